"""``poplin``: matrix multiplication with a tile planner (PopLibs ``include/poplin/MatMul.hpp``).

``C[m, n] = A[m, k] @ B[k, n]`` is split over tiles in a (m, n, k) grid. For each candidate
split the planner estimates:

- partial compute per tile: ``ceil(m/pm) * ceil(n/pn) * ceil(k/pk)`` MACs at the target's AMP
  rate for the input type (``Target.getAmpMacsPerCycle``: ipu2 fp16 64, fp32 16) plus a per-vertex
  overhead;
- exchange of the A and B blocks each tile needs (4 bytes/cycle/tile);
- when ``pk > 1``, the exchange and reduction of ``pk`` partials of each output element;
- temporary bytes per tile (A block + B block + partials), which must fit
  ``availableMemoryProportion`` (default 0.6) of the tile's memory.

It keeps the fastest plan that fits; if none fits it doubles the budget up to twice the tile's
memory, then falls back to the plan with the least temporary memory (as poplin does, with a
warning); the engine then reports the graph as out of memory. Plans are
cached per (shapes, types, options, target). Issue 3 refines this into poplin's full planner
(AMP vertex formulas, serial splits, convolutions).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import VertexGroup

#: Fixed tile cycles of a partials vertex (worklist set-up, weight loads). [A] of the order of
#: PopLibs' convNx1Overhead() = 109 (poplin/PerformanceEstimation.hpp).
AMP_VERTEX_OVERHEAD_CYCLES = 109
#: Fixed tile cycles of a reduce vertex. [A] PopLibs reduce entry/exit + state load (7 + 26).
REDUCE_VERTEX_OVERHEAD_CYCLES = 33


def addCodelets(graph) -> None:  # noqa: N802
    """Register poplin's codelets (built in; kept for API compatibility)."""


@dataclass(frozen=True)
class MatMulPlan:
    """A split of ``C[m,n] = A[m,k] B[k,n]`` over ``pm * pn * pk`` tiles, with its estimates
    (tile cycles, predicted) and temporary bytes per tile."""

    pm: int
    pn: int
    pk: int
    cycles: float
    temp_bytes: int

    @property
    def tiles(self) -> int:
        return self.pm * self.pn * self.pk


_PLAN_CACHE: dict = {}
_log = logging.getLogger("openipu.poplibs.poplin")


def _candidates(dim: int, limit: int):
    c = {1, dim}
    p = 1
    while p < dim and p <= limit:
        c.add(p)
        c.add(-(-dim // -(-dim // p)))
        p *= 2
    return sorted(x for x in c if 1 <= x <= min(dim, limit))


def plan_matmul(m: int, k: int, n: int, in_type, partials_type, target, available_memory_proportion: float = 0.6) -> MatMulPlan:
    """Choose the (pm, pn, pk) split with the fewest estimated cycles whose temporaries fit.

    Never raises for memory: see the module docstring for the fallback.
    """
    key = (m, k, n, in_type.name, partials_type.name, target, round(available_memory_proportion, 6))
    if key in _PLAN_CACHE:
        return _PLAN_CACHE[key]
    tiles = target.getNumTiles()
    macs = target.getAmpMacsPerCycle(in_type, partials_type)
    epc = target.getExchangeBytesPerCycle()
    isz, psz = in_type.size, partials_type.size
    plans = []
    for pm in _candidates(m, tiles):
        for pn in _candidates(n, tiles // pm):
            for pk in _candidates(k, tiles // (pm * pn)):
                bm, bn, bk = -(-m // pm), -(-n // pn), -(-k // pk)
                compute = bm * bn * bk / macs + AMP_VERTEX_OVERHEAD_CYCLES
                exch = (bm * bk + bk * bn) * isz / epc
                temp = (bm * bk + bk * bn) * isz + bm * bn * psz
                reduce = 0.0
                if pk > 1:
                    per_tile_out = -(-m * n // min(tiles, m * n))
                    reduce = per_tile_out * pk * psz / epc + per_tile_out * pk / target.getVectorWidth(partials_type) \
                        + REDUCE_VERTEX_OVERHEAD_CYCLES
                plans.append(MatMulPlan(pm, pn, pk, compute + exch + reduce, int(temp)))
    # poplin: minimise cycles within the budget; if nothing fits, double the budget up to twice
    # the tile's memory, then take the plan with the least temporary memory (with a warning).
    budget = available_memory_proportion * target.getBytesPerTile()
    best = None
    while best is None and budget <= 2 * target.getBytesPerTile():
        fitting = [p for p in plans if p.temp_bytes <= budget]
        best = min(fitting, key=lambda p: p.cycles) if fitting else None
        budget = budget * 2 if budget > 0 else 1024
    if best is None:
        best = min(plans, key=lambda p: (p.temp_bytes, p.cycles))
        _log.warning("matMul planner unable to meet memory target for [%dx%d] x [%dx%d]: least temporary memory "
                     "is %d bytes per tile", m, k, k, n, best.temp_bytes)
    _PLAN_CACHE[key] = best
    return best


def _partials_kernel(a, b, partials, pk, bk, ptype, ctx):
    A, B = ctx.read(a), ctx.read(b)                 # [R, m, k], [R, k, n]
    R, m, k = A.shape
    n = B.shape[2]
    pad = pk * bk - k
    acc = ptype.torch_dtype if A.dtype == torch.float16 and ptype.torch_dtype == torch.float32 else A.dtype
    A2 = torch.nn.functional.pad(A.to(acc), (0, pad)).reshape(R, m, pk, bk)
    B2 = torch.nn.functional.pad(B.to(acc), (0, 0, 0, pad)).reshape(R, pk, bk, n)
    ctx.write(partials, torch.einsum("rmpk,rpkn->rpmn", A2, B2))


def _reduce_kernel(partials, out, ctx):
    ctx.write(out, ctx.read(partials).sum(dim=1))


def _direct_kernel(a, b, out, ptype, ctx):
    A, B = ctx.read(a), ctx.read(b)
    acc = torch.float32 if A.dtype == torch.float16 and ptype.torch_dtype == torch.float32 else A.dtype
    ctx.write(out, torch.matmul(A.to(acc), B.to(acc)))


def matMul(graph, A, B, prog, name_or_type="", name: str = "", options=None, cache=None):  # noqa: N802
    """``C = A @ B`` for 2-D ``A[m,k]``, ``B[k,n]`` (``poplin::matMul``); appends to ``prog``.

    Options: ``availableMemoryProportion`` (default 0.6), ``partialsType`` ("float" or "half").
    Raises ``poplar.graph_connection_error`` for mismatched shapes or types.
    """
    if isinstance(name_or_type, poplar.Type):
        out_type = name_or_type
    else:
        out_type, name = A.elementType(), name or name_or_type
    options = dict(options or {})
    if A.rank() != 2 or B.rank() != 2 or A.dim(1) != B.dim(0):
        raise poplar.graph_connection_error(f"matMul: cannot multiply shapes {A.shape()} and {B.shape()}")
    if A.elementType() != B.elementType():
        raise poplar.graph_connection_error(f"matMul: operand types differ ({A.elementType()} and {B.elementType()})")
    m, k = A.shape()
    n = B.dim(1)
    in_type = A.elementType()
    ptype = poplar.types.as_type(options.get("partialsType", "float"))
    target = graph.getTarget()
    plan = plan_matmul(m, k, n, in_type, ptype, target, float(options.get("availableMemoryProportion", 0.6)))
    name = name or "matmul"
    bm, bn, bk = -(-m // plan.pm), -(-n // plan.pn), -(-k // plan.pk)
    T = target.getNumTiles()
    gt = graph._tiles  # local -> global tile numbers

    def tile_of(i, j, kk):
        return (i * plan.pn + j) * plan.pk + kk

    # output mapped by (m, n) blocks on the kk=0 tile of each block
    out = graph.addVariable(out_type, [m, n], name)
    rows, cols = np.arange(m) // bm, np.arange(n) // bn
    out_tiles = tile_of(rows[:, None], cols[None, :], 0).reshape(-1)
    graph.setTileMapping(out, out_tiles)
    # A[i-block, kk-block] is needed by tiles (i, j, kk) for every j: one read per j (the exchange
    # multicasts, so only the first counts the send); likewise B for every i.
    kidx = np.arange(k) // bk
    reads = []
    for j in range(plan.pn):
        a_tiles = tile_of(rows[:, None], j, kidx[None, :]).reshape(-1)
        reads.append((A, gt[a_tiles], j == 0))
    for i in range(plan.pm):
        b_tiles = tile_of(i, cols[None, :], kidx[:, None]).reshape(-1)
        reads.append((B, gt[b_tiles], i == 0))
    macs = target.getAmpMacsPerCycle(in_type, ptype)
    # per-tile MACs (edge blocks are smaller)
    mi = np.minimum(bm, m - np.arange(plan.pm) * bm)
    nj = np.minimum(bn, n - np.arange(plan.pn) * bn)
    kk = np.minimum(bk, k - np.arange(plan.pk) * bk)
    tile_macs = (mi[:, None, None] * nj[None, :, None] * kk[None, None, :]).reshape(-1)
    tiles = np.arange(plan.tiles)
    cycles = np.ceil(tile_macs / macs) + AMP_VERTEX_OVERHEAD_CYCLES
    vtype = f"poplin::ConvPartial1x1Out<{in_type},{ptype},true,false>"
    cs = graph.addComputeSet(f"{name}/Conv")
    if plan.pk == 1:
        graph.add_vertex_group(cs, VertexGroup(
            vtype, gt[tiles], cycles, functools.partial(_direct_kernel, A, B, out, ptype),
            reads=reads, writes=[(out, gt[out_tiles])], multi=True, flops=2.0 * m * n * k, state_bytes=64))
        prog.add(poplar.program.Execute(cs))
        return out
    partials = graph.addVariable(ptype, [plan.pk, m, n], f"{name}/partials")
    p_tiles = tile_of(rows[None, :, None], cols[None, None, :], np.arange(plan.pk)[:, None, None]).reshape(-1)
    graph.setTileMapping(partials, p_tiles)
    graph.add_vertex_group(cs, VertexGroup(
        vtype, gt[tiles], cycles, functools.partial(_partials_kernel, A, B, partials, plan.pk, bk, ptype),
        reads=reads, writes=[(partials, gt[p_tiles])], multi=True, flops=2.0 * m * n * k, state_bytes=64))
    prog.add(poplar.program.Execute(cs))
    # reduce: output elements spread linearly over all tiles; each sums pk partials
    from openipu.poplar.mapping import linear_tile_of_elements
    red_tiles = linear_tile_of_elements(m * n, T, target.getVectorWidth(out_type), 0)
    graph.setTileMapping(out, red_tiles)
    counts = np.bincount(red_tiles, minlength=T)
    used = np.flatnonzero(counts)
    vw = target.getVectorWidth(ptype)
    rcycles = 6 * (np.ceil(counts[used] * plan.pk / vw / 6) * 2) + REDUCE_VERTEX_OVERHEAD_CYCLES
    p_cons = np.broadcast_to(red_tiles.reshape(1, m * n), (plan.pk, m * n)).reshape(-1)
    rcs = graph.addComputeSet(f"{name}/Reduce")
    graph.add_vertex_group(rcs, VertexGroup(
        f"popops::Reduce<popops::ReduceAdd,{ptype},{out_type}>", gt[used], rcycles,
        functools.partial(_reduce_kernel, partials, out), reads=[(partials, gt[p_cons])],
        writes=[(out, gt[red_tiles])], multi=True, flops=float(m * n * (plan.pk - 1)), state_bytes=32))
    prog.add(poplar.program.Execute(rcs))
    return out

