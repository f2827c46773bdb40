"""``ipu.gradient_accumulation``: how accumulated gradients are reduced (Graphcore TF2 API)."""

import enum


class GradientAccumulationReductionMethod(enum.Enum):
    """``SUM`` (default), ``MEAN``, ``RUNNING_MEAN``; ``parse`` takes the enum, its name or value."""

    SUM = 0
    MEAN = 1
    RUNNING_MEAN = 2

    @classmethod
    def parse(cls, value) -> "GradientAccumulationReductionMethod":
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        if isinstance(value, int):
            return cls(value)
        raise ValueError(f"Cannot parse {value!r} as one of GradientAccumulationReductionMethod's values: "
                         f"{', '.join(cls.__members__)}")
