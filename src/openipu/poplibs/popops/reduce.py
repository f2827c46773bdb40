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

Each stage is one compute set holding one vertex group. Cycle estimates per tile follow the shape
of PopLibs' reduce estimators (``lib/popops/reduction/CycleEstimationFunctions.cpp``):
``ContinuousReduce`` (``getCycleEstimateReduceAllRegionsContinuous``) when the reduced dimensions
are the innermost ones, the general ``Reduce`` vertex (``getCyclesEstimateForReduce``) otherwise
and for the stages that reduce exchanged partials. The work of a tile is split over its 6 worker
contexts; the tile's cycles are ``6 x`` the busiest worker's (how PopLibs splits regions between
workers is approximated: [A]).
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import VertexGroup

__all__ = ["Operation", "ReduceParams", "SingleReduceOp", "reduce", "reduceWithOutput", "reduceMany",
           "reduce_worker_cycles", "continuous_reduce_cycles"]

#: Largest number of partials per output reduced in the final stage before an intermediate stage
#: is added. [A] PopLibs decides with its exchange/compute model (ReductionPlan.cpp).
MAX_FANIN = 32
#: Worker contexts per tile (ipu1/ipu2).
WORKERS = 6


class Operation(enum.Enum):
    """``popops::Operation``: the reduction operator."""

    ADD = "ADD"
    MUL = "MUL"
    MIN = "MIN"
    MAX = "MAX"
    LOGICAL_AND = "LOGICAL_AND"   # bool operands only
    LOGICAL_OR = "LOGICAL_OR"     # bool operands only
    SQUARE_ADD = "SQUARE_ADD"     # squares each element, then ADD
    LOG_ADD = "LOG_ADD"           # acc = max + log(1 + exp(min - max)) (log-sum-exp)

    def __str__(self):
        return self.value


_SCALABLE = (Operation.ADD, Operation.SQUARE_ADD, Operation.LOG_ADD)
_ACCUM = (Operation.ADD, Operation.SQUARE_ADD)
_VECTORISED = (Operation.ADD, Operation.SQUARE_ADD, Operation.MUL, Operation.MAX, Operation.MIN)
#: flops per element combined (PopLibs flopsForReduceOp; LOG_ADD [A]: max, sub, exp, add, log).
_FLOPS = {Operation.ADD: 1, Operation.MUL: 1, Operation.MIN: 1, Operation.MAX: 1, Operation.LOGICAL_AND: 0,
          Operation.LOGICAL_OR: 0, Operation.SQUARE_ADD: 2, Operation.LOG_ADD: 5}


def _as_operation(op) -> Operation:
    if isinstance(op, Operation):
        return op
    try:
        return Operation(str(op).upper().split(".")[-1])
    except ValueError:
        raise poplar.poplar_error(
            f"Unknown reduction operation {op!r}; use one of {', '.join(o.value for o in Operation)}") from None


class ReduceParams:
    """``popops::ReduceParams(op, update=False, scale=None)``.

    ``scale`` (a Python float or a one-element FLOAT/HALF tensor) multiplies the result (for
    LOG_ADD it is added, as in log space); ``update`` makes the reduction ``out += result`` (LOG_ADD:
    ``out = logaddexp(out, result)``). Both are only valid with ADD, SQUARE_ADD and LOG_ADD.
    """

    def __init__(self, op, update: bool = False, scale=None):
        self.op = _as_operation(op)
        self.update = bool(update)
        self.scale = scale

    @property
    def useScale(self) -> bool:  # noqa: N802 - PopLibs field name
        return self.scale is not None

    def __repr__(self):
        return f"ReduceParams({self.op}, update={self.update}, scale={self.scale!r})"


@dataclass
class SingleReduceOp:
    """``popops::SingleReduceOp``: one reduction of a :func:`reduceMany` call."""

    in_: poplar.Tensor
    dims: list
    params: ReduceParams
    outType: poplar.Type | None = None  # noqa: N815 - PopLibs field name
    debugName: str = ""  # noqa: N815
    out: poplar.Tensor | None = field(default=None, repr=False)


# ----------------------------------------------------------------------------------------------
# cycle estimates
# ----------------------------------------------------------------------------------------------
def _acc_vector_width(ptype) -> int:
    """Accumulator vector width (CycleEstimationFunctions.cpp: half 8, float 4, else 1)."""
    return 8 if ptype == poplar.HALF else 4 if ptype == poplar.FLOAT else 1


def _data_path_elems(ptype, target) -> int:
    """Elements per 64-bit load: ``getDataPathWidth() / (typeSize * 8)``."""
    return max(1, target.getDataPathWidth() // (ptype.size * 8))


def continuous_reduce_cycles(num_outputs, num_partials, ptype, op: Operation, update: bool, target):
    """Worker cycles of ``ContinuousReduce``: ``num_outputs`` outputs, each the reduction of
    ``num_partials`` contiguous partials (getCycleEstimateReduceAllRegionsContinuous):
    ``cyclesPerOp x outputs x (partials / elemsPerLoop) + 2 [odd] + 12 x outputs + 10 + update + 7``.
    LOG_ADD runs scalar C++ at 20 cycles per element (the same source)."""
    num_outputs = np.asarray(num_outputs, np.int64)
    num_partials = np.asarray(num_partials, np.int64)
    if op == Operation.LOG_ADD:
        cpo, epl = 20, 1
    else:
        cpo, epl = 1, min(_acc_vector_width(ptype), _data_path_elems(ptype, target))
    cyc = cpo * num_outputs * (num_partials // epl) + np.where(num_partials % 2 == 1, 2, 0) + 12 * num_outputs + 10
    return cyc + int(update) + 7


def reduce_worker_cycles(out_size, num_partials, accum, ptype, out_type, op: Operation, update: bool, target):
    """Worker cycles of the general ``Reduce`` vertex for one output region of ``out_size``
    elements fed by ``num_partials`` partial regions of ``accum x out_size`` elements each
    (getCyclesEstimateForReduce). Arrays broadcast (one entry per tile)."""
    out_size = np.maximum(np.asarray(out_size, np.int64), 1)
    num_partials = np.asarray(num_partials, np.int64)
    accum = np.asarray(accum, np.int64)
    cycles = np.full(np.broadcast(out_size, num_partials, accum).shape, 7, np.int64)   # entry/exit
    if op in _VECTORISED:
        uses_acc = op in _ACCUM
        op_vw = _acc_vector_width(ptype) if uses_acc else target.getVectorWidth(ptype)
        dpw = _data_path_elems(ptype, target)
        out_vw = target.getVectorWidth(out_type)
        cycles = cycles + 26                                              # load state
        load_w = min(op_vw, dpw)
        per_vector_load = (2 if uses_acc else 0) + 2 + op_vw // load_w
        outer = out_size // op_vw
        rem = out_size % op_vw
        checks = max(0, math.ceil(math.log2(op_vw))) if op_vw > 1 else 0

        def store(width):
            return (2 + int(update)) * min(width, out_vw) + int(uses_acc)

        cycles = cycles + 16 + 6 + 2 * checks + 2                         # per region overhead
        cycles = cycles + outer * ((3 + 2 if uses_acc else 3) + store(op_vw) + 1)
        cycles = cycles + outer * num_partials * (7 + 3)                  # _Reduce_ptr_fetch per partial
        cycles = cycles + num_partials * outer * accum * (per_vector_load + 3)
        for i in range(checks):
            bit = 1 << i
            has = (rem & bit) != 0
            loads = bit // min(bit, dpw)
            cycles = cycles + np.where(has, (3 + 1 if uses_acc else 2) + store(bit) + num_partials * 10
                                       + num_partials * accum * (2 + loads + 3), 0)
    else:
        # C++ codelets (LOGICAL_AND/OR, LOG_ADD): ~12 cycles per VectorList, 8 per region,
        # 22 per partial and (24 + cyclesPerOp + conversion) per element.
        cpo = 12 if op == Operation.LOG_ADD else 1
        conv = 0 if ptype == out_type else 1
        cycles = cycles + 24 + 8 + num_partials * (22 + (24 + cpo + conv) * accum * out_size)
    return cycles


def _stage_tile_cycles(E, k, runs, continuous: bool, ptype, out_type, op, update, target):
    """Tile cycles of one stage on each tile that reduces ``E`` elements into ``k`` outputs, the
    elements lying in ``runs`` contiguous partial regions.

    Outputs are split over the 6 workers; when a tile has fewer than 6 outputs but many elements
    per output, the elements are split over the workers and a second pass combines the workers'
    partials (PopLibs splits reductions between workers the same way; the split rule is [A])."""
    E = np.asarray(E, np.int64)
    k = np.maximum(np.asarray(k, np.int64), 1)
    per_out = -(-E // k)
    few = k < WORKERS
    split = np.where(few, np.maximum(1, np.minimum(WORKERS // k, per_out // 2)), 1)  # workers per output
    o_w = np.where(few, k, -(-k // WORKERS))
    n_w = -(-per_out // split)
    if continuous:
        o_single = np.where(few, 1, o_w)          # each worker reduces whole rows (or a piece of one)
        w = continuous_reduce_cycles(o_single, n_w, ptype, op, update, target)
    else:
        edges = np.clip(-(-np.asarray(runs, np.int64) // split), 1, n_w)
        w = reduce_worker_cycles(o_w, edges, -(-n_w // edges), ptype, out_type, op, update, target)
    combine = np.where(split > 1, reduce_worker_cycles(k, split, 1, ptype, out_type, op, update, target), 0)
    return WORKERS * w + combine


def _runs_per_tile(tiles: np.ndarray, addr: np.ndarray, num_tiles: int) -> np.ndarray:
    """Contiguous regions (same tile, consecutive addresses) of each tile, in address order."""
    order = np.argsort(addr, kind="stable")
    a, t = addr[order], tiles[order]
    brk = np.ones(a.size, bool)
    brk[1:] = (t[1:] != t[:-1]) | (a[1:] != a[:-1] + 1)
    return np.bincount(t[brk], minlength=num_tiles)


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


def _stage_kernel(src, dst, index, n_dst, op, compute_dtype, first, final, ctx):
    """One reduction stage: ``dst[j] = op(src[i] for index[i] == j)``; ``final`` = (scale, scale
    tensor or None, update) applies the output transform."""
    vals = ctx.read(src).reshape(ctx.replicas, -1)
    if compute_dtype is not None:
        vals = vals.to(compute_dtype)
    if first and op == Operation.SQUARE_ADD:
        vals = vals * vals
    idx = torch.from_numpy(index)
    res = _segment_reduce(vals, idx, n_dst, op) if vals.shape[1] else \
        torch.full((vals.shape[0], n_dst), _identity(op, vals.dtype), dtype=vals.dtype)
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

_FLOATS = ("float", "half")


def _check_types(op: Operation, in_type, out_type, name):
    if op in (Operation.LOGICAL_AND, Operation.LOGICAL_OR):
        if in_type != poplar.BOOL or out_type != poplar.BOOL:
            raise poplar.graph_connection_error(
                f"{name}: {op} reduces bool tensors to bool, got {in_type} -> {out_type}; cast the input to BOOL first")
        return
    if in_type == poplar.BOOL:
        raise poplar.graph_connection_error(f"{name}: {op} does not take bool input; use LOGICAL_AND or LOGICAL_OR")
    if op in (Operation.MAX, Operation.MIN) and in_type != out_type:
        raise poplar.graph_connection_error(
            f"{name}: {op} needs the output type to equal the input type ({in_type}), got {out_type}")
    if op == Operation.LOG_ADD and not (in_type.is_float and out_type.is_float):
        raise poplar.graph_connection_error(f"{name}: LOG_ADD needs float or half tensors, got {in_type} -> {out_type}")
    if in_type.is_float != out_type.is_float:
        raise poplar.graph_connection_error(
            f"{name}: cannot reduce {in_type} into {out_type}; supported are float<->half and integer->same type")


def _parse_options(options, in_type, op, name):
    opts = dict(options or {})
    known = {"accumType.interTile", "accumType.inVertex"}
    bad = [k for k in opts if k not in known]
    if bad:
        raise poplar.invalid_option(f"{name}: unknown option(s) {bad}; reduce takes {sorted(known)}")
    wide = in_type == poplar.HALF and op in (Operation.ADD, Operation.SQUARE_ADD, Operation.LOG_ADD)
    default = poplar.FLOAT if wide else in_type
    try:
        inter = poplar.types.as_type(opts["accumType.interTile"]) if "accumType.interTile" in opts else default
        invertex = poplar.types.as_type(opts["accumType.inVertex"]) if "accumType.inVertex" in opts else default
    except Exception:
        raise poplar.invalid_option(f"{name}: accumType options take 'float' or 'half'") from None
    if in_type.is_float and (inter not in (poplar.FLOAT, poplar.HALF) or invertex not in (poplar.FLOAT, poplar.HALF)):
        raise poplar.invalid_option(f"{name}: accumType options take 'float' or 'half'")
    if not in_type.is_float:
        inter = invertex = in_type
    return inter, invertex


def _check_dims(in_, dims, name):
    try:
        dims = [int(d) for d in dims]
    except TypeError:
        raise poplar.index_error(f"{name}: dims must be a list of dimension indices, got {dims!r}") from None
    r = in_.rank()
    for d in dims:
        if not 0 <= d < r:
            raise poplar.index_error(f"{name}: dimension {d} is out of range for a tensor of rank {r} (shape {in_.shape()})")
    if len(set(dims)) != len(dims):
        raise poplar.index_error(f"{name}: dims {dims} repeat a dimension; list each reduced dimension once")
    return sorted(dims)


@dataclass
class _Plan:
    out: poplar.Tensor
    stages: list          # VertexGroups, in order


def _plan(graph, in_, dims, params, out_type, out, name, options) -> _Plan:
    """Validate and build the vertex groups of one reduction (no compute sets yet)."""
    if not isinstance(params, ReduceParams):
        params = ReduceParams(params)
    op = params.op
    if not isinstance(in_, poplar.Tensor):
        raise poplar.graph_connection_error(f"{name}: the input must be a Tensor, got {type(in_).__name__}")
    dims = _check_dims(in_, dims, name)
    in_type = in_.elementType()
    keep = [d for d in range(in_.rank()) if d not in dims]
    out_shape = [in_.dim(d) for d in keep]
    if out is not None:
        out_type = out.elementType()
        if list(out.shape()) != out_shape and out.numElements() != int(np.prod(out_shape, dtype=np.int64)):
            raise poplar.graph_connection_error(
                f"{name}: output shape {out.shape()} does not match the reduced shape {out_shape}")
    out_type = poplar.types.as_type(out_type) if out_type is not None else in_type
    _check_types(op, in_type, out_type, name)
    if (params.update or params.scale is not None) and op not in _SCALABLE:
        raise poplar.poplar_error(f"{name}: scale and update are only valid with ADD, SQUARE_ADD and LOG_ADD, not {op}")
    scale_t = None
    if isinstance(params.scale, poplar.Tensor):
        scale_t = params.scale
        if scale_t.numElements() != 1 or not scale_t.elementType().is_float:
            raise poplar.graph_connection_error(
                f"{name}: the scale must be a one-element float or half tensor, got {scale_t.elementType()} "
                f"of shape {scale_t.shape()}")
    inter, invertex = _parse_options(options, in_type, op, name)
    target = graph.getTarget()
    T = graph._top._target.getNumTiles()
    M = int(np.prod(out_shape, dtype=np.int64))
    N = int(np.prod([in_.dim(d) for d in dims], dtype=np.int64))
    view = in_.dimShuffle(keep + dims).reshape([M, N]) if in_.rank() else in_.reshape([1, 1])
    tiles = graph.tile_of_elements(view).astype(np.int64)
    if (tiles < 0).any():
        raise poplar.invalid_tile_mapping(
            f"{name}: {int((tiles < 0).sum())} input elements are not mapped to a tile; map the input first")
    out_mapped = out is not None and bool((graph.tile_of_elements(out) >= 0).all())
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
        otiles = graph.tile_of_elements(out_flat).astype(np.int64)
        used, counts = np.unique(otiles, return_counts=True)
        stages.append(_group(f"popops::Fill<{out_type}>", used, WORKERS * (26 + -(-counts // target.getVectorWidth(out_type))),
                             view, out_flat, np.zeros(0, np.int64), M, op, compute, True, final,
                             reads=[], writes=[(out_flat, otiles)], flops=0.0, scale_t=scale_t, update=params.update))
        return _Plan(out, stages)
    m_idx = np.repeat(np.arange(M, dtype=np.int64), N)
    key = m_idx * T + tiles
    uniq, inverse = np.unique(key, return_inverse=True)
    inverse = inverse.reshape(-1)
    g_m, g_tile = uniq // T, uniq % T
    P = uniq.size
    continuous = dims == list(range(in_.rank() - len(dims), in_.rank()))
    single = P == M and (not out_mapped or np.array_equal(graph.tile_of_elements(out_flat).astype(np.int64), g_tile))
    if single:
        if not out_mapped:
            graph.set_global_tile_mapping(out_flat, g_tile)
        stages.append(_stage(graph, view, tiles, out_flat, inverse, g_tile, M, op, compute, True, final,
                             continuous, in_type, out_type, target, scale_t, params.update, name))
        return _Plan(out, stages)
    # stage 1: partials per (output, tile) on the input's tiles
    part = graph.addVariable(inter, [P], f"{name}/partials0")
    graph.set_global_tile_mapping(part, g_tile)
    stages.append(_stage(graph, view, tiles, part, inverse, g_tile, P, op, compute, True, None,
                         continuous, in_type, inter, target, None, False, name))
    # intermediate stages while the fan-in per output is large
    p_m, p_tile = g_m, g_tile
    later_op = Operation.ADD if op == Operation.SQUARE_ADD else op
    level = 1
    while True:
        fan = np.bincount(p_m, minlength=M)
        if fan.max() <= MAX_FANIN:
            break
        first = np.r_[0, np.cumsum(fan)[:-1]]                     # partials are sorted by output
        rank = np.arange(p_m.size) - first[p_m]
        g = np.maximum(1, np.ceil(np.sqrt(fan)).astype(np.int64))[p_m]
        grp = rank // g
        gkey = p_m * (int(fan.max()) + 1) + grp
        guniq, ginv = np.unique(gkey, return_inverse=True)
        ginv = ginv.reshape(-1)
        n_m = guniq // (int(fan.max()) + 1)
        gfirst = np.full(guniq.size, p_m.size, np.int64)
        np.minimum.at(gfirst, ginv, np.arange(p_m.size))
        gsize = np.bincount(ginv, minlength=guniq.size)
        chosen = gfirst + (n_m % gsize)                           # rotate which member's tile reduces
        n_tile = p_tile[chosen]
        nxt = graph.addVariable(inter, [guniq.size], f"{name}/partials{level}")
        graph.set_global_tile_mapping(nxt, n_tile)
        stages.append(_stage(graph, part, n_tile[ginv], nxt, ginv, n_tile, guniq.size, later_op, None, False, None,
                             False, inter, inter, target, None, False, name))
        part, p_m, p_tile = nxt, n_m, n_tile
        level += 1
    # final stage on the output's tiles. An output without a complete mapping is mapped linearly
    # with at least 4 vectors per tile (PopLibs ReductionStages.cpp intermediateToOutput).
    if not out_mapped:
        from openipu.poplibs.poputil import mapTensorLinearly
        vw = target.getVectorWidth(out_type)
        mapTensorLinearly(graph, out_flat, 4 * vw, vw)
    out_tiles = graph.tile_of_elements(out_flat).astype(np.int64)
    cons = out_tiles[p_m]
    stages.append(_stage(graph, part, cons, out_flat, p_m, out_tiles, M, later_op, None, False, final,
                         False, inter, out_type, target, scale_t, params.update, name))
    return _Plan(out, stages)


def _stage(graph, src, cons_tiles, dst, index, dst_tiles, n_dst, op, compute, first, final, continuous,
           ptype, out_type, target, scale_t, update, name):
    """The vertex group reducing ``src`` (element i read on tile ``cons_tiles[i]``) into ``dst``.

    In the first stage the partial regions are the input's contiguous regions on each tile; in
    later stages each received partial of a tile's outputs is one region (fan-in regions)."""
    T = graph._top._target.getNumTiles()
    E = np.bincount(cons_tiles, minlength=T)
    K = np.bincount(dst_tiles, minlength=T)
    used = np.flatnonzero(E)
    if first:
        runs = _runs_per_tile(cons_tiles, src.flat_addresses(), T)[used]
    else:
        runs = -(-E[used] // np.maximum(K[used], 1))
    upd = bool(update) and final is not None
    cyc = _stage_tile_cycles(E[used], K[used], runs, continuous, ptype, out_type, op, upd, target)
    scaled = final is not None and final[:2] != (None, None)
    vt = ("Scaled" if scaled else "") + ("ContinuousReduce" if continuous else "Reduce")
    op_name = "Reduce" + op.value.title().replace("_", "")
    vname = f"popops::{vt}<popops::{op_name},{ptype},{out_type},{str(upd).lower()}>"
    flops = float(max(0, src.numElements() - n_dst) * _FLOPS[op] + (n_dst if scaled else 0))
    return _group(vname, used, cyc, src, dst, np.ascontiguousarray(index, np.int64), n_dst, op, compute, first, final,
                  reads=[(src.reshape([src.numElements()]), cons_tiles)], writes=[(dst, dst_tiles)], flops=flops,
                  scale_t=scale_t, update=upd)


def _group(vname, used, cycles, src, dst, index, n_dst, op, compute, first, final, reads, writes, flops, scale_t, update):
    reads = list(reads)
    if scale_t is not None and used.size:
        from openipu.poplibs.popops._common import broadcast_view
        reads.append((broadcast_view(scale_t.reshape([1]), [used.size]), used))
    if update and final is not None:
        reads.append((dst, writes[0][1]))
    return VertexGroup(vname, used.astype(np.int64), np.asarray(cycles, np.int64),
                       functools.partial(_stage_kernel, src, dst, index, n_dst, op, compute, first, final),
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
