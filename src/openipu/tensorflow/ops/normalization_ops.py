"""``ipu.normalization_ops`` / ``ipu.ops.normalization_ops``: group, layer and instance norm
(Graphcore TF2 API, the functional TF1-style forms that create ``beta`` / ``gamma`` with
``tf.compat.v1.get_variable`` in a variable scope).

Channels are split into contiguous groups (channel ``c`` in group ``c // (C / groups)``), the
statistics are the biased mean and variance over each group and the non-channel, non-batch axes,
``y = (x - mean) / sqrt(var + epsilon) * gamma + beta``. :func:`normalize` is the computation
without variables (used by the Keras layers).
"""

import tensorflow as tf


def _channels_axis(x, channels_axis):
    rank = x.shape.ndims
    if rank is None:
        raise ValueError("Inputs %s has undefined rank." % getattr(x, "name", "x"))
    if channels_axis > rank - 1:
        raise ValueError("Axis is out of bounds.")
    ax = channels_axis + rank if channels_axis < 0 else channels_axis
    if ax not in (1, rank - 1):
        raise ValueError("Unsupported data format, group norm only supports NCHW(channel axis 1) and NHWC "
                         "(channel axis -1).")
    return ax


def normalize(x, gamma, beta, groups, channels_axis=-1, epsilon=1e-6, strided_channel_grouping=False):
    """Group-normalise ``x`` (float, rank >= 2, batch first, channels on ``channels_axis`` = 1 or
    -1) with ``gamma`` / ``beta`` of shape ``[C]`` (or ``None``). Same shape and dtype as ``x``.
    ``strided_channel_grouping``: channel ``c`` is in group ``c % groups`` (PopLibs' efficient,
    unconventional grouping, the Keras layers' default) instead of ``c // (C / groups)``.
    Raises ``ValueError`` when ``groups`` does not divide the channels."""
    x = tf.convert_to_tensor(x)
    ax = _channels_axis(x, channels_axis)
    channels = x.shape[ax]
    if channels is None:
        raise ValueError("Inputs %s has undefined channel dimension: %d." % (getattr(x, "name", "x"), ax))
    if groups > channels:
        raise ValueError("Invalid groups %d for %d channels." % (groups, channels))
    if channels % groups:
        raise ValueError("%d channels is not commensurate with %d groups." % (channels, groups))
    rank = x.shape.ndims
    perm = None
    if ax == 1 and rank > 2:                        # NCHW: channels last for the computation
        perm = [0] + list(range(2, rank)) + [1]
        x = tf.transpose(x, perm)
    shape = tf.shape(x)
    if strided_channel_grouping:                    # [..., C / groups, groups]: a group is a stride
        grouped = tf.reshape(x, tf.concat([shape[:-1], [channels // groups, groups]], 0))
        axes = list(range(1, rank))
    else:                                           # [..., groups, C / groups]: a group is contiguous
        grouped = tf.reshape(x, tf.concat([shape[:-1], [groups, channels // groups]], 0))
        axes = list(range(1, rank - 1)) + [rank]    # spatial axes and the channels within a group
    mean, var = tf.nn.moments(grouped, axes=axes, keepdims=True)
    y = tf.reshape((grouped - mean) * tf.math.rsqrt(var + epsilon), shape)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    if perm is not None:
        y = tf.transpose(y, [0, rank - 1] + list(range(1, rank - 1)))
    return y


def _norm(inputs, groups, channels_axis, center, scale, epsilon, param_initializers, reuse, trainable, scope,
          default_name):
    inputs = tf.convert_to_tensor(inputs)
    ax = _channels_axis(inputs, channels_axis)
    channels = inputs.shape[ax]
    groups = channels if groups is None else groups
    inits = param_initializers or {}
    with tf.compat.v1.variable_scope(scope, default_name, [inputs], reuse=reuse):
        dtype = inputs.dtype.base_dtype
        beta = tf.compat.v1.get_variable("beta", [channels], dtype, inits.get("beta", tf.zeros_initializer()),
                                         trainable=trainable) if center else None
        gamma = tf.compat.v1.get_variable("gamma", [channels], dtype, inits.get("gamma", tf.ones_initializer()),
                                          trainable=trainable) if scale else None
        return normalize(inputs, gamma, beta, groups, ax, epsilon)


def group_norm(inputs, groups=2, channels_axis=-1, reduction_axes=None, center=True, scale=True, epsilon=1e-6,
               param_initializers=None, reuse=None, variables_collections=None, training=True, trainable=True,
               scope=None):
    """Group normalisation of ``inputs`` over ``groups`` contiguous channel groups (see the
    module docstring); ``reduction_axes`` and ``variables_collections`` are ignored (deprecated /
    TF1 collections), ``training`` does not change the result. Raises ``ValueError`` for an
    undefined rank, a channels axis other than 1 / -1, or groups not dividing the channels."""
    return _norm(inputs, groups, channels_axis, center, scale, epsilon, param_initializers, reuse, trainable, scope,
                 "GroupNorm")


def layer_norm(inputs, channels_axis=-1, reduction_axes=None, center=True, scale=True, epsilon=1e-6,
               param_initializers=None, reuse=None, variables_collections=None, training=True, trainable=True,
               scope=None):
    """Layer normalisation: :func:`group_norm` with one group (statistics over every non-batch
    axis), ``beta`` / ``gamma`` per channel."""
    return _norm(inputs, 1, channels_axis, center, scale, epsilon, param_initializers, reuse, trainable, scope,
                 "LayerNorm")


def instance_norm(inputs, channels_axis=-1, reduction_axes=None, center=True, scale=True, epsilon=1e-6,
                  param_initializers=None, reuse=None, variables_collections=None, training=True, trainable=True,
                  scope=None):
    """Instance normalisation: :func:`group_norm` with one group per channel (statistics over
    the spatial axes)."""
    return _norm(inputs, None, channels_axis, center, scale, epsilon, param_initializers, reuse, trainable, scope,
                 "InstanceNorm")
