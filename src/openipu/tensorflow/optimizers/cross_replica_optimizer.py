"""``ipu.optimizers.CrossReplicaOptimizer`` (Graphcore TF2 API)."""

from ..ops import cross_replica_ops
from .ipu_optimizer import IpuOptimizer


def average_over_replicas(grads_and_vars):
    """``(g, v)`` pairs with every gradient summed over the replicas and divided by their number
    (Graphcore's cross-replica sum and replication normalise); ``None`` gradients kept."""
    from ..ops.replication_ops import replication_factor
    r = replication_factor()
    out = []
    for g, v in grads_and_vars:
        if g is not None:
            g = cross_replica_ops.cross_replica_sum(g)
            if r > 1:
                g = g / r
        out.append((g, v))
    return out


class CrossReplicaOptimizer(IpuOptimizer):
    """Averages the gradients over the IPU replicas, then applies ``opt``'s update (every
    replica then makes the same update). ``opt``: a ``tf.compat.v1.train.Optimizer``."""

    def __init__(self, opt, name="CrossReplicaOptimizer"):
        super().__init__(opt, name=name)

    def _apply(self, grads_and_vars, global_step, name):
        return self._opt.apply_gradients(average_over_replicas(grads_and_vars), global_step, name)
