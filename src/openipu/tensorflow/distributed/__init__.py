"""``ipu.distributed``: collectives between the instances of a ``poprun`` run and
``popdist_strategy.PopDistStrategy`` (Graphcore TF2 API, SDK 3.1+; ``ipu.horovod`` before).

``allreduce`` / ``broadcast`` / ``allgather`` take eager tensors (or numpy arrays) on the host and
run over the instances' ``torch.distributed`` gloo group (:mod:`openipu.poplibs.gcl_instances`);
running alone (no ``poprun``) they return the value. Inside a step compiled for the simulated IPU the gradient
reduction between instances is PopART's distributed replicated graphs instead.
"""

import numpy as np


class ReduceOp:
    """``SUM``, ``MEAN``, ``MAX``, ``MIN`` (Graphcore's ``ipu.distributed.ReduceOp``)."""

    SUM = "SUM"
    MEAN = "MEAN"
    MAX = "MAX"
    MIN = "MIN"


def _torch(value):
    import tensorflow as tf
    import torch
    arr = np.ascontiguousarray(value.numpy() if isinstance(value, (tf.Tensor, tf.Variable)) else np.asarray(value))
    return torch.from_numpy(arr.copy()), arr.dtype


def _instances():
    from openipu import popdist
    return popdist.getNumInstances()


def allreduce(value, reduce_op=ReduceOp.SUM, tensor_name=None):
    """``value`` (a tensor, any shape, numeric) reduced over the instances with ``reduce_op``;
    the same shape and dtype on every instance. Raises ``ValueError`` for another op."""
    import tensorflow as tf
    import torch.distributed as dist

    from openipu.poplibs import gcl_instances
    ops = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.MEAN: dist.ReduceOp.SUM, ReduceOp.MAX: dist.ReduceOp.MAX,
           ReduceOp.MIN: dist.ReduceOp.MIN}
    if reduce_op not in ops:
        raise ValueError(f"Unsupported reduce_op {reduce_op!r}: one of SUM, MEAN, MAX, MIN")
    n = _instances()
    if n < 2:
        return tf.convert_to_tensor(value)
    t, dtype = _torch(value)
    gcl_instances.init_process_group()
    dist.all_reduce(t, ops[reduce_op])
    out = t.numpy()
    if reduce_op == ReduceOp.MEAN:
        out = out / n
    return tf.convert_to_tensor(out.astype(dtype))


def broadcast(value, root_rank=0, tensor_name=None):
    """Instance ``root_rank``'s ``value`` on every instance (same shape and dtype)."""
    import tensorflow as tf

    from openipu.poplibs import gcl_instances
    if _instances() < 2:
        return tf.convert_to_tensor(value)
    t, dtype = _torch(value)
    gcl_instances.broadcast_tensors_from([t], int(root_rank), "broadcast")
    return tf.convert_to_tensor(t.numpy().astype(dtype))


def allgather(value, tensor_name=None):
    """Every instance's ``value`` (all the same shape) concatenated along axis 0, in instance
    order."""
    import tensorflow as tf
    import torch
    import torch.distributed as dist

    from openipu.poplibs import gcl_instances
    n = _instances()
    if n < 2:
        return tf.convert_to_tensor(value)
    t, dtype = _torch(value)
    gcl_instances.init_process_group()
    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t)
    return tf.convert_to_tensor(torch.cat(parts, 0).numpy().astype(dtype))


from . import popdist_strategy  # noqa: E402,F401
