"""Vertex groups shared by popnn's op families (not PopLibs API).

popnn builds its own work (PopLibs' popnn has its own NonLinearity, Loss, Pooling and norm
vertices and calls popops for the rest: softmax, loss and norm sums are ``popops.reduce`` /
``reduceMany`` / ``reduceWithOutput``, planned and costed there); these helpers add popnn's own
work as vertex groups:

- :func:`add_elementwise`: one MultiVertex per tile of the output (``NonLinearity1D`` shape);
- :func:`row_arg_reduce`: max/min and its index per row (``ReduceMaxClassGather`` then
  ``ReduceMaxClassSparse``).

Cycle shapes (tile cycles, MultiVertex):

- elementwise, from PopLibs ``nonLinearity1DCycleEstimator`` (``popnnCycleEstimators.cpp``):
  ``9 + 6 x (20 + [v>0](3 + 2 op + (v-1) vecOp) + remainder)``, ``v = ceil(n / vw / 6)``.
- arg reduce, from PopLibs ``ReduceMaxClassGather``: ``9 + 6 x (26 + 3 x ceil(n/6))`` and
  ``ReduceMaxClassSparse`` ``5 + 22 + 3 x n`` per row.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import VertexGroup
from openipu.poplibs.popops._common import broadcast_view, output_like, tile_counts  # noqa: F401
from openipu.poplibs.popops.reduce import Operation, _segment_reduce


from openipu.poplibs.poputil import poplibs_error  # noqa: E402 - one exception class for all of PopLibs


#: (scalar op cycles, vector op cycles) per element type, for the elementwise estimator. PopLibs
#: ``getNonLinearityOpCycles`` (poplar.md 4.2); entries marked [A] are assumptions.
OP_CYCLES = {
    "RELU": {"float": (1, 1), "half": (1, 1)},
    "SIGMOID": {"float": (5, 10), "half": (2, 4)},
    "TANH": {"float": (5, 10), "half": (1, 2)},
    "GELU": {"float": (10, 20), "half": (5, 10)},          # vector = 2 x scalar [A]
    "GELU_ERF": {"float": (30, 60), "half": (15, 30)},     # vector = 2 x scalar [A]
    "SWISH": {"float": (6, 12), "half": (3, 6)},           # [A] sigmoid + 1 multiply
    "HARD_SIGMOID": {"float": (3, 3), "half": (3, 3)},     # [A] mul, add, clamp
    "EXP": {"float": (6, 12), "half": (4, 8)},             # popops EXPONENT table (poplar.md 4.2)
    "LOG": {"float": (6, 12), "half": (4, 8)},             # [A] like EXPONENT
    "SQRT": {"float": (10, 20), "half": (23, 23)},         # popops SQRT half {23}; float [A]
    "MUL": {"float": (1, 1), "half": (1, 1)},
    "ADD": {"float": (1, 1), "half": (1, 1)},
    "AXPBY": {"float": (2, 2), "half": (2, 2)},            # [A] two MACs
    "DIV": {"float": (10, 20), "half": (10, 20)},          # popops DIVIDE float {10}
}
#: (scalar, vector) cycles of the gradient ops [A]: their flop counts (PopLibs nonlinearityGradFlops).
GRAD_OP_CYCLES = {"RELU": (1, 1), "SIGMOID": (2, 2), "TANH": (2, 2), "GELU": (15, 15), "GELU_ERF": (30, 30),
                  "SWISH": (5, 5), "HARD_SIGMOID": (3, 3)}


def op_cycles(op: str, type_) -> tuple[int, int]:
    """(scalar, vector) cycles of ``op`` for ``type_`` (float types; others cost as float)."""
    e = OP_CYCLES[op]
    return e["half"] if type_ == poplar.HALF else e["float"]


def elementwise_cycles(n: np.ndarray, type_, op: int, vec_op: int, target) -> np.ndarray:
    """Tile cycles of a ``NonLinearity1D``-shaped MultiVertex over ``n`` elements (array)."""
    n = np.asarray(n, np.int64)
    vw = target.getVectorWidth(type_) if type_.is_float else 1
    workers = target.getNumWorkerContexts()
    vectors, rem = n // vw, n % vw
    v = -(-vectors // workers)
    worker = 20 + np.where(v > 0, 3 + 2 * op + np.maximum(v - 1, 0) * vec_op, 0)
    if type_ == poplar.HALF:
        worker = worker + 4 + np.where(rem & 2, 2 + op, 0) + np.where(rem & 1, 3 + op, 0)
    else:
        worker = worker + 3 + np.where(rem & 1, 2 + op, 0)
    return 9 + workers * worker


def gather_view(t, index: np.ndarray):
    """A view of ``t``'s flattened elements picked by ``index`` (any shape); never copies."""
    return poplar.Tensor(t._state, t._type, t.flat_addresses()[np.asarray(index, np.int64)], t._view_type)


def new_mapped(graph, type_, shape, name: str, tiles: np.ndarray | None = None):
    """A new variable mapped per element to ``tiles`` (global tiles) or linearly."""
    out = graph.addVariable(type_, list(shape), name)
    if tiles is None:
        from openipu.poplibs.poputil import mapTensorLinearly
        mapTensorLinearly(graph, out)
    else:
        graph.setTileMapping(out, graph._local_tiles(np.asarray(tiles, np.int64)))
    return out


def check_mapped(graph, t, what: str) -> np.ndarray:
    tiles = graph.tile_of_elements(t)
    if (tiles < 0).any():
        raise poplar.invalid_tile_mapping(f"{what}: tensor {t.shortString()} is not completely mapped to tiles; "
                                          "map it (e.g. poputil.mapTensorLinearly) first")
    return tiles


def add_elementwise(graph, prog, name: str, vertex: str, out, reads, kernel, op: str | tuple,
                    flops_per_element: float = 1.0, state_bytes: int = 16, also_writes=()):
    """Append one compute set: a MultiVertex per tile of ``out`` running ``kernel`` (whole tensors).

    ``reads``: tensors whose elements each tile needs, as views broadcastable to ``out``'s shape
    (each element is consumed on the tile of the output element it feeds). ``op`` names an entry
    of :data:`OP_CYCLES` or is a (scalar, vector) cycles pair. ``also_writes``: more outputs of
    ``out``'s shape the kernel writes (each costed where it is mapped).
    """
    otiles = check_mapped(graph, out, name)
    used, counts = tile_counts(graph, otiles)
    et = out.elementType()
    sc, vc = op_cycles(op, et) if isinstance(op, str) else op
    cycles = elementwise_cycles(counts, et, sc, vc, graph.getTarget())
    shape = out.shape()
    rd = [(broadcast_view(r, shape) if list(r.shape()) != list(shape) else r, otiles) for r in reads]
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        vertex, used, cycles, kernel, reads=rd,
        writes=[(out, otiles)] + [(w, check_mapped(graph, w, name)) for w in also_writes], multi=True,
        flops=float(flops_per_element * out.numElements()), state_bytes=state_bytes))
    prog.add(poplar.program.Execute(cs, name))
    return out


def row_output(graph, type_, src2d, name: str):
    """A new, unmapped ``[rows]`` tensor for a per-row reduction of the 2-D view ``src2d``. popnn
    passes it to ``popops.reduceWithOutput`` / ``reduceMany``, which map it as ``popops.reduce``
    maps a created output: beside each row when the row sits on one tile, else linearly with at
    least 4 vectors per tile (PopLibs)."""
    rows, _ = src2d.shape()
    return graph.addVariable(type_, [rows], name)


def scalar_read(t, tiles: np.ndarray):
    """A read of one-element ``t`` by every tile in ``tiles`` (multicast)."""
    return (broadcast_view(t.flatten(), [tiles.size]), tiles)


# ----------------------------------------------------------------------------------------------
# arg max / min per row
# ----------------------------------------------------------------------------------------------
def _pairs(graph, src2d):
    """(pair index of each element, row of each pair, tile of each pair) for a 2-D view."""
    rows, cols = src2d.shape()
    st = check_mapped(graph, src2d, "reduce").astype(np.int64)
    T = graph._top._target.getNumTiles()
    key = np.repeat(np.arange(rows, dtype=np.int64), cols) * T + st
    uniq, pair = np.unique(key, return_inverse=True)
    return pair.astype(np.int64), uniq // T, uniq % T


def _seg_arg(values, index, seg, nseg, op):
    """Per segment: the max (min) value and the smallest index attaining it."""
    best = _segment_reduce(values, seg, nseg, Operation.MAX if op == "max" else Operation.MIN)
    hit = values == best[:, seg]
    big = torch.iinfo(torch.int64).max
    cand = torch.where(hit, index, torch.full_like(index, big))
    idx = torch.full((values.shape[0], nseg), big, dtype=torch.int64).scatter_reduce_(
        1, seg.expand(values.shape[0], -1), cand, "amin", include_self=True)
    return best, idx


def _arg_stage1(src, pv, pi, op, pair, npairs, cols, ctx):
    v = ctx.read(src)
    R = v.shape[0]
    v = v.reshape(R, -1)
    vals = v.to(torch.float32) if v.is_floating_point() else v.to(torch.int64)
    col = (torch.arange(v.shape[1], dtype=torch.int64) % max(cols, 1)).expand(R, -1)
    best, idx = _seg_arg(vals, col, pair, npairs, op)
    ctx.write(pv, best)
    ctx.write(pi, idx)


def _arg_stage2(pv, pi, vals_out, idx_out, op, prow, rows, ctx):
    best, idx = _seg_arg(ctx.read(pv).to(torch.float64), ctx.read(pi).to(torch.int64), prow, rows, op)
    if vals_out is not None:
        ctx.write(vals_out, best)
    ctx.write(idx_out, idx)


def row_arg_reduce(graph, prog, name: str, src2d, op: str, want_values: bool):
    """Per row of ``src2d``: index (``UNSIGNED_INT``) of the max (``op="max"``) or min, first on
    ties; and the value (``src2d``'s type) when ``want_values``. Returns ``(values|None, indices)``."""
    rows, cols = src2d.shape()
    if cols == 0:
        raise poplibs_error(f"{name}: cannot take arg{op} of rows with no elements (shape {src2d.shape()})")
    target = graph.getTarget()
    et = src2d.elementType()
    pair, prow, ptile = _pairs(graph, src2d)
    npairs = int(prow.size)
    st = graph.tile_of_elements(src2d).astype(np.int64)
    out_tiles = st.reshape(rows, cols)[:, 0]
    pv_type = poplar.FLOAT if et.is_float else poplar.INT
    pv = new_mapped(graph, pv_type, [npairs], f"{name}/partialValues", ptile)
    pi = new_mapped(graph, poplar.UNSIGNED_INT, [npairs], f"{name}/partialIndices", ptile)
    used, counts = tile_counts(graph, st)
    w = target.getNumWorkerContexts()
    c1 = 9 + w * (26 + 3 * (-(-counts // w)))   # ReduceMaxClassGather shape (float/half)
    kind = "Max" if op == "max" else "Min"
    cs = graph.addComputeSet(f"{name}/gather")
    graph.add_vertex_group(cs, VertexGroup(
        f"popnn::Reduce{kind}ClassGather<{et},unsigned int>", used, c1,
        functools.partial(_arg_stage1, src2d, pv, pi, op, torch.from_numpy(pair), npairs, cols),
        reads=[(src2d, st)], writes=[(pv, ptile), (pi, ptile)], multi=True, flops=float(rows * cols), state_bytes=24))
    prog.add(poplar.program.Execute(cs, f"{name}/gather"))
    vals = new_mapped(graph, et, [rows], f"{name}/values", out_tiles) if want_values else None
    idx = new_mapped(graph, poplar.UNSIGNED_INT, [rows], f"{name}/indices", out_tiles)
    consumer = out_tiles[prow]
    used2, _ = tile_counts(graph, out_tiles)
    per_tile_pairs = np.bincount(consumer, minlength=graph._top._target.getNumTiles())[used2]
    c2 = 5 + 22 + 3 * per_tile_pairs                # ReduceMaxClassSparse shape, rows of one tile
    cs2 = graph.addComputeSet(f"{name}/sparse")
    writes = [(idx, out_tiles)] + ([(vals, out_tiles)] if vals is not None else [])
    graph.add_vertex_group(cs2, VertexGroup(
        f"popnn::Reduce{kind}ClassSparse<float,unsigned int>", used2, c2,
        functools.partial(_arg_stage2, pv, pi, vals, idx, op, torch.from_numpy(prow), rows),
        reads=[(pv, consumer), (pi, consumer)], writes=writes, multi=False, flops=float(npairs), state_bytes=16))
    prog.add(poplar.program.Execute(cs2, f"{name}/sparse"))
    return vals, idx


def as_rows(t):
    """``t`` viewed as [outer, innermost] (a 1-D tensor is one row)."""
    if t.rank() == 0:
        raise poplibs_error(f"expected a tensor of rank >= 1, got a scalar {t.shortString()}")
    last = t.dim(t.rank() - 1)
    return t.reshape([t.numElements() // max(last, 1) if last else 0, last])
