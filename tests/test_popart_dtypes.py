"""ONNX semantics by opset and PopART's element types (issue 35): a table of ops, each with the
output type and shape PopART gives (``session.getInfo`` and the anchor array), and the values.

- reductions: ``axes`` absent (all axes), an empty ``axes`` attribute (PopART's ``ReduceOp``
  reduces over none: the op's map only), ``keepdims``, the opset-13 / 18 ``axes`` input and
  ``noop_with_empty_axes``;
- index outputs in PopART's INT32 (``ArgMax`` / ``ArgMin``, ``TopK`` indices, ``ai.graphcore``
  ``Sort``), where ONNX says INT64;
- FLOAT16 times a FLOAT scalar ``Mul``: FLOAT16 (PopART's ``MulOp``);
- ``RandomNormal`` / ``RandomUniform`` (and ``*Like``): FLOAT and FLOAT16, attributes given as
  ints or floats;
- losses on integer labels (every integer type) and L1 on INT32;
- ``If``, ``Loop``, ``Scan`` and ``ai.graphcore`` ``call`` subgraphs: outputs typed in the model
  the Builder writes and in the session."""

from __future__ import annotations

import numpy as np
import pytest

import popart

ALL = popart.AnchorReturnType("All")
X = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4) / 10


def _c(b, v):
    return b.aiOnnx.constant(np.asarray(v))


def _run(b, outs, feeds):
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {o: ALL for o in outs}),
                                popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds, a))
    return s, a


#: name -> (opset, build(b, x) -> id or [ids] (the output checked is the last), PopART type,
#: expected value of that output from X (numpy))
TABLE = {
    "reducesum_no_axes": (11, lambda b, x: b.aiOnnx.reducesum([x]), "FLOAT", X.sum(keepdims=True)),
    "reducesum_no_axes_keepdims0": (11, lambda b, x: b.aiOnnx.reducesum([x], keepdims=0), "FLOAT", X.sum()),
    "reducesum_empty_axes_attribute": (11, lambda b, x: b.aiOnnx.reducesum([x], axes=[]), "FLOAT", X),
    "reducesumsquare_empty_axes_attribute": (11, lambda b, x: b.aiOnnx.reducesumsquare([x], axes=[]), "FLOAT", X * X),
    "reducel1_empty_axes_attribute_opset10": (10, lambda b, x: b.aiOnnx.reducel1([b.aiOnnx.neg([x])], axes=[]),
                                              "FLOAT", X),
    "reducemax_axes_keepdims0": (11, lambda b, x: b.aiOnnx.reducemax([x], axes=[-1, 0], keepdims=0), "FLOAT",
                                 X.max((0, 2))),
    "reducesum_opset13_axes_input": (13, lambda b, x: b.aiOnnx.reducesum([x, _c(b, np.array([1], np.int64))]),
                                     "FLOAT", X.sum(1, keepdims=True)),
    "reducesum_opset13_empty_axes_input": (13, lambda b, x: b.aiOnnx.reducesum([x, _c(b, np.array([], np.int64))],
                                                                               keepdims=0), "FLOAT", X.sum()),
    "reducesum_opset13_noop": (13, lambda b, x: b.aiOnnx.reducesum([x], noop_with_empty_axes=1), "FLOAT", X),
    "reducemean_opset18_axes_input": (18, lambda b, x: b.aiOnnx.reducemean([x, _c(b, np.array([2], np.int64))],
                                                                           keepdims=0), "FLOAT", X.mean(2)),
    # (ONNX's noop: the input itself, not its map)
    "reducel2_opset18_noop": (18, lambda b, x: b.aiOnnx.reducel2([b.aiOnnx.neg([x])], noop_with_empty_axes=1),
                              "FLOAT", -X),
    "argmax": (11, lambda b, x: b.aiOnnx.argmax([x], axis=1), "INT32", X.argmax(1)[:, None]),
    "argmin_keepdims0": (11, lambda b, x: b.aiOnnx.argmin([x], axis=-1, keepdims=0), "INT32", X.argmin(-1)),
    "argmax_opset13": (13, lambda b, x: b.aiOnnx.argmax([x], axis=2, keepdims=0), "INT32", X.argmax(2)),
    "topk_indices": (11, lambda b, x: b.aiOnnx.topk([x, _c(b, np.array([2], np.int64))], axis=2), "INT32",
                     np.argsort(-X, 2)[..., :2]),
    "topk_values": (11, lambda b, x: b.aiOnnx.topk([x, _c(b, np.array([2], np.int64))], axis=2)[:1], "FLOAT",
                    -np.sort(-X, 2)[..., :2]),
    "sort_indices": (11, lambda b, x: b.aiGraphcore.sort([x], axis=1, descending=True), "INT32",
                     np.argsort(-X, 1)),
    "mul_fp16_by_fp32_scalar": (11, lambda b, x: b.aiOnnx.mul([b.aiOnnx.cast([x], "FLOAT16"),
                                                              _c(b, np.float32(2.0))]), "FLOAT16",
                                (X.astype(np.float16) * np.float16(2))),
    "mul_fp32_scalar_by_fp16": (11, lambda b, x: b.aiOnnx.mul([_c(b, np.array([0.5], np.float32)),
                                                              b.aiOnnx.cast([x], "FLOAT16")]), "FLOAT16",
                                (X.astype(np.float16) * np.float16(0.5))),
    "cast_fp16": (11, lambda b, x: b.aiOnnx.cast([x], "FLOAT16"), "FLOAT16", X.astype(np.float16)),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_dtype_table(name):
    opset, build, dtype, want = TABLE[name]
    b = popart.Builder(opsets={"ai.onnx": opset, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, 4]))
    out = build(b, x)
    y = out[-1] if isinstance(out, list) else out
    s, a = _run(b, [y], {x: X})
    assert s.getInfo(y).data_type() == dtype
    assert s.getInfo(y).shape() == list(np.shape(want))
    assert a[y].dtype == np.dtype({"FLOAT": np.float32, "FLOAT16": np.float16, "INT32": np.int32}[dtype])
    np.testing.assert_allclose(a[y].astype(np.float64), np.asarray(want, np.float64), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("op", ["randomnormal", "randomuniform", "randomnormallike", "randomuniformlike"])
@pytest.mark.parametrize("dtype,name", [(1, "FLOAT"), (10, "FLOAT16"), (None, "FLOAT")])
def test_random_ops_types(op, dtype, name):
    """Each random op in FLOAT and FLOAT16, with its float attributes given as ints."""
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [64, 32]))
    kw = {} if dtype is None else {"dtype": dtype}
    if op == "randomnormal":
        y = b.aiOnnx.randomnormal(shape=[64, 32], mean=1, scale=2, **kw)
    elif op == "randomuniform":
        y = b.aiOnnx.randomuniform(shape=[64, 32], high=3, low=1, **kw)
    elif op == "randomnormallike":
        y = b.aiOnnx.randomnormallike([x], mean=1, scale=2, **kw)
    else:
        y = b.aiOnnx.randomuniformlike([x], high=3, low=1, **kw)
    s, a = _run(b, [y], {x: np.zeros((64, 32), np.float32)})
    assert s.getInfo(y).data_type() == name and a[y].shape == (64, 32)
    v = a[y].astype(np.float64)
    if "normal" in op:
        assert abs(v.mean() - 1) < 0.2 and abs(v.std() - 2) < 0.3
    else:
        assert v.min() >= 1 and v.max() <= 3 and abs(v.mean() - 2) < 0.2


@pytest.mark.parametrize("label_type", [np.int32, np.uint32, np.int64, np.int16, np.int8, np.uint8])
def test_nll_on_integer_labels(label_type):
    xv = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    lab = np.array([0, 3, 4, 1], label_type)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 5]))
    label = b.addInputTensor(popart.TensorInfo(lab))
    loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([x], axis=1), label], popart.ReductionType.Mean)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss, popart.ConstSGD(0.1),
                               popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: xv, label: lab}, a))
    logp = xv - np.log(np.exp(xv).sum(1, keepdims=True))
    np.testing.assert_allclose(a[loss], -logp[np.arange(4), lab.astype(np.int64)].mean(), rtol=1e-5)


def test_l1loss_on_int32():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("INT32", [4]))
    loss = b.aiGraphcore.l1loss([x], 0.5, popart.ReductionType.Sum)
    s, a = _run(b, [loss], {x: np.array([1, -2, 3, 4], np.int32)})
    assert s.getInfo(loss).data_type() == "INT32" and int(a[loss]) == 5


def _subgraph_models():
    """If / Loop / Scan / call models whose subgraphs hold ai.graphcore ops (ONNX inference cannot
    type through them); each returns (builder, feeds, output id, expected)."""
    xv = np.array([0.5, -1.0], np.float32)
    out = {}
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    cond = b.addInputTensor(popart.TensorInfo("BOOL", []))
    tb = b.createSubgraphBuilder()
    tb.addInputTensorFromParentGraph(x)
    tb.addOutputTensor(tb.aiGraphcore.scale([tb.aiOnnx.relu([x])], 3.0))
    eb = b.createSubgraphBuilder()
    eb.addInputTensorFromParentGraph(x)
    eb.addOutputTensor(eb.aiGraphcore.scale([x], 2.0))
    o = b.aiOnnx.logical_if([cond], 1, eb, tb)[0]
    out["if"] = (b, {x: xv, cond: np.array(True)}, o, 3 * np.maximum(xv, 0))
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    lb = b.createSubgraphBuilder()
    lb.addInputTensor(popart.TensorInfo("INT64", []))
    c = lb.addInputTensor(popart.TensorInfo("BOOL", []))
    v = lb.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    lb.addOutputTensor(lb.aiOnnx.identity([c]))
    lb.addOutputTensor(lb.aiGraphcore.scale([v], 2.0))
    o = b.aiOnnx.loop([_c(b, np.array(3, np.int64)), _c(b, np.array(True)), x], 1, lb)[0]
    out["loop"] = (b, {x: xv}, o, 8 * xv)
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    s0 = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    xs = b.addInputTensor(popart.TensorInfo("FLOAT", [3, 2]))
    sb = b.createSubgraphBuilder()
    st = sb.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    xi = sb.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    n = sb.aiGraphcore.scaledadd([st, xi], scale0=1.0, scale1=2.0)
    sb.addOutputTensor(n)
    sb.addOutputTensor(sb.aiOnnx.identity([n]))
    o = b.aiOnnx.scan([s0, xs], 2, sb, 1)[1]
    xsv = np.arange(6, dtype=np.float32).reshape(3, 2)
    out["scan"] = (b, {s0: xv, xs: xsv}, o, xv + 2 * np.cumsum(xsv, 0))
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    cb = b.createSubgraphBuilder()
    i = cb.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    cb.addOutputTensor(cb.aiGraphcore.scale([cb.aiOnnx.mul([i, i])], 0.5))
    o = b.aiGraphcore.call([x], 1, cb)[0]
    out["call"] = (b, {x: xv}, o, 0.5 * xv * xv)
    return out


@pytest.mark.parametrize("kind", ["if", "loop", "scan", "call"])
def test_subgraph_outputs_typed(kind):
    import onnx
    b, feeds, o, want = _subgraph_models()[kind]
    b.addOutputTensor(o)
    m = onnx.load_from_string(b.getModelProto())
    onnx.checker.check_model(m, full_check=True)
    assert b.getTensorShape(o) == list(want.shape) and b.getTensorDtypeString(o) == "float32"
    s, a = _run(b, [o], feeds)
    assert s.getInfo(o).data_type() == "FLOAT"
    np.testing.assert_allclose(a[o], want, rtol=1e-6)
