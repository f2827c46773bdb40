"""``ipu.optimizers`` (Graphcore TF2 API) around TensorFlow v1 optimizers in an ``IPUStrategy.run``
custom step: on the simulated IPU (PopART gradient accumulation, replicated graphs) the weights
and losses equal the same step run eagerly by TensorFlow on the CPU, and the CPU semantics of the
wrappers equal hand-computed updates."""

import logging

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import openipu_tf_hook  # noqa: E402,F401

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python import ipu  # noqa: E402
from tensorflow.python.ipu import ipu_outfeed_queue  # noqa: E402

v1 = tf.compat.v1.train


def _configure(n=1):
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = n
    cfg.configure_ipu_system()


def _data(n=64, batch=8):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = rng.integers(0, 4, (n,)).astype(np.int32)
    return x, y, tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def _model():
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="relu"),
                             keras.layers.Dense(4, activation="softmax")])


def _loss(model, x, y):
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True)))


def _tf_vars(model):
    """The model's tf.Variables (a v1 optimizer updates tf.Variable objects, not Keras 3's)."""
    return [v.value for v in model.trainable_variables]


@tf.function(jit_compile=True)
def loop(iterator, outfeed, model, optimizer, n):
    for _ in tf.range(n):
        x, y = next(iterator)
        with tf.GradientTape() as tape:
            loss = _loss(model, x, y)
        variables = _tf_vars(model)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        outfeed.enqueue(loss)


def _run(make_opt, on_ipu, executions=2, n=4, ipus=1):
    _, _, ds = _data()
    if on_ipu:
        _configure(ipus)
        strategy = ipu.ipu_strategy.IPUStrategy()
        with strategy.scope():
            model, opt = _model(), make_opt()
            it, q = iter(ds), ipu_outfeed_queue.IPUOutfeedQueue()
            for _ in range(executions):
                strategy.run(loop, args=[it, q, model, opt, n])
        return strategy, model, np.asarray(q.dequeue())
    model, opt = _model(), make_opt()
    it, q = iter(ds), ipu_outfeed_queue.IPUOutfeedQueue()
    for _ in range(executions):
        loop.python_function(it, q, model, opt, n)
    return None, model, np.asarray(q.dequeue())


@pytest.mark.parametrize("make_opt", [
    lambda: v1.MomentumOptimizer(0.05, 0.9),
    lambda: ipu.optimizers.CrossReplicaOptimizer(v1.AdamOptimizer(0.01)),
    lambda: ipu.optimizers.GradientAccumulationOptimizerV2(v1.GradientDescentOptimizer(0.1), 2),
    lambda: ipu.optimizers.GradientAccumulationOptimizerV2(
        v1.MomentumOptimizer(0.1, 0.9), 4,
        reduction_method=ipu.optimizers.GradientAccumulationReductionMethod.MEAN),
], ids=["momentum", "cross_replica_adam", "ga2_sum", "ga4_mean_momentum"])
def test_v1_optimizers_on_the_ipu_match_cpu(make_opt, caplog):
    caplog.set_level(logging.WARNING, logger="tensorflow.python.ipu")
    strategy, m_ipu, l_ipu = _run(make_opt, True)
    assert "host CPU" not in caplog.text            # it ran on the simulated IPU
    assert strategy.ipu_predicted_seconds["cycles"] > 0
    _, m_cpu, l_cpu = _run(make_opt, False)
    np.testing.assert_allclose(l_ipu, l_cpu, rtol=2e-5)
    for a, b in zip(m_ipu.get_weights(), m_cpu.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_cross_replica_optimizer_averages_two_replicas():
    """2 replicas of batch 8 with CrossReplicaOptimizer(SGD 0.1) equal CPU batches of 16 at lr 0.1:
    the average of the replicas' mean losses' gradients is the gradient of the batch-16 mean."""
    _, m_ipu, l_ipu = _run(lambda: ipu.optimizers.CrossReplicaOptimizer(v1.GradientDescentOptimizer(0.1)),
                           True, executions=2, n=2, ipus=2)
    assert l_ipu.shape == (4, 2)
    x, y, _ = _data()
    model, opt = _model(), v1.GradientDescentOptimizer(0.1)
    for step in range(4):
        xb, yb = x[16 * step:16 * step + 16], y[16 * step:16 * step + 16]
        with tf.GradientTape() as tape:
            loss = _loss(model, xb, yb)
        opt.apply_gradients(zip(tape.gradient(loss, _tf_vars(model)), _tf_vars(model)))
    for a, b in zip(m_ipu.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_replicas_without_cross_replica_optimizer_are_refused():
    with pytest.raises(NotImplementedError, match="CrossReplicaOptimizer"):
        _run(lambda: v1.GradientDescentOptimizer(0.1), True, executions=1, n=2, ipus=2)


def test_wrapper_semantics_on_the_cpu():
    with pytest.raises(ValueError, match="num_mini_batches must be a positive number."):
        ipu.optimizers.GradientAccumulationOptimizerV2(v1.GradientDescentOptimizer(0.1), 0)
    with pytest.raises(TypeError, match="GradientDescentOptimizer and"):
        ipu.optimizers.GradientAccumulationOptimizer(v1.AdamOptimizer(0.1), 2)
    with pytest.raises(TypeError, match="tf.compat.v1.train.Optimizer"):
        ipu.optimizers.CrossReplicaOptimizer(keras.optimizers.SGD(0.1))
    # accumulation: no update until the 3rd call, then w -= lr * (sum or mean of the 3 gradients)
    for method, scale in (("SUM", 1.0), ("MEAN", 1 / 3), ("RUNNING_MEAN", 1 / 3)):
        w = tf.Variable([1.0, 2.0])
        opt = ipu.optimizers.GradientAccumulationOptimizerV2(v1.GradientDescentOptimizer(0.5), 3,
                                                             reduction_method=method)
        grads = [np.array([1.0, 0.0]), np.array([2.0, 1.0]), np.array([3.0, -4.0])]
        for i, g in enumerate(grads):
            opt.apply_gradients([(tf.constant(g, tf.float32), w)])
            if i < 2:
                np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
        np.testing.assert_allclose(w.numpy(), np.array([1.0, 2.0]) - 0.5 * scale * sum(grads), rtol=1e-6)
    # mapping in compute_gradients (so in minimize), not in apply_gradients
    w = tf.Variable([1.0, 2.0])
    opt = ipu.optimizers.MapGradientOptimizer(v1.GradientDescentOptimizer(1.0), lambda g, v: g + 0.1 * v)
    opt.minimize(lambda: tf.reduce_sum(w * w), var_list=[w])
    np.testing.assert_allclose(w.numpy(), [1.0 - (2.0 + 0.1), 2.0 - (4.0 + 0.2)], rtol=1e-6)
    opt.apply_gradients([(tf.constant([1.0, 1.0]), w)])
    np.testing.assert_allclose(w.numpy(), [-1.1 - 1.0, -2.2 - 1.0], rtol=1e-6)
