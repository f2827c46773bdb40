"""``ipu.optimizers.MapGradientOptimizer`` (Graphcore TF2 API)."""

from .. import _custom_step
from .ipu_optimizer import IpuOptimizer


class MapGradientOptimizer(IpuOptimizer):
    """``compute_gradients`` returns ``(gradient_mapping_function(grad, var_value), var)`` for
    the pairs of the wrapped optimizer's ``compute_gradients`` (so ``minimize`` applies mapped
    gradients); ``apply_gradients`` is the wrapped optimizer's (gradients from a
    ``GradientTape`` are not mapped), as Graphcore's.

    In a step compiled for the simulated IPU the mapping would have to run between PopART's
    backward pass and its update: such a step runs with TensorFlow on the host CPU (a warning
    says so)."""

    def __init__(self, wrapped_optimizer, gradient_mapping_function, name="MapGradientOptimizer"):
        super().__init__(wrapped_optimizer, name=name)
        self._gradient_mapping_function = gradient_mapping_function

    def compute_gradients(self, loss, var_list=None, **kwargs):
        if _custom_step.active() is not None:
            raise _custom_step.Unsupported("MapGradientOptimizer.compute_gradients (a gradient mapping function "
                                           "between the backward pass and the update)")
        from .ipu_optimizer import tf_variable
        if var_list is not None:
            var_list = [tf_variable(v) for v in var_list]
        gvs = self._opt.compute_gradients(loss, var_list=var_list, **kwargs)
        return [(None if g is None else self._gradient_mapping_function(g, v.value()), v) for g, v in gvs]

    def minimize(self, loss, global_step=None, var_list=None, name=None, **kwargs):
        gvs = self.compute_gradients(loss, var_list=var_list, **kwargs)
        return self.apply_gradients(gvs, global_step=global_step, name=name)
