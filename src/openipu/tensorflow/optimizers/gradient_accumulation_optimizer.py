"""``ipu.optimizers.GradientAccumulationOptimizerV2`` and its relatives (Graphcore TF2 API)."""

import tensorflow as tf

from ..gradient_accumulation import GradientAccumulationReductionMethod
from .cross_replica_optimizer import CrossReplicaOptimizer
from .ipu_optimizer import IpuOptimizer


def _check_count(num_mini_batches):
    if num_mini_batches < 1:
        raise ValueError("num_mini_batches must be a positive number.")
    return int(num_mini_batches)


class GradientAccumulationOptimizerV2(IpuOptimizer):
    """Accumulates the gradients of ``num_mini_batches`` calls of ``apply_gradients`` and applies
    ``opt``'s update once with the reduced gradients (``reduction_method``: ``SUM``, the default,
    sums them; ``MEAN`` / ``RUNNING_MEAN`` average them), so a micro-batch of ``B`` acts as a
    batch of ``B * num_mini_batches``. ``opt``: a ``tf.compat.v1.train.Optimizer``.

    ``offload_weight_update_variables`` and ``replicated_optimizer_state_sharding`` are memory
    placements (accepted, no effect on the values); ``dtype``: the accumulators' dtype (``None``:
    the variable's; a ``tf.DType``; or a callable ``var -> DType``). Raises ``ValueError`` when
    ``num_mini_batches < 1``. On the host CPU the accumulators are non-trainable variables of the
    variables' shapes and a call counter; in a step compiled for the simulated IPU it is PopART's
    gradient accumulation (the step's loop count must be a multiple of ``num_mini_batches``)."""

    def __init__(self, opt, num_mini_batches, offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding=False, dtype=None,
                 reduction_method=GradientAccumulationReductionMethod.SUM, name="GradientAccumulationOptimizerV2"):
        super().__init__(opt, name=name)
        self._num_mini_batches = _check_count(num_mini_batches)
        self._offload_weight_update_variables = offload_weight_update_variables
        self._replicated_optimizer_state_sharding = replicated_optimizer_state_sharding
        self._dtype = dtype
        self._reduction_method = GradientAccumulationReductionMethod.parse(reduction_method)
        self._accumulators = {}
        self._counter = None

    def _accumulator_dtype(self, var):
        if self._dtype is None:
            return var.dtype.base_dtype
        if callable(self._dtype) and not isinstance(self._dtype, tf.DType):
            return tf.as_dtype(self._dtype(var))
        return tf.as_dtype(self._dtype)

    def _accumulator(self, var):
        key = var.ref()
        if key not in self._accumulators:
            with tf.init_scope():
                self._accumulators[key] = tf.Variable(tf.zeros(var.shape, self._accumulator_dtype(var)),
                                                      trainable=False, name=var.name.split(":")[0] + "/accum")
        return self._accumulators[key]

    def _apply(self, grads_and_vars, global_step, name):
        k = self._num_mini_batches
        if self._counter is None:
            with tf.init_scope():
                self._counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="accumulation_count")
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        accs = [self._accumulator(v) for _, v in pairs]
        adds = [a.assign_add(tf.cast(g, a.dtype)) for a, (g, _) in zip(accs, pairs)]
        with tf.control_dependencies(adds):
            count = self._counter.assign_add(1)

        def update():
            scale = 1.0 if self._reduction_method == GradientAccumulationReductionMethod.SUM else 1.0 / k
            reduced = [(tf.cast(a.read_value() * scale, v.dtype.base_dtype), v) for a, (_, v) in zip(accs, pairs)]
            op = self._opt.apply_gradients(reduced, global_step, name)
            with tf.control_dependencies([op] if op is not None else []):
                zeros = [a.assign(tf.zeros_like(a)) for a in accs]
            with tf.control_dependencies(zeros):
                return tf.constant(True)

        return tf.cond(tf.equal(count % k, 0), update, lambda: tf.constant(False))


class CrossReplicaGradientAccumulationOptimizerV2(GradientAccumulationOptimizerV2):
    """:class:`GradientAccumulationOptimizerV2` of a :class:`.CrossReplicaOptimizer`: the
    accumulated gradients are averaged over the replicas once per update."""

    def __init__(self, opt, num_mini_batches, offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding=False, dtype=None,
                 reduction_method=GradientAccumulationReductionMethod.SUM,
                 name="CrossReplicaGradientAccumulationOptimizerV2"):
        _check_count(num_mini_batches)
        super().__init__(CrossReplicaOptimizer(opt), num_mini_batches, offload_weight_update_variables,
                         replicated_optimizer_state_sharding, dtype, reduction_method, name)


class GradientAccumulationOptimizer(GradientAccumulationOptimizerV2):
    """The older accumulation wrapper, documented for ``GradientDescentOptimizer`` and
    ``MomentumOptimizer`` (``verify_usage=True`` raises ``TypeError`` for other optimizers);
    gradients summed over ``num_mini_batches`` calls."""

    def __init__(self, opt, num_mini_batches, verify_usage=True, name="GradientAccumulationOptimizer"):
        inner = opt._opt if isinstance(opt, CrossReplicaOptimizer) else opt
        if verify_usage and not isinstance(inner, (tf.compat.v1.train.GradientDescentOptimizer,
                                                   tf.compat.v1.train.MomentumOptimizer)):
            raise TypeError("GradientAccumulationOptimizer supports tf.train.GradientDescentOptimizer and "
                            f"tf.train.MomentumOptimizer only (got {type(inner).__name__}): use "
                            "GradientAccumulationOptimizerV2 or verify_usage=False.")
        super().__init__(opt, num_mini_batches, name=name)
        self._verify_usage = verify_usage


class CrossReplicaGradientAccumulationOptimizer(GradientAccumulationOptimizer):
    """:class:`GradientAccumulationOptimizer` of a :class:`.CrossReplicaOptimizer`."""

    def __init__(self, opt, num_mini_batches, verify_usage=True, name="CrossReplicaGradientAccumulationOptimizer"):
        _check_count(num_mini_batches)
        super().__init__(CrossReplicaOptimizer(opt), num_mini_batches, verify_usage, name)


def unwrap(opt):
    """``(base, ga, mean, cross_replica)`` of a chain of wrappers around a v1 optimizer: the
    accumulation count (1: none), whether accumulated gradients are averaged, whether the
    gradients are averaged over the replicas. Raises ``ValueError`` for two accumulations."""
    from .map_gradient_optimizer import MapGradientOptimizer
    ga, mean, cross = 1, False, False
    while isinstance(opt, IpuOptimizer):
        if isinstance(opt, GradientAccumulationOptimizerV2):
            if ga > 1:
                raise ValueError("Two gradient accumulation optimizers wrap one another.")
            ga = opt._num_mini_batches
            mean = opt._reduction_method != GradientAccumulationReductionMethod.SUM
        elif isinstance(opt, CrossReplicaOptimizer):
            cross = True
        elif not isinstance(opt, (MapGradientOptimizer, IpuOptimizer)):
            break
        opt = opt._opt
    return opt, ga, mean, cross
