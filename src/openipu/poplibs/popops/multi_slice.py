"""``popops``: ``multiSlice`` / ``multiUpdate`` / ``multiUpdateAdd`` / ``multiUpdateMax``
(PopLibs ``include/popops/DynamicSlice.hpp``): many single-row slices / updates at run-time
offsets. Layout, out-of-range offsets and cycle estimates: :mod:`.dynamic_slice`'s module doc."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.exchange import Boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._slice_layout import (WORKERS, _bcast, _by_columns, _check_dims, _check_offset,
                                                  _check_options, _column_runs, _columns_view, _flag)
from openipu.poplibs.popops.slice_plan import MAX_ROW_PARTITIONS, plan_lookup_split
from openipu.poplar import sets as _sets

__all__ = ["multiSlice", "multiUpdate", "multiUpdateAdd", "multiUpdateMax"]


# ----------------------------------------------------------------------------------------------
# cycle estimates
# ----------------------------------------------------------------------------------------------
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
    lookup_plan = _lookup_plan(graph, view, runs, parts, N) if N and len(dims) == 1 else None
    if lookup_plan is not None:
        oview = _multi_slice_planned(graph, view, offsets, [t.dim(d) for d in dims], lookup_plan, remap, padding,
                                     prog, name)
        return _as_slice_shape(oview, t, dims, rest, N)
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


def _layout_elements(runs, parts, rows, N, num_tiles) -> int:
    """Most elements one tile holds for a multiSlice that follows the table's layout: the
    table's rows of its columns and the ``N`` slices of them (the output, or with row
    partitions the first stage's buffer and a partition's share of the output)."""
    worst = 0
    for r0, r1, r in parts or [(0, rows, runs)]:
        _, ncols, _ = r.per_tile(num_tiles)
        share = -(-N // len(parts)) if parts else 0
        worst = max(worst, int(ncols.max(initial=0)) * ((r1 - r0) + N + share))
    return worst


def _lookup_plan(graph, view, runs, parts, N):
    """The lookup-split plan (:func:`plan_lookup_split`) for a multiSlice of ``view`` ``[rows,
    cols]`` at ``N`` offsets, or None to follow the table's layout: planned when the plan needs
    under half the elements on its busiest tile that following the layout does. That is an
    activation whose columns sit on a few tiles (few columns, or a row-major table whose first
    rows fill a tile or two), whose slices would all land there; a table laid out for slicing
    (:func:`createSliceableTensor`) keeps its layout."""
    rows, cols = view.shape()
    T = graph.getTarget().getNumTiles()
    if view.numElements() == 0:
        return None
    plan = plan_lookup_split(rows, cols, N, view.elementType(), T)
    if plan is None:
        return None
    ls, ss, _, grain = plan
    per = -(-N // ls)
    planned = (-(-rows // ss) + per + (per + -(-per // ss) if ss > 1 else 0)) * grain
    current = _layout_elements(runs, parts, rows, N, graph._top._target.getNumTiles())
    return plan if 2 * planned < current else None


def _multi_slice_planned(graph, view, offsets, Ds, plan, remap, padding, prog, name):
    """``multiSlice`` of ``view`` ``[rows, cols]`` by a lookup-split plan, as PopLibs'
    ``multiSlicePlanned`` runs it whatever the table's layout: tile ``(i, s, h)`` (local tile
    ``(i x S + s) x H + h``) receives rows range ``s`` of column group ``h`` and looks up the
    offsets of lookup chunk ``i``; with the rows split (``S > 1``) each writes its partials
    (zeros for rows outside its range) to a buffer ``[S, N, cols]`` and a second compute set
    picks each slice from its row's partial, chunk ``i``'s lookups split again over the ``S``
    tiles of the column group, where the output lies. Returns the output ``[N, cols]``."""
    L_split, S, H, grain = plan
    rows, cols = view.shape()
    N = offsets.dim(0)
    k = offsets.dim(1)
    type_, target = view.elementType(), graph.getTarget()
    T = graph._top._target.getNumTiles()
    per_l, per_s = -(-N // L_split), -(-rows // S)
    # no empty lookup chunk, row range or column group
    L_split, S, H = -(-N // per_l), -(-rows // per_s), -(-cols // grain)
    # the (i, s, h) grid: lookup chunk [q0, q1), row range [r0, r1), column group [c0, c1)
    i, s, h = (a.reshape(-1) for a in np.meshgrid(np.arange(L_split), np.arange(S), np.arange(H), indexing="ij"))
    q0, q1 = np.minimum(N, i * per_l), np.minimum(N, (i + 1) * per_l)
    r0, r1 = np.minimum(rows, s * per_s), np.minimum(rows, (s + 1) * per_s)
    c0, c1 = np.minimum(cols, h * grain), np.minimum(cols, (h + 1) * grain)
    keep = (q1 > q0) & (r1 > r0) & (c1 > c0)
    i, s, h, q0, q1, r0, r1, c0, c1 = (a[keep] for a in (i, s, h, q0, q1, r0, r1, c0, c1))
    tiles = graph._global_tiles((i * S + s) * H + h).astype(np.int64)
    table_boxes = Boxes(np.c_[r0, c0], np.c_[r1 - r0, c1 - c0], tiles)
    offs_boxes = Boxes(np.c_[q0, np.zeros_like(q0)], np.c_[q1 - q0, np.full_like(q0, k)], tiles)
    out = graph.addVariable(type_, [cols, N], name)              # column by column, as _by_columns
    oview = out.dimShuffle([1, 0])
    vname = f"popops::MultiSlice<{type_}>"

    def map_out(b0, b1, cc0, cc1, tl):
        # rows [b0, b1) of columns [cc0, cc1) of the column-by-column output on tile tl
        w = cc1 - cc0
        c = np.repeat(cc0, w) + (np.arange(int(w.sum())) - np.repeat(np.cumsum(w) - w, w))
        graph.set_tile_runs(out.reshape([cols * N]), c * N + np.repeat(b0, w), c * N + np.repeat(b1, w),
                            np.repeat(tl, w))

    cyc0 = np.zeros(T)
    np.add.at(cyc0, tiles, multi_slice_tile_cycles(c1 - c0, q1 - q0, type_, target, partitions=S))
    used0 = _sets.unique(tiles)
    cs0 = graph.addComputeSet(f"{name}/stage0")
    if S == 1:
        map_out(q0, q1, c0, c1, tiles)
        out_boxes = Boxes(np.c_[q0, c0], np.c_[q1 - q0, c1 - c0], tiles)
        graph.add_vertex_group(cs0, VertexGroup(
            vname, used0, cyc0[used0],
            functools.partial(_multi_slice_kernel, view, oview, offsets, Ds, remap, padding),
            reads=[Access(view, table_boxes), Access(offsets, offs_boxes)],
            writes=[Access(oview, out_boxes)], multi=True, flops=0.0, state_bytes=32))
        prog.add(poplar.program.Execute(cs0))
        return oview
    # stage 0: partials of row range s in buffer s, on the tile of (i, s, h)
    buf = graph.addVariable(type_, [S, N, cols], f"{name}/stage0")
    bounds = [(min(rows, p * per_s), min(rows, (p + 1) * per_s)) for p in range(S)]
    bufs = [buf[p] for p in range(S)]
    flat = buf.reshape([S * N * cols])
    w = c1 - c0
    # each (tile, lookup row) holds a run of w columns of buffer s
    nq = q1 - q0
    rep = np.repeat(np.arange(nq.size), nq)
    qq = np.repeat(q0, nq) + (np.arange(int(nq.sum())) - np.repeat(np.cumsum(nq) - nq, nq))
    start = (s[rep] * N + qq) * cols + c0[rep]
    graph.set_tile_runs(flat, start, start + w[rep], tiles[rep])
    buf_boxes = Boxes(np.c_[s, q0, c0], np.c_[np.ones_like(s), q1 - q0, c1 - c0], tiles)
    graph.add_vertex_group(cs0, VertexGroup(
        vname, used0, cyc0[used0],
        functools.partial(_stage0_kernel, view, bufs, bounds, offsets, Ds, remap, padding),
        reads=[Access(view, table_boxes), Access(offsets, offs_boxes)],
        writes=[Access(buf, buf_boxes)], multi=True, flops=0.0, state_bytes=32))
    prog.add(poplar.program.Execute(cs0))
    # stage 1: lookup chunk i of column group h split S ways, part s on the tile of (i, s, h)
    per_2 = -(-per_l // S)
    b0, b1 = np.minimum(q1, q0 + s * per_2), np.minimum(q1, q0 + (s + 1) * per_2)
    k1 = b1 > b0
    b0, b1, t1, cc0, cc1 = b0[k1], b1[k1], tiles[k1], c0[k1], c1[k1]
    map_out(b0, b1, cc0, cc1, t1)
    used1 = _sets.unique(t1)
    cyc1 = np.zeros(T)
    np.add.at(cyc1, t1, multi_slice_tile_cycles(cc1 - cc0, b1 - b0, type_, target))
    cs1 = graph.addComputeSet(f"{name}/stage1")
    graph.add_vertex_group(cs1, VertexGroup(
        vname, used1, cyc1[used1],
        functools.partial(_stage1_kernel, bufs, oview, [r for _, r in bounds], offsets, Ds, remap, padding),
        reads=[Access(buf, Boxes(np.c_[np.zeros_like(b0), b0, cc0], np.c_[np.full_like(b0, S), b1 - b0, cc1 - cc0], t1)),
               Access(offsets, Boxes(np.c_[b0, np.zeros_like(b0)], np.c_[b1 - b0, np.full_like(b0, k)], t1))],
        writes=[Access(oview, Boxes(np.c_[b0, cc0], np.c_[b1 - b0, cc1 - cc0], t1))], multi=True, flops=0.0,
        state_bytes=32))
    prog.add(poplar.program.Execute(cs1))
    return oview


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
    used = _sets.unique(tiles)
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
        writes=[Access(b, runs.column_boxes(b, N)) for b, (_, _, runs) in zip(bufs, parts)], multi=True, flops=0.0,
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
    used1 = _sets.unique(boxes.tile)
    cyc1 = np.zeros(T)
    np.add.at(cyc1, boxes.tile, multi_slice_tile_cycles(boxes.sz[:, 1], int(chunk), type_, target))
    cs1 = graph.addComputeSet(f"{name}/stage1")
    graph.add_vertex_group(cs1, VertexGroup(
        f"popops::MultiSlice<{type_}>", used1, cyc1[used1],
        functools.partial(_stage1_kernel, bufs, oview, [r1 for _, r1, _ in parts], offsets, Ds, remap, padding),
        reads=[Access(b, boxes) for b in bufs] + [_bcast(offsets, used1)],
        writes=[Access(oview, boxes)], multi=True, flops=0.0, state_bytes=32))
    prog.add(poplar.program.Execute(cs1))
    return _as_slice_shape(oview, t, dims, rest, N)


def _as_slice_shape(oview, t, dims, rest, N):
    """``oview`` ``[N, cols]`` as the output shape ``[N, *t.shape with dims -> 1]`` (a view)."""
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
