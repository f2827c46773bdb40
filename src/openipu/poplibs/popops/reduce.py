"""``popops``: reductions (PopLibs ``include/popops/Reduce.hpp``, ``Operation.hpp``).

A reduction is planned in stages, like PopLibs' ``lib/popops/reduction/ReductionStages.cpp``:

1. **On the input's tiles.** Every tile reduces the input elements it holds, one partial per
   (output element, tile). Partials are kept in the inter-tile accumulation type (float for half
   inputs of ADD, SQUARE_ADD and LOG_ADD, else the input type; option ``accumType.interTile``).
   When every output element's inputs sit on one tile (and that tile is where the output lives),
   this stage writes the output directly and the reduction has one stage.
2. **Intermediate stages**, only while some output still has more than ``MAX_FANIN`` partials:
   groups of about ``sqrt(fan-in)`` partials are reduced on one of the group's tiles.
3. **On the output's tiles.** The remaining partials are exchanged to the tile of their output
   element and reduced, applying ``scale`` and ``update``. An output that was not given (or not
   completely mapped) is mapped linearly with at least 4 data-path vectors per tile, as PopLibs'
   ``intermediateToOutput`` does (``lib/popops/reduction/ReductionStages.cpp``).

Host work follows the structure: the input's layout is read as boxes of ``[outputs, reduced]`` on
tiles, and the partials of a stage as *classes* of outputs (ranges, or progressions after an
intermediate stage) that share one set of tiles (:class:`_Level`). Each stage's partials are one
variable holding each tile's partials together (PopLibs creates the partials tile by tile), so its
tile map is one interval per tile. Reads of exchanged partials are ranges of that variable, each
used on one tile. Kernels build per-element indices only while they run, a chunk at a time, and
build them from that structure with linear passes (a ``np.repeat`` per list of ranges; no sort or
search per element): the first stage's from the input's tile boxes cut at the class bounds
(:func:`_first_index`), the final stage's from the last level's blocks. A reduction over an
outer axis (the batch axis of a ``linear`` weight gradient, ``[B, rows, cols]`` over ``B``) has
one-column boxes in the ``[outputs, reduced]`` view: work per box row (a sort of the box rows
into the view's order, as this module once did on every run) is work per element there.

Each stage is one compute set holding one vertex group. Cycle estimates per tile
(:mod:`.reduce_cost`; the operators and checks are in :mod:`.reduce_operation`) follow the shape
of PopLibs' reduce estimators (``lib/popops/reduction/CycleEstimationFunctions.cpp``):
``ContinuousReduce`` (``getCycleEstimateReduceAllRegionsContinuous``) when the reduced dimensions
are the innermost ones, the general ``Reduce`` vertex (``getCyclesEstimateForReduce``) otherwise
and for the stages that reduce exchanged partials. The work of a tile is split over its 6 worker
contexts; the tile's cycles are ``6 x`` the busiest worker's (how PopLibs splits regions between
workers is approximated: [A]).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.exchange import tile_boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._common import flat_boxes, read_on_tiles, tile_counts_of, union_intervals
from openipu.poplar import sets as _sets
from openipu.poplibs.popops.reduce_cost import (WORKERS, address_runs_per_tile, continuous_reduce_cycles,
                                                reduce_worker_cycles, stage_tile_cycles)
from openipu.poplibs.popops.reduce_operation import (FLOPS, SCALABLE, Operation, ReduceParams, SingleReduceOp,
                                                     check_dims, check_types, parse_options)

__all__ = ["Operation", "ReduceParams", "SingleReduceOp", "reduce", "reduceWithOutput", "reduceMany",
           "reduce_worker_cycles", "continuous_reduce_cycles"]

#: Largest number of partials per output reduced in the final stage before an intermediate stage
#: is added. [A] PopLibs decides with its exchange/compute model (ReductionPlan.cpp).
MAX_FANIN = 32


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------
def _identity(op: Operation, dtype):
    if op in (Operation.ADD, Operation.SQUARE_ADD, Operation.LOGICAL_OR):
        return 0
    if op in (Operation.MUL, Operation.LOGICAL_AND):
        return 1
    if op == Operation.LOG_ADD:
        return -math.inf
    if dtype.is_floating_point:
        return math.inf if op == Operation.MIN else -math.inf
    info = torch.iinfo(dtype)
    return info.max if op == Operation.MIN else info.min


def _segment_reduce(vals: torch.Tensor, idx: torch.Tensor, n: int, op: Operation) -> torch.Tensor:
    """Reduce ``vals[R, E]`` into ``[R, n]`` by segment ids ``idx[E]`` with ``op`` (no squaring)."""
    R = vals.shape[0]
    dt = vals.dtype
    if op in (Operation.ADD, Operation.SQUARE_ADD):
        return torch.zeros(R, n, dtype=dt).index_add_(1, idx, vals)
    if op == Operation.LOG_ADD:
        ix = idx.expand(R, -1)
        mx = torch.full((R, n), -math.inf, dtype=dt).scatter_reduce_(1, ix, vals, "amax", include_self=True)
        safe = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
        s = torch.zeros(R, n, dtype=dt).index_add_(1, idx, torch.exp(vals - safe.gather(1, ix)))
        return torch.where(torch.isinf(mx) & (mx > 0), mx, safe + torch.log(s))
    if op in (Operation.LOGICAL_AND, Operation.LOGICAL_OR):
        v = vals.to(torch.int32)
        red = "amin" if op == Operation.LOGICAL_AND else "amax"
        init = 1 if op == Operation.LOGICAL_AND else 0
        out = torch.full((R, n), init, dtype=torch.int32).scatter_reduce_(1, idx.expand(R, -1), v, red, include_self=True)
        return out.to(torch.bool)
    red = {Operation.MUL: "prod", Operation.MAX: "amax", Operation.MIN: "amin"}[op]
    init = _identity(op, dt)
    return torch.full((R, n), init, dtype=dt).scatter_reduce_(1, idx.expand(R, -1), vals, red, include_self=True)


@kernel
def _stage_kernel(src, dst, indexer, n_dst, op, compute_dtype, first, final, ctx):
    """One reduction stage: ``dst[j] = op(src[i] for index[i] == j)``, in the order of ``src``'s
    flattened elements; ``indexer()`` yields ``(begin, end, index, dest)`` chunks of the
    flattened ``src``: ``index`` numbers the destination of each element of the chunk, ``dest``
    maps those numbers to positions of ``dst`` (None: they are positions already); the
    destinations of a chunk get all their elements from it. ``final`` = (scale, scale tensor or
    None, update) applies the output transform. Index arrays exist only while the kernel runs,
    one chunk at a time."""
    vals = ctx.read(src).reshape(ctx.replicas, -1)
    if compute_dtype is not None:
        vals = vals.to(compute_dtype)
    if first and op == Operation.SQUARE_ADD:
        vals = vals * vals
    if not vals.shape[1]:
        res = torch.full((vals.shape[0], n_dst), _identity(op, vals.dtype), dtype=vals.dtype)
    else:
        res = None
        for b, e, index, dest in indexer():
            if dest is None and b == 0 and e == vals.shape[1]:
                res = _segment_reduce(vals, torch.from_numpy(index), n_dst, op)
                continue
            if dest is None:
                dest, index = np.unique(index, return_inverse=True)
            part = _segment_reduce(vals[:, b:e], torch.from_numpy(index.reshape(-1)), dest.size, op)
            if res is None:
                res = torch.zeros((vals.shape[0], n_dst), dtype=part.dtype)
            res[:, torch.from_numpy(dest)] = part
    if final is not None:
        res = _finish(res, dst, op, final, ctx)
    ctx.write(dst, res.reshape((ctx.replicas,) + tuple(dst.shape())))


def _finish(res, dst, op, final, ctx):
    scale, scale_t, update = final
    if scale_t is not None:
        k = ctx.read(scale_t).reshape(ctx.replicas, 1).to(res.dtype)
    elif scale is not None:
        k = torch.tensor(float(scale), dtype=res.dtype)
    else:
        k = None
    if k is not None:
        res = res + k if op == Operation.LOG_ADD else res * k
    if update:
        old = ctx.read(dst).reshape(ctx.replicas, -1).to(res.dtype)
        res = torch.logaddexp(old, res) if op == Operation.LOG_ADD else old + res
    return res


# ----------------------------------------------------------------------------------------------
# planning
# ----------------------------------------------------------------------------------------------

@dataclass
class _Plan:
    out: poplar.Tensor
    stages: list          # VertexGroups, in order


#: Elements of the input per chunk of the first stage's kernel (the index arrays of one chunk).
KERNEL_CHUNK = 1 << 22


def _enumerate_ranges(lo: np.ndarray, n: np.ndarray):
    """For ranges ``[lo[k], lo[k] + n[k])``: the range of each item and the item (vectorised)."""
    k = np.repeat(np.arange(n.size), n)
    return k, np.repeat(lo, n) + (np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n))


class _Level:
    """The partials of one stage, by structure.

    *Classes* ``c`` are arithmetic progressions of outputs ``m = m0[c] + i * stride[c]``
    (``i < count[c]``) whose partials lie on one ascending set of tiles
    ``tiles[ptr[c]:ptr[c + 1]]``; a tile's partials of one class form a *block* (blocks are
    numbered class by class, tile by tile: block ``ptr[c] + r`` is class ``c``'s tile of rank
    ``r``). The partials variable holds the blocks tile by tile (PopLibs keeps each tile's
    partials together), a block's partials in the order ``(i mod period, i)`` so that the
    partials the next stage sends to one tile are contiguous.
    """

    def __init__(self, m0, stride, count, ptr, tiles):
        self.m0, self.stride, self.count = (np.asarray(x, np.int64) for x in (m0, stride, count))
        self.ptr, self.tiles = np.asarray(ptr, np.int64), np.asarray(tiles, np.int64)
        sizes = np.diff(self.ptr)
        self.fan = sizes
        self.cls = np.repeat(np.arange(self.m0.size), sizes)
        self.rank = np.arange(self.tiles.size) - np.repeat(self.ptr[:-1], sizes)
        self.bcount = self.count[self.cls]
        self.total = int(self.bcount.sum())
        self.layout(np.ones(self.tiles.size, np.int64))

    def layout(self, period: np.ndarray) -> None:
        self.period = np.asarray(period, np.int64)
        self.in_order = bool((self.period == 1).all())
        self.n_div, self.n_mod = np.divmod(self.bcount, self.period)
        order = np.lexsort((self.cls, self.tiles))
        self.offset = np.empty(self.tiles.size, np.int64)
        self.offset[order] = np.cumsum(self.bcount[order]) - self.bcount[order]

    def position(self, q: np.ndarray, i: np.ndarray) -> np.ndarray:
        """Position in the partials variable of partial ``i`` of block ``q``."""
        if self.in_order:
            return self.offset[q] + i
        d, rho = np.divmod(i, self.period[q])
        return self.offset[q] + rho * self.n_div[q] + np.minimum(rho, self.n_mod[q]) + d

    def tile_runs(self):
        """``(begin, end, tile)`` of the variable: one run per tile."""
        cnt = np.bincount(self.tiles, weights=self.bcount).astype(np.int64)
        used = np.flatnonzero(cnt)
        end = np.cumsum(cnt[used])
        return end - cnt[used], end, used

    def partials_per_tile(self, num_tiles: int) -> np.ndarray:
        return np.bincount(self.tiles, weights=self.bcount, minlength=num_tiles).astype(np.int64)

    def enumerate(self):
        """Every partial: ``(position, block, i)`` (int64 arrays of ``total``; kernels only)."""
        q, i = _enumerate_ranges(np.zeros(self.tiles.size, np.int64), self.bcount)
        return self.position(q, i), q, i

    @staticmethod
    def first(st, slo, shi) -> "_Level":
        """Level 1 from the row ranges each tile holds (``(tile, begin, end)``, a tile's ranges
        disjoint and not touching): classes are the ranges between all the ranges' ends."""
        bounds = _sets.unique(np.concatenate([slo, shi]))
        i0, i1 = np.searchsorted(bounds, slo), np.searchsorted(bounds, shi)
        tl, k = _enumerate_ranges(i0, i1 - i0)
        tl = st[tl]
        order = np.lexsort((tl, k))
        k, tl = k[order], tl[order]
        ptr = np.searchsorted(k, np.arange(bounds.size))
        keep = np.diff(ptr) > 0
        ptr = np.r_[0, np.cumsum(np.diff(ptr)[keep])]
        return _Level(bounds[:-1][keep], np.ones(int(keep.sum()), np.int64), np.diff(bounds)[keep], ptr, tl)


@dataclass
class _Grouping:
    """An intermediate stage from ``src`` to ``dst`` (PopLibs' extra reduction stage): the
    partials of each output (ascending tile order) are cut into groups of ``g = ceil(sqrt(fan))``
    and each group is reduced on the tile of its member ``m mod group size`` (rotating the
    reducing tile over the outputs) [A]. Per source class: ``g``, ``G`` groups, the last group's
    size ``last``, the period ``P`` of the reducing tiles in ``i`` and the first subclass ``sub0``
    (the destination classes are the source classes split by ``i mod P``; ``sub_cls``: the source
    class of each destination class)."""

    src: _Level
    dst: _Level
    g: np.ndarray
    G: np.ndarray
    last: np.ndarray
    P: np.ndarray
    sub0: np.ndarray
    sub_cls: np.ndarray

    @staticmethod
    def of(L: _Level) -> "_Grouping":
        s = L.fan
        g = np.maximum(1, np.ceil(np.sqrt(s)).astype(np.int64))
        G = -(-s // g)
        last = s - (G - 1) * g
        p_full = g // np.gcd(L.stride, g)
        p_last = last // np.gcd(L.stride, last)
        P = np.where(G > 1, np.lcm(p_full, p_last), p_last)
        # the source blocks' layout: partials ordered by their reducing tile's period
        c = L.cls
        j = L.rank // g[c]
        gs = np.where(j == G[c] - 1, last[c], g[c])
        L.layout(gs // np.gcd(L.stride[c], gs))
        # destination classes: class c split by i mod P[c] (subclasses with no output dropped)
        n_sub = np.minimum(P, L.count)
        sc_cls, rho = _enumerate_ranges(np.zeros(L.m0.size, np.int64), n_sub)
        m0 = L.m0[sc_cls] + rho * L.stride[sc_cls]
        stride = L.stride[sc_cls] * P[sc_cls]
        count = (L.count[sc_cls] - rho + P[sc_cls] - 1) // P[sc_cls]
        sc, jj = _enumerate_ranges(np.zeros(sc_cls.size, np.int64), G[sc_cls])
        cc = sc_cls[sc]
        gsj = np.where(jj == G[cc] - 1, last[cc], g[cc])
        tiles = L.tiles[L.ptr[cc] + jj * g[cc] + m0[sc] % gsj]
        dst = _Level(m0, stride, count, np.r_[0, np.cumsum(G[sc_cls])], tiles)
        return _Grouping(L, dst, g, G, last, P, np.cumsum(n_sub) - n_sub, sc_cls)

    def consumer_boxes(self):
        """Where the source partials are reduced: flat ranges of the source variable and tiles."""
        L = self.src
        q, rho = _enumerate_ranges(np.zeros(L.tiles.size, np.int64), L.period)
        c = L.cls[q]
        j = L.rank[q] // self.g[c]
        gs = np.where(j == self.G[c] - 1, self.last[c], self.g[c])
        tile = L.tiles[L.ptr[c] + j * self.g[c] + (L.m0[c] + rho * L.stride[c]) % gs]
        p, n = L.period[q], L.bcount[q]
        begin = L.offset[q] + rho * (n // p) + np.minimum(rho, n % p)
        return begin, begin + n // p + (rho < n % p), tile

    def work(self, num_tiles: int):
        """Per tile: partials received (``E``) and produced (``K``)."""
        D = self.dst
        src_cls = self.sub_cls[D.cls]                    # the source class of each destination block
        j = D.rank
        gs = np.where(j == self.G[src_cls] - 1, self.last[src_cls], self.g[src_cls])
        E = np.bincount(D.tiles, weights=gs * D.bcount, minlength=num_tiles).astype(np.int64)
        return E, D.partials_per_tile(num_tiles)

    def destinations(self) -> np.ndarray:
        """Destination position of each source partial, by source position (kernels only)."""
        L, D = self.src, self.dst
        pos, q, i = L.enumerate()
        c = L.cls[q]
        j = L.rank[q] // self.g[c]
        qn = D.ptr[self.sub0[c] + i % self.P[c]] + j
        out = np.empty(L.total, np.int64)
        out[pos] = D.position(qn, i // self.P[c])
        return out


def _out_boxes(L: _Level, ob, oe, otl):
    """The final stage's reads: flat ranges of the last level's variable and the tile of the
    output each range reduces into (output tile runs ``ob, oe, otl``)."""
    q = np.arange(L.tiles.size)
    c = L.cls
    m0, st, n = L.m0[c], L.stride[c], L.bcount
    m_last = m0 + (n - 1) * st
    a = np.searchsorted(ob, m0, side="right")
    z = np.searchsorted(ob, m_last, side="right")
    k, bi = _enumerate_ranges(a, z - a)                      # run starts inside each block's span
    ich = -(-(ob[bi] - m0[k]) // st[k])                      # first partial past each run start
    qq = np.concatenate([q, k])
    ii = np.concatenate([np.zeros(q.size, np.int64), ich])
    order = np.lexsort((ii, qq))
    qq, ii = qq[order], ii[order]
    keep = np.r_[True, (qq[1:] != qq[:-1]) | (ii[1:] != ii[:-1])]
    qq, ii = qq[keep], ii[keep]
    nxt = np.r_[ii[1:], 0]
    last = np.r_[qq[1:] != qq[:-1], True]
    jj = np.where(last, n[qq], nxt)
    tile = otl[np.searchsorted(ob, m0[qq] + ii * st[qq], side="right") - 1]
    pos = L.offset[qq] + ii                                  # the last level is laid out in i order
    return pos, L.offset[qq] + jj, tile.astype(np.int64)


def _plan(graph, in_, dims, params, out_type, out, name, options) -> _Plan:
    """Validate and build the vertex groups of one reduction (no compute sets yet)."""
    if not isinstance(params, ReduceParams):
        params = ReduceParams(params)
    op = params.op
    if not isinstance(in_, poplar.Tensor):
        raise poplar.graph_connection_error(f"{name}: the input must be a Tensor, got {type(in_).__name__}")
    dims = check_dims(in_, dims, name)
    in_type = in_.elementType()
    keep = [d for d in range(in_.rank()) if d not in dims]
    out_shape = [in_.dim(d) for d in keep]
    if out is not None:
        out_type = out.elementType()
        if list(out.shape()) != out_shape and out.numElements() != int(np.prod(out_shape, dtype=np.int64)):
            raise poplar.graph_connection_error(
                f"{name}: output shape {out.shape()} does not match the reduced shape {out_shape}")
    out_type = poplar.types.as_type(out_type) if out_type is not None else in_type
    check_types(op, in_type, out_type, name)
    if (params.update or params.scale is not None) and op not in SCALABLE:
        raise poplar.poplar_error(f"{name}: scale and update are only valid with ADD, SQUARE_ADD and LOG_ADD, not {op}")
    scale_t = None
    if isinstance(params.scale, poplar.Tensor):
        scale_t = params.scale
        if scale_t.numElements() != 1 or not scale_t.elementType().is_float:
            raise poplar.graph_connection_error(
                f"{name}: the scale must be a one-element float or half tensor, got {scale_t.elementType()} "
                f"of shape {scale_t.shape()}")
    inter, invertex = parse_options(options, in_type, op, name)
    target = graph.getTarget()
    T = graph._top._target.getNumTiles()
    M = int(np.prod(out_shape, dtype=np.int64))
    N = int(np.prod([in_.dim(d) for d in dims], dtype=np.int64))
    view = in_.dimShuffle(keep + dims).reshape([M, N]) if in_.rank() else in_.reshape([1, 1])
    boxes = tile_boxes(view)                         # the input's layout: boxes of [M, N] on tiles
    box_n = np.prod(boxes.sz, axis=1, dtype=np.int64)
    if (boxes.tile < 0).any():
        raise poplar.invalid_tile_mapping(
            f"{name}: {int(box_n[boxes.tile < 0].sum())} input elements are not mapped to a tile; map the input first")
    out_mapped = out is not None and graph.is_mapped(out)
    if out is None:
        out = graph.addVariable(out_type, out_shape, name)
    out_flat = out.reshape([M])
    compute = torch.float32 if invertex == poplar.FLOAT and in_type == poplar.HALF else None
    if op == Operation.LOG_ADD and in_type == poplar.HALF:
        compute = torch.float32                     # log-add is computed in float (ReduceLogAdd casts)
    final = (None if scale_t is not None else params.scale, scale_t, params.update)
    stages = []
    if M == 0:
        return _Plan(out, stages)
    if N == 0:
        if not out_mapped:
            from openipu.poplibs.poputil import mapTensorLinearly
            mapTensorLinearly(graph, out)
        used, counts = tile_counts_of(graph, out_flat)
        stages.append(_group(f"popops::Fill<{out_type}>", used, WORKERS * (26 + -(-counts // target.getVectorWidth(out_type))),
                             view, out_flat, None, M, op, compute, True, final,
                             reads=[], writes=[Access(out_flat)], flops=0.0, scale_t=scale_t, update=params.update))
        return _Plan(out, stages)
    # level 1: one partial per (output, tile holding some of its inputs)
    L1 = _Level.first(*union_intervals(boxes.tile, boxes.lo[:, 0], boxes.lo[:, 0] + boxes.sz[:, 0]))
    continuous = dims == list(range(in_.rank() - len(dims), in_.rank()))
    first_E = np.bincount(boxes.tile, weights=box_n, minlength=T).astype(np.int64)
    first_runs = address_runs_per_tile(view, first_E)
    single = L1.total == M
    if single and out_mapped:
        # the output must lie where each row's inputs lie
        rb, re_, rt = L1.m0, L1.m0 + L1.count, L1.tiles
        ob, oe, ot = graph.tile_runs_of(out_flat)
        single = _same_runs(rb, re_, rt, ob, oe, ot.astype(np.int64))
    if single:
        if not out_mapped:
            graph.set_tile_runs(out_flat, L1.m0, L1.m0 + L1.count, L1.tiles)
        indexer = functools.partial(_first_index, boxes, [M, N], None, T)
        stages.append(_first_stage(graph, view, out_flat, indexer, first_E, L1.partials_per_tile(T), first_runs, M, op,
                                   compute, final, continuous, in_type, out_type, target, scale_t, params.update, name))
        return _Plan(out, stages)
    # intermediate stages while the fan-in per output is large
    levels, groupings = [L1], []
    while int(levels[-1].fan.max()) > MAX_FANIN:
        groupings.append(_Grouping.of(levels[-1]))
        levels.append(groupings[-1].dst)
    # stage 1: partials per (output, tile) on the input's tiles
    part = graph.addVariable(inter, [L1.total], f"{name}/partials0")
    graph.set_tile_runs(part, *L1.tile_runs())
    indexer = functools.partial(_first_index, boxes, [M, N], L1, T)
    stages.append(_first_stage(graph, view, part, indexer, first_E, L1.partials_per_tile(T), first_runs, L1.total, op,
                               compute, None, continuous, in_type, inter, target, None, False, name))
    later_op = Operation.ADD if op == Operation.SQUARE_ADD else op
    for level, gr in enumerate(groupings, start=1):
        nxt = graph.addVariable(inter, [gr.dst.total], f"{name}/partials{level}")
        graph.set_tile_runs(nxt, *gr.dst.tile_runs())
        E, K = gr.work(T)
        b, e, tl = gr.consumer_boxes()
        stages.append(_later_stage(graph, part, Access(part, flat_boxes(b, e, tl)), nxt, functools.partial(_grouping_destinations, gr), E, K,
                                   gr.dst.total, later_op, None, inter, inter, target, None, False))
        part = nxt
    # final stage on the output's tiles. An output without a complete mapping is mapped linearly
    # with at least 4 vectors per tile (PopLibs ReductionStages.cpp intermediateToOutput).
    if not out_mapped:
        from openipu.poplibs.poputil import mapTensorLinearly
        vw = target.getVectorWidth(out_type)
        mapTensorLinearly(graph, out_flat, 4 * vw, vw)
    L = levels[-1]
    ob, oe, ot = graph.tile_runs_of(out_flat)
    b, e, tl = _out_boxes(L, ob, oe, ot.astype(np.int64))
    E = np.bincount(tl, weights=e - b, minlength=T).astype(np.int64)
    K = graph.tile_element_counts(out_flat).astype(np.int64)
    stages.append(_later_stage(graph, part, Access(part, flat_boxes(b, e, tl)), out_flat,
                               functools.partial(_final_destinations, L), E, K, M, later_op, final, inter, out_type,
                               target, scale_t, params.update))
    return _Plan(out, stages)


def _same_runs(ab, ae, at, bb, be, bt) -> bool:
    """Whether two run-length functions over the same range are equal (runs sorted, covering)."""
    def norm(b, e, t):
        order = np.argsort(b, kind="stable")
        b, e, t = b[order], e[order], t[order]
        keep = np.r_[True, t[1:] != t[:-1]]
        return b[keep], t[keep]
    x, y = norm(ab, ae, at), norm(bb, be, bt)
    return x[0].size == y[0].size and bool((x[0] == y[0]).all() and (x[1] == y[1]).all())


@kernel
def _first_index(boxes, shape, level, num_tiles):
    """Chunks of the first stage's kernel: for whole rows of the input view (``shape`` ``[M, N]``,
    tile ``boxes``), the destination of each element (its output, or its level-1 partial).

    Planned by structure: the boxes are cut at the level's class bounds into *sub-boxes* (rows of
    one class on one tile, so one block of partials, laid out affinely when the level is in
    order); only the arrays handed to the kernel have one entry per element, filled from the
    sub-boxes with linear-time numpy (no sort or search per element). Without a level the
    destination of an element is its row, and the boxes are not read at all."""
    M, N = shape
    rows = max(1, KERNEL_CHUNK // max(N, 1))
    if level is None:
        for m0 in range(0, M, rows):
            m1 = min(M, m0 + rows)
            if m0 == 0 and m1 == M:
                yield 0, M * N, np.repeat(np.arange(M, dtype=np.int64), N), None
            else:
                yield m0 * N, m1 * N, np.repeat(np.arange(m1 - m0, dtype=np.int64), N), np.arange(m0, m1, dtype=np.int64)
        return
    # sub-boxes: each box cut at the bounds of the classes its rows cross (the classes of the
    # first level are consecutive row ranges, ascending)
    lo0, h0 = boxes.lo[:, 0], boxes.sz[:, 0]
    ca = np.searchsorted(level.m0, lo0, side="right") - 1
    cb = np.searchsorted(level.m0, lo0 + h0 - 1, side="right") - 1
    k, c = _enumerate_ranges(ca, cb - ca + 1)
    cm0 = level.m0[c]
    sa = np.maximum(lo0[k], cm0)
    sb = np.minimum(lo0[k] + h0[k], cm0 + level.count[c])
    key = level.cls * num_tiles + level.tiles
    q = np.searchsorted(key, c * num_tiles + boxes.tile[k])      # the block of each sub-box
    col, width = boxes.lo[k, 1], boxes.sz[k, 1]
    base = level.offset[q] - cm0                                 # in order: position = base + row
    for m0 in range(0, M, rows):
        m1 = min(M, m0 + rows)
        a, b = np.maximum(sa, m0), np.minimum(sb, m1)
        s = np.flatnonzero(a < b)
        a, h = a[s], (b - a)[s]
        if level.in_order and not (m0 == 0 and m1 == M):
            # the chunk's destinations: the union of the sub-boxes' position ranges (ranges of
            # one block for different columns coincide or overlap; different blocks are
            # disjoint), numbered compactly
            ps, pe = base[s] + a, base[s] + a + h
            order = np.argsort(ps, kind="stable")
            ps_o, pe_o = ps[order], pe[order]
            reach = np.maximum.accumulate(pe_o)
            new = np.r_[True, ps_o[1:] >= reach[:-1]]
            grp = np.cumsum(new) - 1
            us = ps_o[new]
            ue = np.maximum.reduceat(pe_o, np.flatnonzero(new))
            cstart = np.cumsum(ue - us) - (ue - us)
            shift = np.empty(s.size, np.int64)
            shift[order] = cstart[grp] - us[grp]                 # position -> compact position
            uniq = _expand(us, ue - us, np.arange(int((ue - us).sum()), dtype=np.int64))
        else:
            shift, uniq = 0, None
        # (sub-box, row) pieces, each the row's elements of one sub-box: its row, its first
        # element's flat position in the chunk, its destination
        r = _expand(a, h, np.arange(int(h.sum()), dtype=np.int64))
        first = (r - m0) * N + np.repeat(col[s], h)
        if level.in_order:
            dest = r + np.repeat(base[s] + shift, h)
        else:
            dest = level.position(np.repeat(q[s], h), r - np.repeat(cm0[s], h))
        index = np.empty((m1 - m0) * N, np.int64)
        w = width[s]
        if (w == 1).all():
            index[first] = dest
        else:
            w = np.repeat(w, h)
            index[_expand(first, w, np.arange(int(w.sum()), dtype=np.int64))] = np.repeat(dest, w)
        if m0 == 0 and m1 == M:
            yield 0, M * N, index, None
        elif uniq is None:
            uniq, inv = np.unique(index, return_inverse=True)
            yield m0 * N, m1 * N, inv.reshape(-1), uniq
        else:
            yield m0 * N, m1 * N, index, uniq


def _expand(lo: np.ndarray, n: np.ndarray, iota: np.ndarray) -> np.ndarray:
    """The items of the ranges ``[lo[k], lo[k] + n[k])``, concatenated; ``iota`` is
    ``arange(n.sum())`` (linear passes only: one repeat and one add)."""
    return iota + np.repeat(lo - (np.cumsum(n) - n), n)


@kernel
def _grouping_destinations(gr: _Grouping) -> np.ndarray:
    """``gr.destinations()`` as a kernel argument (a module-level function, as executables name)."""
    return gr.destinations()


@kernel
def _final_destinations(L: _Level) -> np.ndarray:
    """The output element of each partial of the last level, by position (kernels only)."""
    if L.in_order:
        # blocks are consecutive ranges of positions: position offset[q] + i holds output
        # m0 + i * stride of the block's class
        order = np.argsort(L.offset, kind="stable")
        n, c = L.bcount[order], L.cls[order]
        st = L.stride[c]
        iota = np.arange(L.total, dtype=np.int64)
        if (st == 1).all():
            return _expand(L.m0[c], n, iota)
        return np.repeat(L.m0[c] - L.offset[order] * st, n) + iota * np.repeat(st, n)
    pos, q, i = L.enumerate()
    out = np.empty(L.total, np.int64)
    out[pos] = L.m0[L.cls[q]] + i * L.stride[L.cls[q]]
    return out


def _stage_name(op, ptype, out_type, final, continuous, update):
    upd = bool(update) and final is not None
    scaled = final is not None and final[:2] != (None, None)
    vt = ("Scaled" if scaled else "") + ("ContinuousReduce" if continuous else "Reduce")
    op_name = "Reduce" + op.value.title().replace("_", "")
    return f"popops::{vt}<popops::{op_name},{ptype},{out_type},{str(upd).lower()}>", upd, scaled


def _first_stage(graph, view, dst, indexer, E, K, runs, n_dst, op, compute, final, continuous, ptype, out_type,
                 target, scale_t, update, name):
    """The vertex group reducing the input ``view`` on its own tiles into ``dst`` (the output or
    the level-1 partials); its partial regions are the input's contiguous regions on each tile."""
    used = np.flatnonzero(E)
    vname, upd, scaled = _stage_name(op, ptype, out_type, final, continuous, update)
    cyc = stage_tile_cycles(E[used], K[used], runs[used], continuous, ptype, out_type, op, upd, target)
    flops = float(max(0, view.numElements() - n_dst) * FLOPS[op] + (n_dst if scaled else 0))
    return _group(vname, used, cyc, view, dst, indexer, n_dst, op, compute, True, final,
                  reads=[Access(view)], writes=[Access(dst)], flops=flops, scale_t=scale_t, update=upd)


def _later_stage(graph, src, read, dst, destinations, E, K, n_dst, op, final, ptype, out_type, target, scale_t,
                 update):
    """The vertex group reducing exchanged partials ``src`` (``read`` says where each is used)
    into ``dst``: each received partial of a tile's outputs is one region (fan-in regions)."""
    used = np.flatnonzero(E)
    vname, upd, scaled = _stage_name(op, ptype, out_type, final, False, update)
    runs = -(-E[used] // np.maximum(K[used], 1))
    cyc = stage_tile_cycles(E[used], K[used], runs, False, ptype, out_type, op, upd, target)
    flops = float(max(0, src.numElements() - n_dst) * FLOPS[op] + (n_dst if scaled else 0))
    indexer = functools.partial(_whole_index, destinations, src.numElements())
    return _group(vname, used, cyc, src, dst, indexer, n_dst, op, None, False, final,
                  reads=[read], writes=[Access(dst)], flops=flops, scale_t=scale_t, update=upd)


@kernel
def _whole_index(destinations, n):
    yield 0, n, destinations(), None


def _group(vname, used, cycles, src, dst, indexer, n_dst, op, compute, first, final, reads, writes, flops, scale_t,
           update):
    reads = list(reads)
    if scale_t is not None and used.size:
        reads.append(Access(scale_t.reshape([1]), read_on_tiles(scale_t.reshape([1]), used)))
    if update and final is not None:
        reads.append(Access(dst))
    return VertexGroup(vname, used.astype(np.int64), np.asarray(cycles, np.int64),
                       functools.partial(_stage_kernel, src, dst, indexer, n_dst, op, compute, first, final),
                       reads=reads, writes=writes, multi=True, flops=flops, state_bytes=32)


def _emit(graph, plans, prog, name):
    """Add each stage of all ``plans`` to one compute set per stage (parallel reductions)."""
    depth = max((len(p.stages) for p in plans), default=0)
    for s in range(depth):
        cs = graph.addComputeSet(f"{name}/Reduce{'' if depth == 1 else s}")
        for p in plans:
            if s < len(p.stages):
                graph.add_vertex_group(cs, p.stages[s])
        if isinstance(prog, list):
            prog.append(cs)
        else:
            prog.add(poplar.program.Execute(cs))


def _split_args(args, fn):
    args = list(args)
    out_type = None
    if args and isinstance(args[0], (poplar.Type, str)):
        out_type = args.pop(0)
    if len(args) < 3:
        raise poplar.poplar_error(f"{fn}: expected (graph, in, [outType,] dims, params, prog[, debugName, options])")
    dims, params, prog = args[:3]
    debug_name = args[3] if len(args) > 3 else ""
    options = args[4] if len(args) > 4 else None
    return out_type, dims, params, prog, debug_name, options


def reduce(graph, in_, *args, debug_name: str = "", options=None):  # noqa: A001 - PopLibs name
    """``popops::reduce(graph, in, [outType,] dims, params, prog, debugName="", options={})``.

    Reduces ``in`` over ``dims`` (any order, each once) with ``params`` (a :class:`ReduceParams`
    or an :class:`Operation`); returns a new tensor of shape ``in.shape`` without ``dims`` and type
    ``outType`` (default: the input type). ``prog`` is a ``Sequence`` (stages appended as
    ``Execute``) or a list to which the compute sets are appended (PopLibs' ``css`` form).
    Options ``accumType.interTile`` / ``accumType.inVertex`` ("float" or "half").

    Raises ``poplar.index_error`` for bad ``dims``, ``poplar.graph_connection_error`` for types the
    operation does not support, ``poplar.poplar_error`` for scale/update with MUL/MIN/MAX/LOGICAL_*,
    ``poplar.invalid_option`` for unknown options. The graph is unchanged when it raises.
    """
    out_type, dims, params, prog, dn, opts = _split_args(args, "reduce")
    name = debug_name or dn or "reduce"
    plan = _plan(graph, in_, dims, params, out_type, None, name, options if options is not None else opts)
    _emit(graph, [plan], prog, name)
    return plan.out


def reduceWithOutput(graph, in_, out, dims, params, prog, debug_name: str = "", options=None):  # noqa: N802
    """``popops::reduceWithOutput``: like :func:`reduce` into ``out`` (its mapping is kept when
    complete, else set). With ``params.update`` the result is added to ``out``."""
    name = debug_name or "reduce"
    if not isinstance(out, poplar.Tensor):
        raise poplar.graph_connection_error(f"{name}: the output must be a Tensor, got {type(out).__name__}")
    plan = _plan(graph, in_, dims, params, None, out, name, options)
    _emit(graph, [plan], prog, name)


def reduceMany(graph, reductions, outputs_or_prog, prog=None, debug_name: str = "", options=None):  # noqa: N802
    """``popops::reduceMany(graph, reductions, outputs, prog, debugName, options)``: several
    reductions whose stages share compute sets (they run in parallel).

    ``reductions`` is a list of :class:`SingleReduceOp`. ``outputs`` is a list: empty to create the
    outputs (appended), or one tensor per reduction. ``reduceMany(graph, reductions, prog)`` is
    also accepted. Returns the list of outputs.
    """
    if prog is None:
        outputs, prog = [], outputs_or_prog
    else:
        outputs = outputs_or_prog
    name = debug_name or "reduceMany"
    given = list(outputs)
    if given and len(given) != len(reductions):
        raise poplar.graph_connection_error(
            f"{name}: {len(given)} outputs given for {len(reductions)} reductions; pass none or one per reduction")
    plans = []
    for i, r in enumerate(reductions):
        if not isinstance(r, SingleReduceOp):
            raise poplar.graph_connection_error(f"{name}: reduction {i} is a {type(r).__name__}, not a SingleReduceOp")
        plans.append(_plan(graph, r.in_, r.dims, r.params, r.outType, given[i] if given else r.out,
                           r.debugName or f"{name}/{i}", options))
    _emit(graph, plans, prog, name)
    if not given:
        outputs.extend(p.out for p in plans)
    return outputs


def _register_records():
    from openipu.poplar.graph_codec import data_class, data_enum
    data_enum(Operation, key="poplibs.popops.reduce:Operation")   # its name before it moved to reduce_operation
    data_class(_Grouping)
    data_class(_Level, fields=("m0", "stride", "count", "ptr", "tiles", "fan", "cls", "rank", "bcount", "total",
                               "period", "in_order", "n_div", "n_mod", "offset"))


_register_records()
