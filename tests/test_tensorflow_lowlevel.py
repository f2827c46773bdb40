"""The low-level TF2 API on the simulated IPU: ``IPUStrategy.run`` of a ``tf.function`` step
(``tf.range`` / ``ipu.loops.repeat`` loop, iterators and infeed queues, ``GradientTape`` and a
Keras optimizer, outfeed queues) runs as one PopART program per call and matches the same Python
step run eagerly by TensorFlow on the CPU (same initial weights, same batches)."""

import contextlib
import logging

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import openipu_tf_hook  # noqa: E402,F401

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python import ipu  # noqa: E402
from tensorflow.python.ipu import ipu_infeed_queue, ipu_outfeed_queue, loops  # noqa: E402


def _configure():
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()


def _dataset(n=96, batch=8):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = rng.integers(0, 4, (n,)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def _model():
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="relu"),
                             keras.layers.Dense(4, activation="softmax")])


@tf.function(jit_compile=True)
def training_loop(iterator, outfeed, model, optimizer, n):
    for _ in tf.range(n):
        x, y = next(iterator)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        outfeed.enqueue({"loss": loss})


def _train(on_ipu, make_opt, executions=3, n=4):
    if on_ipu:
        _configure()
        strategy = ipu.ipu_strategy.IPUStrategy()
        with strategy.scope():
            model, opt = _model(), make_opt()
            it, q = iter(_dataset()), ipu_outfeed_queue.IPUOutfeedQueue()
            for _ in range(executions):
                strategy.run(training_loop, args=[it, q, model, opt, n])
    else:
        strategy = None
        model, opt = _model(), make_opt()
        it, q = iter(_dataset()), ipu_outfeed_queue.IPUOutfeedQueue()
        for _ in range(executions):
            training_loop.python_function(it, q, model, opt, n)      # eagerly on the CPU
    return strategy, model, opt, np.asarray(q.dequeue()["loss"])


@pytest.mark.parametrize("make_opt", [lambda: keras.optimizers.SGD(0.05, momentum=0.9),
                                      lambda: keras.optimizers.Adam(0.01)], ids=["sgd_momentum", "adam"])
def test_training_loop_matches_cpu(make_opt, caplog):
    caplog.set_level(logging.INFO, logger="tensorflow.python.ipu")
    strategy, m_ipu, opt_ipu, l_ipu = _train(True, make_opt)
    _, m_cpu, opt_cpu, l_cpu = _train(False, make_opt)
    assert l_ipu.shape == (12,)
    np.testing.assert_allclose(l_ipu, l_cpu, rtol=2e-5)
    for a, b in zip(m_ipu.get_weights(), m_cpu.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert int(opt_ipu.iterations) == int(opt_cpu.iterations) == 12
    pred = strategy.ipu_predicted_seconds
    assert pred["cycles"] > 0 and pred["step"] == pytest.approx(pred["execution"] / 4)
    assert "ran on the simulated IPU, 4 steps per execution" in caplog.text
    assert "host CPU" not in caplog.text


def test_repeat_with_infeed_inference_and_tensor_arguments():
    _configure()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = _model()
        infeed = ipu_infeed_queue.IPUInfeedQueue(_dataset())
        outfeed = ipu_outfeed_queue.IPUOutfeedQueue()

        def body(scale, x, y):
            outfeed.enqueue(model(x) * scale)
            return scale

        @tf.function
        def predict(scale):
            return loops.repeat(3, body, [scale], infeed)

        out = strategy.run(predict, args=[tf.constant(2.0)])
        got = np.asarray(outfeed.dequeue())
    xs = np.stack([np.asarray(x) for (x, _), _ in zip(_dataset(), range(3))])
    assert got.shape == (3, 8, 4)
    np.testing.assert_allclose(got, 2.0 * np.stack([model(x).numpy() for x in xs]), rtol=1e-5, atol=1e-7)
    assert float(out[0]) == 2.0
    assert strategy.ipu_predicted_seconds["cycles"] > 0

    @tf.function
    def step(x, y, model, opt):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True)))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    batches = [(x, y) for (x, y), _ in zip(_dataset(), range(3))]
    with strategy.scope():
        m1, o1 = _model(), keras.optimizers.SGD(0.1)
        ipu_losses = [float(strategy.run(step, args=[x, y, m1, o1])) for x, y in batches]
    m2, o2 = _model(), keras.optimizers.SGD(0.1)
    cpu_losses = [float(step.python_function(x, y, m2, o2)) for x, y in batches]
    np.testing.assert_allclose(ipu_losses, cpu_losses, rtol=1e-5)


def test_unsupported_step_runs_on_cpu_with_a_warning(caplog):
    _configure()
    strategy = ipu.ipu_strategy.IPUStrategy()

    @tf.function
    def count(x):
        return loops.while_loop(lambda v: v < 10.0, lambda v: v * 2.0, [x])

    with strategy.scope():
        out = strategy.run(count, args=[tf.constant(1.5)])
        counter = tf.Variable(0.0)

        @tf.function
        def bump(x):
            counter.assign_add(x)
            return counter.read_value()

        strategy.run(bump, args=[tf.constant(2.0)])
        strategy.run(bump, args=[tf.constant(3.0)])
    assert float(out[0]) == 12.0
    assert "runs with TensorFlow on the host CPU, not on the simulated IPU: ipu.loops.while_loop" in caplog.text
    assert float(counter.numpy()) == 5.0        # the assignments are not lost
    assert "changes variables other than through the optimizer (AssignAddVariableOp)" in caplog.text


def test_weights_and_learning_rate_changed_between_calls_reach_the_program():
    """The program keeps its weights between calls (only re-sent when the Keras values differ)
    and its learning rate (only re-sent when it changes): a ``set_weights`` and a new learning
    rate between two calls still take effect, as on the CPU."""
    def run(on_ipu):
        if on_ipu:
            _configure()
            strategy = ipu.ipu_strategy.IPUStrategy()

            def call(*a):
                return strategy.run(training_loop, args=list(a))
        else:
            strategy = None
            call = training_loop.python_function
        with strategy.scope() if strategy else contextlib.nullcontext():
            model, opt = _model(), keras.optimizers.SGD(0.05)
            it, q = iter(_dataset()), ipu_outfeed_queue.IPUOutfeedQueue()
            call(it, q, model, opt, 2)
            call(it, q, model, opt, 2)                  # unchanged: nothing re-sent
            model.set_weights([w * 0.5 for w in model.get_weights()])
            opt.learning_rate.assign(0.2)
            call(it, q, model, opt, 2)
        return np.asarray(q.dequeue()["loss"]), model.get_weights()
    l_ipu, w_ipu = run(True)
    l_cpu, w_cpu = run(False)
    np.testing.assert_allclose(l_ipu, l_cpu, rtol=2e-5)
    for a, b in zip(w_ipu, w_cpu):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_two_replicas_sum_their_gradients():
    """``auto_select_ipus = 2``: ``strategy.run`` runs the step on 2 replicas, each taking its own
    batches (step-major); the gradients are summed, so 2 replicas of batch 8 at learning rate
    0.05 equal batches of 16 at 0.1 on the CPU; the outfeed has a replica dimension."""
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model, opt = _model(), keras.optimizers.SGD(0.05, momentum=0.9)
        it, q = iter(_dataset(batch=8)), ipu_outfeed_queue.IPUOutfeedQueue()
        for _ in range(2):
            strategy.run(training_loop, args=[it, q, model, opt, 3])
        l_ipu = np.asarray(q.dequeue()["loss"])
    m_cpu, o_cpu = _model(), keras.optimizers.SGD(0.1, momentum=0.9)
    it, q = iter(_dataset(batch=16)), ipu_outfeed_queue.IPUOutfeedQueue()
    for _ in range(2):
        training_loop.python_function(it, q, m_cpu, o_cpu, 3)
    l_cpu = np.asarray(q.dequeue()["loss"])
    assert l_ipu.shape == (6, 2) and l_cpu.shape == (6,)
    np.testing.assert_allclose(l_ipu.mean(axis=1), l_cpu, rtol=2e-5)
    assert not np.allclose(l_ipu[:, 0], l_ipu[:, 1])        # each replica its own batches
    for a, b in zip(model.get_weights(), m_cpu.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert int(opt.iterations) == 6
    assert strategy.ipu_predicted_seconds["cycles"] > 0


def test_keras_adam_on_an_embedding_in_a_step_matches_cpu():
    """``apply_gradients`` of Keras 3's Adam in a step gets the embedding's gradient as
    ``IndexedSlices`` too: its second moment per lookup on the simulated IPU as on the CPU
    (2 calls of a 4-step loop, ids 0-19 repeated in each batch of 8 x 10; without it the
    losses differed by 1.3e-3, the weights by 0.03)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, (64, 10)).astype(np.int32)
    y = rng.integers(0, 2, (64, 1)).astype(np.float32)

    def run(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(2)
            i = keras.Input((10,), dtype="int32", batch_size=8)
            h = keras.layers.Flatten()(keras.layers.Embedding(20, 4)(i))
            m = keras.Model(i, keras.layers.Dense(1, activation="sigmoid")(h))
            opt, mse = keras.optimizers.Adam(0.01), keras.losses.MeanSquaredError()
            it = iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True))

            @tf.function
            def step(it):
                for _ in tf.range(4):
                    a, b = next(it)
                    with tf.GradientTape() as tape:
                        loss = mse(b, m(a, training=True))
                    opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
                return loss
            return [float(strategy.run(step, args=(it,))) for _ in range(2)], m.get_weights()
    _configure()
    strategy = ipu.ipu_strategy.IPUStrategy()
    l_ipu, w_ipu = run(strategy)
    assert strategy.ipu_predicted_seconds["cycles"] > 0
    l_cpu, w_cpu = run(tf.distribute.OneDeviceStrategy("/cpu:0"))
    np.testing.assert_allclose(l_ipu, l_cpu, rtol=2e-5)
    for a, b in zip(w_ipu, w_cpu):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
