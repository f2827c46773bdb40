"""``ipu.embedding_ops`` / ``ipu.ops.embedding_ops`` (Graphcore TF2 API)."""

import tensorflow as tf


def embedding_lookup(params, ids, name=None, serialization_factor=1):
    """Rows of ``params`` (``[V, ...]``) at ``ids`` (integer tensor of any shape): shape
    ``ids.shape + params.shape[1:]``. ``serialization_factor`` splits the lookup into that many
    lookups over equal slices of the ``V`` rows (less temporary memory on the IPU; the same
    values): it must divide ``V`` (``ValueError`` otherwise, as Graphcore's). In a program captured
    for the simulated IPU it is one ``Gather``."""
    from .._capture import capturing
    with tf.name_scope(name or "embedding_lookup"):
        params = tf.convert_to_tensor(params)
        ids = tf.convert_to_tensor(ids)
        rows = params.shape[0]
        if serialization_factor < 1 or (rows is not None and rows % serialization_factor):
            raise ValueError(f"The serialization_factor ({serialization_factor}) must divide the size of the 0th "
                             f"dimension of params ({rows}).")
        if serialization_factor == 1 or capturing():
            return tf.gather(params, ids)
        size = rows // serialization_factor
        out = None
        for i in range(serialization_factor):       # each slice answers the ids in its rows, zeros elsewhere
            local = ids - i * size
            inside = tf.logical_and(local >= 0, local < size)
            part = tf.gather(params[i * size:(i + 1) * size], tf.where(inside, local, tf.zeros_like(local)))
            mask = tf.reshape(tf.cast(inside, params.dtype), tf.concat([tf.shape(ids), tf.ones([params.shape.ndims - 1],
                                                                                                tf.int32)], 0))
            out = part * mask if out is None else out + part * mask
        return out
