"""The IR executor (``OPENIPU_EXECUTION=ir``) against the device-storage emulation: the same
outputs within the plan's precision and the same predicted cycles, for every anchor return type,
batches per step, weights sent from the host, and the sessions it does not cover."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import popart


def _model(const_weights=True):
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3, 8]), "x")
    w = b.addInitializedInputTensor(rng.standard_normal((8, 5)).astype(np.float32), "w")
    bias = b.addInitializedInputTensor(rng.standard_normal(5).astype(np.float32), "bias")
    h = b.aiOnnx.add([b.aiOnnx.matmul([x, w]), bias])
    r = b.aiOnnx.relu([h])
    y = b.aiOnnx.softmax([r], axis=1)
    b.addOutputTensor(y)
    return b.getModelProto(), x, h, y


def _run(monkeypatch, mode, arts, bps=4, const_weights=True, new_w=None):
    monkeypatch.setenv("OPENIPU_EXECUTION", mode)
    proto, x, h, y = _model()
    opts = popart.SessionOptions()
    opts.constantWeights = const_weights
    flow = popart.DataFlow(bps, {t: art for t, art in zip((y, h), arts)})
    s = popart.InferenceSession(fnModel=proto, dataFlow=flow, userOptions=opts,
                                deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
    s.prepareDevice()
    if new_w is not None:
        s.writeWeights(popart.PyWeightsIO({"w": new_w}))
        s.weightsFromHost()
    a = s.initAnchorArrays()
    xs = np.random.default_rng(1).standard_normal((bps, 3, 8)).astype(np.float32)
    s.run(popart.PyStepIO({x: xs}, a))
    return s, {k: v.copy() for k, v in a.items()}, s.getCycleCount()


ARTS = [("ALL", "ALL"), ("FINAL", "SUM"), ("EVERYN", "ALL"), ("SUM", "FINAL")]


@pytest.mark.parametrize("arts", ARTS, ids=["-".join(a) for a in ARTS])
def test_anchor_return_types_agree_with_the_device_emulation(monkeypatch, arts):
    made = [popart.AnchorReturnType(a, 2) if a == "EVERYN" else popart.AnchorReturnType(a) for a in arts]
    s_dev, dev, c_dev = _run(monkeypatch, "device", made)
    s_ir, ir, c_ir = _run(monkeypatch, "ir", made)
    assert not getattr(s_dev, "_fast", None) and s_ir._fast
    assert c_dev == c_ir > 0
    for k in dev:
        assert dev[k].shape == ir[k].shape
        np.testing.assert_allclose(ir[k], dev[k], rtol=1e-5, atol=1e-6)


def test_weights_sent_from_the_host_are_used(monkeypatch):
    w = np.full((8, 5), 0.25, np.float32)
    arts = [popart.AnchorReturnType("ALL")] * 2
    _, dev, _ = _run(monkeypatch, "device", arts, const_weights=False, new_w=w)
    s, ir, _ = _run(monkeypatch, "ir", arts, const_weights=False, new_w=w)
    assert s._fast
    for k in dev:
        np.testing.assert_allclose(ir[k], dev[k], rtol=1e-5, atol=1e-6)
    # writeWeights on a prepared session reaches the device (both modes)
    s.writeWeights(popart.PyWeightsIO({"w": np.zeros((8, 5), np.float32)}))
    a = s.initAnchorArrays()
    xs = np.random.default_rng(1).standard_normal((4, 3, 8)).astype(np.float32)
    s.run(popart.PyStepIO({"x": xs}, a))
    _, dev0, _ = _run(monkeypatch, "device", arts, const_weights=False, new_w=np.zeros((8, 5), np.float32))
    for k in dev0:
        np.testing.assert_allclose(a[k], dev0[k], rtol=1e-5, atol=1e-6)


def test_sessions_it_does_not_cover_run_on_the_device_emulation(monkeypatch):
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    proto, x, h, y = _model()
    b = popart.Builder(proto)
    loss = b.aiGraphcore.l1loss([y], 0.1)
    opts = popart.SessionOptions()
    opts.syntheticDataMode = popart.SyntheticDataMode.Zeros
    s = popart.TrainingSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {loss: popart.AnchorReturnType("ALL")}),
                               loss=loss, optimizer=popart.ConstSGD(0.1), userOptions=opts,
                               deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.ones((3, 8), np.float32)}, a))
    assert s._fast is False     # (synthetic data streams no anchors either)


def test_an_unknown_mode_is_a_popart_error(monkeypatch):
    monkeypatch.setenv("OPENIPU_EXECUTION", "fastest")
    proto, x, h, y = _model()
    s = popart.InferenceSession(fnModel=proto, dataFlow=popart.DataFlow(1, {y: popart.AnchorReturnType("ALL")}),
                                deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
    with pytest.raises(popart.popart_exception, match="OPENIPU_EXECUTION"):
        s.prepareDevice()


def test_minilm_with_real_weights_agrees(monkeypatch, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))
    from export_minilm import export
    data = export(tmp_path / "m.onnx", batch=2, seq=16)
    feeds = {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}
    outs = {}
    for mode in ("device", "ir"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        s = popart.InferenceSession(fnModel=str(tmp_path / "m.onnx"),
                                    dataFlow=popart.DataFlow(1, {"last_hidden_state": popart.AnchorReturnType("ALL")}),
                                    deviceInfo=popart.DeviceManager().acquireAvailableDevice(numIpus=1))
        s.prepareDevice()
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO(feeds, a))
        outs[mode] = (a["last_hidden_state"], s.getCycleCount())
    assert outs["ir"][1] == outs["device"][1]
    np.testing.assert_allclose(outs["ir"][0], outs["device"][0], rtol=0, atol=1e-5)


def _train(monkeypatch, mode, opt_name, bps=2, steps=3, fp16=False, rf=1, af=1, arts=None):
    monkeypatch.setenv("OPENIPU_EXECUTION", mode)
    rng = np.random.default_rng(0)
    dt, ft = (np.float16, "FLOAT16") if fp16 else (np.float32, "FLOAT")
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo(ft, [4, 8]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [4]), "lab")
    w = b.addInitializedInputTensor(rng.standard_normal((8, 5)).astype(dt), "w")
    bias = b.addInitializedInputTensor(rng.standard_normal(5).astype(dt), "bias")
    h = b.aiOnnx.add([b.aiOnnx.matmul([x, w]), bias])
    y = b.aiOnnx.softmax([b.aiOnnx.relu([h])], axis=1)
    loss = b.aiGraphcore.nllloss([y, lab])
    opt = {"sgd0": lambda: popart.SGD({"defaultLearningRate": (0.1, False)}),
           "sgd1": lambda: popart.SGD({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, False),
                                       "defaultWeightDecay": (0.01, False)}),
           "adam": lambda: popart.Adam({"defaultLearningRate": (0.01, False), "defaultWeightDecay": (0.01, True)}),
           "lamb": lambda: popart.Adam({"defaultLearningRate": (0.01, False)}, popart.AdamMode.Lamb),
           "adam_keras": lambda: _keras_adam(),
           "rmsprop": lambda: popart.Adaptive({"defaultLearningRate": (0.01, False), "defaultMomentum": (0.5, False)},
                                              popart.AdaptiveMode.CenteredRMSProp)}[opt_name]()
    opts = popart.SessionOptions()
    if rf > 1:
        opts.enableReplicatedGraphs, opts.replicatedGraphCount = True, rf
    if af > 1:
        opts.enableGradientAccumulation, opts.accumulationFactor = True, af
    arts = arts or {loss: "ALL", popart.reservedGradientPrefix() + w: "FINAL"}
    s = popart.TrainingSession(fnModel=b.getModelProto(), loss=loss, optimizer=opt, userOptions=opts,
                               dataFlow=popart.DataFlow(bps, {(loss if k == "loss" else k): _art(v)
                                                              for k, v in arts.items()}),
                               deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": rf,
                                                                                       "tilesPerIPU": 8}))
    s.prepareDevice()
    s.weightsFromHost()
    data = np.random.default_rng(2)
    losses = []
    lead = tuple(d for d in (bps, af, rf) if d > 1)
    for _ in range(steps):
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: data.standard_normal(lead + (4, 8)).astype(dt),
                               lab: data.integers(0, 5, lead + (4,)).astype(np.int32)}, a))
        losses.append({k: v.copy() for k, v in a.items()})
    if opt_name == "sgd1":          # a new learning rate reaches the device in both modes
        s.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (0.05, False), "defaultMomentum": (0.9, False),
                                              "defaultWeightDecay": (0.01, False)}))
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: data.standard_normal(lead + (4, 8)).astype(dt),
                               lab: data.integers(0, 5, lead + (4,)).astype(np.int32)}, a))
        losses.append({k: v.copy() for k, v in a.items()})
    s.weightsToHost()
    weights = {"w": np.zeros((8, 5), dt), "bias": np.zeros(5, dt)}
    s.readWeights(popart.PyWeightsIO(weights))
    return s, losses, weights, s.getCycleCount()


def _keras_adam():
    """Adam with Keras's epsilon placement (the TensorFlow route's ``eps_before_correction``);
    a large eps so that the placement matters."""
    opt = popart.Adam({"defaultLearningRate": (0.01, False), "defaultEps": (0.1, True)})
    opt.eps_before_correction = True
    return opt


@pytest.mark.parametrize("opt", ["sgd0", "sgd1", "adam", "lamb", "adam_keras", "rmsprop"])
def test_training_agrees_with_the_device_emulation(monkeypatch, opt):
    _, l_dev, w_dev, c_dev = _train(monkeypatch, "device", opt)
    s, l_ir, w_ir, c_ir = _train(monkeypatch, "ir", opt)
    assert s._fast and c_dev == c_ir
    for a, b in zip(l_dev, l_ir):
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5)
    for k in w_dev:
        np.testing.assert_allclose(w_ir[k], w_dev[k], rtol=1e-4, atol=1e-5)
        assert not np.array_equal(w_ir[k], _model_init(k))      # trained


def _art(name):
    return popart.AnchorReturnType(name, 2) if name == "EVERYN" else popart.AnchorReturnType(name)


def _agree(monkeypatch, opt, tol=(1e-4, 1e-5), **kw):
    _, l_dev, w_dev, c_dev = _train(monkeypatch, "device", opt, **kw)
    s, l_ir, w_ir, c_ir = _train(monkeypatch, "ir", opt, **kw)
    assert s._fast and c_dev == c_ir
    for a, b in zip(l_dev, l_ir):
        for k in a:
            assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
            np.testing.assert_allclose(b[k], a[k], rtol=tol[0], atol=tol[1], err_msg=k)
    for k in w_dev:
        np.testing.assert_allclose(w_ir[k], w_dev[k], rtol=tol[0], atol=tol[1], err_msg=k)
        assert not np.array_equal(w_ir[k], _model_init(k))      # trained


SCHEDULES = [dict(af=3), dict(af=2, bps=4, arts={"loss": "EVERYN", "Gradient___w": "SUM", "w": "FINAL"}),
             dict(rf=2), dict(rf=2, af=2, arts={"loss": "SUM", "Gradient___w": "ALL", "bias": "FINAL"})]


@pytest.mark.parametrize("kw", SCHEDULES, ids=["accumulation", "accumulation-everyn", "replication",
                                              "replication-accumulation"])
@pytest.mark.parametrize("opt", ["sgd1", "adam"])
def test_accumulation_and_replication_agree_with_the_device_emulation(monkeypatch, opt, kw):
    _agree(monkeypatch, opt, **kw)


@pytest.mark.parametrize("opt", ["sgd1", "adam"])
def test_fp16_training_agrees_within_half_precision(monkeypatch, opt):
    """fp16 weights and activations: matmuls compute in float32 and round once (poplin's float
    partials); losses, gradients and weights within one half ulp of the device emulation's."""
    _agree(monkeypatch, opt, tol=(1e-3, 1e-3), fp16=True)


def _model_init(k):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 5)).astype(np.float32)
    return w if k == "w" else rng.standard_normal(5).astype(np.float32)


def test_pipelined_inference_agrees_with_the_device_emulation(monkeypatch):
    from test_popart_pipelining import ALL, _data, _device, _mlp, _options
    outs = {}
    for mode in ("device", "ir"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        b, x, lab, p, loss = _mlp()
        s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(6, {p: ALL}), _device(),
                                    userOptions=_options(True))
        s.prepareDevice()
        out = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: _data(6)[0]}, out))
        outs[mode] = (out[p].copy(), s.getCycleCount(), s._fast)
    assert outs["ir"][2] and not outs["device"][2]
    assert outs["ir"][1] == outs["device"][1]
    np.testing.assert_allclose(outs["ir"][0], outs["device"][0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("strategy", [None, "Running"])
def test_pipelined_training_with_accumulation_agrees(monkeypatch, strategy):
    """Pipelined training with gradient accumulation is functionally accumulation: the executor
    runs the stages micro-batch by micro-batch; without accumulation (stale weights) the device
    emulation runs it."""
    from test_popart_pipelining import _train as train
    res = {}
    for mode in ("device", "ir"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        opt = popart.Adam({"defaultLearningRate": (0.02, True)}) if strategy else None
        out, s = train(True, bps=2, af=4, optimizer=opt, strategy=strategy)
        res[mode] = (out, s.getCycleCount(), s._fast)
    assert res["ir"][2] and res["ir"][1] == res["device"][1]
    for k in res["device"][0]:
        np.testing.assert_allclose(res["ir"][0][k], res["device"][0][k], rtol=1e-5, atol=1e-6, err_msg=k)
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    _, s = train(True, bps=3)
    assert s._fast is False


def _random_run(monkeypatch, mode, rf):
    monkeypatch.setenv("OPENIPU_EXECUTION", mode)
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
    w = b.addInitializedInputTensor(rng.standard_normal((8, 5)).astype(np.float32), "w")
    (d,) = b.aiOnnx.dropout([b.aiOnnx.matmul([x, w])], 1, 0.3)
    y = b.aiOnnx.add([d, b.aiOnnx.randomuniformlike([b.aiGraphcore.detach([d])])])
    loss = b.aiGraphcore.l1loss([y], 0.1)
    o = popart.SessionOptions()
    if rf > 1:
        o.enableReplicatedGraphs, o.replicatedGraphCount = True, rf
    s = popart.TrainingSession(fnModel=b.getModelProto(), loss=loss, optimizer=popart.ConstSGD(0.1), userOptions=o,
                               dataFlow=popart.DataFlow(2, {y: popart.AnchorReturnType("ALL")}),
                               deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": rf,
                                                                                       "tilesPerIPU": 8}))
    s.prepareDevice()
    s.weightsFromHost()
    s.setRandomSeed(7)
    outs = []
    for _ in range(2):
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: np.ones((2,) + ((rf,) if rf > 1 else ()) + (4, 8), np.float32)}, a))
        outs.append(a[y].copy())
    s.weightsToHost()
    wts = {"w": np.zeros((8, 5), np.float32)}
    s.readWeights(popart.PyWeightsIO(wts))
    return s, outs, wts["w"]


@pytest.mark.parametrize("rf", [1, 2])
def test_random_ops_draw_the_device_streams(monkeypatch, rf):
    """Dropout (and its gradient's regenerated mask) and a seeded RandomUniformLike draw what the
    device emulation draws, batch after batch (GetRandomSeed advances the seed in the executor)."""
    _, dev, w_dev = _random_run(monkeypatch, "device", rf)
    s, ir, w_ir = _random_run(monkeypatch, "ir", rf)
    assert s._fast
    for a, b in zip(dev, ir):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    assert not np.allclose(ir[0][0], ir[0][1])          # a new mask every batch
    np.testing.assert_allclose(w_ir, w_dev, rtol=1e-6, atol=1e-6)


def test_print_tensor_prints_what_the_device_prints(monkeypatch, capfd):
    """PrintTensor and its gradient print the device program's text (title, values, order), once
    per batch, from replica 0."""
    printed = {}
    for mode in ("device", "ir"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
        w = b.addInitializedInputTensor(np.arange(9, dtype=np.float32).reshape(3, 3) / 10, "w")
        h = b.aiGraphcore.printtensor([b.aiOnnx.matmul([x, w])], title="hidden")
        loss = b.aiGraphcore.l1loss([h], 0.5)
        s = popart.TrainingSession(fnModel=b.getModelProto(), loss=loss, optimizer=popart.ConstSGD(0.1),
                                   dataFlow=popart.DataFlow(2, {loss: popart.AnchorReturnType("ALL")}),
                                   deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
        s.prepareDevice()
        s.weightsFromHost()
        capfd.readouterr()
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 2, 3)}, a))
        printed[mode] = (capfd.readouterr().out, s._fast)
    assert printed["ir"][1] and not printed["device"][1]
    num = r"-?\d+\.\d+(?:e[-+]\d+)?"
    # the same text up to the last digits of the values (the plan's matmul accumulation order)
    assert re.sub(num, "#", printed["ir"][0]) == re.sub(num, "#", printed["device"][0])
    np.testing.assert_allclose(np.array(re.findall(num, printed["ir"][0]), float),
                               np.array(re.findall(num, printed["device"][0]), float), rtol=1e-6, atol=1e-7)
    assert printed["ir"][0].count("hidden: ") == 2 and printed["ir"][0].count("hidden_gradient: ") == 2


@pytest.mark.parametrize("kind", ["if", "loop", "scan", "call"])
def test_control_flow_agrees_with_the_device_emulation(monkeypatch, kind):
    from test_popart_dtypes import _subgraph_models
    got = {}
    for mode in ("device", "ir"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        b, feeds, o, want = _subgraph_models()[kind]
        b.addOutputTensor(o)
        s = popart.InferenceSession(fnModel=b.getModelProto(),
                                    dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}),
                                    deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
        s.prepareDevice()
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO(feeds, a))
        got[mode] = (a[o].copy(), s.getCycleCount(), s._fast)
    assert got["ir"][2] and got["ir"][1] == got["device"][1]
    np.testing.assert_allclose(got["ir"][0], got["device"][0], rtol=1e-6)
    np.testing.assert_allclose(got["ir"][0], want, rtol=1e-6)


def test_fp16_conv_and_matmul_round_once_from_float32(monkeypatch):
    """An fp16 Conv + MatMul inference: the executor's outputs are the float32 results rounded to
    half (what poplin's float partials give), within one half ulp of the device emulation's."""
    import torch
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((2, 3, 6, 6)).astype(np.float16)
    kv = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    mv = rng.standard_normal((16, 5)).astype(np.float16)
    got = {}
    for mode in ("device", "ir"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT16", [2, 3, 6, 6]), "x")
        c = b.aiOnnx.conv([x, b.addInitializedInputTensor(kv, "k")], strides=[1, 1], pads=[0, 0, 0, 0])
        y = b.aiOnnx.matmul([b.aiOnnx.reshape([c, b.aiOnnx.constant(np.array([8, 16], np.int64))]),
                             b.addInitializedInputTensor(mv, "m")])
        s = popart.InferenceSession(fnModel=b.getModelProto(),
                                    dataFlow=popart.DataFlow(1, {y: popart.AnchorReturnType("ALL")}),
                                    deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
        s.prepareDevice()
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: xv}, a))
        got[mode] = (a[y].copy(), s._fast)
    assert got["ir"][1] and got["ir"][0].dtype == np.float16
    conv = torch.nn.functional.conv2d(torch.from_numpy(xv).float(), torch.from_numpy(kv).float()).half()
    want = (conv.reshape(8, 16).float() @ torch.from_numpy(mv).float()).half().numpy()
    np.testing.assert_array_equal(got["ir"][0], want)
    np.testing.assert_allclose(got["ir"][0].astype(np.float32), got["device"][0].astype(np.float32),
                               rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("op,dtype,replicas", [("Add", "FLOAT", 2), ("Max", "FLOAT", 2), ("Add", "FLOAT16", 4),
                                                ("Mean", "FLOAT16", 4), ("SquareAdd", "FLOAT", 2)])
def test_collectives_across_replicas_agree(monkeypatch, op, dtype, replicas):
    """ReplicatedReduceScatter and ReplicatedAllReduce over the replicas: each replica's piece and
    reduction exactly as the device emulation's gcl collectives give them (ring order, in the
    tensor's own type: fp16 sums round as the device's do)."""
    got = {}
    rng = np.random.default_rng(5)
    npt = np.float32 if dtype == "FLOAT" else np.float16
    xv = (rng.standard_normal((2, replicas, 5)) * 3).astype(npt)
    for mode in ("device", "ir"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo(dtype, [5]), "x")
        y = b.aiGraphcore.replicatedreducescatter([x], getattr(popart.CollectiveOperator, op))
        z = b.aiGraphcore.replicatedallreduce([b.aiOnnx.mul([x, x])], getattr(popart.CollectiveOperator, op))
        opts = popart.SessionOptions()
        opts.enableReplicatedGraphs, opts.replicatedGraphCount = True, replicas
        s = popart.InferenceSession(fnModel=b.getModelProto(), userOptions=opts,
                                    dataFlow=popart.DataFlow(2, {y: popart.AnchorReturnType("ALL"),
                                                                 z: popart.AnchorReturnType("ALL")}),
                                    deviceInfo=popart.DeviceManager().createIpuModelDevice(
                                        {"numIPUs": replicas, "tilesPerIPU": 8}))
        s.prepareDevice()
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: xv}, a))
        got[mode] = ({k: v.copy() for k, v in a.items()}, s._fast, s.getCycleCount())
    assert got["ir"][1] and got["ir"][2] == got["device"][2]
    for k in got["device"][0]:
        np.testing.assert_array_equal(got["ir"][0][k], got["device"][0][k])


@pytest.mark.parametrize("fires", [False, True])
def test_abort_stops_the_run_as_on_the_device(monkeypatch, fires):
    errors = {}
    for mode in ("device", "ir"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
        y = b.aiOnnx.relu([x])
        b.aiGraphcore.abort([b.aiOnnx.reducemax([y], keepdims=0)])      # fires when an input is > 0
        s = popart.InferenceSession(fnModel=b.getModelProto(),
                                    dataFlow=popart.DataFlow(1, {y: popart.AnchorReturnType("ALL")}),
                                    deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
        s.prepareDevice()
        a = s.initAnchorArrays()
        try:
            s.run(popart.PyStepIO({x: np.array([-1, 2 if fires else -2, -3], np.float32)}, a))
            errors[mode] = (None, s._fast)
        except Exception as e:  # noqa: BLE001 - compared between the modes
            errors[mode] = ((type(e), str(e)), s._fast)
    assert errors["ir"][1] and not errors["device"][1]
    assert errors["ir"][0] == errors["device"][0]
    assert (errors["ir"][0] is not None) == fires


def _group_norm_train(monkeypatch, mode, strided, fp16, steps=2):
    """ai.graphcore GroupNormalization (3 groups of 6 channels) after a matmul, softmax and
    NLL, trained by SGD: its gradient op (GroupNormalizationGrad) takes the forward's mean and
    invStdDev. Returns (session, per-step anchors, trained weights, initial weights, data)."""
    monkeypatch.setenv("OPENIPU_EXECUTION", mode)
    rng = np.random.default_rng(3)
    dt, ft = (np.float16, "FLOAT16") if fp16 else (np.float32, "FLOAT")
    init = {"w": rng.standard_normal((8, 5)).astype(dt), "scale": (1 + 0.5 * rng.standard_normal(6)).astype(dt),
            "bias": rng.standard_normal(6).astype(dt)}
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo(ft, [4, 6, 8]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [4, 5]), "lab")
    w, scale, bias = (b.addInitializedInputTensor(init[k], k) for k in ("w", "scale", "bias"))
    h = b.aiOnnx.matmul([x, w])
    y = b.aiGraphcore.groupnormalization([h, scale, bias], 3, 1e-5)[0]
    # the classes are the channels (a softmax over the field would not see the bias)
    loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([b.aiOnnx.transpose([y], [0, 2, 1])], axis=2), lab])
    opts = popart.SessionOptions()
    opts.groupNormStridedChannelGrouping = strided
    g = popart.reservedGradientPrefix()
    arts = {loss: "ALL", y: "ALL", g + w: "ALL", g + scale: "ALL", g + bias: "ALL"}
    s = popart.TrainingSession(fnModel=b.getModelProto(), loss=loss, userOptions=opts,
                               optimizer=popart.SGD({"defaultLearningRate": (0.5, False)}),
                               dataFlow=popart.DataFlow(1, {k: popart.AnchorReturnType(v) for k, v in arts.items()}),
                               deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
    s.prepareDevice()
    s.weightsFromHost()
    data = np.random.default_rng(4)
    feeds = [(data.standard_normal((4, 6, 8)).astype(dt), data.integers(0, 6, (4, 5)).astype(np.int32))
             for _ in range(steps)]
    outs = []
    for xv, lv in feeds:
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: xv, lab: lv}, a))
        outs.append({("loss" if k == loss else k.replace(g, "d_")): v.copy() for k, v in a.items()})
    s.weightsToHost()
    trained = {k: np.zeros(v.shape, dt) for k, v in init.items()}
    s.readWeights(popart.PyWeightsIO(trained))
    return s, outs, trained, init, feeds


def _torch_group_norm_step(init, feed, strided):
    """torch's loss and gradients of the first step of :func:`_group_norm_train` (float32)."""
    import torch
    import torch.nn.functional as F
    p = {k: torch.tensor(v.astype(np.float32), requires_grad=True) for k, v in init.items()}
    h = torch.tensor(feed[0].astype(np.float32)) @ p["w"]
    order = torch.arange(6).reshape(2, 3).T.reshape(-1) if strided else torch.arange(6)    # channel c in c % 3
    y = torch.empty_like(h)
    y[:, order] = F.group_norm(h[:, order], 3, p["scale"][order], p["bias"][order], 1e-5)
    loss = F.nll_loss(torch.log(torch.softmax(y.transpose(1, 2), 2)).reshape(-1, 6),
                      torch.tensor(feed[1]).long().reshape(-1))
    loss.backward()
    return float(loss.detach()), {k: v.grad.numpy() for k, v in p.items()}


@pytest.mark.parametrize("strided, fp16", [(False, False), (True, False), (False, True)],
                         ids=["contiguous", "strided", "fp16"])
def test_group_norm_training_runs_on_the_executor_and_agrees(monkeypatch, strided, fp16):
    """GroupNormalizationGrad (PopTorch's LayerNorm / GroupNorm gradient) has an executor kernel:
    the session runs on the IR executor, its losses, gradients and trained weights agree with
    the device emulation's (popnn's groupNorm gradients) within the plan's precision, and the
    first step's with torch's autograd."""
    _, o_dev, w_dev, _, _ = _group_norm_train(monkeypatch, "device", strided, fp16)
    s, o_ir, w_ir, init, feeds = _group_norm_train(monkeypatch, "ir", strided, fp16)
    assert s._fast and s.getCycleCount() > 0
    tol = dict(rtol=2e-3, atol=2e-3) if fp16 else dict(rtol=1e-4, atol=1e-5)
    for a, b in zip(o_dev, o_ir):
        for k in a:
            assert a[k].dtype == b[k].dtype, k
            np.testing.assert_allclose(b[k], a[k], err_msg=k, **tol)
    for k in w_dev:
        np.testing.assert_allclose(w_ir[k], w_dev[k], err_msg=k, **tol)
        assert not np.array_equal(w_ir[k], init[k]), k
    loss, grads = _torch_group_norm_step(init, feeds[0], strided)
    ttol = dict(rtol=2e-2, atol=2e-2) if fp16 else dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(o_ir[0]["loss"]), loss, **ttol)
    for k in grads:
        np.testing.assert_allclose(o_ir[0]["d_" + k].astype(np.float32), grads[k], err_msg=k, **ttol)


def test_group_norm_grad_kernel_uses_the_given_statistics():
    """The kernel whitens with the mean / invStdDev it is given (PopART's GroupNormGradOp takes
    the forward's), not recomputed ones; with None it recomputes them, as torch does."""
    import torch
    import torch.nn.functional as F
    from openipu.popart.graphcore_ops import find_kernel
    k = find_kernel("ai.graphcore", "GroupNormalizationGrad").fn
    rng = np.random.default_rng(5)
    x = torch.tensor(rng.standard_normal((3, 4, 7)).astype(np.float32), requires_grad=True)
    sc = torch.tensor(rng.standard_normal(4).astype(np.float32), requires_grad=True)
    gy = torch.tensor(rng.standard_normal((3, 4, 7)).astype(np.float32))
    F.group_norm(x, 2, sc, None, 1e-5).backward(gy)
    xv = x.detach().reshape(3, 2, -1)
    mean, inv = xv.mean(-1).reshape(-1), torch.rsqrt(xv.var(-1, unbiased=False) + 1e-5).reshape(-1)
    attrs = {"num_groups": 2, "epsilon": 1e-5}
    for stats in ([mean, inv], [None, None]):
        dx, ds, _ = k([gy, x.detach(), sc.detach()] + stats, attrs, 1)
        np.testing.assert_allclose(dx.numpy(), x.grad.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(ds.numpy(), sc.grad.numpy(), rtol=1e-4, atol=1e-5)
    dx2, _, _ = k([gy, x.detach(), sc.detach(), mean + 1.0, inv], attrs, 1)    # other statistics, other dx
    assert not np.allclose(dx2.numpy(), x.grad.numpy(), atol=1e-3)


@pytest.mark.parametrize("anchor_t", [False, True])
def test_transposes_read_by_matmuls_are_views_and_training_agrees(monkeypatch, anchor_t):
    """A weight's Transpose read only by MatMuls runs as a view (no copy; the weight's update
    comes after its readers), a Transpose read by another op or anchored is copied; training
    agrees with the device emulation either way."""
    from openipu.popart import execute_plan
    res = {}
    for mode in ("device", "ir"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        rng = np.random.default_rng(7)
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
        w = b.addInitializedInputTensor(rng.standard_normal((5, 8)).astype(np.float32), "w")
        wt = b.aiOnnx.transpose([w], [1, 0])
        h = b.aiOnnx.matmul([x, wt])                                    # Linear: x @ w.T
        ht = b.aiOnnx.transpose([h], [1, 0])
        y = b.aiOnnx.add([b.aiOnnx.reducesum([b.aiOnnx.matmul([ht, h])], [1]), b.aiOnnx.reducesum([ht], [1])])
        loss = b.aiGraphcore.l1loss([y], 0.1)
        arts = {loss: popart.AnchorReturnType("ALL")}
        if anchor_t:
            arts[wt] = popart.AnchorReturnType("ALL")
        s = popart.TrainingSession(fnModel=b.getModelProto(), loss=loss, dataFlow=popart.DataFlow(1, arts),
                                   optimizer=popart.SGD({"defaultLearningRate": (0.05, False),
                                                         "defaultMomentum": (0.9, False)}),
                                   deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
        s.prepareDevice()
        s.weightsFromHost()
        data = np.random.default_rng(8)
        outs = []
        for _ in range(3):
            a = s.initAnchorArrays()
            s.run(popart.PyStepIO({x: data.standard_normal((4, 8)).astype(np.float32)}, a))
            outs.append({k: v.copy() for k, v in a.items()})
        s.weightsToHost()
        wv = np.zeros((5, 8), np.float32)
        s.readWeights(popart.PyWeightsIO({w: wv}))
        res[mode] = (outs, wv, s)
    ir = res["ir"][2]._ir
    views = {ir.ops[i].outputs[0] for i in execute_plan.transpose_views(ir, set(ir.data_flow.anchors()))}
    assert res["ir"][2]._fast
    assert (wt in views) == (not anchor_t)
    assert ht not in views          # also read by ReduceSum
    for a, b in zip(res["device"][0], res["ir"][0]):
        for k in a:
            if k != wt:     # (the device emulation's anchor of a weight's transpose is read after the update)
                np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(res["ir"][1], res["device"][1], rtol=1e-5, atol=1e-6)


def test_small_ops_run_on_one_host_thread_and_the_thread_count_is_restored(monkeypatch):
    """A 3 x 8 model's ops run on one host thread (a small softmax opens an OpenMP region that
    waits on a loaded host: host speed only); a large matmul keeps torch's threads; the run
    leaves torch's thread count as it found it, and the outputs agree with the emulation."""
    import torch

    from openipu.popart import execute_plan
    _, dev, _ = _run(monkeypatch, "device", [popart.AnchorReturnType("ALL")] * 2)
    threads = torch.get_num_threads()
    s_ir, ir, _ = _run(monkeypatch, "ir", [popart.AnchorReturnType("ALL")] * 2)
    assert torch.get_num_threads() == threads
    assert all(st[0] for st in s_ir._fast.steps)
    for k in dev:
        np.testing.assert_allclose(ir[k], dev[k], rtol=1e-5, atol=1e-6)

    class T:        # a stand-in IR of one op: shapes only
        def __init__(self, shape):
            self.info = type("I", (), {"shape": lambda _s, shape=shape: shape})()

    class Op:
        def __init__(self, domain, op_type, ins, outs, attrs=None):
            self.domain, self.op_type, self.inputs, self.outputs, self.attrs = domain, op_type, ins, outs, attrs or {}

    ir_ = type("Ir", (), {})()
    ir_.tensors = {"a": T([512, 1024]), "b": T([1024, 1024]), "c": T([512, 1024]), "s": T([2, 2]),
                   "big": T([1024, 1024])}
    assert execute_plan.runs_serially(ir_, Op("", "Softmax", ["s"], ["s"]))
    assert not execute_plan.runs_serially(ir_, Op("", "Relu", ["big"], ["big"]))
    assert not execute_plan.runs_serially(ir_, Op("", "MatMul", ["a", "b"], ["c"]))      # 512 M multiply-adds
    assert execute_plan.runs_serially(ir_, Op("", "MatMul", ["s", "s"], ["s"]))
