"""PopART's ai.graphcore builder ops batchnormalization, lstm, ctcbeamsearchdecoder,
groupedscatterreduce, replicatedreducescatter, splinebasis, splineweighting and packedDataBlock:
forward values against references written here from the documented semantics (torch / numpy /
plain Python), gradients against torch.autograd for the ops PopART trains, and PopART's errors."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch

import popart

G = popart.reservedGradientPrefix()
ALL = popart.AnchorReturnType("All")
F = torch.nn.functional


def _device(n=1):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": n})


def _infer(b, outs, feeds=None, opts=None, ipus=1):
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {o: ALL for o in outs}), _device(ipus),
                                userOptions=opts)
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds or {}, a))
    return s, a


def _train(b, loss, anchors, feeds=None, lr=0.0):
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {a: ALL for a in anchors}), loss,
                               popart.ConstSGD(lr), _device())
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds or {}, a))
    return s, a


def _weighted_loss(b, y, r):
    """``sum(y * r)`` as the loss (``r`` a fixed random tensor): the gradient of ``y`` is ``r``."""
    return b.aiGraphcore.identityloss([b.aiOnnx.mul([y, b.aiOnnx.constant(r)])], popart.ReductionType.Sum)


# --- batchnormalization ---------------------------------------------------------------------
def test_batchnormalization_inference_uses_the_given_statistics():
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((2, 3, 4)).astype(np.float32)
    sc, bi, mu = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, 3).astype(np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, 4]), "x")
    (y,) = b.aiGraphcore.batchnormalization([x] + [b.aiOnnx.constant(v) for v in (sc, bi, mu, var)], 1, 1e-3)
    s, a = _infer(b, [y], {x: xv})
    assert [op.lowering for op in s.ops() if op.op_type == "BatchNormalization"] == ["precise"]
    c = (slice(None), None)
    np.testing.assert_allclose(a[y], (xv - mu[c]) / np.sqrt(var[c] + 1e-3) * sc[c] + bi[c], rtol=1e-5, atol=1e-6)


def test_batchnormalization_training_matches_torch_with_unbiased_running_variance():
    rng = np.random.default_rng(1)
    xv = rng.standard_normal((4, 3, 5)).astype(np.float32) * 2 + 1
    sc, bi = rng.uniform(0.5, 1.5, 3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    mu0, var0 = rng.standard_normal(3).astype(np.float32), rng.uniform(0.5, 2, 3).astype(np.float32)
    eps, momentum = 1e-5, 0.8
    b = popart.Builder()
    x, s, bb = (b.addInitializedInputTensor(v, n) for v, n in ((xv, "x"), (sc, "scale"), (bi, "bias")))
    mean, var = b.addInitializedInputTensor(mu0, "mean"), b.addInitializedInputTensor(var0, "var")
    outs = b.aiGraphcore.batchnormalization([x, s, bb, mean, var], 5, eps, momentum)
    assert len(outs) == 5 and b.getTensorShape(outs[2]) == [3]
    y, run_mean, run_var, saved_mean, saved_var = outs
    r = rng.standard_normal(xv.shape).astype(np.float32)
    loss = _weighted_loss(b, y, r)
    sess, a = _train(b, loss, outs + [G + x, G + s, G + bb])
    assert {op.op_type: op.lowering for op in sess.ops() if "BatchNorm" in op.op_type} == \
        {"BatchNormalization": "precise", "BatchNormalizationGrad": "precise"}
    # torch: training-mode batch norm (PyTorch's momentum is PopART's 1 - momentum)
    tm, tv = torch.tensor(mu0), torch.tensor(var0)
    tx, ts, tb = (torch.tensor(v, requires_grad=True) for v in (xv, sc, bi))
    ty = F.batch_norm(tx, tm, tv, ts, tb, training=True, momentum=1 - momentum, eps=eps)
    (ty * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(a[y], ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    n = xv.size // 3
    batch_mean, batch_var = xv.mean((0, 2)), xv.var((0, 2))
    np.testing.assert_allclose(a[saved_mean], batch_mean, rtol=1e-5, atol=1e-6)
    # PopART's saved variance: the unbiased conversion of the inverse standard deviation
    np.testing.assert_allclose(a[saved_var], (batch_var + eps) * n / (n - 1) - eps, rtol=1e-5)
    np.testing.assert_allclose(a[run_mean], tm.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a[run_var], tv.numpy(), rtol=1e-5, atol=1e-5)      # torch: unbiased variance
    for k, t in ((x, tx), (s, ts), (bb, tb)):
        np.testing.assert_allclose(a[G + k], t.grad.numpy(), rtol=1e-4, atol=1e-5)
    # the running statistics replace the mean / var weights (PopART's VariableUpdateType::Copy)
    w = {mean: np.zeros(3, np.float32), var: np.zeros(3, np.float32)}
    sess.weightsToHost()
    sess.readWeights(popart.PyWeightsIO(w))
    np.testing.assert_allclose(w[mean], a[run_mean], rtol=1e-6)
    np.testing.assert_allclose(w[var], a[run_var], rtol=1e-6)


def test_batchnormalization_non_spatial_gradient():
    # spatial=0 (an attribute the builder does not set): each feature of x.shape[1:] normalised
    rng = np.random.default_rng(2)
    xv = rng.standard_normal((5, 2, 3)).astype(np.float32)
    sc, bi = rng.uniform(0.5, 1.5, (2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    b = popart.Builder()
    x, s = b.addInitializedInputTensor(xv, "x"), b.addInitializedInputTensor(sc, "scale")
    consts = [b.aiOnnx.constant(v) for v in (bi, np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32))]
    y = b.customOp("BatchNormalization", 1, "ai.graphcore", [x, s] + consts, {"spatial": 0}, 5)[0]
    r = rng.standard_normal(xv.shape).astype(np.float32)
    _, a = _train(b, _weighted_loss(b, y, r), [y, G + x, G + s])
    tx, ts = torch.tensor(xv, requires_grad=True), torch.tensor(sc, requires_grad=True)
    ty = F.batch_norm(tx.reshape(5, 6), None, None, ts.reshape(6), torch.tensor(bi).reshape(6), training=True)
    (ty * torch.tensor(r).reshape(5, 6)).sum().backward()
    np.testing.assert_allclose(a[y], ty.detach().numpy().reshape(5, 2, 3), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a[G + x], tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a[G + s], ts.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_batchnormalization_errors():
    b = popart.Builder()
    x = b.addInitializedInputTensor(np.ones((2, 2, 3), np.float32), "x")
    ok = [b.aiOnnx.constant(np.ones(2, np.float32)) for _ in range(4)]
    bad = b.aiOnnx.constant(np.ones(3, np.float32))
    with pytest.raises(popart.popart_exception, match=r"expected shape of batch norm input tensor scale \(\[3\]\) to "
                                                      r"be \[2\] to match dimension 1 of X \(\[2 2 3\]\)"):
        b.aiGraphcore.batchnormalization([x, bad] + ok[1:], 5)
    x2 = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 2]), "x2")
    with pytest.raises(popart.popart_exception, match="batch norm requires X to have a rank >= 3.  x has rank 2"):
        b.aiGraphcore.batchnormalization([x2] + ok, 1)
    with pytest.raises(popart.popart_exception, match="BatchNormalization has invalid number of inputs 3"):
        b.aiGraphcore.batchnormalization([x] + ok[:2], 1)
    # an inference-mode op (one output) in a training session, not detached
    (y,) = b.aiGraphcore.batchnormalization([x] + ok, 1)
    loss = b.aiGraphcore.identityloss([y])
    with pytest.raises(popart.popart_exception, match="has 1 output\\(s\\) which means it is in inference mode, but "
                                                      "its gradient Op is being created"):
        popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss, popart.ConstSGD(0.1),
                               _device())


# --- lstm -----------------------------------------------------------------------------------
def _popart_lstm_ref(x, w, bias, init, full=True):
    """PopART's LSTM from its definition: gates forget, input, candidate, output."""
    n_in = x.shape[2]
    h, c = init[0], init[1]
    ys = []
    for t in range(x.shape[0]):
        g = [x[t] @ w[k, :n_in] + h @ w[k, n_in:] + bias[k] for k in range(4)]
        c = torch.sigmoid(g[0]) * c + torch.sigmoid(g[1]) * torch.tanh(g[2])
        h = torch.sigmoid(g[3]) * torch.tanh(c)
        ys.append(h)
    return (torch.stack(ys) if full else h), c


@pytest.mark.parametrize("full", [1, 0])
def test_lstm_forward_and_gradients_match_torch(full):
    rng = np.random.default_rng(3)
    t, n, i, h = 4, 2, 3, 5
    xv = rng.standard_normal((t, n, i)).astype(np.float32)
    wv = (rng.standard_normal((4, i + h, h)) * 0.4).astype(np.float32)
    bv = (rng.standard_normal((4, h)) * 0.1).astype(np.float32)
    sv = (rng.standard_normal((2, n, h)) * 0.5).astype(np.float32)
    b = popart.Builder()
    x, w, bias, st = (b.addInitializedInputTensor(v, k) for v, k in ((xv, "x"), (wv, "w"), (bv, "b"), (sv, "s")))
    y, cell = b.aiGraphcore.lstm([x, w, bias, st], outputFullSequence=full)
    assert b.getTensorShape(y) == ([t, n, h] if full else [n, h]) and b.getTensorShape(cell) == [n, h]
    ty_shape = (t, n, h) if full else (n, h)
    r1, r2 = rng.standard_normal(ty_shape).astype(np.float32), rng.standard_normal((n, h)).astype(np.float32)
    both = b.aiOnnx.add([b.aiOnnx.reducesum([b.aiOnnx.mul([y, b.aiOnnx.constant(r1)])], keepdims=0),
                         b.aiOnnx.reducesum([b.aiOnnx.mul([cell, b.aiOnnx.constant(r2)])], keepdims=0)])
    loss = b.aiGraphcore.identityloss([both], popart.ReductionType.Sum)
    _, a = _train(b, loss, [y, cell, G + x, G + w, G + bias, G + st])
    tx, tw, tb, ts = (torch.tensor(v, requires_grad=True) for v in (xv, wv, bv, sv))
    ty, tc = _popart_lstm_ref(tx, tw, tb, ts, bool(full))
    ((ty * torch.tensor(r1)).sum() + (tc * torch.tensor(r2)).sum()).backward()
    np.testing.assert_allclose(a[y], ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a[cell], tc.detach().numpy(), rtol=1e-5, atol=1e-6)
    for k, tt in ((x, tx), (w, tw), (bias, tb), (st, ts)):
        np.testing.assert_allclose(a[G + k], tt.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_lstm_matches_torch_nn_lstm_and_defaults():
    # torch's gate order is i, f, g, o; PopART's f, i, g, o with W transposed, biases summed
    torch.manual_seed(0)
    t, n, i, h = 3, 2, 4, 3
    ref = torch.nn.LSTM(i, h)
    xv = torch.randn(t, n, i)
    split = [m.reshape(4, h, -1) for m in (ref.weight_ih_l0.detach(), ref.weight_hh_l0.detach())]
    order = [1, 0, 2, 3]
    wv = torch.cat([split[0][order].transpose(1, 2), split[1][order].transpose(1, 2)], 1).numpy()
    bv = (ref.bias_ih_l0 + ref.bias_hh_l0).detach().reshape(4, h)[order].numpy()
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [t, n, i]), "x")
    y, c = b.aiGraphcore.lstm([x, b.aiOnnx.constant(wv), b.aiOnnx.constant(bv)])     # zero initial state
    y2, c2 = b.aiGraphcore.lstm([x, b.aiOnnx.constant(wv)])                          # no biases either
    _, a = _infer(b, [y, c, y2], {x: xv.numpy()})
    ty, (th, tc) = ref(xv)
    np.testing.assert_allclose(a[y], ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a[c], tc[0].detach().numpy(), rtol=1e-5, atol=1e-6)
    ty2, _ = _popart_lstm_ref(xv, torch.tensor(wv), torch.zeros(4, h), torch.zeros(2, n, h))
    np.testing.assert_allclose(a[y2], ty2.numpy(), rtol=1e-5, atol=1e-6)


def test_lstm_errors():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3, 2, 4]), "x")
    w = b.aiOnnx.constant(np.zeros((4, 5, 3), np.float32))
    with pytest.raises(popart.popart_exception, match=r"Bad weights shape 1, should be \[4 7 3\]"):
        b.aiGraphcore.lstm([x, w])
    w = b.aiOnnx.constant(np.zeros((4, 7, 3), np.float32))
    with pytest.raises(popart.popart_exception, match=r"Bad initialState shape 3, should be \[2 2 3\]"):
        b.aiGraphcore.lstm([x, w, b.aiOnnx.constant(np.zeros((4, 3), np.float32)),
                            b.aiOnnx.constant(np.zeros((2, 3, 3), np.float32))])
    with pytest.raises(popart.popart_exception, match="LSTM has invalid number of inputs 1"):
        b.aiGraphcore.lstm([x])


# --- ctcbeamsearchdecoder ---------------------------------------------------------------------
def _lse(*args):
    if all(v == -math.inf for v in args):
        return -math.inf
    m = max(args)
    return m + math.log(sum(math.exp(v - m) for v in args))


def _prefix_beam_search(lp, width, paths, blank):
    """Textbook CTC prefix beam search (one sequence, ``lp`` [T, C]): prefixes with their
    blank-ending / non-blank-ending log probabilities."""
    beam = [((), (0.0, -math.inf))]
    for row in lp:
        nxt = collections.defaultdict(lambda: (-math.inf, -math.inf))
        for s, p in enumerate(row.tolist()):
            for prefix, (pb, pnb) in beam:
                if s == blank:
                    nb, nnb = nxt[prefix]
                    nxt[prefix] = (_lse(nb, pb + p, pnb + p), nnb)
                    continue
                last = prefix[-1] if prefix else None
                ext = prefix + (s,)
                nb, nnb = nxt[ext]
                nxt[ext] = (nb, _lse(nnb, pb + p) if s == last else _lse(nnb, pb + p, pnb + p))
                if s == last:
                    nb, nnb = nxt[prefix]
                    nxt[prefix] = (nb, _lse(nnb, pnb + p))
        beam = sorted(nxt.items(), key=lambda kv: _lse(*kv[1]), reverse=True)[:width]
    return [(_lse(*beam[k][1]), beam[k][0]) for k in range(paths)]


@pytest.mark.parametrize("blank,width,paths", [(0, 4, 1), (5, 6, 3)])
def test_ctcbeamsearchdecoder_matches_prefix_beam_search(blank, width, paths):
    t, n, c = 7, 3, 6
    torch.manual_seed(4)
    lp = F.log_softmax(torch.rand(t, n, c) * 4, 2).numpy()
    lengths = np.array([7, 5, 6], np.uint32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [t, n, c]), "lp")
    ln = b.addInputTensor(popart.TensorInfo("UINT32", [n]), "len")
    probs, lens, labels = b.aiGraphcore.ctcbeamsearchdecoder([x, ln], blank, width, paths)
    assert [b.getTensorShape(o) for o in (probs, lens, labels)] == [[n, paths], [n, paths], [n, paths, t]]
    assert b.getTensorDtypeString(lens) == "uint32" and b.getTensorDtypeString(labels) == "uint32"
    _, a = _infer(b, [probs, lens, labels], {x: lp, ln: lengths})
    for k in range(n):
        want = _prefix_beam_search(lp[:lengths[k], k], width, paths, blank)
        np.testing.assert_allclose(a[probs][k], [p for p, _ in want], rtol=1e-5, atol=1e-5)
        assert a[lens][k].tolist() == [len(s) for _, s in want]
        for j, (_, seq) in enumerate(want):
            assert tuple(a[labels][k, j, :len(seq)].tolist()) == seq
            assert not a[labels][k, j, len(seq):].any()


def test_ctcbeamsearchdecoder_errors():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 2, 3]), "lp")
    bad_len = b.addInputTensor(popart.TensorInfo("INT32", [2]), "len")
    with pytest.raises(popart.popart_exception, match="Unsupported data type for input 1 of Op .* \\(expected a "
                                                      "'input lengths' tensor of type UINT32, got INT32\\)"):
        b.aiGraphcore.ctcbeamsearchdecoder([x, bad_len])
    ln = b.addInputTensor(popart.TensorInfo("UINT32", [3]), "len3")
    with pytest.raises(popart.popart_exception, match=r"expected a 'data lengths' tensor of shape \[2\], got \[3\]"):
        b.aiGraphcore.ctcbeamsearchdecoder([x, ln])
    with pytest.raises(popart.popart_exception, match="top_paths"):
        b.aiGraphcore.ctcbeamsearchdecoder([x, ln], beam_width=2, top_paths=3)


# --- groupedscatterreduce ---------------------------------------------------------------------
def _grouped_ref(src, index, axis_size, axis, red, initial=None):
    """Each group with torch's scatter_reduce (``axis`` counts the group axis)."""
    outs = []
    for g in range(src.shape[0]):
        shape = list(src[g].shape)
        shape[axis - 1] = axis_size
        base = initial[g].clone() if initial is not None else torch.zeros(shape)
        outs.append(base.scatter_reduce(axis - 1, index[g], src[g], red, include_self=initial is not None))
    return torch.stack(outs)


@pytest.mark.parametrize("red", ["Sum", "Max"])
def test_groupedscatterreduce_forward_and_gradient(red):
    rng = np.random.default_rng(5)
    sv = rng.standard_normal((3, 4, 5)).astype(np.float32)
    iv = rng.integers(0, 4, (3, 4, 5)).astype(np.int32)
    b = popart.Builder()
    s = b.addInitializedInputTensor(sv, "src")
    out = b.aiGraphcore.groupedscatterreduce([s, b.aiOnnx.constant(iv)], 4, axis=1,
                                             reduction=getattr(popart.ScatterReduction, red), group_size=3)
    assert b.getTensorShape(out) == [3, 4, 5]
    r = rng.standard_normal((3, 4, 5)).astype(np.float32)
    _, a = _train(b, _weighted_loss(b, out, r), [out, G + s])
    ts = torch.tensor(sv, requires_grad=True)
    ty = _grouped_ref(ts, torch.tensor(iv).long(), 4, 1, {"Sum": "sum", "Max": "amax"}[red])
    (ty * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(a[out], ty.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(a[G + s], ts.grad.numpy(), rtol=1e-6)


def test_groupedscatterreduce_broadcast_index_and_initial_values():
    rng = np.random.default_rng(6)
    sv = rng.standard_normal((2, 3, 6)).astype(np.float32)
    iv = np.array([[0, 2, 2, 1, 0, 2], [1, 1, 0, 0, 2, 2]], np.uint32)      # [group, n] along axis 2
    init = rng.standard_normal((2, 3, 3)).astype(np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, 6]), "src")
    idx = b.addInputTensor(popart.TensorInfo("UINT32", [2, 6]), "idx")
    y = b.aiGraphcore.groupedscatterreduce([x, idx], 3, axis=2, group_size=2)
    z = b.aiGraphcore.groupedscatterreduce([x, idx, b.aiOnnx.constant(init)], 3, axis=-1,
                                           reduction=popart.ScatterReduction.Min, group_size=2)
    _, a = _infer(b, [y, z], {x: sv, idx: iv})
    full = torch.tensor(iv.astype(np.int64))[:, None, :].expand(2, 3, 6)
    np.testing.assert_allclose(a[y], _grouped_ref(torch.tensor(sv), full, 3, 2, "sum").numpy(), rtol=1e-6)
    np.testing.assert_allclose(a[z], _grouped_ref(torch.tensor(sv), full, 3, 2, "amin", torch.tensor(init)).numpy())


def test_groupedscatterreduce_errors():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    i = b.addInputTensor(popart.TensorInfo("INT32", [2, 3]), "i")
    with pytest.raises(popart.popart_exception, match="ScatterReduceOp group_size = 0 is not valid: must be > 0."):
        b.aiGraphcore.groupedscatterreduce([x, i], 3, group_size=0)
    with pytest.raises(popart.popart_exception, match="ScatterReduceOp axis_size = 0 is not valid"):
        b.aiGraphcore.groupedscatterreduce([x, i], 0, group_size=2)
    with pytest.raises(popart.popart_exception, match=r"ScatterReduceOp::setup axis = 2 is outside the acceptable "
                                                      r"range \[-2, 1\]"):
        b.aiGraphcore.groupedscatterreduce([x, i], 3, axis=2, group_size=2)
    with pytest.raises(popart.popart_exception, match="must be group_size = 3"):
        b.aiGraphcore.groupedscatterreduce([x, i], 3, axis=1, group_size=3)


# --- replicatedreducescatter ------------------------------------------------------------------
def test_replicatedreducescatter_one_replica_is_the_flattened_input():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    y = b.aiGraphcore.replicatedreducescatter([x])
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    s, a = _infer(b, [y], {x: xv})
    np.testing.assert_array_equal(a[y], xv.reshape(-1))
    assert [op.lowering for op in s.ops() if op.op_type == "ReplicatedReduceScatter"] == ["precise"]


@pytest.mark.parametrize("op,fn", [("Add", np.sum), ("Max", np.max)])
def test_replicatedreducescatter_across_replicas(op, fn):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [5]), "x")
    y = b.aiGraphcore.replicatedreducescatter([x], getattr(popart.CollectiveOperator, op))
    assert not b.hasValueInfo(y)        # [ceil(5 / replicas)]: known to the session only
    z = b.aiOnnx.mul([y, y])
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 2
    xv = np.array([[1, 2, 3, 4, 5], [10, 20, -30, 40, 50]], np.float32)
    _, a = _infer(b, [y, z], {x: xv}, opts, ipus=2)
    total = np.concatenate([fn(xv, 0), [0]])              # 5 elements -> 2 pieces of 3, zero-padded
    np.testing.assert_allclose(a[y], total.reshape(2, 3))
    np.testing.assert_allclose(a[z], total.reshape(2, 3) ** 2)


def test_replicatedreducescatter_errors():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4]), "x")
    with pytest.raises(popart.popart_exception, match="Unsupported collective operator 'Median'"):
        b.aiGraphcore.replicatedreducescatter([x], "Median", None, "rs")
    with pytest.raises(popart.popart_exception, match="ReplicatedReduceScatter has invalid number of inputs 2"):
        b.aiGraphcore.replicatedreducescatter([x, x])


# --- splinebasis / splineweighting -----------------------------------------------------------
def _spline_basis_ref(pseudo, ks, is_open, degree):
    """PyTorch Geometric's spline_basis, one edge and one spline at a time."""
    def basis_1d(v, k):
        if degree == 1:
            return 1 - v - k + 2 * v * k
        if degree == 2:
            return [0.5 * v * v - v + 0.5, -v * v + v + 0.5, 0.5 * v * v][k]
        return [(1 - v) ** 3 / 6, (3 * v ** 3 - 6 * v * v + 4) / 6, (-3 * v ** 3 + 3 * v * v + 3 * v + 1) / 6,
                v ** 3 / 6][k]
    e, d = pseudo.shape
    n_s = (degree + 1) ** d
    basis, wi = np.zeros((e, n_s)), np.zeros((e, n_s), np.int64)
    for i in range(e):
        for s in range(n_s):
            k, offset, val = s, 1, 1.0
            for j in range(d):
                k_mod = k % (degree + 1)
                k //= degree + 1
                v = float(pseudo[i, j]) * (int(ks[j]) - degree * int(is_open[j]))
                wi[i, s] += ((int(v) + k_mod) % int(ks[j])) * offset
                offset *= int(ks[j])
                val *= basis_1d(v - math.floor(v), k_mod)
            basis[i, s] = val
    return basis, wi


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_splinebasis_and_splineweighting(degree):
    rng = np.random.default_rng(7)
    e, d, cin, cout = 6, 2, 3, 4
    pv = rng.random((e, d)).astype(np.float32)
    ks, is_open = np.array([3, 5], np.int32), np.array([1, 0], np.uint8)
    xv = rng.standard_normal((e, cin)).astype(np.float32)
    wv = rng.standard_normal((15, cin, cout)).astype(np.float32)
    b = popart.Builder()
    p = b.addInputTensor(popart.TensorInfo("FLOAT", [e, d]), "pseudo")
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [e, cin]), "x")
    basis, wi = b.aiGraphcore.splinebasis([p, b.aiOnnx.constant(ks), b.aiOnnx.constant(is_open)], degree=degree)
    s = (degree + 1) ** d
    assert b.getTensorShape(basis) == [e, s] and b.getTensorDtypeString(wi) == "int32"
    out = b.aiGraphcore.splineweighting([x, b.aiOnnx.constant(wv), basis, wi])
    assert b.getTensorShape(out) == [e, cout]
    _, a = _infer(b, [basis, wi, out], {p: pv, x: xv})
    rb, rw = _spline_basis_ref(pv, ks, is_open, degree)
    np.testing.assert_allclose(a[basis], rb, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a[wi], rw)
    want = np.einsum("es,ei,esio->eo", rb, xv, wv[rw])
    np.testing.assert_allclose(a[out], want, rtol=1e-4, atol=1e-5)


def test_spline_errors():
    b = popart.Builder()
    p = b.addInputTensor(popart.TensorInfo("FLOAT", [6]), "pseudo")
    ks = b.addInputTensor(popart.TensorInfo("INT32", [1]), "ks")
    op = b.addInputTensor(popart.TensorInfo("UINT8", [1]), "open")
    with pytest.raises(popart.popart_exception, match="SplineBasisOp degree = 4 is not valid: must be between 0 and 3."):
        b.aiGraphcore.splinebasis([p, ks, op], 4)
    with pytest.raises(popart.popart_exception, match="SplineBasisOp::setup: pseudo tensor is not a 2-D tensor. "
                                                      "Pseudo tensor rank = 1."):
        b.aiGraphcore.splinebasis([p, ks, op])
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [6, 2]), "x")
    w16 = b.addInputTensor(popart.TensorInfo("FLOAT16", [4, 2, 3]), "w")
    bs = b.addInputTensor(popart.TensorInfo("FLOAT", [6, 4]), "basis")
    wi = b.addInputTensor(popart.TensorInfo("INT32", [6, 4]), "wi")
    with pytest.raises(popart.popart_exception, match="SplineWeightingOp::setup: The input and weight tensors have "
                                                      "different data types. The input tensor data type = float. "
                                                      "The weight tensor data type = float16."):
        b.aiGraphcore.splineweighting([x, w16, bs, wi])
    with pytest.raises(popart.popart_exception, match="SplineWeightingOp::setup: weight tensor is not a 3-D tensor. "
                                                      "Weight tensor rank = 2."):
        b.aiGraphcore.splineweighting([x, bs, bs, wi])


# --- packedDataBlock --------------------------------------------------------------------------
def _unpack(data, offsets, lengths, max_len):
    out = np.zeros((len(offsets), max_len) + data.shape[1:], data.dtype)
    for j, (o, n) in enumerate(zip(offsets, lengths)):
        out[j, :n] = data[o:o + n]
    return out


@pytest.mark.parametrize("callback_batch", [1, 2, 3])
def test_packeddatablock_runs_the_callback_on_unpacked_sequences(callback_batch):
    rng = np.random.default_rng(8)
    lengths = np.array([3, 5, 7, 4, 6, 2], np.uint32)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint32)
    data = rng.integers(1, 10, (int(lengths.sum()), 5)).astype(np.float32)
    b = popart.Builder()
    d = b.addInputTensor(popart.TensorInfo("FLOAT", list(data.shape)), "data")
    off = b.addInputTensor(popart.TensorInfo("UINT32", [6]), "offsets")
    ln = b.addInputTensor(popart.TensorInfo("UINT32", [6]), "lengths")
    sg = b.createSubgraphBuilder()
    seq = sg.addUntypedInputTensor()
    sg.addOutputTensor(sg.aiOnnx.matmul([seq, sg.aiOnnx.transpose([seq], [0, 2, 1])]))
    out = b.aiGraphcore.packedDataBlock([d, off, ln, off, ln], [10], data.shape[0], callback_batch, sg)
    assert b.getTensorShape(out) == [27, 10]
    _, a = _infer(b, [out], {d: data, off: offsets, ln: lengths})
    u = _unpack(data, offsets, lengths, 10)
    mm = u @ u.transpose(0, 2, 1)
    want = np.zeros((27, 10), np.float32)
    for j, (o, n) in enumerate(zip(offsets, lengths)):
        want[o:o + n] = mm[j, :n]
    np.testing.assert_allclose(a[out], want)


def test_packeddatablock_errors():
    b = popart.Builder()
    d = b.addInputTensor(popart.TensorInfo("FLOAT", [6, 2]), "data")
    i = b.addInputTensor(popart.TensorInfo("UINT32", [2]), "i")
    sg = b.createSubgraphBuilder()
    sg.addOutputTensor(sg.aiOnnx.relu([sg.addUntypedInputTensor()]))
    with pytest.raises(popart.popart_exception, match="callback must be a subgraph builder"):
        b.aiGraphcore.packedDataBlock([d, i, i, i, i], [3], 6, 1, popart.Builder())
    with pytest.raises(popart.popart_exception, match="one maxSequenceLength per data input"):
        b.aiGraphcore.packedDataBlock([d, i, i, i, i], [3, 3], 6, 1, sg)
    with pytest.raises(popart.popart_exception, match="one maxSequenceLength per data input"):
        b.aiGraphcore.packedDataBlock([d, i, i, i], [3], 6, 1, sg)
