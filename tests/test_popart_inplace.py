"""In-place ops (PopART's InPlace pattern): an elementwise op, activation or softmax writes its
result over an input that nothing reads afterwards, and never over one that is read later (also
through a view), anchored, a weight or a streamed input. Results match numpy either way."""

from __future__ import annotations

import numpy as np
import pytest

import popart


@pytest.fixture(autouse=True)
def _device_emulation(monkeypatch):
    """These tests check the lowering (views, in-place writes on the device): they run on the
    device-storage emulation, which the IR executor (the default) would bypass."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "device")


def _session(b, anchors, patterns=None):
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": 16})
    s = popart.InferenceSession(fnModel=b.getModelProto(),
                                dataFlow=popart.DataFlow(1, {a: popart.AnchorReturnType("ALL") for a in anchors}),
                                deviceInfo=dev, patterns=patterns)
    s.prepareDevice()
    return s


def _run(s, feeds):
    out = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds, out))
    return out


def _in_place(s) -> dict[str, int]:
    """op type of each in-place op's output id -> the input it overwrote."""
    return {f"{op.op_type}:{op.outputs[0]}": s._lowered.in_place[op.id] for op in s._ir.ops if op.id in s._lowered.in_place}


def _softmax(v):
    e = np.exp(v - v.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _model(later_use_of_matmul=False, anchor_matmul=False):
    rng = np.random.default_rng(0)
    w_np = (rng.standard_normal((8, 8)) / 3).astype(np.float32)
    c_np = rng.standard_normal(8).astype(np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
    w = b.addInitializedInputTensor(w_np, "w")
    c = b.addInitializedInputTensor(c_np, "c")
    m = b.aiOnnx.matmul([x, w])
    a = b.aiOnnx.add([m, c])            # over m, unless m is read later or anchored
    r = b.aiOnnx.relu([a])              # over a
    s = b.aiOnnx.softmax([r], axis=-1)  # over r
    out = b.aiOnnx.sub([s, b.aiOnnx.transpose([b.aiOnnx.transpose([m])])]) if later_use_of_matmul else s
    anchors = [out] + ([m] if anchor_matmul else [])
    xv = rng.standard_normal((4, 8)).astype(np.float32)
    mv = xv @ w_np
    sv = _softmax(np.maximum(mv + c_np, 0))
    want = {out: sv - mv if later_use_of_matmul else sv, m: mv}
    return b, x, xv, anchors, want, (m, a, r, s, out)


def test_a_chain_of_elementwise_ops_overwrites_its_intermediates():
    b, x, xv, anchors, want, (m, a, r, s, out) = _model()
    sess = _session(b, anchors)
    got = _run(sess, {x: xv})
    np.testing.assert_allclose(got[out], want[out], rtol=1e-5, atol=1e-6)
    ip = _in_place(sess)
    assert ip == {f"Add:{a}": 0, f"Relu:{r}": 0, f"Softmax:{s}": 0}


@pytest.mark.parametrize("case", ["read later through views", "anchored"])
def test_an_input_read_later_or_anchored_keeps_its_value(case):
    later, anchored = case == "read later through views", case == "anchored"
    b, x, xv, anchors, want, (m, a, r, s, out) = _model(later_use_of_matmul=later, anchor_matmul=anchored)
    sess = _session(b, anchors)
    got = _run(sess, {x: xv})
    for k in anchors:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    ip = _in_place(sess)
    assert f"Add:{a}" not in ip                   # m keeps its value
    assert ip[f"Relu:{r}"] == 0 and ip[f"Softmax:{s}"] == 0
    if later:
        assert ip[f"Sub:{out}"] == 0              # the softmax output is read nowhere else


def test_patterns_without_inplace_make_new_tensors():
    b, x, xv, anchors, want, (m, a, r, s, out) = _model()
    p = popart.Patterns(popart.PatternsLevel.Minimal)
    sess = _session(b, anchors, patterns=p)
    np.testing.assert_allclose(_run(sess, {x: xv})[out], want[out], rtol=1e-5, atol=1e-6)
    assert _in_place(sess) == {}


def test_weights_inputs_and_broadcast_operands_are_not_overwritten():
    rng = np.random.default_rng(1)
    w_np = rng.standard_normal((4, 8)).astype(np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
    row = b.addInputTensor(popart.TensorInfo("FLOAT", [1, 8]), "row")
    w = b.addInitializedInputTensor(w_np, "w")
    e = b.aiOnnx.exp([x])                    # x is a streamed input: a new tensor
    r = b.aiOnnx.relu([w])                   # w is a weight: a new tensor
    t = b.aiOnnx.tanh([row])                 # a new tensor (a streamed input)
    y = b.aiOnnx.add([t, e])                 # t broadcasts: the result goes over e, the right operand
    z = b.aiOnnx.mul([y, r])
    sess = _session(b, [z])
    xv = rng.standard_normal((4, 8)).astype(np.float32)
    rv = rng.standard_normal((1, 8)).astype(np.float32)
    got = _run(sess, {x: xv, row: rv})[z]
    np.testing.assert_allclose(got, (np.tanh(rv) + np.exp(xv)) * np.maximum(w_np, 0), rtol=1e-5, atol=1e-6)
    ip = _in_place(sess)
    assert f"Exp:{e}" not in ip and f"Relu:{r}" not in ip and f"Tanh:{t}" not in ip
    assert ip[f"Add:{y}"] == 1 and ip[f"Mul:{z}"] == 0
    # the weight still holds its value after the run
    w_out = {w: np.zeros_like(w_np)}
    sess.weightsToHost()
    sess.readWeights(popart.PyWeightsIO(w_out))
    np.testing.assert_array_equal(w_out[w], w_np)


def test_where_overwrites_the_value_it_keeps():
    # the IsNaN / Where pair of exported attention: Where(IsNaN(s), 0, s) goes over s
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3, 5]), "x")
    s = b.aiOnnx.softmax([b.aiOnnx.mul([x, x])], axis=-1)
    zero = b.aiOnnx.constant(np.zeros((), np.float32))
    y = b.aiOnnx.where([b.aiOnnx.isnan([s]), zero, s])
    sess = _session(b, [y])
    xv = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(sess, {x: xv})[y], _softmax(xv * xv), rtol=1e-5, atol=1e-6)
    assert _in_place(sess)[f"Where:{y}"] == 2
