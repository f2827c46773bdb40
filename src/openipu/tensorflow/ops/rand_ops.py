"""``ipu.rand_ops`` / ``ipu.ops.rand_ops`` (Graphcore TF2 API)."""

import tensorflow as tf


def dropout(x, seed=None, rate=0.5, noise_shape=None, name=None):
    """Zero each element of ``x`` with probability ``rate`` and scale the rest by ``1 / (1 -
    rate)`` (``noise_shape``: a shape broadcastable to ``x``'s, for masks shared along axes);
    same shape and dtype. ``seed``: a 2-element int32 tensor (Graphcore's) or ``None``. Raises
    ``ValueError`` unless ``0 <= rate < 1``. The masks come from TensorFlow's generator on the host
    (the IPU's own generator differs, so masks never match bit for bit)."""
    if not 0.0 <= float(rate) < 1.0:
        raise ValueError("The rate must be in the range [0, 1), but was %s" % rate)
    with tf.name_scope(name or "dropout"):
        if seed is not None:
            seed = tf.cast(tf.reshape(tf.convert_to_tensor(seed), [-1])[:2], tf.int32)
            shape = tf.shape(x) if noise_shape is None else noise_shape
            keep = tf.random.stateless_uniform(shape, seed) >= rate
            return tf.where(keep, x / (1.0 - rate), tf.zeros_like(x))
        return tf.nn.dropout(x, rate=rate, noise_shape=noise_shape)
