"""``ipu.ipu_strategy.IPUStrategy``: the distribution strategy that targets the simulated IPU.

Variables created in ``scope()`` live on the host CPU (TensorFlow has no IPU device here); Keras
models built in the scope run ``fit`` / ``evaluate`` / ``predict`` as PopART programs on the
simulated IPU (:mod:`.keras_extensions`); ``run(fn)`` runs a ``tf.function`` step as a PopART
program too (:mod:`._custom_step`), or with TensorFlow on the CPU when it cannot be expressed.
"""

import logging

import numpy as np
import tensorflow as tf

logger = logging.getLogger("tensorflow.python.ipu")


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
        ``tf.function`` or a ``ConcreteFunction``: Graphcore's ``ValueError`` otherwise.

        Called eagerly with a ``tf.function``, the function is compiled once per (function,
        argument kinds) into a PopART program on the simulated IPU and each call is one
        execution (:mod:`._custom_step`: loop count, feeds, optimizer); the **predicted** IPU
        seconds of the last execution are in ``self.ipu_predicted_seconds`` (``{"execution",
        "step", "cycles"}``). A step that cannot be expressed runs with TensorFlow on the host
        CPU, with a warning naming the reason (once per function)."""
        if tf.executing_eagerly() and not _is_tf_function(fn):
            raise ValueError("IPUStrategyV1.run(fn, ...) does not support eager execution. Either convert `fn` into "
                             "a tf.function or consider calling strategy.run inside a tf.function.")
        kwargs = kwargs or {}
        if tf.executing_eagerly():
            step = self._ipu_step(fn, args, kwargs)
            if step is not None:
                out = step.run(list(args), kwargs)
                self.ipu_predicted_seconds = {"execution": step.seconds, "step": step.seconds / step.iterations,
                                              "cycles": step.cycles}
                if not step.reported:
                    step.reported = True
                    logger.info("IPUStrategy.run: %s ran on the simulated IPU, %d step%s per execution; predicted IPU "
                                "time %.4f ms per execution, %.4f ms per step (%d cycles; not host time).",
                                getattr(fn, "__name__", "the function"), step.iterations,
                                "s" if step.iterations != 1 else "", step.seconds * 1e3,
                                step.seconds * 1e3 / step.iterations, step.cycles)
                return out
        return super().run(fn, args=args, kwargs=kwargs, options=options)

    def _ipu_step(self, fn, args, kwargs):
        from . import config as _config
        from ._custom_step import CustomStep, Unsupported
        sysm = _config._system()
        key = (id(fn), sysm.num_ipus if sysm else 1) + tuple(_kind(a) for a in list(args) + sorted(kwargs.items()))
        cache = self.__dict__.setdefault("_openipu_steps", {})
        if key not in cache:
            try:
                cache[key] = CustomStep(fn, list(args), dict(kwargs), num_ipus=sysm.num_ipus if sysm else 1)
            except Unsupported as e:
                logger.warning("IPUStrategy.run: %s runs with TensorFlow on the host CPU, not on the simulated IPU: "
                               "%s is not supported there yet.", getattr(fn, "__name__", "the function"), e)
                cache[key] = None
        return cache[key]

    def experimental_run_v2(self, fn, args=(), kwargs=None, options=None):
        raise RuntimeError("`experimental_run_v2` has been renamed to `run`.")


def _kind(a):
    """What about a ``run`` argument selects the compiled program: iterators / Python objects
    by identity, tensors by shape and dtype, plain values by value."""
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str):      # a kwargs item
        return (a[0], _kind(a[1]))
    if isinstance(a, (tf.Tensor, np.ndarray)):
        return ("tensor", tuple(a.shape), str(a.dtype))
    if isinstance(a, (int, float, str, bool, type(None))):
        return ("value", a)
    return ("object", id(a))


def _is_tf_function(fn) -> bool:
    from tensorflow.python.eager.polymorphic_function import polymorphic_function
    return isinstance(fn, (polymorphic_function.Function, tf.types.experimental.ConcreteFunction)) or \
        hasattr(fn, "get_concrete_function")


IPUStrategy = IPUStrategyV1
