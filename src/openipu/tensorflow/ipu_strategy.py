"""``ipu.ipu_strategy.IPUStrategy``: the distribution strategy that targets the simulated IPU.

Variables created in ``scope()`` live on the host CPU (TensorFlow has no IPU device here); Keras
models built in the scope run ``fit`` / ``evaluate`` / ``predict`` as PopART programs on the
simulated IPU (:mod:`.keras_extensions`). ``run(fn)`` runs a ``tf.function`` once, as replica 0.
"""

import tensorflow as tf


class IPUStrategyV1(tf.distribute.OneDeviceStrategy):
    """``IPUStrategyV1(ipu_device="/device:IPU:0", cpu_device="/device:CPU:0",
    enable_dataset_iterators=True, enable_keras_extensions=True)`` (Graphcore TF2 API).

    ``enable_keras_extensions=False`` leaves Keras models built in the scope to stock Keras (CPU).
    """

    def __init__(self, ipu_device="/device:IPU:0", cpu_device="/device:CPU:0", enable_dataset_iterators=True,
                 enable_keras_extensions=True):
        super().__init__("/cpu:0")
        self._ipu_device = ipu_device
        self._cpu_device = cpu_device
        self._enable_dataset_iterators = enable_dataset_iterators
        self._enable_keras_extensions = enable_keras_extensions
        self._pipeline_stage = None
        try:
            self._device_ordinal = int(str(ipu_device).rsplit(":", 1)[-1])
        except ValueError:
            self._device_ordinal = 0

    def run(self, fn, args=(), kwargs=None, options=None):
        """Run ``fn(*args, **kwargs)`` once as replica 0. Eagerly, ``fn`` must be a
        ``tf.function`` or a ``ConcreteFunction``: Graphcore's ``ValueError`` otherwise."""
        if tf.executing_eagerly() and not _is_tf_function(fn):
            raise ValueError("IPUStrategyV1.run(fn, ...) does not support eager execution. Either convert `fn` into "
                             "a tf.function or consider calling strategy.run inside a tf.function.")
        return super().run(fn, args=args, kwargs=kwargs, options=options)

    def experimental_run_v2(self, fn, args=(), kwargs=None, options=None):
        raise RuntimeError("`experimental_run_v2` has been renamed to `run`.")


def _is_tf_function(fn) -> bool:
    from tensorflow.python.eager.polymorphic_function import polymorphic_function
    return isinstance(fn, (polymorphic_function.Function, tf.types.experimental.ConcreteFunction)) or \
        hasattr(fn, "get_concrete_function")


IPUStrategy = IPUStrategyV1
