"""popart.Builder ids, opsets, shapes and annotations; TensorInfo, SessionOptions, DeviceManager."""

from __future__ import annotations

import inspect

import numpy as np
import onnx
import pytest

import popart


def test_tensor_ids_are_popart_s():
    b = popart.Builder()
    i0 = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    i1 = b.addInputTensor("FLOAT", [2])
    i2 = b.addInputTensor(popart.TensorInfo("FLOAT", [2]), "data")
    w0 = b.addInitializedInputTensor(np.zeros(2, np.float32))
    w1 = b.addInitializedInputTensor(np.zeros(2, np.float32), "weight")
    a0 = b.aiOnnx.add([i0, i1], "output")          # debugContext names the node only
    a1 = b.aiOnnx.add([a0, i2])
    with b.nameScope("layer"):
        a2 = b.aiOnnx.add([a1, w0])
        with b.nameScope("inner"):
            m = b.aiOnnx.mul([a2, w1])
    a3 = b.aiOnnx.add([m, m])
    assert (i0, i1, i2, w0, w1) == ("input", "input/1", "data", "init_input", "weight")
    assert (a0, a1, a2, m, a3) == ("Add:0", "Add:0/1", "layer/Add:0", "layer/inner/Mul:0", "Add:0/2")
    names = [n.name for n in onnx.load_from_string(b.getModelProto()).graph.node]
    assert names == ["output", "", "layer/Add", "layer/inner/Mul", ""]
    assert b.getInputTensorIds() == ["input", "input/1", "data"]
    assert b.isInitializer(w0) and not b.isInitializer(i0)


def test_multi_output_ops_and_shapes():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT16", [4, 6]))
    parts = b.aiOnnx.split([x], 3, axis=1)
    assert parts == ["Split:0", "Split:1", "Split:2"]
    assert b.getTensorShape(parts[1]) == [4, 2]
    assert b.getTensorDtypeString(parts[0]) == "float16"
    c = b.aiOnnx.cast([x], "INT32")
    assert b.getTensorDtypeString(c) == "int32"
    t = b.aiOnnx.transpose([x], perm=[1, 0])
    assert b.getTensorShape(t) == [6, 4]
    r = b.reshape_const(b.aiOnnx, [x], [2, 12])
    assert b.getTensorShape(r) == [2, 12]
    g = b.aiGraphcore.scale([x], 2.0)
    assert b.getTensorShape(g) == [4, 6] and b.getTensorDtypeString(g) == "float16"
    with pytest.raises(popart.popart_exception):
        b.getTensorShape("nope")


def test_opset_selection_rules():
    b = popart.Builder()
    assert b.aiOnnx.getOpsetVersion() == popart.defaultAiOnnxOpset == 10
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    b.aiOnnxOpset11.relu([x])
    assert b.aiOnnx.getOpsetVersion() == 11
    with pytest.raises(RuntimeError, match="Invalid opset 'aiOnnxOpset9' selected. Opset for domain ai.onnx already "
                                           "defined as 11"):
        b.aiOnnxOpset9
    b2 = popart.Builder(opsets={"ai.onnx": 9, "ai.graphcore": 1})
    assert b2.aiOnnx.getOpsetVersion() == 9
    model = onnx.load_from_string(b.getModelProto())
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 11)]


def test_generated_ops_follow_onnx_schemas():
    ops10 = [n for n in dir(popart.Builder().aiOnnxOpset10) if not n.startswith("_") and n != "getOpsetVersion"]
    assert 130 <= len(ops10) <= 145                 # PopART binds 137 ops at opset 10
    for name in ("logical_and", "logical_not", "logical_if", "conv", "maxpool", "gemm", "softmax", "nonzero"):
        assert name in ops10
    o10 = popart.Builder().aiOnnxOpset10
    sig = inspect.signature(o10.gemm)
    assert list(sig.parameters) == ["args", "alpha", "beta", "transA", "transB", "debugContext"]
    assert sig.parameters["alpha"].default == 1.0
    assert "num_outputs" in inspect.signature(o10.maxpool).parameters
    assert "num_outputs" not in inspect.signature(o10.topk).parameters
    assert list(inspect.signature(o10.concat).parameters)[:2] == ["args", "axis"]
    assert "clip" in dir(popart.Builder().aiOnnxOpset11) and "celu" in dir(popart.Builder().aiOnnxOpset12)


def test_builder_argument_errors():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    with pytest.raises(popart.popart_exception, match=r"^Add has invalid number of inputs 1. Must be between 2..2"):
        b.aiOnnx.add([x])
    with pytest.raises(popart.popart_exception, match=r"^Unknown tensor 'ghost' \(valid tensors are input\)\."):
        b.aiOnnx.relu(["ghost"])
    with pytest.raises(popart.popart_exception, match="^Unsupported data type for initialized data"):
        b.addInitializedInputTensor(np.zeros(2, np.float64))


def test_annotations():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 2]))
    with b.virtualGraph(1), b.pipelineStage(2):
        m = b.aiOnnx.matmul([x, x])
    assert b.getVirtualGraph(m) == 1 and b.getPipelineStage(m) == 2
    r = b.aiOnnx.relu([m])
    assert not b.hasVirtualGraph(r)
    b.virtualGraph(r, 0)
    assert b.getVirtualGraph(r) == 0
    b.setAvailableMemoryProportion(m, 0.2)
    b.setPartialsType(m, "half")
    b.setSerializeMatMul({m}, "output_channels", 2)
    assert b.getPartialsType(m) == "HALF"
    assert b.getFloatNodeAttribute("__available_memory_proportion", [m]) == pytest.approx(0.2)
    onnx.checker.check_model(onnx.load_from_string(b.getModelProto()))   # "__" annotations pass the checker
    b.addNodeAttribute("myAttr", [1, 2], {r})
    assert b.getInt64VectorNodeAttribute("myAttr", {r}) == [1, 2]
    with pytest.raises(popart.popart_exception, match="^Node already has attribute myAttr."):
        b.addNodeAttribute("myAttr", 3, {r})


def test_load_existing_model_and_extend():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]))
    r = b.aiOnnx.relu([x])
    b2 = popart.Builder(b.getModelProto())
    assert b2.getTensorShape(r) == [3]
    r2 = b2.aiOnnx.relu([r])
    assert r2 == "Relu:0/1"


def test_tensorinfo_and_datatype():
    ti = popart.TensorInfo("FLOAT16", [2, 3])
    assert (ti.shape(), ti.rank(), ti.nelms(), ti.nbytes(), ti.data_type(), ti.data_type_lcase()) == \
        ([2, 3], 2, 6, 12, "FLOAT16", "float16")
    assert ti.dataType() == popart.DataType.FLOAT16
    assert popart.TensorInfo(np.zeros((4,), np.int32)) == popart.TensorInfo("INT32", [4])
    assert popart.TensorInfo(np.float32, [1]).data_type() == "FLOAT"


def test_session_options_defaults():
    o = popart.SessionOptions()
    assert o.virtualGraphMode == popart.VirtualGraphMode.Off
    assert o.constantWeights is True and o.enableSupportedDataTypeCasting is True
    assert o.replicatedGraphCount == 1 and o.enableOutlining and o.outlineThreshold == 1.0
    assert o.executionPhaseSettings.stages == 2 and o.batchSerializationSettings.factor == 0
    o.engineOptions["debug.allowOutOfMemory"] = "true"
    assert o.engineOptions == {"debug.allowOutOfMemory": "true"}
    assert popart.SessionOptions().engineOptions == {}
    o.executionPhaseSettings.phases = 3
    assert o.executionPhaseSettings.phases == 3


def test_device_manager():
    dm = popart.DeviceManager()
    assert dm is popart.DeviceManager()
    d = dm.acquireAvailableDevice(2)
    assert (d.numIpus, d.tilesPerIPU, d.version, d.type) == (2, 1472, "ipu2", popart.DeviceType.Ipu)
    with pytest.raises(popart.popart_exception, match="The number of IPUs requested must be a power of two"):
        dm.acquireAvailableDevice(3)
    assert dm.tryAcquireAvailableDevice(3) is None
    m = dm.createIpuModelDevice({})
    assert (m.numIpus, m.tilesPerIPU, m.type) == (1, 4, popart.DeviceType.IpuModel)
    assert dm.createIpuModelDevice({"ipuVersion": "ipu1"}).version == "ipu1"
    with pytest.raises(popart.popart_exception, match="^Invalid option `bogus' passed to DevicexManager"):
        dm.createIpuModelDevice({"bogus": 1})
    assert dm.createCpuDevice().type == popart.DeviceType.Cpu
    with dm.createOfflineIPUDevice({"numIPUs": 1, "tilesPerIPU": 8}) as off:
        assert off.type == popart.DeviceType.OfflineIpu and off.tilesPerIPU == 8
    assert not off.isAttached


def test_offline_device_compiles_but_does_not_run():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    o = b.aiOnnx.relu([x])
    dev = popart.DeviceManager().createOfflineIPUDevice({"numIPUs": 1, "tilesPerIPU": 4})
    s = popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, [o]), deviceInfo=dev)
    s.prepareDevice()
    with pytest.raises(popart.popart_exception, match="offline IPU"):
        s.run(popart.PyStepIO({x: np.zeros(2, np.float32)}, s.initAnchorArrays()))


def test_helper_made_model_opset13_gemm_and_folding():
    """An exporter-style model: opset 13, Gemm (precise, no kernel needed), Shape->Gather-free folding."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((4, 3)).astype(np.float32)
    Bv = rng.standard_normal((4,)).astype(np.float32)
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("Gemm", ["x", "W", "B"], ["h"], transB=1),
         onnx.helper.make_node("Relu", ["h"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(W, "W"), onnx.numpy_helper.from_array(Bv, "B")])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 13)])
    dev = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8})
    s = popart.InferenceSession(m.SerializeToString(), popart.DataFlow(1, {"y": popart.AnchorReturnType("ALL")}), dev)
    s.prepareDevice()
    assert [(op.op_type, op.lowering) for op in s.ops()] == [("Gemm", "precise"), ("Relu", "precise")]
    anchors = s.initAnchorArrays()
    xv = rng.standard_normal((2, 3)).astype(np.float32)
    s.run(popart.PyStepIO({"x": xv}, anchors))
    np.testing.assert_allclose(anchors["y"], np.maximum(xv @ W.T + Bv, 0), rtol=1e-5, atol=1e-5)
