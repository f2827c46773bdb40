"""PopTorch's enums (``poptorch/enums.py``; ``research/poptorch.md`` 1.5). ``ReductionType`` and
``MeanReductionStrategy`` are PopART's."""

from __future__ import annotations

import enum

from openipu.popart.options import MeanReductionStrategy, ReductionType  # noqa: F401  (re-exported)


class OutputMode(enum.IntEnum):
    """What a call returns of the ``deviceIterations`` (x replicas x accumulation) results."""

    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


#: PopTorch's name for ``OutputMode`` before 2.5 (deprecated in 2.4, removed in 2.5, research/poptorch.md
#: 1.5): the same members, kept so that scripts written for older SDKs run
AnchorMode = OutputMode


class DataLoaderMode(enum.IntEnum):
    Sync = 0
    Async = 1
    AsyncRebatched = 2


class SharingStrategy(enum.IntEnum):
    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class ConnectionType(enum.IntEnum):
    Always = 0
    OnDemand = 1
    Never = 2


class SyncPattern(enum.IntEnum):
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class HalfFloatCastingBehavior(enum.IntEnum):
    FloatDowncastToHalf = 0
    HalfUpcastToFloat = 1


class MatMulSerializationMode(enum.Enum):
    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


class Liveness(enum.IntEnum):
    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class OverlapMode(enum.Enum):
    NoOverlap = "no_overlap"
    OverlapAccumulationLoop = "overlap_accumulation_loop"
    OverlapDeviceIterationLoop = "overlap_device_iteration_loop"


class AutoStage(enum.IntEnum):
    """How ``PipelinedExecution`` numbers the stages of blocks not given one."""

    SameAsIpu = 0
    AutoIncrement = 1


class MultiConvPlanType(enum.IntEnum):
    Parallel = 0
    Serial = 1


class CommGroupType(enum.IntEnum):
    All = 0
    Consecutive = 1
    Orthogonal = 2
    NoGrouping = 3


class VariableRetrievalMode(enum.IntEnum):
    OnePerGroup = 0
    AllReplicas = 2     # PopTorch's value (PopART's AllReplicas)
