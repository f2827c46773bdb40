"""Bad input gives PopART's exception class and message, and leaves the session usable."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import popart


def _device():
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": 8})


def _model():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    y = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "y")
    o = b.aiOnnx.add([x, y])
    b.addOutputTensor(o)
    return b.getModelProto(), x, y, o


@pytest.fixture(scope="module")
def session():
    proto, x, y, o = _model()
    s = popart.InferenceSession(fnModel=proto, dataFlow=popart.DataFlow(2, {o: popart.AnchorReturnType("ALL")}),
                                deviceInfo=_device())
    s.prepareDevice()
    return s


def _good_run(s):
    anchors = s.initAnchorArrays()
    xv = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    s.run(popart.PyStepIO({"x": xv, "y": xv}, anchors))
    np.testing.assert_array_equal(anchors["Add:0"], 2 * xv)


def test_truncated_file(tmp_path):
    proto, *_ = _model()
    path = tmp_path / "bad.onnx"
    path.write_bytes(proto[: len(proto) // 2])
    df = popart.DataFlow(1, {"Add:0": popart.AnchorReturnType("ALL")})
    with pytest.raises(popart.popart_exception, match=r"^Failed to parse ModelProto from file .*bad\.onnx"):
        popart.InferenceSession(fnModel=str(path), dataFlow=df, deviceInfo=_device())


def test_not_onnx_bytes_and_string():
    df = popart.DataFlow(1, {"Add:0": popart.AnchorReturnType("ALL")})
    with pytest.raises(popart.popart_exception) as e:
        popart.InferenceSession(fnModel="nothing", dataFlow=df, deviceInfo=_device())
    assert e.value.args[0].startswith("Failed to load a ModelProto from the string 'nothing'")
    assert e.value.args[0].endswith("Check that it is either a valid path to an existing onnx model file, or is a "
                                    "valid onnx ModelProto string.")
    with pytest.raises(popart.popart_exception, match="^Failed to load a ModelProto from the string"):
        popart.InferenceSession(fnModel=b"\xff\xfe garbage \x00", dataFlow=df, deviceInfo=_device())


def test_unsupported_op():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4]))
    o = b.aiOnnx.nonzero([x])
    df = popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")})
    with pytest.raises(popart.popart_exception, match=r"^No class for ai\.onnx\.NonZero:0"):
        popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=df, deviceInfo=_device())


def test_double_model_raises_at_prepare():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("DOUBLE", [4]))
    o = b.aiOnnx.relu([x])
    s = popart.InferenceSession(fnModel=b.getModelProto(), deviceInfo=_device(),
                                dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}))
    with pytest.raises(popart.popart_exception, match=r"^Is there a poplar type for DOUBLE\?"):
        s.prepareDevice()


def test_no_anchor_and_unknown_anchor():
    proto, x, y, o = _model()
    with pytest.raises(popart.popart_exception) as e:
        popart.InferenceSession(fnModel=proto, dataFlow=popart.DataFlow(1, {}), deviceInfo=_device())
    assert e.value.args[0] == "User must specify an anchor tensor when doing inference."
    with pytest.raises(popart.popart_exception, match=r"^Anchor tensor `sum' not in Ir Tensors\."):
        popart.InferenceSession(fnModel=proto, dataFlow=popart.DataFlow(1, {"sum": popart.AnchorReturnType("ALL")}),
                                deviceInfo=_device())


def test_no_device():
    proto, x, y, o = _model()
    with pytest.raises(popart.popart_exception, match="^Must pass a valid deviceInfo to InferenceSession"):
        popart.InferenceSession(fnModel=proto, dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}),
                                deviceInfo=None)


def test_run_before_prepare():
    proto, x, y, o = _model()
    s = popart.InferenceSession(fnModel=proto, dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}),
                                deviceInfo=_device())
    with pytest.raises(popart.popart_exception, match="^There is no executatable"):
        s.run(popart.PyStepIO({}, {}))
    with pytest.raises(popart.popart_exception, match="^Must call run before getCycleCount"):
        s.getCycleCount()


def test_missing_input(session):
    anchors = session.initAnchorArrays()
    with pytest.raises(popart.popart_runtime_error) as e:
        session.run(popart.PyStepIO({"x": np.zeros((2, 2, 3), np.float32)}, anchors))
    assert e.value.args[0] == "No tensor y provided in PyStepIO's inputs"
    _good_run(session)


def test_missing_output(session):
    xv = np.zeros((2, 2, 3), np.float32)
    with pytest.raises(popart.popart_runtime_error, match="^No tensor Add:0 provided in PyStepIO's outputs"):
        session.run(popart.PyStepIO({"x": xv, "y": xv}, {}))
    _good_run(session)


def test_wrong_element_count(session):
    anchors = session.initAnchorArrays()
    xv = np.zeros((2, 2, 3), np.float32)
    with pytest.raises(popart.popart_runtime_error) as e:
        session.run(popart.PyStepIO({"x": np.zeros((2, 3), np.float32), "y": xv}, anchors))
    msg = e.value.args[0]
    assert msg.startswith("Unexpected number of input elements for Tensor x. Expected 12, but received 6.\n"
                          "To disable this check at your own risk, use IStepIO::enableRuntimeAsserts.")
    assert "batches per step    = 2" in msg and "Tensor nelms        = 6" in msg
    with pytest.raises(popart.popart_runtime_error, match="^Unexpected number of output elements for Tensor Add:0"):
        session.run(popart.PyStepIO({"x": xv, "y": xv}, {"Add:0": np.zeros(6, np.float32)}))
    _good_run(session)


def test_any_shape_with_right_count_is_accepted(session):
    anchors = session.initAnchorArrays()
    xv = np.arange(12, dtype=np.float32)           # flat: only the element count matters
    session.run(popart.PyStepIO({"x": xv, "y": xv.reshape(4, 3)}, anchors))
    np.testing.assert_array_equal(anchors["Add:0"].reshape(-1), 2 * xv)


def test_wrong_dtype(session):
    anchors = session.initAnchorArrays()
    xv = np.zeros((2, 2, 3), np.float32)
    with pytest.raises(popart.popart_exception) as e:
        session.run(popart.PyStepIO({"x": xv.astype(np.float64), "y": xv}, anchors))
    assert e.value.args[0] == ("Type discrepancy for tensor x. User provided : DOUBLE and expected : FLOAT. "
                               "Consider a custom copy here (as memcpy cannot be used)")
    _good_run(session)


def test_non_contiguous(session):
    anchors = session.initAnchorArrays()
    xv = np.zeros((2, 3, 2), np.float32).transpose(0, 2, 1)
    assert not xv.flags["C_CONTIGUOUS"]
    with pytest.raises(popart.popart_exception) as e:
        session.run(popart.PyStepIO({"x": xv, "y": np.ascontiguousarray(xv)}, anchors))
    assert e.value.args[0].startswith("PyStepIO is unable to use the numpy input array for tensor 'x' as it is not "
                                      "c-contiguous (a data conversion here could have a significant impact on "
                                      "performance and hence is not allowed)")
    _good_run(session)


def test_unknown_and_non_input_stepio_tensors(session):
    anchors = session.initAnchorArrays()
    xv = np.zeros((2, 2, 3), np.float32)
    with pytest.raises(popart.popart_runtime_error, match="^Testing that the buffer provided by user for input Tensor "
                                                          "zz has the correct number of elements, But there is no "
                                                          "Tensor named zz"):
        session.run(popart.PyStepIO({"x": xv, "y": xv, "zz": xv}, anchors))
    with pytest.raises(popart.popart_exception, match="^The tensor 'Add:0' has been provided as one of the inputs to "
                                                      "the stepIO, but it is not registered as one of the inputs"):
        session.run(popart.PyStepIO({"x": xv, "y": xv, "Add:0": xv}, anchors))
    _good_run(session)


def test_dataflow_and_anchor_errors():
    with pytest.raises(popart.popart_exception, match="^'Batches per step' must be greater than zero"):
        popart.DataFlow(0, {})
    with pytest.raises(popart.popart_exception, match="^Must specify return period with option 'EVERYN'"):
        popart.AnchorReturnType("EVERYN")
    with pytest.raises(popart.popart_exception, match="^Invalid anchor return type ID supplied: BOGUS"):
        popart.AnchorReturnType("BOGUS")
    with pytest.raises(popart.popart_exception, match="^A return period should not be supplied"):
        popart.AnchorReturnType("ALL", 2)
    with pytest.raises(popart.popart_exception, match="^Return period must be a factor of the number of batches"):
        popart.DataFlow(4, {"a": popart.AnchorReturnType("EVERYN", 3)})


def test_session_option_conflicts():
    proto, x, y, o = _model()
    df = popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")})
    opts = popart.SessionOptions()
    opts.replicatedGraphCount = 2
    with pytest.raises(popart.popart_exception, match="^enableReplicatedGraphs is false, but replicatedGraphCount > 1"):
        popart.InferenceSession(fnModel=proto, dataFlow=df, deviceInfo=_device(), userOptions=opts)
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = 2
    with pytest.raises(popart.popart_exception, match="^Gradient Accumulation only available when training."):
        popart.InferenceSession(fnModel=proto, dataFlow=df, deviceInfo=_device(), userOptions=opts)
    with pytest.raises(AttributeError):
        opts.noSuchOption = 1


def test_manual_vgraph_all_or_none():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    with b.virtualGraph(0):
        h = b.aiOnnx.relu([x])
    o = b.aiOnnx.relu([h])
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    with pytest.raises(popart.popart_exception, match="^Either all Ops must have their virtual graph ids set, or none"):
        popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}),
                                deviceInfo=_device(), userOptions=opts)


def test_symbolic_input_needs_input_shape_info():
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3])
    g = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 11)])
    df = popart.DataFlow(1, {"y": popart.AnchorReturnType("ALL")})
    with pytest.raises(popart.popart_exception, match=r"^Input tensor 'x' must be specified in InputShapeInfo, as it "
                                                      r"has shape \[batch 3\], which uses an unknown value 'batch'\."):
        popart.InferenceSession(fnModel=m.SerializeToString(), dataFlow=df, deviceInfo=_device())
    isi = popart.InputShapeInfo()
    isi.add("x", popart.TensorInfo("FLOAT", [5, 3]))
    s = popart.InferenceSession(fnModel=m.SerializeToString(), dataFlow=df, deviceInfo=_device(), inputShapeInfo=isi)
    assert s.getInfo("y").shape() == [5, 3]


def test_out_of_memory_exception():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [96, 1024]))
    o = b.aiOnnx.relu([b.aiOnnx.add([x, x])])
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": 1})
    s = popart.InferenceSession(fnModel=b.getModelProto(), deviceInfo=dev,
                                dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}))
    with pytest.raises(popart.OutOfMemoryException) as e:
        s.prepareDevice()
    assert isinstance(e.value, popart.popart_exception)
    assert str(e.value).startswith("Out of memory")
    assert "Memory Usage" in e.value.getSummaryReport()
    assert isinstance(e.value.error, Exception)


def test_precise_only_op_with_unsupported_types(monkeypatch):
    """Mul lowers through popops for floats; with int64 it needs a host kernel (hidden here)."""
    from openipu.popart import graphcore_ops, ir
    monkeypatch.setattr(ir, "find_kernel", lambda d, t: None if t == "Mul" else graphcore_ops.find_kernel(d, t))
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("INT64", [4]))
    o = b.aiOnnx.mul([x, x])
    with pytest.raises(popart.popart_exception, match=r"^No class for ai\.onnx\.Mul:0"):
        popart.InferenceSession(fnModel=b.getModelProto(), deviceInfo=_device(),
                                dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}))
