"""``PopnnLSTM`` / ``LSTM`` and ``PopnnGRU`` / ``GRU`` (``ipu_tensorflow_addons.keras.layers``).

Keras's LSTM / GRU cells (weights, gates ``i, f, c, o`` / ``z, r, h``) with Graphcore's
arguments: ``time_major`` (inputs ``[time, batch, features]``), and the IPU-only ``seed``,
``partials_dtype``, ``available_memory_proportion_fwd`` / ``_bwd``, ``options`` /
``options_bwd`` (planning options of PopLibs' kernels: accepted, no effect on the values).
Graphcore's layers refuse ``stateful=True`` and ``go_backwards=True``; so do these
(``ValueError``). While a model is captured for the IPU, a default ``PopnnGRU`` is written in
the form tf2onnx turns into one ONNX ``GRU`` (``PopnnGRU._captured_gru``); the LSTM needs no
such help.
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

    def call(self, sequences, initial_state=None, mask=None, training=False):
        from ..._capture import capturing
        if capturing():
            reason = self._not_plain_gru(mask, training)
            if reason:
                raise NotImplementedError(
                    f"PopnnGRU with {reason} on the IPU (supported: activation='tanh', "
                    "recurrent_activation='sigmoid', use_bias=True, reset_after=True, no mask, no dropout "
                    "while training, unroll=False)")
            return self._captured_gru(sequences, initial_state)
        return super().call(sequences, initial_state=initial_state, mask=mask, training=training)

    def _not_plain_gru(self, mask, training) -> str:
        """What keeps the layer from being the GRU tf2onnx recognises (tanh / sigmoid, bias,
        reset_after, no mask, no dropout in effect, not unrolled); "" when nothing does. Keras's
        own loop for the others becomes an ONNX ``Loop`` PopART cannot run."""
        c = self.cell
        act, rec = (keras.activations.serialize(a) for a in (c.activation, c.recurrent_activation))
        checks = [(mask is not None, "a mask"), (not c.use_bias, "use_bias=False"),
                  (not c.reset_after, "reset_after=False"), (self.unroll, "unroll=True"),
                  (act != "tanh", f"activation={act!r}"), (rec != "sigmoid", f"recurrent_activation={rec!r}"),
                  (bool(training and (c.dropout or c.recurrent_dropout)), "dropout while training")]
        return ", ".join(text for bad, text in checks if bad)

    def _captured_gru(self, sequences, initial_state):
        """The same GRU (reset after, gates ``z, r, h``) written as the ``while_loop`` tf2onnx's
        Keras GRU rewriter turns into one ONNX ``GRU`` (``linear_before_reset=1``): the weights
        read and the bias unstacked before the loop, each step ``BiasAdd(MatMul)`` then
        ``Split`` into the three gates. Keras 3's own cell (slices, ``squeeze(split(bias))``
        in the loop) becomes an ONNX ``Loop`` instead, which PopART cannot train."""
        c = self.cell
        x = sequences if self.time_major else tf.transpose(sequences, [1, 0, 2])   # [time, batch, features]
        kernel, recurrent_kernel = tf.convert_to_tensor(c.kernel), tf.convert_to_tensor(c.recurrent_kernel)
        input_bias, recurrent_bias = tf.unstack(tf.convert_to_tensor(c.bias))
        steps = tf.shape(x)[0]
        inputs = tf.TensorArray(x.dtype, size=steps).unstack(x)
        outputs = tf.TensorArray(x.dtype, size=steps)
        if initial_state is not None:
            h0 = initial_state[0] if isinstance(initial_state, (list, tuple)) else initial_state
        else:
            h0 = tf.zeros(tf.stack([tf.shape(x)[1], self.units]), x.dtype)

        def step(t, h, out):
            x_z, x_r, x_h = tf.split(tf.nn.bias_add(tf.matmul(inputs.read(t), kernel), input_bias), 3, axis=1)
            r_z, r_r, r_h = tf.split(tf.nn.bias_add(tf.matmul(h, recurrent_kernel), recurrent_bias), 3, axis=1)
            z = tf.sigmoid(x_z + r_z)
            r = tf.sigmoid(x_r + r_r)
            hh = tf.tanh(x_h + r * r_h)
            h = z * h + (1 - z) * hh
            return t + 1, h, out.write(t, h)
        _, last, outputs = tf.while_loop(lambda t, *_: t < steps, step, (tf.constant(0), h0, outputs))
        seq = outputs.stack()                   # [time, batch, units]
        if not self.time_major:
            seq = tf.transpose(seq, [1, 0, 2])
        out = seq if self.return_sequences else last
        return [out, last] if self.return_state else out


LSTM = PopnnLSTM
GRU = PopnnGRU
