"""Keras models with several inputs and outputs in an ``IPUStrategy``: ``fit`` / ``evaluate`` /
``predict`` with dict and list inputs, per-output losses, ``loss_weights`` and per-output metrics
match stock Keras on the CPU (same initial weights, same batches)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
import openipu_tf_hook  # noqa: F401

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python import ipu  # noqa: E402


def _model(as_dict):
    keras.utils.set_random_seed(7)
    a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    cls = keras.layers.Dense(4, activation="softmax", name="cls")(h)
    reg = keras.layers.Dense(2, name="reg")(h)
    if as_dict:
        return keras.Model({"a": a, "b": b}, {"cls": cls, "reg": reg})
    return keras.Model([a, b], [cls, reg])


def _data(as_dict, n=32):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(n, 6)).astype(np.float32), rng.normal(size=(n, 3)).astype(np.float32)
    c, r = rng.integers(0, 4, (n,)).astype(np.int32), rng.normal(size=(n, 2)).astype(np.float32)
    if as_dict:
        return {"a": a, "b": b}, {"cls": c, "reg": r}
    return [a, b], [c, r]


def _run(on_ipu, as_dict, dataset=False):
    x, y = _data(as_dict)
    if as_dict:
        kw = dict(loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"}, loss_weights={"cls": 1.0, "reg": 0.5},
                  metrics={"cls": ["accuracy"], "reg": ["mae"]})
    else:
        kw = dict(loss=["sparse_categorical_crossentropy", "mae"], loss_weights=[0.3, 2.0],
                  metrics=[["accuracy"], ["mse"]])

    def go():
        model = _model(as_dict)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5), steps_per_execution=2, **kw)
        if dataset:
            ds = tf.data.Dataset.from_tensor_slices((tuple(x) if not as_dict else x,
                                                     tuple(y) if not as_dict else y)).batch(8, drop_remainder=True)
            hist = model.fit(ds, epochs=2, verbose=0)
            ev = model.evaluate(ds, verbose=0, return_dict=True)
        else:
            hist = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
            ev = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
        pred = model.predict(x, batch_size=8, verbose=0)
        return model, hist.history, ev, pred
    if not on_ipu:
        return go()
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    with ipu.ipu_strategy.IPUStrategy().scope():
        out = go()
    assert out[0].ipu_predicted_seconds["cycles"] > 0
    return out


@pytest.mark.parametrize("as_dict,dataset", [(True, False), (False, True)], ids=["dict_numpy", "list_dataset"])
def test_multi_input_multi_output_match_cpu_keras(as_dict, dataset):
    m_ipu, h_ipu, ev_ipu, p_ipu = _run(True, as_dict, dataset)
    m_cpu, h_cpu, ev_cpu, p_cpu = _run(False, as_dict, dataset)
    assert sorted(h_ipu) == sorted(h_cpu)           # loss, per-output losses, per-output metrics
    assert len([k for k in h_cpu if k.endswith("_loss")]) == 2
    for k in h_cpu:
        np.testing.assert_allclose(h_ipu[k], h_cpu[k], rtol=2e-5, atol=1e-6, err_msg=k)
    assert sorted(ev_ipu) == sorted(ev_cpu)
    for k in ev_cpu:
        np.testing.assert_allclose(ev_ipu[k], ev_cpu[k], rtol=2e-5, atol=1e-6, err_msg=k)
    assert type(p_ipu) is type(p_cpu)
    for a, b in zip(tf.nest.flatten(p_ipu), tf.nest.flatten(p_cpu)):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    for a, b in zip(m_ipu.get_weights(), m_cpu.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
