"""``popart.SessionOptions``, its enums and settings structs, ``Patterns`` and ``InputShapeInfo``.

Every field of PopART's ``SessionOptions`` (``research/popart.md`` section 1.10) exists with
PopART's default. Inference sessions honour: ``enableReplicatedGraphs`` /
``replicatedGraphCount``, ``virtualGraphMode`` (Off, Manual), ``constantWeights``,
``engineOptions`` (passed to the Poplar Engine), ``partialsTypeMatMuls``,
``enableSupportedDataTypeCasting``, ``enableStochasticRounding`` and ``enableFloatingPointChecks``
(honoured by the IR executor: :mod:`openipu.popart.fp_behaviour`; not by the device-storage
emulation), ``compileEngine``, ``syntheticDataMode`` (inputs filled on the device, anchors not returned); the rest
are stored and ignored. Setting an unknown field raises
``AttributeError``, as PopART's pybind object does.
"""

from __future__ import annotations

import copy

from openipu.popart.errors import popart_exception


class _Member(str):
    """An enum value: its name (a ``str``, so ``RecomputationType.Standard == "Standard"``) and
    its C++ integer value (``int(popart.RecomputationType.Pipeline) == 3``, as PopART's examples
    pass it to ``opts._Popart.set``)."""

    def __new__(cls, name: str, value: int):
        m = super().__new__(cls, name)
        m._value = value
        m._enum = None          # the enum class, set by _enum()
        return m

    def __int__(self):
        if self._value is None:
            raise TypeError(f"popart enum value {str(self)!r} has no integer value here; use it by name")
        return self._value

    def __reduce__(self):
        return _Member, (str(self), self._value)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class _Enum:
    """Base for PopART's enums: class attributes whose values are their own names."""

    @classmethod
    def names(cls):
        return [k for k in vars(cls) if not k.startswith("_") and k not in ("names", "member")]

    @classmethod
    def member(cls, v) -> str:
        """The member name of ``v``: a member, its name (``"Pipeline"``, ``"RecomputationType.Pipeline"``)
        or its C++ integer value. Raises ``popart_exception`` otherwise."""
        names = cls.names()
        if isinstance(v, int) and not isinstance(v, bool):
            for n in names:
                if getattr(cls, n)._value == v:
                    return n
        elif str(v).split(".")[-1] in names:
            return str(v).split(".")[-1]
        values = [getattr(cls, n)._value for n in names]
        also = f" (or their values {', '.join(map(str, values))})" if None not in values else ""
        raise popart_exception(f"Unknown {cls.__name__} {v!r}: expected one of {', '.join(names)}{also}")


def _enum(name, members, values=None):
    """An enum class of ``members``; ``values``: their C++ integer values, where checked against
    PopART's headers (default: none, the members are used by name)."""
    values = [None] * len(members) if values is None else values
    cls = type(name, (_Enum,), {m: _Member(m, v) for m, v in zip(members, values)})
    for m in members:
        getattr(cls, m)._enum = cls
    return cls


def set_session_option(opts, key: str, value) -> None:
    """``setattr(opts, key, value)`` as PopTorch's ``Options._Popart.set(key, value)`` does it:
    ``key`` may name a field of a settings struct (``"accumulateOuterFragmentSettings.schedule"``),
    and an integer given for an enum field becomes that enum's member (PopART's C++ value, e.g.
    ``int(popart.AccumulateOuterFragmentSchedule.OverlapMemoryOptimized)`` = 3). Raises
    ``AttributeError`` for an unknown option or field and ``popart_exception`` for an integer
    that is not a value of the field's enum."""
    target, field = opts, key
    if "." in key:
        head, field = key.split(".", 1)
        target = getattr(opts, head)
        if not isinstance(target, _Struct) or "." in field:
            raise AttributeError(f"'{head}' is not a settings struct with a field '{field}'")
    current = getattr(target, field)
    enum = getattr(current, "_enum", None)
    if enum is not None and isinstance(value, int) and not isinstance(value, bool):
        value = getattr(enum, enum.member(value))
    setattr(target, field, value)


VirtualGraphMode = _enum("VirtualGraphMode", ["Off", "Manual", "Auto", "ExecutionPhases"])
#: C++ ``popart::RecomputationType``: None = 0, Standard, NormOnly, Pipeline, RecomputeAll
RecomputationType = _enum("RecomputationType", ["NoRecompute", "Standard", "NormOnly", "RecomputeAll", "Pipeline"],
                          [0, 1, 2, 4, 3])
RecomputeType = _enum("RecomputeType", ["Undefined", "Checkpoint", "Recompute", "Recomputed"])
MergeVarUpdateType = _enum("MergeVarUpdateType", ["Off", "All", "AutoTight", "AutoLoose"])
ReductionType = _enum("ReductionType", ["Mean", "NoReduction", "Sum"])
MeanReductionStrategy = _enum("MeanReductionStrategy", ["Running", "Post", "PostAndLoss"])
TensorStorage = _enum("TensorStorage", ["OnChip", "OffChip"])
ReplicatedTensorSharding = _enum("ReplicatedTensorSharding", ["Off", "On"])
ReplicatedStreamMode = _enum("ReplicatedStreamMode", ["Replicate", "Broadcast"])
ExecutionPhaseIOSchedule = _enum("ExecutionPhaseIOSchedule", ["Preload", "OnDemand"])
ExecutionPhaseSchedule = _enum("ExecutionPhaseSchedule", ["Interleaving", "Batch", "BatchClusteredIO"])
BatchSerializationMethod = _enum("BatchSerializationMethod", ["UnrollDynamic", "UnrollStatic", "Loop"])
BatchSerializationTransformContext = _enum("BatchSerializationTransformContext", ["Fwd", "Bwd"])
BatchSerializationBatchSchedule = _enum("BatchSerializationBatchSchedule",
                                        ["Scheduler", "Isomorphic", "OverlapOnIo", "OverlapOnCompute"])
PatternsLevel = _enum("PatternsLevel", ["All", "Default", "Minimal", "NoPatterns"])
#: C++ values from PopART's sessionoptions.hpp (Graphcore's applications pass ``int(...)`` to ``_Popart.set``)
SyntheticDataMode = _enum("SyntheticDataMode", ["Off", "Zeros", "RandomNormal", "RandomUniform"], [0, 1, 2, 3])
Instrumentation = _enum("Instrumentation", ["Outer", "Inner"])
SubgraphCopyingStrategy = _enum("SubgraphCopyingStrategy", ["OnEnterAndExit", "JustInTime"], [0, 1])
AccumulateOuterFragmentSchedule = _enum("AccumulateOuterFragmentSchedule",
                                        ["Scheduler", "Serial", "OverlapCycleOptimized", "OverlapMemoryOptimized"],
                                        [0, 1, 2, 3])
SyncPattern = _enum("SyncPattern", ["Full", "SinglePipeline", "ReplicaAndLadder"])
InitType = _enum("InitType", ["NoInit", "Zero"])
ScatterReduction = _enum("ScatterReduction", ["Sum", "Max", "Min", "Mul", "NoReduction"])
CollectiveOperator = _enum("CollectiveOperator", ["Add", "Mean", "Mul", "Min", "Max", "LogicalAnd", "LogicalOr",
                                                  "SquareAdd", "Local"])
TensorRemapType = _enum("TensorRemapType", ["FwdBwdReverse", "FwdBwd", "Fwd"])
VariableRetrievalMode = _enum("VariableRetrievalMode", ["OnePerGroup", "AllReduceReplicas", "AllReplicas"], [0, 1, 2])
#: C++ ``popart::CommGroupType``: All = 0, Consecutive, Orthogonal, None (Python ``Ungrouped``)
CommGroupType = _enum("CommGroupType", ["All", "Consecutive", "Orthogonal", "Ungrouped"], [0, 1, 2, 3])
GradientTensorTrackingMethod = _enum("GradientTensorTrackingMethod",
                                     ["AllNonViewChangingGradientTensors", "ConvAndMatmulGradients",
                                      "GradientsOfUserSpecifiedTensors"])
AutodiffStitchStrategy = _enum("AutodiffStitchStrategy",
                               ["RecomputeMinimal", "RecomputeAllNonInputs", "AddFwdOutputs", "SafeAddFwdOutputs"])
DotCheck = _enum("DotCheck", ["Fwd0", "Fwd1", "Bwd0", "PreAlias", "Final", "All"])
IrSerializationFormat = _enum("IrSerializationFormat", ["JSON"])


class _Struct:
    """A settings struct: keyword constructor over its defaults; unknown fields raise."""

    _defaults: dict = {}

    def __init__(self, *args, **kwargs):
        for k, v in self._defaults.items():
            object.__setattr__(self, k, copy.deepcopy(v))
        for k, v in zip(self._defaults, args):
            setattr(self, k, v)
        for k, v in kwargs.items():
            setattr(self, k, v)

    def __setattr__(self, k, v):
        if k not in self._defaults:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{k}'")
        object.__setattr__(self, k, v)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self._defaults)})"


def _struct(name, defaults):
    return type(name, (_Struct,), {"_defaults": defaults})


class TensorLocation(_Struct):
    """``popart.TensorLocation``: PopART's constructors ``()``, ``(storage)``, ``(storage,
    replicatedTensorSharding[, shardingDomain])`` and ``(storage, loadTileSet, storageTileSet[,
    replicatedTensorSharding[, shardingDomain]])`` (positional or by name). ``shardingDomain``
    (a ``popart.CommGroup``; None = all replicas) is the replicas a sharded tensor is spread
    over."""

    _defaults = {"storage": TensorStorage.OnChip, "loadTileSet": "Compute", "storageTileSet": "Compute",
                 "replicatedTensorSharding": ReplicatedTensorSharding.Off, "shardingDomain": None}

    def __init__(self, *args, **kwargs):
        if len(args) >= 2 and str(args[1]).split(".")[-1] in ("On", "Off"):     # (storage, rts[, domain])
            names = ("storage", "replicatedTensorSharding", "shardingDomain")
            if len(args) > 3:
                raise TypeError("TensorLocation(storage, replicatedTensorSharding, shardingDomain) takes at most 3 "
                                "positional arguments")
            kwargs = {**dict(zip(names, args)), **kwargs}
            args = ()
        super().__init__(*args, **kwargs)


TensorLocationSettings = _struct("TensorLocationSettings", {
    "location": TensorLocation(), "minElementsForOffChip": 2, "minElementsForReplicatedTensorSharding": 8192})
BatchSerializationSettings = _struct("BatchSerializationSettings", {
    "factor": 0, "concatOnVirtualGraphChange": True, "concatOnExecutionPhaseChange": True,
    "concatOnPipelineStageChange": True, "transformContext": BatchSerializationTransformContext.Fwd,
    "method": BatchSerializationMethod.UnrollDynamic, "batchSchedule": BatchSerializationBatchSchedule.Isomorphic})
ExecutionPhaseSettings = _struct("ExecutionPhaseSettings", {
    "phases": 0, "stages": 2, "weightIOSchedule": ExecutionPhaseIOSchedule.Preload,
    "activationIOSchedule": ExecutionPhaseIOSchedule.Preload,
    "optimizerStateIOSchedule": ExecutionPhaseIOSchedule.OnDemand,
    "accumulatorIOSchedule": ExecutionPhaseIOSchedule.Preload, "schedule": ExecutionPhaseSchedule.Interleaving})
AccumulateOuterFragmentSettings = _struct("AccumulateOuterFragmentSettings", {
    "schedule": AccumulateOuterFragmentSchedule.Serial, "excludedVirtualGraphs": []})
AutomaticLossScalingSettings = _struct("AutomaticLossScalingSettings", {
    "enabled": False, "toTrackTensors": None, "binEdgeLocation": 0.125, "thresholdUpperCountProportion": 1e-7,
    "updatePeriod": 1, "gradientTensorTrackingMethod": GradientTensorTrackingMethod.AllNonViewChangingGradientTensors})
ReplicatedCollectivesSettings = _struct("ReplicatedCollectivesSettings", {
    "prepareScheduleForMergingCollectives": False, "mergeAllReduceCollectives": False,
    "mergeReduceScatterCollectives": False, "mergeAllGatherCollectives": False})
AutodiffSettings = _struct("AutodiffSettings", {"stitchStrategy": AutodiffStitchStrategy.RecomputeAllNonInputs})
DeveloperSettings = _struct("DeveloperSettings", {"timePartitionLoggerThresholdPercentage": 1.0})
ExperimentalSettings = _struct("ExperimentalSettings", {"customTransformApplierSettings": {}})

#: SessionOptions fields and PopART's defaults (``sessionoptions.hpp``).
SESSION_OPTION_DEFAULTS = {
    "virtualGraphMode": VirtualGraphMode.Off, "virtualGraphSplitRatios": [],
    "enablePipelining": False,
    "enableReplicatedGraphs": False, "replicatedGraphCount": 1,
    "enableDistributedReplicatedGraphs": False, "globalReplicationFactor": 1, "globalReplicaOffset": 0,
    "enableGradientAccumulation": False, "accumulationFactor": 1,
    "accumulationAndReplicationReductionType": ReductionType.Sum,
    "meanAccumulationAndReplicationReductionStrategy": MeanReductionStrategy.Post,
    "autoRecomputation": RecomputationType.NoRecompute, "explicitRecomputation": False,
    "enableOutlining": True, "outlineThreshold": 1.0, "outlineSequenceBreakCost": 10000.0,
    "enableOutliningCopyCostPruning": True, "subgraphCopyingStrategy": SubgraphCopyingStrategy.OnEnterAndExit,
    "enableStochasticRounding": False, "enableFloatingPointChecks": False,
    "enableEngineCaching": False, "cachePath": "session_cache", "enableVariablesCaching": True,
    "engineOptions": {}, "reportOptions": {}, "convolutionOptions": {}, "lstmOptions": {}, "matmulOptions": {},
    "gclOptions": {}, "partialsTypeMatMuls": "",
    "batchSerializationSettings": BatchSerializationSettings(),
    "executionPhaseSettings": ExecutionPhaseSettings(),
    "weightTensorLocationSettings": TensorLocationSettings(),
    "activationTensorLocationSettings": TensorLocationSettings(),
    "optimizerStateTensorLocationSettings": TensorLocationSettings(),
    "accumulatorTensorLocationSettings": TensorLocationSettings(),
    "tensorLocationSettingsOverride": {},
    "numIOTiles": 0,
    "instrumentWithHardwareCycleCounter": False, "hardwareInstrumentations": {Instrumentation.Outer},
    "logDir": "", "syntheticDataMode": SyntheticDataMode.Off, "constantWeights": True, "compileEngine": True,
    "enableNonStableSoftmax": False, "enableStableNorm": False,
    "mergeVarUpdate": MergeVarUpdateType.Off, "mergeVarUpdateMemThreshold": 1000000,
    "looseThresholdAtPeak": 8000, "decomposeGradSum": False, "delayVarUpdates": True,
    "enableFullyConnectedPass": True, "enableSerializedMatmuls": True,
    "defaultBufferingDepth": 1, "bufferingDepthMap": {}, "enablePrefetchDatastreams": True,
    "rearrangeAnchorsOnHost": True, "rearrangeStreamsOnHost": False,
    "automaticLossScalingSettings": AutomaticLossScalingSettings(),
    "replicatedCollectivesSettings": ReplicatedCollectivesSettings(),
    "accumulateOuterFragmentSettings": AccumulateOuterFragmentSettings(),
    "autodiffSettings": AutodiffSettings(), "developerSettings": DeveloperSettings(),
    "experimentalSettings": ExperimentalSettings(),
    "useHostCopyOps": False, "enableExplicitMainLoops": False, "aliasZeroCopy": False, "groupHostSync": False,
    "strictOpVersions": True, "opxAliasChecking": False, "opxModifyChecking": False,
    "enableLoadAndOffloadRNGState": False, "enableSupportedDataTypeCasting": True,
    "ensureFp32LossScaleTensor": False, "enableMergeExchange": True, "dotChecks": set(), "firstDotOp": 0,
    "finalDotOp": 10000, "dotOpNames": False, "exportPoplarComputationGraph": False,
    "exportPoplarVertexGraph": False, "kahnTieBreaker": "greedy", "timeLimitScheduler": 1e9,
    "swapLimitScheduler": 1000000000, "serializedPoprithmsShiftGraphsDir": "", "customCodelets": [],
    "customCodeletCompileFlags": "", "updatableNamedBuffers": [], "disableGradAccumulationTensorStreams": False,
    "disableOptimizerStateTensorStreams": False, "createImplicitPipeliningFwdOnlyProgram": False,
    "throwIfLog2ScaleTensorNotInRange": True, "enableInplaceAmbiguityChecking": False,
    "scheduleNonWeightUpdateGradientConsumersEarly": False, "groupNormStridedChannelGrouping": False,
    "compilationProgressLogger": None, "compilationProgressTotal": 100,
    "prefetchBufferingDepthMap": {}, "defaultPrefetchBufferingDepth": 1,
    # accepted, with PopART's defaults; they steer PopART's dot output, scheduler, constant
    # folding, outlining and inference-pipeline stashing, none of which changes a result here
    "separateCallOpPdfs": True, "_enableRngStateManagement": False, "transitiveClosureOptimizationThreshold": 100000,
    "serializedPoprithmsAnnealGraphsDir": "", "enableEfficientOverlapIOTopoCons": False,
    "enableConstantFoldingOfMultipleConsumers": True, "useLoopCandidateCreator": False,
    "stashAllTensorsInferencePipeline": False,
}


class SessionOptions:
    """``popart.SessionOptions()``: every PopART field with its default (see module docstring).

    Map-valued fields (``engineOptions`` ...) are plain dicts, so ``opts.engineOptions["k"] = "v"``
    persists as in PopART. ``enableExplicitIR(bool)`` sets the three explicit-IR flags.
    """

    def __init__(self):
        for k, v in SESSION_OPTION_DEFAULTS.items():
            object.__setattr__(self, k, copy.deepcopy(v))

    def __setattr__(self, k, v):
        if k not in SESSION_OPTION_DEFAULTS:
            raise AttributeError(f"'popart_core.SessionOptions' object has no attribute '{k}'")
        object.__setattr__(self, k, v)

    def enableExplicitIR(self, enable: bool) -> None:  # noqa: N802
        self.useHostCopyOps = self.enableExplicitMainLoops = bool(enable)

    def explicitRecomputationEnabled(self) -> bool:  # noqa: N802
        return bool(self.explicitRecomputation)

    def getGlobalReplicationFactor(self) -> int:  # noqa: N802
        return self.globalReplicationFactor if self.enableDistributedReplicatedGraphs else self.replication_factor()

    def replication_factor(self) -> int:
        """The local replication factor in effect (openipu helper)."""
        return int(self.replicatedGraphCount) if self.enableReplicatedGraphs else 1

    def accumulation_factor(self) -> int:
        return int(self.accumulationFactor) if self.enableGradientAccumulation else 1

    def __repr__(self):
        changed = {k: getattr(self, k) for k, v in SESSION_OPTION_DEFAULTS.items() if getattr(self, k) != v}
        return f"SessionOptions({changed})"


class InputShapeInfo:
    """``popart.InputShapeInfo()``: ``add(id, TensorInfo)`` fixes the shape of an ONNX input with
    symbolic or unknown dimensions."""

    def __init__(self):
        self._infos = {}

    def add(self, tid: str, info) -> None:
        self._infos[tid] = info

    def get(self, tid: str):
        return self._infos[tid]

    def has(self, tid: str) -> bool:
        return tid in self._infos

    def getInfos(self) -> dict:  # noqa: N802
        return dict(self._infos)


def __getattr__(name):
    # ``popart.options.Patterns`` (its old home): the class now lives in openipu.popart.patterns
    if name == "Patterns":
        from openipu.popart.patterns import Patterns
        return Patterns
    raise AttributeError(name)
