"""``ipu.pipelining_ops`` / ``ipu.ops.pipelining_ops``: pipeline schedules and options (enums)."""

import enum


class PipelineSchedule(enum.IntEnum):
    """``Grouped`` (default), ``Interleaved``, ``Sequential``."""

    Grouped = 0
    Interleaved = 1
    Sequential = 2


class RecomputationMode(enum.Enum):
    Auto = 0
    RecomputeThenBackpropagate = 1
    RecomputeAndBackpropagateInterleaved = 2


class PipelineStageOptions:
    """Per-stage Poplar options (``convolution_options``, ``matmul_options``, ``slice_options``),
    recorded only."""

    def __init__(self, convolution_options=None, matmul_options=None, slice_options=None):
        self.convolution_options = dict(convolution_options or {})
        self.matmul_options = dict(matmul_options or {})
        self.slice_options = dict(slice_options or {})
