"""Gradients of any tensor (issue 35, PopART's ``TrainingSession``): ``Gradient___<id>`` can be
anchored for every float tensor on the loss's path, model inputs and intermediate tensors
included, and a graph without trainable weights still grows its backward pass when gradients
are anchored. This is how PopART's own operator tests check a gradient: the differentiated
tensors are *inputs* (``addInputTensor``) fed by the ``PyStepIO``, compared with
``torch.autograd`` on the same values. Every case of :mod:`test_popart_op_grads` runs here again
with its weights made inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import popart
from test_popart_op_grads import CASES, _c, _rand

G = popart.reservedGradientPrefix()
ALL = popart.AnchorReturnType("All")


def _device():
    return popart.DeviceManager().createIpuModelDevice({})


def _train(b, loss, anchors, feeds, optimizer=None):
    """A TrainingSession run once on ``feeds``; returns the anchor arrays."""
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {a: ALL for a in anchors}), loss,
                               optimizer or popart.ConstSGD(0.1), _device())
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds, a))
    return a


@pytest.mark.parametrize("name", sorted(CASES))
def test_input_gradient_matches_torch(name):
    """Every op-gradient case with its differentiated tensors as model inputs and no weights."""
    c = CASES[name]
    b = popart.Builder(opsets={"ai.onnx": c.opset, "ai.graphcore": 1})
    ids = [b.addInputTensor(popart.TensorInfo(w), f"x{i}") for i, w in enumerate(c.ws)]
    y = c.build(b, *ids)
    tws = [torch.tensor(w.astype(np.float32), requires_grad=True) for w in c.ws]
    ty = c.ref(*tws)
    r = np.random.default_rng(11).standard_normal(tuple(ty.shape)).astype(np.float16 if c.fp16 else np.float32)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([y, _c(b, r)])], popart.ReductionType.Sum)
    a = _train(b, loss, [loss, y] + [G + i for i in ids], dict(zip(ids, c.ws)))
    (ty * torch.tensor(r.astype(np.float32))).sum().backward()
    np.testing.assert_allclose(a[y].astype(np.float32).reshape(ty.shape), ty.detach().numpy(), rtol=c.rtol,
                               atol=c.atol)
    for i, t, w in zip(ids, tws, c.ws):
        assert a[G + i].dtype == w.dtype, (i, a[G + i].dtype)
        np.testing.assert_allclose(a[G + i].astype(np.float32), t.grad.numpy(), rtol=c.rtol, atol=c.atol,
                                   err_msg=f"gradient of {i}")


def test_intermediate_and_loss_gradients():
    """``Gradient___`` of op outputs (one consumer, two consumers) and of the loss itself."""
    xv = _rand(2, 3)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    y = b.aiOnnx.relu([x])
    z = b.aiOnnx.mul([y, y])
    t = b.aiOnnx.tanh([z])
    loss = b.aiGraphcore.identityloss([t], popart.ReductionType.Sum)
    a = _train(b, loss, [loss, G + x, G + y, G + z, G + t, G + loss], {x: xv})
    tx = torch.tensor(xv, requires_grad=True)
    ty = torch.relu(tx)
    ty.retain_grad()
    tz = ty * ty
    tz.retain_grad()
    tt = torch.tanh(tz)
    tt.retain_grad()
    tt.sum().backward()
    for k, v in ((x, tx), (y, ty), (z, tz), (t, tt)):
        np.testing.assert_allclose(a[G + k], v.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(a[G + loss]) == 1.0


def test_inputs_and_weights_together():
    """A matmul + softmax + nll model: the gradient of the input beside the weight's, and the
    weight still updated (plain SGD)."""
    xv, wv, lab = _rand(4, 5), _rand(5, 3), np.array([0, 2, 1, 2], np.int32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 5]))
    label = b.addInputTensor(popart.TensorInfo("INT32", [4]))
    w = b.addInitializedInputTensor(wv, "w")
    p = b.aiOnnx.softmax([b.aiOnnx.matmul([x, w])], axis=1)
    loss = b.aiGraphcore.nllloss([p, label], popart.ReductionType.Mean)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {G + x: ALL, G + w: ALL}), loss,
                               popart.ConstSGD(0.5), _device())
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: xv, label: lab}, a))
    tx, tw = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
    F.cross_entropy(tx @ tw, torch.tensor(lab, dtype=torch.long)).backward()
    np.testing.assert_allclose(a[G + x], tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a[G + w], tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    s.weightsToHost()
    out = {"w": np.zeros_like(wv)}
    s.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_allclose(out["w"], wv - 0.5 * tw.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["conv_pool", "gemm", "l1loss", "nll_logprob", "graphcore_ops"])
def test_input_gradient_other_families(family):
    """Families the op-gradient table differentiates through weights only: conv + pooling,
    Gemm, the ai.graphcore losses and elementwise ops, each through an input's gradient."""
    b = popart.Builder()
    if family == "conv_pool":
        xv, wv = _rand(1, 2, 6, 6), _rand(3, 2, 3, 3)
        x, w = (b.addInputTensor(popart.TensorInfo(v)) for v in (xv, wv))
        y = b.aiOnnx.maxpool([b.aiOnnx.conv([x, w], pads=[1, 1, 1, 1])], 1, kernel_shape=[2, 2], strides=[2, 2])[0]
        y = b.aiOnnx.averagepool([y], kernel_shape=[3, 3], strides=[1, 1])

        def ref(tx, tw):
            return F.avg_pool2d(F.max_pool2d(F.conv2d(tx, tw, padding=1), 2), 3, 1)
        loss = b.aiGraphcore.identityloss([y], popart.ReductionType.Sum)
        vals = [xv, wv]
    elif family == "gemm":
        xv, wv, cv = _rand(3, 4), _rand(5, 4), _rand(5)
        x, w, cc = (b.addInputTensor(popart.TensorInfo(v)) for v in (xv, wv, cv))
        y = b.aiOnnx.gemm([x, w, cc], alpha=0.5, beta=2.0, transB=1)

        def ref(tx, tw, tc):
            return 0.5 * tx @ tw.T + 2.0 * tc
        loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([y, y])], popart.ReductionType.Mean)
        vals = [xv, wv, cv]
        ref = (lambda f: lambda *t: f(*t) ** 2)(ref)
    elif family == "l1loss":
        xv = _rand(3, 4)
        x = b.addInputTensor(popart.TensorInfo(xv))
        loss = b.aiGraphcore.l1loss([x], 0.3, popart.ReductionType.Mean)

        def ref(tx):
            return 0.3 * tx.abs()
        vals = [xv]
    elif family == "nll_logprob":
        xv, lab = _rand(4, 5), np.array([1, 4, 0, 1], np.int32)
        x = b.addInputTensor(popart.TensorInfo(xv))
        label = b.addInputTensor(popart.TensorInfo(lab))
        loss = b.aiGraphcore.nllloss([b.aiOnnx.logsoftmax([x], axis=1), label], popart.ReductionType.Sum,
                                     inputIsLogProbability=True)
        s = _train(b, loss, [G + x], {x: xv, label: lab})
        tx = torch.tensor(xv, requires_grad=True)
        F.cross_entropy(tx, torch.tensor(lab, dtype=torch.long), reduction="sum").backward()
        np.testing.assert_allclose(s[G + x], tx.grad.numpy(), rtol=1e-5, atol=1e-6)
        return
    else:
        xv, yv = _rand(3, 4, lo=0.2), _rand(3, 4, lo=0.2)
        x, y0 = (b.addInputTensor(popart.TensorInfo(v)) for v in (xv, yv))
        y = b.aiGraphcore.scaledadd([b.aiGraphcore.gelu([x]), b.aiGraphcore.swish([y0])], scale0=0.5, scale1=2.0)
        y = b.aiGraphcore.scale([y], 3.0)
        loss = b.aiGraphcore.identityloss([y], popart.ReductionType.Sum)

        def ref(tx, ty):
            return 3.0 * (0.5 * F.gelu(tx, approximate="tanh") + 2.0 * F.silu(ty))
        vals = [xv, yv]
    ins = b.getInputTensorIds()[:len(vals)]
    a = _train(b, loss, [G + i for i in ins], dict(zip(ins, vals)))
    ts = [torch.tensor(v, requires_grad=True) for v in vals]
    out = ref(*ts)
    (out.mean() if family in ("gemm", "l1loss") else out.sum()).backward()
    for i, t in zip(ins, ts):
        np.testing.assert_allclose(a[G + i], t.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=i)


def test_gradient_without_path_to_loss_is_anchor_error():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    u = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    loss = b.aiGraphcore.identityloss([x])
    with pytest.raises(popart.popart_exception, match="Anchor tensor `Gradient___input/1' not in Ir Tensors"):
        popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {G + u: ALL}), loss, popart.ConstSGD(0.1),
                               _device())


def test_no_gradient_anchored_grows_nothing_for_inputs():
    """Without anchored gradients an input's gradient is not computed (pruned, as in PopART)."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 2]))
    w = b.addInitializedInputTensor(np.ones((2, 2), np.float32))
    loss = b.aiGraphcore.identityloss([b.aiOnnx.matmul([x, w])])
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss, popart.ConstSGD(0.1),
                               _device())
    assert not any(o == G + x for op in s.ops() for o in op.outputs)
