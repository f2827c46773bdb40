"""``ipu.optimizers``: optimizer wrappers for IPU training loops (Graphcore TF2 API).

They wrap TensorFlow's v1 optimizers (``tf.compat.v1.train.GradientDescentOptimizer``,
``MomentumOptimizer``, ``AdamOptimizer``, ...), as Graphcore's do, and are used in a custom
training step run by ``IPUStrategy.run``:

- :class:`CrossReplicaOptimizer`: gradients averaged over the replicas (a cross-replica sum
  divided by the replication factor) before the wrapped optimizer's update;
- :class:`GradientAccumulationOptimizerV2` (and the older :class:`GradientAccumulationOptimizer`):
  gradients of ``num_mini_batches`` calls accumulated (``SUM``, ``MEAN`` or ``RUNNING_MEAN``),
  one update every ``num_mini_batches`` calls; the ``CrossReplica...`` forms combine both;
- :class:`MapGradientOptimizer`: ``compute_gradients`` maps every gradient with
  ``gradient_mapping_function(grad, var)``.

On the host CPU (TensorFlow) they compute exactly that. In a step compiled for the simulated IPU
(:mod:`.._custom_step`) the wrappers become PopART session options: gradient accumulation
(``accumulationFactor``) and replicated graphs, with the averaging as a scale on the loss whose
gradient PopART grows (a gradient is linear in the loss).
"""

from ..gradient_accumulation import GradientAccumulationReductionMethod  # noqa: F401
from .cross_replica_optimizer import CrossReplicaOptimizer  # noqa: F401
from .gradient_accumulation_optimizer import (CrossReplicaGradientAccumulationOptimizer,  # noqa: F401
                                              CrossReplicaGradientAccumulationOptimizerV2,
                                              GradientAccumulationOptimizer, GradientAccumulationOptimizerV2)
from .ipu_optimizer import IpuOptimizer  # noqa: F401
from .map_gradient_optimizer import MapGradientOptimizer  # noqa: F401
