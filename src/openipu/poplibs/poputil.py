"""``poputil``: tile-mapping helpers (PopLibs ``include/poputil/TileMapping.hpp``, ``Util.hpp``).

The rules follow PopLibs ``lib/poputil/TileMapping.cpp``, ``Util.cpp`` and ``TensorUseTracker.cpp``
(SDK 3.4):

- ``splitRegions``: cut a sequence of regions into at most ``maxPartitions`` parts of whole grains,
  each part at least ``minElementsPerPartition`` elements where possible, using as few parts as
  the largest part allows; part ``v`` takes grains ``[v*G//P, (v+1)*G//P)``.
- ``calcLinearTileMapping`` / ``mapTensorLinearly``: ``splitRegions`` of the flattened tensor over
  every tile of the graph; defaults grain = ``target.getVectorWidth(type)`` (float 2, half 4) and
  ``minElementsPerTile = ceil(128 bytes / type size)`` (float 32, half 64).
- ``getTileImbalance``: elements on the fullest tile minus the balanced count
  ``max(ceil(total / numTiles), minElementsPerTile, grainSize)`` (0 if below it).

All mapping work is numpy over runs of the tile maps (intervals of elements on one tile), never
over elements; the only Python loops run over runs of equal tile sets (``createBroadcastOperand``),
at most a few per tile.
"""

from __future__ import annotations

import numpy as np

from openipu.poplar import errors
from openipu.poplar import sets as _sets
from openipu.poplar.graph import TensorCloneMethod
from openipu.poplar.mapping import linear_tile_runs, map_linearly
from openipu.poplar.regions import group_ranks
from openipu.poplar.tensor import Interval, Tensor
from openipu.poplibs.popops._common import split_positions, union_intervals

__all__ = ["poplibs_error", "splitRegions", "calcLinearTileMapping", "mapTensorLinearly", "getTileImbalance",
           "cloneToIpu", "createIpuCopy", "copyToIpu", "cloneToGraph", "createBroadcastOperand",
           "dimIsSplitOverTiles", "dimIsSplitOverIPUs"]

#: PopLibs ``calcLinearTileMapping``: at least this many bytes per used tile by default.
MIN_BYTES_PER_TILE = 128


class poplibs_error(errors.poplar_error):  # noqa: N801 - PopLibs spelling
    """``poputil::poplibs_error``: a PopLibs function was called with arguments it cannot use."""


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------
def _local_runs(graph, t: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(begin, end, local tile)`` runs of ``t``'s flattened elements in ``graph`` (-1 where
    unmapped or mapped outside the graph); adjacent runs may share a tile."""
    b, e, tl = graph.tile_runs_of(t)
    tl = tl.astype(np.int64)
    return b, e, (graph._local_tiles(tl) if tl.size else tl)


def _row_runs(b, e, tl, row: int):
    """Runs ``[b, e)`` with values ``tl`` over a flat index space of rows of ``row`` elements,
    split at row boundaries: ``(row index, begin in row, end in row, value)``."""
    if b.size == 0 or row == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, z
    r0, r1 = b // row, (e - 1) // row
    cnt = r1 - r0 + 1
    k, local = group_ranks(cnt)
    r = r0[k] + local
    lo = np.maximum(b[k], r * row) - r * row
    hi = np.minimum(e[k], (r + 1) * row) - r * row
    return r, lo, hi, tl[k]


def _interval_bounds(regions) -> tuple[np.ndarray, np.ndarray]:
    b = np.array([r.begin() if isinstance(r, Interval) else r[0] for r in regions], np.int64)
    e = np.array([r.end() if isinstance(r, Interval) else r[1] for r in regions], np.int64)
    if b.size and np.any(e < b):
        raise poplibs_error("splitRegions: an interval ends before it begins")
    return b, e


# ----------------------------------------------------------------------------------------------
# splitting and linear mapping
# ----------------------------------------------------------------------------------------------
def splitRegions(regions, grainSize: int, maxPartitions: int, minElementsPerPartition: int = 0):  # noqa: N802,N803
    """``poputil::splitRegions``: split ``regions`` (a list of :class:`Interval` or ``(begin, end)``)
    into at most ``maxPartitions`` lists of intervals of whole grains of ``grainSize`` elements
    (the last grain may be short), each at least ``minElementsPerPartition`` elements where there
    are enough. Returns ``list[list[Interval]]`` (one list per partition; empty if no elements).

    Raises :class:`poplibs_error` for a zero grain size or partition count.
    """
    if grainSize < 1 or maxPartitions < 1:
        raise poplibs_error(f"splitRegions needs grainSize >= 1 and maxPartitions >= 1, got {grainSize}, {maxPartitions}")
    b, e = _interval_bounds(regions)
    total = int((e - b).sum())
    if total == 0:
        return []
    pb, pe = linear_tile_runs(total, maxPartitions, grainSize, minElementsPerPartition)
    lo, hi, part = split_positions(b, e, pb, pe)
    # pieces of one partition at consecutive elements join into one interval
    join = np.r_[False, (part[1:] == part[:-1]) & (lo[1:] == hi[:-1])]
    first = np.flatnonzero(~join)
    last = np.r_[first[1:], lo.size] - 1
    out: list[list[Interval]] = [[] for _ in range(pb.size)]
    for p, x, y in zip(part[first].tolist(), lo[first].tolist(), hi[last].tolist()):
        out[p].append(Interval(x, y))
    return out


def _linear_defaults(graph, type_, min_elements_per_tile, grain_size):
    target = graph.getTarget()
    grain = target.getVectorWidth(type_) if grain_size is None else int(grain_size)
    size = target.getTypeSize(type_)
    min_el = -(-MIN_BYTES_PER_TILE // size) if min_elements_per_tile is None else int(min_elements_per_tile)
    if grain < 1:
        raise poplibs_error(f"grainSize must be at least 1, got {grain}")
    return min_el, grain


def calcLinearTileMapping(graph, t, minElementsPerTile: int | None = None, grainSize: int | None = None,  # noqa: N802,N803
                          type_=None, *, min_elements_per_tile: int | None = None, grain_size: int | None = None):
    """``poputil::calcLinearTileMapping(graph, t)`` or ``(graph, shape, minElementsPerTile, grainSize)``.

    ``t`` is a :class:`Tensor` or a shape (then give ``minElementsPerTile`` and ``grainSize``, or
    ``type_`` for the defaults). Returns per tile of ``graph`` a list of :class:`Interval` of the
    flattened elements. Defaults: grain = vector width of the type, minimum = ceil(128 / type size).
    ``min_elements_per_tile`` / ``grain_size`` are PEP 8 aliases of the PopLibs arguments.
    """
    minElementsPerTile = minElementsPerTile if min_elements_per_tile is None else min_elements_per_tile  # noqa: N806
    grainSize = grainSize if grain_size is None else grain_size  # noqa: N806
    if isinstance(t, Tensor):
        n, et = t.numElements(), t.elementType()
    else:
        n = int(np.prod([int(s) for s in t], dtype=np.int64))
        et = type_
        if et is None and (minElementsPerTile is None or grainSize is None):
            raise poplibs_error("calcLinearTileMapping(graph, shape, ...) needs minElementsPerTile and grainSize")
    if et is None:
        min_el, grain = int(minElementsPerTile), int(grainSize)
    else:
        min_el, grain = _linear_defaults(graph, et, minElementsPerTile, grainSize)
    b, e = linear_tile_runs(n, graph.getTarget().getNumTiles(), grain, min_el)
    out: list[list[Interval]] = [[] for _ in range(graph.getTarget().getNumTiles())]
    for tl, (lo, hi) in enumerate(zip(b.tolist(), e.tolist())):
        out[tl].append(Interval(lo, hi))
    return out


def mapTensorLinearly(graph, t, minElementsPerTile: int | None = None, grainSize: int | None = None,  # noqa: N802,N803
                      *, min_elements_per_tile: int | None = None, grain_size: int | None = None) -> None:
    """``poputil::mapTensorLinearly``: map ``t``'s flattened elements over every tile of ``graph`` in
    index order (see :func:`calcLinearTileMapping` for the rule, defaults and aliases)."""
    minElementsPerTile = minElementsPerTile if min_elements_per_tile is None else min_elements_per_tile  # noqa: N806
    grainSize = grainSize if grain_size is None else grain_size  # noqa: N806
    min_el, grain = _linear_defaults(graph, t.elementType(), minElementsPerTile, grainSize)
    map_linearly(graph, t, min_el, grain)


def getTileImbalance(graph, t, minElementsPerTile: int = 0, grainSize: int = 1) -> int:  # noqa: N802,N803
    """``poputil::getTileImbalance``: elements on the fullest tile of ``graph`` minus the balanced
    count ``max(ceil(numElements / numTiles), minElementsPerTile, grainSize)``; 0 if no tile holds
    more. Raises ``invalid_tile_mapping`` if ``t`` is not completely mapped."""
    b, e, tl = _local_runs(graph, t)
    if (tl < 0).any():
        raise errors.invalid_tile_mapping(f"getTileImbalance: tensor {t.shortString()} is not completely mapped")
    num_tiles = graph.getTarget().getNumTiles()
    counts = np.bincount(tl, weights=e - b, minlength=num_tiles).astype(np.int64)
    total = int(counts.sum())
    balanced = max(-(-total // num_tiles), int(minElementsPerTile), int(grainSize))
    worst = int(counts.max()) if counts.size else 0
    return 0 if worst < balanced else worst - balanced


# ----------------------------------------------------------------------------------------------
# multi-IPU copies and graph clones
# ----------------------------------------------------------------------------------------------
def cloneToIpu(graph, t, dstIPU: int, name: str = "",  # noqa: N802,N803
               method=TensorCloneMethod.PRESERVE_ORDER_UNLESS_ALIASES):
    """``poputil::cloneToIpu``: a new tensor like ``t`` whose elements sit on IPU ``dstIPU`` of
    ``graph``'s target, each on the same tile index within the IPU as in ``t`` (elements already on
    ``dstIPU`` stay put). Raises :class:`poplibs_error` for an IPU out of range and
    ``invalid_tile_mapping`` if ``t`` is not completely mapped."""
    target = graph.getTarget()
    if not 0 <= int(dstIPU) < target.getNumIPUs():
        raise poplibs_error(f"cloneToIpu: IPU {dstIPU} does not exist; the graph's target has "
                            f"{target.getNumIPUs()} IPU(s)")
    b, e, tl = _local_runs(graph, t)
    if (tl < 0).any():
        raise errors.invalid_tile_mapping(f"cloneToIpu: tensor {t.shortString()} is not completely mapped")
    out = graph.clone(t, name=name or "cloneToIpu", method=method)
    tpi = target.getTilesPerIPU()
    graph.set_tile_runs(out, b, e, graph._global_tiles(int(dstIPU) * tpi + tl % tpi))
    return out


def createIpuCopy(graph, t, dstIpu: int, name: str = "",  # noqa: N802,N803
                  method=TensorCloneMethod.PRESERVE_ORDER_UNLESS_ALIASES):
    """``poputil::createIpuCopy``: ``(tLocal, copySrc, copyDst)``: the clone on ``dstIpu`` and the
    tensors to copy between (here ``t`` and the clone itself)."""
    out = cloneToIpu(graph, t, dstIpu, name, method)
    return out, t, out


def copyToIpu(graph, t, prog, dstIPU: int, name: str = "",  # noqa: N802,N803
              method=TensorCloneMethod.PRESERVE_ORDER_UNLESS_ALIASES):
    """``poputil::copyToIpu``: :func:`cloneToIpu` plus a ``Copy(t, clone)`` appended to ``prog``
    (the engine costs it as an inter-IPU exchange). Returns the clone."""
    from openipu.poplar.program import Copy
    out, src, dst = createIpuCopy(graph, t, dstIPU, name or "copyToIpu", method)
    prog.add(Copy(src, dst))
    return out


def cloneToGraph(srcGraph, dstGraph, t, name: str = "",  # noqa: N802,N803
                 method=TensorCloneMethod.PRESERVE_ORDER_UNLESS_ALIASES):
    """``poputil::cloneToGraph``: a clone of ``t`` (of ``srcGraph``) mapped in ``dstGraph`` to the
    same local tile numbers it has in ``srcGraph``.

    Raises :class:`poplibs_error` if the replication factors differ, if the graphs do not share a
    top-level graph, or if ``t`` uses a tile number ``dstGraph`` does not have.
    """
    if srcGraph.getReplicationFactor() != dstGraph.getReplicationFactor():
        raise poplibs_error(
            "Cannot clone a tensor to a graph with a different replication factor: the source graph has "
            f"replication factor {srcGraph.getReplicationFactor()} and the destination graph "
            f"{dstGraph.getReplicationFactor()}")
    if srcGraph._state is not dstGraph._state:
        raise poplibs_error("cloneToGraph: the graphs must be virtual graphs of one top-level graph")
    b, e, tl = _local_runs(srcGraph, t)
    if (tl < 0).any():
        raise errors.invalid_tile_mapping(f"cloneToGraph: tensor {t.shortString()} is not completely mapped")
    n_dst = dstGraph.getTarget().getNumTiles()
    if tl.size and tl.max() >= n_dst:
        raise poplibs_error(
            "Cannot clone a tensor to a graph with fewer tiles than required by the input tensor mapping: "
            f"elements are mapped to tile {int(tl.max())} of the source graph, but the destination graph "
            f"only has {n_dst} tiles")
    out = srcGraph.clone(t, name=name or "cloneToGraph", method=method)
    dstGraph.set_tile_runs(out, b, e, dstGraph._global_tiles(tl))
    return out


# ----------------------------------------------------------------------------------------------
# broadcast operands
# ----------------------------------------------------------------------------------------------
def _boost_hash_range(values, seed: int = 0x9E3779B9) -> int:
    """``boost::hash_range`` over size_t values with the classic ``hash_combine`` (64-bit)."""
    mask = (1 << 64) - 1
    for v in values:
        seed ^= (int(v) + 0x9E3779B9 + ((seed << 6) & mask) + (seed >> 2)) & mask
        seed &= mask
    return seed


def createBroadcastOperand(graph, fullTensor, type_, dim: int, ditherMapping: bool = False,  # noqa: N802,N803
                           name: str = ""):
    """``poputil::createBroadcastOperand``: a 1-D tensor of ``fullTensor.dim(dim)`` elements of
    ``type_``, mapped for broadcasting along ``dim`` of ``fullTensor``.

    PopLibs' rule (TileMapping.cpp, TensorUseTracker ``ConstrainMappingToUsedTiles``): element ``c``
    is *used* on every tile that holds some element of ``fullTensor`` with index ``c`` along
    ``dim``. Runs of elements with the same set of using tiles are merged with their neighbours
    while the sets intersect; each merged group is split (grain = data-path width / type size:
    float 2, half 4) over the tiles of its set, in tile order. With ``ditherMapping`` the whole
    mapping is rotated by a start tile hashed from ``fullTensor``'s shape.

    Raises ``index_error`` for a bad ``dim`` and ``invalid_tile_mapping`` if ``fullTensor`` is not
    completely mapped.
    """
    from openipu.poplar.types import as_type
    type_ = as_type(type_)
    rank = fullTensor.rank()
    if not 0 <= int(dim) < rank:
        raise errors.index_error(f"createBroadcastOperand: dim {dim} is out of range for a tensor of rank {rank}")
    C = fullTensor.dim(dim)
    out = graph.addVariable(type_, [C], name or "broadcastOperand")
    target = graph.getTarget()
    num_tiles = target.getNumTiles()
    t = fullTensor.dimRoll(dim, rank - 1)
    if (_local_runs(graph, t)[2] < 0).any():
        raise errors.invalid_tile_mapping(
            f"createBroadcastOperand: tensor {fullTensor.shortString()} is not completely mapped")
    if t.numElements() == 0 or C == 0:
        mapTensorLinearly(graph, out)
        return out
    # channels each tile uses: the union of the channel ranges of its boxes of t viewed [rows, C]
    from openipu.poplar.exchange import tile_boxes
    bx = tile_boxes(t.reshape([t.numElements() // C, C]))
    st, slo, shi = union_intervals(graph._local_tiles(bx.tile), bx.lo[:, 1], bx.lo[:, 1] + bx.sz[:, 1])
    # runs of channels with one tile set: the ranges between the segments' ends (each end changes
    # the set, as a tile's segments neither touch nor overlap)
    bounds = _sets.unique(np.concatenate([slo, shi]))
    run_lo, run_hi = bounds[:-1], bounds[1:]
    i0, i1 = np.searchsorted(bounds, slo), np.searchsorted(bounds, shi)
    cnt = i1 - i0
    run_of = np.repeat(i0, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    tile_of = np.repeat(st, cnt)
    order = np.lexsort((tile_of, run_of))
    run_of, tile_of = run_of[order], tile_of[order]
    cuts = np.searchsorted(run_of, np.arange(run_lo.size + 1))
    run_sets = [frozenset(tile_of[a:z].tolist()) for a, z in zip(cuts[:-1].tolist(), cuts[1:].tolist())]
    # merge neighbouring runs whose tile sets intersect the group's union (mergeIntersectingTileGroups)
    groups: dict[frozenset, list[tuple[int, int]]] = {}
    cur, lo, hi = set(run_sets[0]), int(run_lo[0]), int(run_hi[0])
    for s, a, b in zip(run_sets[1:], run_lo[1:].tolist(), run_hi[1:].tolist()):
        if cur.isdisjoint(s):
            groups.setdefault(frozenset(cur), []).append((lo, hi))
            cur, lo, hi = set(s), a, b
        else:
            cur |= s
            hi = b
    groups.setdefault(frozenset(cur), []).append((lo, hi))
    grain = max(1, target.getDataPathWidth() // (8 * type_.size))
    los, his, tls = [], [], []
    for tile_set, ivs in groups.items():
        tl = np.array(sorted(tile_set), np.int64)
        b = np.array([i[0] for i in ivs], np.int64)
        e = np.array([i[1] for i in ivs], np.int64)
        lo, hi, part = split_positions(b, e, *linear_tile_runs(int((e - b).sum()), tl.size, grain, 0))
        los.append(lo)
        his.append(hi)
        tls.append(tl[part])
    lo, hi, tl = np.concatenate(los), np.concatenate(his), np.concatenate(tls)
    if ditherMapping:
        start = _boost_hash_range(fullTensor.shape()) % num_tiles
        tl = (tl + start) % num_tiles
    graph.set_tile_runs(out, lo, hi, graph._global_tiles(tl))
    return out


def dimIsSplitOverTiles(graph, t, dimension: int) -> bool:  # noqa: N802
    """``poputil::dimIsSplitOverTiles``: do slices of ``t`` along ``dimension`` have different tile
    mappings?"""
    n = t.dim(dimension)
    if n == 0:
        return False
    row = t.numElements() // n
    r, lo, hi, tl = _row_runs(*_local_runs(graph, t.dimRoll(dimension, 0)), row)
    if r.size == 0:
        return False
    # the runs of each slice, merged where neighbours share a tile, must equal slice 0's
    keep = np.r_[True, (r[1:] != r[:-1]) | (tl[1:] != tl[:-1])]
    r, lo, tl = r[keep], lo[keep], tl[keep]
    per = np.bincount(r, minlength=n)
    if (per != per[0]).any():
        return True
    k = int(per[0])
    return bool((lo.reshape(n, k) != lo[:k]).any() or (tl.reshape(n, k) != tl[:k]).any())


def dimIsSplitOverIPUs(graph, t, dimension: int) -> bool:  # noqa: N802
    """``poputil::dimIsSplitOverIPUs``: does some slice of ``t`` along ``dimension`` (all its
    other indices fixed) span more than one IPU?"""
    target = graph.getTarget()
    if target.getNumIPUs() == 1 or t.numElements() == 0:
        return False
    b, e, tl = _local_runs(graph, t.dimRoll(dimension, t.rank() - 1))
    r, _, _, ipu = _row_runs(b, e, tl // target.getTilesPerIPU(), t.dim(dimension))
    # a slice spans two IPUs where two of its runs lie on different IPUs
    return bool(((r[1:] == r[:-1]) & (ipu[1:] != ipu[:-1])).any())
