"""``ipu.replication_ops`` / ``ipu.ops.replication_ops`` (Graphcore TF2 API)."""

import tensorflow as tf


def replication_factor() -> int:
    """Replicas of the step being traced for the simulated IPU; 1 where TensorFlow runs it."""
    from .. import _custom_step
    tr = _custom_step.active()
    return int(getattr(tr, "replicas", 1) or 1) if tr is not None else 1


def _single_replica(what):
    if replication_factor() > 1:
        from .. import _custom_step
        raise _custom_step.Unsupported(f"{what} in a replicated step")


def replication_index(name=None):
    """The index of the replica running the op (an int32 scalar tensor): 0 where TensorFlow runs
    the step (one replica)."""
    _single_replica("replication_index")
    return tf.constant(0, tf.int32, name=name)
