"""The moves of exchange transfers and their figures per tile (host work only; the figures are
predictions for the IPU): which (lattice, tile-map run) overlaps of a :class:`~exchange.RegionTransfer`
change tile (:func:`transfer_pairs`), and the bytes, messages and exchange code units each tile
receives and sends for them (:func:`add_volume`). Split from :mod:`openipu.poplar.exchange`, which
keeps the geometry (lattices of views, tile boxes) and re-exports these names; the semantics are
the ones its docstring gives.
"""

from __future__ import annotations

import numpy as np

# the geometry, called through the module (tests patch it there)
from openipu.poplar import exchange as X
from openipu.poplar import regions as R
from openipu.poplar import sets as _sets
from openipu.poplar import structure_cache as SC
from openipu.poplar.exchange import Boxes, RegionTransfer, count_below, monotone, unrank

_I64 = np.int64


def _union(group: np.ndarray, start: np.ndarray, end: np.ndarray):
    """Per interval sorted by (group, start): its contribution to the union of its group's
    intervals and whether it starts a new merged interval (it does not touch the previous one)."""
    if start.size == 0:
        return np.zeros(0, _I64), np.zeros(0, bool)
    new_group = np.r_[True, group[1:] != group[:-1]]
    # running max of previous ends within the group (an offset per group keeps groups apart)
    gid = np.cumsum(new_group) - 1
    lo = int(start.min())
    off = gid * (int(end.max()) - lo + 2)
    prev = np.maximum.accumulate(end - lo + off) - off + lo
    prev_end = np.r_[-1, prev[:-1]]
    prev_end = np.where(new_group, np.iinfo(_I64).min, prev_end)
    contrib = np.maximum(0, end - np.maximum(start, prev_end))
    starts_new = new_group | (start > prev_end)
    return contrib, starts_new


def code_units(group: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Which intervals, sorted by (group, start), begin a new piece of exchange code (bool).

    Poplar's exchange code sends and receives a region with a repeat loop, and a run of
    equal-sized regions at one address stride (a strided or transposed read, a strided
    convolution's input) with one loop nest whose address increments by the stride, not one
    instruction sequence per region. So the intervals of one group (a tile and its partner)
    cost one code unit for each maximal arithmetic progression of equal lengths: an interval
    continues the progression of the two before it when its length and its distance from the
    previous one repeat theirs. A progression of k regions is 2 units (its first region, then the
    loop), a region with no regular neighbours 1, so this never exceeds one unit per region.
    [A]: the instruction-level form of Poplar's exchange code is not published."""
    n = start.size
    if n == 0:
        return np.zeros(0, bool)
    same = np.r_[False, group[1:] == group[:-1]]
    gap = np.r_[0, np.diff(start)]
    cont = np.zeros(n, bool)
    if n > 2:
        cont[2:] = same[2:] & same[1:-1] & (length[2:] == length[1:-1]) & (gap[2:] == gap[1:-1])
    return ~cont


def _split_sparse(bi, var, base, T, n, elems, starts):
    """Lattices whose address span meets more tile-map runs than the lattice has rows (or
    points) are cut into their rows (or points), so that the overlaps :func:`transfer_pairs`
    enumerates grow with the elements moved, not with the runs a strided lattice steps over (a
    transposed read of a weight mapped in column blocks: every point in its own row). The
    pieces keep their lattice's view elements per point (broadcast multiplicity)."""
    m, d = T.shape
    if m == 0 or d == 0:
        return bi, var, base, T, n, elems
    span_hi = base + (T * (n - 1)).sum(axis=1)
    nruns = np.searchsorted(starts, span_hi, side="right") - np.searchsorted(starts, base, side="right") + 1
    pts = np.prod(n, axis=1, dtype=_I64)
    rows = pts // np.maximum(n[:, 0], 1)
    contig = T[:, 0] == 1
    to_rows = contig & (d > 1) & (rows > 1) & (nruns > 2 * rows)
    to_pts = ~contig & (pts > 1) & (nruns > pts)
    if not (to_rows.any() or to_pts.any()):
        return bi, var, base, T, n, elems
    per_pt = elems // np.maximum(pts, 1)
    keep = ~(to_rows | to_pts)
    parts = [(bi[keep], var[keep], base[keep], T[keep], n[keep], elems[keep])]
    for sel, inner in ((np.flatnonzero(to_rows), 1), (np.flatnonzero(to_pts), 0)):
        if not sel.size:
            continue
        # the pieces: every combination of the dims from ``inner`` up, as its own lattice
        k = (pts[sel] // np.prod(n[sel, :inner], axis=1, dtype=_I64))
        rep, idx = R.group_ranks(k)
        src = sel[rep]
        b = unrank(base[src], T[src, inner:], n[src, inner:], idx)
        Tn = np.zeros((src.size, d), _I64)
        nn = np.ones((src.size, d), _I64)
        if inner:
            Tn[:, :inner], nn[:, :inner] = T[src, :inner], n[src, :inner]
        parts.append((bi[src], var[src], b, Tn, nn, per_pt[src] * np.prod(nn, axis=1, dtype=_I64)))
    return tuple(np.concatenate([q[i] for q in parts]) for i in range(6))


#: Fields of :func:`transfer_pairs`' result that are addresses (translated on a memo hit).
_ADDRESS_FIELDS = (3, 6, 7, 10, 11)


def transfer_pairs(tr: RegionTransfer):
    """The moves of one transfer: per (lattice, tile-map run) overlap with elements that change
    tile, ``(src, dst, var, base, T, n, S, E, count, msgs, first, last, mult)``; ``S, E`` bound
    the overlap, ``first`` / ``last`` its first and last address. None when nothing meets,
    ``"elements"`` when the view is not monotone. Memoised on the view's structure, its
    variables' mappings and the boxes (:mod:`structure_cache`)."""
    view = tr.view
    if not SC.enabled() or len(view.pieces) == 0:
        return _transfer_pairs(tr)
    key, uv, starts = SC.view_key(b"transfer_pairs" + (b"w" if tr.to_owner else b"r"), view, True,
                                  (tr.boxes.lo, tr.boxes.sz, tr.boxes.tile))
    hit = SC.MEMO.get(key)
    if hit is None:
        res = _transfer_pairs(tr)
        if res is None or isinstance(res, str):
            hit = (res,)
        else:
            local = np.searchsorted(uv, res[2])
            off = starts[local]
            hit = tuple(local if i == 2 else a - off if i in _ADDRESS_FIELDS else a for i, a in enumerate(res))
        SC.MEMO.put(key, hit)
    if len(hit) == 1:
        return hit[0]
    off = starts[hit[2]]
    return tuple(uv[a] if i == 2 else a + off if i in _ADDRESS_FIELDS else a.copy() for i, a in enumerate(hit))


def _all_intervals(T: np.ndarray, n: np.ndarray) -> bool:
    """Whether every canonical lattice ``(T, n)`` is one interval of consecutive addresses (a
    contiguous inner dim, or one point, and no other used dim)."""
    return not T.shape[1] or bool((n[:, 1:] == 1).all() and ((T[:, 0] == 1) | (n[:, 0] == 1)).all())


def _transfer_pairs(tr: RegionTransfer):
    view = tr.view
    bi, var, base, T, n, elems = X.lattices(view, tr.boxes)
    if bi.size == 0:
        return None
    if not monotone(T, n).all():
        return "elements"
    runs = X.variable_runs(view, var)
    bi, var, base, T, n, elems = _split_sparse(bi, var, base, T, n, elems, runs[0])
    span_hi = base + (T * (n - 1)).sum(axis=1)
    li, ri, gst, gend, gtl = X._run_overlaps(view, var, base, span_hi, runs)
    other = tr.boxes.tile[bi[li]]
    owner = gtl[ri].astype(_I64)
    src, dst = (other, owner) if tr.to_owner else (owner, other)
    move = (src != dst) & (dst >= 0)
    if not move.any():
        return None                     # every element is used on its owner
    li, ri, src, dst = li[move], ri[move], src[move], dst[move]
    b, Tl, nl = base[li], T[li], n[li]
    S = np.maximum(gst[ri], b)
    E = np.minimum(gend[ri], span_hi[li] + 1)
    mult = elems[li] // np.maximum(np.prod(nl, axis=1, dtype=_I64), 1) if nl.shape[1] else elems[li]
    if _all_intervals(Tl, nl):
        # every lattice is one interval of consecutive addresses: its overlap with a run is
        # [S, E), one message (what count_below / unrank give for such lattices)
        count = E - S
        ok = count > 0
        out = (src, dst, var[li], b, Tl, nl, S, E, count, ok.astype(_I64), S, E - 1, mult)
        return out if ok.all() else tuple(a[ok] for a in out)
    c_lo = count_below(b, Tl, nl, S)
    c_hi = count_below(b, Tl, nl, E)
    count = c_hi - c_lo
    contig = Tl[:, 0] == 1 if Tl.shape[1] else np.zeros(li.size, bool)
    if Tl.shape[1] > 1:
        n0 = np.where(contig, nl[:, 0], 1)
        rows_hi = count_below(b, Tl[:, 1:], nl[:, 1:], E)
        rows_lo = count_below(b, Tl[:, 1:], nl[:, 1:], S - n0 + 1)
        msgs = np.where(contig, rows_hi - rows_lo, count)
    else:
        msgs = np.where(count > 0, np.where(contig, 1, count), 0)
    ok = count > 0
    first = unrank(b, Tl, nl, c_lo)
    last = unrank(b, Tl, nl, c_hi - 1)
    out = (src, dst, var[li], b, Tl, nl, S, E, count, msgs, first, last, mult)
    return out if ok.all() else tuple(a[ok] for a in out)


#: "not given" for the ``pairs`` arguments below (:func:`transfer_pairs` may return None).
UNSET = object()


def moved_elements(tr: RegionTransfer, num_tiles: int, pairs=UNSET) -> np.ndarray | None:
    """Per destination tile, how many *view elements* of the transfer change tile (a broadcast
    element counts once per use, unlike received bytes). For on-tile copy costs. ``pairs``:
    :func:`transfer_pairs` of ``tr`` when the caller has it (a large copy's pairs are too big for
    the memo, and the copy's exchange volume needs them too)."""
    res = transfer_pairs(tr) if pairs is UNSET else pairs
    out = np.zeros(num_tiles)
    if isinstance(res, str):
        return None                        # not monotone: the caller counts per element
    if res is None:
        return out
    dst, count, mult = res[1], res[8], res[12]
    return np.bincount(dst, weights=count * mult, minlength=num_tiles).astype(np.float64)


def add_volume(spec, tr: RegionTransfer, recv_b, send_b, recv_m, send_m, glob, recv_c=None, send_c=None,
               pairs=UNSET) -> bool:
    """Add one transfer's volume (bytes and messages per tile, IPU-Link bytes per IPU) to the
    arrays; and, when ``recv_c`` / ``send_c`` are given, its exchange code units per tile
    (:func:`code_units`). Returns False if the transfer needs the per-element model (a
    non-monotone view). ``pairs``: :func:`transfer_pairs` of ``tr``, when the caller has it."""
    if pairs is UNSET and _add_shared_box_reads(spec, tr, recv_b, send_b, recv_m, send_m, glob, recv_c, send_c):
        return True
    res = transfer_pairs(tr) if pairs is UNSET else pairs
    if res is None:
        return True
    if isinstance(res, str):
        return False
    src, dst, var, base, T, n, S, E, count, msgs, first, last, _ = res
    if src.size == 0:
        return True
    size = tr.view._type.size
    T_ = spec.num_tiles
    tpi = spec.tiles_per_ipu
    single = msgs == 1                          # the overlap is one interval [first, last]
    # receives: union per (dst, src) of the single intervals; multi-interval overlaps counted once
    # per distinct (dst, lattice, run)
    _accumulate(src, dst, base, T, n, S, E, count, msgs, first, last, single, recv_b, recv_m, size, T_,
                key_tile=dst, other=src, glob=glob, tpi=tpi, out_c=recv_c,
                pair_scale=(float(tr.supertile_recv_scale), int(spec.tiles_per_shared_exchange_bus)))
    if tr.count_send:
        ft = src >= 0
        _accumulate(src[ft], dst[ft], base[ft], T[ft], n[ft], S[ft], E[ft], count[ft], msgs[ft], first[ft],
                    last[ft], single[ft], send_b, send_m, size, T_, key_tile=src[ft], other=None, glob=None, tpi=tpi,
                    out_c=send_c)
    return True


#: a read whose boxes repeat one of at most this fraction of distinct ranges is costed per distinct
#: range (:func:`_add_shared_box_reads`)
SHARED_BOX_MAX_FRACTION = 0.5


def _add_shared_box_reads(spec, tr: RegionTransfer, recv_b, send_b, recv_m, send_m, glob, recv_c, send_c) -> bool:
    """:func:`add_volume` of a read whose rank-1 boxes are a few distinct ranges, each read by many
    tiles, one box per tile (a bias or an operand every tile of a matmul reads whole): the moves
    of each distinct range are computed once, for a stand-in reader, and each reading tile takes
    its range's figures less what it owns (its own source's intervals), so the work follows the
    distinct ranges, not ranges x readers. The same figures as the per-reader computation: a
    reader's receives from a source are that source's intervals of its one range (their union,
    merged messages and code units), and a source sends the union of its intervals over the
    ranges some other tile reads. Returns False (nothing added) where that does not hold: writes,
    several boxes on one tile, ranges that are not each one address interval per tile-map run,
    or a supertile scale whose products are not exact in float64."""
    b = tr.boxes
    k = len(b)
    if tr.to_owner or k < 4 or b.lo.shape[1] != 1 or (b.tile < 0).any():
        return False
    scale = float(tr.supertile_recv_scale)
    if scale.as_integer_ratio()[1] > 1024:
        return False
    if _sets.unique(b.tile).size != k:
        return False                       # a tile reading several ranges: unions across them
    lo, sz = b.lo[:, 0], b.sz[:, 0]
    width = int(sz.max()) + 1
    rkey = lo * width + sz
    ukey = _sets.unique(rkey)
    G = ukey.size
    if G > SHARED_BOX_MAX_FRACTION * k:
        return False
    T_ = spec.num_tiles
    g_of = np.searchsorted(ukey, rkey)                 # each box's distinct range
    stand_in = RegionTransfer(tr.view, Boxes((ukey // width)[:, None], (ukey % width)[:, None],
                                             T_ + np.arange(G, dtype=_I64)), count_send=tr.count_send)
    res = transfer_pairs(stand_in)
    if isinstance(res, str):
        return False
    if res is None or res[0].size == 0:
        return True
    src, dst, _, _, _, _, _, _, _, msgs, first, last, _ = res
    if not (msgs == 1).all():
        return False
    size = tr.view._type.size
    tpi = spec.tiles_per_ipu
    g = dst - T_
    # per (range, source): the union of its intervals, its merged messages and code units
    order = np.lexsort((first, src, g))
    g, src, a, z = g[order], src[order], first[order], last[order] + 1
    W = T_ + 2                                          # sources -2 .. T-1
    group = g * W + (src + 2)
    contrib, new = _union(group, a, z)
    at = np.flatnonzero(new)
    ends = np.maximum.reduceat(z, at)
    unit = code_units(group[at], a[at], ends - a[at])
    B = np.bincount(group, weights=contrib, minlength=G * W).reshape(G, W)
    M = np.bincount(group[at], minlength=G * W).reshape(G, W).astype(np.float64)
    C = np.bincount(group[at][unit], minlength=G * W).reshape(G, W).astype(np.float64)
    t = b.tile.astype(_I64)
    own = t + 2
    rb = B.sum(axis=1)[g_of] - B[g_of, own]
    if scale != 1.0:
        # bytes from outside the reader's supertile count at ``scale``: from inside it (and from
        # unmapped sources) at 1
        per_bus = int(spec.tiles_per_shared_exchange_bus)
        cum = np.concatenate((np.zeros((G, 1)), np.cumsum(B, axis=1)), axis=1)
        s0 = (t // per_bus) * per_bus + 2
        inside = cum[g_of, np.minimum(s0 + per_bus, W)] - cum[g_of, s0] - B[g_of, own] + cum[g_of, 2]
        rb = scale * (rb - inside) + inside
    recv_b[t] += rb * size
    recv_m[t] += M.sum(axis=1)[g_of] - M[g_of, own]
    if recv_c is not None:
        recv_c[t] += C.sum(axis=1)[g_of] - C[g_of, own]
    if glob is not None:
        ipu_of_src = np.arange(W - 2) // tpi
        per_ipu = np.stack([B[:, 2:][:, ipu_of_src == i].sum(axis=1) for i in range(glob.size)], axis=1)
        ti = t // tpi
        cross = per_ipu.sum(axis=1)[g_of] - per_ipu[g_of, ti]
        if cross.any():
            glob += np.bincount(ti, weights=cross, minlength=glob.size) * size
    if tr.count_send:
        # a source sends the intervals of the ranges some tile other than itself reads
        readers = np.bincount(g_of, minlength=G)
        self_read = np.zeros(G * W, bool)
        self_read[g_of * W + own] = True
        ft = (src >= 0) & (readers[g] > self_read[group])
        single = np.ones(int(ft.sum()), bool)
        zero = np.zeros(single.size, _I64)
        _accumulate(src[ft], zero, zero, np.zeros((single.size, 0), _I64), np.zeros((single.size, 0), _I64), zero,
                    zero, zero, zero, a[ft], z[ft] - 1, single, send_b, send_m, size, T_, key_tile=src[ft], other=None,
                    glob=None, tpi=tpi, out_c=send_c)
    return True


def _first_of_equal_rows(cols: list) -> np.ndarray:
    """Index of the first occurrence of each distinct row of the columns ``cols`` (int arrays of
    one length), as ``np.unique(np.stack(cols, 1), axis=0, return_index=True)[1]`` gives them but
    in numeric row order: a stable lexsort and a pass per column (2-3x faster than ``unique``'s
    sort of the rows as bytes)."""
    order = np.lexsort(cols[::-1])
    if order.size == 0:
        return order
    new = np.zeros(order.size, bool)
    new[0] = True
    for c in cols:
        cs = c[order]
        new[1:] |= cs[1:] != cs[:-1]
    return order[new]


def _accumulate(src, dst, base, T, n, S, E, count, msgs, first, last, single, out_b, out_m, size, num_tiles,
                key_tile, other, glob, tpi, out_c=None, pair_scale=(1.0, 2)):
    grp_other = other if other is not None else np.zeros_like(key_tile)
    scale, per_bus = pair_scale

    def weight(kt, ko):
        """Byte weights: ``scale`` for bytes from outside the receiving tile's supertile."""
        if scale == 1.0:
            return 1.0
        return np.where((ko >= 0) & (ko // per_bus != kt // per_bus), scale, 1.0)
    # single intervals: union per (tile, other end) with adjacency merged into one message
    s = single
    if s.any():
        kt, ko, a, z = key_tile[s], grp_other[s], first[s], last[s] + 1
        order = np.lexsort((a, ko, kt))
        kt, ko, a, z = kt[order], ko[order], a[order], z[order]
        group = kt * (num_tiles + 3) + (ko + 2)
        contrib, new = _union(group, a, z)
        out_b += np.bincount(kt, weights=contrib * weight(kt, ko), minlength=num_tiles) * size
        out_m += np.bincount(kt[new], minlength=num_tiles)
        if out_c is not None:
            # the merged intervals of each (tile, other end), in address order
            at = np.flatnonzero(new)
            ends = np.maximum.reduceat(z, at)
            unit = code_units(group[at], a[at], ends - a[at])
            out_c += np.bincount(kt[at][unit], minlength=num_tiles)
        if glob is not None:
            cross = ko >= 0
            cross &= (ko // tpi) != (kt // tpi)
            if cross.any():
                glob += np.bincount(kt[cross] // tpi, weights=contrib[cross], minlength=glob.size) * size
    m = ~single
    if m.any():
        Tm, nm = T[m], n[m]
        cols = [key_tile[m], grp_other[m], base[m], S[m], E[m]] + [Tm[:, j] for j in range(Tm.shape[1])] + \
               [nm[:, j] for j in range(nm.shape[1])]
        idx = _first_of_equal_rows(cols)
        kt, ko, c, mm = key_tile[m][idx], grp_other[m][idx], count[m][idx], msgs[m][idx]
        out_b += np.bincount(kt, weights=c * weight(kt, ko), minlength=num_tiles) * size
        out_m += np.bincount(kt, weights=mm, minlength=num_tiles)
        if out_c is not None:
            # a strided lattice's regions are one loop nest: a unit per level (dimension with
            # more than one point), one for a partial first row and one for a partial last row
            levels = (nm[idx] > 1).sum(axis=1) if n.shape[1] else np.zeros(idx.size, _I64)
            out_c += np.bincount(kt, weights=np.minimum(mm, levels + 2), minlength=num_tiles)
        if glob is not None:
            cross = (ko >= 0) & ((ko // tpi) != (kt // tpi))
            if cross.any():
                glob += np.bincount(kt[cross] // tpi, weights=c[cross], minlength=glob.size) * size
