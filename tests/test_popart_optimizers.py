"""PopART's Adam and Adaptive optimizers: steps against ``torch.optim`` on the same weights and
gradients, and against PopART's documented formulas where torch has no match (Lamb, AdaMax's
epsilon, the TF RMSProp variant)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart
from test_popart_training import _mlp, _run, _session, _weights

STEPS = 3


def _feeds3(feeds):
    return {k: np.ascontiguousarray(np.stack([v * (1 + 0.1 * j) if v.dtype == np.float32 else v
                                              for j in range(STEPS)])) for k, v in feeds.items()}


def _torch_steps(ws, x3, make_opt):
    """``STEPS`` steps of the MLP of ``_mlp`` in PyTorch with optimizer ``make_opt(params)``."""
    t = [torch.tensor(w, requires_grad=True) for w in ws]
    opt = make_opt(t)
    for j in range(STEPS):
        opt.zero_grad()
        logits = torch.relu(torch.tensor(x3["x"][j]) @ t[0] + t[1]) @ t[2]
        torch.nn.functional.cross_entropy(logits, torch.tensor(x3["label"][j]).long()).backward()
        opt.step()
    return [tt.detach().numpy() for tt in t]


def _popart_steps(opt, seed=3, **kw):
    b, loss, ids, ws, feeds = _mlp(seed)
    s = _session(b, loss, [loss], opt, bps=STEPS, **kw)
    x3 = _feeds3(feeds)
    _run(s, x3)
    new = _weights(s, ids)
    return [new[i] for i in ids], ws, x3, s


ADAM_CASES = [
    ("Adam", "Decay", 0.0, lambda t: torch.optim.Adam(t, lr=0.01, betas=(0.9, 0.999), eps=1e-6)),
    ("Adam", "Decay", 0.1, lambda t: torch.optim.AdamW(t, lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1)),
    ("Adam", "L2Regularization", 0.1,
     lambda t: torch.optim.Adam(t, lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1)),
]


@pytest.mark.parametrize("mode,wdm,wd,make", ADAM_CASES, ids=["adam", "adamw", "adam-l2"])
def test_adam_matches_torch(mode, wdm, wd, make):
    opt = popart.Adam({"defaultLearningRate": (0.01, True), "defaultWeightDecay": (wd, True),
                       "defaultEps": (1e-6, True)}, mode=getattr(popart.AdamMode, mode),
                      weight_decay_mode=getattr(popart.WeightDecayMode, wdm))
    got, ws, x3, s = _popart_steps(opt)
    for g, r in zip(got, _torch_steps(ws, x3, make)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)
    ops = [op.op_type for op in s.ops()]
    assert ops.count("AdamUpdater") == 3 and ops.count("Accumulate") == 6
    assert {op.lowering for op in s.ops() if op.op_type in ("AdamUpdater", "AdamVarUpdate", "Accumulate")} == \
        {"precise"}


def _numpy_adam(ws, x3, grads_of, lr, b1, b2, eps, wd, mode, mwn=10.0):
    """PopART's adam.hpp equations, in numpy (Decay mode)."""
    w = [np.array(x, np.float64) for x in ws]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for step in range(1, STEPS + 1):
        gs = grads_of(w, step - 1)
        for k, g in enumerate(gs):
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = np.maximum(b2 * v[k], np.abs(g)) if mode == "AdaMax" else b2 * v[k] + (1 - b2) * g * g
            bias = mode in ("Adam", "Lamb", "AdaMax")
            mc = m[k] / (1 - b1 ** step) if bias else m[k]
            vc = v[k] / (1 - b2 ** step) if mode in ("Adam", "Lamb") else v[k]
            x = mc / ((vc if mode == "AdaMax" else np.sqrt(vc)) + eps) + wd * w[k]
            ratio = 1.0
            if mode.startswith("Lamb"):
                r1, r2 = np.sqrt((w[k] ** 2).sum()), np.sqrt((x ** 2).sum())
                ratio = min(r1, mwn) / r2 if r1 > 0 and r2 > 0 else 1.0
            w[k] = w[k] - lr * ratio * x
    return w


def _grads_fn(x3):
    def grads(w, j):
        t = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in w]
        logits = torch.relu(torch.tensor(x3["x"][j], dtype=torch.float64) @ t[0] + t[1]) @ t[2]
        torch.nn.functional.cross_entropy(logits, torch.tensor(x3["label"][j]).long()).backward()
        return [tt.grad.numpy() for tt in t]
    return grads


@pytest.mark.parametrize("mode", ["AdamNoBias", "AdaMax", "Lamb", "LambNoBias"])
def test_adam_modes_follow_popart_formula(mode):
    lr, wd, mwn = 0.02, 0.01, 0.5
    opt = popart.Adam({"defaultLearningRate": (lr, True), "defaultWeightDecay": (wd, True),
                       "defaultMaxWeightNorm": (mwn, True)}, mode=mode)
    got, ws, x3, s = _popart_steps(opt, seed=6)
    want = _numpy_adam(ws, x3, _grads_fn(x3), lr, 0.9, 0.999, 1e-6, wd, mode, mwn)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-6)
    if mode.startswith("Lamb"):
        assert sum(op.op_type == "LambSquare" for op in s.ops()) == 6


def test_adamax_close_to_torch():
    """PopART adds eps to the infinity norm after the max, PyTorch before: equal to ~eps."""
    opt = popart.Adam({"defaultLearningRate": (0.01, True), "defaultEps": (1e-8, True)}, mode=popart.AdamMode.AdaMax)
    got, ws, x3, _ = _popart_steps(opt)
    for g, r in zip(got, _torch_steps(ws, x3, lambda t: torch.optim.Adamax(t, lr=0.01, eps=1e-8))):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)


ADAPTIVE_CASES = {
    "adagrad": (dict(mode="AdaGrad"), lambda t: torch.optim.Adagrad(t, lr=0.05, eps=1e-6)),
    "rmsprop": (dict(mode="RMSProp"), lambda t: torch.optim.RMSprop(t, lr=0.01, alpha=0.9, eps=1e-6)),
    "rmsprop-momentum-l2": (dict(mode="RMSProp", momentum=0.8, wd=0.05, wdm="L2Regularization"),
                            lambda t: torch.optim.RMSprop(t, lr=0.01, alpha=0.9, eps=1e-6, momentum=0.8,
                                                          weight_decay=0.05)),
    "centered": (dict(mode="CenteredRMSProp", momentum=0.5),
                 lambda t: torch.optim.RMSprop(t, lr=0.01, alpha=0.9, eps=1e-6, centered=True, momentum=0.5)),
    "adadelta": (dict(mode="AdaDelta", lr=1.0), lambda t: torch.optim.Adadelta(t, lr=1.0, rho=0.9, eps=1e-6)),
}


@pytest.mark.parametrize("case", list(ADAPTIVE_CASES))
def test_adaptive_matches_torch(case):
    kw, make = ADAPTIVE_CASES[case]
    lr = kw.get("lr", 0.05 if kw["mode"] == "AdaGrad" else 0.01)
    opt = popart.Adaptive({"defaultLearningRate": (lr, True), "defaultAlpha": (0.9, True),
                           "defaultMomentum": (kw.get("momentum", 0.0), True),
                           "defaultWeightDecay": (kw.get("wd", 0.0), True), "defaultEps": (1e-6, True)},
                          mode=kw["mode"], weight_decay_mode=kw.get("wdm", "Decay"))
    got, ws, x3, _ = _popart_steps(opt)
    for g, r in zip(got, _torch_steps(ws, x3, make)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)


def test_adaptive_decay_and_tf_variant_follow_popart_formula():
    """RMSProp TF variant with momentum and decoupled weight decay:
    v1 = a v1 + (1-a) g^2; v3 = m v3 + lr g / sqrt(v1 + eps); w -= v3 + wd w."""
    lr, a, mm, eps, wd = 0.01, 0.9, 0.5, 1e-6, 0.02
    opt = popart.Adaptive({"defaultLearningRate": (lr, True), "defaultAlpha": (a, True),
                           "defaultMomentum": (mm, True), "defaultEps": (eps, True),
                           "defaultWeightDecay": (wd, True)}, mode=popart.AdaptiveMode.RMSProp,
                          rmsprop_tf_variant=True)
    got, ws, x3, _ = _popart_steps(opt, seed=7)
    grads = _grads_fn(x3)
    w = [np.array(x, np.float64) for x in ws]
    v1 = [np.zeros_like(x) for x in w]
    v3 = [np.zeros_like(x) for x in w]
    for j in range(STEPS):
        for k, g in enumerate(grads(w, j)):
            v1[k] = a * v1[k] + (1 - a) * g * g
            v3[k] = mm * v3[k] + lr * g / np.sqrt(v1[k] + eps)
            w[k] = w[k] - (v3[k] + wd * w[k])
    for g, r in zip(got, w):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)


def test_non_const_adam_values_and_loss_scaling():
    """Non-const hyper-parameters are device tensors: the same steps as const ones, and
    ``updateOptimizerFromHost`` changes them (learning rate 0: the weights stay)."""
    vals = {"defaultLearningRate": (0.01, False), "defaultBeta1": (0.8, False), "defaultEps": (1e-6, False),
            "defaultWeightDecay": (0.1, False), "lossScaling": (16.0, False)}
    got, ws, x3, s = _popart_steps(popart.Adam(vals))
    ref = _torch_steps(ws, x3, lambda t: torch.optim.AdamW(t, lr=0.01, betas=(0.8, 0.999), eps=1e-6,
                                                            weight_decay=0.1))
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)
    s.updateOptimizerFromHost(popart.Adam({**vals, "defaultLearningRate": (0.0, False),
                                           "defaultWeightDecay": (0.0, False)}))
    before = _weights(s, ["w1"])["w1"]
    _run(s, x3)
    np.testing.assert_array_equal(_weights(s, ["w1"])["w1"], before)


def test_fp16_weights_with_fp32_adam_state():
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((8, 4)).astype(np.float16)
    x0 = rng.standard_normal((2, 8)).astype(np.float16)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT16", [2, 8]), "x")
    w = b.addInitializedInputTensor(w0, "w")
    loss = b.aiGraphcore.l1loss([b.aiOnnx.matmul([x, w])], 0.5, popart.ReductionType.Sum)
    s = _session(b, loss, [loss], popart.Adam({"defaultLearningRate": (1e-2, True)}))
    _run(s, {x: x0})
    assert s.getInfo("Accl1___w").data_type() == "FLOAT" and s.getInfo("w").data_type() == "FLOAT16"
    t = torch.tensor(w0.astype(np.float32), requires_grad=True)
    (0.5 * (torch.tensor(x0.astype(np.float32)) @ t).abs().sum()).backward()
    topt = torch.optim.AdamW([t], lr=1e-2, eps=1e-6, weight_decay=0.0)
    topt.step()
    s.weightsToHost()
    out = {"w": np.zeros((8, 4), np.float16)}
    s.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_allclose(out["w"].astype(np.float32), t.detach().numpy(), rtol=1e-2, atol=2e-3)


def test_optimizer_errors():
    with pytest.raises(popart.popart_exception, match="Invalid Adam key, defaultBeta3"):
        popart.Adam({"defaultBeta3": (0.5, True)})
    with pytest.raises(popart.popart_exception, match="py::tuple"):
        popart.Adaptive({"defaultAlpha": 0.5})
    with pytest.raises(popart.popart_exception, match="Invalid AdamMode"):
        popart.Adam({}, mode="Adamm")
    b, loss, ids, ws, feeds = _mlp(1)
    s = _session(b, loss, [loss], popart.Adam({"defaultLearningRate": (0.01, False)}))
    with pytest.raises(popart.popart_exception, match="Can not update optimizer of type Adam"):
        s.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (0.01, False)}))
    _run(s, feeds)      # still usable


# --- gradient accumulation and replication --------------------------------------------------
SCALE_OUT = [(4, 1, "Sum", "sgd1"), (4, 1, "Mean", "sgd1"), (1, 2, "Sum", "sgd1"), (1, 2, "Mean", "sgd0"),
             (2, 2, "Mean", "sgd1"), (2, 2, "Sum", "adam"), (1, 2, "Mean", "adam"), (3, 1, "Mean", "rmsprop"),
             (1, 1, "Sum", "sgd2"), (4, 1, "Mean", "sgd2"), (1, 2, "Sum", "sgd2"), (2, 2, "Mean", "sgd2"),
             # the other mean strategies (the ones above are Post, the default)
             (2, 2, "Mean/Running", "sgd1"), (2, 2, "Mean/Running", "adam"), (3, 2, "Mean/Running", "sgd2"),
             (1, 2, "Mean/Running", "sgd0"), (4, 1, "Mean/Running", "rmsprop"), (2, 2, "Mean/PostAndLoss", "sgd1"),
             (1, 2, "Mean/PostAndLoss", "adam"), (2, 2, "Mean/PostAndLoss", "sgd2"),
             # nesterov momentum: the gradients summed over micro-batches and replicas
             (2, 2, "Sum", "nesterov"), (1, 2, "Sum", "nesterov"), (3, 1, "Sum", "nesterov2"),
             (2, 2, "Sum", "nesterov2")]


def _scale_out_session(b, loss, opt, af=1, rf=1, bps=1, reduction="Sum", anchors=()):
    """A prepared TrainingSession with accumulation factor ``af`` and ``rf`` replicas (one IPU
    each), gradients reduced by ``reduction`` (``Mean/<MeanReductionStrategy>`` for a strategy
    other than Post), anchoring the loss (and ``anchors``) every micro-batch."""
    o = popart.SessionOptions()
    if af > 1:
        o.enableGradientAccumulation, o.accumulationFactor = True, af
    if rf > 1:
        o.enableReplicatedGraphs, o.replicatedGraphCount = True, rf
    reduction, _, strategy = reduction.partition("/")
    o.accumulationAndReplicationReductionType = getattr(popart.ReductionType, reduction)
    if strategy:
        o.meanAccumulationAndReplicationReductionStrategy = getattr(popart.MeanReductionStrategy, strategy)
    flow = {t: popart.AnchorReturnType("All") for t in (loss, *anchors)}
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(bps, flow),
                               loss, opt, popart.DeviceManager().createIpuModelDevice({"numIPUs": rf}),
                               userOptions=o)
    s.prepareDevice()
    s.weightsFromHost()
    return s


def _scale_out_optimizer(kind):
    return {"sgd0": (popart.ConstSGD(0.05), lambda t: torch.optim.SGD(t, lr=0.05)),
            "sgd1": (popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True)}),
                     lambda t: torch.optim.SGD(t, lr=0.05, momentum=0.9)),
            "sgd2": (popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True)},
                                accumulatorAndMomentum=popart.SGDAccumulatorAndMomentum.Separate),
                     lambda t: torch.optim.SGD(t, lr=0.05, momentum=0.9)),
            "adam": (popart.Adam({"defaultLearningRate": (0.01, True)}),
                     lambda t: torch.optim.Adam(t, lr=0.01, eps=1e-6)),
            "rmsprop": (popart.Adaptive({"defaultLearningRate": (0.01, True), "defaultAlpha": (0.9, True)}),
                        lambda t: torch.optim.RMSprop(t, lr=0.01, alpha=0.9, eps=1e-6)),
            "nesterov": (popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, False),
                                     "defaultWeightDecay": (0.01, True), "nesterov": (1, True)}),
                         lambda t: torch.optim.SGD(t, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True)),
            "nesterov2": (popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True),
                                      "nesterov": (1, True), "lossScaling": (4.0, True)},
                                     accumulatorAndMomentum=popart.SGDAccumulatorAndMomentum.Separate),
                          lambda t: torch.optim.SGD(t, lr=0.05, momentum=0.9, nesterov=True))}[kind]


@pytest.mark.parametrize("af,rf,red,kind", SCALE_OUT, ids=[f"af{a}-rf{r}-{m}-{k}" for a, r, m, k in SCALE_OUT])
def test_accumulation_and_replication_match_one_large_batch(af, rf, red, kind):
    """``af`` micro-batches on each of ``rf`` replicas make one weight update: the same as one
    PyTorch step on the loss summed (or, with Mean reduction, meaned) over them."""
    b, loss, ids, ws, feeds = _mlp(3)
    opt, make = _scale_out_optimizer(kind)
    bps = 2
    s = _scale_out_session(b, loss, opt, af, rf, bps, red)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((bps, af, rf, 4, 5)).astype(np.float32)
    lab = rng.integers(0, 3, (bps, af, rf, 4)).astype(np.int32)
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x, "label": lab}, a))
    assert a[loss].shape == tuple(d for d in (bps, af, rf) if d > 1)
    t = [torch.tensor(w, requires_grad=True) for w in ws]
    topt = make(t)
    for j in range(bps):
        topt.zero_grad()
        losses = [torch.nn.functional.cross_entropy(torch.relu(torch.tensor(x[j, k, r]) @ t[0] + t[1]) @ t[2],
                                                    torch.tensor(lab[j, k, r]).long())
                  for k in range(af) for r in range(rf)]
        np.testing.assert_allclose(a[loss].reshape(bps, -1)[j], [v.item() for v in losses], rtol=1e-5)
        (sum(losses) / (len(losses) if red.startswith("Mean") else 1)).backward()
        topt.step()
    new = _weights(s, ids)
    for i, tt in zip(ids, t):
        np.testing.assert_allclose(new[i], tt.detach().numpy(), rtol=1e-4, atol=1e-6)
    ops = s.ops()
    if rf > 1:
        assert any(op.op_type.startswith("ReplicatedAllReduce") and op.lowering == "precise" for op in ops)
    if af > 1:
        outer = [op.op_type for op in ops if op.execution_context == "AccumulateOuterFragment"]
        assert outer and all(t_ not in outer for t_ in ("MatMul", "SGD1Accumulate"))
    if red == "Mean/Running" and af > 1 and kind != "sgd1":  # a running-mean accumulator, never zeroed
        assert "Counter___" in s.getTensorIds()
        assert any(op.op_type == "Accumulate" and op.attrs["accumulationType"] == "Mean" for op in ops)
        assert all(op.op_type != "AccumulatorUpdate" or op.inputs[0].startswith(("Counter", "Accl___"))
                   for op in ops)
    if kind == "sgd2":      # separate accumulator and velocity (Accl1___), PopART's SGD2 ops
        types = [op.op_type for op in ops]
        assert types.count("SGD2VarUpdate") == 3 and types.count("SGD2PartialAcclUpdate") == 3
        assert all(f"Accl1___{i}" in s.getTensorIds() for i in ids)
        assert (f"Accum___{ids[0]}" in s.getTensorIds()) == (af > 1)


def test_accumulation_amortises_the_update():
    """Predicted cycles: af micro-batches cost about af forward/backward passes but one update,
    so the cycles per image fall as af grows (Adam: the update is a large share)."""
    cycles = {}
    for af in (1, 4):
        b, loss, ids, ws, feeds = _mlp(3)
        s = _scale_out_session(b, loss, popart.Adam({}), af=af)
        x = np.zeros((af, 4, 5), np.float32)
        _run(s, {"x": x, "label": np.zeros((af, 4), np.int32)})
        cycles[af] = s.getCycleCount() / af
    assert cycles[4] < 0.8 * cycles[1]


def test_replication_adds_the_all_reduce_time():
    cycles = {}
    for rf in (1, 2):
        b, loss, ids, ws, feeds = _mlp(3)
        s = _scale_out_session(b, loss, popart.ConstSGD(0.1), rf=rf)
        _run(s, {"x": np.zeros((rf, 4, 5), np.float32), "label": np.zeros((rf, 4), np.int32)})
        cycles[rf] = s.getCycleCount()
    assert cycles[2] > cycles[1]


@pytest.mark.parametrize("kind", ["sgd1", "adam"])
def test_accumulators_are_laid_out_like_their_gradient(kind):
    """SGD's velocity and Adam's moments (FLOAT state of FLOAT16 weights) are clones of their
    gradient's layout, made when the gradient is lowered (PopART's ``SGD1AccumulateOpx`` /
    ``AccumulateBaseOpx::createInputTensor``), not linearly mapped: the accumulate ops exchange
    nothing (a linear velocity made megabytes of exchange code per tile on BERT-base), nor does
    SGD1AcclUpdate without weight decay (PopART's ``SGD1AcclUpdateOpx`` reads no weight then)."""
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT16", [64, 256]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [64]), "label")
    w1 = b.addInitializedInputTensor((rng.standard_normal((256, 256)) / 16).astype(np.float16), "w1")
    w2 = b.addInitializedInputTensor((rng.standard_normal((256, 10)) / 16).astype(np.float16), "w2")
    h = b.aiOnnx.relu([b.aiOnnx.matmul([x, w1])])
    loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([b.aiOnnx.matmul([h, w2])], axis=1), lab],
                                 popart.ReductionType.Mean)
    opt = (popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True)}) if kind == "sgd1"
           else popart.Adam({"defaultLearningRate": (0.01, True)}))
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                               opt, popart.DeviceManager().createOfflineIPUDevice({"numIPUs": 1, "tilesPerIPU": 64}))
    s.prepareDevice(loadEngine=False)
    # SGD without weight decay: SGD1AcclUpdate scales the velocity without reading the weight
    acc = ("SGD1Accumulate/", "SGD1AcclUpdate/") if kind == "sgd1" else ("Accumulate/",)
    steps = [st for st in s._engine._compiled.compiler.steps if st.name.startswith(acc)]
    assert len(steps) == 4
    assert all(float(st.cost.duration["exchange"].max()) == 0.0 for st in steps)


def test_model_to_host_saves_and_resumes_the_optimizer_state(tmp_path):
    """Two runs in one session equal one run, modelToHost, a new session from that file, and a
    second run: the Adam moments and step counters travel in the ONNX file."""
    b, loss, ids, ws, feeds = _mlp(2)
    opt = popart.Adam({"defaultLearningRate": (0.01, True)})
    one = _session(b, loss, [loss], opt)
    _run(one, feeds)
    _run(one, feeds)
    first = _session(b, loss, [loss], opt)
    _run(first, feeds)
    path = str(tmp_path / "resume.onnx")
    first.modelToHost(path)
    import onnx
    from onnx import numpy_helper
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    assert {"Accl1___w1", "Accl2___w1"} <= set(inits) and float(inits["Step___w1"]) == 1.0
    second = popart.TrainingSession(path, popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss, opt,
                                    popart.DeviceManager().createIpuModelDevice({}))
    second.prepareDevice()
    second.weightsFromHost()
    _run(second, feeds)
    a, c = _weights(one, ids), _weights(second, ids)
    for i in ids:
        np.testing.assert_allclose(c[i], a[i], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["sgd0", "adam"])
def test_clip_norm_settings_match_torch_clip_grad_norm(kind):
    """``ClipNormSettings`` clips the global gradient norm of its weights before the update, as
    ``torch.nn.utils.clip_grad_norm_``."""
    b, loss, ids, ws, feeds = _mlp(3)
    clip = [popart.ClipNormSettings.clipWeights(["w1", "w2"], 0.2)]
    opt = popart.ConstSGD(0.05, clip_norm_settings=clip) if kind == "sgd0" else \
        popart.Adam({"defaultLearningRate": (0.01, True)}, clip_norm_settings=clip)
    s = _session(b, loss, [loss], opt, bps=STEPS)
    x3 = _feeds3(feeds)
    _run(s, x3)
    t = [torch.tensor(w, requires_grad=True) for w in ws]
    topt = torch.optim.SGD(t, lr=0.05) if kind == "sgd0" else torch.optim.Adam(t, lr=0.01, eps=1e-6)
    for j in range(STEPS):
        topt.zero_grad()
        logits = torch.relu(torch.tensor(x3["x"][j]) @ t[0] + t[1]) @ t[2]
        torch.nn.functional.cross_entropy(logits, torch.tensor(x3["label"][j]).long()).backward()
        assert torch.nn.utils.clip_grad_norm_([t[0], t[2]], 0.2) > 0.2     # the clip is active
        topt.step()
    new = _weights(s, ids)
    for i, tt in zip(ids, t):
        np.testing.assert_allclose(new[i], tt.detach().numpy(), rtol=1e-4, atol=1e-6)
    with pytest.raises(popart.popart_exception, match="Could not find a varupdate op for tensor nope"):
        _session(b, loss, [loss], popart.ConstSGD(0.05, clip_norm_settings=[popart.ClipNormSettings(["nope"], 1.0)]))


def test_everyn_anchor_with_accumulation():
    """An EVERYN(2) anchor with accumulation holds every micro-batch of every second batch."""
    b, loss, ids, ws, feeds = _mlp(3)
    o = popart.SessionOptions()
    o.enableGradientAccumulation, o.accumulationFactor = True, 2
    import onnx
    probs = [n for n in onnx.load_from_string(b.getModelProto()).graph.node if n.op_type == "Softmax"][0].output[0]
    df = popart.DataFlow(4, {loss: popart.AnchorReturnType("All"), probs: popart.AnchorReturnType("EveryN", 2)})
    s = popart.TrainingSession(b.getModelProto(), df, loss, popart.ConstSGD(0.0),
                               popart.DeviceManager().createIpuModelDevice({}), userOptions=o)
    s.prepareDevice()
    s.weightsFromHost()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 2, 4, 5)).astype(np.float32)
    lab = rng.integers(0, 3, (4, 2, 4)).astype(np.int32)
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x, "label": lab}, a))
    assert a[loss].shape == (4, 2) and a[probs].shape == (2, 2, 4, 3)
    rows = -np.log(np.take_along_axis(a[probs], lab[[1, 3]][..., None], -1)[..., 0]).mean(-1)
    np.testing.assert_allclose(rows, a[loss][[1, 3]], rtol=1e-5)


def test_sgd2_fp16_accumulator_with_fp32_velocity():
    """SGD2 (Separate) with ``accumType`` FLOAT16: the gradient accumulator is half precision,
    the velocity (``accl1Type`` FLOAT) full; the steps stay within fp16 rounding of SGD1's."""
    got = {}
    for mode, acc_type in (("Combined", None), ("Separate", popart.DataType.FLOAT16)):
        b, loss, ids, ws, feeds = _mlp(3)
        opt = popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True)},
                         accumulatorAndMomentum=getattr(popart.SGDAccumulatorAndMomentum, mode),
                         accumType=acc_type, accl1Type=popart.DataType.FLOAT)
        s = _scale_out_session(b, loss, opt, af=4, bps=2)
        rng = np.random.default_rng(1)
        _run(s, {"x": rng.standard_normal((2, 4, 4, 5)).astype(np.float32),
                 "label": rng.integers(0, 3, (2, 4, 4)).astype(np.int32)})
        got[mode] = _weights(s, ids)
        if mode == "Separate":
            assert s.getIr().tensors[f"Accum___{ids[0]}"].info.data_type() == "FLOAT16"
    for i in ids:
        np.testing.assert_allclose(got["Separate"][i], got["Combined"][i], rtol=2e-3, atol=2e-4)


RTS_CASES = [("adam", 1), ("adam", 2), ("lamb", 1), ("sgd2", 2), ("rmsprop", 1)]


@pytest.mark.parametrize("kind,af", RTS_CASES, ids=[f"{k}-af{a}" for k, a in RTS_CASES])
def test_replicated_tensor_sharding_of_the_optimizer_state(kind, af, tmp_path):
    """``optimizerStateTensorLocationSettings`` with replicated tensor sharding on 2 replicas:
    each replica keeps half of every state tensor (gradients reduce-scattered, the weight's
    slice updated, the slices all-gathered); the weights and the state written by
    ``modelToHost`` equal the unsharded run's, and the state's tile memory halves."""
    opt = {"adam": lambda: popart.Adam({"defaultLearningRate": (0.01, True)}),
           "lamb": lambda: popart.Adam({"defaultLearningRate": (0.01, True)}, mode=popart.AdamMode.Lamb),
           "sgd2": lambda: popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True)},
                                      accumulatorAndMomentum=popart.SGDAccumulatorAndMomentum.Separate),
           "rmsprop": lambda: popart.Adaptive({"defaultLearningRate": (0.01, True)})}[kind]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, af, 2, 4, 5)).astype(np.float32).squeeze(1 if af == 1 else ())
    lab = rng.integers(0, 3, x.shape[:-1]).astype(np.int32)
    got = {}
    for rts in (False, True):
        b, loss, ids, ws, feeds = _mlp(3)
        o = popart.SessionOptions()
        o.enableReplicatedGraphs, o.replicatedGraphCount = True, 2
        if af > 1:
            o.enableGradientAccumulation, o.accumulationFactor = True, af
        if rts:
            o.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = popart.ReplicatedTensorSharding.On
            o.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 4
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(2, {loss: popart.AnchorReturnType("All")}),
                                   loss, opt(), popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}),
                                   userOptions=o)
        s.prepareDevice()
        s.weightsFromHost()
        _run(s, {"x": x, "label": lab})
        path = str(tmp_path / f"rts{rts}.onnx")
        s.modelToHost(path)
        import onnx
        got[rts] = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
        if rts:
            types = [op.op_type for op in s.ops()]
            assert types.count("ReplicatedReduceScatter") == 3 and types.count("ReplicatedAllGather") == 3
            state = [t for t in s.getIr().sharded_state]
            assert state and all(s.getIr().tensors[t].info.nelms() * 2 >= got[rts][t].size for t in state)
    assert set(got[True]) == set(got[False])
    for k, v in got[False].items():
        np.testing.assert_allclose(got[True][k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_replicated_tensor_sharding_of_combined_sgd_is_refused():
    b, loss, ids, ws, feeds = _mlp(3)
    o = popart.SessionOptions()
    o.enableReplicatedGraphs, o.replicatedGraphCount = True, 2
    o.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = popart.ReplicatedTensorSharding.On
    o.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 4
    with pytest.raises(popart.popart_exception, match="SGDAccumulatorAndMomentum.Separate"):
        popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                               popart.SGD({"defaultMomentum": (0.9, True)}),
                               popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}), userOptions=o)


def test_replicated_tensor_sharding_halves_the_state_memory():
    """A 512x512 weight trained with Adam on 2 replicas: its two moments (2 MB) sharded over the
    replicas hold half the always-live variable bytes per replica."""
    live = {}
    for rts in (False, True):
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [8, 512]), "x")
        w = b.addInitializedInputTensor(np.zeros((512, 512), np.float32), "w")
        loss = b.aiGraphcore.identityloss([b.aiOnnx.matmul([x, w])])
        o = popart.SessionOptions()
        o.enableReplicatedGraphs, o.replicatedGraphCount = True, 2
        if rts:
            o.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = popart.ReplicatedTensorSharding.On
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
                                   loss, popart.Adam({}), popart.DeviceManager().createIpuModelDevice(
                                       {"numIPUs": 2, "tilesPerIPU": 64}), userOptions=o)
        s.prepareDevice()
        live[rts] = float(s._engine._compiled.memory.always_live_variables.sum())
    # weight 1 MB + moments 2 MB unsharded; moments 1 MB sharded
    assert live[True] < live[False] - 0.9 * (1 << 20)


# --- the mean strategies, nesterov with Mean, Adam's scaled state ------------------------------
@pytest.mark.parametrize("strategy", ["Post", "PostAndLoss", "Running"])
def test_mean_strategy_decides_where_the_replicas_mean_is_taken(strategy):
    """Mean over 2 replicas: with Post and Running the anchored gradient is each replica's own
    (the update divides by R, or the all-reduce means), with PostAndLoss the loss gradient, and
    so the anchored gradient, is divided by R (PopART's ``lossMeanReplication``); the trained
    weights are the same."""
    b, loss, ids, ws, feeds = _mlp(3)
    G = popart.reservedGradientPrefix()
    s = _scale_out_session(b, loss, _scale_out_optimizer("sgd1")[0], 1, 2, 1, f"Mean/{strategy}",
                           anchors=[G + ids[2]])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 5)).astype(np.float32)
    lab = rng.integers(0, 3, (2, 4)).astype(np.int32)
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x, "label": lab}, a))
    grads = []
    for r in range(2):
        t = [torch.tensor(w, requires_grad=True) for w in ws]
        torch.nn.functional.cross_entropy(torch.relu(torch.tensor(x[r]) @ t[0] + t[1]) @ t[2],
                                          torch.tensor(lab[r]).long()).backward()
        grads.append(t[2].grad.numpy() / (2 if strategy == "PostAndLoss" else 1))
    np.testing.assert_allclose(a[G + ids[2]], np.stack(grads), rtol=1e-4, atol=1e-6)
    mean_grad = np.mean([g * (2 if strategy == "PostAndLoss" else 1) for g in grads], axis=0)
    np.testing.assert_allclose(_weights(s, ids)[ids[2]], ws[2] - 0.05 * mean_grad, rtol=1e-5, atol=1e-6)


def test_nesterov_with_mean_reduction_follows_popart_formula():
    """SGD1 nesterov, accumulation factor 2 on 2 replicas, Mean: the velocity takes the mean
    gradient but the nesterov term the sum of the 4 micro-batch gradients (``sgd.hpp``:
    ``a = vs rf (a / ls + wd w) + mm v``, ``ndsf1 * dpsf1 = 1 / ls``):
    ``w1 = w0 - lr (sum g + wd w0 + mm v1)``, ``v1 = mean g + wd w0``."""
    b, loss, ids, ws, feeds = _mlp(3)
    lr, mm, wd = 0.05, 0.9, 0.01
    opt = popart.SGD({"defaultLearningRate": (lr, True), "defaultMomentum": (mm, True),
                      "defaultWeightDecay": (wd, True), "nesterov": (1, True)})
    s = _scale_out_session(b, loss, opt, 2, 2, 1, "Mean")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 2, 4, 5)).astype(np.float32)
    lab = rng.integers(0, 3, (2, 2, 4)).astype(np.int32)
    s.run(popart.PyStepIO({"x": x, "label": lab}, s.initAnchorArrays()))
    t = [torch.tensor(w, requires_grad=True) for w in ws]
    total = sum(torch.nn.functional.cross_entropy(torch.relu(torch.tensor(x[k, r]) @ t[0] + t[1]) @ t[2],
                                                  torch.tensor(lab[k, r]).long()) for k in range(2) for r in range(2))
    total.backward()
    new = _weights(s, ids)
    for i, w, tt in zip(ids, ws, t):
        g_sum = tt.grad.numpy()
        v1 = g_sum / 4 + wd * w
        np.testing.assert_allclose(new[i], w - lr * (g_sum + wd * w + mm * v1), rtol=1e-5, atol=1e-6)
    assert all(f"Accl___{i}_nesterovGrad" in s.getTensorIds() for i in ids)


@pytest.mark.parametrize("wdm", ["Decay", "L2Regularization"])
def test_adam_scaled_optimizer_state(wdm):
    """``scaled_optimizer_state``: the moments keep the loss scaling (``m`` times ``ls``, ``v``
    times ``ls^2``) and the steps equal plain Adam's; with a non-const loss scaling changed
    between steps (``updateOptimizerFromHost``) the state is rescaled to the new value."""
    def adam(ls, const, scaled):
        return popart.Adam({"defaultLearningRate": (0.01, True), "defaultWeightDecay": (0.1, True),
                            "lossScaling": (ls, const)}, weight_decay_mode=getattr(popart.WeightDecayMode, wdm),
                           scaled_optimizer_state=scaled)
    got = {}
    for const, scaled in ((True, False), (True, True), (False, True)):
        b, loss, ids, ws, feeds = _mlp(3)
        s = _session(b, loss, [loss], adam(8.0, const, scaled))
        _run(s, feeds)
        if not const:
            s.updateOptimizerFromHost(adam(32.0, const, scaled))
        _run(s, feeds)
        state = [f"Accl1___{ids[2]}", f"Accl2___{ids[2]}"]
        got[const, scaled] = _weights(s, list(ids) + state)
    ref = got[True, False]
    for key, scale in (((True, True), 8.0), ((False, True), 32.0)):
        for i in ids:
            np.testing.assert_allclose(got[key][i], ref[i], rtol=1e-5, atol=1e-6, err_msg=f"{key} {i}")
        np.testing.assert_allclose(got[key][f"Accl1___{ids[2]}"], scale * ref[f"Accl1___{ids[2]}"], rtol=1e-4)
        np.testing.assert_allclose(got[key][f"Accl2___{ids[2]}"], scale ** 2 * ref[f"Accl2___{ids[2]}"], rtol=1e-4)


def test_clip_norm_with_replicated_tensor_sharding():
    """Gradient clipping with the optimizer state sharded over 2 replicas: each replica's norm
    is the whole gradient's (its slice's squares all-reduced); the weights equal the unsharded
    run's."""
    got = {}
    for rts in (False, True):
        b, loss, ids, ws, feeds = _mlp(3)
        o = popart.SessionOptions()
        o.enableReplicatedGraphs, o.replicatedGraphCount = True, 2
        if rts:
            o.optimizerStateTensorLocationSettings.location.replicatedTensorSharding = popart.ReplicatedTensorSharding.On
            o.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 4
        opt = popart.Adam({"defaultLearningRate": (0.01, True)},
                          clip_norm_settings=[popart.ClipNormSettings.clipAllWeights(0.05)])
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
                                   loss, opt, popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}),
                                   userOptions=o)
        s.prepareDevice()
        s.weightsFromHost()
        rng = np.random.default_rng(4)
        _run(s, {"x": rng.standard_normal((2, 4, 5)).astype(np.float32),
                 "label": rng.integers(0, 3, (2, 4)).astype(np.int32)})
        got[rts] = _weights(s, ids)
        if rts:
            assert sum(op.op_type == "ReplicatedReduceScatter" for op in s.ops()) == 3
    for i in got[False]:
        np.testing.assert_allclose(got[True][i], got[False][i], rtol=1e-5, atol=1e-7, err_msg=i)


@pytest.mark.parametrize("per_lookup", [True, False])
def test_adam_per_lookup_second_moment_of_a_gathered_table(per_lookup):
    """openipu-only ``Adam.per_lookup_second_moment`` (set by the TensorFlow route for Keras 3's
    Adam): the second moment of a table read by a Gather adds each lookup's squared gradient
    (``index_add(gy ** 2)``), the first moment their sum; without it, the square of the sum
    (PopART's). 3 steps of loss = sum(gather(table, ids) ** 2) with repeated ids."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((6, 3)).astype(np.float32)
    ids = np.array([[0, 1, 1, 4], [4, 4, 2, 0]], np.int32)
    b = popart.Builder()
    i = b.addInputTensor(popart.TensorInfo("INT32", [2, 4]), "ids")
    w = b.addInitializedInputTensor(table, "table")
    g = b.aiOnnx.gather([w, i], axis=0)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.reducesum([b.aiOnnx.mul([g, g])], keepdims=0)])
    opt = popart.Adam({"defaultLearningRate": (0.05, True), "defaultEps": (1e-6, True)})
    opt.per_lookup_second_moment = per_lookup
    s = _session(b, loss, [loss], opt)
    for _ in range(3):
        _run(s, {"ids": ids})
    got = _weights(s, ["table"])["table"]
    ref, m, v = table.astype(np.float64), np.zeros(table.shape), np.zeros(table.shape)
    b1, b2 = 0.9, 0.999
    flat = ids.reshape(-1)
    for t in range(1, 4):
        gy = 2 * ref[flat]                              # one row per lookup
        gsum, gsq = np.zeros(table.shape), np.zeros(table.shape)
        np.add.at(gsum, flat, gy)
        np.add.at(gsq, flat, gy * gy)
        m = b1 * m + (1 - b1) * gsum
        v = b2 * v + (1 - b2) * (gsq if per_lookup else gsum * gsum)
        ref = ref - 0.05 * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + 1e-6)
    # rtol 1e-4: the bias correction's 1 - b2^t is FLOAT (1 - 0.999f is 1.3e-5 off 0.001), the
    # moving average's 1 - b2 is not; per lookup vs summed differ by far more (sqrt(3) vs 1 here)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
