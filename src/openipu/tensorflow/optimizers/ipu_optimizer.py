"""``ipu.optimizers.IpuOptimizer``: the base of the IPU optimizer wrappers (Graphcore TF2 API)."""

import tensorflow as tf

from .. import _custom_step


def tf_variable(v):
    """The ``tf.Variable`` behind a Keras 3 variable (TensorFlow's v1 optimizers update
    ``tf.Variable`` objects only); other values unchanged."""
    import keras
    if isinstance(v, keras.Variable) and isinstance(getattr(v, "_value", None), tf.Variable):
        return v._value
    return v


class IpuOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps ``opt`` (a ``tf.compat.v1.train.Optimizer``); what a subclass does not override is
    the wrapped optimizer's (``get_name``, slots, ``variables``, ``compute_gradients``,
    ``apply_gradients``); Keras 3 variables are updated through their ``tf.Variable``. Raises
    ``TypeError`` for anything but a v1 optimizer."""

    def __init__(self, opt, name=None):
        if not isinstance(opt, tf.compat.v1.train.Optimizer):
            raise TypeError(f"{type(self).__name__} wraps a tf.compat.v1.train.Optimizer (the optimizers of "
                            f"tensorflow.python.training), not {type(opt).__name__}.")
        super().__init__(False, name or type(self).__name__)
        self._opt = opt

    def get_name(self):
        return self._opt.get_name()

    def get_slot(self, *args, **kwargs):
        return self._opt.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._opt.get_slot_names(*args, **kwargs)

    def variables(self):
        return self._opt.variables()

    def compute_gradients(self, loss, var_list=None, **kwargs):
        if _custom_step.active() is not None:
            return _custom_step.record_v1_gradients(self, loss, var_list)
        if var_list is not None:
            var_list = [tf_variable(v) for v in var_list]
        return self._opt.compute_gradients(loss, var_list=var_list, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        if _custom_step.active() is not None:
            return _custom_step.record_v1_apply(self, grads_and_vars, global_step)
        return self._apply([(g, tf_variable(v)) for g, v in grads_and_vars], global_step, name)

    def _apply(self, grads_and_vars, global_step, name):
        return self._opt.apply_gradients(grads_and_vars, global_step, name)
