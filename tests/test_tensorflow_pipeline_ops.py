"""``ipu.pipelining_ops.pipeline`` in a step ``IPUStrategy.run`` runs on the simulated IPU: the
stages become a PopART pipeline over the mapped IPUs, with gradient accumulation; it matches the
same training on the CPU and predicts a speed-up over sharding (``PipelineSchedule.Sequential``)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import openipu_tf_hook  # noqa: F401

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python import ipu  # noqa: E402
from tensorflow.python.ipu import ipu_infeed_queue, ipu_outfeed_queue, pipelining_ops  # noqa: E402


N, WIDTH, HIDDEN, GA = 128, 64, 256, 8


def _configure(n):
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = n
    cfg.configure_ipu_system()


def _dataset(batch):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, WIDTH)).astype(np.float32)
    y = rng.integers(0, 4, (N,)).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat()


def _layers():
    keras.utils.set_random_seed(5)
    d1, d2 = keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(4, activation="softmax")
    d1.build((None, WIDTH))
    d2.build((None, HIDDEN))
    return d1, d2


def _pipelined(schedule=None, calls=2, lr=0.1 / GA, recompute=False, **pipeline_kwargs):
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.allow_recompute = recompute
    cfg.configure_ipu_system()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        d1, d2 = _layers()
        opt = keras.optimizers.SGD(lr, momentum=0.9)
        infeed = ipu_infeed_queue.IPUInfeedQueue(_dataset(8))
        outfeed = ipu_outfeed_queue.IPUOutfeedQueue()

        def stage1(x, y):
            return d1(x), y

        def stage2(h, y):
            p = d2(h)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, p))
            return (loss, tf.reduce_max(p)) if pipeline_kwargs.get("outfeed_loss") else loss

        def optimizer_function(loss, *_):
            return pipelining_ops.OptimizerFunctionOutput(opt, loss)

        @tf.function
        def step():
            pipelining_ops.pipeline([stage1, stage2], gradient_accumulation_count=GA, repeat_count=2,
                                    infeed_queue=infeed, outfeed_queue=outfeed, optimizer_function=optimizer_function,
                                    device_mapping=[0, 1], pipeline_schedule=schedule, **pipeline_kwargs)
        for _ in range(calls):
            strategy.run(step)
    return np.asarray(outfeed.dequeue()), d1.get_weights() + d2.get_weights(), opt, strategy.ipu_predicted_seconds


def _cpu():
    """CPU training on batches GA times larger at lr 0.1: (losses, layers)."""
    d1, d2 = _layers()
    opt_cpu = keras.optimizers.SGD(0.1, momentum=0.9)
    cpu = []
    for (x, y), _ in zip(_dataset(8 * GA), range(4)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, d2(d1(x))))
        variables = d1.trainable_variables + d2.trainable_variables
        opt_cpu.apply_gradients(zip(tape.gradient(loss, variables), variables))
        cpu.append(float(loss))
    return cpu, d1, d2


def test_pipeline_matches_cpu_and_predicts_a_speed_up_over_sharding():
    losses, weights, opt, pred = _pipelined()       # GA sums: lr / GA on batches GA times larger
    cpu, d1, d2 = _cpu()
    assert losses.shape == (4 * GA,)
    np.testing.assert_allclose(losses.reshape(4, GA).mean(axis=1), cpu, rtol=2e-5)
    for a, b in zip(weights, d1.get_weights() + d2.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert int(opt.iterations) == 4
    _, w_seq, _, pred_seq = _pipelined(pipelining_ops.PipelineSchedule.Sequential, calls=1)
    print("predicted cycles per execution: pipelined", pred["cycles"], "sequential", pred_seq["cycles"])
    assert pred["cycles"] < pred_seq["cycles"]


def test_pipeline_mean_reduction_outfeed_loss_accumulate_and_recompute():
    """``reduction_method=MEAN`` at lr 0.1 equals the CPU's batches of 64 at lr 0.1;
    ``outfeed_loss`` outfeeds the loss (not the last stage's pair), ``accumulate_outfeed`` one
    sum per update; ``allow_recompute`` keeps the values and predicts more cycles."""
    kw = dict(lr=0.1, reduction_method=ipu.gradient_accumulation.GradientAccumulationReductionMethod.MEAN,
              outfeed_loss=True, accumulate_outfeed=True)
    losses, weights, _, pred = _pipelined(recompute=True, **kw)
    cpu, d1, d2 = _cpu()
    assert losses.shape == (4,)
    np.testing.assert_allclose(losses, GA * np.asarray(cpu), rtol=2e-5)
    for a, b in zip(weights, d1.get_weights() + d2.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    _, w_plain, _, pred_plain = _pipelined(recompute=False, calls=2, **kw)
    for a, b in zip(weights, w_plain):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    print("predicted cycles per execution: recompute", pred["cycles"], "plain", pred_plain["cycles"])
    assert pred["cycles"] > pred_plain["cycles"]
    with pytest.raises(ValueError, match="optimizer_function must be provided"):
        pipelining_ops.pipeline([lambda x: x, lambda x: x], gradient_accumulation_count=4, outfeed_loss=True)


def test_pipeline_errors():
    with pytest.raises(ValueError, match="gradient_accumulation_count must be specified."):
        pipelining_ops.pipeline([lambda x: x, lambda x: x])
    with pytest.raises(ValueError, match="Pipeline requires at least two computational stages."):
        pipelining_ops.pipeline([lambda x: x], gradient_accumulation_count=4)
    with pytest.raises(ValueError, match=r"Each stage must be mapped to an IPU: 1 mappings != 2 stages"):
        pipelining_ops.pipeline([lambda x: x, lambda x: x], gradient_accumulation_count=4, device_mapping=[0])
