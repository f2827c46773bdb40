"""Tile memory planning: bytes per tile by category, variable liveness, out-of-memory tiles.

Categories follow Poplar's summary ("By Data Type"): Variables (always live, plus the peak of
the not-always-live ones), Constants, Stack, Vertex Instances (vertex state), Vertex Code,
Internal Exchange Code, Control Code. Byte figures are predictions for the IPU; code and stack
sizes are assumptions listed in :mod:`openipu.poplar.calibration`.

Liveness: program steps are numbered in compile order. A variable is *not always live* when
every program step that touches it belongs to one program, and its first touch writes it; it
then occupies memory over its def-use segments: from a write to the last touch before the next
step that writes all of it without reading it (one segment from first to last touch when none
does; widened to the whole of a loop that uses a value from before the loop; a variable first
written inside a loop is not widened; a function's own variables live during each call).
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


@dataclass
class MemoryPlan:
    """Bytes per tile (numpy arrays, length = tiles) by category, and what overflows.

    ``total`` = sum of categories with not-always-live variables at their peak.
    ``liveness`` = not-always-live bytes summed over tiles, per program step;
    ``liveness_by_ipu`` the same per IPU (``[ipus, steps]``).
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


def _function_locals(comp, S, V, nv: int):
    """Variables touched only inside the calls of one function: per variable (``[nv]``) the
    function's id (-1 if none) and its first and last step relative to the start of a call.
    Calls of a function lay out the same steps, so one call's pattern holds for all."""
    fid = np.full(nv, -1, np.int64)
    lo = np.full(nv, np.iinfo(np.int64).max)
    hi = np.zeros(nv, np.int64)
    if not comp.calls or S is None:
        return fid, lo, hi
    n = len(comp.steps)
    call_of = np.full(n + 1, -1, np.int64)
    for i, (_, a, b) in enumerate(comp.calls):     # inner calls come first; outer ones cover them
        call_of[a:b] = i
    fn = np.array([f for f, _, _ in comp.calls], np.int64)
    start = np.array([a for _, a, _ in comp.calls], np.int64)
    c = call_of[S]
    f = np.where(c >= 0, fn[np.maximum(c, 0)], -2)
    fmin = np.full(nv, np.iinfo(np.int64).max)
    fmax = np.full(nv, np.iinfo(np.int64).min)
    np.minimum.at(fmin, V, f)
    np.maximum.at(fmax, V, f)
    local = (fmin == fmax) & (fmin >= 0)
    rel = S - start[np.maximum(c, 0)]
    np.minimum.at(lo, V, rel)
    np.maximum.at(hi, V, rel)
    fid[local] = fmin[local]
    # a local made before a loop of the body and touched in it lives for all of the loop (every
    # call lays out the same loops: one of each, relative to the call's start, is enough)
    if comp.loops:
        loops = np.array(comp.loops, np.int64)
        ends = np.array([b for _, _, b in comp.calls], np.int64)
        ci, li = np.nonzero((start[:, None] <= loops[None, :, 0]) & (loops[None, :, 1] < ends[:, None]))
        rel_loops = np.unique(np.c_[fn[ci], loops[li] - start[ci, None]], axis=0)
        for f, rlo, rhi in rel_loops.tolist():
            carried = (fid == f) & (lo < rlo) & (hi >= rlo)
            hi[carried] = np.maximum(hi[carried], rhi)
    return fid, lo, hi


def code_steps(comp) -> int:
    """The program steps that have control code: every laid-out step, except that a function's
    steps count once however many times it is called (its code exists once; each call site
    jumps to it), as do the functions it calls."""
    n = len(comp.steps)
    repeat = np.zeros(n + 1, bool)
    seen: set = set()
    for f, a, b in sorted(comp.calls, key=lambda c: c[1]):     # each function's first call in time keeps its code
        if f in seen:
            repeat[a:b] = True
        seen.add(f)
    return int(n - repeat[:n].sum())


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


#: cells of the (half-step x tile) table in which per-tile peaks are found at once (128 MB of
#: float64); a longer program is done in blocks of tiles
PEAK_TABLE_CELLS = 1 << 24


def _add_events(tiles: list, steps: list, nbytes: list, tl, alloc, free, nb) -> None:
    """Record an allocation of ``nb`` bytes on tiles ``tl`` at half-steps ``alloc`` and its free
    at ``free`` (compact dtypes: the event lists of a large model hold tens of millions)."""
    tl = np.asarray(tl, np.int32)
    tiles += [tl, tl]
    steps += [np.asarray(alloc, np.int32), np.asarray(free, np.int32)]
    nb = np.asarray(nb, np.float32)
    nbytes += [nb, -nb]


def _tile_peaks(et, es, eb, T: int, H: int):
    """Per tile, the peak over half-steps of its live bytes (allocations at odd half-steps, frees
    at even ones), from events (tile, half-step, +/- bytes); and the byte change per half-step.
    The events of one (tile, half-step) all have one sign, so the peak at half-step granularity
    is the peak of the running sum. Tiles are taken in blocks so that the dense table stays
    within :data:`PEAK_TABLE_CELLS`."""
    peak = np.zeros(T)
    block = max(1, PEAK_TABLE_CELLS // H)
    for lo in range(0, T, block):
        hi = min(T, lo + block)
        m = slice(None) if (lo, hi) == (0, T) else (et >= lo) & (et < hi)
        table = np.zeros((H, hi - lo))
        np.add.at(table, (es[m], et[m] - lo), eb[m])
        np.cumsum(table, axis=0, out=table)
        peak[lo:hi] = np.maximum(table.max(axis=0), 0)
    return peak, np.bincount(es, weights=eb, minlength=H)


def plan_memory(comp, prog_ranges) -> MemoryPlan:
    """Plan the memory of a compiled graph (``comp`` is the engine's compiler)."""
    st, spec = comp.state, comp.spec
    T = spec.num_tiles
    nsteps = len(comp.steps)
    variables = np.zeros(T)
    constants = np.zeros(T)
    nal_peak = np.zeros(T)
    always = np.zeros(T)
    liveness = np.zeros(max(nsteps, 1))
    liveness_by_ipu = np.zeros((spec.num_ipus, max(nsteps, 1)))
    host_vars = {}
    for t in list(st.host_writes.values()) + list(st.host_reads.values()) + [t for t, _ in getattr(st, "initial_values", [])]:
        host_vars.setdefault(t._type.space, []).append(_space_indices(st, t))
    events_tile, events_step, events_bytes = [], [], []
    host_layout: dict = {}
    prog_of_step = np.zeros(max(nsteps, 1), np.int64)
    for i, (a, b) in enumerate(prog_ranges):
        prog_of_step[a:b] = i
    step_vars, num_edges = _step_variables(comp)
    for name, space in st.spaces.items():
        nv = len(space.vars)
        if nv == 0:
            continue
        first = np.full(nv, np.iinfo(np.int64).max)
        last = np.full(nv, -1)
        first_is_write = np.zeros(nv, bool)
        multi_prog = np.zeros(nv, bool)
        if name in step_vars:
            S, V, W, F = step_vars[name]
            np.minimum.at(first, V, S)
            np.maximum.at(last, V, S)
            # the first touch is a write unless the variable is read in its first step (a step
            # that reads and writes a variable counts as a read)
            read_first = np.zeros(nv, bool)
            read_first[V[~W & (S == first[V])]] = True
            first_is_write = (last >= 0) & ~read_first
            nprog = max(len(prog_ranges), 1)
            pairs = np.unique(V * nprog + prog_of_step[S])
            multi_prog = np.bincount(pairs // nprog, minlength=nv) > 1
        for lo, hi in comp.loops:
            # The host keeps one place per variable over all its life, stretched over the loops
            # it crosses (a value made before a loop and used in it lives for all of the loop).
            carried = (last >= lo) & (first <= hi) & ((first < lo) | ~first_is_write)
            last = np.where(carried, np.maximum(last, hi), last)
        is_const = np.array([v.constant for v in space.vars])
        pinned = np.zeros(nv, bool)
        for vids in host_vars.get(name, []):
            pinned[vids] = True
        pinned |= np.array([v.init is not None for v in space.vars]) & ~is_const
        nal = (~is_const) & (~pinned) & (last >= 0) & first_is_write & (~multi_prog)
        sizes = np.array([v.numel for v in space.vars], np.int64)
        host_layout[name] = host_offsets(sizes, first, last, nal)
        var_ids, tiles, nbytes = _variable_runs(space)
        ok = tiles >= 0
        var_ids, tiles, nbytes = var_ids[ok], tiles[ok], nbytes[ok]
        c = is_const[var_ids]
        constants += np.bincount(tiles[c], weights=nbytes[c], minlength=T)
        al = ~c & ~nal[var_ids]
        always += np.bincount(tiles[al], weights=nbytes[al], minlength=T)
        m = nal[var_ids]
        if m.any():
            v, tl, nb = var_ids[m], tiles[m], nbytes[m]
            # a function's own variables live during each call, not from the first call to the last
            S, V, W, F = step_vars[name]
            lf, lo_rel, hi_rel = _function_locals(comp, S, V, nv)
            loc = lf[v] >= 0
            # the others live over their def-use segments, stretched over the loops they cross; a
            # run is allocated before each segment and freed after
            seg_ok = nal & (lf < 0)
            sv, s0, s1 = _widen_over_loops(*_segments(S, V, W, F, seg_ok), comp.loops)
            cnt = np.bincount(sv, minlength=nv)
            seg_at = np.cumsum(cnt) - cnt                      # index of each variable's first segment
            g = np.flatnonzero(~loc)
            owner, j = R.group_ranks(cnt[v[g]])             # each run once per segment of its variable
            run = g[owner]
            si = seg_at[v[run]] + j
            sa, se = s0[si], s1[si]
            _add_events(events_tile, events_step, events_bytes, tl[run], sa * 2 + 1, se * 2 + 2, nb[run])
            for fid, a, _ in comp.calls:
                k = loc & (lf[v] == fid)
                if k.any():
                    _add_events(events_tile, events_step, events_bytes, tl[k], (a + lo_rel[v[k]]) * 2 + 1,
                                (a + hi_rel[v[k]]) * 2 + 2, nb[k])
    # operands exchanged into a compute set live in receive buffers for that step only
    for s_idx, recv in comp.recv_buffers.items():
        tl = np.flatnonzero(recv)
        _add_events(events_tile, events_step, events_bytes, tl, np.full(tl.size, s_idx * 2 + 1),
                    np.full(tl.size, s_idx * 2 + 2), recv[tl])
    if events_tile:
        H = 2 * nsteps + 3
        et, es, eb = np.concatenate(events_tile), np.concatenate(events_step), np.concatenate(events_bytes)
        nal_peak, step_delta = _tile_peaks(et, es, eb, T, H)
        live_by_half = np.cumsum(step_delta)
        liveness = live_by_half[1:2 * nsteps + 1:2] if nsteps else liveness
        if nsteps:
            ipu_of = (et // spec.tiles_per_ipu).astype(np.int64)
            per = np.bincount(ipu_of * H + es, weights=eb, minlength=spec.num_ipus * H).reshape(spec.num_ipus, H)
            liveness_by_ipu = np.cumsum(per, axis=1)[:, 1:2 * nsteps + 1:2]
        del et, es, eb
    variables = always + nal_peak
    vertex_code = np.zeros(T)
    for tname, mask in comp.vertex_code_tiles.items():
        vertex_code += mask * float(comp.vertex_type_code.get(tname, cal.USER_CODELET_CODE_BYTES))
    categories = {
        "Variables": variables,
        "Constants": constants,
        "Stack": np.full(T, float(cal.STACK_BYTES_PER_TILE)),
        "Vertex Instances": comp.vertex_state.copy(),
        "Control Code": np.full(T, float(cal.CONTROL_CODE_BYTES_PER_STEP * code_steps(comp))),
        "Vertex Code": vertex_code,
        "Internal Exchange Code": comp.exchange_code.copy(),
    }
    total = sum(categories.values())
    oom = np.flatnonzero(total > spec.bytes_per_tile)
    return MemoryPlan(spec.bytes_per_tile, categories, total, always, nal_peak, np.asarray(liveness),
                      oom, dict(comp.vertex_state_by_type), sum(len(s.vars) for s in st.spaces.values()), num_edges,
                      host_layout, liveness_by_ipu)
