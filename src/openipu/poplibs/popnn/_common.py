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

Host work follows the graph's structure, never the number of elements: per-tile element counts
come from the tensors' regions (``tile_counts_of``), reads and writes are
:class:`~openipu.poplar.graph.Access` entries (a view used where another view lives, a tile, or
boxes of tiles), and new tensors are mapped like another tensor or by runs.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.exchange import Boxes, tile_boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._common import broadcast_view, output_like, tile_counts_of  # noqa: F401
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


def new_mapped(graph, type_, shape, name: str, like=None, runs=None):
    """A new variable of ``type_`` and ``shape``: mapped like ``like`` (a tensor with as many
    elements), or by ``runs`` = ``(begins, ends, global_tiles)`` of its flattened elements, or
    linearly (``poputil.mapTensorLinearly``). No per-element work."""
    out = graph.addVariable(type_, list(shape), name)
    if like is not None:
        graph.copy_tile_mapping(out, like)
    elif runs is not None:
        b, e, t = runs
        if np.size(b):
            graph.set_tile_runs(out, np.asarray(b, np.int64), np.asarray(e, np.int64), np.asarray(t, np.int64))
    else:
        from openipu.poplibs.poputil import mapTensorLinearly
        mapTensorLinearly(graph, out)
    return out


def check_mapped(graph, t, what: str) -> None:
    """Raise Poplar's ``invalid_tile_mapping`` unless every element of ``t`` is mapped (from the
    tensor's regions: no per-element work)."""
    if not graph.is_mapped(t):
        raise poplar.invalid_tile_mapping(f"{what}: tensor {t.shortString()} is not completely mapped to tiles; "
                                          "map it (e.g. poputil.mapTensorLinearly) first")


def compress_runs(values: np.ndarray):
    """``(begins, ends, value)`` of the runs of equal consecutive entries of a 1-D array (a per-row
    or per-vertex array, never a per-element one)."""
    values = np.asarray(values)
    if values.size == 0:
        z = np.zeros(0, np.int64)
        return z, z, values[:0]
    b = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    return b.astype(np.int64), np.append(b[1:], values.size).astype(np.int64), values[b]


def row_boxes(rows_b: np.ndarray, rows_e: np.ndarray, cols: int, tiles: np.ndarray) -> Boxes:
    """Boxes ``[rows_b[i], rows_e[i]) x [0, cols)`` of a 2-D view, each on global tile ``tiles[i]``."""
    k = np.size(rows_b)
    lo = np.zeros((k, 2), np.int64)
    sz = np.zeros((k, 2), np.int64)
    lo[:, 0] = rows_b
    sz[:, 0] = np.asarray(rows_e) - np.asarray(rows_b)
    sz[:, 1] = cols
    return Boxes(lo, sz, np.asarray(tiles, np.int64))


def flat_range_boxes(b: Boxes, shape) -> Boxes:
    """``b`` cut so that every box is one flat range of a row-major index space of ``shape``
    (its dims outside the innermost partial one become single indices).

    The exchange model merges neighbouring transfers into one message only for boxes that are
    one contiguous interval; boxes that are not (a few rows of a partial width, e.g. the window
    rows a pooling output reads) are cut into their rows, so that messages are counted as for
    the same elements one by one. The result has one box per row of such boxes: host work
    follows rows of boxes, never elements."""
    d = len(shape)
    k = len(b)
    if k == 0 or d < 2:
        return b
    S = np.asarray(shape, np.int64)
    notfull = ~((b.lo == 0) & (b.sz == S[None, :]))
    q = np.where(notfull.any(axis=1), d - 1 - np.argmax(notfull[:, ::-1], axis=1), -1)
    outer = np.arange(d)[None, :] < q[:, None]
    cnt = np.prod(np.where(outer, b.sz, 1), axis=1)
    if (cnt <= 1).all():
        return b
    rep = np.repeat(np.arange(k), cnt)
    local = np.arange(rep.size, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    lo, sz = b.lo[rep].copy(), b.sz[rep].copy()
    use_all = outer[rep]
    for i in range(d - 1, -1, -1):
        use = use_all[:, i]
        szi = np.maximum(sz[:, i], 1)
        lo[:, i] += np.where(use, local % szi, 0)
        local = np.where(use, local // szi, local)
        sz[:, i] = np.where(use, 1, sz[:, i])
    return Boxes(lo, sz, b.tile[rep])


def multicast(t, tiles: np.ndarray) -> Access:
    """A read of every element of ``t`` by each global tile in ``tiles`` (one box of the whole
    view per tile: the exchange sends each value once and every tile receives it)."""
    tiles = np.asarray(tiles, np.int64).reshape(-1)
    d = t.rank()
    return Access(t, Boxes(np.zeros((tiles.size, d), np.int64),
                           np.tile(np.array(t.shape(), np.int64).reshape(1, d), (tiles.size, 1)), tiles))


def row_first_tiles(graph, t2d) -> np.ndarray:
    """Global tile of element ``[r, 0]`` of each row of a mapped 2-D view (``[rows]`` int64, from
    the view's tile runs)."""
    rows, cols = t2d.shape()
    b, _, tl = graph.tile_runs_of(t2d)
    at = np.arange(rows, dtype=np.int64) * cols
    return tl[np.searchsorted(b, at, side="right") - 1].astype(np.int64)


def add_elementwise(graph, prog, name: str, vertex: str, out, reads, kernel, op: str | tuple,
                    flops_per_element: float = 1.0, state_bytes: int = 16, also_writes=()):
    """Append one compute set: a MultiVertex per tile of ``out`` running ``kernel`` (whole tensors).

    ``reads``: tensors whose elements each tile needs, as views broadcastable to ``out``'s shape
    (each element is consumed on the tile of the output element it feeds). ``op`` names an entry
    of :data:`OP_CYCLES` or is a (scalar, vector) cycles pair. ``also_writes``: more outputs of
    ``out``'s shape the kernel writes (each costed where it is mapped).
    """
    check_mapped(graph, out, name)
    used, counts = tile_counts_of(graph, out)
    et = out.elementType()
    sc, vc = op_cycles(op, et) if isinstance(op, str) else op
    cycles = elementwise_cycles(counts, et, sc, vc, graph.getTarget())
    shape = out.shape()
    rd = [Access(broadcast_view(r, shape) if list(r.shape()) != list(shape) else r, out) for r in reads]
    for w in also_writes:
        check_mapped(graph, w, name)
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        vertex, used, cycles, kernel, reads=rd,
        writes=[Access(out)] + [Access(w) for w in also_writes], multi=True,
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


# ----------------------------------------------------------------------------------------------
# arg max / min per row
# ----------------------------------------------------------------------------------------------
def _segments(graph, src2d):
    """The row segments of a mapped 2-D view on each tile, from its tile boxes: per segment its
    flat start, length and (row, tile) *pair* index; pairs sorted by (row, global tile). Returns
    ``(seg_start, seg_len, seg_pair, pair_row, pair_tile)`` (int64; one entry per segment or pair,
    as many as the view has (box, row) overlaps, never one per element)."""
    rows, cols = src2d.shape()
    bx = tile_boxes(src2d)
    nr = bx.sz[:, 0]
    box = np.repeat(np.arange(len(bx)), nr)
    row = bx.lo[box, 0] + (np.arange(box.size, dtype=np.int64) - np.repeat(np.cumsum(nr) - nr, nr))
    tile = bx.tile[box].astype(np.int64)
    T = graph._top._target.getNumTiles()
    uniq, seg_pair = np.unique(row * T + tile, return_inverse=True)
    return (row * cols + bx.lo[box, 1], bx.sz[box, 1].astype(np.int64), seg_pair.reshape(-1).astype(np.int64),
            uniq // T, uniq % T)


def _element_pairs(seg_start, seg_len, seg_pair) -> torch.Tensor:
    """Run time: the pair index of each flattened element (built from the segments when the
    kernel runs, dropped after)."""
    order = np.argsort(seg_start, kind="stable")
    return torch.from_numpy(np.repeat(seg_pair[order], seg_len[order]))


def _seg_arg(values, index, seg, nseg, op):
    """Per segment: the max (min) value and the smallest index attaining it."""
    best = _segment_reduce(values, seg, nseg, Operation.MAX if op == "max" else Operation.MIN)
    hit = values == best[:, seg]
    big = torch.iinfo(torch.int64).max
    cand = torch.where(hit, index, torch.full_like(index, big))
    idx = torch.full((values.shape[0], nseg), big, dtype=torch.int64).scatter_reduce_(
        1, seg.expand(values.shape[0], -1), cand, "amin", include_self=True)
    return best, idx


@kernel
def _arg_stage1(src, pv, pi, op, segs, npairs, cols, ctx):
    v = ctx.read(src)
    R = v.shape[0]
    v = v.reshape(R, -1)
    vals = v.to(torch.float32) if v.is_floating_point() else v.to(torch.int64)
    col = (torch.arange(v.shape[1], dtype=torch.int64) % max(cols, 1)).expand(R, -1)
    best, idx = _seg_arg(vals, col, _element_pairs(*segs), npairs, op)
    ctx.write(pv, best)
    ctx.write(pi, idx)


@kernel
def _arg_stage2(pv, pi, vals_out, idx_out, op, prow, rows, ctx):
    best, idx = _seg_arg(ctx.read(pv).to(torch.float64), ctx.read(pi).to(torch.int64), prow, rows, op)
    if vals_out is not None:
        ctx.write(vals_out, best)
    ctx.write(idx_out, idx)


def _runs_boxes(values: np.ndarray) -> Boxes:
    """Boxes of a 1-D tensor: each run of equal consecutive ``values`` (global tiles) is one box."""
    b, e, v = compress_runs(values)
    return Boxes(b.reshape(-1, 1), (e - b).reshape(-1, 1), v.astype(np.int64))


def row_arg_reduce(graph, prog, name: str, src2d, op: str, want_values: bool):
    """Per row of ``src2d``: index (``UNSIGNED_INT``) of the max (``op="max"``) or min, first on
    ties; and the value (``src2d``'s type) when ``want_values``. Returns ``(values|None, indices)``.

    Stage 1 (``ReduceMaxClassGather``) reduces each row's elements on each tile to one partial
    (value, index) *pair* on that tile; stage 2 (``ReduceMaxClassSparse``) reduces each row's pairs
    on the tile of the row's first element, where the outputs live. Host work follows the pairs
    (rows x tiles per row), not the elements."""
    rows, cols = src2d.shape()
    if cols == 0:
        raise poplibs_error(f"{name}: cannot take arg{op} of rows with no elements (shape {src2d.shape()})")
    target = graph.getTarget()
    et = src2d.elementType()
    check_mapped(graph, src2d, "reduce")
    seg_start, seg_len, seg_pair, prow, ptile = _segments(graph, src2d)
    npairs = int(prow.size)
    out_tiles = row_first_tiles(graph, src2d)
    pv_type = poplar.FLOAT if et.is_float else poplar.INT
    pair_runs = compress_runs(ptile)
    pv = new_mapped(graph, pv_type, [npairs], f"{name}/partialValues", runs=pair_runs)
    pi = new_mapped(graph, poplar.UNSIGNED_INT, [npairs], f"{name}/partialIndices", runs=pair_runs)
    used, counts = tile_counts_of(graph, src2d)
    w = target.getNumWorkerContexts()
    c1 = 9 + w * (26 + 3 * (-(-counts // w)))   # ReduceMaxClassGather shape (float/half)
    kind = "Max" if op == "max" else "Min"
    cs = graph.addComputeSet(f"{name}/gather")
    graph.add_vertex_group(cs, VertexGroup(
        f"popnn::Reduce{kind}ClassGather<{et},unsigned int>", used, c1,
        functools.partial(_arg_stage1, src2d, pv, pi, op, (seg_start, seg_len, seg_pair), npairs, cols),
        reads=[Access(src2d)], writes=[Access(pv), Access(pi)], multi=True, flops=float(rows * cols),
        state_bytes=24))
    prog.add(poplar.program.Execute(cs, f"{name}/gather"))
    row_runs = compress_runs(out_tiles)
    vals = new_mapped(graph, et, [rows], f"{name}/values", runs=row_runs) if want_values else None
    idx = new_mapped(graph, poplar.UNSIGNED_INT, [rows], f"{name}/indices", runs=row_runs)
    consumer = out_tiles[prow]
    T = graph._top._target.getNumTiles()
    used2 = np.flatnonzero(np.bincount(out_tiles, minlength=T))
    per_tile_pairs = np.bincount(consumer, minlength=T)[used2]
    c2 = 5 + 22 + 3 * per_tile_pairs                # ReduceMaxClassSparse shape, rows of one tile
    cs2 = graph.addComputeSet(f"{name}/sparse")
    on = _runs_boxes(consumer)
    writes = [Access(idx)] + ([Access(vals)] if vals is not None else [])
    graph.add_vertex_group(cs2, VertexGroup(
        f"popnn::Reduce{kind}ClassSparse<float,unsigned int>", used2, c2,
        functools.partial(_arg_stage2, pv, pi, vals, idx, op, torch.from_numpy(prow), rows),
        reads=[Access(pv, on), Access(pi, on)], writes=writes, multi=False, flops=float(npairs), state_bytes=16))
    prog.add(poplar.program.Execute(cs2, f"{name}/sparse"))
    return vals, idx


def as_rows(t):
    """``t`` viewed as [outer, innermost] (a 1-D tensor is one row)."""
    if t.rank() == 0:
        raise poplibs_error(f"expected a tensor of rank >= 1, got a scalar {t.shortString()}")
    last = t.dim(t.rank() - 1)
    return t.reshape([t.numElements() // max(last, 1) if last else 0, last])
