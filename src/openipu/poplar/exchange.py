"""Exchange volumes from regions: which bytes and messages each tile sends and receives.

The cost model (:mod:`openipu.poplar.cost`) needs, per tile, the bytes and the regions
(messages) it receives and sends in one exchange phase. Here those come from structure:

- a tensor view is a few affine pieces over variables (:mod:`openipu.poplar.regions`);
- a variable's tile mapping is a run-length list of intervals (:mod:`openipu.poplar.tilemap`);
- where elements are needed is a list of *boxes* of the view's index space, each with a tile
  (:class:`Boxes`), e.g. the tile boxes of an op's output (:func:`tile_boxes`).

A box laid over a piece is a *lattice* of addresses ``base + sum(j_i * T_i)``, ``0 <= j_i < n_i``
(:func:`lattices`). Lattices of views are *monotone*: their addresses increase with the
lexicographic order of ``j`` (outermost dim first), so the number of lattice points below an
address is a closed form (:func:`count_below`), and so is the number of points and of contiguous
runs inside a run of a tile map. The work is proportional to the number of (box, piece, run)
overlaps, never to the number of elements.

This module holds that geometry; the moves of a transfer and its volumes per tile
(:func:`transfer_pairs`, :func:`add_volume`) are in :mod:`openipu.poplar.exchange_moves`, whose
names are importable from here too.

Semantics (the same as the per-element model it replaces, :func:`cost.exchange_volume`):

- a tile receives each element it needs from another tile once; consecutive addresses from one
  source are one message;
- a tile sends each element once however many tiles need it (the exchange multicasts); sends of
  consecutive addresses are one message;
- traffic between tiles of different IPUs also counts as global (IPU-Link) bytes.

Where a box meets a piece in a lattice that is not contiguous and the view has aliases, the
deduplication above is approximated (identical lattices count once; overlapping ones add up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from openipu.poplar import regions as R
from openipu.poplar import sets as _sets
from openipu.poplar import structure_cache as SC

_I64 = np.int64


@dataclass
class Boxes:
    """Boxes of a tensor's index space, each on one tile: ``lo``, ``sz`` ``[k, d]``, ``tile`` ``[k]``
    (global tile; -2 for the host)."""

    lo: np.ndarray
    sz: np.ndarray
    tile: np.ndarray

    @staticmethod
    def whole(shape, tile: int) -> "Boxes":
        d = len(shape)
        return Boxes(np.zeros((1, d), _I64), np.array([list(shape)], _I64).reshape(1, d), np.array([tile], _I64))

    def __len__(self):
        return int(self.tile.size)


@dataclass
class RegionTransfer:
    """Elements of ``view`` that move between their owner tiles and the tiles of ``boxes``.

    ``to_owner`` False (a read): element at index ``i`` is needed on the tile of every box that
    holds ``i``. ``to_owner`` True (a write, or a host transfer with box tile -2): it comes from
    that tile and goes to its owner. ``count_send`` False: the same values are sent by another
    transfer (multicast), so only receives count. ``supertile_recv_scale``: bytes a tile receives
    from outside its supertile count at this fraction (its supertile partner receives the same
    values in the same cycles; see :class:`openipu.poplar.graph.Access`).
    """

    view: object
    boxes: Boxes
    to_owner: bool = False
    count_send: bool = True
    supertile_recv_scale: float = 1.0


# ----------------------------------------------------------------------------------------------
# lattices
# ----------------------------------------------------------------------------------------------
def monotone(T: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Whether each lattice's addresses increase with its lexicographic order (``T`` ascending):
    ``T[j+1] > sum_{i<=j} T[i] (n[i] - 1)`` for every used ``j + 1``."""
    span = np.cumsum(T * (n - 1), axis=1)
    ok = (T[:, 1:] == 0) | (T[:, 1:] > span[:, :-1])
    return ok.all(axis=1) if ok.size else np.ones(T.shape[0], bool)


def count_below(base: np.ndarray, T: np.ndarray, n: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Number of points of each monotone lattice with an address below ``x`` (arrays ``[m]``)."""
    m, d = T.shape
    rem = np.asarray(x, _I64) - base
    total = np.zeros(m, _I64)
    if d == 0:
        return (rem > 0).astype(_I64)
    P = np.ones((m, d), _I64)                           # points per unit of each dim
    for j in range(1, d):
        P[:, j] = P[:, j - 1] * n[:, j - 1]
    active = rem > 0
    nused = (T > 0).sum(axis=1)
    total = np.where((nused == 0) & active, 1, total)
    for j in range(d - 1, 0, -1):
        use = active & (T[:, j] > 0)
        if not use.any():
            continue
        Tj = np.where(use, T[:, j], 1)
        q = np.where(use, rem // Tj, 0)
        full = use & (q >= n[:, j])
        total = np.where(full, total + n[:, j] * P[:, j], total)
        step = use & ~full
        total = np.where(step, total + q * P[:, j], total)
        rem = np.where(step, rem - q * Tj, rem)
        active = active & ~full
    use = active & (T[:, 0] > 0)
    T0 = np.where(use, T[:, 0], 1)
    total = np.where(use, total + np.minimum(-(-rem // T0), n[:, 0]), total)
    return total


def unrank(base: np.ndarray, T: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Address of the ``k``-th point (lexicographic order) of each lattice."""
    out = np.asarray(base, _I64).copy()
    k = np.asarray(k, _I64).copy()
    for j in range(T.shape[1]):
        nj = np.maximum(n[:, j], 1)
        out += (k % nj) * T[:, j]
        k //= nj
    return out


# ----------------------------------------------------------------------------------------------
# tile boxes of a view
# ----------------------------------------------------------------------------------------------
def variable_runs(view, var_ids):
    """``(starts, ends, tiles)`` of the tile-map runs of the variables ``var_ids`` (ids, repeats
    allowed) of ``view``'s space, sorted by address."""
    state = view._state
    space = state.space(view._type)
    gst, gtl, gvi = space.runs_of([state.variables[v].space_index for v in _sets.unique(var_ids).tolist()])
    return gst, space.run_ends(gst, gvi), gtl


def _run_overlaps(view, var_ids, lo, hi, runs=None):
    """The tile-map runs that each address interval ``[lo[i], hi[i]]`` (inclusive, within the
    variables ``var_ids`` of ``view``'s space) meets: ``(i, run, starts, ends, tiles)``, one
    ``(i, run)`` pair per meeting, ``starts`` / ``ends`` / ``tiles`` indexed by run (``runs``:
    :func:`_runs` of those variables, when the caller has them)."""
    gst, gend, gtl = runs if runs is not None else variable_runs(view, var_ids)
    r0 = np.searchsorted(gst, lo, side="right") - 1
    r1 = np.searchsorted(gst, hi, side="right") - 1
    cnt = r1 - r0 + 1
    i, local = R.group_ranks(cnt)
    ri = r0[i] + local
    return i, ri, gst, gend, gtl


def tile_boxes(t) -> Boxes:
    """The partition of ``t``'s index space into boxes, each held by one tile (the tile mapping
    of the view, by structure). Unmapped elements get tile -1. At most ``2 m - 1`` boxes per
    overlap of a piece with a run of its variable's tile map (``m``: the piece's non-unit dims).
    Memoised on the view's structure and its variables' mappings (:mod:`structure_cache`)."""
    d = t.rank()
    if len(t.pieces) == 0:
        return Boxes(np.zeros((0, d), _I64), np.zeros((0, d), _I64), np.zeros(0, _I64))
    if not SC.enabled():
        return _tile_boxes(t)
    key = SC.view_key(b"tile_boxes", t, True)[0]
    hit = SC.MEMO.get(key)
    if hit is None:
        b = _tile_boxes(t)
        hit = (b.lo, b.sz, b.tile)
        SC.MEMO.put(key, hit)
    return Boxes(hit[0].copy(), hit[1].copy(), hit[2].copy())


def _tile_boxes(t) -> Boxes:
    p = t.pieces
    d = t.rank()
    base, T, n, dim, flip = R.sorted_lattices(p.addr, p.sz, p.st)
    lo_a, hi_a = p.address_bounds()
    pi, ri, gst, gend, gtl = _run_overlaps(t, p.var, lo_a, hi_a)
    mono = monotone(T, n)
    if not mono.all():
        raise NotImplementedError("tile_boxes: a view whose pieces are not monotone lattices")
    S = np.maximum(gst[ri], lo_a[pi])
    E = np.minimum(gend[ri], hi_a[pi] + 1)
    u = count_below(base[pi], T[pi], n[pi], S)
    v = count_below(base[pi], T[pi], n[pi], E)
    keep = v > u
    pi, ri, u, v = pi[keep], ri[keep], u[keep], v[keep]
    los, szs, tiles = [], [], []
    # range_boxes takes one radix list: group the overlaps by their lattice's sizes
    nrev = n[:, ::-1]                                  # outermost lattice dim first
    if len(p) == 1:
        key, inv = nrev, None
    else:       # grouped by piece (few), not by overlap (many)
        key, pinv = np.unique(nrev, axis=0, return_inverse=True)
        inv = pinv.reshape(-1)[pi]
    for g in range(key.shape[0]):
        sel = np.arange(pi.size) if inv is None else np.flatnonzero(inv == g)
        if not sel.size:
            continue
        owner, blo, bsz = R.range_boxes(u[sel], v[sel], key[g].tolist())
        if inv is None:
            # one piece: its dims, flips and sizes are the same for every box (no per-box gathers)
            los.append(np.repeat(p.lo[:1], owner.size, axis=0))
            szs.append(np.repeat(p.sz[:1], owner.size, axis=0))
            for j, (od, fl, nn) in enumerate(zip(dim[0, ::-1].tolist(), flip[0, ::-1].tolist(),
                                                 n[0, ::-1].tolist())):
                if od >= 0:
                    c0, cs = blo[:, j], bsz[:, j]
                    los[-1][:, od] = p.lo[0, od] + (nn - c0 - cs if fl else c0)
                    szs[-1][:, od] = cs
            tiles.append(gtl[ri[sel][owner]].astype(_I64))
            continue
        pk = pi[sel][owner]
        # lattice coords (outermost first) back to box dims of the piece
        lo_box = p.lo[pk].copy()
        sz_box = p.sz[pk].copy()
        dims_rev, flip_rev, n_rev = dim[pk][:, ::-1], flip[pk][:, ::-1], n[pk][:, ::-1]
        for j in range(d):
            od = dims_rev[:, j]
            use = od >= 0
            if not use.any():
                continue
            rows = np.flatnonzero(use)
            c0, cs, nn = blo[rows, j], bsz[rows, j], n_rev[rows, j]
            start = np.where(flip_rev[rows, j], nn - c0 - cs, c0)
            lo_box[rows, od[rows]] = p.lo[pk[rows], od[rows]] + start
            sz_box[rows, od[rows]] = cs
        los.append(lo_box)
        szs.append(sz_box)
        tiles.append(gtl[ri[sel][owner]].astype(_I64))
    if not los:
        return Boxes(np.zeros((0, d), _I64), np.zeros((0, d), _I64), np.zeros(0, _I64))
    return Boxes(np.concatenate(los), np.concatenate(szs), np.concatenate(tiles))


def _range_counts(t, num_tiles: int):
    """:func:`tile_counts` of a view whose pieces are each one range of consecutive addresses
    (whole variables, their reshapes and row slices: most op outputs), from the overlaps of those
    ranges with the tile-map runs; None for any other view."""
    p = t.pieces
    if len(p) == 0 or t.numElements() == 0:
        return None
    if p.row is not None:
        if not R._dense(p.row[3], p.row[4]):
            return None
        start, length = np.array([p.row[1]], _I64), np.array([int(np.prod(p.row[3], dtype=_I64))], _I64)
    else:
        base, T, n = R.canonical(p.addr, p.sz, p.st)
        one = (T[:, 1:] == 0).all(axis=1) & ((T[:, 0] == 1) | (n[:, 0] == 1)) if T.shape[1] else np.ones(len(p), bool)
        length = np.prod(n, axis=1, dtype=_I64) if n.shape[1] else np.ones(len(p), _I64)
        if not one.all() or int(length.sum()) != t.numElements():     # strided, or broadcast
            return None
        start = base
    end = start + length
    pi, ri, gst, gend, gtl = _run_overlaps(t, p.var, start, end - 1)
    over = np.minimum(gend[ri], end[pi]) - np.maximum(gst[ri], start[pi])
    tiles = gtl[ri].astype(_I64)
    ok = (tiles >= 0) & (over > 0)
    return np.bincount(tiles[ok], weights=over[ok], minlength=num_tiles).astype(np.float64)


def tile_counts(t, num_tiles: int) -> np.ndarray:
    """Elements of ``t`` on each global tile (float64 ``[num_tiles]``; unmapped ones left out)."""
    fast = _range_counts(t, num_tiles)
    if fast is not None:
        return fast
    b = tile_boxes(t)
    nel = np.prod(b.sz, axis=1, dtype=_I64) if b.sz.shape[1] else np.ones(len(b), _I64)
    ok = b.tile >= 0
    return np.bincount(b.tile[ok], weights=nel[ok], minlength=num_tiles).astype(np.float64)


# ----------------------------------------------------------------------------------------------
# boxes of a view laid over its pieces
# ----------------------------------------------------------------------------------------------
#: Views with more pieces than this are intersected with boxes through a :class:`_SlabIndex`.
SLAB_MIN_PIECES = 16


class _SlabIndex:
    """Pieces sorted into slabs by their corner along each dim, so that the pieces a box may meet
    are, for any dim, one range of the pieces sorted on it: those of the slabs from the first
    whose pieces may reach the box (running maximum of the slabs' ends) to the last that starts
    before the box ends. Each box takes the dim that leaves it the fewest candidates. Exact for
    any set of pieces."""

    def __init__(self, p):
        lo, hi = p.lo, p.lo + p.sz
        self.dims = []
        for j in range(lo.shape[1]):
            order = np.argsort(lo[:, j], kind="stable")
            slo = lo[order, j]
            first = np.r_[True, slo[1:] != slo[:-1]]
            starts = np.flatnonzero(first)
            reach = np.maximum.accumulate(np.maximum.reduceat(hi[order, j], starts))
            self.dims.append((order, slo[first], np.r_[starts, slo.size], reach))
        self.orders = np.stack([d[0] for d in self.dims])          # [d, pieces]

    def _range(self, j, bl, bh):
        order, slab_lo, slab_start, reach = self.dims[j]
        s0 = np.searchsorted(reach, bl[:, j], side="right")
        s1 = np.maximum(np.searchsorted(slab_lo, bh[:, j], side="left"), s0)
        return slab_start[s0], slab_start[s1]

    def pairs(self, bl, bh):
        """``(box, piece)`` candidate pairs (piece indices into the unsorted pieces)."""
        ranges = [self._range(j, bl, bh) for j in range(len(self.dims))]
        counts = np.stack([b - a for a, b in ranges], axis=1)
        best = np.argmin(counts, axis=1)
        rows = np.arange(bl.shape[0])
        a = np.stack([r[0] for r in ranges], axis=1)[rows, best]
        cnt = counts[rows, best]
        owner, local = R.group_ranks(cnt)
        bi = rows[owner]
        pos = np.repeat(a, cnt) + local
        return bi, self.orders[np.repeat(best, cnt), pos]


def _cell_ranges(edges, lo, hi):
    """Per box (rows of ``lo``/``hi``) and dim, the range ``[a, b)`` of the grid's intervals it
    meets, and the cells it meets enumerated: ``(box index, cell multi-index list)``."""
    a = [np.searchsorted(e, lo[:, j], side="right") - 1 for j, e in enumerate(edges)]
    b = [np.searchsorted(e, hi[:, j], side="left") for j, e in enumerate(edges)]
    n = np.stack([np.maximum(y - x, 0) for x, y in zip(a, b)], axis=1)
    cnt = np.prod(n, axis=1, dtype=_I64)
    bi, local = R.group_ranks(cnt)
    idx = []
    for j in range(len(edges) - 1, -1, -1):
        nj = n[bi, j]
        idx.append(a[j][bi] + local % nj)
        local //= nj
    return bi, tuple(reversed(idx))


class _GridIndex:
    """The grid cut by every piece's edges, each cell naming the piece that covers it (pieces
    partition the view). A box meets the pieces of the cells in its per-dim ranges. Exact; used
    when the grid has not many more cells than there are pieces (a blocked tensor, or views of
    one whose reshapes cut blocks at different places)."""

    def __init__(self, edges, cell, exact):
        self.edges, self.cell, self.exact = edges, cell, exact

    @staticmethod
    def of(p, max_cells_per_piece: int = 8):
        lo, hi = p.lo, p.lo + p.sz
        edges = [_sets.unique(np.r_[lo[:, j], hi[:, j]]) for j in range(lo.shape[1])]
        counts = [e.size - 1 for e in edges]
        total = math.prod(counts)
        if total > max_cells_per_piece * len(p) + 4096:
            return None
        pi, idx = _cell_ranges(edges, lo, hi)
        cell = np.full(total, -1, _I64)
        cell[np.ravel_multi_index(idx, counts)] = pi
        return _GridIndex(edges, cell.reshape(counts), total == len(p))

    def pairs(self, bl, bh):
        bi, idx = _cell_ranges(self.edges, bl, bh)
        pi = self.cell[idx]
        ok = pi >= 0
        bi, pi = bi[ok], pi[ok]
        if not self.exact and bi.size:            # a piece over several cells: once per box
            m = int(self.cell.max()) + 1
            key = _sets.unique(bi * m + pi)
            bi, pi = key // m, key % m
        return bi, pi


def lattices(view, boxes: Boxes, chunk: int = 1 << 20):
    """Intersect ``boxes`` with ``view``'s pieces. Returns ``(box index, var id, base, T, n,
    elements)`` with ``T``/``n`` the merged canonical lattice (:func:`regions.canonical`) of each
    non-empty intersection and its number of view elements (more than its lattice points where
    the view broadcasts). Many pieces are searched through a :class:`_SlabIndex`. Memoised on
    the view's structure relative to its variables and the boxes (:mod:`structure_cache`)."""
    if not SC.enabled() or len(view.pieces) == 0:
        return _lattices(view, boxes, chunk)
    key, uv, starts = SC.view_key(b"lattices", view, False, (np.array([chunk]), boxes.lo, boxes.sz))
    hit = SC.MEMO.get(key)
    if hit is None:
        bi, var, base, T, n, elems = _lattices(view, boxes, chunk)
        local = np.searchsorted(uv, var)
        hit = (bi, local, base - starts[local], T, n, elems)
        SC.MEMO.put(key, hit)
    bi, local, rel, T, n, elems = hit
    return bi.copy(), uv[local], rel + starts[local], T.copy(), n.copy(), elems.copy()


def _lattices(view, boxes: Boxes, chunk: int = 1 << 20):
    p = view.pieces
    k, m = len(boxes), len(p)
    d = view.rank()
    out = []
    index = None
    if m > SLAB_MIN_PIECES and d:
        if p.index is None:
            p.index = _GridIndex.of(p) or _SlabIndex(p)
        index = p.index
    step = max(1, chunk // (16 if index is not None else max(m, 1)))
    for a in range(0, k, step):
        bl, bs = boxes.lo[a:a + step], boxes.sz[a:a + step]
        if m == 1 and d:
            lo = np.maximum(bl, p.lo)
            hi = np.minimum(bl + bs, p.lo + p.sz)
            bi = np.arange(a, a + bl.shape[0])
            pi = np.zeros(bl.shape[0], _I64)
        elif index is not None:
            bi, pi = index.pairs(bl, bl + bs)
            lo = np.maximum(bl[bi], p.lo[pi])
            hi = np.minimum((bl + bs)[bi], (p.lo + p.sz)[pi])
            bi = bi + a
        else:
            lo = np.maximum(bl[:, None, :], p.lo[None, :, :])
            hi = np.minimum((bl + bs)[:, None, :], (p.lo + p.sz)[None, :, :])
            ok = (hi > lo).all(axis=2) if d else np.ones((bl.shape[0], m), bool)
            bi, pi = np.nonzero(ok)
            lo, hi = lo[bi, pi], hi[bi, pi]
            bi = bi + a
        if d:
            ok = (hi > lo).all(axis=1)
            bi, pi, lo, hi = bi[ok], pi[ok], lo[ok], hi[ok]
        addr = p.addr[pi] + ((lo - p.lo[pi]) * p.st[pi]).sum(axis=1) if d else p.addr[pi]
        base, T, n = R.canonical(addr, hi - lo, p.st[pi]) if d else (addr, np.zeros((bi.size, 0), _I64),
                                                                     np.zeros((bi.size, 0), _I64))
        elems = np.prod(hi - lo, axis=1, dtype=_I64) if d else np.ones(bi.size, _I64)
        out.append((bi, p.var[pi], base, T, n, elems))
    if not out:
        z = np.zeros(0, _I64)
        return z, z, z, np.zeros((0, max(d, 0)), _I64), np.zeros((0, max(d, 0)), _I64), z
    return tuple(np.concatenate([o[i] for o in out]) for i in range(6))


def _register_records():
    from openipu.poplar.graph_codec import data_class
    data_class(Boxes)


_register_records()
