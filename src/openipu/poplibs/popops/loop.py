"""``popops``: counted loops (PopLibs ``include/popops/Loop.hpp``).

``countedLoop`` is built like PopLibs': an UNSIGNED_INT induction variable on tile 0, a ``Copy``
of the constant ``begin`` into it, then ``Repeat(count, body + index += step)``; the increment is
a one-vertex group (``popops::ScaledAddSupervisor``-like, a few cycles) on tile 0.
"""

from __future__ import annotations

import functools

import numpy as np

from openipu import poplar
from openipu.poplar.graph import VertexGroup
from openipu.poplar.graph_codec import kernel

__all__ = ["countedLoop"]

#: Tile cycles of the one-element in-place add of the induction variable: PopLibs
#: basicOpSupervisorOverhead (11) + a BinaryOp1D worker pass of one element (6 x (29 + 3)) [A].
INCREMENT_CYCLES = 11 + 6 * (29 + 3)


@kernel
def _increment_kernel(var, step, ctx):
    ctx.write(var, ctx.read(var) + step)


def countedLoop(graph, begin, end=None, step=None, body=None, debug_name: str = ""):  # noqa: N802
    """``popops::countedLoop(graph, begin, end, step, body, debugContext)`` or
    ``countedLoop(graph, count, body, debugContext)``.

    Returns a ``Sequence`` equivalent to ``for (i = begin; i < end; i += step) body(i)``:
    ``body(index)`` is called once at graph-construction time with the induction variable (an
    UNSIGNED_INT tensor of shape [1] on tile 0) and returns the ``Program`` to repeat.
    Raises ``poplar.poplar_error`` when ``step`` is 0, when ``begin >= end`` (PopLibs' rule), or
    when ``body`` does not return a Program.
    """
    if callable(end) and body is None:                       # countedLoop(graph, count, body[, name])
        body = end
        if isinstance(step, str):
            debug_name = step
        begin, end, step = 0, begin, 1
    if body is None or not callable(body):
        raise poplar.poplar_error("countedLoop: body must be a callable taking the index tensor and returning a Program")
    begin, end, step = int(begin), int(end), int(step if step is not None else 1)
    if step <= 0:
        raise poplar.poplar_error("countedLoop: step must be greater than zero")
    if begin >= end:
        raise poplar.poplar_error(f"countedLoop: begin ({begin}) must be less than end ({end})")
    name = debug_name or "countedLoop"
    index = graph.addVariable(poplar.UNSIGNED_INT, [1], f"{name}/index")
    graph.setTileMapping(index, 0)
    t_begin = graph.addConstant(poplar.UNSIGNED_INT, [1], begin, f"{name}/begin-{begin}")
    graph.setTileMapping(t_begin, 0)
    seq = poplar.program.Sequence(debugContext=name)
    seq.add(poplar.program.Copy(t_begin, index))
    body_prog = body(index)
    if not isinstance(body_prog, poplar.program.Program):
        raise poplar.poplar_error(f"countedLoop: body returned {type(body_prog).__name__}, not a Program")
    cs = graph.addComputeSet(f"{name}/increment")
    tile0 = graph._tiles[:1].astype(np.int64)
    graph.add_vertex_group(cs, VertexGroup(
        "popops::ScaledAddSupervisor<unsigned int>", tile0, np.array([INCREMENT_CYCLES]),
        functools.partial(_increment_kernel, index, step), reads=[(index, tile0)], writes=[(index, tile0)],
        multi=True, flops=0.0, state_bytes=16))
    inner = poplar.program.Sequence(body_prog, poplar.program.Execute(cs))
    count = (end - begin + step - 1) // step
    seq.add(poplar.program.Repeat(count, inner, debugContext=name))
    return seq
