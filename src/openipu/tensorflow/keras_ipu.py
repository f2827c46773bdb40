"""``keras.ipu`` (Graphcore Keras wheel, SDK 2.6+): ``PipelineStage`` and friends."""

import enum

from .gradient_accumulation import GradientAccumulationReductionMethod  # noqa: F401


class ReplicatedMetricReductionMethod(enum.Enum):
    NONE = 0
    LIST = 1
    SUM = 2
    MEAN = 3


class PipelineStage:
    """``with keras.ipu.PipelineStage(n):`` tags layers built or called inside with stage ``n``.
    Raises ``RuntimeError`` outside an ``IPUStrategy`` scope or when nested and ``ValueError`` for
    a negative stage."""

    def __init__(self, stage):
        if not isinstance(stage, int) or stage < 0:
            raise ValueError("%d is not a valid pipeline stage.")
        self._stage = stage
        self._strategy = None

    def __enter__(self):
        import tensorflow as tf
        from .ipu_strategy import IPUStrategyV1
        s = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
        if not isinstance(s, IPUStrategyV1):
            raise RuntimeError("PipelineStage may only be used from within an IPUStrategy context.")
        if s._pipeline_stage is not None:
            raise RuntimeError("Pipeline stages must not be nested.")
        s._pipeline_stage = self._stage
        self._strategy = s
        return self

    def __exit__(self, *exc):
        self._strategy._pipeline_stage = None
        return False
