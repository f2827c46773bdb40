"""Group / instance / layer normalisation layers (``ipu_tensorflow_addons.keras.layers``)."""

import math

import keras

from ...ops.normalization_ops import normalize


class GroupNormalization(keras.layers.Layer):
    """Group normalisation with trainable ``gamma`` / ``beta`` of shape ``[C]`` and no
    statistics gathering (the same in training and inference). ``groups`` must divide the
    channels (on ``channels_axis``: 1 or -1); ``strided_channel_grouping`` (default ``True``, as
    Graphcore's) puts channel ``c`` in group ``c % groups``; ``epsilon`` is added to the biased
    variance. Input: float, rank >= 2, batch first; output: the same shape and dtype. Raises
    ``ValueError`` (Graphcore's texts) for groups not dividing the channels or another axis."""

    def __init__(self, groups=2, channels_axis=-1, center=True, scale=True, epsilon=1e-3, beta_initializer=None,
                 gamma_initializer=None, strided_channel_grouping=True, trainable=True, **kwargs):
        super().__init__(trainable=trainable, **kwargs)
        self.groups, self.channels_axis = groups, channels_axis
        self.center, self.scale, self.epsilon = center, scale, epsilon
        self.beta_initializer = keras.initializers.get(beta_initializer or "zeros")
        self.gamma_initializer = keras.initializers.get(gamma_initializer or "ones")
        self.strided_channel_grouping = strided_channel_grouping

    def _groups(self, channels):
        return self.groups

    def build(self, input_shape):
        rank = len(input_shape)
        if self.channels_axis > rank - 1:
            raise ValueError("Axis is out of bounds.")
        ax = self.channels_axis + rank if self.channels_axis < 0 else self.channels_axis
        if ax not in (1, rank - 1):
            raise ValueError("Unsupported data format, group norm only supports NCHW(channel axis 1) and NHWC "
                             "(channel axis -1).")
        channels = input_shape[ax]
        groups = self._groups(channels)
        if groups > channels:
            raise ValueError("Invalid groups %d for %d channels." % (groups, channels))
        if channels % groups:
            raise ValueError("%d channels is not commensurate with %d groups." % (channels, groups))
        self._axis, self._channels = ax, channels
        self.gamma = self.add_weight(name="gamma", shape=(channels,), initializer=self.gamma_initializer) \
            if self.scale else None
        self.beta = self.add_weight(name="beta", shape=(channels,), initializer=self.beta_initializer) \
            if self.center else None

    def call(self, inputs, training=None):
        return normalize(inputs, self.gamma, self.beta, self._groups(self._channels), self._axis, self.epsilon,
                         self.strided_channel_grouping)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        cfg = super().get_config()
        cfg.update(groups=self.groups, channels_axis=self.channels_axis, center=self.center, scale=self.scale,
                   epsilon=self.epsilon, beta_initializer=keras.initializers.serialize(self.beta_initializer),
                   gamma_initializer=keras.initializers.serialize(self.gamma_initializer),
                   strided_channel_grouping=self.strided_channel_grouping)
        return cfg


class InstanceNormalization(GroupNormalization):
    """:class:`GroupNormalization` with one group per channel (statistics over the spatial axes
    of each channel)."""

    def __init__(self, channels_axis=-1, center=True, scale=True, epsilon=1e-3, beta_initializer=None,
                 gamma_initializer=None, trainable=True, **kwargs):
        super().__init__(groups=0, channels_axis=channels_axis, center=center, scale=scale, epsilon=epsilon,
                         beta_initializer=beta_initializer, gamma_initializer=gamma_initializer,
                         trainable=trainable, **kwargs)

    def _groups(self, channels):
        return channels

    def get_config(self):
        cfg = super().get_config()
        for k in ("groups", "strided_channel_grouping"):
            cfg.pop(k)
        return cfg


class LayerNormalization(GroupNormalization):
    """Layer normalisation over ``axis`` (an int or a list of ints): the input is permuted and
    reshaped to ``[rest, prod(axis dims)]`` and normalised as one group; ``gamma`` / ``beta`` have
    shape ``[prod(axis dims)]`` (``[C]`` for the last axis, as Keras's). Regularizers and
    constraints are refused (``ValueError``), as Graphcore's."""

    def __init__(self, axis=-1, epsilon=1e-3, center=True, scale=True, beta_initializer="zeros",
                 gamma_initializer="ones", beta_regularizer=None, gamma_regularizer=None, beta_constraint=None,
                 gamma_constraint=None, trainable=True, **kwargs):
        if not isinstance(axis, (list, tuple, int)):
            raise ValueError("Expected an int or a list/tuple of ints for the argument 'axis', but received "
                             "instead: %s" % axis)
        for v, n in ((beta_regularizer, "beta_regularizer"), (gamma_regularizer, "gamma_regularizer"),
                     (beta_constraint, "beta_constraint"), (gamma_constraint, "gamma_constraint")):
            if v is not None:
                raise ValueError(f"{n} is not supported by the IPU LayerNormalization layer.")
        super().__init__(groups=1, channels_axis=-1, center=center, scale=scale, epsilon=epsilon,
                         beta_initializer=beta_initializer, gamma_initializer=gamma_initializer,
                         strided_channel_grouping=False, trainable=trainable, **kwargs)
        self.axis = list(axis) if isinstance(axis, (list, tuple)) else axis

    def build(self, input_shape):
        nd = len(input_shape)
        axes = sorted(a + nd if a < 0 else a for a in ([self.axis] if isinstance(self.axis, int) else self.axis))
        for a in axes:
            if a < 0 or a >= nd:
                raise ValueError("Invalid axis: %d" % a)
        if len(axes) != len(set(axes)):
            raise ValueError("Duplicate axis: {}".format(tuple(axes)))
        if any(input_shape[a] is None for a in axes):
            raise ValueError("Input shape %s has unknown dimensions - all dimensions need to be fully specified."
                             % (input_shape,))
        self._axes = axes
        self._kept = [d for d in range(nd) if d not in axes]
        self._perm = self._kept + axes
        self._reduced = math.prod(input_shape[a] for a in axes)
        super().build((None, self._reduced))

    def call(self, inputs, training=None):
        import tensorflow as tf
        permuted = tf.transpose(inputs, self._perm)
        flat = tf.reshape(permuted, [-1, self._reduced])
        out = normalize(flat, self.gamma, self.beta, 1, -1, self.epsilon)
        out = tf.reshape(out, tf.shape(permuted))
        return tf.transpose(out, tf.math.invert_permutation(self._perm))

    def get_config(self):
        cfg = super().get_config()
        for k in ("groups", "channels_axis", "strided_channel_grouping"):
            cfg.pop(k)
        cfg["axis"] = self.axis
        return cfg


GroupNorm = GroupNormalization
InstanceNorm = InstanceNormalization
LayerNorm = LayerNormalization
