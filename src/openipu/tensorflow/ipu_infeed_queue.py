"""``ipu.ipu_infeed_queue.IPUInfeedQueue``: a dataset feeding an IPU loop."""

import tensorflow as tf


class IPUInfeedQueue:
    """``IPUInfeedQueue(dataset, device_ordinal=None, prefetch_depth=None, optimise_latency=False)``.
    Raises ``ValueError`` for shapes that are not fully defined (Graphcore's text) and for a
    ``prefetch_depth`` outside 1..255."""

    def __init__(self, dataset, device_ordinal=None, prefetch_depth=None, optimise_latency=False, **kwargs):
        for s in tf.nest.flatten(dataset.element_spec):
            if not s.shape.is_fully_defined():
                raise ValueError(f"Output shape {s.shape} is not fully defined. If using tf.Dataset.batch, set "
                                 "`drop_remainder=True`.")
        if prefetch_depth is not None and not 0 < int(prefetch_depth) <= 255:
            raise ValueError("prefetch_depth must be greater than zero and smaller than 256")
        self._dataset = dataset
        self._device_ordinal = device_ordinal or 0
        self._iterator = iter(dataset)
        self._initialized = True

    @property
    def initializer(self):
        return None

    def get_next(self):
        raise ValueError("`get_next()` is not supported on an IPUInfeedQueue: pass the queue to an IPU loop "
                         "(ipu.loops.repeat(..., infeed_queue=queue)) or iterate over it.")

    def __iter__(self):
        return iter(self._dataset)

