"""The rest of PopART's API that user code reaches for (issue 35): ``Patterns`` by name,
``GraphTransformer``, ``Builder.saveInitializersExternally`` / ``checkpointOutput``,
``Session._serializeIr`` and the RNG state APIs."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import popart

ALL = popart.AnchorReturnType("All")


def _dev():
    return popart.DeviceManager().createIpuModelDevice({})


# -- Patterns ---------------------------------------------------------------------------------
def test_patterns_levels_and_names():
    p = popart.Patterns()
    assert p.InPlace and p.PreUniRepl and p.SoftMaxGradDirect and p.isPatternEnabled("NlllWithSoftmaxGradDirect")
    assert not p.isPatternEnabled("SplitGather") and p.isPatternEnabled("MatMulOp")
    m = popart.Patterns(popart.PatternsLevel.Minimal)
    assert not m.InPlace and not m.PreUniRepl and m.MatMulOp
    assert popart.Patterns(popart.PatternsLevel.All).isPatternEnabled("TiedGather")
    n = popart.Patterns(["PreUniRepl", "InPlace"])
    assert n.PreUniRepl and n.InPlace and not n.PostNRepl
    p.NlllWithSoftMaxGradDirect = False
    assert not p.isPatternEnabled("NlllWithSoftmaxGradDirect")


@pytest.mark.parametrize("make,msg", [
    (lambda: popart.Patterns(["NoSuchPattern"]), "Unknown pattern NoSuchPattern"),
    (lambda: popart.Patterns(["Inplace"]), "Unknown pattern Inplace, did you mean InPlace?"),
    (lambda: popart.Patterns().isPatternEnabled("Nope"), "Unknown pattern Nope"),
    (lambda: popart.Patterns().enablePattern("MatMulOp", False), "Pattern 'MatMulOp' is mandatory and cannot be "
                                                                 "disabled"),
])
def test_patterns_errors(make, msg):
    with pytest.raises(popart.popart_exception, match=msg):
        make()


def test_patterns_mandatory_checked_at_session_creation():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    y = b.aiOnnx.relu([x])
    p = popart.Patterns(["PreUniRepl"])
    with pytest.raises(popart.popart_exception, match=r"Pattern '\w+' must be enabled"):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _dev(), patterns=p)
    p.enableRuntimeAsserts(False)
    popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _dev(), patterns=p)


def test_disabling_nll_softmax_pattern_keeps_gradient():
    xv, lab = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), np.array([1, 0, 3], np.int32)
    grads = []
    for on in (True, False):
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [3, 4]))
        label = b.addInputTensor(popart.TensorInfo("INT32", [3]))
        loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([x], axis=1), label])
        p = popart.Patterns()
        p.NlllWithSoftMaxGradDirect = on
        g = popart.reservedGradientPrefix() + x
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {g: ALL}), loss, popart.ConstSGD(0.1), _dev(),
                                   patterns=p)
        s.prepareDevice()
        s.weightsFromHost()
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: xv, label: lab}, a))
        grads.append(a[g])
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)


# -- GraphTransformer -------------------------------------------------------------------------
def _float_model():
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    w = b.addInitializedInputTensor(np.array([1.5, -2.0, 0.25], np.float32), "w")
    i = b.addInitializedInputTensor(np.array([2, 0, 1], np.int64), "idx")
    b.addInputTensor(popart.TensorInfo("FLOAT", [4]), "unused")
    c = b.aiOnnx.constant(np.array(0.5, np.float32))
    y = b.aiOnnx.gather([b.aiOnnx.add([b.aiOnnx.mul([x, w]), c]), i], axis=1)
    b.addOutputTensor(y)
    return b, x, y


def test_graph_transformer_float_to_half_runs_in_fp16():
    b, x, y = _float_model()
    gt = popart.GraphTransformer(b.getModelProto())
    gt.convertFloatsToHalfs()
    gt.removeUnusedInputs()
    m = onnx.load_from_string(gt.getModelProto())
    assert [i.name for i in m.graph.input if i.name == "unused"] == []
    inits = {i.name: i for i in m.graph.initializer}
    assert inits["w"].data_type == onnx.TensorProto.FLOAT16 and inits["idx"].data_type == onnx.TensorProto.INT64
    s = popart.InferenceSession(gt.getModelProto(), popart.DataFlow(1, {y: ALL}), _dev())
    s.prepareDevice()
    a = s.initAnchorArrays()
    xv = np.arange(6, dtype=np.float16).reshape(2, 3)
    s.run(popart.PyStepIO({x: xv}, a))
    assert a[y].dtype == np.float16
    np.testing.assert_allclose(a[y], (xv * np.array([1.5, -2, 0.25], np.float16) + np.float16(0.5))[:, [2, 0, 1]])


def test_graph_transformer_int64_and_constants():
    b, x, y = _float_model()
    gt = popart.GraphTransformer(b.getModelProto())
    gt.convertINT64ToINT32()
    gt.convertAllFixedPointInitializersToConstants()
    m = onnx.load_from_string(gt.getModelProto())
    assert "idx" not in {i.name for i in m.graph.initializer}
    const = [n for n in m.graph.node if n.op_type == "Constant" and n.output[0] == "idx"][0]
    assert numpy_helper.to_array(const.attribute[0].t).dtype == np.int32
    with pytest.raises(popart.popart_exception, match="TensorId nope not in the model initalizers"):
        gt.convertInitializersToConstants(["nope"])
    b2 = popart.Builder()
    b2.addInitializedInputTensor(np.array([2 ** 40], np.int64), "big")
    g2 = popart.GraphTransformer(b2.getModelProto())
    with pytest.raises(popart.popart_exception, match="cannot cast int64 to int32: number is too large"):
        g2.convertINT64ToINT32()
    g2.convertINT64ToINT32(clip=True)
    big = onnx.load_from_string(g2.getModelProto()).graph.initializer[0]
    assert numpy_helper.to_array(big).tolist() == [2 ** 31 - 1]


def test_graph_transformer_prepare_nodes_for_training():
    b = popart.Builder(opsets={"ai.onnx": 9, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, 2, 2]))
    ws = [b.addInitializedInputTensor(np.ones(3, np.float32) * k) for k in (1, 0, 0, 1)]
    b.aiOnnx.batchnormalization([x] + ws, 1)
    gt = popart.GraphTransformer(b.getModelProto())
    gt.prepareNodesForTraining()
    bn = [n for n in onnx.load_from_string(gt.getModelProto()).graph.node if n.op_type == "BatchNormalization"][0]
    assert len(bn.output) == 5


# -- external initializers, checkpoints -------------------------------------------------------
@pytest.mark.parametrize("via", ["builder", "graph_transformer"])
def test_save_initializers_externally(tmp_path, via):
    b, x, y = _float_model()
    fn = str(tmp_path / "weights.bin")
    if via == "builder":
        b.saveInitializersExternally(["w", "idx"], fn)
        proto = b.getModelProto()
    else:
        gt = popart.GraphTransformer(b.getModelProto())
        gt.saveInitializersExternally(["w", "idx"], fn)
        proto = gt.getModelProto()
    assert os.path.getsize(fn) == 3 * 4 + 3 * 8
    inits = {i.name: i for i in onnx.load_from_string(proto).graph.initializer}
    assert inits["w"].data_location == onnx.TensorProto.EXTERNAL
    assert {e.key: e.value for e in inits["idx"].external_data} == {"location": fn, "offset": "12", "length": "24"}
    s = popart.InferenceSession(proto, popart.DataFlow(1, {y: ALL}), _dev())
    s.prepareDevice()
    a = s.initAnchorArrays()
    xv = np.ones((2, 3), np.float32)
    s.run(popart.PyStepIO({x: xv}, a))
    np.testing.assert_allclose(a[y], (xv * np.array([1.5, -2, 0.25], np.float32) + 0.5)[:, [2, 0, 1]])
    with pytest.raises(popart.popart_exception, match="Tensor 'input' is not an initializer"):
        popart.GraphTransformer(proto).saveInitializersExternally([x], str(tmp_path / "x.bin"))
    with pytest.raises(popart.popart_exception, match="parent directory does not exist"):
        popart.GraphTransformer(proto).saveInitializersExternally(["w"], str(tmp_path / "no" / "x.bin"))


def test_checkpoint_output_trains_like_without():
    xv = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    results = []
    for checkpoint in (False, True):
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
        w = b.addInitializedInputTensor(np.array([0.5, 1.0, -1.0], np.float32), "w")
        h = b.aiOnnx.tanh([b.aiOnnx.mul([x, w])])
        if checkpoint:
            (h,) = b.checkpointOutput([h])
            assert b.getRecomputeOutputInBackwardPass(h)
        loss = b.aiGraphcore.l1loss([b.aiOnnx.sigmoid([h])], 1.0)
        g = popart.reservedGradientPrefix() + w
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {g: ALL}), loss, popart.ConstSGD(0.1),
                                   _dev())
        s.prepareDevice()
        s.weightsFromHost()
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: xv}, a))
        results.append(a[g])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)


# -- IR JSON, RNG state -----------------------------------------------------------------------
def test_serialize_ir_json():
    b, x, y = _float_model()
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _dev())
    ir = json.loads(s._serializeIr(popart.IrSerializationFormat.JSON))
    ops = ir["maingraph"]
    assert [o["type"] for o in ops] == ["Mul", "Add", "Gather"]
    assert ops[0]["inputs"][0] == {"name": x, "shape": "[2 3]", "type": "FLOAT", "index": "0"}
    assert ops[-1]["outputs"] == [{"name": y, "index": "0"}] and ops[-1]["attributes"]["axis"] == "1"


def test_rng_state_round_trip():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4]))
    y = b.aiOnnx.relu([x])
    opts = popart.SessionOptions()
    opts.enableLoadAndOffloadRNGState = True
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _dev(), userOptions=opts)
    with pytest.raises(popart.popart_exception, match=r"Devicex::prepare\(\) must be called"):
        s.getRNGState()
    s.prepareDevice()
    state = s.getRNGState()
    assert len(state) == 4 * 6 * 4 and all(0 <= v < 2 ** 32 for v in state)
    s.setRNGState([7] * len(state))
    assert s.getRNGState() == [7] * len(state)
    with pytest.raises(popart.popart_exception, match="values given"):
        s.setRNGState([1, 2])
    s2 = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _dev())
    s2.prepareDevice()
    with pytest.raises(popart.popart_runtime_error, match="enableLoadAndOffloadRNGState must be set to True"):
        s2.getRNGState()


# -- VariableSettings -------------------------------------------------------------------------
def test_variable_settings():
    vs = popart.VariableSettings(popart.CommGroup(popart.CommGroupType.Consecutive, 2),
                                 popart.VariableRetrievalMode.OnePerGroup)
    assert vs.getGroupCount(4) == 2 and vs.numReplicasReturningVariable(4) == 2
    assert popart.VariableSettings(popart.VariableRetrievalMode.AllReplicas).numReplicasReturningVariable(4) == 4
    assert popart.VariableSettings(popart.CommGroup(popart.CommGroupType.Ungrouped, 0)).getGroupCount(4) == 4
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]))
    w = b.addInitializedInputTensor(np.array([1.0, 2.0, 3.0], np.float32),
                                    popart.VariableSettings(popart.CommGroup(popart.CommGroupType.All, 0)), "w")
    y = b.aiOnnx.mul([x, w])
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: ALL}), _dev())
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.ones(3, np.float32)}, a))
    assert a[y].tolist() == [1.0, 2.0, 3.0]
    # a grouped weight is accepted (its checks and runs: tests/test_popart_replica_grouping.py)
    v = b.addInitializedInputTensor(np.ones((2, 3), np.float32), vs, "v")
    assert b.getTensorShape(v) == [2, 3]


def test_logger_set_level_persists(capfd):
    """``getLogger(module).setLevel`` holds for later messages (it was reset to POPART_LOG_LEVEL)."""
    log = popart.getLogger("session")
    log.setLevel("INFO")
    log.info("first message")
    log.debug("hidden")
    popart.getLogger().setLevel("WARN")
    popart.getLogger("ir").info("hidden too")
    popart.getLogger("ir").warn("second message")
    popart.getLogger().setLevel("OFF")
    popart.getLogger("ir").error("hidden as well")
    err = capfd.readouterr().err
    assert "popart:session" in err and " I: first message" in err and " W: second message" in err
    assert "hidden" not in err


# -- Poplar debug info, the serialized graph, options accepted -------------------------------
def _small_training(tmp_path):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    w = b.addInitializedInputTensor(np.ones((3, 2), np.float32), "w")
    y = b.aiOnnx.matmul([x, w], "mm")
    loss = b.aiGraphcore.l1loss([y], 0.1)
    return popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss,
                                  popart.ConstSGD(0.1), _dev())


@pytest.mark.parametrize("fmt", ["json", "cbor"])
def test_poplar_debug_info_streamer(tmp_path, fmt):
    """``initializePoplarDebugInfo`` / ``closePoplarDebugInfo``: the sessions made in between
    write one ``popart`` op context per IR op (forward and backward) to the file."""
    fn = tmp_path / f"debug.{fmt}"
    popart.initializePoplarDebugInfo(str(fn), fmt)
    s = _small_training(tmp_path)
    popart.closePoplarDebugInfo()
    popart.closePoplarDebugInfo()          # nothing open: nothing happens
    data = fn.read_bytes()
    if fmt == "cbor":
        assert data[:10] == b"\xa1\x68contexts"    # a map of one key, "contexts" (RFC 8949)
        assert b"ai.onnx.MatMul:" in data
        return
    contexts = json.loads(data)["contexts"]
    ops = [c for c in contexts if c["category"] == "op"]
    assert len(ops) == len(s.ops())
    assert any(c["opid"].startswith("ai.onnx.MatMul") and c["pass"] == "forward" for c in ops)
    assert any(c["pass"] == "backward" for c in ops)
    assert not os.path.exists(tmp_path / "other.json")
    _small_training(tmp_path)       # no streamer open: nothing recorded, no file
    assert not any(p.name == "other.json" for p in tmp_path.iterdir())


def test_serialized_graph(tmp_path):
    """``getSerializedGraph``: after ``prepareDevice``, the graph's variables (the weight among
    them, on some tiles) and compute sets (the matmul's vertices) as JSON bytes."""
    s = _small_training(tmp_path)
    with pytest.raises(popart.popart_exception, match="prepared"):
        s.getSerializedGraph()
    s.prepareDevice()
    data = s.getSerializedGraph()
    assert isinstance(data, bytes)
    doc = json.loads(data)
    assert doc["target"]["numIPUs"] == 1
    w = [v for v in doc["variables"] if v["name"] == "w"]
    assert w and int(np.prod(w[0]["shape"])) == 6 and w[0]["tiles"] >= 1 and not w[0]["constant"]
    assert sum(c["vertices"] for c in doc["computeSets"]) > 0
    assert any("poplin" in t or "Conv" in t or "MatMul" in t for c in doc["computeSets"] for t in c["vertexTypes"])


def test_session_options_of_popart_accepted():
    o = popart.SessionOptions()
    assert o.stashAllTensorsInferencePipeline is False and o.enableConstantFoldingOfMultipleConsumers is True
    o.stashAllTensorsInferencePipeline = True
    o.useLoopCandidateCreator = True
    assert o.stashAllTensorsInferencePipeline and o.useLoopCandidateCreator


def test_cycle_counters_on_every_ipu():
    """``getCycleCount("inner_ipu_<i>")`` with ``Instrumentation.Inner``: each IPU of a 2-IPU
    sharded model has its own count of one batch (the heavier IPU more); the outer count (the
    whole run) is at least the largest over ``batchesPerStep`` batches. Another id, or Inner
    not asked for, is PopART's runtime_error."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [64, 64]), "x")
    with b.virtualGraph(0):
        y = b.aiOnnx.relu([x])
    with b.virtualGraph(1):
        w = b.addInitializedInputTensor(np.ones((64, 64), np.float32), "w")
        z = b.aiOnnx.matmul([y, w])
        for _ in range(3):
            z = b.aiOnnx.matmul([z, w])
    o = popart.SessionOptions()
    o.virtualGraphMode = popart.VirtualGraphMode.Manual
    o.instrumentWithHardwareCycleCounter = True
    o.hardwareInstrumentations = {popart.Instrumentation.Outer, popart.Instrumentation.Inner}
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(2, {z: ALL}),
                                popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}), userOptions=o)
    s.prepareDevice()
    with pytest.raises(popart.popart_runtime_error, match="Must call run before getCycleCount"):
        s.getCycleCount("inner_ipu_0")
    s.run(popart.PyStepIO({x: np.ones((2, 64, 64), np.float32)}, s.initAnchorArrays()))
    c0, c1 = s.getCycleCount("inner_ipu_0"), s.getCycleCount("inner_ipu_1")
    assert 0 < c0 < c1
    assert s.getCycleCount() >= c1 * 2 * 0.99
    with pytest.raises(popart.popart_runtime_error, match="Invalid id for cycle counter, 'inner_ipu_2'"):
        s.getCycleCount("inner_ipu_2")
    o.hardwareInstrumentations = {popart.Instrumentation.Outer}
    s2 = popart.InferenceSession(b.getModelProto(), popart.DataFlow(2, {z: ALL}),
                                 popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}), userOptions=o)
    s2.prepareDevice()
    s2.run(popart.PyStepIO({x: np.ones((2, 64, 64), np.float32)}, s2.initAnchorArrays()))
    with pytest.raises(popart.popart_runtime_error, match="hardwareInstrumentations"):
        s2.getCycleCount("inner_ipu_0")
