"""The convolution / matmul planner (PopLibs ``lib/poplin/ConvPlan.cpp``, ``ConvModel.cpp``).

A matmul ``A[g][m][k] x B[g][k][n]`` is planned as a convolution with ``g`` conv groups, batch
``m``, ``k`` input and ``n`` output channels and a field and kernel of size 1 (PopLibs
``MatMul.cpp getConvParams``), so one planner serves both.

A plan splits the work over tiles in parallel along conv groups, batch, the first output field
dimension, input channels and output channels; and serially (steps in time) along output
channels when temporary memory is short (PopLibs ``Partition``: ``convGroupSplit``,
``batchSplit``, ``fieldSplit``, ``inChanSplit``, ``outChanSplit{parallel, serial}``; PopLibs
splits the batch in parallel only). For every
candidate split and vertex type it estimates, per tile and serial step (all predicted IPU cycles):

- the partial-sum vertex: ``poplin::ConvPartial1x1Out`` (AMP, 1x1 kernels), ``ConvPartialnx1``
  (AMP, larger kernels) or ``ConvPartialHorizontalMac`` (HMAC), with the shapes of PopLibs'
  estimators (``lib/poplin/PerformanceEstimation.hpp``): the tile's input channels are rounded up
  to the AMP's input channel grouping and its output channels to its conv units; each worker
  processes its share of output positions in the AMP core loop (4 worker cycles per position
  for half, 8 for float, "Core loop cycles for 16x8 AMP vertex"), once per (conv group, input
  channel group, output channel group), with weight loads and loop overheads around it;
- the exchange of the input and weight blocks the tile does not hold (4 bytes/cycle/tile), with
  the tensors laid out as ``createInput`` / ``createWeights`` lay them out;
- when input channels are split, the exchange and reduction of the partial sums;
- with a serial split, the loop's copies of each step's weight slice and output slice
  (``popops`` dynamic slice and update, on the tile);
- the syncs and compute-set launches the engine charges (``openipu.poplar.calibration``);

and the temporary memory per tile: the input and weight blocks its vertices read (counted whole,
as work buffers), partial sums, and the partials received for the reduction (the peak of the two
phases, as ``ConvModel.cpp addEstimates`` takes the peak of concurrent temporaries), plus the
loop's slice buffers with serial splits. Serial splits must divide the split dimension's
parallel blocks evenly.

It keeps the fastest plan whose temporary memory fits ``availableMemoryProportion`` (default 0.6)
of the tile's memory. Serial splits are tried only when no parallel plan fits. If no plan fits at
all, it does as PopLibs' planner does: it warns through Poplar's logger (``PO:POPLIN [W]``,
printed with ``POPLAR_LOG_LEVEL=WARN`` or ``POPLAR_POPLIN_LOG_LEVEL=WARN``: "convolution planner
unable to meet memory target", naming the op, its shapes, the least temporary memory found and the
budget) and takes the plan that needs least temporary memory (the MINIMIZE_TILE_TEMP_MEMORY
objective). The graph then holds more than the budget, usually more than the tile, and the memory
report says it does not fit, as for any graph that does not fit. Callers that want to know can
collect those plans with :func:`record_over_budget`. ``availableMemoryProportion`` 0 asks for the
plan with the least temporary memory from the start.

The AMP's conv units come from the target table: ``units = Target.getAmpMacsPerCycle(in,
partials) x core cycles / weights per conv unit`` (ipu2: 16 for half with half partials, 8 for
half with float partials, 16 for float), so a tile never exceeds the table's MACs per cycle.

Transforms: the forward and weight-update passes try PopLibs' ``expandDims`` on every subset of
the candidate field dimensions (:mod:`openipu.poplibs.poplin.transforms`; in the weight update the
forward output field folded into the input channels, so that the ``N x H x W`` reduction is split
over tiles; in the forward pass kernel dimensions folded into the input channels, so that ResNet's
3-channel 7x7 stem fills the AMP) and keep the cheapest plan, transform cost included. Not
modelled: ``expandDims`` in the input-gradient pass, ``swapOperands``, ``outChanFlattenDims``,
``combineConvGroups``; SLIC, VMAC and OuterProduct vertices; multi-stage reductions; the multi-IPU (system) level of the plan. Positions that meet the zeros
of a dilated input are skipped at a rate of ``1 / inputDilation`` [A].

Plans are cached per (problem, types, options, target) in a :class:`PlanningCache` (one
module-wide cache unless the caller passes its own). Candidate evaluation is vectorised with
numpy: one array element per candidate.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np

from openipu import poplar
from openipu.poplar import calibration as cal
from openipu.poplar.options import get_logger
from openipu.poplar.types import as_type
from openipu.poplibs.poplin.params import ConvParams, poplibs_error
from openipu.poplibs.popops.dynamic_slice import dynamic_slice_worker_cycles

# --------------------------------------------------------------------------------------------
# constants (PopLibs estimator names; [A] = assumption)
# --------------------------------------------------------------------------------------------
#: Input channels one conv unit takes (``Target::getWeightsPerConvUnit``): 16 half, 8 float
#: (PopLibs ``ConvVertexType.cpp``; poplar.md 4.2).
WEIGHTS_PER_CONV_UNIT = {"half": 16, "float": 8, "quarter": 32}
# quarter (fp8, ipu21): [A] each conv unit takes twice the input channels of half in the same
# core loop, so 16 units give the 128 MACs/cycle/tile of the ipu21 fp8 rate (target.py).
#: AMP core-loop worker cycles per output position ("Core loop cycles for 16x8 AMP vertex":
#: ``floatActivations ? 8 : 4``, ``getConvPartial1x1SupervisorInnerLoopCycleEstimate``).
AMP_CORE_CYCLES = {"half": 4, "float": 8, "quarter": 4}
#: Bytes of weights a conv unit loads per cycle (``getConvUnitCoeffLoadBytesPerCycle``). [A] 8,
#: Poplar's default without the ``use128BitConvUnitLoad`` option.
CONV_UNIT_COEFF_LOAD_BYTES_PER_CYCLE = 8
#: Supervisor cycles outside the loops of ConvPartial1x1Out (``supervisorNonloopOverhead = 50``).
AMP_1X1_SUPERVISOR_OVERHEAD = 50
#: ``convNx1Overhead()`` = 109 (SDK 3.4 ``PerformanceEstimation.hpp``).
AMP_NX1_OVERHEAD = 109
#: ``convHorizontalMacOverhead(floatActivations)``: 58 float, 63 half.
HMAC_OVERHEAD = {"float": 58, "half": 63, "quarter": 63}
#: Fraction of a tile's memory under which the partials a tile receives for its reduction may be
#: gathered into one buffer, making the reduction a single-input ``ReduceAdd``
#: (``ConvReducePlan.hpp checkPartialsSizeForSingleInputReduce``: "< 1/16 of the total tile
#: memory", after rounding the bytes up to a memory element; the element size is not published
#: and the rounding is left out [A]).
SINGLE_INPUT_REDUCE_MEMORY_FRACTION = 1 / 16


def conv_reduce_cycles(out_size, depth, float_out: bool, float_partials: bool, W: int, data_path_width: int,
                       bytes_per_tile: int):
    """Tile cycles of one ``poplin::ReduceAdd`` vertex summing ``depth`` partials of ``out_size``
    outputs (arrays broadcast; ``out_size`` the tile's share of the output, ``depth`` the
    input-channel split), as PopLibs' ``getReduceCycleEstimate``
    (``lib/poplin/PerformanceEstimation.hpp``) with the vertex variant ``ConvReduce.cpp`` picks:

    - *single input* when the share is a multiple of the accumulator width (8 half, 4 float
      partials) and the ``depth - 1`` partials received fit :data:`SINGLE_INPUT_REDUCE_MEMORY_FRACTION`
      of the tile: the tile's own partial is the initial value, ``depth - 1`` are loaded, 2 cycles
      per accumulator vector and partial (one 64-bit load per cycle, ``enableFastReduce`` off as
      in PopLibs' default), an outer-loop overhead per vector (half partials: 9 to half, 10 to
      float; float partials: 7 / 8), 20 per worker and 33 supervisor cycles;
    - otherwise the multi-input vertex: ``depth`` partials at 3 cycles per vector (2 loads + 1
      pointer load), 32 per worker, and a shorter remainder loop.

    Returns predicted tile cycles (``numWorkers x`` the busiest worker's, plus supervisor)."""
    out_size = np.asarray(out_size, np.int64)
    depth = np.asarray(depth, np.int64)
    acc = 4 if float_partials else 8
    psize = 4 if float_partials else 2
    per_load = data_path_width // (psize * 8)
    # single input: initialPartial local, depth - 1 exchanged
    exch_bytes = out_size * (depth - 1) * psize
    single = (out_size % acc == 0) & (exch_bytes < SINGLE_INPUT_REDUCE_MEMORY_FRACTION * bytes_per_tile)
    loop1 = acc // min(acc, per_load)
    outer1 = (8 if float_out else 7) if float_partials else (10 if float_out else 9)
    loops = out_size // acc
    c_single = W * (20 + (loop1 * (depth - 1) + outer1) * _ceil(loops, W)) + 33
    # multi-input (supervisor) vertex
    loop2 = acc // min(acc, per_load) + 1
    loops2 = out_size // acc
    for i in range(int(math.log2(acc))):
        loops2 = loops2 + ((out_size >> i) & 1)
    ldw = loops2 // W
    rem = loops2 % W
    odd = (out_size & (acc - 1)) != 0
    extra = np.where((rem != 0) & odd, 2 * depth + (13 if float_partials else 11), 0)
    ldw = ldw + ((rem != 0) & ~odd)
    outer2 = (7 if float_partials else 9) if float_out else (6 if float_partials else 8)
    c_multi = W * (32 + extra + (loop2 * depth + outer2) * ldw)
    return np.where(depth <= 1, 0, np.where(single, c_single, c_multi))


#: Serial steps tried when no parallel plan fits (powers of two). [A]
SERIAL_SPLITS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class ConvPlan:
    """A plan: parallel splits (tiles used = their product), serial splits, the vertex type and
    its channel groupings, and the estimates: predicted IPU cycles of the whole op and its
    parts, and temporary bytes per tile (the peak of the op's concurrent temporaries)."""

    method: str                 # "AMP" or "HMAC"
    conv_units: int             # AMP engines used (0 for HMAC)
    in_chans_per_group: int
    out_chans_per_group: int    # partialChansPerGroup
    group_split: int
    batch_split: int
    field_split: int            # over the first output field dimension
    in_chan_split: int
    out_chan_split: int
    out_chan_serial: int
    cycles: float
    compute_cycles: float
    exchange_cycles: float
    reduce_cycles: float
    temp_bytes: int
    budget_bytes: int

    @property
    def tiles(self) -> int:
        return self.group_split * self.batch_split * self.field_split * self.in_chan_split * self.out_chan_split

    @property
    def serial_steps(self) -> int:
        return self.out_chan_serial

    def vertex_name(self, in_type, partials_type, one_by_one: bool) -> str:
        if self.method == "HMAC":
            return f"poplin::ConvPartialHorizontalMac<{in_type},{partials_type},true>"
        if one_by_one:
            return f"poplin::ConvPartial1x1Out<{in_type},{partials_type},true,false,{self.conv_units}>"
        return f"poplin::ConvPartialnx1<{in_type},{partials_type},true,false,{self.conv_units}>"

    def report(self) -> str:
        """A text summary (the spirit of ``poplin::reportPlanInfo``)."""
        return (f"method {self.method}"
                + (f" ({self.conv_units} conv units)" if self.method == "AMP" else "")
                + f", inChansPerGroup {self.in_chans_per_group}, partialChansPerGroup {self.out_chans_per_group}\n"
                f"  parallel splits: convGroup {self.group_split}, batch {self.batch_split}, field {self.field_split}, "
                f"inChan {self.in_chan_split}, outChan {self.out_chan_split} ({self.tiles} tiles)\n"
                f"  serial splits: outChan {self.out_chan_serial}\n"
                f"  estimated cycles {self.cycles:,.0f} (partials {self.compute_cycles:,.0f}, exchange "
                f"{self.exchange_cycles:,.0f}, reduction {self.reduce_cycles:,.0f})\n"
                f"  temporary memory {self.temp_bytes:,} bytes per tile (budget {self.budget_bytes:,})")


class PlanningCache:
    """``poplin::PlanningCache``: plans keyed by (problem, types, options, target)."""

    def __init__(self):
        self.plans: dict = {}

    def size(self) -> int:
        return len(self.plans)

    def clear(self) -> None:
        self.plans.clear()


_DEFAULT_CACHE = PlanningCache()


@dataclass(frozen=True)
class OverBudgetPlan:
    """A plan taken although its temporary memory is over the budget (no plan met it).

    ``temp_bytes`` and ``budget_bytes``: bytes per tile (predicted)."""

    op: str
    temp_bytes: int
    budget_bytes: int


_over_budget_sinks: list[list] = []


@contextlib.contextmanager
def _collecting(sinks: list):
    """A list appended to ``sinks`` for the ``with`` block (yielded), removed after it."""
    sink: list = []
    sinks.append(sink)
    try:
        yield sink
    finally:
        sinks.remove(sink)


def record_over_budget():
    """Collect the :class:`OverBudgetPlan` of every plan made or reused inside the ``with`` block
    whose temporary memory is over its budget (the planner fell back to the least-memory plan).
    Yields the list they are appended to. openipu extension (the sizing CLI reports them)."""
    return _collecting(_over_budget_sinks)


_plan_sinks: list[list] = []


def record_plans():
    """Collect every :class:`ConvPlan` made or reused inside the ``with`` block (yields the list
    they are appended to). openipu extension: ``openipu sweep`` reads the largest temporary
    memory of a compile's plans to know when a smaller budget would choose the same plans."""
    return _collecting(_plan_sinks)


def _note_over_budget(plan: "ConvPlan", op_desc: str) -> None:
    for sink in _plan_sinks:
        sink.append(plan)
    if plan.temp_bytes > plan.budget_bytes:
        for sink in _over_budget_sinks:
            sink.append(OverBudgetPlan(op_desc, plan.temp_bytes, plan.budget_bytes))

# --------------------------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------------------------
_PASSES = {"NONE", "INFERENCE_FWD", "TRAINING_FWD", "TRAINING_BWD", "TRAINING_WU", "FC_INFERENCE_FWD",
           "FC_TRAINING_FWD", "FC_TRAINING_BWD", "FC_TRAINING_WU", "NONE_MATMUL"}
#: Options accepted and ignored (they change PopLibs' lowering details, not this model).
_IGNORED_OPTIONS = {"inputRHSIsPreArranged", "planConstraints", "enableMultiStageReduce", "enableFastReduce",
                    "remapOutputTensor", "gatherOutput", "disableSRForAMPVertices", "use128BitConvUnitLoad",
                    "partialsType.interTile", "partialsType.interIPU", "planConstraintsOutputFilename",
                    "enableConvDithering", "disableTransformations", "startTileMultiplier", "numIPUs",
                    "tilesPerIPU", "enableSerialConvolutions", "insertTransformsCycleCountProgs",
                    "use8BitConvUnitLoad", "enableAmpHalfEnginesPlan", "enableSingleConvCycleCount"}


@dataclass(frozen=True)
class PlanOptions:
    """Parsed planner options. Units: a proportion of a tile's memory."""

    available_memory_proportion: float = 0.6
    partials_type: str = "float"
    pass_: str = "NONE"

    def key(self) -> tuple:
        return (round(self.available_memory_proportion, 9), self.partials_type, self.pass_)


def parse_options(options, op: str) -> PlanOptions:
    """Validate ``options`` (a dict or ``poplar.OptionFlags``) for ``op``.

    Raises ``poplar.invalid_option`` for an unknown name or a bad value.
    """
    if options is None:
        return PlanOptions()
    items = dict(options.items()) if hasattr(options, "items") else dict(options)
    amp, pt, pss = 0.6, "float", "NONE"
    for name, value in items.items():
        if name == "availableMemoryProportion":
            try:
                amp = float(value)
            except (TypeError, ValueError):
                raise poplar.invalid_option(f"{op}: availableMemoryProportion must be a number, got {value!r}") from None
            if not 0 <= amp <= 1 or math.isnan(amp):
                raise poplar.invalid_option(
                    f"{op}: availableMemoryProportion must lie in [0, 1], got {value!r}")
        elif name == "partialsType":
            pt = str(value).lower()
            if pt not in ("float", "half"):
                raise poplar.invalid_option(f"{op}: partialsType must be 'float' or 'half', got {value!r}")
        elif name in ("fullyConnectedPass", "pass"):
            pss = str(value).upper()
            if pss not in _PASSES:
                raise poplar.invalid_option(f"{op}: {name} must be one of {sorted(_PASSES)}, got {value!r}")
        elif name not in _IGNORED_OPTIONS:
            raise poplar.invalid_option(
                f"{op}: unknown option '{name}'; poplin accepts availableMemoryProportion, partialsType, "
                f"fullyConnectedPass / pass and {', '.join(sorted(_IGNORED_OPTIONS))}")
    return PlanOptions(amp, pt, pss)


# --------------------------------------------------------------------------------------------
# the problem in planner terms
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """What the planner needs from a :class:`ConvParams` (element counts; hashable)."""

    G: int
    N: int
    Ci: int
    Co: int
    out_rows: int        # first output field dimension, after stride, before output padding
    out_rest: int        # product of the other output dimensions
    in_rows: int         # first input field dimension
    in_rest: int         # product of the other input dimensions
    rows_per_out: float  # input rows per output row (stride / input dilation)
    halo_rows: float     # extra input rows a block of output rows needs
    taps: int            # kernel elements after truncation
    kernel_outer: int    # kernel size of the first dimension after truncation
    density: float       # fraction of (position, tap) pairs that meet real input (1 / input dilation) [A]

    @staticmethod
    def from_params(p: ConvParams) -> "Problem":
        n = p.getNumFieldDims()
        out = [p._strided_size(d) for d in range(n)]
        kt = [p.getTruncatedKernelSize(d) for d in range(n)]
        it, ot = p.inputTransform, p.outputTransform
        dil = it.dilation[0]
        keff = p.getTransformedKernelSize(0)
        return Problem(p.numConvGroups, p.batchSize, p.inputChannelsPerConvGroup, p.outputChannelsPerConvGroup,
                       out[0], int(np.prod(out[1:], dtype=np.int64)), p.inputFieldShape[0],
                       int(np.prod(p.inputFieldShape[1:], dtype=np.int64)), ot.stride[0] / dil,
                       max(0.0, (keff - 1) / dil), int(np.prod(kt, dtype=np.int64)), kt[0],
                       1.0 / float(np.prod(it.dilation)))

    def macs(self) -> float:
        return float(self.G) * self.N * self.Ci * self.Co * self.out_rows * self.out_rest * self.taps * self.density


def _ceil(a, b):
    return -(-a // b)


def split_candidates(d: int, limit: int, grains=(), tiles: int = 0, coarse: bool = False) -> np.ndarray:
    """Split factors worth trying for a dimension of size ``d`` over at most ``limit`` tiles:
    powers of two and 3, 5, 7 times powers of two (``coarse``: powers of two only), the divisors
    of ``tiles`` (so that splits can multiply up to every tile), the smallest factor giving each
    of those block sizes, and factors giving blocks that are multiples of ``grains``."""
    lim = max(1, min(d, limit))
    base = {1, lim}
    p = 1
    while p <= lim:
        base.add(p)
        if not coarse:
            base.update(m * p for m in (3, 5, 7))
        p *= 2
    if tiles and not coarse:
        base.update(q for q in range(1, min(lim, tiles) + 1) if tiles % q == 0)
    c = set()
    for q in base:
        if 1 <= q <= lim:
            c.add(q)
            c.add(_ceil(d, _ceil(d, q)))
    for g in grains:
        b = g
        while b < d:
            q = _ceil(d, b)
            if q <= lim:
                c.add(q)
            b *= 2
    return np.array(sorted(x for x in c if 1 <= x <= lim), np.int64)


def _cross(cols: dict, name: str, vals: np.ndarray, limit: int | None = None, par=()) -> dict:
    n = len(next(iter(cols.values()))) if cols else 1
    m = vals.size
    out = {k: np.repeat(v, m) for k, v in cols.items()}
    out[name] = np.tile(vals, n)
    if limit is not None:
        prod = np.ones(n * m, np.int64)
        for k in par:
            prod = prod * out[k]
        keep = prod <= limit
        out = {k: v[keep] for k, v in out.items()}
    return out


# --------------------------------------------------------------------------------------------
# vertex estimators (vectorised; shapes of PopLibs PerformanceEstimation.hpp)
# --------------------------------------------------------------------------------------------
def amp_1x1_cycles(P, nig, nog, groups, units, in_name: str, float_partials: bool, W: int):
    """Tile cycles of one ``ConvPartial1x1Out`` vertex (``getConvPartial1x1SupervisorCycleEstimate``)
    for ``P`` output positions per (group, in-group, out-group), arrays broadcast together."""
    fa = in_name == "float"
    core = AMP_CORE_CYCLES[in_name]
    ne = _ceil(P, W)
    # "The code paths for half activations, half partials and 16 conv units is = half
    # activations, float partials and 8 conv units" (commonHalfAndFloatPartialsCodePath)
    common = np.broadcast_to(np.asarray(False if fa else (np.asarray(units) == 16) | float_partials), np.shape(ne))
    zc = np.where(np.asarray(units) == 16, 8, 4) if fa else (4 if float_partials else 2)

    def worker(z):
        if fa:
            return np.select([ne == 0, ne == 1, ne == 2],
                             [24, 47 + (2 + zc) * z, 46 + (2 + zc * 2) * z],
                             46 + (2 + zc * ne) * z + (ne - 3) * core)
        c = np.select([ne == 0, ne == 1, ne == 2], [20 + (1 if z else 2), 31 + (1 if z else 2), 40 + (1 if z else 2)],
                      (37 if z else 38) + (ne - 3) * core)
        nc = np.select([ne == 0, ne == 1, ne == 2], [24, 39 + (2 + zc) * z, 40 + (2 + zc * 2) * z],
                       41 + (2 + zc * ne) * z + (ne - 3) * core)
        return np.where(common, c - 7, nc)            # conv1x1WorkerRetentionSavings: 7
    inner_z, inner_nz = W * worker(1), W * worker(0)
    rs1, rs2 = (np.where(common, 7, 0), np.where(common, 3, 0)) if not fa else (0, 0)
    loads = units * WEIGHTS_PER_CONV_UNIT[in_name] * (4 if fa else 2) // CONV_UNIT_COEFF_LOAD_BYTES_PER_CYCLE
    c = common.astype(np.int64)
    return (AMP_1X1_SUPERVISOR_OVERHEAD + W * (rs1 + rs2 * (nig * groups - 1))
            + groups * (12 + c + (nig - 1) * (15 - c + 1 + nog * (19 + 6 + loads + inner_nz))
                        + (10 + 1 + nog * (19 - c + 7 + loads + inner_z))))


def amp_nx1_cycles(P, nig, nog, groups, units, taps, kernel_outer, ocpg, in_name: str, float_partials: bool, W: int,
                   partials_vector_width: int):
    """Tile cycles of one ``ConvPartialnx1`` vertex (``getConvPartialnx1SupervisorCycleEstimate``
    with one worklist entry per worker and kernel element), plus zeroing its partials
    (``getZeroSupervisorVertexCycleEstimate``)."""
    fa = in_name == "float"
    core = AMP_CORE_CYCLES[in_name]
    ne = _ceil(P, W)
    loads = units * WEIGHTS_PER_CONV_UNIT[in_name] * (4 if fa else 2) // CONV_UNIT_COEFF_LOAD_BYTES_PER_CYCLE
    worker = 17 + (0 if float_partials else 1) + 3 + np.select(
        [ne == 0, ne == 1, ne == 2], [17, 33 if fa else 29, 44 if fa else 33],
        (45 if fa else 34) + (ne - 3) * core) - 9        # convnx1WorkerRetentionSavings = 9
    innermost = loads + 15                               # filterHeight 1
    inner = kernel_outer * 15 + taps * (20 + innermost + W * worker)
    zero = groups * nog * W * (_ceil(ne * ocpg, partials_vector_width) + 5)
    return (AMP_NX1_OVERHEAD + W * 9 + W * 10 + groups * (nog * 17 + (nog - 1) * 6 + 1) + (groups - 1) * 6 + 1
            + groups * (16 + nig * (14 + nog * (14 + inner))) + zero)


def hmac_cycles(P, ci, co, groups, taps, in_name: str, float_partials: bool, W: int, vector_width: int):
    """Tile cycles of one ``ConvPartialHorizontalMac`` vertex
    (``getConvPartialHorizontalMacSupervisorCycleEstimate``): all of the tile's input channels in
    one group, one (float partials) or two (half partials) output channels per dot-product pass."""
    ne = _ceil(P, W)
    per_pass = 1 if float_partials else 2
    nog = _ceil(co, per_pass)
    dot = 3 * per_pass + (0 if float_partials else 1) + 3 + 1 + _ceil(ci, vector_width)
    worker = 16 + taps * (16 + 19 + ne * (7 + per_pass * dot))
    return HMAC_OVERHEAD[in_name] + W * 10 + groups * (23 + (15 + nog * (10 + W * worker)))


# --------------------------------------------------------------------------------------------
# the planner
# --------------------------------------------------------------------------------------------
def _variants(target, in_type, partials_type):
    """(method, conv units, float partials) the target offers for these types."""
    in_name = in_type.name
    if in_name not in WEIGHTS_PER_CONV_UNIT:
        raise poplibs_error(f"poplin: input type {in_type} is not supported (use half, float or quarter)")
    fp = in_name == "float" or partials_type.name == "float"
    macs = target.getAmpMacsPerCycle(in_type, poplar.FLOAT if fp else poplar.HALF)
    units = macs * AMP_CORE_CYCLES[in_name] // WEIGHTS_PER_CONV_UNIT[in_name]
    out = []
    if units > 0:
        out.append(("AMP", units, fp))
        if units > 8:                       # "On IPU2 we need to enable 8 engines config as well"
            out.append(("AMP", 8, fp))
    out.append(("HMAC", 0, fp))
    return out


def _evaluate(pb: Problem, c: dict, method, units, fp, in_type, out_type, target, W):
    """Estimates for candidate arrays ``c`` (dict of int arrays). Returns (cycles, compute,
    exchange, reduce, temp, icpg, ocpg)."""
    in_name = in_type.name
    isz, psz = in_type.size, 4 if fp else 2
    vwp = 2 if fp else 4
    epc = target.getExchangeBytesPerCycle()
    sync = cal.INTERNAL_SYNC_CYCLES + target.spec.min_ipu_sync_delay
    gB = _ceil(pb.G, c["gs"])
    nB = _ceil(pb.N, c["bs"])
    fB = _ceil(pb.out_rows, c["fs"])
    ciB = _ceil(pb.Ci, c["ics"])
    coB = _ceil(pb.Co, c["ocs"])
    coS = _ceil(coB, c["so"])
    steps = c["so"]
    P = nB * fB * pb.out_rest
    Pw = np.maximum(1, np.ceil(P * pb.density).astype(np.int64))
    if method == "AMP":
        wpcu = WEIGHTS_PER_CONV_UNIT[in_name]
        allowed = [a for a in (wpcu // 4, wpcu // 2, wpcu) if a * isz * 8 % 64 == 0]
        icpg = np.full(ciB.shape, allowed[-1], np.int64)
        for a in reversed(allowed[:-1]):
            icpg = np.where(ciB <= a, a, icpg)
        ocpg = np.full(ciB.shape, units, np.int64)
        nig, nog = _ceil(ciB, icpg), _ceil(coS, ocpg)
        if pb.taps == 1:
            comp = amp_1x1_cycles(Pw, nig, nog, gB, units, in_name, fp, W)
        else:
            comp = amp_nx1_cycles(Pw, nig, nog, gB, units, pb.taps, pb.kernel_outer, ocpg, in_name, fp, W, vwp)
    else:
        icpg, ocpg = ciB, np.full(ciB.shape, 1 if fp else 2, np.int64)
        taps_eff = max(1, int(math.ceil(pb.taps * pb.density)))
        comp = hmac_cycles(P, ciB, coS, gB, taps_eff, in_name, fp, W, target.getVectorWidth(in_type))
    comp = comp + cal.COMPUTE_SET_LAUNCH_CYCLES
    # exchange of the input and weight blocks a tile does not hold
    rows_in = np.minimum(pb.in_rows, np.ceil(fB * pb.rows_per_out + pb.halo_rows)).astype(np.int64)
    in_blk = gB * nB * ciB * rows_in * pb.in_rest
    w_blk = gB * coS * ciB * pb.taps
    in_recv = in_blk * (1.0 - 1.0 / c["ocs"]) * isz
    # PopLibs ExchangeEstimator: with an even output-channel split the two tiles of a supertile
    # read the same input block and receive it in the same cycles: twice the bytes per cycle
    in_recv = in_recv * np.where(c["ocs"] % target.getTilesPerSharedExchangeBus() == 0, 0.5, 1.0)
    w_recv = w_blk * (1.0 - 1.0 / (c["bs"] * c["fs"])) * isz
    recv = in_recv + w_recv
    exch = np.where(recv > 0, np.ceil(recv / epc) + cal.EXCHANGE_PHASE_OVERHEAD_CYCLES + sync, 0.0) + sync
    # reduction of partials across the input-channel split
    split = c["ics"] > 1
    part_elems = gB * nB * fB * pb.out_rest * coS
    outs = _ceil(part_elems, c["ics"])
    red_recv = np.where(split, outs * (c["ics"] - 1) * psz, 0)
    red_comp = conv_reduce_cycles(outs, c["ics"], out_type.name == "float", fp, W, target.getDataPathWidth(),
                                  target.getBytesPerTile()) + cal.COMPUTE_SET_LAUNCH_CYCLES
    red = np.where(split, np.ceil(red_recv / epc) + cal.EXCHANGE_PHASE_OVERHEAD_CYCLES + 3 * sync + red_comp, 0.0)
    partial_bytes = np.where(split, part_elems * psz, 0)
    # the vertices read the tile's whole input and weight blocks: count them as temporaries
    # (the part already local is a conservative overcount, as if rearranged into a work buffer)
    temp = np.maximum((in_blk + w_blk) * isz + partial_bytes, partial_bytes + red_recv)
    # a serial split is a loop (core._serial_loop): each step copies the tile's share of the
    # weights' slice into a buffer (dynamicSlice) and its share of the slice's output out of one
    # (dynamicUpdate), both on the tile; the two buffers live during the loop
    loop = steps > 1
    slice_elems = np.where(loop, _ceil(w_blk, c["bs"] * c["fs"]), 0)
    out_elems = _ceil(part_elems, c["ics"])
    copies = (_copy_cycles(slice_elems, in_type, target, W) + _copy_cycles(out_elems, out_type, target, W)
              + 2 * (cal.COMPUTE_SET_LAUNCH_CYCLES + 2 * sync))
    temp = temp + np.where(loop, slice_elems * isz + out_elems * out_type.size, 0)
    total = steps * (comp + exch + red + np.where(loop, copies, 0))
    return total, steps * comp, steps * exch, steps * red, np.ceil(temp).astype(np.int64), icpg, ocpg


def _copy_cycles(elems, type_, target, W):
    """Tile cycles of a dynamic slice or update of ``elems`` elements of ``type_`` on one tile,
    split over the ``W`` workers (popops ``DynamicSlice2D``, one region per worker)."""
    return W * dynamic_slice_worker_cycles(1, _ceil(elems, W), 1, type_, target)


def _candidates(pb: Problem, T: int, serial: bool) -> dict:
    """Candidate splits: every parallel split (product at most ``T`` tiles), without serial
    splits; or, when ``serial``, coarser parallel splits with serial ones."""
    kw = dict(tiles=T, coarse=serial)
    c: dict = {}
    c = _cross(c, "gs", split_candidates(pb.G, T, **kw))
    c = _cross(c, "bs", split_candidates(pb.N, T, **kw), T, ("gs", "bs"))
    c = _cross(c, "fs", split_candidates(pb.out_rows, T, **kw), T, ("gs", "bs", "fs"))
    c = _cross(c, "ics", split_candidates(pb.Ci, T, (16, 8), **kw), T, ("gs", "bs", "fs", "ics"))
    c = _cross(c, "ocs", split_candidates(pb.Co, T, (16, 8), **kw), T, ("gs", "bs", "fs", "ics", "ocs"))
    if not serial:
        c["so"] = np.ones_like(c["gs"])
        return c
    ser = np.array(SERIAL_SPLITS, np.int64)
    c = _cross(c, "so", ser[ser <= max(1, pb.Co)])
    # a serial split must cut every parallel block into equal slices (PopLibs: the serial split
    # divides the channels evenly), so that one loop body serves every step
    keep = (c["so"] > 1) & (pb.Co % (c["ocs"] * c["so"]) == 0)
    return {k: v[keep] for k, v in c.items()}


def plan_problem(pb: Problem, in_type, partials_type, out_type, target, opts: PlanOptions, op_desc: str,
                 cache: PlanningCache | None = None) -> ConvPlan:
    """The cheapest plan for ``pb`` whose temporary memory fits the budget (see module doc).

    When none fits ``availableMemoryProportion x bytesPerTile`` it warns through Poplar's logger
    and returns the plan with the least temporary memory (its ``temp_bytes`` over
    ``budget_bytes``), as PopLibs does.

    Raises:
        poplibs_error: the problem has no candidate plan at all (an empty problem).
    """
    cache = _DEFAULT_CACHE if cache is None else cache
    in_type, partials_type, out_type = as_type(in_type), as_type(partials_type), as_type(out_type)
    if in_type.name == "float":
        partials_type = poplar.FLOAT
    key = (pb, in_type.name, partials_type.name, out_type.name, opts.key(), target.spec)
    hit = cache.plans.get(key)
    if hit is not None:
        _note_over_budget(hit, op_desc)
        return hit
    T = target.getNumTiles()
    W = target.getNumWorkerContexts()
    budget = opts.available_memory_proportion * target.getBytesPerTile()
    minimise_memory = opts.available_memory_proportion == 0
    best, least = None, None       # least: (temp bytes, cycles, plan) of the least-memory plan
    for serial in (False, True):
        c = _candidates(pb, T, serial)
        if c["gs"].size == 0:
            continue
        for method, units, fp in _variants(target, in_type, partials_type):
            total, comp, exch, red, temp, icpg, ocpg = _evaluate(pb, c, method, units, fp, in_type, out_type, target, W)
            if minimise_memory:
                score = temp.astype(np.float64) * 1e12 + total
                ok = np.ones(temp.shape, bool)
            else:
                score = total
                ok = temp <= budget
            lo = temp.min()
            j = int(np.flatnonzero(temp == lo)[np.argmin(total[temp == lo])])   # fastest of the least
            if least is None or (int(temp[j]), float(total[j])) < least[:2]:
                least = (int(temp[j]), float(total[j]), ConvPlan(
                    method, units, int(icpg[j]), int(ocpg[j]), int(c["gs"][j]), int(c["bs"][j]), int(c["fs"][j]),
                    int(c["ics"][j]), int(c["ocs"][j]), int(c["so"][j]), float(total[j]),
                    float(comp[j]), float(exch[j]), float(red[j]), int(temp[j]), int(budget)))
            if ok.any():
                i = int(np.flatnonzero(ok)[np.argmin(score[ok])])
                if best is None or score[i] < best[0]:
                    best = (float(score[i]), ConvPlan(
                        method, units, int(icpg[i]), int(ocpg[i]), int(c["gs"][i]), int(c["bs"][i]), int(c["fs"][i]),
                        int(c["ics"][i]), int(c["ocs"][i]), int(c["so"][i]), float(total[i]),
                        float(comp[i]), float(exch[i]), float(red[i]), int(temp[i]), int(budget)))
        if best is not None and not minimise_memory:
            break
    if best is None:
        if least is None:
            raise poplibs_error(f"{op_desc}: the planner found no candidate plan")
        get_logger("poplin").warning(
            f"{op_desc}: convolution planner unable to meet memory target. The plan using least temporary memory "
            f"needs {least[0]:,} bytes per tile, but availableMemoryProportion {opts.available_memory_proportion:g} "
            f"of {target.getBytesPerTile():,} bytes per tile allows {int(budget):,} bytes; using it anyway, so the "
            f"graph may not fit in tile memory. Raise availableMemoryProportion, lower the batch size, or use more "
            f"IPUs.")
        best = (0.0, least[2])
    plan = best[1]
    cache.plans[key] = plan
    _note_over_budget(plan, op_desc)
    return plan


def plan_convolution(params: ConvParams, target, options=None, cache: PlanningCache | None = None,
                     op: str = "convolution", out_type=None) -> ConvPlan:
    """Plan a convolution (``poplin::preplanConvolution`` in spirit). See :func:`plan_problem`."""
    opts = parse_options(options, op)
    pb = Problem.from_params(params)
    desc = f"{op} {params}"
    return plan_problem(pb, params.inputType, opts.partials_type, out_type or params.outputType, target, opts,
                        desc, cache)


def plan_matmul(groups: int, m: int, k: int, n: int, in_type, target, options=None, cache=None,
                op: str = "matMul", out_type=None) -> ConvPlan:
    """Plan ``[groups][m][k] x [groups][k][n]`` (a conv with batch m, k in and n out channels)."""
    opts = parse_options(options, op)
    pb = Problem(groups, m, k, n, 1, 1, 1, 1, 1.0, 0.0, 1, 1, 1.0)
    shape = (f"[{groups}x{m}x{k}] x [{groups}x{k}x{n}]" if groups > 1 else f"[{m}x{k}] x [{k}x{n}]")
    desc = f"{op} {shape} ({as_type(in_type)} inputs, {opts.partials_type} partials)"
    return plan_problem(pb, in_type, opts.partials_type, out_type or in_type, target, opts, desc, cache)
