"""PopART's ai.graphcore builder ops in training and inference: forward values and gradients
against torch (autograd), random ops and the session seed, subgraph calls, and PopART's errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart

G = popart.reservedGradientPrefix()
ALL = popart.AnchorReturnType("All")
F = torch.nn.functional


def _device():
    return popart.DeviceManager().createIpuModelDevice({})


def _train(b, loss, anchors, feeds=None, bps=1, opts=None, seed=None):
    df = popart.DataFlow(bps, {a: ALL for a in anchors})
    s = popart.TrainingSession(b.getModelProto(), df, loss, popart.ConstSGD(0.1), _device(), userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    if seed is not None:
        s.setRandomSeed(seed)
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds or {}, a))
    return s, a


def _infer(b, outs, feeds=None, opts=None):
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {o: ALL for o in outs}), _device(),
                                userOptions=opts)
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds or {}, a))
    return s, a


def _const(b, v):
    return b.aiOnnx.constant(np.asarray(v))


# --- gradients against torch.autograd ------------------------------------------------------
# name: (x shape, w shape, popart fn(b, x, w) -> y, torch fn(x, w) -> y)
def _gn(b, x, w):
    bias = b.aiOnnx.constant(np.linspace(-1, 1, 6).astype(np.float32))
    return b.aiGraphcore.groupnormalization([x, w, bias], 3, 1e-5)[0]


def _tgn(x, w):
    return F.group_norm(x, 3, w, torch.linspace(-1, 1, 6), 1e-5)


def _dyn_update(b, x, w):
    off = _const(b, np.array([1, 2], np.uint32))
    return b.aiGraphcore.dynamicupdate([x, off, w], axes=[0, 2], sizes=[2, 3])


def _t_dyn_update(x, w):
    y = x.clone()
    y[1:3, :, 2:5] = w
    return y


def _dyn_add(b, x, w):
    off = _const(b, np.array([3], np.int32))
    return b.aiGraphcore.dynamicadd([x, off, w], axes=[1], sizes=[2])


def _t_dyn_add(x, w):          # offset 3 of a size-2 slice in a dimension of 4 wraps to row 0
    y = x.clone()
    y[:, [3, 0]] = y[:, [3, 0]] + w
    return y


def _dyn_slice(b, x, w):
    off = _const(b, np.array([1], np.uint32))
    return b.aiOnnx.mul([b.aiGraphcore.dynamicslice([x, off], axes=[1], sizes=[2]), w])


def _dyn_zero(b, x, w):
    off = _const(b, np.array([2], np.uint32))
    return b.aiOnnx.mul([b.aiGraphcore.dynamiczero([x, off], axes=[0], sizes=[1]), w])


def _t_dyn_zero(x, w):
    y = x.clone()
    y[2] = 0
    return y * w


def _seq_slice(b, x, w):
    n = _const(b, np.array([2, 1], np.uint32))
    so = _const(b, np.array([0, 3], np.uint32))
    do = _const(b, np.array([1, 4], np.uint32))
    return b.aiGraphcore.sequenceslice([x, w, n, so, do], 0)


def _t_seq_slice(x, w):
    y = w.clone()
    y[1:3] = x[0:2]
    y[4] = x[3]
    return y


def _scatter(red):
    def fn(b, x, w):
        idx = _const(b, np.array([[0, 2, 0], [1, 1, 2]], np.int32))
        return b.aiOnnx.mul([b.aiGraphcore.scatterreduce([x, idx], 3, axis=1, reduction=red), w])

    def tfn(x, w):
        idx = torch.tensor([[0, 2, 0], [1, 1, 2]])
        r = {"Sum": "sum", "Max": "amax", "Min": "amin", "Mul": "prod"}[red]
        return torch.zeros(2, 3).scatter_reduce(1, idx, x, r, include_self=False) * w
    return fn, tfn


def _grouped_gather(b, x, w):
    idx = _const(b, np.array([[2, 0], [1, 1]], np.int32))
    return b.aiOnnx.mul([b.aiGraphcore.groupedgather([x, idx], axis=1), w])


def _t_grouped_gather(x, w):
    return torch.stack([x[0][[2, 0]], x[1][[1, 1]]]) * w


def _call(b, x, w):
    sg = b.createSubgraphBuilder()
    i0 = sg.addInputTensor(popart.TensorInfo("FLOAT", [3, 4]))
    i1 = sg.addInputTensor(popart.TensorInfo("FLOAT", [4, 2]))
    h = sg.aiOnnx.tanh([sg.aiOnnx.matmul([i0, i1])])
    sg.addOutputTensor(h)
    sg.addOutputTensor(sg.aiOnnx.sigmoid([h]))
    y0, y1 = b.aiGraphcore.call([x, w], 2, sg)
    y2 = b.aiGraphcore.call([b.aiOnnx.mul([x, x]), w], 2, sg)[0]       # called twice
    return b.aiOnnx.add([b.aiOnnx.mul([y0, y1]), y2])


def _t_call(x, w):
    h = torch.tanh(x @ w)
    return h * torch.sigmoid(h) + torch.tanh((x * x) @ w)


def _multiconv(b, x, w):
    w2 = b.aiOnnx.constant(np.linspace(-1, 1, 2 * 4 * 1 * 1).reshape(2, 4, 1, 1).astype(np.float32))
    y0, y1 = b.aiGraphcore.multiconv([[x, w], [x, w2]], pads=[[1, 1, 1, 1], [0, 0, 0, 0]],
                                     strides=[[1, 1], [2, 2]])
    return b.aiOnnx.add([b.aiOnnx.reducesum([y0], keepdims=0), b.aiOnnx.reducesum([y1], keepdims=0)])


def _t_multiconv(x, w):
    w2 = torch.linspace(-1, 1, 8).reshape(2, 4, 1, 1)
    return F.conv2d(x, w, padding=1).sum() + F.conv2d(x, w2, stride=2).sum()


def _ctc(reduction, zero_inf=False):
    tgt_np = np.array([[1, 2, 2], [3, 1, 0]], np.int32)
    il_np, tl_np = np.array([6, 5], np.int32), np.array([3, 2], np.int32)

    def fn(b, x, w):
        lp = b.aiOnnx.logsoftmax([b.aiOnnx.mul([x, w])], axis=2)
        loss = b.aiGraphcore.ctcloss([lp, _const(b, tgt_np), _const(b, il_np), _const(b, tl_np)],
                                     getattr(popart.ReductionType, reduction), 0, zeroInfinity=zero_inf)
        return loss

    def tfn(x, w):
        lp = torch.log_softmax(x * w, 2)
        return F.ctc_loss(lp, torch.tensor(tgt_np).long(), torch.tensor(il_np).long(), torch.tensor(tl_np).long(),
                          reduction={"Sum": "sum", "Mean": "mean", "NoReduction": "none"}[reduction],
                          zero_infinity=zero_inf)
    return fn, tfn


CASES = {
    "scaledadd": ((3, 4), (3, 4), lambda b, x, w: b.aiGraphcore.scaledadd([x, w], 0.5, -2.0),
                  lambda x, w: 0.5 * x - 2.0 * w),
    "scaledadd_tensor_scales": ((3, 4), (4,), lambda b, x, w: b.aiGraphcore.scaledadd(
        [x, w, _const(b, np.float32(0.3)), _const(b, np.float32(0.7))]), lambda x, w: 0.3 * x + 0.7 * w),
    "scale_nop_remap_allreduce": ((3, 4), (4,), lambda b, x, w: b.aiGraphcore.replicatedallreduce(
        [b.aiGraphcore.tensorremap([b.aiGraphcore.nop([b.aiGraphcore.scale([b.aiOnnx.mul([x, w])], -1.5)])])]),
        lambda x, w: -1.5 * x * w),
    "subsample": ((4, 6), (2, 3), lambda b, x, w: b.aiOnnx.mul([b.aiGraphcore.subsample([x], [2, 2]), w]),
                  lambda x, w: x[::2, ::2] * w),
    "reverse_reshape_slice": ((4, 6), (2, 3), lambda b, x, w: b.aiOnnx.mul(
        [b.aiGraphcore.reshape(b.aiGraphcore.slice([b.aiGraphcore.reverse([x], [0, 1])], [4, 4], [1, 2], [0, 1]),
                               [2, 3]), w]),
        lambda x, w: x.flip(0, 1)[1:4, 2:4].reshape(2, 3) * w),
    "swish_gelu_geluerf": ((3, 5), (5,), lambda b, x, w: b.aiGraphcore.swish(
        [b.aiGraphcore.gelu([b.aiGraphcore.geluerf([b.aiOnnx.add([x, w])])])]),
        lambda x, w: F.silu(F.gelu(F.gelu(x + w), approximate="tanh"))),
    "expm1_log1p": ((3, 4), (4,), lambda b, x, w: b.aiGraphcore.log1p(
        [b.aiOnnx.mul([b.aiGraphcore.expm1([b.aiOnnx.mul([x, w])]), b.aiGraphcore.expm1([x])])]),
        lambda x, w: torch.log1p(torch.expm1(x * w) * torch.expm1(x))),
    "atan2": ((3, 4), (4,), lambda b, x, w: b.aiGraphcore.atan2([x, w]), torch.atan2),
    "reducemedian": ((4, 5, 3), (4, 3), lambda b, x, w: b.aiOnnx.mul(
        [b.aiGraphcore.reducemedian([x], axes=[1], keepdims=0)[0], w]),
        lambda x, w: x.median(1).values * w),
    "reducemedian_axes02_keepdims": ((4, 5, 3), (1, 5, 1), lambda b, x, w: b.aiOnnx.mul(
        [b.aiGraphcore.reducemedian([x], axes=[0, 2])[0], w]),
        lambda x, w: x.permute(1, 0, 2).reshape(5, -1).median(1).values.reshape(1, 5, 1) * w),
    "groupnormalization": ((2, 6, 3, 3), (6,), _gn, _tgn),
    "sort": ((3, 6), (3, 6), lambda b, x, w: b.aiOnnx.mul([b.aiGraphcore.sort([x], axis=1, descending=True)[0], w]),
             lambda x, w: torch.sort(x, 1, descending=True).values * w),
    "dynamicslice": ((3, 4, 5), (3, 2, 5), _dyn_slice, lambda x, w: x[:, 1:3] * w),
    "dynamicupdate": ((4, 3, 6), (2, 3, 3), _dyn_update, _t_dyn_update),
    "dynamiczero": ((4, 3), (4, 3), _dyn_zero, _t_dyn_zero),
    "dynamicadd_wraps": ((3, 4, 2), (3, 2, 2), _dyn_add, _t_dyn_add),
    "sequenceslice": ((5, 3), (6, 3), _seq_slice, _t_seq_slice),
    "scatterreduce_sum": ((2, 3), (2, 3)) + _scatter("Sum"),
    "scatterreduce_max": ((2, 3), (2, 3)) + _scatter("Max"),
    "scatterreduce_mul": ((2, 3), (2, 3)) + _scatter("Mul"),
    "groupedgather": ((2, 3, 4), (2, 2, 4), _grouped_gather, _t_grouped_gather),
    "depthtospace_dcr": ((1, 8, 2, 3), (1, 2, 4, 6), lambda b, x, w: b.aiOnnx.mul(
        [b.aiGraphcore.depthtospace([x], 2, "DCR"), w]),
        lambda x, w: x.reshape(1, 2, 2, 2, 2, 3).permute(0, 3, 4, 1, 5, 2).reshape(1, 2, 4, 6) * w),
    "depthtospace_crd": ((1, 8, 2, 3), (1, 2, 4, 6), lambda b, x, w: b.aiOnnx.mul(
        [b.aiGraphcore.depthtospace([x], 2, "CRD"), w]), lambda x, w: F.pixel_shuffle(x, 2) * w),
    "call": ((3, 4), (4, 2), _call, _t_call),
    "multiconv": ((2, 4, 5, 5), (3, 4, 3, 3), _multiconv, _t_multiconv),
    "ctc_mean": ((6, 2, 5), (5,)) + _ctc("Mean"),
    "ctc_sum": ((6, 2, 5), (5,)) + _ctc("Sum"),
    "ctc_noreduction": ((6, 2, 5), (5,)) + _ctc("NoReduction"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_match_torch_autograd(case):
    xs, wsh, fn, tfn = CASES[case]
    rng = np.random.default_rng(3)
    xv, wv = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(wsh).astype(np.float32)
    if case == "scatterreduce_mul":
        wv = np.abs(wv) + 0.5
    b = popart.Builder()
    x, w = b.addInitializedInputTensor(xv, "x"), b.addInitializedInputTensor(wv, "w")
    y = fn(b, x, w)
    tx, tw = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
    ty = tfn(tx, tw)
    r = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([y, _const(b, r)])], popart.ReductionType.Sum)
    _, a = _train(b, loss, [y, loss, G + x, G + w])
    (ty * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(a[y], ty.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a[G + x], tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a[G + w], tw.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("reduction", ["Sum", "Mean", "NoReduction"])
def test_identityloss_reductions(reduction):
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) / 3
    b = popart.Builder()
    x = b.addInitializedInputTensor(xv, "x")
    sq = b.aiOnnx.mul([x, x])
    red = getattr(popart.ReductionType, reduction)
    inner = b.aiGraphcore.identityloss([sq], red)
    loss = inner if reduction != "NoReduction" else b.aiGraphcore.identityloss([inner], popart.ReductionType.Sum)
    _, a = _train(b, loss, [loss, inner, G + x])
    want = {"Sum": (xv ** 2).sum(), "Mean": (xv ** 2).mean(), "NoReduction": (xv ** 2).sum()}[reduction]
    assert float(a[loss]) == pytest.approx(want, rel=1e-6)
    if reduction == "NoReduction":
        np.testing.assert_allclose(a[inner], xv ** 2, rtol=1e-6)
    np.testing.assert_allclose(a[G + x], 2 * xv / (xv.size if reduction == "Mean" else 1), rtol=1e-6)


def test_detach_stops_the_gradient():
    b = popart.Builder()
    x = b.addInitializedInputTensor(np.full((2, 2), 3.0, np.float32), "x")
    w = b.addInitializedInputTensor(np.full((2, 2), 2.0, np.float32), "w")
    y = b.aiOnnx.add([b.aiOnnx.mul([x, w]), b.aiOnnx.mul([b.aiGraphcore.detach([x]), x])])
    loss = b.aiGraphcore.identityloss([y], popart.ReductionType.Sum)
    _, a = _train(b, loss, [G + x, G + w])
    np.testing.assert_allclose(a[G + x], np.full((2, 2), 2.0 + 3.0))     # w + detach(x), not w + 2x
    np.testing.assert_allclose(a[G + w], np.full((2, 2), 3.0))


def test_ctc_zero_infinity_and_out_type():
    # target longer than the input allows: an infinite loss, zeroed with its gradient
    b = popart.Builder()
    x = b.addInitializedInputTensor(np.zeros((3, 1, 4), np.float32), "x")
    lp = b.aiOnnx.logsoftmax([x], axis=2)
    args = [lp, _const(b, np.array([[1, 2, 3, 1]], np.int32)), _const(b, np.array([3], np.int32)),
            _const(b, np.array([4], np.int32))]
    loss = b.aiGraphcore.ctcloss(args, popart.ReductionType.Sum, zeroInfinity=True)
    _, a = _train(b, loss, [loss, G + x])
    assert float(a[loss]) == 0.0
    np.testing.assert_array_equal(a[G + x], 0.0)
    b2 = popart.Builder()
    x2 = b2.addInputTensor(popart.TensorInfo("FLOAT16", [3, 1, 4]), "x")
    out = b2.aiGraphcore.ctcloss([x2] + [b2.aiOnnx.constant(np.array(v, np.int32)) for v in ([[1]], [3], [1])],
                                 outDataType="FLOAT")
    assert b2.getTensorDtypeString(out) == "float32"
    assert len(b2._model.graph.node[-1].output) == 2           # PopART's Ctc: loss and gradient


# --- dropout and the random seed -----------------------------------------------------------
def _dropout_model(kind="dropout", ratio=0.25, shape=(4, 6, 5)):
    rng = np.random.default_rng(0)
    wv = rng.standard_normal(shape).astype(np.float32)
    b = popart.Builder()
    w = b.addInitializedInputTensor(wv, "w")
    if kind == "dropout":
        d = b.aiOnnx.dropout([w], 1, ratio)[0]
    else:
        d = b.aiGraphcore.shapeddropout([w], [shape[0], 1, shape[2]], ratio)
    y = b.aiOnnx.mul([d, d])
    loss = b.aiGraphcore.identityloss([y], popart.ReductionType.Sum)
    return b, w, wv, d, loss


@pytest.mark.parametrize("kind", ["dropout", "shapeddropout"])
def test_dropout_training_masks_scales_and_gradient(kind):
    ratio = 0.25
    b, w, wv, d, loss = _dropout_model(kind, ratio)
    s, a = _train(b, loss, [d, G + w], bps=2, seed=11)
    keep = a[d] != 0
    np.testing.assert_allclose(a[d][0][keep[0]], (wv / (1 - ratio))[keep[0]], rtol=1e-6)   # (batch 1: updated w)
    # the backward pass regenerates the same mask: d(sum(d^2))/dw = 2 d mask / (1 - ratio)
    np.testing.assert_allclose(a[G + w], 2 * a[d] * keep / (1 - ratio), rtol=1e-5, atol=1e-6)
    assert 0.55 < keep[0].mean() < 0.95
    assert not np.array_equal(keep[0], keep[1])          # a new mask each batch
    if kind == "shapeddropout":                            # the mask is [4, 1, 5], broadcast over dim 1
        assert (keep[0] == keep[0][:, :1, :]).all()
    assert {op.lowering for op in s.ops() if "ropout" in op.op_type} == {"precise"}


def test_random_seed_gives_reproducible_masks():
    b, w, wv, d, loss = _dropout_model()
    proto = b.getModelProto()
    df = popart.DataFlow(1, {d: ALL})
    masks = []
    for seed in (5, 5, 6):
        s = popart.TrainingSession(proto, df, loss, popart.ConstSGD(0.0), _device())
        with pytest.raises(popart.popart_exception, match="prepareDevice"):
            s.setRandomSeed(seed)
        s.prepareDevice()
        s.weightsFromHost()
        s.setRandomSeed(seed)
        assert s.getRandomSeed() == seed
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({}, a))
        masks.append(a[d] != 0)
        s.setRandomSeed(seed)                 # the same seed again: the same first mask
        a2 = s.initAnchorArrays()
        s.run(popart.PyStepIO({}, a2))
        np.testing.assert_array_equal(a2[d] != 0, masks[-1])
    np.testing.assert_array_equal(masks[0], masks[1])
    assert not np.array_equal(masks[0], masks[2])


def test_dropout_mask_output_and_inference_identity():
    b, w, wv, d, loss = _dropout_model()
    b2 = popart.Builder()
    x = b2.addInputTensor(popart.TensorInfo("FLOAT", [3, 4]), "x")
    y, mask = b2.aiOnnx.dropout([x], 2, 0.5)
    sd = b2.aiGraphcore.shapeddropout([x], [3, 1], 0.5)
    xv = np.arange(12, dtype=np.float32).reshape(3, 4)
    s, a = _infer(b2, [y, mask, sd], {x: xv})
    np.testing.assert_array_equal(a[y], xv)
    np.testing.assert_array_equal(a[sd], xv)
    assert a[mask].all()
    # training: the mask output agrees with the dropped elements
    wv = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    b3 = popart.Builder()
    w3 = b3.addInitializedInputTensor(wv, "w")
    y3, m3 = b3.aiOnnx.dropout([w3], 2, 0.5)
    loss = b3.aiGraphcore.identityloss([y3])
    s3, a3 = _train(b3, loss, [y3, m3, G + w3], seed=3)
    np.testing.assert_array_equal(a3[m3], a3[y3] != 0)
    np.testing.assert_allclose(a3[y3], np.where(a3[m3], 2 * wv, 0))
    # the forward op (host kernel, for the mask) and its gradient (poprand) draw the same mask
    assert [op.lowering for op in s3.ops() if "Dropout" in op.op_type] == ["generic", "precise"]
    np.testing.assert_allclose(a3[G + w3], np.where(a3[m3], 2 / 12, 0), rtol=1e-6)


def test_set_random_seed_without_random_ops_warns(monkeypatch, capfd):
    monkeypatch.setenv("POPART_LOG_LEVEL", "WARN")
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    y = b.aiOnnx.relu([x])
    s, _ = _infer(b, [y], {x: np.ones(2, np.float32)})
    s.setRandomSeed(1)
    assert "this session has no random behaviour. Doing nothing." in capfd.readouterr().err


# --- forward-only ops ---------------------------------------------------------------------
def test_forward_only_ops():
    rng = np.random.default_rng(1)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 5]), "x")
    bounds = _const(b, np.array([-1.0, 0.0, 0.5], np.float32))
    bk = b.aiGraphcore.bucketize([x, bounds])
    bkr = b.aiGraphcore.bucketize([x, bounds], right=True)
    im = b.aiGraphcore.incrementmod([x], 1.5, 2.0)
    init = b.aiGraphcore.init([2, 3], popart.DataType.FLOAT, popart.InitType.Zero)
    init2 = b.aiGraphcore.init([4], "INT32", popart.InitType.NoInit, 0)
    img = b.addInputTensor(popart.TensorInfo("UINT8", [2, 2, 3]), "img")
    ni = b.aiGraphcore.normalize_image([img, _const(b, np.array([1, 2, 3], np.float16)),
                                        _const(b, np.array([0.5, 1, 2], np.float16))], 1 / 255)
    xv = np.array([[-2, -1, 0, 0.2, 0.5], [0.7, -0.5, 1, 3, -1]], np.float32)
    imgv = rng.integers(0, 255, (2, 2, 3)).astype(np.uint8)
    _, a = _infer(b, [bk, bkr, im, init, init2, ni], {x: xv, img: imgv})
    np.testing.assert_array_equal(a[bk], torch.bucketize(torch.tensor(xv), torch.tensor([-1.0, 0.0, 0.5])).numpy())
    np.testing.assert_array_equal(a[bkr], torch.bucketize(torch.tensor(xv), torch.tensor([-1.0, 0.0, 0.5]),
                                                          right=True).numpy())
    np.testing.assert_allclose(a[im], np.fmod(xv + 1.5, 2.0), rtol=1e-6)
    assert a[init].shape == (2, 3) and not a[init].any() and a[init2].dtype == np.int32
    want = (imgv.astype(np.float32) / 255 - np.array([1, 2, 3])) * np.array([0.5, 1, 2])
    assert a[ni].dtype == np.float16 and a[ni].shape == (2, 2, 4)
    np.testing.assert_allclose(a[ni][..., :3], want, rtol=2e-3, atol=2e-3)
    assert not a[ni][..., 3].any()


def test_groupnormalization_outputs_and_strided_grouping():
    rng = np.random.default_rng(2)
    xv = rng.standard_normal((2, 6, 4)).astype(np.float32)
    sc, bi = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    for strided in (False, True):
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 6, 4]), "x")
        y, mean, inv = b.aiGraphcore.groupnormalization([x, _const(b, sc), _const(b, bi)], 2, 1e-3)
        assert b.getTensorShape(mean) == [4]
        opts = popart.SessionOptions()
        opts.groupNormStridedChannelGrouping = strided
        s, a = _infer(b, [y, mean, inv], {x: xv}, opts)
        perm = [0, 2, 4, 1, 3, 5] if strided else list(range(6))       # channel c in group c % 2
        xp = torch.tensor(xv)[:, perm]
        ty = F.group_norm(xp, 2, torch.tensor(sc)[perm], torch.tensor(bi)[perm], 1e-3)
        inv_perm = np.argsort(perm)
        np.testing.assert_allclose(a[y], ty.numpy()[:, inv_perm], rtol=1e-4, atol=1e-5)
        xg = xp.reshape(2, 2, -1)
        np.testing.assert_allclose(a[mean], xg.mean(-1).reshape(-1).numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(a[inv], (1 / torch.sqrt(xg.var(-1, unbiased=False) + 1e-3)).reshape(-1).numpy(),
                                   rtol=1e-4)
        assert [op.lowering for op in s.ops() if op.op_type == "GroupNormalization"] == ["precise"]


def test_reducemedian_indices_and_sort_indices():
    xv = np.array([[[3, 1], [2, 5], [4, 0]]], np.float32)       # [1, 3, 2]
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [1, 3, 2]), "x")
    v, i = b.aiGraphcore.reducemedian([x], axes=[1, 2], keepdims=0)
    sv, si = b.aiGraphcore.sort([x], axis=1)
    _, a = _infer(b, [v, i, sv, si], {x: xv})
    assert a[v].tolist() == [2.0] and a[i].tolist() == [2]          # flat index over the reduced axes
    np.testing.assert_array_equal(a[sv], np.sort(xv, 1))
    np.testing.assert_array_equal(a[si], np.argsort(xv, 1, kind="stable"))


def test_printtensor_prints_value_and_gradient(capfd):
    b = popart.Builder()
    x = b.addInitializedInputTensor(np.array([1.0, 2.0], np.float32), "x")
    p = b.aiGraphcore.printtensor([x], title="xs")
    q = b.aiGraphcore.printtensor([b.aiOnnx.mul([p, p])], print_gradient=0)
    loss = b.aiGraphcore.identityloss([q], popart.ReductionType.Sum)
    _train(b, loss, [loss])
    out = capfd.readouterr().out
    assert "xs: [1 2]" in out or "xs: [1.0000000 2.0000000]" in out
    assert "xs_gradient: [" in out
    assert out.count("_gradient") == 1 and "Mul:0: [" in out


def test_abort_stops_run():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    flag = b.aiOnnx.reducesum([x], keepdims=0)
    assert b.aiGraphcore.abort([flag]) is None
    y = b.aiOnnx.relu([x])
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _device())
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.zeros(2, np.float32)}, a))         # zero: no abort
    with pytest.raises(popart.poplar_application_runtime_error):
        s.run(popart.PyStepIO({x: np.ones(2, np.float32)}, a))


def test_call_subgraph_inference_and_parent_tensors():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    c = _const(b, np.float32(2.0))
    sg = b.createSubgraphBuilder()
    i = sg.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    pc = sg.addInputTensorFromParentGraph(c)
    sg.addOutputTensor(sg.aiOnnx.mul([i, pc]))
    sg.addOutputTensor(i)                                          # an input passed through
    y, z = b.aiGraphcore.call([x, ], 2, sg)
    assert b.getTensorShape(y) == [2, 3]
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    _, a = _infer(b, [y, z], {x: xv})
    np.testing.assert_allclose(a[y], 2 * xv)
    np.testing.assert_allclose(a[z], xv)


@pytest.mark.parametrize("dtype", ["INT32", "UINT32"])
def test_dynamic_ops_with_runtime_offsets(dtype):
    rng = np.random.default_rng(4)
    tv, sv = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32)
    b = popart.Builder()
    t = b.addInitializedInputTensor(tv, "t")
    s_ = b.addInitializedInputTensor(sv, "s")
    off = b.addInputTensor(popart.TensorInfo(dtype, [1]), "off")
    sl = b.aiGraphcore.dynamicslice([t, off], [0], [2])
    up = b.aiGraphcore.dynamicupdate([t, off, s_], [0], [2])
    loss = b.aiGraphcore.identityloss([b.aiOnnx.add([b.aiOnnx.reducesum([b.aiOnnx.mul([sl, sl])], keepdims=0),
                                                     b.aiOnnx.reducesum([up], keepdims=0)])], popart.ReductionType.Sum)
    npdt = np.int32 if dtype == "INT32" else np.uint32
    df = popart.DataFlow(2, {sl: ALL, G + t: ALL, G + s_: ALL})
    sess = popart.TrainingSession(b.getModelProto(), df, loss, popart.ConstSGD(0.0), _device())
    sess.prepareDevice()
    sess.weightsFromHost()
    a = sess.initAnchorArrays()
    sess.run(popart.PyStepIO({off: np.array([[1], [4]], npdt)}, a))
    np.testing.assert_allclose(a[sl][0], tv[1:3])
    np.testing.assert_allclose(a[sl][1], tv[[4, 0]])               # wraps round
    gt = np.ones_like(tv)
    gt[1:3] = 2 * tv[1:3]                      # rows the update overwrote get only the slice's gradient
    np.testing.assert_allclose(a[G + t][0], gt, rtol=1e-6)
    gt = np.ones_like(tv)
    gt[[4, 0]] = 2 * tv[[4, 0]]
    np.testing.assert_allclose(a[G + t][1], gt, rtol=1e-6)
    np.testing.assert_allclose(a[G + s_], 1.0)
    kinds = {op.op_type: op.lowering for op in sess.ops() if op.op_type.startswith("Dynamic")}
    assert kinds["DynamicSlice"] == kinds["DynamicUpdate"] == "precise"          # popops


def test_call_uses_parent_weights_and_nests():
    rng = np.random.default_rng(5)
    wv, xv = rng.standard_normal((3, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    b = popart.Builder()
    w = b.addInitializedInputTensor(wv, "w")
    x = b.addInitializedInputTensor(xv, "x")
    inner = b.createSubgraphBuilder()
    i = inner.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    inner.addOutputTensor(inner.aiOnnx.relu([inner.aiOnnx.matmul([i, inner.addInputTensorFromParentGraph(w)])]))
    outer = b.createSubgraphBuilder()
    j = outer.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    h = outer.aiGraphcore.call([j], 1, inner)[0]
    outer.addOutputTensor(outer.aiGraphcore.call([h], 1, inner)[0])
    y = b.aiGraphcore.call([x], 1, outer)[0]
    loss = b.aiGraphcore.identityloss([y], popart.ReductionType.Sum)
    _, a = _train(b, loss, [y, G + w, G + x])
    tw, tx = torch.tensor(wv, requires_grad=True), torch.tensor(xv, requires_grad=True)
    ty = torch.relu(torch.relu(tx @ tw) @ tw)
    ty.sum().backward()
    np.testing.assert_allclose(a[y], ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a[G + w], tw.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(a[G + x], tx.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_subgraph_builders_for_onnx_if_and_loop():
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    c = b.addInputTensor(popart.TensorInfo("BOOL", []), "c")
    then_b, else_b = b.createSubgraphBuilder(), b.createSubgraphBuilder()
    then_b.addOutputTensor(then_b.aiOnnx.add([x, x]))
    else_b.addOutputTensor(else_b.aiOnnx.mul([x, x]))
    y = b.aiOnnx.logical_if([c], 1, else_b, then_b)[0]
    body = b.createSubgraphBuilder()
    body.addUntypedInputTensor()
    cond = body.addInputTensor(popart.TensorInfo("BOOL", []))
    v = body.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    body.addOutputTensor(body.aiOnnx.identity([cond]))
    body.addOutputTensor(body.aiOnnx.add([v, x]))
    z = b.aiOnnx.loop([_const(b, np.array(3, np.int64)), _const(b, np.array(True)), x], 1, body)[0]
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL, z: ALL}), _device())
    s.prepareDevice()
    a = s.initAnchorArrays()
    xv = np.array([3.0, 4.0], np.float32)
    s.run(popart.PyStepIO({x: xv, c: np.array(False)}, a))
    np.testing.assert_allclose(a[y], xv * xv)
    np.testing.assert_allclose(a[z], 4 * xv)


def test_gradient_host_kernels_match_torch():
    """The host kernels the generic lowering runs when the PopLibs forms decline (mixed types ...)."""
    from openipu.popart.graphcore_ops import find_kernel
    rng = np.random.default_rng(6)
    x = torch.tensor(rng.standard_normal((2, 6, 5)).astype(np.float32), requires_grad=True)
    sc = torch.tensor(rng.standard_normal(6).astype(np.float32), requires_grad=True)
    bi = torch.zeros(6, requires_grad=True)
    gy = torch.tensor(rng.standard_normal((2, 6, 5)).astype(np.float32))
    F.group_norm(x, 3, sc, bi, 1e-5).backward(gy)
    dx, ds, db = find_kernel("ai.graphcore", "GroupNormalizationGrad").fn(
        [gy, x.detach(), sc.detach(), None, None], {"num_groups": 3, "epsilon": 1e-5}, 1)
    for got, want in ((dx, x.grad), (ds, sc.grad), (db, bi.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
    xs = torch.tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    g = torch.ones(3, 4)
    F.silu(xs).backward(g)
    (got,) = find_kernel("ai.graphcore", "SwishGrad").fn([xs.detach(), g], {}, 1)
    np.testing.assert_allclose(got.numpy(), xs.grad.numpy(), rtol=1e-5)


def test_copyvarupdate_keeps_state_across_batches():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    acc = b.addInitializedInputTensor(np.zeros(2, np.float32), "acc")
    new = b.aiGraphcore.copyvarupdate([acc, b.aiOnnx.add([acc, x])])
    y = b.aiOnnx.mul([new, _const(b, np.float32(2.0))])
    opts = popart.SessionOptions()
    opts.constantWeights = False
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(3, {y: ALL}), _device(), userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.ones((3, 2), np.float32)}, a))
    np.testing.assert_allclose(a[y], [[2, 2], [4, 4], [6, 6]])
    s.weightsToHost()
    out = {acc: np.zeros(2, np.float32)}
    s.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_allclose(out[acc], [3, 3])
    with pytest.raises(popart.popart_exception, match="is not a variable"):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _device())


def test_replicatedallreduce_across_replicas():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    y = b.aiGraphcore.replicatedallreduce([x])
    z = b.aiGraphcore.replicatedallreduce([x], popart.CollectiveOperator.Max)
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 2
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL, z: ALL}),
                                popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}), userOptions=opts)
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.array([[1, 2, 3], [10, 20, 30]], np.float32)}, a))
    np.testing.assert_allclose(a[y], [[11, 22, 33]] * 2)
    np.testing.assert_allclose(a[z], [[10, 20, 30]] * 2)


# --- errors ----------------------------------------------------------------------------------
def test_builder_errors():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    with pytest.raises(popart.popart_exception, match="Scale has invalid number of inputs 2. Must be between 1..1"):
        b.aiGraphcore.scale([x, x], 2.0)
    with pytest.raises(popart.popart_exception, match="Ctc has invalid number of inputs 2. Must be between 4..4"):
        b.aiGraphcore.ctcloss([x, x])
    with pytest.raises(popart.popart_exception, match="args must be a list of tensor ids"):
        b.aiGraphcore.nop(x)
    with pytest.raises(popart.popart_exception, match="outDataType"):
        b.aiGraphcore.ctcloss([x, x, x, x], outDataType="INT32")
    with pytest.raises(popart.popart_exception, match="Unknown ReductionType"):
        b.aiGraphcore.identityloss([x], "Median")
    with pytest.raises(popart.popart_exception, match="ratio value"):
        b.aiGraphcore.shapeddropout([x], [2, 1], 1.5)
    with pytest.raises(popart.popart_exception, match="axes .* and sizes .* must have the same length"):
        b.aiGraphcore.dynamicslice([x, x], [0, 1], [1])
    sg = b.createSubgraphBuilder()
    sg.addOutputTensor(sg.aiOnnx.relu([sg.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))]))
    with pytest.raises(popart.popart_exception, match="num_outputs is 2"):
        b.aiGraphcore.call([x], 2, sg)
    with pytest.raises(popart.popart_exception, match="callee must be a subgraph builder"):
        b.aiGraphcore.call([x], 1, popart.Builder())
    with pytest.raises(popart.popart_exception, match="one entry per convolution"):
        b.aiGraphcore.multiconv([[x, x]], strides=[[1, 1], [1, 1]])
    with pytest.raises(popart.popart_exception, match="untyped tensors to the top-level graph"):
        b.addUntypedInputTensor()


def test_session_errors_name_the_op():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    idx = _const(b, np.array([[0, 1, 5], [0, 0, 0]], np.int32))
    y = b.aiGraphcore.scatterreduce([x, idx], 3, axis=7)
    with pytest.raises(popart.popart_exception, match="outside the acceptable range"):
        _infer(b, [y], {x: np.zeros((2, 3), np.float32)})
