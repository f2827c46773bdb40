"""``popops``: elementwise operations (PopLibs ``include/popops/ElementWise.hpp``).

Work follows the output's tile mapping: one ``BinaryOp1D`` MultiVertex per tile that owns output
elements; operands mapped elsewhere are exchanged in (and costed by the engine). Cycle estimate
per vertex, from PopLibs ``popopsCycleEstimators.cpp`` (poplar.md 4.2):
``6 x (overhead + inner(ceil(n/6))) + 11`` tile cycles, where ``inner`` processes one data-path
vector (2 float or 4 half) per ``cyclesPerLoop`` cycles plus a 2-cycle loop overhead.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import VertexGroup
from openipu.poplibs.popops._common import broadcast_view, output_like, tile_counts

__all__ = ["BINARY_OPS", "binary_op", "binary_op_cycles", "add", "sub", "mul", "div", "max", "min"]

#: op -> (torch function, cycles per vector loop, worker overhead float, half). PopLibs tables.
BINARY_OPS = {
    "ADD": (torch.add, 1), "SUBTRACT": (torch.sub, 1), "MULTIPLY": (torch.mul, 1),
    "DIVIDE": (torch.div, 10), "MAXIMUM": (torch.maximum, 1), "MINIMUM": (torch.minimum, 1),
    "POWER": (torch.pow, 40),
}


def _binary_kernel(fn, out, a, b, ctx):
    ctx.write(out, fn(ctx.read(a), ctx.read(b)))


def binary_op_cycles(n_per_tile: np.ndarray, type_, cycles_per_loop: int, target) -> np.ndarray:
    """Tile cycles of ``popops::BinaryOp1D`` for ``n`` elements per tile (MultiVertex, 6 workers)."""
    vw = target.getVectorWidth(type_)
    per_worker = -(-n_per_tile // 6)
    inner = -(-per_worker // vw) * cycles_per_loop + 2
    overhead = 29 if type_ == poplar.FLOAT else 26
    return 6 * (overhead + inner) + 11


def binary_op(graph, op: str, a, b, prog, name: str = ""):
    """``out = op(a, b)`` with numpy broadcasting; appends one compute set to ``prog``."""
    if a.elementType() != b.elementType():
        raise poplar.graph_connection_error(f"{op}: operand types differ ({a.elementType()} and {b.elementType()})")
    try:
        shape = list(np.broadcast_shapes(tuple(a.shape()), tuple(b.shape())))
    except ValueError:
        raise poplar.index_error(f"{op}: shapes {a.shape()} and {b.shape()} cannot be broadcast together") from None
    fn, cpl = BINARY_OPS[op]
    out = output_like(graph, a.elementType(), shape, (a, b), name or op.lower())
    otiles = graph.tile_of_elements(out)
    used, counts = tile_counts(graph, otiles)
    cycles = binary_op_cycles(counts, a.elementType(), cpl, graph.getTarget())
    a_v, b_v = broadcast_view(a, shape), broadcast_view(b, shape)
    cs = graph.addComputeSet(name or op.lower())
    vname = f"popops::BinaryOp1D<popops::expr::BinaryOpType::{op},{a.elementType()}>"
    graph.add_vertex_group(cs, VertexGroup(
        vname, used, cycles, functools.partial(_binary_kernel, fn, out, a, b),
        reads=[(a_v, otiles), (b_v, otiles)], writes=[(out, otiles)], multi=True,
        flops=float(out.numElements()), state_bytes=16))
    prog.add(poplar.program.Execute(cs))
    return out


def add(graph, a, b, prog, name: str = ""):
    """``a + b`` (``popops::add``)."""
    return binary_op(graph, "ADD", a, b, prog, name)


def sub(graph, a, b, prog, name: str = ""):
    """``a - b`` (``popops::sub``)."""
    return binary_op(graph, "SUBTRACT", a, b, prog, name)


def mul(graph, a, b, prog, name: str = ""):
    """``a * b`` (``popops::mul``)."""
    return binary_op(graph, "MULTIPLY", a, b, prog, name)


def div(graph, a, b, prog, name: str = ""):
    """``a / b`` (``popops::div``)."""
    return binary_op(graph, "DIVIDE", a, b, prog, name)


def max(graph, a, b, prog, name: str = ""):  # noqa: A001 - Poplar name
    """Elementwise maximum (``popops::max``)."""
    return binary_op(graph, "MAXIMUM", a, b, prog, name)


def min(graph, a, b, prog, name: str = ""):  # noqa: A001 - Poplar name
    """Elementwise minimum (``popops::min``)."""
    return binary_op(graph, "MINIMUM", a, b, prog, name)
