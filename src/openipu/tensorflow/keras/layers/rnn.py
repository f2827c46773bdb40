"""``PopnnLSTM`` / ``LSTM`` and ``PopnnGRU`` / ``GRU`` (``ipu_tensorflow_addons.keras.layers``).

Keras's LSTM / GRU cells (weights, gates ``i, f, c, o`` / ``z, r, h``) with Graphcore's
arguments: ``time_major`` (inputs ``[time, batch, features]``), and the IPU-only ``seed``,
``partials_dtype``, ``available_memory_proportion_fwd`` / ``_bwd``, ``options`` /
``options_bwd`` (planning options of PopLibs' kernels: accepted, no effect on the values).
Graphcore's layers refuse ``stateful=True`` and ``go_backwards=True``; so do these
(``ValueError``).
"""

import keras
import tensorflow as tf

_IPU_ONLY = ("partials_dtype", "available_memory_proportion_fwd", "available_memory_proportion_bwd", "options",
             "options_bwd")


class _Popnn:
    def _ipu_init(self, kwargs):
        self.time_major = bool(kwargs.pop("time_major", False))
        self.ipu_options = {k: kwargs.pop(k) for k in _IPU_ONLY if k in kwargs}
        if kwargs.get("stateful"):
            raise ValueError(f"{type(self).__name__} does not support stateful=True on the IPU.")
        if kwargs.get("go_backwards"):
            raise ValueError(f"{type(self).__name__} does not support go_backwards=True on the IPU.")
        return kwargs

    def call(self, sequences, initial_state=None, mask=None, training=False):
        if self.time_major:
            sequences = tf.transpose(sequences, [1, 0, 2])
        out = super().call(sequences, initial_state=initial_state, mask=mask, training=training)
        if self.time_major and self.return_sequences:
            if isinstance(out, (list, tuple)):
                out = [tf.transpose(out[0], [1, 0, 2])] + list(out[1:])
            else:
                out = tf.transpose(out, [1, 0, 2])
        return out

    def compute_output_shape(self, sequences_shape, initial_state_shape=None):
        if not self.time_major:
            return super().compute_output_shape(sequences_shape, initial_state_shape)
        t, b = sequences_shape[0], sequences_shape[1]
        shapes = super().compute_output_shape((b, t) + tuple(sequences_shape[2:]), initial_state_shape)
        if self.return_sequences:
            first = shapes[0] if self.return_state else shapes
            first = (first[1], first[0]) + tuple(first[2:])
            return [first] + list(shapes[1:]) if self.return_state else first
        return shapes


class PopnnLSTM(_Popnn, keras.layers.LSTM):
    """Keras's LSTM (``units``, ``activation='tanh'``, ``recurrent_activation='sigmoid'``,
    ``unit_forget_bias=True``, ``dropout``, ``return_sequences``, ``return_state``) with
    Graphcore's ``time_major`` and IPU-only options. Input ``[batch, time, features]`` (or
    ``[time, batch, features]``), float32."""

    def __init__(self, units, *args, seed=None, **kwargs):
        kwargs = self._ipu_init(kwargs)
        super().__init__(units, *args, seed=seed, **kwargs)


class PopnnGRU(_Popnn, keras.layers.GRU):
    """Keras's GRU (``units``, ``reset_after``, ``return_sequences``, ``return_state``) with
    Graphcore's ``time_major`` and IPU-only options."""

    def __init__(self, units, *args, seed=None, **kwargs):
        kwargs = self._ipu_init(kwargs)
        super().__init__(units, *args, seed=seed, **kwargs)


LSTM = PopnnLSTM
GRU = PopnnGRU
