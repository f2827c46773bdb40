"""The IPU Keras layers (``ipu_tensorflow_addons.keras.layers`` / ``ipu.keras.layers``) and
``ipu.*_ops`` (Graphcore TF2 API): values against stock Keras / TensorFlow on the CPU, and a model
built of them trains through the IPU route (``fit`` in an ``IPUStrategy``) to the same losses and
weights as the same model fitted by Keras on the CPU."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import openipu_tf_hook  # noqa: E402,F401

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python import ipu  # noqa: E402
from tensorflow.python.ipu.keras import layers  # noqa: E402

X = np.random.default_rng(0).normal(size=(4, 5, 8)).astype(np.float32)


def test_addons_namespace_is_the_same_classes():
    import ipu_tensorflow_addons.keras.layers as addons
    assert addons.GroupNorm is layers.GroupNormalization is addons.GroupNormalization
    assert addons.LSTM is layers.PopnnLSTM and addons.GRU is layers.PopnnGRU
    assert ipu.nn_ops is ipu.ops.nn_ops


def test_normalisation_layers_match_keras():
    g = layers.GroupNormalization(groups=4, strided_channel_grouping=False)
    np.testing.assert_allclose(g(X), keras.layers.GroupNormalization(groups=4, epsilon=1e-3)(X), atol=1e-5)
    np.testing.assert_allclose(layers.LayerNorm()(X), keras.layers.LayerNormalization(epsilon=1e-3)(X), atol=1e-5)
    np.testing.assert_allclose(layers.InstanceNorm()(X), keras.layers.GroupNormalization(groups=8, epsilon=1e-3)(X),
                               atol=1e-5)
    # strided grouping (the default): channel c in group c % groups = contiguous grouping of the
    # channels reordered [0, 2, 4, 6, 1, 3, 5, 7]
    order = np.argsort(np.arange(8) % 2, kind="stable")
    ref = keras.layers.GroupNormalization(groups=2, epsilon=1e-3)(X[..., order]).numpy()
    out = layers.GroupNorm(groups=2)(X).numpy()
    np.testing.assert_allclose(out[..., order], ref, atol=1e-5)
    with pytest.raises(ValueError, match="8 channels is not commensurate with 3 groups."):
        layers.GroupNorm(groups=3)(X)
    # the functional op creates beta / gamma (zeros / ones); one group: statistics over every
    # non-batch axis (channels and spatial), as Graphcore documents
    np.testing.assert_allclose(ipu.normalization_ops.layer_norm(tf.constant(X), epsilon=1e-3),
                               keras.layers.LayerNormalization(axis=[1, 2], epsilon=1e-3)(X), atol=1e-5)


@pytest.mark.parametrize("dim", ["input_columns", "input_rows_kernel_columns", "kernel_rows"])
def test_serial_dense_and_serialized_matmul_match_dense(dim):
    d = keras.layers.Dense(6)
    d.build((None, 8))
    s = layers.SerialDense(6, 2, dim)
    s.build((None, 8))
    s.set_weights(d.get_weights())
    np.testing.assert_allclose(s(X), d(X), atol=1e-5)
    a, b = tf.constant(X[0]), tf.constant(X[1].T)          # [5, 8] x [8, 5]
    op_dim = {"input_columns": "a_columns", "input_rows_kernel_columns": "a_rows_b_columns", "kernel_rows": "b_rows"}
    k = 4 if dim == "input_rows_kernel_columns" else 5
    np.testing.assert_allclose(ipu.math_ops.serialized_matmul(a, b, k, op_dim[dim]), tf.matmul(a, b), atol=1e-5)
    with pytest.raises(ValueError, match="divide"):
        ipu.math_ops.serialized_matmul(a, b, 3, op_dim[dim])


def test_embedding_dropout_gelu_rnn():
    e, ke = layers.Embedding(12, 3, serialization_factor=4), keras.layers.Embedding(12, 3)
    e.build(None)
    ke.build(None)
    e.set_weights(ke.get_weights())
    ids = np.array([[0, 5, 11], [3, 3, 7]])
    np.testing.assert_array_equal(e(ids), ke(ids))
    np.testing.assert_array_equal(ipu.embedding_ops.embedding_lookup(ke.embeddings, ids, serialization_factor=3),
                                  tf.gather(ke.embeddings, ids))
    with pytest.raises(ValueError, match="serialization_factor"):
        layers.Embedding(10, 3, serialization_factor=4)
    x = tf.ones([1000])
    y = ipu.rand_ops.dropout(x, seed=[1, 2], rate=0.25).numpy()
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)} and 0.18 < np.mean(y == 0) < 0.32
    with pytest.raises(ValueError, match=r"The rate must be in the range \[0, 1\), but was 1.0"):
        ipu.rand_ops.dropout(x, rate=1.0)
    v = tf.constant([-2.0, -0.5, 0.0, 1.0, 3.0])
    np.testing.assert_allclose(ipu.nn_ops.gelu(v), keras.activations.gelu(v, approximate=True), atol=1e-6)
    np.testing.assert_allclose(ipu.nn_ops.gelu(v, approximate=False), keras.activations.gelu(v, approximate=False),
                               atol=1e-6)
    # PopnnLSTM = Keras's LSTM; time_major transposes in and out
    keras.utils.set_random_seed(1)
    lstm = layers.PopnnLSTM(4, return_sequences=True, time_major=True, available_memory_proportion_fwd=0.3)
    out = lstm(np.transpose(X, (1, 0, 2)))
    ref = keras.layers.LSTM(4, return_sequences=True)
    ref.build(X.shape)
    ref.set_weights(lstm.get_weights())
    np.testing.assert_allclose(np.transpose(out, (1, 0, 2)), ref(X), atol=1e-5)
    with pytest.raises(ValueError, match="stateful"):
        layers.PopnnGRU(3, stateful=True)
    assert ipu.cross_replica_ops.cross_replica_sum(v) is not None
    assert int(ipu.replication_ops.replication_index()) == 0


def _on_cpu_then_ipu(fit):
    """``fit()`` (returning the model and its losses) on the CPU, then in an IPUStrategy scope on
    one configured IPU, where it must have run on the simulated IPU (a predicted step). Returns
    both results."""
    cpu = fit()
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    with ipu.ipu_strategy.IPUStrategy().scope():
        on_ipu = fit()
        assert on_ipu[0].ipu_predicted_seconds["cycles"] > 0
    return cpu, on_ipu


def _model():
    keras.utils.set_random_seed(7)
    ids = keras.Input((6,), dtype="int32")
    h = layers.Embedding(16, 8, serialization_factor=2)(ids)           # [B, 6, 8]
    h = layers.LayerNorm()(h)
    h = layers.SerialDense(8, 2, "input_rows_kernel_columns", activation="relu")(h)
    h = layers.GroupNorm(groups=2)(h)
    h = layers.RecomputationCheckpoint()(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Lambda(lambda t: ipu.nn_ops.gelu(t))(h)
    out = keras.layers.Dense(3, activation="softmax")(h)
    return keras.Model(ids, out)


def test_model_of_ipu_layers_trains_on_the_ipu_like_keras_on_the_cpu():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 16, (32, 6)).astype(np.int32)
    y = rng.integers(0, 3, (32,)).astype(np.int32)

    def fit():
        m = _model()
        m.compile(keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy", steps_per_execution=2)
        h = m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        return m, h.history["loss"]
    (m_cpu, l_cpu), (m_ipu, l_ipu) = _on_cpu_then_ipu(fit)      # _model() seeds itself: order-free
    np.testing.assert_allclose(l_ipu, l_cpu, rtol=2e-5)
    for a, b in zip(m_ipu.get_weights(), m_cpu.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rnn", ["LSTM", "GRU"])
def test_recurrent_model_trains_on_the_ipu_like_keras_on_the_cpu(rnn, monkeypatch):
    """Embedding → PopnnLSTM / PopnnGRU → Dense: tf2onnx re-packs the cell's kernels into ONNX's
    LSTM / GRU layout (LSTM: gates reordered, the recurrence bias's zeros appended); the captured
    program computes that layout from the Keras weights (a Gather), so PopART trains the Keras
    variables themselves. The GRU is captured as one ONNX ``GRU`` (no ``Loop``). 2 epochs of 4
    steps, SGD momentum: losses and weights as Keras on the CPU."""
    import ipu_tensorflow_addons.keras.layers as addons
    from tensorflow.python.ipu import _program
    op_types = set()
    orig = _program.IpuProgram.__init__

    def record(self, captured, *args, **kwargs):
        op_types.update(n.op_type for n in captured.model.graph.node)
        orig(self, captured, *args, **kwargs)
    monkeypatch.setattr(_program.IpuProgram, "__init__", record)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, (32, 10)).astype(np.int32)
    y = rng.integers(0, 2, (32, 1)).astype(np.float32)

    def fit():
        keras.utils.set_random_seed(2)
        i = keras.Input((10,), dtype="int32", batch_size=8)
        h = getattr(addons, rnn)(8)(addons.Embedding(50, 8)(i))
        m = keras.Model(i, keras.layers.Dense(1, activation="sigmoid")(h))
        m.compile(keras.optimizers.SGD(0.1, momentum=0.9), "binary_crossentropy", steps_per_execution=2)
        return m, m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    (m_cpu, l_cpu), (m_ipu, l_ipu) = _on_cpu_then_ipu(fit)
    assert rnn in op_types and "Loop" not in op_types, op_types
    np.testing.assert_allclose(l_ipu, l_cpu, rtol=2e-5)
    for a, b in zip(m_ipu.get_weights(), m_cpu.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("optimizer", ["Adam", "RMSprop"])
def test_adam_and_rmsprop_on_an_embedding_match_keras_on_the_cpu(optimizer):
    """Keras 3 receives an embedding table's gradient as TensorFlow ``IndexedSlices`` (one slice
    per lookup) and squares the slices before adding duplicate rows into Adam's / RMSprop's
    second moment; the IPU program does the same (``per_lookup_second_moment``). 20 ids looked
    up 80 times per batch (many repeats), 2 epochs of 4 steps: losses and weights as Keras on the
    CPU (with the square of the summed gradient the second epoch's loss differed by 1.7e-3 /
    1.1e-2 relative for Adam / RMSprop)."""
    import ipu_tensorflow_addons.keras.layers as addons
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, (32, 10)).astype(np.int32)
    y = rng.integers(0, 2, (32, 1)).astype(np.float32)

    def fit():
        keras.utils.set_random_seed(2)
        i = keras.Input((10,), dtype="int32", batch_size=8)
        h = keras.layers.Flatten()(addons.Embedding(20, 4)(i))
        m = keras.Model(i, keras.layers.Dense(1, activation="sigmoid")(h))
        m.compile(getattr(keras.optimizers, optimizer)(0.01), "binary_crossentropy", steps_per_execution=2)
        return m, m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    (m_cpu, l_cpu), (m_ipu, l_ipu) = _on_cpu_then_ipu(fit)
    np.testing.assert_allclose(l_ipu, l_cpu, rtol=2e-5)
    for a, b in zip(m_ipu.get_weights(), m_cpu.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_gru_the_ipu_route_cannot_capture_says_why():
    """A PopnnGRU other than Keras's default (here ``reset_after=False``) would become an ONNX
    ``Loop`` PopART cannot run: the capture stops with a ``NotImplementedError`` naming it."""
    import ipu_tensorflow_addons.keras.layers as addons
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    with ipu.ipu_strategy.IPUStrategy().scope():
        i = keras.Input((7, 5), batch_size=8)
        m = keras.Model(i, addons.GRU(6, reset_after=False)(i))
        m.compile()
        with pytest.raises(NotImplementedError, match="PopnnGRU with reset_after=False on the IPU"):
            m.predict(np.zeros((16, 7, 5), np.float32), batch_size=8, verbose=0)
