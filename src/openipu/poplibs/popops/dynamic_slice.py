"""``popops``: slicing at run-time offsets (PopLibs ``include/popops/DynamicSlice.hpp``).

The sliced dimensions ``dims`` of ``t`` are moved to the front and the rest flattened into
*columns*: ``t`` is viewed as ``[prod(t.dim(d) for d in dims), columns]``. Every column is sliced
by one vertex on the tile that holds the column's first element (``t[0, ..., column]``); the
other elements of the column are exchanged to that tile (the exchange is static: the whole
column moves, whatever the offset), so tensors made by :func:`createSliceableTensor`, which keep
each column on one tile, slice without exchange. Slices and updates are mapped with their column.
A table whose rows are split into a few ranges, each range keeping each of its columns on one
tile (PopLibs' ``slicedDimSplit``: ``createSliceableTensor`` with an embedding plan, as PopART
lays out an embedding with fewer columns than tiles; :func:`plan_row_split`), is sliced by
``multiSlice`` in two stages as PopLibs' planned multiSlice does: every range slices on its own
tiles, then each slice is picked from its row's range; the ``multiUpdate*`` functions update
every range on its own tiles.

Layout: the tensors openipu creates here (:func:`createSliceableTensor`, :func:`createSliceTensor`,
the outputs of :func:`dynamicSlice` and :func:`multiSlice`) are variables laid out column by
column (the columns' elements contiguous, as PopLibs allocates them tile by tile) and returned as
views of the requested shape, so their tile maps are one interval per run of columns on a tile.
Columns are handled as runs of columns on one tile, never one by one.

Offsets are device tensors (``UNSIGNED_INT`` or ``INT``). Out-of-range offsets follow PopLibs:

- ``dynamicSlice`` / ``dynamicUpdate``: a slice that runs past the end of a dimension wraps round
  to its start (``(offset + i) mod size``); an offset ``>= size`` (or negative) leaves the output
  (resp. ``t``) unchanged, unless option ``remapOutOfBoundIndices`` is true, which uses offset 0
  (PopLibs ``DynamicSlice2D`` codelet).
- ``multiSlice``: an out-of-range offset gives an undefined slice in PopLibs; here it is zeros (as
  the padding index does with ``paddingIndexUsed``), or offset 0 with ``remapOutOfBoundIndices``.
- ``multiUpdate*``: out-of-range offsets are ignored (or remapped to 0).

Cycle estimates (``lib/popops/popopsCycleEstimators.cpp``, ``PerformanceEstimation.cpp``):
``DynamicSlice2D`` / ``DynamicUpdateSlice2D`` ``23 + sum_regions((29|31|50 + nVectors x c) x
numSubElements + 13)`` worker cycles, regions split over the 6 workers; ``MultiSlice`` /
``MultiUpdate`` ``(30|29 + inRange x (19 + ceil(elems/vw) x 2) + outOfRange x 8) x 6``;
``MultiUpdateOp`` ``(3 + 29|30 + scaled + inRange x (11|12 + (elems/atom - 1) x 3) + outOfRange
x 5) x 6``. The base's dictionary rows are split over the workers, so each worker copies about
``numOffsets / 6`` in-range offsets (PopLibs' ``indicesDistribution = uniform``) [A].
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.exchange import Boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.mapping import linear_tile_runs
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._common import read_on_tiles, unmapped_count

__all__ = ["SlicePlan", "embedding", "createSliceableTensor", "createSliceTensor", "createIndicesTensor",
           "dynamicSlice", "dynamicSliceWithOutput", "dynamicUpdate", "multiSlice", "multiUpdate",
           "multiUpdateAdd", "multiUpdateMax"]

WORKERS = 6
_OPTIONS = {"remapOutOfBoundIndices", "paddingIndexUsed", "usedForSlice", "usedForUpdate", "operationForUpdate",
            "availableMemoryProportion", "indicesDistribution", "planMinimisationTarget", "indicesAreSorted",
            "partialType"}


@dataclass(frozen=True)
class SlicePlan:
    """``popops::SlicePlan``: what an embedding was planned for. :func:`createSliceableTensor`
    lays a table out by it (its rows split over tiles when it has fewer columns than tiles, see
    :func:`plan_row_split`); the slicing functions slice columns where they live (in two stages
    for a table split along its rows, see the module doc), whatever the plan. The default plan
    ``SlicePlan()`` plans nothing."""

    dataType: object = None  # noqa: N815 - PopLibs names
    numEntries: int = 0  # noqa: N815
    outputSize: int = 0  # noqa: N815
    numLookups: tuple = ()  # noqa: N815
    options: tuple = field(default=(), compare=False)


class embedding:  # noqa: N801 - PopLibs namespace ``popops::embedding``
    """``popops::embedding``: planning of embedding lookups."""

    @staticmethod
    def plan(graph, dataType, numEntries, outputSize, numLookups, options=None) -> SlicePlan:  # noqa: N803
        """``embedding::plan(graph, dataType, numEntries, outputSize, numLookups, options)``.

        Options ``usedForSlice``, ``usedForUpdate`` (not both false), ``operationForUpdate``
        ("none", "add", "max"), ``availableMemoryProportion``, ``indicesDistribution``
        ("uniform", "onePoint"), ``planMinimisationTarget`` ("memory", "cycles"),
        ``indicesAreSorted``. Raises ``poplar.invalid_option`` for others or bad values."""
        opts = _check_options(options, "embedding::plan")
        truthy = {"true": True, "false": False, True: True, False: False}
        try:
            use_slice = truthy[opts.get("usedForSlice", True)]
            use_update = truthy[opts.get("usedForUpdate", True)]
        except KeyError:
            raise poplar.invalid_option("embedding::plan: usedForSlice / usedForUpdate take true or false") from None
        if not (use_slice or use_update):
            raise poplar.invalid_option("embedding::plan: usedForSlice and usedForUpdate cannot both be false")
        if str(opts.get("operationForUpdate", "add")) not in ("none", "add", "max", "mul"):
            raise poplar.invalid_option("embedding::plan: operationForUpdate takes none, add or max")
        if str(opts.get("indicesDistribution", "uniform")) not in ("uniform", "onePoint"):
            raise poplar.invalid_option("embedding::plan: indicesDistribution takes uniform or onePoint")
        if str(opts.get("planMinimisationTarget", "memory")) not in ("memory", "cycles"):
            raise poplar.invalid_option("embedding::plan: planMinimisationTarget takes memory or cycles")
        return SlicePlan(poplar.types.as_type(dataType), int(numEntries), int(outputSize),
                         tuple(int(n) for n in np.atleast_1d(numLookups)), tuple(sorted((k, str(v)) for k, v in opts.items())))


def _check_options(options, name) -> dict:
    opts = dict(options or {})
    bad = sorted(k for k in opts if k not in _OPTIONS)
    if bad:
        raise poplar.invalid_option(f"{name}: unknown option(s) {bad}; known options are {sorted(_OPTIONS)}")
    return opts


def _flag(opts, key) -> bool:
    v = opts.get(key, False)
    if isinstance(v, str):
        if v.lower() not in ("true", "false"):
            raise poplar.invalid_option(f"option {key} takes true or false, got {v!r}")
        return v.lower() == "true"
    return bool(v)


# ----------------------------------------------------------------------------------------------
# layout
# ----------------------------------------------------------------------------------------------
def _check_dims(shape, dims, sizes, name, sizes_one=False):
    try:
        dims = [int(d) for d in dims]
        sizes = [int(s) for s in sizes]
    except TypeError:
        raise poplar.index_error(f"{name}: dims and sizes must be lists of integers") from None
    if len(dims) != len(sizes):
        raise poplar.index_error(f"{name}: {len(dims)} dims but {len(sizes)} sizes; give one size per sliced dimension")
    rank = len(shape)
    for d, s in zip(dims, sizes):
        if not 0 <= d < rank:
            raise poplar.index_error(f"{name}: dimension {d} is out of range for a tensor of shape {list(shape)}")
        if not 1 <= s <= shape[d]:
            raise poplar.index_error(
                f"{name}: slice size {s} in dimension {d} must be between 1 and the dimension's size {shape[d]}")
        if sizes_one and s != 1:
            raise poplar.index_error(f"{name}: slice sizes must be 1 (got {s} in dimension {d})")
    if len(set(dims)) != len(dims):
        raise poplar.index_error(f"{name}: dims {dims} repeat a dimension")
    return dims, sizes


def _columns_view(t, dims):
    """``t`` as ``[*t.dim(dims), columns]`` and the rest dims."""
    rest = [d for d in range(t.rank()) if d not in dims]
    cols = int(np.prod([t.dim(d) for d in rest], dtype=np.int64))
    return t.dimShuffle(dims + rest).reshape([t.dim(d) for d in dims] + [cols]), rest, cols



@dataclass
class _Cols:
    """Runs of columns on one tile: columns ``[begin[i], end[i])`` sit on global tile ``tile[i]``
    (the tile of each column's first element), adjacent runs on different tiles."""

    begin: np.ndarray
    end: np.ndarray
    tile: np.ndarray
    cols: int

    def boxes(self, view) -> Boxes:
        """Boxes of ``view`` ``[*rows, cols]``, each used on the tile of its columns: the view's
        own tile boxes cut at the column runs (so that each box lies in one run of its owner's
        tile map, and elements already on their column's tile are seen to stay)."""
        from openipu.poplar.exchange import tile_boxes
        tb = tile_boxes(view)
        c0 = tb.lo[:, -1]
        c1 = c0 + tb.sz[:, -1]
        a = np.searchsorted(self.end, c0, side="right")          # first column run reaching past c0
        z = np.searchsorted(self.begin, c1, side="left")         # runs starting before c1
        cnt = np.maximum(z - a, 0)
        k = np.repeat(np.arange(len(tb)), cnt)
        r = np.repeat(a, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        lo, sz = tb.lo[k].copy(), tb.sz[k].copy()
        x0 = np.maximum(c0[k], self.begin[r])
        x1 = np.minimum(c1[k], self.end[r])
        lo[:, -1], sz[:, -1] = x0, x1 - x0
        return Boxes(lo, sz, self.tile[r].astype(np.int64))

    def per_tile(self, num_tiles):
        """``(used tiles, columns on each, runs of columns on each)``."""
        n = np.bincount(self.tile, weights=self.end - self.begin, minlength=num_tiles).astype(np.int64)
        r = np.bincount(self.tile, minlength=num_tiles).astype(np.int64)
        used = np.flatnonzero(n)
        return used, n[used], r[used]


def _column_runs(graph, view, name) -> _Cols:
    """The column runs of ``view`` ``[*rows, cols]`` (from its runs; raises if not mapped)."""
    if not graph.is_mapped(view):
        raise poplar.invalid_tile_mapping(
            f"{name}: {unmapped_count(graph, view)} elements of the sliced tensor are not mapped to a tile; map it "
            "first (createSliceableTensor makes a well-mapped one)")
    cols = view.shape()[-1]
    if cols == 0 or view.numElements() == 0:
        z = np.zeros(0, np.int64)
        return _Cols(z, z, z, cols)
    first = view.reshape([view.numElements() // cols, cols])[0]
    b, e, tl = graph.tile_runs_of(first)
    return _Cols(b, e, tl.astype(np.int64), cols)


def _column_major(graph, type_, shape, row_dims, name):
    """A new variable holding ``shape`` column by column: the dims not in ``row_dims`` form the
    columns (row-major among themselves), each column's elements (``row_dims`` row-major)
    contiguous. Returns the variable (unmapped) and its view of ``shape``."""
    shape = [int(s) for s in shape]
    col_dims = [d for d in range(len(shape)) if d not in row_dims]
    order = col_dims + list(row_dims)
    u = graph.addVariable(type_, [shape[d] for d in order], name)
    inv = [0] * len(order)
    for k, d in enumerate(order):
        inv[d] = k
    return u, u.dimShuffle(inv)


def _by_columns(graph, type_, shape, row_dims, name, runs: _Cols | None):
    """A new variable of ``shape`` laid out column by column (:func:`_column_major`), returned
    as a view of ``shape``; mapped by ``runs`` of columns when given."""
    u, view = _column_major(graph, type_, shape, row_dims, name)
    rows = int(np.prod([int(shape[d]) for d in row_dims], dtype=np.int64))
    if runs is not None and runs.begin.size and rows:
        graph.set_tile_runs(u.reshape([u.numElements()]), runs.begin * rows, runs.end * rows, runs.tile)
    return view


def _map_by_columns(graph, view, runs: _Cols) -> None:
    """Map an existing view ``[*rows, cols]`` column run by column run (every row)."""
    if not runs.begin.size:
        return
    rows = view.numElements() // runs.cols
    base = (np.arange(rows, dtype=np.int64) * runs.cols)[:, None]
    graph.set_tile_runs(view.reshape([view.numElements()]), (base + runs.begin).reshape(-1),
                        (base + runs.end).reshape(-1), np.broadcast_to(runs.tile, (rows, runs.begin.size)).reshape(-1))


def createSliceableTensor(graph, type_, shape, dims, sizes, minGrainSize=0, options=None,  # noqa: N802,N803
                          debug_name: str = ""):
    """``popops::createSliceableTensor(graph, type, shape, dims, sizes, minGrainSize=0, name)``
    or ``(graph, type, shape, dims, sizes, plan, options, name)``: a new tensor whose columns (all
    elements that differ only in ``dims``) each sit on one tile, the columns spread linearly over
    the tiles in grains of ``minGrainSize`` columns. With a plan from :meth:`embedding.plan`
    (``numEntries`` > 0) and one sliced dimension, a table with fewer columns than tiles has its rows
    split too, as :func:`plan_row_split` says for the plan's lookups (the tiles of every range
    hold each of its columns whole; :func:`multiSlice` slices it in two stages). The tensor is a
    view of a variable laid out column by column (see the module docstring). Raises
    ``poplar.index_error`` for bad dims or sizes, ``poplar.invalid_option`` for bad options."""
    plan = None
    if isinstance(minGrainSize, SlicePlan):
        _check_options(options, "createSliceableTensor")
        plan, minGrainSize = minGrainSize, 0
    elif isinstance(options, str) and not debug_name:
        debug_name = options
    shape = [int(s) for s in shape]
    dims, sizes = _check_dims(shape, dims, sizes, "createSliceableTensor")
    u, view = _column_major(graph, type_, shape, dims, debug_name or "sliceable")
    rows = int(np.prod([shape[d] for d in dims], dtype=np.int64))
    lookups = sum(plan.numLookups) if plan is not None and plan.numEntries and len(dims) == 1 else None
    map_sliceable(graph, u, rows, u.numElements() // max(rows, 1), type_, lookups, max(1, int(minGrainSize)))
    return view


def map_sliceable(graph, flat, rows: int, cols: int, type_, lookups=None, grain: int = 1) -> None:
    """Map ``flat``, a variable holding a table ``[rows, cols]`` column by column (``[cols,
    rows]`` flattened), for slicing its rows: each column on one tile, the columns spread
    linearly over the tiles in grains of ``grain``; when ``lookups`` is given (a lookup of that
    many offsets is planned: :meth:`embedding.plan`, PopART's Gather) and the table has fewer
    columns than tiles, its rows are split too as :func:`plan_row_split` says."""
    T = graph.getTarget().getNumTiles()
    flat = flat.reshape([flat.numElements()])
    split = row_split_runs(rows, cols, type_, T, lookups) if lookups is not None else None
    if split is not None:
        b, e, tiles = split
    else:
        b, e = linear_tile_runs(cols, T, grain, grain)
        b, e, tiles = b * rows, e * rows, np.arange(b.size)
    if b.size and rows:
        graph.set_tile_runs(flat, b, e, graph._global_tiles(tiles).astype(np.int64))


def createSliceTensor(graph, t, dims, sizes, numIndices, debug_name: str = ""):  # noqa: N802,N803
    """``popops::createSliceTensor(graph, t, dims, sizes, numIndices, name)``: a tensor of shape
    ``[numIndices, *t.shape with dims -> sizes]`` mapped like the columns of ``t`` it slices."""
    dims, sizes = _check_dims(t.shape(), dims, sizes, "createSliceTensor")
    view, rest, cols = _columns_view(t, dims)
    runs = _column_runs(graph, view, "createSliceTensor")
    shape = list(t.shape())
    for d, s in zip(dims, sizes):
        shape[d] = s
    return _by_columns(graph, t.elementType(), [int(numIndices)] + shape, [0] + [1 + d for d in dims],
                       debug_name or "slice", runs)


def createIndicesTensor(graph, dims, numIndices, plan=None, options=None, debug_name: str = ""):  # noqa: N802,N803
    """``popops::createIndicesTensor``: an UNSIGNED_INT tensor ``[numIndices, len(dims)]`` mapped
    linearly."""
    _check_options(options, "createIndicesTensor")
    t = graph.addVariable(poplar.UNSIGNED_INT, [int(numIndices), len(dims)], debug_name or "indices")
    from openipu.poplibs.poputil import mapTensorLinearly
    mapTensorLinearly(graph, t)
    return t


# ----------------------------------------------------------------------------------------------
# cycle estimates
# ----------------------------------------------------------------------------------------------
def dynamic_slice_worker_cycles(regions, region_elems, num_sub, type_, target):
    """``DynamicSlice2D`` worker cycles for ``regions`` regions of ``region_elems`` elements each
    sliced ``num_sub`` times (popopsCycleEstimators.cpp): ``23 + regions x ((29|31|50 + nVectors
    x c) x numSubElements + 13)``; c = 1 for 4-byte types, 2 for half and 1-byte types."""
    regions = np.asarray(regions, np.int64)
    size = type_.size
    if size == 1:
        base, vw, c = 50, 4, 2
    elif size == 2:
        base, vw, c = 31, target.getDataPathWidth() // 16, 2
    else:
        base, vw, c = 29, max(1, target.getDataPathWidth() // (8 * min(size, 4))), 1
    nvec = -(-np.asarray(region_elems, np.int64) // vw)
    return 23 + regions * ((base + nvec * c) * num_sub + 13)


def _slice_tile_cycles(runs: "_Cols", num_sub, type_, target, T):
    """Tile cycles of the DynamicSlice2D vertices on each tile (regions = runs of columns, split
    over workers)."""
    used, ncols, regions = runs.per_tile(T)
    r_w = -(-regions // WORKERS)
    e_w = -(-ncols // np.maximum(np.minimum(WORKERS, ncols), 1))       # elements per worker's region
    e_w = np.where(regions >= WORKERS, -(-ncols // regions), e_w)
    return used, WORKERS * dynamic_slice_worker_cycles(r_w, e_w, num_sub, type_, target)


def _elem_params(type_, target):
    if type_.size == 1:
        return 4, 3
    if type_.size == 2:
        return 2, 2
    return max(1, target.getDataPathWidth() // 32), 2


def multi_slice_tile_cycles(elems_per_slice, num_offsets, type_, target, update=False, partitions=1):
    """Tile cycles of ``MultiSlice`` / ``MultiUpdate`` (getMultiSliceCycleEstimate) with the
    dictionary rows split over the workers (about numOffsets/6 in range per worker [A]), and
    over ``partitions`` row ranges on different tiles (numOffsets/(6 x partitions) in range)."""
    vw, cpv = _elem_params(type_, target)
    in_range = -(-num_offsets // (WORKERS * partitions))
    out_range = num_offsets - in_range
    vec = -(-np.asarray(elems_per_slice, np.int64) // vw)
    per_worker = (29 if update else 30) + in_range * (19 + vec * cpv) + out_range * 8
    return WORKERS * per_worker


def multi_update_op_tile_cycles(elems_per_slice, num_offsets, type_, target, scaled, scale_wider, partitions=1):
    """Tile cycles of ``MultiUpdateOp`` (getMultiUpdateOpCycleEstimate), the offsets in range
    split as in :func:`multi_slice_tile_cycles`."""
    four = type_.size == 4
    cycles = 3 + (29 if four else 30) + ((2 + 2 + 2 * four) if scaled else 0)
    in_range = -(-num_offsets // (WORKERS * partitions))
    per_in = (11 if four else 12) + (1 if (not four and scaled) else 0)
    atom = math.lcm(target.getAtomicStoreGranularity(), type_.size) // type_.size
    e = np.maximum(np.asarray(elems_per_slice, np.int64), atom)
    per_in = per_in + (e // atom - 1) * (3 + int(scale_wider))
    return WORKERS * (cycles + in_range * per_in + (num_offsets - in_range) * 5)


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------
def _offsets(ctx, offset, k):
    return ctx.read(offset).reshape(ctx.replicas, -1, k).to(torch.int64) if k else None


def _dyn_index(o, D, S, remap):
    """Per-dimension indices of a wrapping slice: ``(o + i) mod D``; validity of ``o``."""
    valid = (o >= 0) & (o < D)
    if remap:
        o = torch.where(valid, o, torch.zeros_like(o))
        valid = torch.ones_like(valid)
    return (o.clamp(0, D - 1)[..., None] + torch.arange(S)) % D, valid


@kernel
def _slice_kernel(view, out_view, offset, Ds, Ss, remap, ctx):
    base = ctx.read(view)                              # [R, *Ds, cols]
    R = base.shape[0]
    k = len(Ds)
    offs = _offsets(ctx, offset, k)
    old = ctx.read(out_view)
    res = []
    for r in range(R):                                 # replicas (not data-size scaling)
        x = base[r]
        ok = True
        for j in range(k):
            idx, valid = _dyn_index(offs[r, 0, j], Ds[j], Ss[j], remap)
            x = x.index_select(j, idx)
            ok = ok and bool(valid)
        res.append(x if ok else old[r])
    ctx.write(out_view, torch.stack(res))


@kernel
def _update_kernel(view, s_view, offset, Ds, Ss, remap, ctx):
    base = ctx.read(view).clone()
    upd = ctx.read(s_view)
    k = len(Ds)
    offs = _offsets(ctx, offset, k)
    for r in range(base.shape[0]):
        idxs, ok = [], True
        for j in range(k):
            idx, valid = _dyn_index(offs[r, 0, j], Ds[j], Ss[j], remap)
            idxs.append(idx)
            ok = ok and bool(valid)
        if ok:
            grids = torch.meshgrid(*idxs, indexing="ij") if k else ()
            base[r][grids] = upd[r].to(base.dtype)
    ctx.write(view, base)


def _multi_rows(offs, Ds, remap, padding):
    """Linear dictionary row of each offset ``[R, N, k]`` and its validity; padding rows are invalid."""
    valid = torch.ones(offs.shape[:2], dtype=torch.bool)
    lin = torch.zeros(offs.shape[:2], dtype=torch.int64)
    for j, D in enumerate(Ds):
        o = offs[..., j]
        ok = (o >= 0) & (o < D)
        if remap:
            o = torch.where(ok | (padding & (o == D)), o, torch.zeros_like(o))
            ok = (o >= 0) & (o < D)
        valid &= ok
        lin = lin * D + o.clamp(0, D - 1)
    return lin, valid


@kernel
def _multi_slice_kernel(view, out_view, offsets, Ds, remap, padding, ctx):
    base = ctx.read(view)
    R = base.shape[0]
    flat = base.reshape(R, -1, base.shape[-1])          # [R, rows, cols]
    lin, valid = _multi_rows(ctx.read(offsets).reshape(R, -1, len(Ds)).to(torch.int64), Ds, remap, padding)
    out = torch.gather(flat, 1, lin[..., None].expand(-1, -1, flat.shape[2]))
    ctx.write(out_view, torch.where(valid[..., None], out, torch.zeros((), dtype=out.dtype)))


@kernel
def _multi_update_kernel(view, s_view, offsets, Ds, remap, padding, op, scale, scale_t, ctx):
    base = ctx.read(view)
    R = base.shape[0]
    flat = base.reshape(R, -1, base.shape[-1]).clone()
    s = ctx.read(s_view).reshape(R, -1, flat.shape[2])
    lin, valid = _multi_rows(ctx.read(offsets).reshape(R, -1, len(Ds)).to(torch.int64), Ds, remap, padding)
    rows = flat.shape[1]
    for r in range(R):
        li, sv = lin[r][valid[r]], s[r][valid[r]]
        if op == "none":
            # duplicates: the last offset wins (deterministic)
            last = torch.full((rows,), -1, dtype=torch.int64).scatter_reduce_(
                0, li, torch.arange(li.numel()), "amax", include_self=True)
            hit = last >= 0
            flat[r][hit] = sv[last[hit]].to(flat.dtype)
        elif op == "add":
            k = ctx.read(scale_t).reshape(R)[r].to(torch.float32) if scale_t is not None else torch.tensor(float(scale))
            acc = torch.float32 if flat.is_floating_point() else flat.dtype
            delta = (sv.to(acc) * k.to(acc)) if flat.is_floating_point() else (sv * k.to(sv.dtype))
            flat[r] = flat[r].to(acc).index_add_(0, li, delta).to(flat.dtype)
        else:                                             # max
            flat[r] = flat[r].scatter_reduce(0, li[:, None].expand(-1, flat.shape[2]), sv.to(flat.dtype), "amax",
                                             include_self=True)
    ctx.write(view, flat.reshape(base.shape))


# ----------------------------------------------------------------------------------------------
# dynamic slice / update
# ----------------------------------------------------------------------------------------------
def _check_offset(offset, n, name, rank_two=False):
    if not isinstance(offset, poplar.Tensor):
        raise poplar.graph_connection_error(f"{name}: offsets must be a Tensor, got {type(offset).__name__}")
    if offset.elementType() not in (poplar.UNSIGNED_INT, poplar.INT):
        raise poplar.graph_connection_error(
            f"{name}: offsets must be UNSIGNED_INT or INT, got {offset.elementType()}; cast them first")
    if not rank_two and offset.numElements() != n:
        raise poplar.graph_connection_error(
            f"{name}: the offset tensor has {offset.numElements()} elements (shape {offset.shape()}) but {n} "
            "dimensions are sliced; give one offset per sliced dimension")


def _bcast(t, used) -> Access:
    """Every tile of ``used`` reads all of ``t`` (offsets, a scale)."""
    flat = t.reshape([t.numElements()])
    return Access(flat, read_on_tiles(flat, used))


def _checked_slice(t, offset, dims, sizes, options, name):
    """Validate a dynamic slice / update of ``t``: ``(remap, dims, sizes, slice shape)``."""
    remap = _flag(_check_options(options, name), "remapOutOfBoundIndices")
    dims, sizes = _check_dims(t.shape(), dims, sizes, name)
    _check_offset(offset, len(dims), name)
    shape = list(t.shape())
    for d, sz in zip(dims, sizes):
        shape[d] = sz
    return remap, dims, sizes, shape


def _slice_impl(graph, out, t, offset, dims, sizes, prog, name, options):
    remap, dims, sizes, shape = _checked_slice(t, offset, dims, sizes, options, name)
    view, rest, cols = _columns_view(t, dims)
    runs = _column_runs(graph, view, name)
    if out is not None:
        if out.elementType() != t.elementType() or list(out.shape()) != shape:
            raise poplar.graph_connection_error(
                f"{name}: the output must be {t.elementType()} of shape {shape}, got {out.elementType()} {out.shape()}")
        oview = out.dimShuffle(dims + rest).reshape(sizes + [cols])
        if not graph.is_mapped(out) and cols:
            _map_by_columns(graph, oview, runs)
    else:
        out = _by_columns(graph, t.elementType(), shape, dims, name, runs)
        oview = out.dimShuffle(dims + rest).reshape(sizes + [cols])
    nsub = int(np.prod(sizes, dtype=np.int64))
    if t.numElements() == 0:
        return out
    T = graph._top._target.getNumTiles()
    used, cyc = _slice_tile_cycles(runs, nsub, t.elementType(), graph.getTarget(), T)
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        f"popops::DynamicSlice2D<{t.elementType()}>", used, cyc,
        functools.partial(_slice_kernel, view, oview, offset, [t.dim(d) for d in dims], sizes, remap),
        reads=[Access(view, runs.boxes(view)), _bcast(offset, used), Access(oview, runs.boxes(oview))],
        writes=[Access(oview, runs.boxes(oview))], multi=True, flops=0.0, state_bytes=24))
    prog.add(poplar.program.Execute(cs))
    return out


def dynamicSlice(graph, t, offset, dims, sizes, prog, debug_name: str = "", options=None):  # noqa: N802
    """``popops::dynamicSlice(graph, t, offset, dims, sizes, prog, debugContext, options)``.

    Returns ``t`` sliced to ``sizes[i]`` elements from ``offset[i]`` in each ``dims[i]`` (a new
    tensor, mapped with the columns it came from). ``offset`` holds ``len(dims)`` UNSIGNED_INT or
    INT values. See the module docstring for wrapping and out-of-range offsets.
    Raises ``poplar.index_error`` (bad dims / sizes), ``poplar.graph_connection_error`` (offset
    type or size), ``poplar.invalid_option``, ``poplar.invalid_tile_mapping`` (unmapped ``t``)."""
    return _slice_impl(graph, None, t, offset, dims, sizes, prog, debug_name or "dynamicSlice", options)


def dynamicSliceWithOutput(graph, output, t, offset, dims, sizes, prog, debug_name: str = "", options=None):  # noqa: N802
    """``popops::dynamicSliceWithOutput``: :func:`dynamicSlice` into ``output``."""
    _slice_impl(graph, output, t, offset, dims, sizes, prog, debug_name or "dynamicSlice", options)


def dynamicUpdate(graph, t, s, offset, dims, sizes, prog, debug_name: str = "", options=None):  # noqa: N802
    """``popops::dynamicUpdate(graph, t, s, offset, dims, sizes, prog, debugContext, options)``:
    writes ``s`` (shape of the slice) into ``t`` at ``offset`` (in place; wraps like
    :func:`dynamicSlice`; an out-of-range offset leaves ``t`` unchanged).
    Raises as :func:`dynamicSlice`, plus ``poplar.graph_connection_error`` when ``s`` has the
    wrong type or shape."""
    name = debug_name or "dynamicUpdate"
    remap, dims, sizes, shape = _checked_slice(t, offset, dims, sizes, options, name)
    if not isinstance(s, poplar.Tensor) or s.elementType() != t.elementType() or list(s.shape()) != shape:
        raise poplar.graph_connection_error(
            f"{name}: the update must be {t.elementType()} of shape {shape}, got "
            f"{getattr(s, 'elementType', lambda: type(s).__name__)()} {getattr(s, 'shape', lambda: '')()}")
    view, rest, cols = _columns_view(t, dims)
    runs = _column_runs(graph, view, name)
    if t.numElements() == 0:
        return
    sview = s.dimShuffle(dims + rest).reshape(sizes + [cols])
    nsub = int(np.prod(sizes, dtype=np.int64))
    T = graph._top._target.getNumTiles()
    used, cyc = _slice_tile_cycles(runs, nsub, t.elementType(), graph.getTarget(), T)
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        f"popops::DynamicUpdateSlice2D<{t.elementType()}>", used, cyc,
        functools.partial(_update_kernel, view, sview, offset, [t.dim(d) for d in dims], sizes, remap),
        reads=[Access(view, runs.boxes(view)), Access(sview, runs.boxes(sview)), _bcast(offset, used)],
        writes=[Access(view, runs.boxes(view))], multi=True, flops=0.0, state_bytes=24))
    prog.add(poplar.program.Execute(cs))


# ----------------------------------------------------------------------------------------------
# multi slice / update
# ----------------------------------------------------------------------------------------------
def _multi_common(graph, t, offsets, dims, sizes, name, options):
    opts = _check_options(options, name)
    remap, padding = _flag(opts, "remapOutOfBoundIndices"), _flag(opts, "paddingIndexUsed")
    dims, sizes = _check_dims(t.shape(), dims, sizes, name, sizes_one=True)
    _check_offset(offsets, 0, name, rank_two=True)
    k = len(dims)
    if offsets.rank() == 1 and k == 1:
        offsets = offsets.reshape([offsets.dim(0), 1])
    if offsets.rank() != 2 or offsets.dim(1) != k:
        raise poplar.graph_connection_error(
            f"{name}: offsets must have shape [numOffsets, {k}] (one row per slice), got {offsets.shape()}")
    view, rest, cols = _columns_view(t, dims)
    runs = _column_runs(graph, view, name)
    return offsets, dims, sizes, view, rest, cols, runs, remap, padding


def _slice_shape(t, dims, n):
    shape = list(t.shape())
    for d in dims:
        shape[d] = 1
    return [n] + shape


def multiSlice(graph, t, offsets, dims, sizes, prog, plan=None, options=None, debug_name: str = ""):  # noqa: N802
    """``popops::multiSlice(graph, t, offsets, dims, sizes, prog, plan, options, debugContext)``.

    ``offsets`` is ``[N, len(dims)]`` UNSIGNED_INT/INT (``[N]`` accepted for one dim); sizes must
    be 1. Returns ``[N, *t.shape with dims -> 1]``: slice i is ``t`` at ``offsets[i]``. Options
    ``remapOutOfBoundIndices``, ``paddingIndexUsed`` (offset == size gives zeros).
    Raises like :func:`dynamicSlice`."""
    name = debug_name or "multiSlice"
    offsets, dims, sizes, view, rest, cols, runs, remap, padding = _multi_common(
        graph, t, offsets, dims, sizes, name, options)
    N = offsets.dim(0)
    parts = _row_partitions(graph, view, name) if N and len(dims) == 1 else None
    if parts is not None:
        return _multi_slice_two_stage(graph, t, view, offsets, dims, rest, cols, parts, remap, padding, prog, name)
    out = _by_columns(graph, t.elementType(), _slice_shape(t, dims, N), [0] + [1 + d for d in dims], name, runs)
    oview = out.dimShuffle([0] + [1 + d for d in dims] + [1 + d for d in rest]).reshape([N, cols])
    if N == 0 or t.numElements() == 0:
        return out
    used, ncols, _ = runs.per_tile(graph._top._target.getNumTiles())
    cyc = multi_slice_tile_cycles(ncols, N, t.elementType(), graph.getTarget())
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        f"popops::MultiSlice<{t.elementType()}>", used, cyc,
        functools.partial(_multi_slice_kernel, view, oview, offsets, [t.dim(d) for d in dims], remap, padding),
        reads=[Access(view, runs.boxes(view)), _bcast(offsets, used)],
        writes=[Access(oview, runs.boxes(oview))], multi=True, flops=0.0, state_bytes=32))
    prog.add(poplar.program.Execute(cs))
    return out


#: Most row partitions a two-stage multiSlice handles (PopLibs' plans split the sliced dimension
#: of the tables they create a few to a few tens of ways); a table mapped in more row ranges
#: is sliced in one stage, its columns moved to their first rows' tiles.
MAX_ROW_PARTITIONS = 64


def plan_row_split(rows: int, cols: int, type_, num_tiles: int, lookups: int = 0):
    """How a table ``[rows, cols]`` with fewer columns than tiles is spread over ``num_tiles``
    tiles when its rows are split as well (the partition of PopLibs' embedding plan: the sliced
    dimension split ``split`` ways, the unsliced one in groups of ``grain`` columns, ``split x
    ceil(cols / grain)`` tiles at most ``num_tiles``): ``(split, grain)``, or None to keep one
    range (or when ``cols >= num_tiles``).

    A tile of range ``p`` and column group ``j`` holds ``ceil(rows / split) x grain`` elements
    of the table and, for a lookup of ``lookups`` rows, the ``lookups x grain`` elements of its
    first stage (as a range's update reads every slice of its columns) and ``ceil(lookups /
    split) x grain`` of the output; unsplit, ``(rows + lookups) x grain``. Those elements also
    set its cycles; the plan minimises them. ``grain``
    is at least 4 bytes of columns (PopLibs' ``unslicedGrainSize``: 2 halves or 1 float) and
    ``split`` at most :data:`MAX_ROW_PARTITIONS`; ties go to fewer ranges. Examples (1,472
    tiles, fp32): BERT-base's 30522 x 768 word embedding with 128 lookups is split 15 ways in
    groups of 8 columns (1,440 tiles, 65 KB of table each, against 122 KB on 768 tiles
    unsplit); with no lookups (a plan made without them), 23 ways in groups of 12 (all 1,472
    tiles); its 512 x 768 position embedding is not split."""
    g0 = max(1, 4 // type_.size)
    if cols >= num_tiles or rows < 2 or cols <= 0:
        return None
    s = np.arange(1, min(rows, MAX_ROW_PARTITIONS, num_tiles) + 1, dtype=np.int64)
    grain = np.maximum(g0, -(-cols // (num_tiles // s)))
    n = max(0, int(lookups))
    per_tile = (-(-rows // s) + n + np.where(s > 1, -(-n // s), 0)) * grain
    k = int(np.argmin(per_tile))               # the first minimum: the fewest ranges
    split = int(s[k])
    return (split, int(grain[k])) if split >= 2 else None


def row_split_runs(rows: int, cols: int, type_, num_tiles: int, lookups: int = 0):
    """The tile runs of a table split as :func:`plan_row_split` says: ``(begins, ends, local
    tiles)`` of the flattened column-by-column variable ``[cols, rows]``, column group ``j`` of
    row range ``p`` on tile ``p * groups + j`` (int64 arrays, one interval per column and range);
    None when the rows are not split. :func:`multiSlice` slices such a table in two stages and
    the ``multiUpdate*`` functions update each range on its own tiles."""
    plan = plan_row_split(rows, cols, type_, num_tiles, lookups)
    if plan is None:
        return None
    split, grain = plan
    groups = -(-cols // grain)
    per = -(-rows // split)
    bounds = [(p * per, min(rows, (p + 1) * per)) for p in range(split) if p * per < rows]
    c = np.arange(cols, dtype=np.int64)
    begins = np.concatenate([c * rows + r0 for r0, _ in bounds])
    ends = np.concatenate([c * rows + r1 for _, r1 in bounds])
    tiles = np.concatenate([p * groups + c // grain for p in range(len(bounds))])
    return begins, ends, tiles


def _row_partitions(graph, view, name):
    """The row partitions of a table ``view`` ``[rows, cols]`` whose sliced dimension is split
    over tiles (PopLibs' ``slicedDimSplit``: :func:`createSliceableTensor` with a plan that splits
    it): ``[(first row, end row, column runs)]`` when column 0 spans 2 to
    :data:`MAX_ROW_PARTITIONS` tiles and every partition keeps each of its columns on one tile
    (its first and last rows have the same column runs), else None."""
    rows, cols = view.shape()
    if rows < 2 or cols == 0:
        return None
    b, e, tl = graph.tile_runs_of(view.slice(0, 1, 1))
    if not 2 <= b.size <= MAX_ROW_PARTITIONS or (tl < 0).any():
        return None
    parts = []
    for r0, r1 in zip(b.tolist(), e.tolist()):
        first = _column_runs(graph, view.slice(r0, r0 + 1, 0), name)
        last = _column_runs(graph, view.slice(r1 - 1, r1, 0), name)
        if not (np.array_equal(first.begin, last.begin) and np.array_equal(first.end, last.end)
                and np.array_equal(first.tile, last.tile)):
            return None
        parts.append((r0, r1, first))
    return parts


def _multi_slice_two_stage(graph, t, view, offsets, dims, rest, cols, parts, remap, padding, prog, name):
    """``multiSlice`` of a table split over tiles along its sliced dimension, as PopLibs'
    planned multiSlice does it: stage 0 slices every partition on its own tiles into a buffer
    ``[partitions, N, cols]`` (a row outside the partition gives zeros there); stage 1 picks each
    slice from its row's partition, the lookups split over the partitions' tiles (lookup chunk
    ``q`` on partition ``q``'s tiles), which is where the output is mapped. Returns the output
    ``[N, *t.shape with dims -> 1]``."""
    T = graph._top._target.getNumTiles()
    type_, target = t.elementType(), graph.getTarget()
    N, S = offsets.dim(0), len(parts)
    Ds = [t.dim(d) for d in dims]
    bufs = [_by_columns(graph, type_, [N, cols], [0], f"{name}/stage0", runs) for _, _, runs in parts]
    tiles = np.concatenate([runs.tile for _, _, runs in parts])
    used = np.unique(tiles)
    cyc0 = np.zeros(T)
    for _, _, runs in parts:
        u, ncols, _ = runs.per_tile(T)
        cyc0[u] += multi_slice_tile_cycles(ncols, N, type_, target, partitions=S)
    cs0 = graph.addComputeSet(f"{name}/stage0")
    graph.add_vertex_group(cs0, VertexGroup(
        f"popops::MultiSlice<{type_}>", used, cyc0[used],
        functools.partial(_stage0_kernel, view, bufs, [(r0, r1) for r0, r1, _ in parts], offsets, Ds, remap, padding),
        reads=[Access(view.slice(r0, r1, 0), runs.boxes(view.slice(r0, r1, 0))) for r0, r1, runs in parts]
        + [_bcast(offsets, used)],
        writes=[Access(b, runs.boxes(b)) for b, (_, _, runs) in zip(bufs, parts)], multi=True, flops=0.0,
        state_bytes=32))
    prog.add(poplar.program.Execute(cs0))
    # the output: lookup chunk q (rows of the output) on partition q's column runs
    out = graph.addVariable(type_, [cols, N], name)            # column by column, as _by_columns
    chunk = -(-N // S)
    lo_l, sz_l, tl_l, beg_l, end_l, ctl_l = [], [], [], [], [], []
    for q, (_, _, runs) in enumerate(parts):
        q0, q1 = min(N, q * chunk), min(N, (q + 1) * chunk)
        if q1 <= q0:
            continue
        width = runs.end - runs.begin
        lo_l.append(np.c_[np.full(width.size, q0), runs.begin])
        sz_l.append(np.c_[np.full(width.size, q1 - q0), width])
        tl_l.append(runs.tile)
        # each column of the run holds rows q0..q1 of the column-by-column variable on the tile
        first = np.repeat(runs.begin - np.cumsum(width) + width, width) + np.arange(int(width.sum()))
        beg_l.append(first * N + q0)
        end_l.append(first * N + q1)
        ctl_l.append(np.repeat(runs.tile, width))
    graph.set_tile_runs(out.reshape([cols * N]), np.concatenate(beg_l), np.concatenate(end_l), np.concatenate(ctl_l))
    oview = out.dimShuffle([1, 0])
    boxes = Boxes(np.concatenate(lo_l).astype(np.int64), np.concatenate(sz_l).astype(np.int64),
                  np.concatenate(tl_l).astype(np.int64))
    used1 = np.unique(boxes.tile)
    cyc1 = np.zeros(T)
    np.add.at(cyc1, boxes.tile, multi_slice_tile_cycles(boxes.sz[:, 1], int(chunk), type_, target))
    cs1 = graph.addComputeSet(f"{name}/stage1")
    graph.add_vertex_group(cs1, VertexGroup(
        f"popops::MultiSlice<{type_}>", used1, cyc1[used1],
        functools.partial(_stage1_kernel, bufs, oview, [r1 for _, r1, _ in parts], offsets, Ds, remap, padding),
        reads=[Access(b, boxes) for b in bufs] + [_bcast(offsets, used1)],
        writes=[Access(oview, boxes)], multi=True, flops=0.0, state_bytes=32))
    prog.add(poplar.program.Execute(cs1))
    shape = _slice_shape(t, dims, N)
    # oview is [N, cols]; the output's shape puts the sliced dim (size 1) back among the rest
    res = oview.reshape([N] + [1] + [t.dim(d) for d in rest])
    inv = [0] * len(shape)
    for k, d in enumerate([0] + [1 + d for d in dims] + [1 + d for d in rest]):
        inv[d] = k
    return res.dimShuffle(inv)


@kernel
def _stage0_kernel(view, bufs, bounds, offsets, Ds, remap, padding, ctx):
    base = ctx.read(view)
    R = base.shape[0]
    flat = base.reshape(R, -1, base.shape[-1])
    lin, valid = _multi_rows(ctx.read(offsets).reshape(R, -1, len(Ds)).to(torch.int64), Ds, remap, padding)
    for b, (r0, r1) in zip(bufs, bounds):
        here = valid & (lin >= r0) & (lin < r1)
        rows = torch.gather(flat, 1, lin.clamp(r0, r1 - 1)[..., None].expand(-1, -1, flat.shape[2]))
        ctx.write(b, torch.where(here[..., None], rows, torch.zeros((), dtype=rows.dtype)))


@kernel
def _stage1_kernel(bufs, out_view, ends, offsets, Ds, remap, padding, ctx):
    parts = torch.stack([ctx.read(b) for b in bufs], 1)          # [R, S, N, cols]
    R = parts.shape[0]
    lin, _ = _multi_rows(ctx.read(offsets).reshape(R, -1, len(Ds)).to(torch.int64), Ds, remap, padding)
    which = torch.bucketize(lin, torch.tensor(ends, dtype=torch.int64), right=True).clamp(max=len(bufs) - 1)
    out = torch.gather(parts, 1, which[:, None, :, None].expand(-1, 1, -1, parts.shape[3])).squeeze(1)
    ctx.write(out_view, out)


def _multi_update(graph, t, s, offsets, dims, sizes, prog, options, name, op, scale=None):
    offsets, dims, sizes, view, rest, cols, runs, remap, padding = _multi_common(
        graph, t, offsets, dims, sizes, name, options)
    N = offsets.dim(0)
    want = _slice_shape(t, dims, N)
    if not isinstance(s, poplar.Tensor) or s.elementType() != t.elementType() or \
            (list(s.shape()) != want and s.numElements() != int(np.prod(want, dtype=np.int64))):
        raise poplar.graph_connection_error(
            f"{name}: the slices must be {t.elementType()} of shape {want}, got "
            f"{getattr(s, 'elementType', lambda: type(s).__name__)()} {getattr(s, 'shape', lambda: '')()}")
    scale_t, scale_v = None, None
    if op == "add":
        if isinstance(scale, poplar.Tensor):
            ok = scale.numElements() == 1 and (scale.elementType() == t.elementType() or
                                               (t.elementType() == poplar.HALF and scale.elementType() == poplar.FLOAT))
            if not ok:
                raise poplar.graph_connection_error(
                    f"{name}: scale must be one element of {t.elementType()} (or FLOAT for HALF data), got "
                    f"{scale.elementType()} of shape {scale.shape()}")
            scale_t = scale
        else:
            try:
                scale_v = float(scale)
            except (TypeError, ValueError):
                raise poplar.graph_connection_error(f"{name}: scale must be a tensor or a number, got {scale!r}") from None
    if N == 0 or t.numElements() == 0:
        return
    s = s.reshape(want)
    sview = s.dimShuffle([0] + [1 + d for d in dims] + [1 + d for d in rest]).reshape([N, cols])
    T = graph._top._target.getNumTiles()
    # a table split along its rows (PopLibs' slicedDimSplit) is updated range by range on the
    # range's own tiles, each reading every slice of its columns; else on its columns' tiles
    parts = _row_partitions(graph, view, name) if len(dims) == 1 else None
    parts = parts or [(0, view.dim(0), runs)]
    target = graph.getTarget()
    cyc = np.zeros(T)
    for _, _, r in parts:
        u, ncols, _ = r.per_tile(T)
        if op == "none":
            cyc[u] += multi_slice_tile_cycles(ncols, N, t.elementType(), target, update=True, partitions=len(parts))
        else:
            wider = scale_t is not None and scale_t.elementType().size > t.elementType().size
            cyc[u] += multi_update_op_tile_cycles(ncols, N, t.elementType(), target, op == "add", wider,
                                                  partitions=len(parts))
    used = np.flatnonzero(cyc)
    if op == "none":
        vname = f"popops::MultiUpdate<{t.elementType()}>"
    else:
        vname = f"popops::{'Scaled' if op == 'add' else ''}MultiUpdateOp<{t.elementType()},{op}>"
    ranges = [view.slice(r0, r1, 0) if len(parts) > 1 else view for r0, r1, _ in parts]
    reads = [Access(v, r.boxes(v)) for v, (_, _, r) in zip(ranges, parts)]
    reads += [Access(sview, r.boxes(sview)) for _, _, r in parts] + [_bcast(offsets, used)]
    if scale_t is not None:
        reads.append(_bcast(scale_t, used))
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        vname, used, cyc[used],
        functools.partial(_multi_update_kernel, view, sview, offsets, [t.dim(d) for d in dims], remap, padding, op,
                          scale_v, scale_t),
        reads=reads, writes=[Access(v, r.boxes(v)) for v, (_, _, r) in zip(ranges, parts)], multi=True,
        flops=float(N * cols * (2 if op == "add" else 1 if op == "max" else 0)), state_bytes=32))
    prog.add(poplar.program.Execute(cs))


def multiUpdate(graph, t, s, offsets, dims, sizes, prog, plan=None, options=None, debug_name: str = ""):  # noqa: N802
    """``popops::multiUpdate``: ``t[offsets[i]] = s[i]`` (in place); ``s`` is ``[N, *slice]``.
    Out-of-range offsets are ignored; with repeated offsets the last one wins."""
    _multi_update(graph, t, s, offsets, dims, sizes, prog, options, debug_name or "multiUpdate", "none")


def multiUpdateAdd(graph, t, s, offsets, scale, dims, sizes, prog, plan=None, options=None,  # noqa: N802
                   debug_name: str = ""):
    """``popops::multiUpdateAdd``: ``t[offsets[i]] += scale * s[i]`` for every i (repeats add up).
    ``scale`` is a one-element tensor of t's type (or FLOAT for HALF ``t``), or a number."""
    _multi_update(graph, t, s, offsets, dims, sizes, prog, options, debug_name or "multiUpdateAdd", "add", scale)


def multiUpdateMax(graph, t, s, offsets, dims, sizes, prog, plan=None, options=None, debug_name: str = ""):  # noqa: N802
    """``popops::multiUpdateMax``: ``t[offsets[i]] = max(t[offsets[i]], s[i])``."""
    _multi_update(graph, t, s, offsets, dims, sizes, prog, options, debug_name or "multiUpdateMax", "max")
