"""The cost model: predicted IPU cycles of compute sets, exchanges, syncs and host transfers.

Everything here is a *prediction for the real IPU* (tile clock cycles), never host time. All
work is vectorised over tiles and elements with numpy.

A step's cost is a :class:`StepCost`: per IPU, the duration of each category (the slowest tile
sets the length of a BSP phase) and the sum over tiles of each tile's own busy cycles (for
Poplar's "Tile average ..." figures).

Compute (Poplar's IPU Model, poplar.md 4.1): single-worker vertices are placed round-robin on the
tile's 6 worker contexts; a tile's compute time is ``6 x`` the busiest context's worker cycles
("including idle threads"), its busy time the sum of all worker cycles ("excluding idle
threads"). MultiVertex estimates are already tile cycles. Exchange: a tile receives at
``exchangeBytesPerCycle`` (4 B/cycle) plus a cost per received region; multicast sends count
once. Host transfers: bytes over the calibrated host bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from openipu.poplar import calibration as cal
from openipu.poplar import regions as R
from openipu.poplar import structure_cache as SC
from openipu.poplar.exchange import Boxes, RegionTransfer, _run_overlaps, variable_runs
from openipu.poplar.exchange_moves import UNSET as X_UNSET
from openipu.poplar.exchange_moves import _union, add_volume, code_units

CATEGORIES = ("compute", "exchange", "global_exchange", "host_exchange", "sync")


@dataclass
class StepCost:
    """Predicted cost of one program step, per IPU (numpy arrays of length ``num_ipus``).

    ``duration[c]``: cycles the step adds to each IPU's clock in category ``c``.
    ``tile_sum[c]``: sum over that IPU's tiles of each tile's own cycles in ``c`` (the profile
    divides by tiles per IPU for Poplar's "Tile average" lines); ``tile_sum['compute_excl']``
    counts busy worker cycles only. ``flops``: floating-point operations. ``by_vertex_type``:
    {type: (instances, tile cycles summed over vertices)}.
    """

    num_ipus: int
    duration: dict = field(default_factory=dict)
    tile_sum: dict = field(default_factory=dict)
    flops: float = 0.0
    by_vertex_type: dict = field(default_factory=dict)
    syncs: int = 0
    tile_compute: np.ndarray | None = None   # compute cycles of each tile (compute sets; for profiles)

    def __post_init__(self):
        for c in CATEGORIES:
            self.duration.setdefault(c, np.zeros(self.num_ipus))
            self.tile_sum.setdefault(c, np.zeros(self.num_ipus))
        self.tile_sum.setdefault("compute_excl", np.zeros(self.num_ipus))

    def total(self) -> np.ndarray:
        """Cycles per IPU the step lasts (sum of its category durations)."""
        return sum(self.duration[c] for c in CATEGORIES)

    def add(self, other: "StepCost") -> "StepCost":
        for c in CATEGORIES:
            self.duration[c] = self.duration[c] + other.duration[c]
            self.tile_sum[c] = self.tile_sum[c] + other.tile_sum[c]
        self.tile_sum["compute_excl"] = self.tile_sum["compute_excl"] + other.tile_sum["compute_excl"]
        self.flops += other.flops
        self.syncs += other.syncs
        for k, (n, cyc) in other.by_vertex_type.items():
            n0, c0 = self.by_vertex_type.get(k, (0, 0))
            self.by_vertex_type[k] = (n0 + n, c0 + cyc)
        return self


def _per_ipu(spec, per_tile: np.ndarray, reduce: str) -> np.ndarray:
    t = per_tile.reshape(spec.num_ipus, spec.tiles_per_ipu)
    return t.max(axis=1) if reduce == "max" else t.sum(axis=1)


def sync_cost(spec, ipus_involved: np.ndarray, n: int = 1) -> StepCost:
    """``n`` internal syncs on the IPUs flagged in ``ipus_involved`` (bool per IPU)."""
    c = StepCost(spec.num_ipus, syncs=n)
    per = float(cal.INTERNAL_SYNC_CYCLES + spec.min_ipu_sync_delay) * n
    c.duration["sync"] = np.where(ipus_involved, per, 0.0)
    c.tile_sum["sync"] = c.duration["sync"] * spec.tiles_per_ipu
    return c


def compute_cost(spec, tiles: np.ndarray, cycles: np.ndarray, multi: np.ndarray,
                 type_ids: np.ndarray | None = None, type_names: list | None = None) -> tuple[StepCost, np.ndarray]:
    """Cost of one compute set.

    Args:
        tiles: int array (global tile of each vertex). cycles: int array (worker cycles, or tile
            cycles where ``multi``). multi: bool array. type_ids / type_names: vertex type of each
            vertex, for "Cycles by vertex type".

    Returns:
        (cost, active) where ``active`` flags the tiles that run vertices.
    """
    T, W = spec.num_tiles, spec.num_worker_contexts
    cost = StepCost(spec.num_ipus)
    if tiles.size == 0:
        return cost, np.zeros(T, bool)
    tiles = tiles.astype(np.int64)
    cycles = cycles.astype(np.float64)
    single = ~multi
    incl = np.zeros(T)
    excl = np.zeros(T)
    if single.any():
        st, sc = tiles[single], cycles[single]
        order = np.argsort(st, kind="stable")
        st, sc = st[order], sc[order]
        first = np.searchsorted(st, st, side="left")
        ctx = (np.arange(st.size) - first) % W
        ctx_sum = np.bincount(st * W + ctx, weights=sc, minlength=T * W).reshape(T, W)
        incl += W * ctx_sum.max(axis=1)
        excl += ctx_sum.sum(axis=1)
    if multi.any():
        m = np.bincount(tiles[multi], weights=cycles[multi], minlength=T)
        incl += m
        excl += m
    active = np.bincount(tiles, minlength=T) > 0
    incl = np.where(active, incl + cal.COMPUTE_SET_LAUNCH_CYCLES, 0.0)
    excl = np.where(active, excl, 0.0)     # the supervisor's launch is idle time for the workers
    cost.duration["compute"] = _per_ipu(spec, incl, "max")
    cost.tile_sum["compute"] = _per_ipu(spec, incl, "sum")
    cost.tile_sum["compute_excl"] = _per_ipu(spec, excl, "sum")
    cost.tile_compute = incl.astype(np.float32)
    if type_ids is not None:
        tile_cycles = np.where(multi, cycles, cycles * W)
        per_type = np.bincount(type_ids, weights=tile_cycles, minlength=len(type_names))
        counts = np.bincount(type_ids, minlength=len(type_names))
        cost.by_vertex_type = {n: (int(counts[i]), float(per_type[i])) for i, n in enumerate(type_names) if counts[i]}
    return cost, active


@dataclass
class Transfer:
    """Elements that must reach a tile: ``addr`` in ``space`` is needed on tile ``dst`` (int arrays;
    ``None``: the tile ``space`` maps each address to, i.e. a write back to the owner).

    ``src`` overrides the source tile of each element (default: where ``space`` maps it; -2 means
    the host)."""

    space: object
    addr: np.ndarray
    dst: np.ndarray | None
    src: np.ndarray | None = None
    count_send: bool = True   # False: the same values are also sent by another Transfer (multicast)


@dataclass
class ExchangeVolume:
    """Per tile: bytes and regions received and sent in one exchange phase; plus inter-IPU bytes;
    and the exchange code units per tile (:func:`openipu.poplar.exchange_moves.code_units`: a run of
    equal regions at one stride is one loop), which size the Internal Exchange Code."""

    recv_bytes: np.ndarray
    send_bytes: np.ndarray
    recv_msgs: np.ndarray
    send_msgs: np.ndarray
    global_bytes: np.ndarray   # per IPU: bytes crossing IPU-Links into this IPU
    recv_code: np.ndarray | None = None    # None: one unit per message
    send_code: np.ndarray | None = None

    def code_units(self) -> np.ndarray:
        """Exchange code units per tile (received and sent), float64 ``[tiles]``."""
        r = self.recv_msgs if self.recv_code is None else self.recv_code
        s = self.send_msgs if self.send_code is None else self.send_code
        return r + s

    def any(self) -> bool:
        return bool(self.recv_bytes.any() or self.send_bytes.any())


def _runs_of_increasing(tr: Transfer, addr: np.ndarray, dst: np.ndarray, contiguous: bool):
    """Maximal runs of a transfer whose addresses ``addr`` are strictly increasing: consecutive
    addresses with one source tile and one destination tile.

    Returns (first address, length, source tile, destination tile) per run (int64 arrays). The
    work is a few vectorised passes over the int32 tile arrays, with no int64 copy per element;
    a contiguous address range reads its source tiles as a slice of the space (no gather)."""
    n = addr.size
    owner = None
    if tr.src is None or dst is None:
        owner = tr.space.tiles_of(addr)
    s = owner if tr.src is None else np.broadcast_to(np.asarray(tr.src), (n,))
    if dst is None:
        dst = owner
    brk = s[1:] != s[:-1]
    if dst.strides[0] != 0:
        brk |= dst[1:] != dst[:-1]
    if not contiguous:
        brk |= addr[1:] != addr[:-1] + 1
    start = np.flatnonzero(brk)
    start += 1
    start = np.concatenate((np.zeros(1, start.dtype), start))
    length = np.diff(np.append(start, n))
    return addr[start].astype(np.int64), length, s[start].astype(np.int64), dst[start].astype(np.int64)


def _elements_of(tr) -> list[Transfer]:
    """A region transfer as a per-element :class:`Transfer` (the fallback for views whose pieces
    are not monotone lattices, and the reference the structural model is tested against)."""
    view = tr.view
    space = view._state.space(view._type)
    addrs, tiles = [], []
    b = tr.boxes
    for k in range(len(b)):
        sub = view.slice([int(x) for x in b.lo[k]], [int(x + y) for x, y in zip(b.lo[k], b.sz[k])]) if view.rank() else view
        a = sub.flat_addresses()
        addrs.append(a)
        tiles.append(np.full(a.size, int(b.tile[k]), np.int64))
    if not addrs:
        return []
    a, t = np.concatenate(addrs), np.concatenate(tiles)
    if tr.to_owner:
        return [Transfer(space, a, None, src=t, count_send=tr.count_send)]
    return [Transfer(space, a, t, count_send=tr.count_send)]


#: a region transfer whose view and boxes hold at most this many elements per box is costed with
#: the per-element model: as exact, and cheaper than the lattice overlaps when boxes are that small
#: (conv layouts of a few channels per run). A read of a flat view (the runs of
#: ``poplin.core.runs_access``) gets that model's figures from its address segments
#: (:func:`_read_segments`), so host work and memory follow the boxes, not the elements; other
#: transfers list their elements (at most this many per box)
ELEMENTS_PER_BOX = 16


def per_element_model(tr) -> bool:
    """Whether :func:`exchange_volume` costs the region transfer ``tr`` with the per-element
    model (its boxes hold at most :data:`ELEMENTS_PER_BOX` elements each on average, counting the
    view's elements too) rather than the lattice overlaps of :func:`exchange_moves.add_volume`."""
    k = len(tr.boxes)
    if not (k and tr.view.rank() and tr.boxes.lo.shape[1] == tr.view.rank()):
        return False
    covered = int(np.prod(tr.boxes.sz, axis=1, dtype=np.int64).sum())
    return covered + tr.view.numElements() <= ELEMENTS_PER_BOX * k


def _elements_by_runs(tr) -> list[Transfer]:
    """:func:`_elements_of` without a Python loop over boxes: the boxes' flat-index runs gather
    the view's addresses in one pass (same elements, same order)."""
    view, b = tr.view, tr.boxes
    owner, start, length = R.box_flat_runs(b.lo, b.sz, view.shape())
    total = int(length.sum())
    idx = np.arange(total, dtype=np.int64) + np.repeat(start - (np.cumsum(length) - length), length)
    a = view.flat_addresses()[idx]
    t = np.repeat(b.tile[owner].astype(np.int64), length)
    space = view._state.space(view._type)
    if tr.to_owner:
        return [Transfer(space, a, None, src=t, count_send=tr.count_send)]
    return [Transfer(space, a, t, count_send=tr.count_send)]


def _read_segments(tr):
    """The elements :func:`_elements_by_runs` would list for a read (``to_owner`` False) of a
    rank-1 view whose pieces are contiguous (the flat views of :func:`poplin.core.runs_access`),
    as segments of consecutive addresses with one source and one destination tile, in the same
    order: ``(start, end, src, dst)`` int64 arrays, or None for any other transfer. The work
    follows the (box, piece, tile-map run) overlaps, never the elements."""
    view, b = tr.view, tr.boxes
    if tr.to_owner:
        return None
    if view.rank() != 1 or b.lo.shape[1] != 1:
        shape = view.shape()
        big = [j for j in range(len(shape)) if shape[j] > 1]
        if len(big) == 1 and b.lo.shape[1] == len(shape):
            # one dim of more than one element: the same elements in the same order as a flat view
            j = big[0]
            flat = RegionTransfer(view.reshape([shape[j]]), Boxes(b.lo[:, j:j + 1], b.sz[:, j:j + 1], b.tile),
                                  count_send=tr.count_send)
            return _read_segments(flat)
        return _row_segments(tr)
    p = view.pieces
    if len(p) == 0:
        return None
    plo, psz, pst = p.lo[:, 0], p.sz[:, 0], p.st[:, 0]
    if not ((pst == 1) | (psz == 1)).all():
        return None                       # strided or broadcast pieces: per element
    order = np.argsort(plo, kind="stable")
    plo, psz, paddr, pvar = plo[order], psz[order], p.addr[order], p.var[order]
    blo = b.lo[:, 0].astype(np.int64)
    bhi = blo + b.sz[:, 0]
    keep = bhi > blo
    blo, bhi, btile = blo[keep], bhi[keep], np.asarray(b.tile, np.int64)[keep]
    p0 = np.searchsorted(plo, blo, side="right") - 1
    p1 = np.searchsorted(plo, bhi - 1, side="right") - 1
    bi, local = R.group_ranks(p1 - p0 + 1)
    pi = p0[bi] + local
    lo = np.maximum(blo[bi], plo[pi])
    hi = np.minimum(bhi[bi], plo[pi] + psz[pi])
    start = paddr[pi] + (lo - plo[pi])
    end = start + (hi - lo)
    var = pvar[pi]
    if start.size == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, z
    # cut at the tile-map runs of the variables: one source tile per segment
    runs = variable_runs(view, var)
    i, ri, gst, gend, gtl = _run_overlaps(view, var, start, end - 1, runs)
    s_ = np.maximum(gst[ri], start[i])
    e_ = np.minimum(gend[ri], end[i])
    ok = e_ > s_
    return s_[ok], e_[ok], gtl[ri][ok].astype(np.int64), btile[bi][i][ok]


def _row_segments(tr):
    """:func:`_read_segments` of a read of a one-piece view of rank > 1 whose last dim of more
    than one element has stride 1 (rows of consecutive addresses; a slice, a broadcast or a
    permutation of the outer dims): one segment per box row, in element order (boxes in order,
    rows in row-major order), cut at the tile-map runs. None for any other view."""
    view, b = tr.view, tr.boxes
    p = view.pieces
    d = view.rank()
    if p.row is None or d == 0 or b.lo.shape[1] != d:
        return None
    var, a, plo, _, pst = p.row
    shape = view.shape()
    big = [j for j in range(d) if shape[j] > 1]
    L = big[-1] if big else d - 1
    if shape[L] > 1 and pst[L] != 1:
        return None
    keep = (b.sz > 0).all(axis=1)
    lo, sz, btile = b.lo[keep], b.sz[keep], np.asarray(b.tile, np.int64)[keep]
    if lo.shape[0] == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, z
    rows = np.prod(sz[:, :L], axis=1, dtype=np.int64) if L else np.ones(lo.shape[0], np.int64)
    owner, local = R.group_ranks(rows)
    st = np.asarray(pst, np.int64)
    start = np.full(owner.size, a - int(np.dot(np.asarray(plo, np.int64), st)), np.int64)
    start += (lo[owner] * st).sum(axis=1)
    for j in range(L - 1, -1, -1):
        if shape[j] == 1:
            continue
        r = sz[owner, j]
        start += (local % r) * st[j]
        local //= r
    end = start + sz[owner, L]
    var_ids = np.full(start.size, var, np.int64)
    runs = variable_runs(view, var_ids[:1])
    i, ri, gst, gend, gtl = _run_overlaps(view, var_ids, start, end - 1, runs)
    s_ = np.maximum(gst[ri], start[i])
    e_ = np.minimum(gend[ri], end[i])
    ok = e_ > s_
    return s_[ok], e_[ok], gtl[ri][ok].astype(np.int64), btile[owner][i][ok]


def _add_increasing_runs(T, tpi, size, count_send, a0, ln, s, d, recv_b, send_b, recv_m, send_m, recv_c, send_c,
                         glob) -> None:
    """Add the maximal runs (first address ``a0``, length ``ln``, source ``s``, destination ``d``)
    of a transfer whose addresses strictly increase (each run one message)."""
    move = (s != d) & (d >= 0)
    if not move.any():
        return
    a0, ln, s, d = a0[move], ln[move], s[move], d[move]
    # runs are maximal, so each moved run is one message to its destination
    recv_b += np.bincount(d, weights=ln, minlength=T) * size
    recv_m += np.bincount(d, minlength=T)
    o = np.lexsort((a0, s, d))
    unit = code_units(d[o] * (T + 3) + s[o] + 2, a0[o], ln[o])
    recv_c += np.bincount(d[o][unit], minlength=T)
    if not count_send:
        return
    ft = s >= 0
    a0, ln, s, d = a0[ft], ln[ft], s[ft], d[ft]
    if s.size == 0:
        return
    send_b += np.bincount(s, weights=ln, minlength=T) * size
    # a send message spans runs of one source at adjacent addresses (multicast to several
    # destinations is one message)
    sbrk = np.ones(s.size, bool)
    sbrk[1:] = (s[1:] != s[:-1]) | (a0[1:] != a0[:-1] + ln[:-1])
    send_m += np.bincount(s[sbrk], minlength=T)
    at = np.flatnonzero(sbrk)
    sln = np.add.reduceat(ln, at)
    o = np.lexsort((a0[at], s[at]))
    unit = code_units(s[at][o], a0[at][o], sln[o])
    send_c += np.bincount(s[at][o][unit], minlength=T)
    cross = (s // tpi) != (d // tpi)
    if cross.any():
        glob += np.bincount(d[cross] // tpi, weights=ln[cross], minlength=glob.size) * size


def _add_read_segments(T, tpi, size, count_send, seg, recv_b, send_b, recv_m, send_m, recv_c, send_c, glob) -> None:
    """:func:`exchange_volume`'s per-element model of a read, from its segments
    (:func:`_read_segments`): the same figures, with work and memory following the segments."""
    start, end, s, d = seg
    if start.size == 0:
        return
    if int((end - start).sum()) > 1 and (start[1:] >= end[:-1]).all():
        # strictly increasing addresses: the maximal runs of (consecutive address, source, destination)
        brk = np.ones(start.size, bool)
        brk[1:] = (start[1:] != end[:-1]) | (s[1:] != s[:-1]) | (d[1:] != d[:-1])
        at = np.flatnonzero(brk)
        ln = np.add.reduceat(end - start, at)
        _add_increasing_runs(T, tpi, size, count_send, start[at], ln, s[at], d[at], recv_b, send_b, recv_m, send_m,
                             recv_c, send_c, glob)
        return
    # repeated or unordered addresses: a tile receives an element once. Each address has one
    # source, so the unique (destination, address) pairs are the union of the segments per
    # (destination, source); a message is a union interval (consecutive addresses, one source).
    move = (s != d) & (d >= 0)
    if not move.any():
        return
    start, end, s, d = start[move], end[move], s[move], d[move]
    o = np.lexsort((start, s, d))
    start, end, s, d = start[o], end[o], s[o], d[o]
    contrib, new = _union(d * (T + 3) + (s + 2), start, end)
    recv_b += np.bincount(d, weights=contrib, minlength=T) * size
    recv_m += np.bincount(d[new], minlength=T)
    recv_c += np.bincount(d[new], minlength=T)
    ft = s >= 0
    if not count_send or not ft.any():
        return
    cross = ft & ((s // tpi) != (d // tpi))
    ss, sa, se = s[ft], start[ft], end[ft]
    o = np.lexsort((sa, ss))
    ss, sa, se = ss[o], sa[o], se[o]
    scontrib, snew = _union(ss, sa, se)
    send_b += np.bincount(ss, weights=scontrib, minlength=T) * size
    send_m += np.bincount(ss[snew], minlength=T)
    send_c += np.bincount(ss[snew], minlength=T)
    if cross.any():
        glob += np.bincount(d[cross] // tpi, weights=contrib[cross], minlength=glob.size) * size


_SPEC_KEYS: dict = {}


def _spec_key(spec) -> bytes:
    """``repr(spec)`` as key bytes; kept per target object when its class is a frozen dataclass
    (:class:`openipu.ipu.Target`: it cannot change), made again otherwise."""
    hit = _SPEC_KEYS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    b = repr(spec).encode()
    params = getattr(type(spec), "__dataclass_params__", None)
    if params is not None and params.frozen:
        if len(_SPEC_KEYS) > 64:
            _SPEC_KEYS.clear()
        _SPEC_KEYS[id(spec)] = (spec, b)
    return b


def exchange_volume(spec, transfers: list, pairs: list | None = None) -> ExchangeVolume:
    """Bytes and messages each tile receives and sends for ``transfers`` (local elements are free).
    Memoised (:mod:`structure_cache`) when every transfer is a :class:`RegionTransfer`: the
    volume depends on their views' structure, their variables' tile mappings, the boxes and the
    target only, so identical layers cost their exchange once (see :func:`_exchange_volume`).
    ``pairs``: per transfer, its :func:`exchange_moves.transfer_pairs` when the caller has computed
    them (``exchange_moves.UNSET`` for the others), so they are not computed again."""
    if not transfers or not SC.enabled() or not all(isinstance(tr, RegionTransfer) for tr in transfers):
        return _exchange_volume(spec, transfers, pairs)
    parts = [_spec_key(spec)]
    for tr in transfers:
        parts.append(b"%d%d%d%s" % (tr.to_owner, tr.count_send, tr.view._type.size,
                                    repr(float(getattr(tr, "supertile_recv_scale", 1.0))).encode()))
        parts.append(SC.view_key(b"xv", tr.view, True, (tr.boxes.lo, tr.boxes.sz, tr.boxes.tile))[0])
    key = b"|".join(parts)
    hit = SC.MEMO.get(key)
    if hit is None:
        v = _exchange_volume(spec, transfers, pairs)
        hit = (v.recv_bytes, v.send_bytes, v.recv_msgs, v.send_msgs, v.global_bytes, v.recv_code, v.send_code)
        SC.MEMO.put(key, hit)
    return ExchangeVolume(*(None if a is None else a.copy() for a in hit))


def _exchange_volume(spec, transfers: list, pairs: list | None = None) -> ExchangeVolume:
    """:func:`exchange_volume`, computed.

    A value needed by several tiles is sent once (the exchange multicasts) and received by each.
    Consecutive addresses from the same source form one message (region): a tile receives one
    message per run of consecutive addresses (of the set it receives) from one source, and a tile
    sends one per run of consecutive addresses of the set it sends.

    Transfers whose addresses are strictly increasing (a tensor, or a slice of one) are costed per
    run of (consecutive address, source, destination), never per element; others (repeated or
    unordered addresses) per element, after keeping unique (destination, address) pairs.
    """
    T = spec.num_tiles
    tpi = spec.tiles_per_ipu
    recv_b = np.zeros(T)
    send_b = np.zeros(T)
    recv_m = np.zeros(T)
    send_m = np.zeros(T)
    recv_c = np.zeros(T)
    send_c = np.zeros(T)
    glob = np.zeros(spec.num_ipus)
    legacy = []
    for j, tr in enumerate(transfers):
        if isinstance(tr, RegionTransfer):
            if per_element_model(tr):
                seg = _read_segments(tr)
                if seg is None:
                    legacy.extend(_elements_by_runs(tr))
                else:
                    _add_read_segments(T, tpi, tr.view._type.size, tr.count_send, seg, recv_b, send_b, recv_m,
                                       send_m, recv_c, send_c, glob)
                continue
            if not add_volume(spec, tr, recv_b, send_b, recv_m, send_m, glob, recv_c, send_c,
                              X_UNSET if pairs is None else pairs[j]):
                legacy.extend(_elements_of(tr))
        else:
            legacy.append(tr)
    for tr in legacy:
        addr = np.asarray(tr.addr).reshape(-1)
        if addr.size == 0:
            continue
        size = tr.space.type.size
        dst = None if tr.dst is None else np.broadcast_to(np.asarray(tr.dst), addr.shape)
        if addr.size > 1 and np.all(addr[1:] > addr[:-1]):
            contiguous = int(addr[-1]) - int(addr[0]) == addr.size - 1
            a0, ln, s, d = _runs_of_increasing(tr, addr, dst, contiguous)
            _add_increasing_runs(T, tpi, size, tr.count_send, a0, ln, s, d, recv_b, send_b, recv_m, send_m, recv_c,
                                 send_c, glob)
            continue
        # repeated or unordered addresses: a tile receives an element once, so keep unique
        # (dst, addr) pairs, sorted
        addr = addr.astype(np.int64, copy=False)
        dst = (tr.space.tiles_of(addr) if dst is None else dst).astype(np.int64)
        src = tr.space.tiles_of(addr).astype(np.int64) if tr.src is None else np.broadcast_to(
            np.asarray(tr.src, np.int64), addr.shape).reshape(-1)
        move = (src != dst) & (dst >= 0)
        if not move.any():
            continue
        a, s, d = addr[move], src[move], dst[move]
        key = d * (tr.space.size + 1) + a
        order = np.argsort(key, kind="stable")      # a sort: numpy's hashed unique is slower here
        ks = key[order]
        keep = order[np.r_[True, ks[1:] != ks[:-1]]]
        a, s, d = a[keep], s[keep], d[keep]
        brk = np.ones(a.size, bool)
        brk[1:] = (d[1:] != d[:-1]) | (a[1:] != a[:-1] + 1) | (s[1:] != s[:-1])
        recv_b += np.bincount(d, minlength=T) * size
        recv_m += np.bincount(d[brk], minlength=T)
        recv_c += np.bincount(d[brk], minlength=T)
        from_tile = s >= 0
        if not tr.count_send or not from_tile.any():
            continue
        ss, aa = s[from_tile], a[from_tile]
        skey = ss * (tr.space.size + 1) + aa
        uk = np.sort(skey)
        uk = uk[np.r_[True, uk[1:] != uk[:-1]]]
        us = uk // (tr.space.size + 1)
        send_b += np.bincount(us, minlength=T) * size
        ua = uk % (tr.space.size + 1)
        sbrk = np.ones(uk.size, bool)
        sbrk[1:] = (us[1:] != us[:-1]) | (ua[1:] != ua[:-1] + 1)
        send_m += np.bincount(us[sbrk], minlength=T)
        send_c += np.bincount(us[sbrk], minlength=T)
        cross = from_tile.copy()
        cross[from_tile] = (ss // tpi) != (d[from_tile] // tpi)
        if cross.any():
            glob += np.bincount(d[cross] // tpi, minlength=spec.num_ipus) * size
    return ExchangeVolume(recv_b, send_b, recv_m, send_m, glob, recv_c, send_c)


def exchange_cost(spec, vol: ExchangeVolume) -> StepCost:
    """Cycles of one exchange phase: per tile ``max(in, out) bytes / exchangeBytesPerCycle`` plus
    ``EXCHANGE_CYCLES_PER_MESSAGE`` per region received, plus a fixed phase set-up; the phase lasts
    as long as its slowest tile. Traffic between IPUs goes over IPU-Links (global exchange)."""
    cost = StepCost(spec.num_ipus)
    if not vol.any():
        return cost
    epc = spec.exchange_bytes_per_cycle
    busy = np.maximum(vol.recv_bytes, vol.send_bytes) / epc + np.maximum(vol.recv_msgs, vol.send_msgs) * cal.EXCHANGE_CYCLES_PER_MESSAGE
    part = (vol.recv_bytes > 0) | (vol.send_bytes > 0)
    per_ipu_active = _per_ipu(spec, part.astype(np.float64), "sum") > 0
    tile_t = np.where(part, np.ceil(busy) + cal.EXCHANGE_PHASE_OVERHEAD_CYCLES, 0.0)
    cost.duration["exchange"] = _per_ipu(spec, tile_t, "max")
    cost.tile_sum["exchange"] = _per_ipu(spec, tile_t, "sum")
    if vol.global_bytes.any():
        link_bpc = spec.ipu_link_bytes_per_s / spec.clock_hz
        g = np.where(vol.global_bytes > 0, vol.global_bytes / link_bpc + spec.global_sync_cycles, 0.0)
        cost.duration["global_exchange"] = g
        cost.tile_sum["global_exchange"] = g * spec.tiles_per_ipu
    cost.duration["exchange"] = np.where(per_ipu_active, cost.duration["exchange"], 0.0)
    return cost


def host_cost(spec, bytes_per_ipu: np.ndarray) -> StepCost:
    """Host<->IPU stream transfer of ``bytes_per_ipu`` (array per IPU) at the calibrated host
    bandwidth (:data:`calibration.HOST_EXCHANGE_BYTES_PER_S`). Every tile of the IPU waits."""
    cost = StepCost(spec.num_ipus)
    bpc = cal.HOST_EXCHANGE_BYTES_PER_S / spec.clock_hz
    cyc = np.where(bytes_per_ipu > 0, np.ceil(bytes_per_ipu / bpc), 0.0)
    cost.duration["host_exchange"] = cyc
    cost.tile_sum["host_exchange"] = cyc * spec.tiles_per_ipu
    return cost


def on_tile_copy_cost(spec, bytes_per_tile: np.ndarray) -> StepCost:
    """On-tile copies (a copy vertex per tile) at ``memcpyBytesPerCycle``, counted as compute."""
    cost = StepCost(spec.num_ipus)
    if not bytes_per_tile.any():
        return cost
    cyc = np.where(bytes_per_tile > 0, np.ceil(bytes_per_tile / spec.memcpy_bytes_per_cycle) + cal.COMPUTE_SET_LAUNCH_CYCLES, 0.0)
    cost.duration["compute"] = _per_ipu(spec, cyc, "max")
    cost.tile_sum["compute"] = _per_ipu(spec, cyc, "sum")
    cost.tile_sum["compute_excl"] = cost.tile_sum["compute"].copy()
    cost.by_vertex_type = {"poplar_rt::Memcpy": (int((cyc > 0).sum()), float(cyc.sum()))}
    return cost


def ipus_of_tiles(spec, tiles_mask: np.ndarray) -> np.ndarray:
    """Bool per IPU: does any flagged tile lie on it."""
    return tiles_mask.reshape(spec.num_ipus, spec.tiles_per_ipu).any(axis=1)


def _register_records():
    from openipu.poplar.graph_codec import data_class
    data_class(StepCost)


_register_records()
