"""Dropout, Embedding, SerialDense, RecomputationCheckpoint, AssumeEqualAcrossReplicas
(``ipu_tensorflow_addons.keras.layers``)."""

import keras
import tensorflow as tf

from ...ops import embedding_ops, math_ops

_DENSE_DIMS = {"input_columns": "a_columns", "input_rows_kernel_columns": "a_rows_b_columns", "kernel_rows": "b_rows"}


class Dropout(keras.layers.Dropout):
    """Keras's ``Dropout(rate, noise_shape, seed)`` (the IPU route makes it PopART's dropout: the
    IPU's generator, so masks differ from Keras's on the CPU). ``seed`` may also be Graphcore's
    pair of ints (combined into one Keras seed)."""

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        if isinstance(seed, (list, tuple)):
            seed = int(seed[0]) * 65536 + int(seed[-1])
        super().__init__(rate, noise_shape=noise_shape, seed=seed, **kwargs)


class Embedding(keras.layers.Embedding):
    """Keras's ``Embedding`` whose lookup is :func:`..ops.embedding_ops.embedding_lookup` with
    ``serialization_factor`` (must divide ``input_dim``; ``ValueError`` otherwise). Input: int
    ids of any shape; output ``ids.shape + [output_dim]``, float32."""

    def __init__(self, input_dim, output_dim, embeddings_initializer="uniform", embeddings_regularizer=None,
                 activity_regularizer=None, embeddings_constraint=None, mask_zero=False, input_length=None,
                 serialization_factor=1, **kwargs):
        if serialization_factor < 1 or input_dim % serialization_factor:
            raise ValueError(f"The serialization_factor ({serialization_factor}) must divide input_dim "
                             f"({input_dim}).")
        super().__init__(input_dim, output_dim, embeddings_initializer=embeddings_initializer,
                         embeddings_regularizer=embeddings_regularizer, activity_regularizer=activity_regularizer,
                         embeddings_constraint=embeddings_constraint, mask_zero=mask_zero, **kwargs)
        self.serialization_factor = int(serialization_factor)

    def call(self, inputs):
        ids = tf.cast(inputs, tf.int32)
        return embedding_ops.embedding_lookup(self.embeddings, ids, serialization_factor=self.serialization_factor)

    def get_config(self):
        cfg = super().get_config()
        cfg["serialization_factor"] = self.serialization_factor
        return cfg


class SerialDense(keras.layers.Dense):
    """``activation(inputs @ kernel + bias)`` (Keras's ``Dense`` weights) with the matmul split
    into ``serialization_factor`` matmuls along ``serialization_dimension``: ``"input_columns"``
    (the rows of the output), ``"input_rows_kernel_columns"`` (the input features, partial
    products summed) or ``"kernel_rows"`` (the units). Input ``[..., k]`` float; output
    ``[..., units]``. Raises ``ValueError`` for another dimension name or a factor not dividing it."""

    def __init__(self, units, serialization_factor, serialization_dimension, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", kernel_regularizer=None,
                 bias_regularizer=None, activity_regularizer=None, kernel_constraint=None, bias_constraint=None,
                 **kwargs):
        if serialization_dimension not in _DENSE_DIMS:
            raise ValueError("Invalid serialization_dimension={}, expected one of: 'input_columns', "
                             "'input_rows_kernel_columns', 'kernel_rows'.".format(serialization_dimension))
        super().__init__(units, activation=activation, use_bias=use_bias, kernel_initializer=kernel_initializer,
                         bias_initializer=bias_initializer, kernel_regularizer=kernel_regularizer,
                         bias_regularizer=bias_regularizer, activity_regularizer=activity_regularizer,
                         kernel_constraint=kernel_constraint, bias_constraint=bias_constraint, **kwargs)
        self.serialization_factor = int(serialization_factor)
        self.serialization_dimension = serialization_dimension

    def call(self, inputs, training=None):
        if self.serialization_factor < 1:
            raise ValueError("serialization_factor has to be at least 1, but was {}.".format(
                self.serialization_factor))
        x = tf.convert_to_tensor(inputs)
        flat = tf.reshape(x, [-1, x.shape[-1]]) if x.shape.ndims > 2 else x
        out = math_ops.serialized_matmul(flat, self.kernel, self.serialization_factor,
                                         _DENSE_DIMS[self.serialization_dimension])
        if x.shape.ndims > 2:
            out = tf.reshape(out, tf.concat([tf.shape(x)[:-1], [self.units]], 0))
        if self.use_bias:
            out = out + self.bias
        return self.activation(out) if self.activation is not None else out

    def get_config(self):
        cfg = super().get_config()
        cfg.update(serialization_factor=self.serialization_factor,
                   serialization_dimension=self.serialization_dimension)
        return cfg


class RecomputationCheckpoint(keras.layers.Layer):
    """Marks its inputs (a tensor or a list of tensors, returned unchanged) as a recomputation
    checkpoint of a pipelined model: in recomputation the activations here are kept and the ops
    between checkpoints recomputed (the values are the same)."""

    def call(self, inputs, **kwargs):
        return tf.nest.map_structure(tf.identity, inputs)

    def compute_output_shape(self, input_shape):
        return input_shape


class AssumeEqualAcrossReplicas(keras.layers.Layer):
    """Marks its inputs as equal on every replica (a hint for the compiler's divergent control
    flow checks); returns them unchanged. ``inplace`` is accepted."""

    def __init__(self, inplace=False, **kwargs):
        super().__init__(**kwargs)
        self.inplace = inplace

    def call(self, inputs, **kwargs):
        return tf.nest.map_structure(tf.identity, inputs)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        cfg = super().get_config()
        cfg["inplace"] = self.inplace
        return cfg
