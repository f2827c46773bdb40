"""Tile memory planning: bytes per tile by category, variable liveness, out-of-memory tiles.

Categories follow Poplar's summary ("By Data Type"): Variables (always live, plus the peak of
the not-always-live ones), Constants, Stack, Vertex Instances (vertex state), Vertex Code,
Internal Exchange Code, Control Code. Byte figures are predictions for the IPU; code and stack
sizes are assumptions listed in :mod:`openipu.poplar.calibration`.

Liveness: the timeline has one *position* per program step laid out, in compile order, and one
per re-occurrence of a reused block (a ``Sequence`` met again, a function called again: its steps
are laid out once, see :class:`_Blocks`), so the plan follows the program's structure, not how
many times a block runs. A variable is *not always live* when every position that touches it
belongs to one program, and its first touch writes it; it then occupies memory over its def-use
segments: from a write to the last touch before the next position that writes all of it without
reading it (one segment from first to last touch when none does; widened to the whole of a loop
that uses a value from before the loop; a variable first written inside a loop is not widened).
A variable touched only inside one reused block (and written first there) belongs to it: its
segments over the block's steps hold for every occurrence (a function's own variables live
during each call). A variable the block shares with the rest of the program is touched at each
re-occurrence (as the block first touches it there); at a re-occurrence the timeline holds, per
tile, the block's peak in that occurrence: its own variables, receive buffers and inner
re-occurrences, plus the shared variables over their segments in the block, entered from the
block's start or left at its end as their segments do in that occurrence. Host storage keeps a
block's variables apart from everything live up to the block's last occurrence.
Constants, variables with host read/write handles or initial values, and variables read before
they are written are *always live*. Operands a compute set receives from other tiles occupy
receive buffers on the receiving tile during that step (the "Variables" category includes them at
the peak). Peaks are computed per tile with one sweep over sorted
allocation events (numpy; no Python loop over tiles).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from openipu.poplar import calibration as cal
from openipu.poplar import regions as R
from openipu.poplar import sets as _sets


@dataclass
class MemoryPlan:
    """Bytes per tile (numpy arrays, length = tiles) by category, and what overflows.

    ``total`` = sum of categories with not-always-live variables at their peak.
    ``liveness`` = not-always-live bytes summed over tiles, per program step;
    ``liveness_by_ipu`` the same per IPU (``[ipus, steps]``). ``num_events``: the allocations
    (one tile, one allocation and one free) the plan swept for its peaks, a host-cost figure: it
    grows with the program's structure (steps laid out, tiles), not with how often a block runs.
    """

    bytes_per_tile: int
    categories: dict
    total: np.ndarray
    always_live_variables: np.ndarray
    not_always_live_peak: np.ndarray
    liveness: np.ndarray
    out_of_memory_tiles: np.ndarray
    vertex_state_by_type: dict
    num_variables: int
    num_edges: int
    host_layout: dict = None      # type name -> (offset of each variable of the space, buffer size)
    liveness_by_ipu: np.ndarray = None   # [ipus, steps]: ``liveness`` split by IPU (profiles)
    num_events: int = 0     # allocations on the plan's timeline (each one allocated and freed)
    #: ids of the graph's not-always-live variables (int64), and their def-use segments on the
    #: plan's timeline: ``(variable id, first position, last position)`` int64 arrays (profiles)
    not_always_live_ids: np.ndarray = None
    nal_segments: tuple = None
    step_pos: np.ndarray = None      # per program step: its position on the timeline

    def live_at_step(self, step: int) -> np.ndarray:
        """Ids of the not-always-live variables whose def-use segments cover program step
        ``step`` (int64, sorted). A variable of a reused block counts at the block's first
        occurrence. Raises ``IndexError`` for a step the plan does not have."""
        if self.nal_segments is None or self.step_pos is None:
            return np.zeros(0, np.int64)
        p = int(self.step_pos[step])
        v, s0, s1 = self.nal_segments
        return _sets.unique(v[(s0 <= p) & (p <= s1)])

    def worst_tiles(self, n: int = 5) -> list[tuple[int, int]]:
        """The ``n`` tiles using most memory: [(tile, bytes)], most used first."""
        order = np.argsort(-self.total, kind="stable")[:n]
        return [(int(t), int(self.total[t])) for t in order]

    def fits(self) -> bool:
        return self.out_of_memory_tiles.size == 0


def _variable_runs(space):
    """(var index, tile, bytes) for each run of one variable's elements on one tile, from the
    variables' run-length tile maps (no per-element work)."""
    if not space.vars:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    st, tl, vi = space.runs()
    sizes = np.array([v.numel for v in space.vars], np.int64)
    run_end = np.append(st[1:], space.size)
    nonempty = sizes[vi] > 0
    return vi[nonempty], tl[nonempty].astype(np.int64), (run_end - st)[nonempty] * float(space.type.size)


def _space_indices(st, t) -> np.ndarray:
    """Indices, in their type's space, of the variables a tensor view touches (from its pieces)."""
    row = t.pieces.row
    if row is not None:
        return np.array([st.variables[row[0]].space_index], np.int64)
    ids = t.variable_ids()
    return np.array([st.variables[i].space_index for i in ids.tolist()], np.int64)


def _step_variables(comp):
    """Per element type, the variables each step touches as flat arrays ``(step, var, is_write,
    is_full_write)`` (int64, int64, bool, bool; a variable may appear more than once per step;
    a full write writes every element of the variable); and the number of tensor connections
    (edges)."""
    st = comp.state
    parts: dict = {name: ([], [], [], []) for name in st.spaces}
    edges = 0
    touched: dict = {}      # id(tensor) -> variable ids (the tensors stay alive in comp.uses)
    for s_idx, uses in enumerate(comp.uses):
        for t, is_write in uses:
            edges += 1
            vids = touched.get(id(t))
            if vids is None:
                vids = touched[id(t)] = _space_indices(st, t)
            S, V, W, F = parts[t._type.space]
            S.append(np.full(vids.size, s_idx, np.int64))
            V.append(vids)
            W.append(np.full(vids.size, bool(is_write)))
            # a written view never holds an element twice, so one variable and as many elements
            # as it has means all of it
            F.append(np.full(vids.size, bool(is_write) and vids.size == 1
                             and t.numElements() == st.spaces[t._type.space].vars[int(vids[0])].numel))
    out = {}
    for name, (S, V, W, F) in parts.items():
        if S:
            out[name] = (np.concatenate(S), np.concatenate(V).astype(np.int64), np.concatenate(W), np.concatenate(F))
    return out, edges


def _segments(S, V, W, F, use):
    """Def-use segments of the variables ``use`` (bool ``[nv]``): a variable is dead from its
    last access before a step that writes all of it (and does not read it) until that step, as
    Poplar's liveness analysis finds (a subgraph's inputs between calls, a buffer reused).
    Returns ``(var, first step, last step)`` per segment (int64 arrays, sorted by var)."""
    k = use[V]
    S, V, W, F = S[k], V[k], W[k], F[k]
    if S.size == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    order = np.lexsort((S, V))
    S, V, W, F = S[order], V[order], W[order], F[order]
    # one access per (var, step): it redefines the variable when a use writes all of it and none reads
    new = np.r_[True, (V[1:] != V[:-1]) | (S[1:] != S[:-1])]
    grp = np.cumsum(new) - 1
    reads = np.bincount(grp, weights=~W, minlength=grp[-1] + 1) > 0
    full = np.bincount(grp, weights=F, minlength=grp[-1] + 1) > 0
    S, V = S[new], V[new]
    first_of_var = np.r_[True, V[1:] != V[:-1]]
    start = first_of_var | (full & ~reads)
    starts = np.flatnonzero(start)
    ends = np.r_[starts[1:] - 1, S.size - 1]
    return V[starts], S[starts], S[ends]


def _widen_over_loops(sv, s0, s1, loops):
    """Stretch def-use segments ``(var, first step, last step)`` (int64 arrays sorted by var,
    then first step) over the loops ``[(first step, last step)]`` they cross.

    A value made before a loop and touched in it is live for all of the loop (every iteration
    reads it); one defined inside the loop is remade each iteration and needs nothing. Segments of
    one variable that then overlap are merged, so a variable is never counted twice. Returns the
    segments in the same form."""
    if sv.size == 0 or not loops:
        return sv, s0, s1
    s1 = s1.copy()
    for lo, hi in loops:
        carried = (s0 < lo) & (s1 >= lo)
        s1[carried] = np.maximum(s1[carried], hi)
    # merge overlapping segments of a variable: a running maximum of the ends within each
    # variable (offset by variable so one maximum.accumulate serves all of them)
    big = int(max(s1.max(), s0.max())) + 2
    run_end = np.maximum.accumulate(s1 + sv * big) - sv * big
    new = np.r_[True, (sv[1:] != sv[:-1]) | (s0[1:] > run_end[:-1])]
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:] - 1, sv.size - 1]
    return sv[starts], s0[starts], run_end[ends]


class _Blocks:
    """The reused blocks of a compiled program: blocks of steps laid out once and met again (a
    ``Sequence`` in several places, a function called again), on the memory plan's timeline of
    *positions* (one per step laid out, one per re-occurrence of a block).

    Arrays per reused block (in the order blocks were laid out: a block nested in another comes
    first): ``ids`` (the compiler's block index), ``pa`` / ``pb`` (first and end position),
    ``closed`` (every reused block laid out inside it has all its occurrences inside it), ``refs``
    (positions of its re-occurrences); ``inner`` (per position, the innermost reused block holding
    it, or -1) and ``occ_end`` (per reused block, the last position of any of its occurrences,
    including the occurrences of the blocks around it)."""

    def __init__(self, comp):
        npos = len(comp.positions)
        ids = [b for b, r in enumerate(comp.block_refs) if r]
        self.ids = np.array(ids, np.int64)
        self.pa = np.array([comp.blocks[b][0] for b in ids], np.int64)
        self.pb = np.array([comp.blocks[b][1] for b in ids], np.int64)
        self.refs = [np.array(comp.block_refs[b], np.int64) for b in ids]
        self.is_function = np.array([comp.block_is_function[b] for b in ids], bool)
        n = len(ids)
        # C is laid out inside B: laid out before B (nested blocks finish first) and within its range
        self.within = ((self.ids[:, None] <= self.ids[None, :]) & (self.pa[:, None] >= self.pa[None, :])
                       & (self.pb[:, None] <= self.pb[None, :]))          # [C, B]
        self.closed = np.ones(n, bool)
        for c in range(n):
            out = (self.refs[c] < self.pa[:, None]) | (self.refs[c] >= self.pb[:, None])    # [B, refs of c]
            self.closed &= ~(self.within[c] & (np.arange(n) != c) & out.any(axis=1))
        self.inner = np.full(max(npos, 1), -1, np.int64)
        for k in range(n - 1, -1, -1):          # outer blocks first; inner ones paint over them
            self.inner[self.pa[k]:self.pb[k]] = k
        self.occ_end = self.pb - 1
        for k in range(n - 1, -1, -1):
            e = max(int(self.pb[k]) - 1, int(self.refs[k].max()))
            # the occurrences of the blocks around this one, or around one of its occurrences
            for d in range(k + 1, n):
                if self.within[k, d] or ((self.refs[k] >= self.pa[d]) & (self.refs[k] < self.pb[d])).any():
                    e = max(e, int(self.occ_end[d]))
            self.occ_end[k] = e

    def __len__(self):
        return self.ids.size


def _local_blocks(blocks: _Blocks, P, V, W, F, nv: int) -> np.ndarray:
    """Per variable (``[nv]``), the innermost closed reused block holding every step that touches
    it (-1: none). Such a variable belongs to the block: each occurrence of the block runs the same
    steps on it, so its def-use segments over the block's steps hold for every occurrence. In a
    ``Sequence`` met again, only when its first touch writes all of it (nothing it held before can
    be read; a value it keeps from one occurrence to the next lives between them); a function's
    own variables live during each call."""
    loc = np.full(nv, -1, np.int64)
    if not len(blocks) or P.size == 0:
        return loc
    lo = np.full(nv, np.iinfo(np.int64).max)
    hi = np.full(nv, -1, np.int64)
    np.minimum.at(lo, V, P)
    np.maximum.at(hi, V, P)
    at_first = P == lo[V]
    reads = np.bincount(V[at_first], weights=~W[at_first], minlength=nv) > 0
    full = np.bincount(V[at_first], weights=F[at_first], minlength=nv) > 0
    redefined = full & ~reads
    for k in np.flatnonzero(blocks.closed).tolist():       # inner blocks first
        m = (loc < 0) & (lo >= blocks.pa[k]) & (hi < blocks.pb[k])
        if not blocks.is_function[k]:
            m &= redefined
        loc[m] = k
    return loc


def _expand_occurrences(blocks: _Blocks, P, V, W, F, loc):
    """Touches ``(position, var, is_write, is_full_write)`` with, for each re-occurrence of a
    reused block, one touch of every variable the block touches, at the re-occurrence's position
    (the first access of the variable in the block: a read, a write, or a write of all of it);
    except for variables that belong to the block or to a block inside it (:func:`_local_blocks`),
    whose other occurrences the re-occurrences' peaks account for. Blocks are taken inner first,
    so a block's touches include those of the re-occurrences inside it.

    Returns the touches and, per reused block, ``(vars, first, last)``: the variables so touched
    at its re-occurrences, with their first and last position in the block's own steps."""
    touched: dict = {}
    if not len(blocks) or P.size == 0:
        return P, V, W, F, touched
    order = np.argsort(P, kind="stable")
    P, V, W, F = P[order], V[order], W[order], F[order]
    extra = ([], [], [], [])
    for k in range(len(blocks)):
        a, e = int(blocks.pa[k]), int(blocks.pb[k])
        i, j = np.searchsorted(P, [a, e])
        parts = [(P[i:j], V[i:j], W[i:j], F[i:j])]
        if extra[0]:
            xp = np.concatenate(extra[0])
            m = (xp >= a) & (xp < e)
            if m.any():
                parts.append((xp[m], np.concatenate(extra[1])[m], np.concatenate(extra[2])[m], np.concatenate(extra[3])[m]))
        p, v, w, f = (np.concatenate(x) for x in zip(*parts))
        lv = loc[v]
        own = (lv >= 0) & blocks.within[np.maximum(lv, 0), k]
        p, v, w, f = p[~own], v[~own], w[~own], f[~own]
        if p.size == 0:
            continue
        o = np.lexsort((p, v))
        p, v, w, f = p[o], v[o], w[o], f[o]
        new = np.r_[True, v[1:] != v[:-1]]
        grp = np.cumsum(new) - 1
        at_first = p == p[new][grp]
        g = grp[at_first]
        reads = np.bincount(g, weights=~w[at_first], minlength=grp[-1] + 1) > 0
        full = np.bincount(g, weights=f[at_first], minlength=grp[-1] + 1) > 0
        uv = v[new]
        touched[k] = (uv, p[new], p[np.r_[np.flatnonzero(new)[1:] - 1, p.size - 1]])
        refs = blocks.refs[k]
        extra[0].append(np.repeat(refs, uv.size))
        extra[1].append(np.tile(uv, refs.size))
        extra[2].append(np.tile(~reads, refs.size))
        extra[3].append(np.tile(full & ~reads, refs.size))
    if extra[0]:
        P, V, W, F = (np.concatenate([x] + y) for x, y in zip((P, V, W, F), extra))
    return P, V, W, F, touched


def host_offsets(sizes: np.ndarray, first: np.ndarray, last: np.ndarray, shared: np.ndarray):
    """Where each variable of one element type lives in the host's storage buffer.

    Variables that are not ``shared`` (always live) lie end to end; the shared ones (not always
    live, alive from step ``first`` to step ``last``) are packed after them: allocated at their
    first step, freed after their last, first-fit in a free list that merges neighbours, as the
    chip's memory plan reuses the memory of variables whose lifetimes do not overlap. So host
    storage follows the simulated memory, not the sum of all variables.

    Returns ``(offsets, size)``: int64 offset (elements) of each variable and the buffer size.
    """
    n = sizes.size
    off = np.zeros(n, np.int64)
    fixed = ~shared
    off[fixed] = np.cumsum(sizes[fixed]) - sizes[fixed]
    base = int(sizes[fixed].sum())
    idx = np.flatnonzero(shared & (sizes > 0))
    if idx.size == 0:
        return off, max(base, 1)
    # events: (time, kind) with frees (kind 0, after the last step) before allocations (kind 1)
    t = np.concatenate([last[idx] + 1, first[idx]])
    kind = np.concatenate([np.zeros(idx.size, np.int64), np.ones(idx.size, np.int64)])
    who = np.concatenate([idx, idx])
    order = np.lexsort((kind, t))
    free_start: list[int] = []          # sorted free blocks below `top`
    free_size: list[int] = []
    top = peak = 0
    sz = sizes.tolist()
    pos = [0] * n
    for e in order.tolist():
        v = int(who[e])
        s = sz[v]
        if kind[e] == 1:
            for i, fs in enumerate(free_size):
                if fs >= s:
                    pos[v] = free_start[i]
                    if fs == s:
                        del free_start[i], free_size[i]
                    else:
                        free_start[i] += s
                        free_size[i] -= s
                    break
            else:
                if free_start and free_start[-1] + free_size[-1] == top:   # grow the last free block
                    pos[v] = free_start.pop()
                    free_size.pop()
                    top = pos[v] + s
                else:
                    pos[v] = top
                    top += s
                peak = max(peak, top)
        else:
            a = pos[v]
            i = bisect.bisect_left(free_start, a)
            if i > 0 and free_start[i - 1] + free_size[i - 1] == a:
                i -= 1
                free_size[i] += s
            else:
                free_start.insert(i, a)
                free_size.insert(i, s)
            if i + 1 < len(free_start) and free_start[i] + free_size[i] == free_start[i + 1]:
                free_size[i] += free_size[i + 1]
                del free_start[i + 1], free_size[i + 1]
            if free_start and free_start[-1] + free_size[-1] == top:
                top = free_start.pop()
                free_size.pop()
    off[idx] = base + np.array([pos[v] for v in idx.tolist()], np.int64)
    return off, max(base + peak, 1)


#: cells of the (half-step x tile) table in which per-tile peaks are found at once (64 MB of
#: float64, and as much again for the sums of one batch of events); a longer program is done in
#: blocks of tiles
PEAK_TABLE_CELLS = 1 << 23

#: events summed into the peak table at once (bounds the other temporaries of one batch)
EVENT_BATCH = 1 << 20


class _Events:
    """Allocation events of the memory plan, kept as the chunks they were recorded in (never
    concatenated into one array: the events of a large model hold tens of millions).

    Each chunk is ``(tiles, alloc, free, bytes, tag)``: per allocation, its tile (int32), the
    half-step at which it is allocated and the one at which it is freed (int32), its bytes
    (float32, or float64 for sums), and ``tag``, the innermost reused block it belongs to (-1:
    none; an int32 array, or one int for the whole chunk)."""

    def __init__(self):
        self.chunks: list = []
        self.count = 0

    def add(self, tl, alloc, free, nb, tag=-1, exact: bool = False) -> None:
        """Record allocations of ``nb`` bytes on tiles ``tl`` at half-steps ``alloc``, freed at
        ``free``; ``exact`` keeps the bytes as float64 (sums of many runs)."""
        tl = np.asarray(tl, np.int32)
        if tl.size == 0:
            return
        if not np.isscalar(tag):
            tag = np.asarray(tag, np.int32)
        self.count += tl.size
        self.chunks.append((tl, np.asarray(alloc, np.int32), np.asarray(free, np.int32),
                            np.asarray(nb, np.float64 if exact else np.float32), tag))

    def inside(self, inside: np.ndarray, shift: int) -> list:
        """The chunks of the events whose tag ``t`` has ``inside[t]`` (``inside[-1]`` is for
        untagged events), half-steps moved by ``-shift``."""
        out = []
        for tl, al, fr, nb, tag in self.chunks:
            if np.isscalar(tag):
                if inside[tag]:
                    out.append((tl, al - shift, fr - shift, nb, tag))
                continue
            m = inside[tag]
            if m.any():
                out.append((tl[m], al[m] - shift, fr[m] - shift, nb[m], -1))
        return out


def _event_batches(chunks):
    """Batches ``(tiles, half-steps, +/- bytes)`` of about :data:`EVENT_BATCH` events (one per
    allocation and one per free) from allocation chunks ``(tiles, alloc, free, bytes, ...)``."""
    pend, n = [], 0

    def flush():
        tl = np.concatenate([c[0] for c in pend] * 2)
        hs = np.concatenate([c[1] for c in pend] + [c[2] for c in pend])
        nb = np.concatenate([c[3] for c in pend] + [-c[3] for c in pend])
        return tl, hs, nb

    for c in chunks:
        size = c[0].size
        for lo in range(0, size, EVENT_BATCH):
            sl = slice(lo, lo + EVENT_BATCH)
            pend.append((c[0][sl], c[1][sl], c[2][sl], c[3][sl]))
            n += min(size - lo, EVENT_BATCH)
            if n >= EVENT_BATCH:
                yield flush()
                pend, n = [], 0
    if pend:
        yield flush()


def _tile_peaks(chunks, T: int, H: int, ipus: int = 0, tiles_per_ipu: int = 1):
    """Per tile, the peak over half-steps of its live bytes (allocations at odd half-steps, frees
    at even ones), from allocation chunks (see :class:`_Events`); the byte change per half-step;
    and, when ``ipus`` is given, the byte change per IPU and half-step (``[ipus, H]``).
    The events of one (tile, half-step) all have one sign, so the peak at half-step granularity
    is the peak of the running sum. Tiles are taken in blocks so that the dense table stays
    within :data:`PEAK_TABLE_CELLS`; events are summed into it in batches (``np.bincount``; byte
    counts are whole numbers, so the sums are exact in any order)."""
    peak = np.zeros(T)
    delta = np.zeros(H)
    per_ipu = np.zeros(ipus * H)
    block = max(1, PEAK_TABLE_CELLS // H)
    if block >= T:
        # one block: the byte change per half-step (and per IPU) are the table's sums over tiles
        # (whole numbers: exact in any order), not two more passes over the events
        table = np.zeros(H * T)
        for et, es, eb in _event_batches(chunks):
            table += np.bincount(es.astype(np.int64) * T + et, weights=eb, minlength=H * T)
        table = table.reshape(H, T)
        delta = table.sum(axis=1)
        if ipus:
            per_ipu = table.reshape(H, ipus, tiles_per_ipu).sum(axis=2).T.reshape(-1)
        np.cumsum(table, axis=0, out=table)
        peak = np.maximum(table.max(axis=0), 0)
        return peak, delta, per_ipu.reshape(ipus, H)
    for lo in range(0, T, block):
        hi = min(T, lo + block)
        w = hi - lo
        table = np.zeros(H * w)
        for et, es, eb in _event_batches(chunks):
            if lo == 0:
                delta += np.bincount(es, weights=eb, minlength=H)
                if ipus:
                    per_ipu += np.bincount((et // tiles_per_ipu).astype(np.int64) * H + es, weights=eb,
                                           minlength=ipus * H)
            if w < T:
                m = (et >= lo) & (et < hi)
                et, es, eb = et[m], es[m], eb[m]
            table += np.bincount(es.astype(np.int64) * w + (et - lo), weights=eb, minlength=H * w)
        table = table.reshape(H, w)
        np.cumsum(table, axis=0, out=table)
        peak[lo:hi] = np.maximum(table.max(axis=0), 0)
    return peak, delta, per_ipu.reshape(ipus, H)


def _occurrence_runs(blocks, touched, nal, v, tl, nb, sv, s0, s1, occ_runs, events: _Events, T: int):
    """For the not-always-live variables a reused block shares with the rest of the program
    (``touched``, from :func:`_expand_occurrences`; runs ``v, tl, nb``; def-use segments ``sv,
    s0, s1``, sorted by variable then start): at each re-occurrence, take them out of the
    timeline for its position (the re-occurrence's peak holds them), and record per block how
    they live in its occurrences: over their segments in the block's own steps, the first one
    from the block's start when their segment enters the occurrence, the last one to the block's
    end when it goes on after (else to their last touch in the block)."""
    if sv.size == 0:
        return
    big = int(max(s1.max(), s0.max(), max(int(r.max()) for r in blocks.refs))) + 2
    key = sv * big + s0
    order = np.argsort(v, kind="stable")
    rv = v[order]
    for k, (uv, fp, lp) in touched.items():
        keep = nal[uv]
        uv, lp = uv[keep], lp[keep]
        if uv.size == 0:
            continue
        a, e = int(blocks.pa[k]), int(blocks.pb[k])
        refs = blocks.refs[k]
        # the segment of each variable that holds each re-occurrence ([refs, vars])
        i = np.searchsorted(key, uv[None, :] * big + refs[:, None], side="right") - 1
        pattern = ((s0[i] < refs[:, None]).astype(np.int8) + 2 * (s1[i] > refs[:, None]).astype(np.int8))
        # their segments in the block's own steps, clipped to it
        lo_s, hi_s = np.searchsorted(sv, uv), np.searchsorted(sv, uv, side="right")
        g, j = R.group_ranks(hi_s - lo_s)
        si = lo_s[g] + j
        ov = (s0[si] < e) & (s1[si] >= a)
        g, si = g[ov], si[ov]
        if g.size == 0:
            continue
        first_seg = np.r_[True, g[1:] != g[:-1]]
        last_seg = np.r_[g[1:] != g[:-1], True]
        start, end = np.maximum(s0[si], a), np.minimum(s1[si], e - 1)
        # each segment once per run of its variable
        lo_r, hi_r = np.searchsorted(rv, uv[g]), np.searchsorted(rv, uv[g], side="right")
        owner, jr = R.group_ranks(hi_r - lo_r)
        if owner.size == 0:
            continue
        run = order[lo_r[owner] + jr]
        gv = g[owner]
        occ_runs.setdefault(k, []).append((pattern[:, gv], tl[run].astype(np.int32), start[owner], end[owner],
                                           first_seg[owner], last_seg[owner], lp[gv], nb[run].astype(np.float32)))
        # out of the outer timeline at each re-occurrence (live there: it touches them): their
        # bytes per tile, once per run
        vr_lo, vr_hi = np.searchsorted(rv, uv), np.searchsorted(rv, uv, side="right")
        o2, j2 = R.group_ranks(vr_hi - vr_lo)
        run2 = order[vr_lo[o2] + j2]
        per_tile = np.bincount(tl[run2], weights=nb[run2], minlength=T)
        tiles = np.flatnonzero(per_tile)
        events.add(np.tile(tiles, refs.size), np.repeat(refs * 2 + 1, tiles.size), np.repeat(refs * 2 + 2, tiles.size),
                   -np.tile(per_tile[tiles], refs.size), np.repeat(blocks.inner[refs], tiles.size), exact=True)


def plan_memory(comp, prog_ranges) -> MemoryPlan:
    """Plan the memory of a compiled graph (``comp`` is the engine's compiler; ``prog_ranges`` the
    ``(first, end)`` positions of each engine program on the compiler's timeline).

    The timeline has one position per step laid out and one per re-occurrence of a reused block
    (:class:`_Blocks`), so the plan's size follows the program's structure, not the number of
    times a block runs. A variable that belongs to a reused block (:func:`_local_blocks`) lives
    over its def-use segments in the block's steps; at each re-occurrence, the block's own peak
    per tile (its variables', its receive buffers' and its inner re-occurrences') is allocated for
    that position. Any other variable touched in a reused block is touched at each of its
    re-occurrences (:func:`_expand_occurrences`): live over the whole re-occurrence when its
    def-use segment reaches it. So each tile's peak is at least what any execution holds (an
    upper bound over a re-occurrence, exact in the block's first occurrence)."""
    st, spec = comp.state, comp.spec
    T = spec.num_tiles
    nsteps = len(comp.steps)
    npos = len(comp.positions)
    step_pos = np.asarray(comp.step_pos, np.int64)
    blocks = _Blocks(comp)
    variables = np.zeros(T)
    constants = np.zeros(T)
    nal_peak = np.zeros(T)
    always = np.zeros(T)
    liveness = np.zeros(max(nsteps, 1))
    liveness_by_ipu = np.zeros((spec.num_ipus, max(nsteps, 1)))
    host_vars = {}
    for t in list(st.host_writes.values()) + list(st.host_reads.values()) + [t for t, _ in getattr(st, "initial_values", [])]:
        host_vars.setdefault(t._type.space, []).append(_space_indices(st, t))
    events = _Events()
    occ_runs: dict = {}       # reused block -> [(entry/exit pattern per ref, tiles, first, last, bytes)]
    host_layout: dict = {}
    nal_ids, seg_v, seg_0, seg_1 = [], [], [], []
    prog_of_pos = np.zeros(max(npos, 1), np.int64)
    for i, (a, b) in enumerate(prog_ranges):
        prog_of_pos[a:b] = i
    step_vars, num_edges = _step_variables(comp)
    for name, space in st.spaces.items():
        nv = len(space.vars)
        if nv == 0:
            continue
        first = np.full(nv, np.iinfo(np.int64).max)
        last = np.full(nv, -1)
        first_is_write = np.zeros(nv, bool)
        multi_prog = np.zeros(nv, bool)
        loc = np.full(nv, -1, np.int64)
        if name in step_vars:
            S, V, W, F = step_vars[name]
            loc = _local_blocks(blocks, step_pos[S], V, W, F, nv)
            S, V, W, F, touched = _expand_occurrences(blocks, step_pos[S], V, W, F, loc)
            np.minimum.at(first, V, S)
            np.maximum.at(last, V, S)
            # the first touch is a write unless the variable is read in its first step (a step
            # that reads and writes a variable counts as a read)
            read_first = np.zeros(nv, bool)
            read_first[V[~W & (S == first[V])]] = True
            first_is_write = (last >= 0) & ~read_first
            nprog = max(len(prog_ranges), 1)
            pairs = _sets.unique(V * nprog + prog_of_pos[S])
            multi_prog = np.bincount(pairs // nprog, minlength=nv) > 1
        host_last = last.copy()
        for lo, hi in comp.loops:
            # The host keeps one place per variable over all its life, stretched over the loops
            # it crosses (a value made before a loop and used in it lives for all of the loop).
            carried = (host_last >= lo) & (first <= hi) & ((first < lo) | ~first_is_write)
            host_last = np.where(carried, np.maximum(host_last, hi), host_last)
        # ... and over every occurrence of the block it belongs to
        owned = loc >= 0
        if owned.any():
            host_last[owned] = np.maximum(host_last[owned], blocks.occ_end[loc[owned]])
        is_const = np.array([v.constant for v in space.vars])
        pinned = np.zeros(nv, bool)
        for vids in host_vars.get(name, []):
            pinned[vids] = True
        pinned |= np.array([v.init is not None for v in space.vars]) & ~is_const
        nal = (~is_const) & (~pinned) & (last >= 0) & first_is_write & (~multi_prog)
        sizes = np.array([v.numel for v in space.vars], np.int64)
        host_layout[name] = host_offsets(sizes, first, host_last, nal)
        var_ids, tiles, nbytes = _variable_runs(space)
        ok = tiles >= 0
        var_ids, tiles, nbytes = var_ids[ok], tiles[ok], nbytes[ok]
        c = is_const[var_ids]
        constants += np.bincount(tiles[c], weights=nbytes[c], minlength=T)
        al = ~c & ~nal[var_ids]
        always += np.bincount(tiles[al], weights=nbytes[al], minlength=T)
        m = nal[var_ids]
        if m.any():
            # (the events' compact dtypes: tiles int32, bytes float32)
            v, tl, nb = var_ids[m], tiles[m].astype(np.int32), nbytes[m].astype(np.float32)
            # not-always-live variables live over their def-use segments, stretched over the loops
            # they cross; a run is allocated before each segment and freed after
            sv, s0, s1 = _widen_over_loops(*_segments(S, V, W, F, nal), comp.loops)
            gid = np.fromiter((x.id for x in space.vars), np.int64, nv)
            seg_v.append(gid[sv])
            seg_0.append(np.asarray(s0, np.int64))
            seg_1.append(np.asarray(s1, np.int64))
            nal_ids.append(gid[nal])
            cnt = np.bincount(sv, minlength=nv)
            seg_at = np.cumsum(cnt) - cnt                      # index of each variable's first segment
            per_run = cnt[v]
            # runs taken in slices of about EVENT_BATCH allocations (bounded temporaries)
            ends = np.cumsum(per_run)
            cuts = np.searchsorted(ends, np.arange(EVENT_BATCH, int(ends[-1]), EVENT_BATCH), side="right")
            for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, v.size].tolist()):
                owner, j = R.group_ranks(per_run[lo:hi])    # each run once per segment of its variable
                vo = v[lo:hi][owner]
                si = seg_at[vo] + j
                del j
                events.add(tl[lo:hi][owner], s0[si] * 2 + 1, s1[si] * 2 + 2, nb[lo:hi][owner],
                           loc[vo] if len(blocks) else -1)
                del owner, vo, si
            if touched:
                _occurrence_runs(blocks, touched, nal, v, tl, nb, sv, s0, s1, occ_runs, events, T)
    # operands exchanged into a compute set live in receive buffers for that step only
    for s_idx, recv in comp.recv_buffers.items():
        tl = np.flatnonzero(recv)
        pos = int(step_pos[s_idx])
        events.add(tl, np.full(tl.size, pos * 2 + 1), np.full(tl.size, pos * 2 + 2), recv[tl],
                   int(blocks.inner[pos]))
    # each re-occurrence of a reused block holds, for its position, the peak per tile of the block's
    # own events and of the variables it shares with the rest of the program, live in it as they
    # are in that occurrence (inner blocks first: their re-occurrences are events of the outer one)
    if len(blocks) and events.chunks:
        for k in range(len(blocks)):
            inside = np.zeros(len(blocks) + 1, bool)
            inside[:-1] = blocks.within[:, k]           # tag -1 indexes the last (False) entry
            a, e = int(blocks.pa[k]), int(blocks.pb[k])
            own = events.inside(inside, 2 * a)
            refs = blocks.refs[k]
            runs = occ_runs.get(k, [])
            # refs whose shared variables are live alike share one peak
            keys = [b"".join(r[0][i].tobytes() for r in runs) for i in range(refs.size)]
            peaks: dict = {}
            for i, r in enumerate(refs.tolist()):
                if keys[i] not in peaks:
                    x = list(own)
                    for pattern, tl, lo, hi, is_first, is_last, last_touch, nb in runs:
                        entry, exit_ = (pattern[i] & 1) > 0, (pattern[i] & 2) > 0
                        first = np.where(is_first & entry, a, lo) - a
                        last = np.where(is_last, np.where(exit_, e - 1, np.minimum(hi, last_touch)), hi) - a
                        x.append((tl, (first * 2 + 1).astype(np.int32), (last * 2 + 2).astype(np.int32), nb))
                    peaks[keys[i]] = _tile_peaks(x, T, 2 * (e - a) + 3)[0]
                peak = peaks[keys[i]]
                tl = np.flatnonzero(peak > 0)
                events.add(tl, np.full(tl.size, 2 * r + 1), np.full(tl.size, 2 * r + 2), peak[tl],
                           int(blocks.inner[r]))
    if events.chunks:
        H = 2 * npos + 3
        nal_peak, step_delta, per = _tile_peaks(events.chunks, T, H, spec.num_ipus, spec.tiles_per_ipu)
        events.chunks = []
        live_by_half = np.cumsum(step_delta)
        if nsteps:
            liveness = live_by_half[step_pos * 2 + 1]
            liveness_by_ipu = np.cumsum(per, axis=1)[:, step_pos * 2 + 1]
    variables = always + nal_peak
    vertex_code = np.zeros(T)
    for tname, mask in comp.vertex_code_tiles.items():
        vertex_code += mask * float(comp.vertex_type_code.get(tname, cal.USER_CODELET_CODE_BYTES))
    categories = {
        "Variables": variables,
        "Constants": constants,
        "Stack": np.full(T, float(cal.STACK_BYTES_PER_TILE)),
        "Vertex Instances": comp.vertex_state.copy(),
        # a Sequence met again is code again on Poplar; a function's body is code once
        "Control Code": np.full(T, float(cal.CONTROL_CODE_BYTES_PER_STEP * comp.code_steps)),
        "Vertex Code": vertex_code,
        "Internal Exchange Code": comp.exchange_code.copy(),
    }
    total = sum(categories.values())
    oom = np.flatnonzero(total > spec.bytes_per_tile)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))  # noqa: E731
    return MemoryPlan(spec.bytes_per_tile, categories, total, always, nal_peak, np.asarray(liveness),
                      oom, dict(comp.vertex_state_by_type), sum(len(s.vars) for s in st.spaces.values()), num_edges,
                      host_layout, liveness_by_ipu, events.count, cat(nal_ids), (cat(seg_v), cat(seg_0), cat(seg_1)),
                      step_pos)
