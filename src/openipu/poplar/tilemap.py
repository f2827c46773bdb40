"""Tile maps of variables as run-length intervals (``poplar::Graph::TileToTensorMapping``).

Each variable keeps its mapping as two arrays over its flattened elements: ``starts`` (int64,
sorted, ``starts[0] == 0``) and ``tiles`` (int32): run ``r`` covers elements
``[starts[r], starts[r + 1])`` (the last run ends at the variable's size) and lives on global tile
``tiles[r]`` (-1: unmapped). Adjacent runs always have different tiles. Host memory is two
numbers per run, never one per element.
"""

from __future__ import annotations

import numpy as np

from openipu.poplar import sets

_I64 = np.int64


def unmapped() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(1, _I64), np.full(1, -1, np.int32)


def compress(starts: np.ndarray, tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge adjacent runs on the same tile (``starts`` sorted, unique)."""
    if starts.size <= 1:
        return starts.astype(_I64, copy=False), tiles.astype(np.int32, copy=False)
    keep = np.ones(starts.size, bool)
    keep[1:] = tiles[1:] != tiles[:-1]
    return starts[keep].astype(_I64, copy=False), tiles[keep].astype(np.int32, copy=False)


def from_per_element(tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of a per-element tile array."""
    tiles = np.asarray(tiles)
    if tiles.size == 0:
        return unmapped()
    brk = np.flatnonzero(tiles[1:] != tiles[:-1]) + 1
    starts = np.concatenate(([0], brk)).astype(_I64)
    return starts, tiles[starts].astype(np.int32)


def assign(starts: np.ndarray, tiles: np.ndarray, numel: int, b: np.ndarray, e: np.ndarray,
           t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Set elements ``[b[i], e[i])`` to tile ``t[i]`` in the map ``(starts, tiles)`` of a variable of
    ``numel`` elements. Intervals may come in any order; where they overlap the later one wins
    (numpy assignment semantics)."""
    b = np.asarray(b, _I64).reshape(-1)
    e = np.asarray(e, _I64).reshape(-1)
    t = np.broadcast_to(np.asarray(t, np.int32), b.shape)
    ok = e > b
    if not ok.all():
        b, e, t = b[ok], e[ok], t[ok]
    if b.size == 0:
        return starts, tiles
    if b.size == 1 and b[0] == 0 and e[0] == numel:
        return np.zeros(1, _I64), t[:1].copy()
    order = np.argsort(b, kind="stable")
    b, e, t = b[order], e[order], t[order]
    if b.size > 1 and np.any(b[1:] < e[:-1]):
        return _assign_overlapping(starts, tiles, numel, b, e, t, order)
    # segments between all boundaries; each takes the new tile where covered, else the old one
    bounds = sets.unique(np.concatenate((starts, b, e[e < numel])))     # three sorted runs, merged
    j = np.searchsorted(b, bounds, side="right") - 1
    covered = (j >= 0) & (bounds < e[np.maximum(j, 0)])
    old = tiles[np.searchsorted(starts, bounds, side="right") - 1]
    new_tiles = np.where(covered, t[np.maximum(j, 0)], old)
    return compress(bounds, new_tiles)


def _assign_overlapping(starts, tiles, numel, b, e, t, order):
    """Overlapping intervals (sorted by ``b``; ``order`` gives each one's position in the
    caller's sequence): the latest covering interval wins.

    Vectorised range-max: every interval is cut into the canonical nodes of a segment tree over
    the elementary segments (at most two per level), each node keeps the latest interval laid on
    it (``maximum.at``), and each segment takes the latest over its ancestors. O(k log n)."""
    bounds = sets.unique(np.concatenate((starts, b, e[e < numel])))     # three sorted runs, merged
    nseg = bounds.size
    seg_tile = tiles[np.searchsorted(starts, bounds, side="right") - 1].astype(np.int32)
    lo = np.searchsorted(bounds, b)
    hi = np.searchsorted(bounds, e)
    size = 1
    while size < nseg:
        size *= 2
    best = np.full(2 * size, -1, _I64)                      # latest interval rank per tree node
    rank = order.astype(_I64)
    l, r = lo + size, hi + size
    while True:
        active = l < r
        if not active.any():
            break
        left = active & (l % 2 == 1)
        np.maximum.at(best, l[left], rank[left])
        l = np.where(left, l + 1, l)
        right = active & (r % 2 == 1)
        r = np.where(right, r - 1, r)
        np.maximum.at(best, r[right], rank[right])
        l //= 2
        r //= 2
    # push the latest rank down: a leaf's winner is the latest over its path to the root
    node = np.arange(size, size + nseg)
    win = best[node].copy()
    anc = node // 2
    while (anc > 0).any():
        win = np.maximum(win, best[anc])
        anc //= 2
    by_rank = np.empty(rank.size, np.int32)
    by_rank[rank] = t
    covered = win >= 0
    seg_tile[covered] = by_rank[win[covered]]
    return compress(bounds, seg_tile)


def lookup(starts: np.ndarray, tiles: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Tile of each element index in ``idx`` (int32 array like ``idx``)."""
    return tiles[np.searchsorted(starts, idx, side="right") - 1]


def ends(starts: np.ndarray, numel: int) -> np.ndarray:
    return np.append(starts[1:], numel)
