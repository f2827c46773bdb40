"""``ipu.nn_ops`` / ``ipu.ops.nn_ops``: activations (Graphcore TF2 API).

Plain TensorFlow compositions: where a step runs on the simulated IPU they are converted with the
rest of the step (tf2onnx) and run as PopART ops; on the host CPU TensorFlow runs them.
"""

import math

import tensorflow as tf


def gelu(x, approximate=True, name=None):
    """GELU of ``x`` (float tensor, any shape; same shape and dtype): with ``approximate`` the
    tanh form ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``, else ``0.5 x (1 + erf(x /
    sqrt(2)))``."""
    with tf.name_scope(name or "gelu"):
        x = tf.convert_to_tensor(x)
        if approximate:
            c = tf.cast(math.sqrt(2.0 / math.pi), x.dtype)
            return 0.5 * x * (1.0 + tf.tanh(c * (x + tf.cast(0.044715, x.dtype) * x * x * x)))
        return 0.5 * x * (1.0 + tf.math.erf(x / tf.cast(math.sqrt(2.0), x.dtype)))


def hard_sigmoid(x, name=None):
    """``clip(0.2 x + 0.5, 0, 1)`` (float tensor, same shape and dtype)."""
    with tf.name_scope(name or "hard_sigmoid"):
        return tf.clip_by_value(0.2 * x + 0.5, 0.0, 1.0)


def swish(x, name=None):
    """``x * sigmoid(x)`` (float tensor, same shape and dtype)."""
    with tf.name_scope(name or "swish"):
        return x * tf.sigmoid(x)


def softmax(x, stable=False, name=None):
    """Softmax over the last axis of ``x``; ``stable`` subtracts the maximum first (the same values
    in exact arithmetic, Graphcore's numerically stable variant)."""
    with tf.name_scope(name or "softmax"):
        if stable:
            x = x - tf.stop_gradient(tf.reduce_max(x, axis=-1, keepdims=True))
        return tf.nn.softmax(x, axis=-1)
