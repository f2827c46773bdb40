"""Keras 3 models in an ``IPUStrategy``: ``fit`` / ``evaluate`` / ``predict`` run as PopART programs
on the simulated IPU and match stock Keras on the CPU (same initial weights, same batches)."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import openipu_tf_hook  # noqa: E402,F401

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python import ipu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _configure(n=1):
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = n
    cfg.configure_ipu_system()


def _mlp(seed=3, logits=False):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(3, activation=None if logits else "softmax")])


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8)).astype(np.float32), rng.integers(0, 3, (n,)).astype(np.int32)


def _train(on_ipu, opt, loss, epochs=2, batch_size=8, spe=2, logits=False, ga=None, n_ipus=1, y=None,
           ga_reduction="sum"):
    x, yy = _data()
    y = yy if y is None else y
    if on_ipu:
        _configure(n_ipus)
        strategy = ipu.ipu_strategy.IPUStrategy()
        with strategy.scope():
            model = _mlp(logits=logits)
            model.compile(optimizer=opt, loss=loss, metrics=["accuracy"], steps_per_execution=spe)
            if ga:
                model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=ga,
                                                        gradient_accumulation_reduction_method=ga_reduction)
            hist = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
            ev = model.evaluate(x, y, batch_size=batch_size, verbose=0)
            pred = model.predict(x, batch_size=batch_size, verbose=0)
    else:
        model = _mlp(logits=logits)
        model.compile(optimizer=opt, loss=loss, metrics=["accuracy"], steps_per_execution=spe)
        hist = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
        ev = model.evaluate(x, y, batch_size=batch_size, verbose=0)
        pred = model.predict(x, batch_size=batch_size, verbose=0)
    return model, hist.history, ev, pred


# Adam / AdamW follow Keras's formula (epsilon added to sqrt(v) before the bias correction,
# decoupled weight decay); SGD nesterov PopART's, which is Keras's at a constant learning rate
@pytest.mark.parametrize("make_opt,loss,logits,tol", [
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy", False, 2e-5),
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), "sparse_categorical_crossentropy", False, 2e-5),
    (lambda: keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True), True, 2e-5),
    (lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05), "sparse_categorical_crossentropy", False, 2e-5),
    (lambda: keras.optimizers.RMSprop(0.01), "sparse_categorical_crossentropy", False, 2e-5),
], ids=["sgd_momentum", "sgd_nesterov", "adam_logits", "adamw", "rmsprop"])
def test_mlp_fit_evaluate_predict_match_cpu_keras(make_opt, loss, logits, tol):
    cpu = _train(False, make_opt(), loss, logits=logits)
    dev = _train(True, make_opt(), loss, logits=logits)
    np.testing.assert_allclose(dev[1]["loss"], cpu[1]["loss"], rtol=tol, atol=tol / 10)
    np.testing.assert_allclose(dev[1]["accuracy"], cpu[1]["accuracy"])
    np.testing.assert_allclose(dev[2], cpu[2], rtol=tol, atol=tol / 10)
    np.testing.assert_allclose(dev[3], cpu[3], rtol=tol, atol=tol / 10)
    for a, b in zip(dev[0].get_weights(), cpu[0].get_weights()):
        np.testing.assert_allclose(a, b, rtol=5 * tol, atol=tol)
    assert int(dev[0].optimizer.iterations) == int(cpu[0].optimizer.iterations) == 16
    t = dev[0].ipu_predicted_seconds
    assert t["cycles"] > 0 and t["step"] > 0 and t["execution"] == pytest.approx(2 * t["step"])


@pytest.mark.parametrize("loss,labels", [
    ("categorical_crossentropy", "one_hot"),
    (keras.losses.CategoricalCrossentropy(label_smoothing=0.1), "soft"),
    ("mse", "one_hot"),
    ("mae", "soft"),
    ("binary_crossentropy", "binary_sigmoid"),
    (keras.losses.Huber(delta=0.3), "soft"),
], ids=["ce_one_hot", "ce_smoothed_soft", "mse", "mae", "bce_sigmoid", "huber"])
def test_keras_losses_match_cpu_keras(loss, labels, monkeypatch):
    """Losses other than sparse cross-entropy and MSE run Keras's own loss graph (captured with
    the forward), so clipping epsilons and label smoothing are Keras's. Binary cross-entropy on
    a sigmoid output (Keras on the CPU takes the sigmoid's logits, the IPU the clipped formula:
    equal where the clip does not bite)."""
    _, y = _data()
    rng = np.random.default_rng(1)
    y = {"one_hot": np.eye(3, dtype=np.float32)[y], "soft": rng.dirichlet(np.ones(3), len(y)).astype(np.float32),
         "binary_sigmoid": rng.integers(0, 2, (len(y), 3)).astype(np.float32)}[labels]
    if labels == "binary_sigmoid":
        def sigmoid_mlp(seed=3, logits=False):
            keras.utils.set_random_seed(seed)
            return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                     keras.layers.Dense(3, activation="sigmoid")])
        monkeypatch.setattr(sys.modules[__name__], "_mlp", sigmoid_mlp)
    cpu = _train(False, keras.optimizers.SGD(0.1), loss, y=y)
    dev = _train(True, keras.optimizers.SGD(0.1), loss, y=y)
    np.testing.assert_allclose(dev[1]["loss"], cpu[1]["loss"], rtol=2e-5)
    np.testing.assert_allclose(dev[2][0], cpu[2][0], rtol=2e-5)
    for a, b in zip(dev[0].get_weights(), cpu[0].get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)


def test_gradient_accumulation_sums_the_micro_batch_gradients():
    """Graphcore's default reduction is SUM: 2 micro-batches of 8 at lr 0.05 = one batch of 16
    at lr 0.1 on the CPU."""
    dev = _train(True, keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy", spe=4, ga=2, epochs=1)
    cpu = _train(False, keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", spe=1, batch_size=16,
                 epochs=1)
    for a, b in zip(dev[0].get_weights(), cpu[0].get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert int(dev[0].optimizer.iterations) == 4


def test_gradient_accumulation_mean():
    dev = _train(True, keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", spe=4, ga=2, epochs=1,
                 ga_reduction=ipu.gradient_accumulation.GradientAccumulationReductionMethod.MEAN)
    cpu = _train(False, keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", spe=1, batch_size=16,
                 epochs=1)
    for a, b in zip(dev[0].get_weights(), cpu[0].get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_two_ipus_replicate_the_model():
    """``auto_select_ipus = 2`` on an unpipelined model: 2 replicas, each taking its own batch of
    8; their gradients are summed (one update per step pair = a CPU batch of 16 at twice the
    learning rate)."""
    dev = _train(True, keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy", spe=2, epochs=1, n_ipus=2)
    cpu = _train(False, keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", spe=1, batch_size=16,
                 epochs=1)
    for a, b in zip(dev[0].get_weights(), cpu[0].get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _staged_mlp(n_ipus, ga=4, assign=False, schedule=None):
    keras.utils.set_random_seed(3)
    inp = keras.Input((8,))
    if assign:
        x = keras.layers.Dense(16, activation="relu")(inp)
        out = keras.layers.Dense(3, activation="softmax")(x)
        model = keras.Model(inp, out)
        model.set_pipeline_stage_assignment([0, 1])
    else:
        with keras.ipu.PipelineStage(0):
            x = keras.layers.Dense(16, activation="relu")(inp)
        with keras.ipu.PipelineStage(1):
            out = keras.layers.Dense(3, activation="softmax")(x)
        model = keras.Model(inp, out)
    if ga:
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=ga,
                                     pipeline_schedule=schedule or ipu.ops.pipelining_ops.PipelineSchedule.Grouped)
    return model


@pytest.mark.parametrize("assign", [False, True])
def test_pipelined_model_over_two_ipus_matches_cpu(assign):
    """Two stages (``keras.ipu.PipelineStage`` or ``set_pipeline_stage_assignment``) on 2 IPUs,
    GA 4: PopART's pipeline; the weights equal CPU Keras with batches of 32 at 4x the rate."""
    x, y = _data()
    _configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = _staged_mlp(2, assign=assign)
        assert model.get_pipeline_stage_assignment() == [0, 1]
        model.compile(keras.optimizers.SGD(0.025), "sparse_categorical_crossentropy", steps_per_execution=8)
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        ev = model.evaluate(x, y, batch_size=8, verbose=0)
    cpu = _mlp()
    cpu.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    cpu.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), cpu.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ev, cpu.evaluate(x, y, batch_size=8, verbose=0), rtol=1e-4)
    assert model.ipu_predicted_seconds["cycles"] > 0


@pytest.mark.slow
def test_pipelined_conv_model_with_dropout_trains():
    """A 1-channel conv net (tf2onnx reshapes its input; constants stay unannotated) in two
    stages with a Dropout in the second: compiles, trains (6 weight updates move the weights) and
    predicts."""
    rng = np.random.default_rng(1)
    x = rng.random((64, 8, 8, 1), dtype=np.float32)
    y = (x.mean(axis=(1, 2, 3)) > 0.5).astype(np.int32)
    _configure(2)
    with ipu.ipu_strategy.IPUStrategy().scope():
        keras.utils.set_random_seed(0)
        inp = keras.Input((8, 8, 1))
        with keras.ipu.PipelineStage(0):
            h = keras.layers.Conv2D(4, 3, activation="relu")(inp)
            h = keras.layers.MaxPooling2D()(h)
        with keras.ipu.PipelineStage(1):
            h = keras.layers.Flatten()(h)
            h = keras.layers.Dropout(0.2)(h)
            out = keras.layers.Dense(2, activation="softmax")(h)
        model = keras.Model(inp, out)
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=4)
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy",
                      steps_per_execution=8)
        before = [w.copy() for w in model.get_weights()]
        hist = model.fit(x, y, batch_size=8, epochs=3, verbose=0)
        assert model.predict(x, batch_size=8, verbose=0).shape == (64, 2)
    assert np.isfinite(hist.history["loss"]).all() and len(hist.history["loss"]) == 3
    assert all(not np.allclose(a, b) for a, b in zip(model.get_weights(), before))
    assert int(model.optimizer.iterations) == 6


def test_pipelining_predicts_a_speed_up_over_sharding():
    """The same 2-stage model with ``PipelineSchedule.Sequential`` (stages in turn: sharding) and
    ``Grouped`` (PopART's pipeline): the same weights, fewer predicted cycles per step."""
    x, y = _data()
    _configure(2)
    strategy = ipu.ipu_strategy.IPUStrategy()
    runs = {}
    for schedule in (ipu.ops.pipelining_ops.PipelineSchedule.Sequential,
                     ipu.ops.pipelining_ops.PipelineSchedule.Grouped):
        with strategy.scope():
            model = _staged_mlp(2, ga=8, schedule=schedule)
            model.compile(keras.optimizers.SGD(0.025), "sparse_categorical_crossentropy", steps_per_execution=8)
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        runs[schedule.name] = (model.get_weights(), model.ipu_predicted_seconds["step"])
    for a, b in zip(runs["Sequential"][0], runs["Grouped"][0]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert runs["Grouped"][1] < runs["Sequential"][1]


def test_pipeline_configuration_errors():
    x, y = _data()
    _configure(1)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = _staged_mlp(1, ga=None)
        model.compile("sgd", "sparse_categorical_crossentropy", steps_per_execution=8)
        with pytest.raises(ValueError, match="Current device has 1 IPUs attached, however the current model requires "
                                             "a multiple of 2 IPUs."):
            model.fit(x, y, batch_size=8)
        _configure(2)
        with pytest.raises(ValueError, match=r"is pipelined, however `gradient_accumulation_steps_per_replica` has not "
                                             r"been set through `set_pipelining_options\(\)`"):
            model.fit(x, y, batch_size=8)
        with pytest.raises(ValueError, match=r"The size of the provided `pipeline_stage_assignment` \(1\)"):
            model.set_pipeline_stage_assignment([0])


def _ipu_model(spe=1):
    _configure(1)
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = _mlp()
        model.compile("sgd", "sparse_categorical_crossentropy", steps_per_execution=spe)
    return strategy, model


def test_dataset_rules_give_graphcores_errors():
    x, y = _data()
    strategy, model = _ipu_model(spe=3)
    with strategy.scope():
        with pytest.raises(ValueError, match=r"The provided set of data has a partial batch, which could result in "
                                             r"data being dropped. Either adjust the `batch_size` of your model "
                                             r"\(currently set to 10\)"):
            model.fit(x, y, batch_size=10)
        with pytest.raises(ValueError, match=r"`steps_per_execution` \(3\) must be a divisor of the number of "
                                             r"batches \(8\) in the dataset provided."):
            model.fit(x, y, batch_size=8)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        with pytest.raises(ValueError, match=r"which is not fully defined. Executing on IPU requires all dataset "
                                             r"elements to have fully defined shapes. If using batch\(\) make sure to "
                                             r"set `drop_remainder=True`."):
            model.fit(ds)
        with pytest.raises(ValueError, match="Could not infer the size of the data. You must specify the number of "
                                             "steps to run."):
            model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True).repeat())
        with pytest.raises(ValueError, match="is not compatible with the IPU's requirement to know the data shape"):
            model.fit(iter([(x, y)]))
        model.compile("sgd", "sparse_categorical_crossentropy", steps_per_execution=2)
        model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=4)
        with pytest.raises(RuntimeError, match=r"the current `steps_per_execution` value \(set to 2\) is not "
                                               r"divisible by `gradient_accumulation_steps_per_replica` \(4\)"):
            model.fit(x, y, batch_size=8)
        with pytest.raises(ValueError, match="Expected `gradient_accumulation_steps_per_replica` to be a positive "
                                             "integer, but got 0 instead."):
            model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=0)
        with pytest.raises(ValueError, match="Found `gradient_accumulation_count` key in `pipelining_kwargs`. Set "
                                             "the `gradient_accumulation_steps_per_replica` argument"):
            model.set_pipelining_options(gradient_accumulation_count=4)
        model.compile("sgd", "sparse_categorical_crossentropy", run_eagerly=True)
        with pytest.raises(RuntimeError, match="Keras models cannot run eagerly when using `IPUStrategy`."):
            model.fit(x, y, batch_size=8)


def test_reset_ipu_seed_makes_dropout_repeatable():
    x, y = _data()
    _configure(1)
    runs = []
    for seed in (7, 7, 8):
        ipu.utils.reset_ipu_seed(seed)
        with ipu.ipu_strategy.IPUStrategy().scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dropout(0.5), keras.layers.Dense(3, activation="softmax")])
            model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", steps_per_execution=4)
            runs.append(model.fit(x, y, batch_size=8, epochs=1, verbose=0).history["loss"])
    assert runs[0] == runs[1] and runs[2] != runs[0]


def test_dataset_input_trains_and_spe_larger_than_the_epoch_is_truncated(caplog):
    x, y = _data()
    strategy, model = _ipu_model(spe=100)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    with strategy.scope():
        with caplog.at_level("WARNING", logger="tensorflow.python.ipu"):
            hist = model.fit(ds, epochs=2, verbose=0)
    assert "only contains 4 batches. Using 4 as `steps_per_execution`." in caplog.text
    assert len(hist.history["loss"]) == 2 and hist.history["loss"][1] < hist.history["loss"][0]


def test_models_outside_the_strategy_stay_stock_keras():
    x, y = _data()
    model = _mlp()
    model.compile("sgd", "sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=10, verbose=0)     # a partial batch is fine on the CPU
    assert not hasattr(model, "ipu_predicted_seconds")


def _cifar_main():
    sys.path.insert(0, str(ROOT / "examples" / "tensorflow2"))
    try:
        import cifar10_keras
    finally:
        sys.path.pop(0)
    return cifar10_keras.main


@pytest.mark.slow
def test_cifar10_seed_script_matches_cpu_keras(monkeypatch, capsys):
    """The seed workshop's CIFAR-10 script (IPU port) on generated CIFAR-shaped data: its first
    epochs' losses equal stock Keras's on the CPU (same seed, same batches, dropout off)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (256, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 10, (256, 1), dtype=np.uint8)
    monkeypatch.setattr(keras.datasets.cifar10, "load_data", lambda: ((x, y), (x[:32], y[:32])))
    main = _cifar_main()
    args = ["--samples", "256", "--epochs", "2", "--steps-per-execution", "4", "--dropout", "0"]
    cpu = main(args + ["--cpu"]).history["loss"]
    dev = main(args).history["loss"]
    np.testing.assert_allclose(dev, cpu, rtol=1e-5)
    assert "Predicted IPU time per training step" in capsys.readouterr().out
