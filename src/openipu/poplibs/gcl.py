"""``gcl``: Graphcore Communication Library collectives on the simulated IPU.

Mirrors ``gcl/Collectives.hpp`` (GCL, closed source; names and semantics from its users in
PopART / TensorFlow-IPU and from PopLibs' older ``popops/Collectives.hpp``):

- across replicas: :func:`allReduceCrossReplica`, :func:`allReduceInPlaceCrossReplica`,
  :func:`allReduceToDestinationCrossReplica`, :func:`allGatherCrossReplica`,
  :func:`reduceScatterCrossReplica`, each over a :class:`CommGroup` (``ALL``, ``CONSECUTIVE``,
  ``ORTHOGONAL`` groups of ``replicaGroupSize`` replicas);
- across the IPUs of one replica: :func:`allReduceWithinReplica`,
  :func:`reduceScatterWithinReplica` (-> :class:`Chunks`), :func:`allGatherWithinReplica`.

**Function.** The engine keeps all replicas' storage in one ``[replicas, size]`` buffer per type, so
a collective is one torch kernel over the replica dimension. Reductions run in ring order in the
tensor's own type (fp16 sums accumulate in fp16, as the ring's on-tile reductions do).

**Cost** (one ``program.Collective`` step per call, categories of the engine's profile):

- *global exchange*: a ring schedule over the IPUs of the group (GCL's rings, PopLibs
  ``CollectiveMethod``: clockwise / anticlockwise ring, bidirectional ring pair, meet-in-middle
  ring; ``auto`` takes the cheapest). The tensor is cut into ``p`` fragments, split per tile (every
  tile takes part in every step [A]); all-reduce is a reduce-scatter phase then an all-gather
  phase of ``p-1`` steps each, so each IPU sends ``2(p-1)/p x bytes`` (``(p-1)/p`` for all-gather,
  of its output, and reduce-scatter). A step lasts ``max(fragment bytes / link bytes per cycle,
  busiest tile's fragment bytes / exchangeBytesPerCycle) + hop latency``;
- *sync*: one external sync (``Target.getGlobalSyncCycles()``) per ring step;
- *compute*: the on-tile reduction of each received fragment, PopLibs ``BinaryOp1D`` estimator
  shape (``popops.elementwise.binary_op_cycles``), plus a squaring pass (``SQUARE_ADD``) or a
  scaling pass (``MEAN``).

Link bandwidth is the target's ``ipu_link_bytes_per_s`` (per IPU, both directions together [A]);
a one-directional ring uses half of it [A]. A ring whose IPUs span more than one IPU-Link domain
(an IPU-POD64 rack) crosses GW-Links and runs at the GW-Link bandwidth per IPU
(the target's ``gw_link_bytes_per_s``; a system without GW-Links keeps the IPU-Link rate).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from openipu import poplar
from openipu.poplar import calibration as cal
from openipu.poplar import cost as costmod
from openipu.poplar import errors
from openipu.poplar.program import Collective
from openipu.poplar.graph_codec import kernel
from openipu.poplibs import gcl_instances
from openipu.poplibs.popops.elementwise import binary_op_cycles
from openipu.poplibs.poputil import poplibs_error

__all__ = ["CollectiveOperator", "CommGroupType", "CommGroup", "Chunk", "Chunks",
           "allReduceCrossReplica", "allReduceInPlaceCrossReplica", "allReduceToDestinationCrossReplica",
           "allGatherCrossReplica", "reduceScatterCrossReplica",
           "allReduceWithinReplica", "reduceScatterWithinReplica", "allGatherWithinReplica",
           "ring_cost", "RingCost", "OPTIONS"]

# ----------------------------------------------------------------------------------------------
# constants (each with its source)
# ----------------------------------------------------------------------------------------------
#: IPUs joined by IPU-Links: one IPU-POD64 rack ([P] IPU-POD64 datasheet "2D-torus IPU-Link
#: topology"; IPU-POD128 datasheet: two POD64 racks joined by GW-Links).
IPU_LINK_DOMAIN_IPUS = 64
#: Latency of one IPU-Link hop: 15 ns ([P] PopLibs ``poplibs_test/Util.cpp setGlobalSyncLatency``
#: uses 15 ns per hop for the IPU Model's global sync).
IPU_LINK_HOP_LATENCY_S = 15e-9
#: Latency of one GW-Link hop (through the IPU-Gateway and a 100 GbE cable). [A]
GW_LINK_HOP_LATENCY_S = 1e-6
#: Share of an IPU's link bandwidth a one-directional ring can use (the send half). [A]
ONE_WAY_LINK_SHARE = 0.5
#: Cycles per vector of the on-tile reduce (PopLibs BinaryOp1D ``cyclesPerLoop`` for ADD / MUL /
#: MIN / MAX; logical ops assumed the same [A]).
REDUCE_CYCLES_PER_VECTOR = 1

#: Collective options openipu accepts (GCL option names); unknown keys raise ``invalid_option``.
OPTIONS = {"method": "auto", "useSynclessCollectives": "auto", "maxBytesPerTile": "", "syncful.maxBroadcastSize": ""}
METHODS = ("auto", "clockwise_ring", "anticlockwise_ring", "bidirectional_ring_pair", "meet_in_middle_ring")


class CollectiveOperator:
    """``gcl::CollectiveOperator`` (popops::CollectiveOperator plus MEAN)."""

    ADD = "ADD"
    MEAN = "MEAN"
    MUL = "MUL"
    MIN = "MIN"
    MAX = "MAX"
    LOGICAL_AND = "LOGICAL_AND"   # bool operands only
    LOGICAL_OR = "LOGICAL_OR"     # bool operands only
    SQUARE_ADD = "SQUARE_ADD"     # square each element, then ADD
    LOCAL = "LOCAL"               # keep the local value

    ALL = ("ADD", "MEAN", "MUL", "MIN", "MAX", "LOGICAL_AND", "LOGICAL_OR", "SQUARE_ADD", "LOCAL")


class CommGroupType:
    """``gcl::CommGroupType``: ALL replicas; CONSECUTIVE blocks of ``replicaGroupSize``; ORTHOGONAL
    groups of replicas ``numReplicas / replicaGroupSize`` apart."""

    ALL = "ALL"
    CONSECUTIVE = "CONSECUTIVE"
    ORTHOGONAL = "ORTHOGONAL"


@dataclass(frozen=True)
class CommGroup:
    """``gcl::CommGroup(type, replicaGroupSize)``: the replicas a collective spans.

    With 8 replicas and size 2: CONSECUTIVE groups ``{0,1} {2,3} {4,5} {6,7}``, ORTHOGONAL groups
    ``{0,4} {1,5} {2,6} {3,7}``. ``ALL`` ignores the size.
    """

    type: str = CommGroupType.ALL
    replicaGroupSize: int = 0  # noqa: N815 - GCL spelling


@dataclass
class Chunk:
    """``gcl::Chunk``: the part of a within-replica reduce-scatter result on one IPU."""

    tensor: poplar.Tensor
    index: int = 0    # ring index: the IPU that holds the chunk
    offset: int = 0   # offset within the rank (model-parallel index)


@dataclass
class Chunks:
    """``gcl::Chunks``: the chunks of a reduce-scatter and the input they came from."""

    originalInput: poplar.Tensor | None = None  # noqa: N815 - GCL spelling
    chunks: list = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# kernels (module level: executables pickle)
# ----------------------------------------------------------------------------------------------
def _combine(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if op in ("ADD", "MEAN", "SQUARE_ADD"):
        return a + b
    if op == "MUL":
        return a * b
    if op == "MIN":
        return torch.minimum(a, b)
    if op == "MAX":
        return torch.maximum(a, b)
    if op == "LOGICAL_AND":
        return torch.logical_and(a, b)
    if op == "LOGICAL_OR":
        return torch.logical_or(a, b)
    raise ValueError(op)


def _reduce(x: torch.Tensor, op: str, dim: int) -> torch.Tensor:
    """Reduce ``x`` over ``dim`` in ring order, in ``x``'s own type."""
    if op == "SQUARE_ADD":
        x = x * x
    acc = x.select(dim, 0)
    for i in range(1, x.shape[dim]):
        acc = _combine(op, acc, x.select(dim, i))
    if op == "MEAN":
        n = x.shape[dim]
        acc = acc / n if acc.is_floating_point() else torch.div(acc, n, rounding_mode="trunc")
    return acc


def _global(v: torch.Tensor, span, what: str) -> torch.Tensor:
    """``v`` (``[local replicas, ...]``) as the ``[global replicas, ...]`` stack when the graph is
    part of a distributed replicated graph (``span = (offset, local)``), over
    :func:`gcl_instances.gather_replicas`; else ``v``."""
    return v if span is None else gcl_instances.gather_replicas(v, what)


def _reduce_groups(v: torch.Tensor, groups: np.ndarray, op: str, span, what: str) -> torch.Tensor:
    """``[G, *shape]``: the reduction of each replica group (``groups [G, p]``, ring order) of
    ``v`` (``[replicas, *shape]``). In a distributed replicated graph (``span``) ``v`` holds
    this instance's replicas and the fold runs as a chain over the instances
    (:func:`gcl_instances.reduce_groups`), bit-identical to the one-process fold."""
    if span is None:
        return _reduce(v[torch.from_numpy(groups).to(v.device)], op, 1)
    red = gcl_instances.reduce_groups(v, groups, span[0], lambda a, b: _combine(op, a, b),
                                      (lambda x: x * x) if op == "SQUARE_ADD" else None, what)
    if op == "MEAN":
        p = groups.shape[1]
        red = red / p if red.is_floating_point() else torch.div(red, p, rounding_mode="trunc")
    return red


def _mine(x: torch.Tensor, span) -> torch.Tensor:
    """This instance's rows of a ``[global replicas, ...]`` result."""
    return x if span is None else x[span[0]: span[0] + span[1]]


@kernel
def _cross_allreduce_kernel(data, out, groups, group_of, op, span, ctx):
    v = ctx.read(data)
    if op == "LOCAL":
        ctx.write(out, v.clone())
        return
    red = _reduce_groups(v, groups, op, span, "allReduceCrossReplica")   # [G, *shape]
    ctx.write(out, _mine(red[torch.from_numpy(group_of)], span))


@kernel
def _cross_allgather_kernel(data, out, groups, group_of, span, ctx):
    v = _global(ctx.read(data), span, "allGatherCrossReplica")
    x = v[torch.from_numpy(groups)]                       # [G, p, *shape]
    ctx.write(out, _mine(x[torch.from_numpy(group_of)], span))   # [R, p, *shape]


def _scatter_index(layout, p: int) -> np.ndarray:
    """``index[q, o]``: the input element that output element ``o`` takes on the replica at
    position ``q`` of its group (``n``: zero padding). Built when the kernel runs (from the
    per-run layout), dropped after."""
    rb, re, seg_start, seg_len, m, out_start, n = layout
    order = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(rb, re)]) if rb.size else \
        np.zeros(0, np.int64)
    out_n = int(m.sum())
    seg_of_o = np.repeat(np.arange(seg_len.size), m)
    e_of_o = np.arange(out_n) - np.repeat(out_start, m)
    local = np.arange(p)[:, None] * m[seg_of_o][None, :] + e_of_o[None, :]   # position within the segment
    valid = local < seg_len[seg_of_o][None, :]
    return np.where(valid, order[np.minimum(seg_start[seg_of_o][None, :] + local, n - 1)], n).astype(np.int64)


@kernel
def _cross_reducescatter_kernel(data, out, groups, group_of, pos_of, layout, op, span, ctx):
    v = ctx.read(data)
    if op == "LOCAL":
        red = _global(v, span, "reduceScatterCrossReplica")
        red = red.reshape(red.shape[0], -1)
    else:
        red = _reduce_groups(v.reshape(v.shape[0], -1), groups, op, span,
                             "reduceScatterCrossReplica")[torch.from_numpy(group_of)]   # [R, n] (R global)
    R = red.shape[0]
    padded = torch.cat([red, torch.zeros(R, 1, dtype=red.dtype)], 1)
    index = _scatter_index(layout, groups.shape[1])
    idx = torch.from_numpy(index)[torch.from_numpy(pos_of)]                                # [R, out_n]
    ctx.write(out, _mine(torch.gather(padded, 1, idx), span))


@kernel
def _within_allreduce_kernel(data, out, op, ctx):
    v = ctx.read(data)                                    # [R, k, *shape]
    if op == "LOCAL":
        ctx.write(out, v.clone())
        return
    red = _reduce(v, op, 1)
    ctx.write(out, red.unsqueeze(1).expand_as(v).contiguous())


@kernel
def _within_reducescatter_kernel(data, outs, bounds, op, ctx):
    v = ctx.read(data)
    flat = v.reshape(v.shape[0], v.shape[1], -1)          # [R, k, n]
    red = None if op == "LOCAL" else _reduce(flat, op, 1)
    for i, (t, (a, b)) in enumerate(zip(outs, bounds)):
        if b > a:
            ctx.write(t, (flat[:, i] if red is None else red)[:, a:b])


@kernel
def _within_allgather_kernel(chunks, out, ctx):
    parts = [ctx.read(c).reshape(ctx.replicas, -1) for c in chunks]
    row = torch.cat(parts, 1)
    k = out.dim(0)
    ctx.write(out, row.unsqueeze(1).expand(ctx.replicas, k, row.shape[1]).contiguous())


# ----------------------------------------------------------------------------------------------
# cost
# ----------------------------------------------------------------------------------------------
@dataclass
class RingCost:
    """The ring schedule chosen for one collective and its predicted cycles (per IPU arrays over
    the IPUs of the graph's target)."""

    method: str
    group_size: int
    steps: int                    # ring steps over all phases
    link_cycles: np.ndarray       # cycles of link transfer, all steps
    tile_cycles: np.ndarray       # cycles the busiest tile needs to send its fragments, all steps
    latency_cycles: float         # hop latency, all steps
    link_bytes: np.ndarray        # bytes each IPU sends over links
    cost: costmod.StepCost
    crosses_gw_links: bool = False


def _link(spec, ring_ipus: np.ndarray) -> tuple[float, float, bool]:
    """(bytes/s per IPU, hop latency in s, crosses GW-Links) for a ring through ``ring_ipus``."""
    domains = np.unique(np.asarray(ring_ipus) // IPU_LINK_DOMAIN_IPUS)
    if domains.size > 1:
        gw = spec.gw_link_bytes_per_s or spec.ipu_link_bytes_per_s   # no GW-Links: the IPU-Link domain is the system
        return float(min(gw, spec.ipu_link_bytes_per_s)), GW_LINK_HOP_LATENCY_S, True
    return float(spec.ipu_link_bytes_per_s), IPU_LINK_HOP_LATENCY_S, False


def _schedule(method: str, p: int):
    """(steps per phase, fragments received per tile per step, link share per direction)."""
    if method == "meet_in_middle_ring":
        return p // 2, 2.0, ONE_WAY_LINK_SHARE
    if method == "bidirectional_ring_pair":
        return p - 1, 1.0, 2 * ONE_WAY_LINK_SHARE
    return p - 1, 1.0, ONE_WAY_LINK_SHARE


def ring_cost(spec, counts: np.ndarray, type_, p: int, kind: str, op: str = "ADD", method: str = "auto",
              ring_ipus=None, target=None) -> RingCost:
    """Predicted cost of one ring collective (see the module docstring for the model).

    Args:
        spec: the engine's :class:`openipu.ipu.Target` (IPUs of one replica, or of the graph).
        counts: int array over ``spec``'s tiles: elements of the collective's input on each tile.
        type_: element type. p: ring size (replicas in the group, or IPUs of the replica).
        kind: ``"allreduce"``, ``"reducescatter"`` or ``"allgather"``.
        op: :class:`CollectiveOperator` (adds squaring / scaling passes and reduce compute).
        method: a :data:`METHODS` entry; ``auto`` takes the cheapest.
        ring_ipus: global IPU ids along the ring (to detect GW-Link crossings); default one domain.
        target: ``poplar.Target`` for the reduce-vertex estimates (default built from ``spec``).

    Returns:
        :class:`RingCost` whose ``cost`` is a StepCost (cycles) with global exchange, sync and compute.
    """
    if method == "auto":
        cands = [ring_cost(spec, counts, type_, p, kind, op, m, ring_ipus, target)
                 for m in ("bidirectional_ring_pair", "meet_in_middle_ring")]
        return min(cands, key=lambda c: float(c.cost.total().max()))
    target = target or poplar.Target(spec)
    S, tpi = spec.num_ipus, spec.tiles_per_ipu
    size = type_.size
    counts = np.asarray(counts, np.int64)
    cost = costmod.StepCost(S)
    zero = np.zeros(S)
    if p <= 1 or op == "LOCAL" or not counts.any():
        return RingCost(method, p, 0, zero, zero.copy(), 0.0, zero.copy(), cost)
    bw, hop_s, gw = _link(spec, np.arange(p) if ring_ipus is None else ring_ipus)
    steps_phase, frag_mult, share = _schedule(method, p)
    phases = 2 if kind == "allreduce" else 1
    steps = phases * steps_phase
    # elements of one fragment on each tile: all-gather moves whole inputs, the others 1/p of them
    frag_t = counts if kind == "allgather" else -(-counts // p)
    recv_t = frag_t * frag_mult                                   # elements a tile receives per step
    per_ipu = lambda a, how: a.reshape(S, tpi).max(1) if how == "max" else a.reshape(S, tpi).sum(1)  # noqa: E731
    frag_bytes = per_ipu(frag_t * float(size), "sum")
    link_bpc = bw * share / spec.clock_hz                         # bytes per cycle per direction used
    # one fragment per step in each direction used (the pair sends half a fragment each way at
    # twice the share): the same time per step for every method, differing in steps and share
    link_step = frag_bytes / link_bpc
    tile_step = per_ipu(recv_t * float(size), "max") / spec.exchange_bytes_per_cycle
    lat = hop_s * spec.clock_hz
    active = frag_bytes > 0
    step_t = np.where(active, np.maximum(link_step, tile_step) + lat, 0.0)
    cost.duration["global_exchange"] = steps * step_t
    cost.tile_sum["global_exchange"] = cost.duration["global_exchange"] * tpi
    cost.duration["sync"] = np.where(active, float(steps * spec.global_sync_cycles), 0.0)
    cost.tile_sum["sync"] = cost.duration["sync"] * tpi
    cost.syncs = steps
    # on-tile reduction of every received fragment, plus squaring / scaling passes
    used = counts > 0
    passes = []                      # (elements per tile array, number of passes, vertex name)
    tname = str(type_)
    if kind != "allgather":
        vop = {"MUL": "MULTIPLY", "MIN": "MINIMUM", "MAX": "MAXIMUM", "LOGICAL_AND": "LOGICAL_AND",
               "LOGICAL_OR": "LOGICAL_OR"}.get(op, "ADD")
        passes.append((recv_t, steps_phase, f"popops::BinaryOp1DInPlace<popops::expr::BinaryOpType::{vop},{tname}>"))
        if op == "SQUARE_ADD":
            passes.append((counts, 1, f"popops::UnaryOp1DInPlace<popops::expr::UnaryOpType::SQUARE,{tname}>"))
        if op == "MEAN":
            passes.append((-(-counts // p), 1, f"popops::ScaledAdd1D<{tname}>"))
    flops = 0.0
    for elems, n, vname in passes:
        cyc = np.where(used, binary_op_cycles(np.asarray(elems, np.int64), type_, REDUCE_CYCLES_PER_VECTOR, target)
                       + cal.COMPUTE_SET_LAUNCH_CYCLES, 0.0)
        cost.duration["compute"] = cost.duration["compute"] + n * per_ipu(cyc, "max")
        cost.tile_sum["compute"] = cost.tile_sum["compute"] + n * per_ipu(cyc, "sum")
        cost.tile_sum["compute_excl"] = cost.tile_sum["compute_excl"] + n * per_ipu(cyc, "sum")
        cost.by_vertex_type[vname] = (int(used.sum()) * n, float(n * cyc.sum()))
        flops += float(n * np.asarray(elems)[used].sum()) if type_.is_float else 0.0
    cost.flops = flops
    link_bytes = steps * frag_bytes * (frag_mult if method == "meet_in_middle_ring" else 1.0)
    return RingCost(method, p, steps, steps * link_step * active, steps * tile_step * active,
                    steps * lat, link_bytes, cost, gw)


# ----------------------------------------------------------------------------------------------
# argument checks
# ----------------------------------------------------------------------------------------------
def _parse_options(options) -> dict:
    opts = dict(OPTIONS)
    for k, v in dict(options or {}).items():
        if k not in OPTIONS:
            raise errors.invalid_option(f"Unrecognised GCL option '{k}'; known options: {', '.join(sorted(OPTIONS))}")
        opts[k] = str(v).lower() if k == "method" else str(v)
    if opts["method"] not in METHODS:
        raise errors.invalid_option(f"Invalid value '{opts['method']}' for GCL option 'method': "
                                    f"use one of {', '.join(METHODS)}")
    return opts


def _check_op(op, t, what: str) -> str:
    op = str(getattr(op, "name", op)).upper()
    if op not in CollectiveOperator.ALL:
        raise poplibs_error(f"{what}: unknown collective operator '{op}'; use one of {', '.join(CollectiveOperator.ALL)}")
    is_bool = t.elementType() == poplar.BOOL
    if op in ("LOGICAL_AND", "LOGICAL_OR") and not is_bool:
        raise poplibs_error(f"{what}: {op} needs bool operands, got {t.elementType()}")
    if is_bool and op not in ("LOGICAL_AND", "LOGICAL_OR", "LOCAL"):
        raise poplibs_error(f"{what}: bool operands support LOGICAL_AND, LOGICAL_OR and LOCAL only, got {op}")
    return op


def _check_mapped(graph, t, what: str) -> np.ndarray:
    """Elements of ``t`` on each global tile (int64 ``[num_tiles]``, from its regions); raises
    ``invalid_tile_mapping`` if some element is unmapped."""
    if not graph.is_mapped(t):
        b, e, tl = graph.tile_runs_of(t)
        raise errors.invalid_tile_mapping(
            f"{what}: tensor {t.shortString()} is not completely mapped ({int((e - b)[tl < 0].sum())} elements "
            "unmapped); map it before adding the collective")
    return graph.tile_element_counts(t).astype(np.int64)


def _ipu_runs(graph, t):
    """``(begin, end, global tile)`` runs of ``t``'s flattened elements."""
    b, e, tl = graph.tile_runs_of(t)
    return b.astype(np.int64), e.astype(np.int64), tl.astype(np.int64)


def _split_args(group, debug_name, options):
    """GCL overloads: ``(..., prog, group, debugName, options)`` or ``(..., prog, debugName, options)``;
    a ``(type, size)`` tuple stands for a CommGroup."""
    if group is None or isinstance(group, CommGroup):
        return group, debug_name, options
    if isinstance(group, tuple):
        return CommGroup(*group), debug_name, options
    if isinstance(group, dict):
        return None, "", group
    return None, str(group), debug_name if isinstance(debug_name, dict) else options


def _span(graph):
    """``(offset, local replicas)`` of this instance when ``graph`` is built inside a
    :func:`gcl_instances.scope` (a distributed replicated graph), else None."""
    sc = gcl_instances.current_scope()
    if sc is None or sc.local_replicas != graph.getReplicationFactor():
        return None
    return (sc.offset, sc.local_replicas)


def _groups(graph, group: CommGroup | None, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(groups [G, p] of replica ids, group of each replica, position of each replica in its group),
    over the global replicas of a distributed replicated graph (:func:`_span`)."""
    span = _span(graph)
    R = graph.getReplicationFactor() if span is None else gcl_instances.current_scope().global_replicas
    gtype = CommGroupType.ALL if group is None else str(group.type).upper()
    size = 0 if group is None else int(group.replicaGroupSize)
    if gtype == CommGroupType.ALL:
        groups = np.arange(R).reshape(1, R)
    elif gtype in (CommGroupType.CONSECUTIVE, CommGroupType.ORTHOGONAL):
        if size < 1 or R % size:
            raise poplibs_error(f"{what}: a {gtype} CommGroup of size {size} does not divide the {R} replicas; "
                                "use a replicaGroupSize that divides the replication factor")
        groups = (np.arange(R).reshape(R // size, size) if gtype == CommGroupType.CONSECUTIVE
                  else np.arange(R).reshape(size, R // size).T.copy())
    else:
        raise poplibs_error(f"{what}: unknown CommGroupType '{group.type}'; use ALL, CONSECUTIVE or ORTHOGONAL")
    group_of = np.empty(R, np.int64)
    pos_of = np.empty(R, np.int64)
    group_of[groups.reshape(-1)] = np.repeat(np.arange(groups.shape[0]), groups.shape[1])
    pos_of[groups.reshape(-1)] = np.tile(np.arange(groups.shape[1]), groups.shape[0])
    return groups.astype(np.int64), group_of, pos_of


def _spec(graph):
    return graph._top._target.spec


def _ipus_per_replica(graph) -> int:
    return max(1, graph._state.target.getNumIPUs() // graph.getReplicationFactor())


def _cross_cost(graph, data, counts, p, kind, op, opts, groups):
    spec = _spec(graph)
    k = _ipus_per_replica(graph)
    ring_ipus = groups[0] * k
    return ring_cost(spec, counts, data.elementType(), p, kind, op, opts["method"], ring_ipus, graph._top.getTarget())


def _add(prog, kernel, reads, writes, rc: RingCost, tiles_recv: np.ndarray, name: str):
    prog.add(Collective(kernel, reads, writes, rc.cost, tiles_recv, name))


def _recv_bytes(spec, counts, type_, p, kind):
    """Bytes each tile receives per ring step (``counts``: elements of the input per tile)."""
    frag = counts if kind == "allgather" else -(-counts // max(p, 1))
    return frag * float(type_.size) if p > 1 else np.zeros(spec.num_tiles)


# ----------------------------------------------------------------------------------------------
# cross-replica collectives
# ----------------------------------------------------------------------------------------------
def _allreduce_args(graph, data, op, group, options, what):
    """Check everything before the graph changes (a failed call leaves the graph usable)."""
    opts = _parse_options(options)
    op = _check_op(op, data, what)
    tiles = _check_mapped(graph, data, what)
    groups, group_of, _ = _groups(graph, group, what)
    return opts, op, tiles, groups, group_of


def _allreduce_into(graph, data, out, prog, name, what, args):
    opts, op, tiles, groups, group_of = args
    p = groups.shape[1]
    rc = _cross_cost(graph, data, tiles, p, "allreduce", op, opts, groups)
    if out is not data and (p <= 1 or op == "LOCAL"):
        rc.cost.add(costmod.on_tile_copy_cost(_spec(graph), tiles * float(data.elementType().size)))
    kernel = functools.partial(_cross_allreduce_kernel, data, out, groups, group_of, op, _span(graph))
    _add(prog, kernel, [data], [out], rc, _recv_bytes(_spec(graph), tiles, data.elementType(), p, "allreduce"),
         name or what)


def allReduceCrossReplica(graph, data, op, prog, group=None, debug_name: str = "", options=None):  # noqa: N802
    """``gcl::allReduceCrossReplica(graph, data, op, prog, [group,] debugContext, options)``.

    Reduces ``data`` (any shape and type; bool only with LOGICAL_AND / LOGICAL_OR / LOCAL) over the
    replicas of each group and returns a new tensor of the same shape and type, mapped like
    ``data``, holding the group's result on every replica of the group. Cost: see module docstring
    (``2(p-1)/p x bytes`` per IPU over the links).

    Raises: :class:`poplibs_error` (unknown operator, operator / type mismatch, a CommGroup size
    that does not divide the replication factor), ``invalid_tile_mapping`` (``data`` not mapped),
    ``invalid_option`` (unknown option or method).
    """
    group, debug_name, options = _split_args(group, debug_name, options)
    what = "allReduceCrossReplica"
    args = _allreduce_args(graph, data, op, group, options, what)
    out = graph.clone(data, name=(debug_name or "allReduce") + "/out")
    _allreduce_into(graph, data, out, prog, debug_name, what, args)
    return out


def allReduceInPlaceCrossReplica(graph, data, op, prog, group=None, debug_name: str = "", options=None):  # noqa: N802
    """``gcl::allReduceInPlaceCrossReplica``: as :func:`allReduceCrossReplica`, writing the result
    back into ``data``. Returns None."""
    group, debug_name, options = _split_args(group, debug_name, options)
    what = "allReduceInPlaceCrossReplica"
    _allreduce_into(graph, data, data, prog, debug_name, what, _allreduce_args(graph, data, op, group, options, what))


def allReduceToDestinationCrossReplica(graph, data, destination, op, prog, group=None,  # noqa: N802
                                       debug_name: str = "", options=None):
    """``gcl::allReduceToDestinationCrossReplica``: as :func:`allReduceCrossReplica`, writing the
    result into ``destination`` (same shape and type as ``data``; raises ``graph_connection_error``
    otherwise). Returns None."""
    group, debug_name, options = _split_args(group, debug_name, options)
    if destination.shape() != data.shape() or destination.elementType() != data.elementType():
        raise errors.graph_connection_error(
            f"allReduceToDestinationCrossReplica: destination {destination.shortString()} must have the shape and "
            f"type of the data {data.shortString()}")
    what = "allReduceToDestinationCrossReplica"
    _check_mapped(graph, destination, what)
    _allreduce_into(graph, data, destination, prog, debug_name, what,
                    _allreduce_args(graph, data, op, group, options, what))


def allGatherCrossReplica(graph, data, prog, group=None, debug_name: str = "", options=None):  # noqa: N802
    """``gcl::allGatherCrossReplica(graph, data, prog, [group,] debugContext, options)``.

    Returns a tensor of shape ``[p, *data.shape]`` (``p`` replicas in the group) whose row ``i`` is
    ``data`` of the group's ``i``-th replica, on every replica of the group; each row is mapped
    like ``data``. Cost: ``(p-1)/p x output bytes`` per IPU over the links, no reduce compute.
    Raises as :func:`allReduceCrossReplica`.
    """
    group, debug_name, options = _split_args(group, debug_name, options)
    what = "allGatherCrossReplica"
    opts = _parse_options(options)
    tiles = _check_mapped(graph, data, what)
    groups, group_of, _ = _groups(graph, group, what)
    p = groups.shape[1]
    out = graph.addVariable(data.elementType(), [p] + data.shape(), (debug_name or "allGather") + "/out")
    for i in range(p):                             # each row mapped like data
        graph.copy_tile_mapping(out[i], data)
    rc = _cross_cost(graph, data, tiles, p, "allgather", "ADD", opts, groups)
    kernel = functools.partial(_cross_allgather_kernel, data, out, groups, group_of, _span(graph))
    _add(prog, kernel, [data], [out], rc, _recv_bytes(_spec(graph), tiles, data.elementType(), p, "allgather"),
         debug_name or what)
    return out


def reduceScatterCrossReplica(graph, data, op, prog, group=None, debug_name: str = "", options=None):  # noqa: N802
    """``gcl::reduceScatterCrossReplica(graph, data, op, prog, [group,] debugContext, options)``.

    ``data`` is rank 1. Elements are grouped per IPU of the replica (in index order); each IPU's
    ``n_j`` elements are reduced over the group and cut into ``p`` pieces of ``ceil(n_j / p)``
    (zero-padded); the replica at position ``q`` of its group gets piece ``q`` of every IPU, so the
    result has ``sum_j ceil(n_j / p)`` elements, grouped per IPU. Piece elements are mapped on the
    tiles of every ``p``-th input element of their IPU. Cost: ``(p-1)/p x bytes`` per IPU.
    Raises as :func:`allReduceCrossReplica`, plus :class:`poplibs_error` if ``data`` is not rank 1.
    """
    group, debug_name, options = _split_args(group, debug_name, options)
    what = "reduceScatterCrossReplica"
    opts = _parse_options(options)
    op = _check_op(op, data, what)
    if data.rank() != 1:
        raise poplibs_error(f"{what}: data must be rank 1, got shape {data.shape()}; flatten it first")
    tiles = _check_mapped(graph, data, what)
    groups, group_of, pos_of = _groups(graph, group, what)
    p = groups.shape[1]
    spec = _spec(graph)
    n = data.numElements()
    # the data's runs grouped by IPU (stable): the elements of each IPU in index order
    rb, re, rt = _ipu_runs(graph, data)
    ipu = rt // spec.tiles_per_ipu
    order = np.argsort(ipu, kind="stable")
    rb, re, ipu = rb[order], re[order], ipu[order]
    rlen = re - rb
    seg_ipus, seg_first = np.unique(ipu, return_index=True)
    seg_len = np.add.reduceat(rlen, seg_first) if rlen.size else np.zeros(0, np.int64)
    seg_start = np.r_[0, np.cumsum(seg_len)[:-1]].astype(np.int64)
    m = -(-seg_len // p)                                         # piece length per IPU segment
    out_n = int(m.sum())
    # the data in that order (a view: one slice per run) and where each segment's pieces start
    perm = poplar.concat([data.slice(int(a), int(b), 0) for a, b in zip(rb, re)], 0) if rb.size > 1 else data
    out = graph.addVariable(data.elementType(), [out_n], (debug_name or "reduceScatter") + "/out")
    # output element e of a segment sits on the tile of the segment's element e * p
    out_start = np.r_[0, np.cumsum(m)[:-1]].astype(np.int64)
    for j in range(seg_len.size):
        if m[j]:
            src = perm.slice(int(seg_start[j]), int(seg_start[j] + (m[j] - 1) * p + 1), 0).subSample(p, 0)
            graph.copy_tile_mapping(out.slice(int(out_start[j]), int(out_start[j] + m[j]), 0), src)
    layout = (rb, re, seg_start, seg_len, m, out_start, n)
    rc = _cross_cost(graph, data, tiles, p, "reducescatter", op, opts, groups)
    kernel = functools.partial(_cross_reducescatter_kernel, data, out, groups, group_of, pos_of, layout, op,
                               _span(graph))
    _add(prog, kernel, [data], [out], rc, _recv_bytes(spec, tiles, data.elementType(), p, "reducescatter"),
         debug_name or what)
    return out


# ----------------------------------------------------------------------------------------------
# within-replica collectives (across the IPUs of one replica)
# ----------------------------------------------------------------------------------------------
def _check_rows_on_ipus(graph, t, what: str) -> np.ndarray:
    k = graph.getTarget().getNumIPUs()
    if t.rank() < 1 or t.dim(0) != k:
        raise poplibs_error(f"{what}: the outermost dimension must be the number of IPUs ({k}) of the replica, "
                            f"got shape {t.shape()}")
    tiles = _check_mapped(graph, t, what)
    b, e, tl = _ipu_runs(graph, t)
    row_len = max(t.numElements() // max(k, 1), 1)
    ipu_local = graph._local_tiles(tl) // graph.getTarget().getTilesPerIPU()
    if ((ipu_local != b // row_len) | (ipu_local != (e - 1) // row_len)).any():
        raise poplibs_error(f"{what}: index i of the outermost dimension must be mapped to IPU i; map row i of "
                            f"{t.shortString()} to tiles of IPU i")
    return tiles


def _within_cost(graph, counts, type_, p, kind, op, opts):
    spec = _spec(graph)
    k = _ipus_per_replica(graph)
    return ring_cost(spec, counts, type_, p, kind, op, opts["method"], np.arange(k), graph._top.getTarget())


def allReduceWithinReplica(graph, data, op, prog, debug_name: str = "", options=None):  # noqa: N802
    """``gcl::allReduceWithinReplica(graph, data, op, prog, debugContext, options)``.

    ``data`` has shape ``[numIPUs, ...]`` with row ``i`` mapped to IPU ``i`` of ``graph``'s target.
    Returns a tensor of the same shape, mapped like ``data``, whose every row is the reduction of
    the rows. Cost: a ring over the replica's IPUs (IPU-Links), ``2(p-1)/p x row bytes`` per IPU.

    Raises :class:`poplibs_error` (wrong outer dimension or mapping, bad operator),
    ``invalid_tile_mapping``, ``invalid_option``.
    """
    what = "allReduceWithinReplica"
    opts = _parse_options(options)
    op = _check_op(op, data, what)
    tiles = _check_rows_on_ipus(graph, data, what)
    out = graph.clone(data, name=(debug_name or "allReduceWithinReplica") + "/out")
    p = data.dim(0)
    rc = _within_cost(graph, tiles, data.elementType(), p, "allreduce", op, opts)
    kernel = functools.partial(_within_allreduce_kernel, data, out, op)
    _add(prog, kernel, [data], [out], rc, _recv_bytes(_spec(graph), tiles, data.elementType(), p, "allreduce"),
         debug_name or what)
    return out


def reduceScatterWithinReplica(graph, data, op, prog, debug_name: str = "", options=None) -> Chunks:  # noqa: N802
    """``gcl::reduceScatterWithinReplica(graph, data, op, prog, debugContext, options)`` -> :class:`Chunks`.

    ``data`` is ``[numIPUs, ...]`` with row ``i`` on IPU ``i``. The rows are reduced and the
    flattened result cut into ``numIPUs`` chunks of ``ceil(n / numIPUs)`` elements (the last ones
    may be shorter or empty); chunk ``i`` (``Chunk.index == i``) lives on IPU ``i``, on the tiles
    holding the same elements of row ``i``. Cost: ``(p-1)/p x row bytes`` per IPU.
    Raises as :func:`allReduceWithinReplica`.
    """
    what = "reduceScatterWithinReplica"
    opts = _parse_options(options)
    op = _check_op(op, data, what)
    tiles = _check_rows_on_ipus(graph, data, what)
    k = data.dim(0)
    n = data.numElements() // k
    m = -(-n // k)
    bounds = [(min(i * m, n), min((i + 1) * m, n)) for i in range(k)]
    rows = data.reshape([k, n])
    chunks = Chunks(data, [])
    outs = []
    for i, (a, b) in enumerate(bounds):          # one chunk per IPU of the replica
        t = graph.addVariable(data.elementType(), [b - a], f"{debug_name or what}/chunk{i}")
        graph.copy_tile_mapping(t, rows[i].slice(a, b, 0))
        outs.append(t)
        chunks.chunks.append(Chunk(t, i, 0))
    rc = _within_cost(graph, tiles, data.elementType(), k, "reducescatter", op, opts)
    kernel = functools.partial(_within_reducescatter_kernel, data, outs, bounds, op)
    _add(prog, kernel, [data], outs, rc, _recv_bytes(_spec(graph), tiles, data.elementType(), k, "reducescatter"),
         debug_name or what)
    return chunks


def allGatherWithinReplica(graph, toGather: Chunks, prog, debug_name: str = "", options=None):  # noqa: N802,N803
    """``gcl::allGatherWithinReplica(graph, chunks, prog, debugContext, options)``.

    ``toGather.chunks[i]`` lives on IPU ``chunks[i].index``. Returns ``[numIPUs, ...]`` whose row
    ``i`` (on IPU ``i``) is the concatenation of the chunks in ``index`` order, shaped like
    ``originalInput`` when its size matches (else ``[numIPUs, total]``); row ``i`` puts each chunk's
    elements on the same tile index of IPU ``i`` that the chunk uses on its own IPU. Cost:
    ``(p-1)/p x row bytes`` per IPU. Raises :class:`poplibs_error` if the chunks are not one per IPU.
    """
    what = "allGatherWithinReplica"
    opts = _parse_options(options)
    k = graph.getTarget().getNumIPUs()
    chunks = sorted(toGather.chunks, key=lambda c: c.index)
    if [c.index for c in chunks] != list(range(k)):
        raise poplibs_error(f"{what}: expected one chunk per IPU with indices 0..{k - 1}, got "
                            f"{[c.index for c in toGather.chunks]}")
    types = {c.tensor.elementType() for c in chunks}
    if len(types) != 1:
        raise poplibs_error(f"{what}: chunks have different element types {sorted(map(str, types))}")
    type_ = types.pop()
    counts = sum(_check_mapped(graph, c.tensor, what) for c in chunks)
    total = sum(c.tensor.numElements() for c in chunks)
    orig = toGather.originalInput
    shape = [k] + orig.shape()[1:] if orig is not None and orig.numElements() == k * total else [k, total]
    out = graph.addVariable(type_, shape, (debug_name or what) + "/out")
    tpi_local = graph.getTarget().getTilesPerIPU()
    # row i: each chunk's runs on the same tile index of IPU i
    off = 0
    flat = out.reshape([k, total])
    for c in chunks:
        b, e, tl = _ipu_runs(graph, c.tensor)
        row_local = graph._local_tiles(tl) % tpi_local
        for i in range(k):
            graph.set_tile_runs(flat[i], b + off, e + off, graph._global_tiles(i * tpi_local + row_local))
        off += c.tensor.numElements()
    all_tiles = counts
    rc = _within_cost(graph, all_tiles, type_, k, "allgather", "ADD", opts)
    kernel = functools.partial(_within_allgather_kernel, [c.tensor for c in chunks], out)
    _add(prog, kernel, [c.tensor for c in chunks], [out], rc,
         _recv_bytes(_spec(graph), all_tiles, type_, k, "allgather"), debug_name or what)
    return out
