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
every range on its own tiles. A ``multiSlice`` of a table whose columns sit on a few tiles (an
activation with few columns, or a row-major one whose first row fills a tile or two: a graph
network's node features gathered at its edges) would put every slice on those tiles; it is
planned instead as PopLibs' ``multiSlicePlanned`` runs an embedding plan, whatever the table's
layout: the lookups, the rows and the columns split over the tiles, each tile receiving its
piece of the table (:func:`~.slice_plan.plan_lookup_split`, :mod:`.multi_slice`).

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

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._slice_layout import (WORKERS, _bcast, _Cols, _by_columns, _check_dims, _check_offset,  # noqa: F401
                                                  _check_options, _column_runs, _columns_view, _flag,
                                                  _map_by_columns)
# the other slicing families, re-exported here (``popops.dynamic_slice`` kept its names)
from openipu.poplibs.popops.slice_plan import (MAX_ROW_PARTITIONS, SlicePlan, createIndicesTensor,  # noqa: F401
                                               createSliceableTensor, createSliceTensor, embedding,
                                               map_sliceable, plan_row_split, row_split_runs)
from openipu.poplibs.popops.multi_slice import (multiSlice, multi_slice_tile_cycles,  # noqa: F401
                                                multi_update_op_tile_cycles, multiUpdate, multiUpdateAdd,
                                                multiUpdateMax)

__all__ = ["SlicePlan", "embedding", "createSliceableTensor", "createSliceTensor", "createIndicesTensor",
           "dynamicSlice", "dynamicSliceWithOutput", "dynamicUpdate", "multiSlice", "multiUpdate",
           "multiUpdateAdd", "multiUpdateMax"]


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


def _slice_tile_cycles(runs: _Cols, num_sub, type_, target, T):
    """Tile cycles of the DynamicSlice2D vertices on each tile (regions = runs of columns, split
    over workers)."""
    used, ncols, regions = runs.per_tile(T)
    r_w = -(-regions // WORKERS)
    e_w = -(-ncols // np.maximum(np.minimum(WORKERS, ncols), 1))       # elements per worker's region
    e_w = np.where(regions >= WORKERS, -(-ncols // regions), e_w)
    return used, WORKERS * dynamic_slice_worker_cycles(r_w, e_w, num_sub, type_, target)

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

# ----------------------------------------------------------------------------------------------
# dynamic slice / update
# ----------------------------------------------------------------------------------------------
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
