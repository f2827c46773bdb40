"""``popops``: cycle estimates of the reduction vertices (PopLibs
``lib/popops/reduction/CycleEstimationFunctions.cpp``), per tile, as numpy arrays (one entry per
tile). Used by :mod:`.reduce` for each stage's vertex group."""

from __future__ import annotations

import math

import numpy as np

from openipu import poplar
from openipu.poplar import regions as R
from openipu.poplar.exchange import variable_runs
from openipu.poplibs.popops._common import union_intervals
from openipu.poplibs.popops.reduce_operation import ACCUMULATING, VECTORISED, Operation

__all__ = ["WORKERS", "continuous_reduce_cycles", "reduce_worker_cycles", "stage_tile_cycles", "address_runs_per_tile"]

#: Worker contexts per tile (ipu1/ipu2).
WORKERS = 6


def acc_vector_width(ptype) -> int:
    """Accumulator vector width (CycleEstimationFunctions.cpp: half 8, float 4, else 1)."""
    return 8 if ptype == poplar.HALF else 4 if ptype == poplar.FLOAT else 1


def data_path_elems(ptype, target) -> int:
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
        cpo, epl = 1, min(acc_vector_width(ptype), data_path_elems(ptype, target))
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
    if op in VECTORISED:
        uses_acc = op in ACCUMULATING
        op_vw = acc_vector_width(ptype) if uses_acc else target.getVectorWidth(ptype)
        dpw = data_path_elems(ptype, target)
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


def stage_tile_cycles(E, k, runs, continuous: bool, ptype, out_type, op, update, target):
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


def address_runs_per_tile(view, elems_per_tile: np.ndarray) -> np.ndarray:
    """Contiguous regions of each tile in the first stage: runs of consecutive addresses of
    ``view`` on one tile (a repeated address of a broadcast view starts a new region), from the
    view's address runs and the tile maps (no per-element work). ``elems_per_tile`` counts the
    view's elements per tile (with repeats)."""
    T = elems_per_tile.size
    var, start, length = R.piece_runs(view.pieces)
    # the runs of the view's variables only (not of the whole space, which other tensors keep
    # growing between reductions)
    gst, gend, gtl = variable_runs(view, var)
    end = start + length
    r0 = np.searchsorted(gst, start, side="right") - 1
    r1 = np.searchsorted(gst, end - 1, side="right") - 1
    cnt = r1 - r0 + 1
    ri = np.repeat(r0, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    lo = np.maximum(np.repeat(start, cnt), gst[ri])
    hi = np.minimum(np.repeat(end, cnt), gend[ri])
    key, ulo, uhi = union_intervals(gtl[ri].astype(np.int64), lo, hi)
    runs = np.bincount(key, minlength=T)
    distinct = np.bincount(key, weights=uhi - ulo, minlength=T).astype(np.int64)
    return runs + (elems_per_tile - distinct)
