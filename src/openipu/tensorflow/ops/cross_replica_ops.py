"""``ipu.cross_replica_ops`` / ``ipu.ops.cross_replica_ops`` (Graphcore TF2 API).

The TensorFlow functions run where a step runs with TensorFlow: on the host CPU that is one
replica, so a cross-replica sum or mean is the identity. Inside a step compiled for the simulated
IPU with several replicas they raise :class:`.._custom_step.Unsupported` (the step then runs on
the host CPU); the optimizer wrappers' reductions are PopART's replicated reduction instead.
"""

import tensorflow as tf

from .replication_ops import _single_replica


def cross_replica_sum(x, replica_group_size=None, name=None):
    """Sum of ``x`` (a tensor of any shape and numeric dtype) over the replicas (groups of
    ``replica_group_size``, default all); same shape and dtype."""
    _single_replica("cross_replica_sum")
    return tf.identity(x, name=name)


def cross_replica_mean(x, replica_group_size=None, name=None):
    """Mean of ``x`` over the replicas (groups of ``replica_group_size``); same shape and dtype."""
    _single_replica("cross_replica_mean")
    return tf.identity(x, name=name)


def assume_equal_across_replicas(tensors, inplace=False):
    """Marks ``tensors`` (a tensor or a structure of them) as equal on every replica (a hint for
    the compiler's divergence checks); returns them unchanged."""
    return tf.nest.map_structure(tf.identity, tensors)
