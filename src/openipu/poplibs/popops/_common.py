"""Helpers shared by popops' op families: output allocation, per-tile element counts, and the
structural descriptions (runs, boxes) that vertex groups use for their reads and writes.

Not part of the PopLibs API. Everything here costs per run, box or tile, never per element,
except :func:`tile_counts`, kept for callers that still hold a per-element tile array.
"""

from __future__ import annotations

import numpy as np

from openipu import poplar
from openipu.poplar import sets as _sets
from openipu.poplar.exchange import Boxes

_I64 = np.int64


def output_like(graph, type_, shape, candidates, name: str):
    """A new variable of ``type_`` and ``shape``: a clone (element order and tile mapping,
    :meth:`Graph.clone_layout`) of the first of ``candidates`` whose shape equals ``shape`` and
    which is fully mapped; otherwise mapped linearly (PopLibs' ``createOutputForElementWiseOp``
    rule, simplified)."""
    for src in candidates:
        if list(src.shape()) == list(shape) and graph.is_mapped(src):
            return graph.clone_layout(type_, src, name)
    out = graph.addVariable(type_, list(shape), name)
    from openipu.poplibs.poputil import mapTensorLinearly
    mapTensorLinearly(graph, out)
    return out


def tile_counts(graph, tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(used_tiles, elements_on_each)`` for a per-element global tile array (small tensors)."""
    counts = np.bincount(tiles.astype(np.int64), minlength=graph._top._target.getNumTiles())
    used = np.flatnonzero(counts)
    return used, counts[used]


def tile_counts_of(graph, t) -> tuple[np.ndarray, np.ndarray]:
    """``(used_tiles, elements_on_each)`` (global tiles, int64) of a mapped tensor, from its
    regions (no per-element work)."""
    counts = interval_tile_counts(graph, t)
    if counts is None:
        counts = graph.tile_element_counts(t).astype(np.int64)
    used = np.flatnonzero(counts)
    return used, counts[used]


def interval_tile_counts(graph, t) -> np.ndarray | None:
    """Elements of ``t`` on each global tile (int64, one entry per tile of the target) when
    every piece of ``t`` covers an interval of addresses of one variable exactly once (its
    strides, sorted, are the row-major strides of its sizes in some order of its dims: a
    variable, a block, a slice of consecutive elements, or a transpose of one) and the pieces'
    intervals do not overlap: the counts are then those of the intervals, from the variable's
    run-length tile map (counts do not depend on the order of the elements). None otherwise
    (the caller counts from the view's tile boxes). Unmapped elements are not counted."""
    p = t.pieces
    if len(p) == 0:
        return None
    if p.row is not None:
        v, a0, _, sz_, st_ = p.row
        n = 1
        for stride, size in sorted((st_[d], sz_[d]) for d in range(len(sz_)) if sz_[d] != 1):
            if stride != n:
                return None
            n *= size
        if 0 in sz_:
            return None
        addr, num = np.array([a0], np.int64), np.array([n], np.int64)
    else:
        v = int(p.var[0])
        if not (p.var == v).all():
            return None
        sz, st = p.sz, p.st
        order = np.argsort(np.where(sz == 1, 0, st), axis=1, kind="stable")
        ssz, sst = np.take_along_axis(sz, order, 1), np.take_along_axis(st, order, 1)
        expect = np.cumprod(np.c_[np.ones(len(p), np.int64), ssz[:, :-1]], axis=1)
        if not ((ssz == 1) | (sst == expect)).all() or (sz == 0).any():
            return None
        num = np.prod(sz, axis=1, dtype=np.int64)
        o = np.argsort(p.addr, kind="stable")
        addr, num = p.addr[o], num[o]
        if (addr[1:] < addr[:-1] + num[:-1]).any():
            return None
    var = t._state.variables[v]
    b = addr - var.start
    e = b + num
    s, ids = var.tile_starts, var.tile_ids
    i0 = np.searchsorted(s, b, side="right") - 1
    i1 = np.searchsorted(s, e, side="left")
    cnt = i1 - i0
    k = np.repeat(np.arange(b.size), cnt)
    idx = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt) + i0[k]
    lo = np.maximum(s[idx], b[k])
    hi = np.minimum(np.append(s[1:], var.numel)[idx], e[k])
    tl = ids[idx].astype(np.int64)
    keep = tl >= 0
    return np.bincount(tl[keep], weights=(hi - lo)[keep],
                       minlength=graph._top._target.getNumTiles()).astype(np.int64)


def broadcast_view(t, shape):
    """``t`` broadcast to ``shape`` as a view (numpy rules); raises Poplar's ``index_error``."""
    return t.broadcast_to(shape)


def unmapped_count(graph, t) -> int:
    """Elements of ``t`` not mapped to any tile (from its runs)."""
    b, e, tl = graph.tile_runs_of(t)
    return int((e - b)[tl < 0].sum())


def require_mapped(graph, t, message: str) -> None:
    """Raise Poplar's ``invalid_tile_mapping`` with ``message`` unless ``t`` is completely mapped."""
    if not graph.is_mapped(t):
        raise poplar.invalid_tile_mapping(message)


def read_on_tiles(t, tiles) -> Boxes:
    """Boxes for an ``Access`` of ``t``: every (global) tile in ``tiles`` uses the whole of ``t``
    (a scalar, a seed or an index vector each vertex reads)."""
    tiles = np.asarray(tiles, _I64).reshape(-1)
    d = t.rank()
    return Boxes(np.zeros((tiles.size, d), _I64), np.tile(np.asarray(t.shape(), _I64).reshape(1, d), (tiles.size, 1)),
                 tiles)


def flat_boxes(begins, ends, tiles) -> Boxes:
    """Boxes of a 1-D view: flat ranges ``[begins[i], ends[i])`` each used on global ``tiles[i]``
    (empty ranges dropped)."""
    b = np.asarray(begins, _I64).reshape(-1)
    e = np.asarray(ends, _I64).reshape(-1)
    tl = np.broadcast_to(np.asarray(tiles, _I64), b.shape)
    keep = e > b
    return Boxes(b[keep].reshape(-1, 1), (e - b)[keep].reshape(-1, 1), tl[keep].copy())


def union_intervals(key: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Union of intervals ``[lo, hi)`` grouped by ``key`` (int arrays of one length). Returns
    ``(key, lo, hi)`` of the merged intervals, sorted by ``(key, lo)``; touching intervals merge."""
    key, lo, hi = (np.asarray(x, _I64).reshape(-1) for x in (key, lo, hi))
    ok = hi > lo
    key, lo, hi = key[ok], lo[ok], hi[ok]
    if key.size == 0:
        return key, lo, hi
    order = np.lexsort((lo, key))
    key, lo, hi = key[order], lo[order], hi[order]
    new_key = np.r_[True, key[1:] != key[:-1]]
    # running max of ends within each key (offset per key keeps keys apart)
    gid = np.cumsum(new_key) - 1
    base = int(lo.min())
    span = int(hi.max()) - base + 2
    run_max = np.maximum.accumulate(hi - base + gid * span) - gid * span + base
    prev = np.r_[np.iinfo(_I64).min, run_max[:-1]]
    start = new_key | (lo > prev)
    first = np.flatnonzero(start)
    last = np.r_[first[1:], key.size] - 1
    return key[first], lo[first], run_max[last]


def row_intervals_per_tile(graph, view2d):
    """For a mapped 2-D view ``[rows, cols]``: per global tile, the union of the row ranges it
    holds elements of, as ``(tile, row_begin, row_end)`` sorted by ``(tile, row_begin)``
    (from the view's tile boxes: per box, not per element)."""
    from openipu.poplar.exchange import tile_boxes
    b = tile_boxes(view2d)
    ok = b.tile >= 0
    return union_intervals(b.tile[ok], b.lo[ok, 0], b.lo[ok, 0] + b.sz[ok, 0])


def rows_per_tile(graph, view2d) -> np.ndarray:
    """Distinct rows of a 2-D view with elements on each global tile (int64 ``[num_tiles]``)."""
    t, a, z = row_intervals_per_tile(graph, view2d)
    return np.bincount(t, weights=z - a, minlength=graph._top._target.getNumTiles()).astype(_I64)


def split_positions(begins, ends, part_begins, part_ends):
    """Intervals ``[begins[i], ends[i])`` laid end to end form a position space; parts are
    ranges ``[part_begins[j], part_ends[j])`` of it (sorted, disjoint). Returns the pieces
    ``(begin, end, part)`` (int64) of the intervals that fall in each part, in position order
    (empty intervals are dropped). Cost: per interval and part, never per element."""
    b = np.asarray(begins, _I64).reshape(-1)
    e = np.asarray(ends, _I64).reshape(-1)
    keep = e > b
    b, e = b[keep], e[keep]
    pb = np.asarray(part_begins, _I64).reshape(-1)
    pe = np.asarray(part_ends, _I64).reshape(-1)
    if b.size == 0 or pb.size == 0:
        z = np.zeros(0, _I64)
        return z, z, z
    off = np.r_[0, np.cumsum(e - b)]                     # position of each interval's first element
    cuts = _sets.unique(np.concatenate([off[:-1], pb, pe]))
    cuts = cuts[(cuts >= max(0, int(pb[0]))) & (cuts < min(int(off[-1]), int(pe[-1])))]
    x = cuts
    y = np.r_[cuts[1:], min(int(off[-1]), int(pe[-1]))]
    i = np.searchsorted(off, x, side="right") - 1
    j = np.searchsorted(pb, x, side="right") - 1
    inside = (j >= 0) & (x < pe[np.maximum(j, 0)])
    x, y, i, j = x[inside], y[inside], i[inside], j[inside]
    y = np.minimum(y, pe[j])
    return b[i] + (x - off[i]), b[i] + (y - off[i]), j
