"""Matrix multiplication (PopLibs ``include/poplin/MatMul.hpp``).

``A[g][m][k] x B[g][k][n]`` is planned and built as a convolution with ``g`` conv groups, batch
``m``, ``k`` input channels, ``n`` output channels and a 1x1 field and kernel (PopLibs
``MatMul.cpp getConvParams``): see :mod:`openipu.poplibs.poplin.plan`.
"""

from __future__ import annotations

import functools

import numpy as np

from openipu import poplar
from openipu.poplar.exchange import tile_boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.types import as_type
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.poplin import core, layout
from openipu.poplibs.poplin.params import ConvParams
from openipu.poplibs.poplin.plan import parse_options, plan_matmul
from openipu.poplibs.popops._common import tile_counts_of

__all__ = ["map_matmul_input_rhs", "create_matmul_input_rhs", "matMul", "matMulGrouped", "matMulAcc", "matMulGroupedAcc",
           "createMatMulInputLHS",
           "createMatMulInputRHS", "createMatMulGroupedInputLHS", "createMatMulGroupedInputRHS",
           "createMatMulOutput", "createMatMulGroupedOutput", "matMulReportPlan", "preplanMatMuls"]


def _args(op, args, kw):
    """Parse ``[outputType,] debugName, options, cache`` (PopLibs' two overload forms)."""
    args = list(args)
    out_type = args.pop(0) if args and isinstance(args[0], poplar.Type) else kw.pop("outputType", None)
    names = ("name", "options", "cache")
    if len(args) > 3:
        raise TypeError(f"{op}: too many arguments")
    vals = dict(zip(names, args))
    for k, v in kw.items():
        if k not in names or k in vals:
            raise TypeError(f"{op}: unexpected or repeated argument '{k}'")
        vals[k] = v
    return out_type, vals.get("name") or "", vals.get("options"), vals.get("cache")


def _params(g, m, k, n, in_type, out_type) -> ConvParams:
    return ConvParams(in_type, out_type, m, [1], [1], k, n, g)


def _plan(graph, g, m, k, n, in_type, out_type, options, cache, op):
    return plan_matmul(g, m, k, n, in_type, graph.getTarget(), options, cache, op=op, out_type=out_type)


def _check(op, A, B, grouped):
    r = 3 if grouped else 2
    if A.rank() != r or B.rank() != r:
        raise poplar.graph_connection_error(
            f"{op}: operands must have rank {r} ({'[g, m, k] and [g, k, n]' if grouped else '[m, k] and [k, n]'}), "
            f"got shapes {A.shape()} and {B.shape()}")
    if A.dim(r - 1) != B.dim(r - 2) or (grouped and A.dim(0) != B.dim(0)):
        raise poplar.graph_connection_error(f"{op}: cannot multiply shapes {A.shape()} and {B.shape()}")
    if A.elementType() != B.elementType():
        raise poplar.graph_connection_error(
            f"{op}: operand types differ ({A.elementType()} and {B.elementType()}); cast one with popops.cast")
    if A.elementType() not in (poplar.FLOAT, poplar.HALF, poplar.QUARTER):
        raise poplar.graph_connection_error(f"{op}: operands must be float, half or quarter, got {A.elementType()}")


def _grouped(graph, A, B, prog, out_type, name, options, cache, op):
    g, m, k = A.shape()
    n = B.dim(2)
    in_type = A.elementType()
    out_type = as_type(out_type or (poplar.HALF if in_type == poplar.QUARTER else in_type))
    plan = _plan(graph, g, m, k, n, in_type, out_type, options, cache, op)
    params = _params(g, m, k, n, in_type, out_type)
    x = A.reshape([g, m, k, 1])
    w = B.dimShuffle([0, 2, 1]).reshape([g, n, k, 1])
    opts = parse_options(options, op)
    out = core.build(graph, x, w, params, plan, opts.partials_type, out_type, prog, name or op)
    return out.reshape([g, m, n])


def matMul(graph, A, B, prog, *args, **kw):  # noqa: N802
    """``C = A @ B`` for ``A[m, k]``, ``B[k, n]`` (``poplin::matMul``); appends to ``prog``.

    Forms (positional or keyword ``name``, ``options``, ``cache``, ``outputType``):
    ``matMul(graph, A, B, prog, debugName, options, cache)`` and
    ``matMul(graph, A, B, prog, outputType, debugName, options, cache)``. Types: float or half
    operands; the output type defaults to the operands'. Options: ``availableMemoryProportion``
    (default 0.6), ``partialsType`` ("float" default, or "half"), ``fullyConnectedPass``.

    Returns a new tensor ``[m, n]`` mapped the way the plan produces it.
    Raises ``poplar.graph_connection_error`` (shapes or types) and ``poplar.invalid_option``. No
    plan within the memory budget is a warning and the least-memory plan
    (:mod:`openipu.poplibs.poplin.plan`), not an error.
    """
    out_type, name, options, cache = _args("matMul", args, kw)
    _check("matMul", A, B, False)
    return _grouped(graph, A.expand([0]), B.expand([0]), prog, out_type, name, options, cache,
                    "matMul").reshape([A.dim(0), B.dim(1)])


def matMulGrouped(graph, A, B, prog, *args, **kw):  # noqa: N802
    """``C[g] = A[g] @ B[g]`` for ``A[g, m, k]``, ``B[g, k, n]`` (``poplin::matMulGrouped``).
    Returns ``[g, m, n]``; errors as :func:`matMul`."""
    out_type, name, options, cache = _args("matMulGrouped", args, kw)
    _check("matMulGrouped", A, B, True)
    return _grouped(graph, A, B, prog, out_type, name, options, cache, "matMulGrouped")


@kernel
def _scaled_add_kernel(c, t, scale, ctx):
    C, X = ctx.read(c), ctx.read(t)
    ctx.write(c, (C.float() + scale * X.float()).to(C.dtype))


#: ScaledAdd tile cycles: supervisor 21 + 11 + 7 + 12 + 6, per worker prologue 16 + 6, inner loop
#: 3 cycles per vector (``popops getScaledArithmeticSupervisorCycleEstimate``; poplar.md 4.2).
SCALED_ADD_SUPERVISOR = 21 + 11 + 7 + 12 + 6
SCALED_ADD_WORKER_PROLOGUE = 16 + 6
SCALED_ADD_CYCLES_PER_VECTOR = 3


def _scaled_add_to(graph, C, X, scale: float, prog, name):
    """``C += scale * X`` on the tiles that hold ``C`` (in place); ``X`` is exchanged to them."""
    used, counts = tile_counts_of(graph, C)
    W = graph.getTarget().getNumWorkerContexts()
    vw = graph.getTarget().getVectorWidth(C.elementType())
    cyc = SCALED_ADD_SUPERVISOR + W * (SCALED_ADD_WORKER_PROLOGUE
                                       + SCALED_ADD_CYCLES_PER_VECTOR * -(-counts // (vw * W)))
    cs = graph.addComputeSet(f"{name}/ScaledAdd")
    graph.add_vertex_group(cs, VertexGroup(
        f"popops::ScaledAddSupervisor<{C.elementType()},{X.elementType()}>", used, cyc,
        functools.partial(_scaled_add_kernel, C, X, float(scale)),
        reads=[Access(C), core.runs_access(X, tile_boxes(C))], writes=[Access(C)], multi=True,
        flops=2.0 * C.numElements(),
        state_bytes=24))
    prog.add(poplar.program.Execute(cs))


def matMulAcc(graph, C, k: float, A, B, prog, name: str = "", options=None, cache=None):  # noqa: N802
    """``C += k * (A @ B)`` (``poplin::matMulAcc``); ``C`` is ``[m, n]`` and updated in place.
    Raises ``poplar.graph_connection_error`` when ``C``'s shape is not ``[m, n]``."""
    P = matMul(graph, A, B, prog, C.elementType(), name or "matMulAcc", options, cache)
    if C.shape() != P.shape():
        raise poplar.graph_connection_error(f"matMulAcc: C has shape {C.shape()}, A @ B has {P.shape()}")
    _scaled_add_to(graph, C, P, k, prog, name or "matMulAcc")


def matMulGroupedAcc(graph, C, k: float, A, B, prog, name: str = "", options=None, cache=None):  # noqa: N802
    """``C[g] += k * (A[g] @ B[g])`` (``poplin::matMulGroupedAcc``)."""
    P = matMulGrouped(graph, A, B, prog, C.elementType(), name or "matMulGroupedAcc", options, cache)
    if C.shape() != P.shape():
        raise poplar.graph_connection_error(f"matMulGroupedAcc: C has shape {C.shape()}, A @ B has {P.shape()}")
    _scaled_add_to(graph, C, P, k, prog, name or "matMulGroupedAcc")


def _shapes(op, aShape, bShape, grouped):  # noqa: N803
    a, b = list(aShape), list(bShape)
    if not grouped:
        a, b = [1] + a, [1] + b
    if len(a) != 3 or len(b) != 3 or a[2] != b[1] or a[0] != b[0]:
        raise poplar.graph_connection_error(f"{op}: cannot multiply shapes {list(aShape)} and {list(bShape)}")
    return a[0], a[1], a[2], b[2]


def _create(graph, op, type_, aShape, bShape, name, options, cache, which, grouped, out_type=None,  # noqa: N803
            value=None):
    g, m, k, n = _shapes(op, aShape, bShape, grouped)
    type_ = as_type(type_)
    out_type = as_type(out_type or type_)
    plan = _plan(graph, g, m, k, n, type_, out_type, options, cache, op)
    params = _params(g, m, k, n, type_, out_type)
    shape = {"lhs": [g, m, k], "rhs": [g, k, n], "out": [g, m, n]}[which]
    if which == "rhs":      # blocks stored contiguously (createWeights), canonical [g, n, k, 1]
        if value is not None:
            value = np.asarray(value).reshape(g, k, n).transpose(0, 2, 1)
        w = layout.create_weights(graph, type_, params, plan, name, value)
        t = w.reshape([g, n, k]).dimShuffle([0, 2, 1])
    elif which == "lhs":    # blocks stored contiguously (createInput), canonical [g, m, k, 1]
        t = layout.create_input(graph, type_, params, plan, name).reshape(shape)
    else:                   # (createOutput) canonical [g, m, n, 1]
        t = layout.create_output(graph, out_type, params, plan, name).reshape(shape)
    return t if grouped else t.reshape(shape[1:])


def create_matmul_input_rhs(graph, type_, aShape, bShape, name: str = "", options=None, cache=None,  # noqa: N803
                            value=None):
    """``createMatMulInputRHS`` (``[k, n]``; ``[g, k, n]`` operands give the grouped form) with
    an optional constant ``value``: a weight created by its consumer (PopART's unwinding) is
    created here, in the layout the plan wants, constant or not. openipu extension."""
    grouped = len(list(bShape)) == 3
    op = "createMatMulGroupedInputRHS" if grouped else "createMatMulInputRHS"
    return _create(graph, op, type_, aShape, bShape, name or "rhs", options, cache, "rhs", grouped, value=value)


def map_matmul_input_rhs(graph, B, aShape, options=None, cache=None, outType=None) -> None:  # noqa: N803
    """Re-map an existing right operand ``B`` (``[k, n]``, or ``[g, k, n]`` for grouped) the way
    :func:`createMatMulInputRHS` lays one out for ``aShape x B.shape()``, so a weight created before
    its consumer is known gets the consumer's layout (PopART creates weights from their consumer,
    "unwinding"). openipu extension; raises like ``createMatMulInputRHS``."""
    grouped = B.rank() == 3
    op = "createMatMulGroupedInputRHS" if grouped else "createMatMulInputRHS"
    g, m, k, n = _shapes(op, list(aShape), B.shape(), grouped)
    type_ = B.elementType()
    out_type = as_type(outType or type_)
    plan = _plan(graph, g, m, k, n, type_, out_type, options, cache, op)
    Bg = B if grouped else B.reshape([1, k, n])
    layout.map_weights(graph, Bg.dimShuffle([0, 2, 1]).reshape([g, n, k, 1]), _params(g, m, k, n, type_, out_type), plan)


def createMatMulInputLHS(graph, type_, aShape, bShape, name: str = "", options=None, cache=None):  # noqa: N802,N803
    """A new ``[m, k]`` tensor for the left operand of ``matMul``, mapped the way the plan for
    ``aShape x bShape`` wants it (each tile holds part of the block it multiplies), so the
    multiplication exchanges only what several tiles share (``poplin::createMatMulInputLHS``)."""
    return _create(graph, "createMatMulInputLHS", type_, aShape, bShape, name or "lhs", options, cache, "lhs", False)


def createMatMulInputRHS(graph, type_, aShape, bShape, name: str = "", options=None, cache=None):  # noqa: N802,N803
    """A new ``[k, n]`` right operand laid out for the plan (``poplin::createMatMulInputRHS``)."""
    return _create(graph, "createMatMulInputRHS", type_, aShape, bShape, name or "rhs", options, cache, "rhs", False)


def createMatMulGroupedInputLHS(graph, type_, aShape, bShape, name: str = "", options=None, cache=None):  # noqa: N802,N803
    """``[g, m, k]`` left operand for ``matMulGrouped`` (``poplin::createMatMulGroupedInputLHS``)."""
    return _create(graph, "createMatMulGroupedInputLHS", type_, aShape, bShape, name or "lhs", options, cache,
                   "lhs", True)


def createMatMulGroupedInputRHS(graph, type_, aShape, bShape, name: str = "", options=None, cache=None):  # noqa: N802,N803
    """``[g, k, n]`` right operand for ``matMulGrouped`` (``poplin::createMatMulGroupedInputRHS``)."""
    return _create(graph, "createMatMulGroupedInputRHS", type_, aShape, bShape, name or "rhs", options, cache,
                   "rhs", True)


def createMatMulOutput(graph, inputType, outputType, aShape, bShape, name: str = "", options=None,  # noqa: N802,N803
                       cache=None):
    """A new ``[m, n]`` tensor mapped as ``matMul`` maps its result (``poplin::createMatMulOutput``)."""
    return _create(graph, "createMatMulOutput", inputType, aShape, bShape, name or "out", options, cache, "out",
                   False, outputType)


def createMatMulGroupedOutput(graph, inputType, outputType, aShape, bShape, name: str = "", options=None,  # noqa: N802,N803
                              cache=None):
    """``[g, m, n]`` output of ``matMulGrouped`` (``poplin::createMatMulGroupedOutput``)."""
    return _create(graph, "createMatMulGroupedOutput", inputType, aShape, bShape, name or "out", options, cache,
                   "out", True, outputType)


def matMulReportPlan(out, graph, inputType, outputType, aShape, bShape, options=None, cache=None):  # noqa: N802,N803
    """Write the plan for ``aShape x bShape`` to the text stream ``out`` (``poplin::matMulReportPlan``)."""
    g, m, k, n = _shapes("matMulReportPlan", aShape, bShape, len(list(aShape)) == 3)
    plan = _plan(graph, g, m, k, n, as_type(inputType), as_type(outputType), options, cache, "matMulReportPlan")
    out.write(plan.report() + "\n")


def preplanMatMuls(target, matmuls, cache=None):  # noqa: N802
    """Plan ``[(inputType, aShape, bShape, options)]`` ahead of time into ``cache``
    (``poplin::preplanMatMuls``, simplified: a target instead of a graph)."""
    for in_type, a, b, opts in matmuls:
        g, m, k, n = _shapes("preplanMatMuls", a, b, len(list(a)) == 3)
        plan_matmul(g, m, k, n, as_type(in_type), target, opts, cache, op="preplanMatMuls")
