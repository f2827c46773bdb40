"""Weights on the host as PopART writes them (issue 35): the Builder stores initializers in the
typed fields (``float_data`` for FLOAT ...), ``modelToHost`` writes the current weights into
each initializer where it keeps its data (``raw_data`` stays ``raw_data``) and adds the optimizer
state (Adam moments and step, SGD accumulators and velocities) in the typed fields; a session
made from that file resumes training exactly. Code reading protobuf fields directly and code
using ``onnx.numpy_helper`` see the same values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import popart
from openipu.popart.tensor_proto import typed_tensor, write_into

ALL = popart.AnchorReturnType("All")
VALUES = [np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5, np.array([-3, 0, 2 ** 31 - 1, -2 ** 31], np.int32),
          np.array([-2 ** 63, 5, 2 ** 62], np.int64), np.array([0, 2 ** 32 - 1], np.uint32), np.array([True, False]),
          np.array([-128, 127], np.int8), np.array([0, 255], np.uint8), np.array([-32768, 7], np.int16),
          np.array([0, 65535], np.uint16), np.array([1.5, -2.25]), np.float32(7.0), np.zeros((0, 2), np.float32)]
FIELD = {np.float32: "float_data", np.int32: "int32_data", np.int64: "int64_data", np.uint32: "uint64_data",
         np.bool_: "int32_data", np.int8: "int32_data", np.uint8: "int32_data", np.int16: "int32_data",
         np.uint16: "int32_data", np.float64: "double_data"}


@pytest.mark.parametrize("k", range(len(VALUES)))
def test_typed_fields_match_onnx_helper(k):
    a = VALUES[k]
    tp = typed_tensor(a, "t")
    assert not tp.HasField("raw_data")
    ref = helper.make_tensor("t", tp.data_type, a.shape, a.reshape(-1).tolist() if a.dtype != np.float16 else a,
                             raw=False)
    field = FIELD[a.dtype.type]
    assert list(getattr(tp, field)) == list(getattr(ref, field))
    np.testing.assert_array_equal(numpy_helper.to_array(tp), a)
    b = a[::-1].copy() if a.ndim else a
    write_into(tp, b)
    np.testing.assert_array_equal(numpy_helper.to_array(tp), b)


def test_builder_writes_float_data():
    b = popart.Builder()
    b.addInitializedInputTensor(np.array([1.0, 2.0], np.float32), "w")
    b.addInitializedInputTensor(np.array([3, 4], np.int32), "i")
    b.addInitializedInputTensor(np.array([0.5], np.float16), "h")
    inits = {i.name: i for i in onnx.load_from_string(b.getModelProto()).graph.initializer}
    assert list(inits["w"].float_data) == [1.0, 2.0] and not inits["w"].HasField("raw_data")
    assert list(inits["i"].int32_data) == [3, 4]
    assert numpy_helper.to_array(inits["h"]).tolist() == [0.5]


def _model(big_raw=False):
    """x [2, 3] * w [3] + rowsum(x @ v[:3]); v [50, 40] (8000 bytes ... one held as numpy by the IR
    when large), optionally stored as raw_data as an exporter would."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    w = b.addInitializedInputTensor(np.array([0.5, -1.0, 2.0], np.float32), "w")
    v = b.addInitializedInputTensor(np.linspace(-1, 1, 200 * 100, dtype=np.float32).reshape(200, 100), "v")
    y = b.aiOnnx.add([b.aiOnnx.mul([x, w]), b.aiOnnx.reducesum(
        [b.aiOnnx.matmul([x, b.aiGraphcore.slice([v], ends=[3, 100], starts=[0, 0])])], axes=[1])])
    loss = b.aiGraphcore.l1loss([y], 0.1)
    proto = b.getModelProto()
    if big_raw:
        m = onnx.load_from_string(proto)
        for i in m.graph.initializer:
            i.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(i), i.name))
        proto = m.SerializeToString()
    return proto, x, loss


OPTIMIZERS = {
    "adam": (lambda: popart.Adam({"defaultLearningRate": (0.01, False)}), ("Accl1___", "Accl2___", "Step___")),
    "sgd1_momentum": (lambda: popart.SGD({"defaultLearningRate": (0.05, False), "defaultMomentum": (0.9, True)}),
                      ("Accl___",)),
    "sgd2_separate": (lambda: popart.SGD({"defaultLearningRate": (0.05, False), "defaultMomentum": (0.9, True)},
                                         accumulatorAndMomentum=popart.SGDAccumulatorAndMomentum.Separate),
                      ("Accl1___",)),
    "rmsprop": (lambda: popart.Adaptive({"defaultLearningRate": (0.01, False)}), ("Accl1___",)),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("raw", [False, True])
def test_model_to_host_saves_and_restores_optimizer_state(tmp_path, name, raw):
    make, prefixes = OPTIMIZERS[name]
    proto, x, loss = _model(big_raw=raw)
    xv = np.random.default_rng(1).uniform(-1, 1, (2, 3)).astype(np.float32)

    def session(model):
        s = popart.TrainingSession(model, popart.DataFlow(1, {loss: ALL}), loss, make(),
                                   popart.DeviceManager().createIpuModelDevice({}))
        s.prepareDevice()
        s.weightsFromHost()
        return s, s.initAnchorArrays()
    s, a = session(proto)
    for _ in range(3):
        s.run(popart.PyStepIO({x: xv}, a))
    fn = str(tmp_path / "m.onnx")
    s.modelToHost(fn)
    inits = {i.name: i for i in onnx.load(fn).graph.initializer}
    for wid in ("w", "v"):
        assert inits[wid].HasField("raw_data") == raw, wid      # each keeps its storage
        for p in prefixes:
            assert p + wid in inits, (p + wid, sorted(inits))
            assert not inits[p + wid].HasField("raw_data")        # optimizer state: typed fields
            assert len(inits[p + wid].float_data) == numpy_helper.to_array(inits[p + wid]).size
    out = {"w": np.zeros(3, np.float32)}
    s.weightsToHost()
    s.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_array_equal(numpy_helper.to_array(inits["w"]), out["w"])
    if not raw:
        np.testing.assert_array_equal(np.array(inits["w"].float_data, np.float32), out["w"])
    s2, a2 = session(fn)
    for _ in range(2):
        s.run(popart.PyStepIO({x: xv}, a))
        s2.run(popart.PyStepIO({x: xv}, a2))
        np.testing.assert_allclose(a2[loss], a[loss], rtol=1e-6)


def test_write_and_read_weights_round_trip():
    proto, x, loss = _model()
    opts = popart.SessionOptions()
    opts.constantWeights = False
    s = popart.InferenceSession(proto, popart.DataFlow(1, {loss: ALL}), popart.DeviceManager().createIpuModelDevice({}),
                                userOptions=opts)
    s.prepareDevice()
    s.writeWeights(popart.PyWeightsIO({"w": np.array([1.0, 2.0, 3.0], np.float32)}))
    s.weightsToHost()
    out = {"w": np.zeros(3, np.float32)}
    s.readWeights(popart.PyWeightsIO(out))
    assert out["w"].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mean", [False, True])
def test_optimizer_state_round_trip_with_accumulation_and_replication(tmp_path, name, mean):
    """2 replicas x 2 micro-batches (``global batch size`` 4 per step, Sum or Mean reduction):
    one step, ``modelToHost``, a new session from the file, one more step, equals two steps in
    one session (weights and optimizer state)."""
    make, prefixes = OPTIMIZERS[name]
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = b.addInitializedInputTensor(np.array([0.5, -1.0, 2.0], np.float32), "w")
    loss = b.aiGraphcore.l1loss([b.aiOnnx.mul([b.aiOnnx.mul([x, w]), w])], 0.1)
    proto = b.getModelProto()
    xs = np.random.default_rng(5).uniform(-1, 1, (2, 2, 2, 2, 3)).astype(np.float32)   # step, af, rf

    def session(model):
        o = popart.SessionOptions()
        o.enableReplicatedGraphs, o.replicatedGraphCount = True, 2
        o.enableGradientAccumulation, o.accumulationFactor = True, 2
        if mean:
            o.accumulationAndReplicationReductionType = popart.ReductionType.Mean
        s = popart.TrainingSession(model, popart.DataFlow(1, {loss: ALL}), loss, make(),
                                   popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}), userOptions=o)
        s.prepareDevice()
        s.weightsFromHost()
        return s

    def inits(fn):
        return {i.name: numpy_helper.to_array(i) for i in onnx.load(fn).graph.initializer}
    s = session(proto)
    for i in range(2):
        s.run(popart.PyStepIO({x: xs[i]}, s.initAnchorArrays()))
    s.modelToHost(str(tmp_path / "two.onnx"))
    s = session(proto)
    s.run(popart.PyStepIO({x: xs[0]}, s.initAnchorArrays()))
    s.modelToHost(str(tmp_path / "one.onnx"))
    s2 = session(str(tmp_path / "one.onnx"))
    s2.run(popart.PyStepIO({x: xs[1]}, s2.initAnchorArrays()))
    s2.modelToHost(str(tmp_path / "resumed.onnx"))
    two, resumed = inits(str(tmp_path / "two.onnx")), inits(str(tmp_path / "resumed.onnx"))
    assert set(two) == set(resumed) and all(p + "w" in two for p in prefixes)
    assert not np.allclose(two["w"], inits(str(tmp_path / "one.onnx"))["w"])
    for k, v in two.items():
        np.testing.assert_allclose(resumed[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
