"""PopART training: autodiff, SGD updates, TrainingSession API and errors, against torch.autograd
and torch.optim on the same weights."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import popart

G = popart.reservedGradientPrefix()
ALL = popart.AnchorReturnType("All")


def _device():
    return popart.DeviceManager().createIpuModelDevice({})


def _session(b, loss, anchors, optimizer=None, bps=1, **kw):
    df = popart.DataFlow(bps, {a: ALL for a in anchors})
    s = popart.TrainingSession(b.getModelProto(), df, loss, optimizer or popart.ConstSGD(0.1), _device(), **kw)
    s.prepareDevice()
    s.weightsFromHost()
    return s


def _run(s, feeds):
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds, a))
    return a


def _weights(s, ids):
    s.weightsToHost()
    out = {i: np.zeros(s.getInfo(i).shape(), np.float32) for i in ids}
    s.readWeights(popart.PyWeightsIO(out))
    return out


def _mlp(seed=0):
    rng = np.random.default_rng(seed)
    w1, b1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((5, 6), (6,), (6, 3)))
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 5]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [4]), "label")
    W1, B1, W2 = (b.addInitializedInputTensor(v, n) for v, n in ((w1, "w1"), (b1, "b1"), (w2, "w2")))
    h = b.aiOnnx.relu([b.aiOnnx.add([b.aiOnnx.matmul([x, W1]), B1])])
    p = b.aiOnnx.softmax([b.aiOnnx.matmul([h, W2])], axis=1)
    loss = b.aiGraphcore.nllloss([p, lab], popart.ReductionType.Mean)
    feeds = {x: rng.standard_normal((4, 5)).astype(np.float32), lab: np.array([0, 2, 1, 2], np.int32)}
    return b, loss, (W1, B1, W2), (w1, b1, w2), feeds


def _torch_mlp(ws, feeds, x, lab):
    t = [torch.tensor(w, requires_grad=True) for w in ws]
    logits = torch.relu(torch.tensor(feeds[x]) @ t[0] + t[1]) @ t[2]
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(feeds[lab]).long())
    loss.backward()
    return t, loss


def test_mlp_step_matches_torch():
    b, loss, ids, ws, feeds = _mlp()
    s = _session(b, loss, [loss] + [G + i for i in ids], popart.ConstSGD(0.1))
    a = _run(s, feeds)
    t, tl = _torch_mlp(ws, feeds, "x", "label")
    assert a[loss] == pytest.approx(tl.item(), rel=1e-5)
    for i, tt in zip(ids, t):
        np.testing.assert_allclose(a[G + i], tt.grad.numpy(), rtol=1e-4, atol=1e-6)
    new = _weights(s, ids)
    for i, w, tt in zip(ids, ws, t):
        np.testing.assert_allclose(new[i], w - 0.1 * tt.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert s.getCycleCount() > 0
    # the softmax + nll gradient is one op (NlllWithSoftmaxGradDirect) and the weight updates
    # are precise PopLibs lowerings
    types = [op.op_type for op in s.ops()]
    assert "NlllWithSoftmaxGradDirect" in types and "SoftmaxGrad" not in types
    assert {op.lowering for op in s.ops() if op.op_type == "SGD0VarUpdate"} == {"precise"}


def test_pattern_off_uses_softmax_grad():
    b, loss, ids, ws, feeds = _mlp()
    pats = popart.Patterns()
    pats.NlllWithSoftMaxGradDirect = False
    s = _session(b, loss, [G + ids[2]], patterns=pats)
    a = _run(s, feeds)
    assert "SoftmaxGrad" in [op.op_type for op in s.ops()]
    t, _ = _torch_mlp(ws, feeds, "x", "label")
    np.testing.assert_allclose(a[G + ids[2]], t[2].grad.numpy(), rtol=1e-4, atol=1e-6)


# --- gradients of each op family against torch.autograd ------------------------------------
def _conv(b, x, w):
    return b.aiOnnx.conv([x, w], pads=[1, 0, 1, 0], strides=[2, 1], group=1)


def _torch_conv(x, w):
    return torch.nn.functional.conv2d(torch.nn.functional.pad(x, (0, 0, 1, 1)), w, stride=(2, 1))


def _sm(b, x, w):
    return b.aiOnnx.softmax([b.aiOnnx.mul([x, w])], axis=-1)


CASES = {
    # name: (x shape, w shape, popart fn, torch fn, opset)
    "matmul_broadcast": ((2, 3, 4), (4, 5), lambda b, x, w: b.aiOnnx.matmul([x, w]), torch.matmul, None),
    "gemm_transB": ((3, 4), (5, 4), lambda b, x, w: b.aiOnnx.gemm([x, w, b.aiOnnx.constant(np.ones(5, np.float32))], 0.5, 2.0, 0, 1),
                    lambda x, w: 0.5 * x @ w.T + 2.0, None),
    "mul_div_sub_broadcast": ((2, 3, 4), (3, 1), lambda b, x, w: b.aiOnnx.sub([b.aiOnnx.div([x, b.aiOnnx.exp([w])]),
                                                                             b.aiOnnx.mul([x, w])]),
                              lambda x, w: x / torch.exp(w) - x * w, None),
    "conv_stride_pad": ((2, 3, 7, 5), (4, 3, 3, 2), _conv, _torch_conv, None),
    "conv_grouped_bias": ((1, 4, 6, 6), (4, 2, 3, 3),
                          lambda b, x, w: b.aiOnnx.conv([x, w], pads=[1, 1, 1, 1], group=2),
                          lambda x, w: torch.nn.functional.conv2d(x, w, padding=1, groups=2), None),
    "maxpool_sigmoid": ((2, 3, 6, 6), (1, 3, 1, 1),
                        lambda b, x, w: b.aiOnnx.maxpool([b.aiOnnx.sigmoid([b.aiOnnx.mul([x, w])])], num_outputs=1,
                                                         kernel_shape=[2, 2], strides=[2, 2])[0],
                        lambda x, w: torch.nn.functional.max_pool2d(torch.sigmoid(x * w), 2), None),
    "avgpool_tanh": ((2, 3, 6, 6), (1, 3, 1, 1),
                     lambda b, x, w: b.aiOnnx.averagepool([b.aiOnnx.tanh([b.aiOnnx.add([x, w])])],
                                                          kernel_shape=[3, 3], strides=[1, 1]),
                     lambda x, w: torch.nn.functional.avg_pool2d(torch.tanh(x + w), 3, 1), None),
    "global_avgpool": ((2, 3, 4, 4), (1, 3, 1, 1),
                       lambda b, x, w: b.aiOnnx.globalaveragepool([b.aiOnnx.mul([x, w])]),
                       lambda x, w: (x * w).mean((2, 3), keepdim=True), None),
    "softmax_last_axis": ((2, 3, 5), (5,), _sm, lambda x, w: torch.softmax(x * w, -1), None),
    "logsoftmax_gelu": ((3, 6), (6,), lambda b, x, w: b.aiOnnx.logsoftmax([b.aiGraphcore.gelu([b.aiOnnx.add([x, w])])],
                                                                          axis=1),
                        lambda x, w: torch.log_softmax(torch.nn.functional.gelu(x + w, approximate="tanh"), 1), None),
    "transpose_reshape_concat": ((2, 3, 4), (2, 4, 3),
                                 lambda b, x, w: b.aiOnnx.reshape([b.aiOnnx.concat([b.aiOnnx.transpose([x], [0, 2, 1]), w],
                                                                                   axis=1),
                                                                   b.aiOnnx.constant(np.array([4, -1], np.int64))]),
                                 lambda x, w: torch.cat([x.permute(0, 2, 1), w], 1).reshape(4, -1), None),
    "reducemean_sqrt_log": ((3, 4), (4,), lambda b, x, w: b.aiOnnx.reducemean(
        [b.aiOnnx.log([b.aiOnnx.sqrt([b.aiOnnx.add([b.aiOnnx.mul([x, x]), b.aiOnnx.exp([w])])])])], axes=[0], keepdims=0),
        lambda x, w: torch.log(torch.sqrt(x * x + torch.exp(w))).mean(0), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_match_torch_autograd(case):
    xs, wsh, fn, tfn, _ = CASES[case]
    rng = np.random.default_rng(1)
    xv, wv = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(wsh).astype(np.float32)
    b = popart.Builder()
    x, w = b.addInitializedInputTensor(xv, "x"), b.addInitializedInputTensor(wv, "w")
    y = fn(b, x, w)
    yshape = tuple(tfn(torch.tensor(xv), torch.tensor(wv)).shape)
    r = rng.standard_normal(yshape).astype(np.float32)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([y, b.aiOnnx.constant(r)])], popart.ReductionType.Sum)
    s = _session(b, loss, [loss, G + x, G + w])
    a = _run(s, {})
    tx, tw = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
    tl = (tfn(tx, tw) * torch.tensor(r)).sum()
    tl.backward()
    assert float(a[loss]) == pytest.approx(tl.item(), rel=1e-4, abs=1e-5)
    np.testing.assert_allclose(a[G + x], tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a[G + w], tw.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_gather_l1_gradients():
    rng = np.random.default_rng(2)
    table = rng.standard_normal((7, 4)).astype(np.float32)
    idx = np.array([[1, 3, 1], [6, 0, 3]], np.int32)
    b = popart.Builder()
    t = b.addInitializedInputTensor(table, "table")
    i = b.addInputTensor(popart.TensorInfo("INT32", [2, 3]), "idx")
    loss = b.aiGraphcore.l1loss([b.aiOnnx.gather([t, i], axis=0)], 0.5, popart.ReductionType.Mean)
    s = _session(b, loss, [loss, G + t])
    a = _run(s, {i: idx})
    tt = torch.tensor(table, requires_grad=True)
    tl = 0.5 * tt[torch.tensor(idx).long()].abs().mean()
    tl.backward()
    assert float(a[loss]) == pytest.approx(tl.item(), rel=1e-5)
    np.testing.assert_allclose(a[G + t], tt.grad.numpy(), rtol=1e-5, atol=1e-7)


# --- optimizers ----------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{"momentum": 0.9}, {"momentum": 0.9, "weight_decay": 0.01},
                                {"momentum": 0.5, "nesterov": True, "weight_decay": 0.02},
                                {"weight_decay": 0.05}])
def test_sgd_steps_match_torch_optim(kw):
    b, loss, ids, ws, feeds = _mlp(3)
    opt = popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (kw.get("momentum", 0.0), True),
                      "defaultWeightDecay": (kw.get("weight_decay", 0.0), True),
                      "nesterov": (float(kw.get("nesterov", False)), True)})
    s = _session(b, loss, [loss], opt, bps=3)
    x3 = {k: np.ascontiguousarray(np.stack([v * (1 + 0.1 * j) if v.dtype == np.float32 else v for j in range(3)]))
          for k, v in feeds.items()}
    _run(s, x3)
    t = [torch.tensor(w, requires_grad=True) for w in ws]
    topt = torch.optim.SGD(t, lr=0.05, **kw)
    for j in range(3):
        topt.zero_grad()
        logits = torch.relu(torch.tensor(x3["x"][j]) @ t[0] + t[1]) @ t[2]
        torch.nn.functional.cross_entropy(logits, torch.tensor(x3["label"][j]).long()).backward()
        topt.step()
    new = _weights(s, ids)
    for i, tt in zip(ids, t):
        np.testing.assert_allclose(new[i], tt.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_weights_to_host_keeps_no_second_host_copy(monkeypatch):
    """``weightsToHost`` with one replica writes the device's weights and optimizer state straight
    into the session's host copies: no staging buffer per weight stays connected to the engine
    (it doubled the host memory of every weight and momentum: +0.9 GB for fp32 BERT-base), and a
    second step and read-back still give torch.optim.SGD's weights. (The device emulation's
    streams: the IR executor keeps no engine buffers.)"""
    monkeypatch.setenv("OPENIPU_EXECUTION", "device")
    b, loss, ids, ws, feeds = _mlp(3)
    s = _session(b, loss, [loss], popart.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True)}))
    t = [torch.tensor(w, requires_grad=True) for w in ws]
    topt = torch.optim.SGD(t, lr=0.05, momentum=0.9)
    for _ in range(2):
        _run(s, feeds)
        s.weightsToHost()
        topt.zero_grad()
        logits = torch.relu(torch.tensor(feeds["x"]) @ t[0] + t[1]) @ t[2]
        torch.nn.functional.cross_entropy(logits, torch.tensor(feeds["label"]).long()).backward()
        topt.step()
    outs = s._lowered.weights_out
    assert any(tid.startswith("Accl") for tid in outs)          # the momentum comes back too
    for tid, h in outs.items():
        assert np.shares_memory(s._engine._streams[h], s._host_weights[tid]), tid
    new = _weights(s, ids)
    for i, tt in zip(ids, t):
        np.testing.assert_allclose(new[i], tt.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_dampening_and_loss_scaling_follow_popart_formula():
    """With dampening, PopART's velocity starts at (1 - dm) wd w0 and is dampened from the
    first step on (PyTorch does not dampen its first step): w1 = w0 - lr (1 - dm)(g + wd w0)."""
    b, loss, ids, ws, feeds = _mlp(4)
    lr, mm, dm, wd, ls = 0.1, 0.9, 0.3, 0.01, 8.0
    opt = popart.SGD({"defaultLearningRate": (lr, True), "defaultMomentum": (mm, True),
                      "defaultDampening": (dm, True), "defaultWeightDecay": (wd, True), "lossScaling": (ls, True)})
    s = _session(b, loss, [G + i for i in ids], opt)
    a = _run(s, feeds)
    t, _ = _torch_mlp(ws, feeds, "x", "label")
    new = _weights(s, ids)
    for i, w, tt in zip(ids, ws, t):
        np.testing.assert_allclose(a[G + i], ls * tt.grad.numpy(), rtol=1e-4, atol=1e-5)   # scaled gradients
        np.testing.assert_allclose(new[i], w - lr * (1 - dm) * (tt.grad.numpy() + wd * w), rtol=1e-4, atol=1e-6)


def test_update_optimizer_from_host():
    b, loss, ids, ws, feeds = _mlp(5)
    s = _session(b, loss, [G + ids[0]], popart.SGD({"defaultLearningRate": (0.1, False)}))
    _run(s, feeds)
    w_after1 = _weights(s, ids)[ids[0]]
    s.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (0.0, False)}))
    _run(s, feeds)
    np.testing.assert_array_equal(_weights(s, ids)[ids[0]], w_after1)     # lr 0: no change
    with pytest.raises(popart.popart_exception, match="constant"):
        s.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (0.1, True)}))


# --- errors -----------------------------------------------------------------------------------
def test_training_errors():
    b, loss, ids, ws, feeds = _mlp()
    proto = b.getModelProto()
    df = popart.DataFlow(1, {loss: ALL})
    with pytest.raises(popart.popart_exception, match="Could not find loss tensor 'nope' in main graph tensors"):
        popart.TrainingSession(proto, df, "nope", popart.ConstSGD(0.1), _device())
    with pytest.raises(popart.popart_exception, match="must be a scalar tensor"):
        popart.TrainingSession(proto, df, "x", popart.ConstSGD(0.1), _device())
    with pytest.raises(popart.popart_exception, match="Invalid SGD key, defaultLearningRat, the allowed keys"):
        popart.SGD({"defaultLearningRat": (0.1, True)})
    with pytest.raises(popart.popart_exception, match="must be a py::tuple"):
        popart.SGD({"defaultLearningRate": 0.1})
    s = popart.TrainingSession(proto, df, loss, popart.ConstSGD(0.1), _device())
    s.prepareDevice()
    with pytest.raises(popart.popart_exception, match="Must call weightsFromHost before run"):
        s.run(popart.PyStepIO(feeds, s.initAnchorArrays()))
    s.weightsFromHost()
    _run(s, feeds)          # still usable


def test_op_without_gradient_is_named():
    b = popart.Builder()
    w = b.addInitializedInputTensor(np.ones((2, 2), np.float32), "w")
    loss = b.aiGraphcore.identityloss([b.aiOnnx.hardmax([w])])
    with pytest.raises(popart.popart_exception, match=r"ai.onnx.Hardmax.*has no gradient"):
        popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss, popart.ConstSGD(0.1),
                               _device())


# --- acceptance: the digits classifier -----------------------------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "popart"))


#: (optimizer, replicas, accumulation factor, pipelined over 2 IPUs): the acceptance's variants.
#: Every one trains on the same 32 images per weight update, in the same order, for the same
#: epochs (``train_digits``'s recipe); the micro-batch is 32 / (replicas x accumulation).
DIGITS = [("constsgd", 1, 1, False), ("sgd", 1, 1, False), ("adam", 1, 1, False), ("constsgd", 2, 1, False),
          ("constsgd", 1, 4, False), ("constsgd", 1, 1, True), ("sgd", 1, 4, True), ("adam", 2, 2, False)]


@pytest.fixture(scope="module")
def digits_constsgd():
    """The reference run: ConstSGD, one replica, no accumulation, not pipelined."""
    pytest.importorskip("sklearn")
    from train_digits import train
    return train("constsgd")


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,replicas,accumulation,pipeline", DIGITS,
                         ids=[f"{o}-r{r}-a{a}{'-pipelined' if p else ''}" for o, r, a, p in DIGITS])
def test_digits_classifier_trains(optimizer, replicas, accumulation, pipeline, digits_constsgd):
    """The acceptance classifier: ConstSGD reaches >= 95 % test accuracy on the digits, and the
    same script with SGD momentum, with Adam, with 2 replicas, with accumulation factor 4 and
    pipelined over 2 IPUs reaches >= 95 % too, within 1 point of the ConstSGD run.

    One recipe for all (``examples/popart/train_digits.py``): the same model and initial weights,
    32 images per weight update in the same order, the same learning-rate schedule (30 epochs at
    the optimizer's rate, then 10 at a tenth of it, where the test accuracy is flat).
    Replicas and accumulation split each update's 32 images into micro-batches whose gradients
    PopART's default Sum reduction adds, so those runs make the updates of the reference run; the
    pipelined run without accumulation updates the weights every micro-batch with stale weights
    (PopART's continuous pipelining), its own trajectory. Measured figures: README."""
    from train_digits import train
    ref = (optimizer, replicas, accumulation, pipeline) == ("constsgd", 1, 1, False)
    r = digits_constsgd if ref else train(optimizer, replicas=replicas, accumulation=accumulation, pipeline=pipeline)
    assert r["losses"][-1] < r["losses"][0] / 4
    assert r["test_accuracy"] >= 0.95
    assert abs(r["test_accuracy"] - digits_constsgd["test_accuracy"]) <= 0.01 + 1e-9, \
        (r["test_accuracy"], digits_constsgd["test_accuracy"])


def test_a_weight_without_a_gradient_path_is_not_updated_and_its_gradient_is_no_anchor():
    """PopART grows gradients from the loss only: a weight that does not reach the loss gets no
    gradient and no update, and anchoring ``Gradient___<it>`` raises PopART's anchor error; the
    same model without that anchor trains."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = b.addInitializedInputTensor(np.ones((3, 3), np.float32), "w")
    u = b.addInitializedInputTensor(np.ones((3, 3), np.float32), "u")       # no path to the loss
    y = b.aiOnnx.matmul([x, w])
    z = b.aiOnnx.matmul([x, u])
    loss = b.aiGraphcore.l1loss([y], 1.0)
    with pytest.raises(popart.popart_exception, match=r"^Anchor tensor `Gradient___u' not in Ir Tensors\."):
        popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL, G + u: ALL}), loss,
                               popart.ConstSGD(0.1), _device())
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL, z: ALL, G + w: ALL}), loss,
                               popart.ConstSGD(0.1), _device())
    s.prepareDevice()
    s.weightsFromHost()
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.ones((2, 3), np.float32)}, out))
    np.testing.assert_allclose(out[z], 3.0)
    got = {"w": np.zeros((3, 3), np.float32), "u": np.zeros((3, 3), np.float32)}
    s.weightsToHost()
    s.readWeights(popart.PyWeightsIO(got))
    np.testing.assert_array_equal(got["u"], 1.0)                        # not updated
    np.testing.assert_allclose(got["w"], 1.0 - 0.1 * out[G + w], rtol=1e-6)
    assert (out[G + w] != 0).all()


@pytest.mark.parametrize("reduction", ["Sum", "Mean"])
def test_two_replicas_train_like_one_replica_at_twice_the_micro_batch(monkeypatch, reduction):
    """The digits classifier over 2 replicas of micro-batch 16 (the data split row-major over the
    replicas, gradients all-reduced) makes the same weights as one replica of micro-batch 32 on the
    same images: with PopART's default Sum reduction exactly the same step, with Mean half of it
    (the update divides by the replication factor). This is why the 2-replica digits run differs
    from the single-replica one only by its trajectory (fewer, averaged updates), not by a bug."""
    import train_digits
    rng = np.random.default_rng(0)
    x0 = rng.random((4 * 32, 1, 8, 8), np.float32)
    y0 = rng.integers(0, 10, 4 * 32).astype(np.int32)
    out = {}
    for replicas, batch in ((2, 16), (1, 32)):
        monkeypatch.setattr(train_digits, "BATCH", batch)
        b, x, y, _, loss = train_digits.model(0)
        o = popart.SessionOptions()
        if replicas > 1:
            o.enableReplicatedGraphs = True
            o.replicatedGraphCount = replicas
        o.accumulationAndReplicationReductionType = getattr(popart.ReductionType, reduction)
        lr = 0.01 if reduction == "Sum" or replicas > 1 else 0.005      # Mean over 2 replicas halves the step
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(4, {loss: ALL}), loss, popart.ConstSGD(lr),
                                   popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas}), userOptions=o)
        s.prepareDevice()
        s.weightsFromHost()
        s.run(popart.PyStepIO({x: x0, y: y0}, s.initAnchorArrays()))
        out[replicas] = _weights(s, ["conv_w", "conv_b", "fc_w", "fc_b"])
    for k in out[1]:
        np.testing.assert_allclose(out[2][k], out[1][k], rtol=1e-5, atol=1e-6, err_msg=k)
