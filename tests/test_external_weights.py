"""Weights stored beside the model file (ONNX external data) read straight into the IR's arrays
(``popart.ir_weights.read_external_weights``, issue 34): the same values, outputs and
predictions as loading them into the proto first, onnx's bounds and path rules, and the errors
of a missing or short weights file."""

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import popart
from openipu import runner
from openipu.popart.ir_weights import WEIGHT_BYTES, read_external_weights


def _model(dtype=TensorProto.FLOAT, np_dtype=np.float32, width=160):
    """MatMul by a large weight (above WEIGHT_BYTES), Add of a small one, Mul by a Constant."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal([width, width]).astype(np_dtype)
    b = rng.standard_normal([width]).astype(np_dtype)
    c = helper.make_tensor("c", dtype, [width], rng.standard_normal(width).astype(np_dtype).tobytes(), raw=True)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Constant", [], ["k"], value=c), helper.make_node("Mul", ["a", "k"], ["y"])]
    g = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", dtype, [2, 8, width])],
                          [helper.make_tensor_value_info("y", dtype, [2, 8, width])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _save(model, path, location="w.data"):
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location,
              size_threshold=0, convert_attribute=True)


def test_read_external_weights_gives_onnx_values_and_clears_the_proto(tmp_path):
    _save(_model(), tmp_path / "m.onnx")
    ref = onnx.load(str(tmp_path / "m.onnx"))
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    got = read_external_weights(proto, str(tmp_path))
    assert list(got) == ["w"]                              # only the large one becomes an array
    want = {i.name: numpy_helper.to_array(i) for i in ref.graph.initializer}
    np.testing.assert_array_equal(got["w"], want["w"])
    assert got["w"].dtype == np.float32 and not got["w"].flags.writeable
    inits = {i.name: i for i in proto.graph.initializer}
    assert inits["w"].HasField("raw_data") and inits["w"].raw_data == b"" and list(inits["w"].dims) == [160, 160]
    assert inits["w"].data_location == TensorProto.DEFAULT and not inits["w"].external_data
    np.testing.assert_array_equal(numpy_helper.to_array(inits["b"]), want["b"])     # small: into the proto
    const = proto.graph.node[2].attribute[0].t
    assert const.data_location == TensorProto.DEFAULT and len(const.raw_data) == 160 * 4
    assert 160 * 160 * 4 >= WEIGHT_BYTES > 160 * 4


def _run(model_or_path, **kw):
    x = np.random.default_rng(3).standard_normal([2, 8, 160]).astype(np.float32)
    return runner.run_model(model_or_path, inputs={"x": x}, tiles_per_ipu=16, **kw)


@pytest.mark.parametrize("kw", [{}, {"precision": "fp16"}, {"batch_size": 2}])
def test_run_model_from_external_data_equals_the_loaded_proto(tmp_path, kw):
    _save(_model(), tmp_path / "m.onnx")
    from_file = _run(str(tmp_path / "m.onnx"), **kw)
    from_proto = _run(onnx.load(str(tmp_path / "m.onnx")), **kw)      # serialised with its weights
    np.testing.assert_array_equal(from_file.outputs["y"], from_proto.outputs["y"])
    assert (from_file.step_cycles, from_file.tile_bytes_max, from_file.memory_by_category) == \
        (from_proto.step_cycles, from_proto.tile_bytes_max, from_proto.memory_by_category)


def test_session_from_a_path_reads_external_weights(tmp_path):
    _save(_model(), tmp_path / "m.onnx")
    x = np.random.default_rng(4).standard_normal([2, 8, 160]).astype(np.float32)
    outs = []
    for fn in (str(tmp_path / "m.onnx"), onnx.load(str(tmp_path / "m.onnx")).SerializeToString()):
        s = popart.InferenceSession(fnModel=fn, dataFlow=popart.DataFlow(1, {"y": popart.AnchorReturnType("ALL")}),
                                    deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 16}))
        s.prepareDevice()
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO({"x": x}, a))
        outs.append(a["y"])
    np.testing.assert_array_equal(outs[0], outs[1])
    m = onnx.load(str(tmp_path / "m.onnx"))
    w, b, k = (numpy_helper.to_array(t) for t in (m.graph.initializer[0], m.graph.initializer[1],
                                                 m.graph.node[2].attribute[0].t))
    np.testing.assert_allclose(outs[0], (x @ w + b) * k, rtol=1e-5, atol=1e-5)


def test_short_or_missing_weights_file_is_the_runners_error(tmp_path):
    _save(_model(), tmp_path / "m.onnx")
    data = tmp_path / "w.data"
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) - 100)
    with pytest.raises(ValueError, match="weights stored beside it"):
        runner.run_model(str(tmp_path / "m.onnx"), offline=True)
    data.unlink()
    with pytest.raises(ValueError, match="weights stored beside it"):
        runner.run_model(str(tmp_path / "m.onnx"), offline=True)


def test_location_outside_the_model_directory_is_refused(tmp_path):
    (tmp_path / "sub").mkdir()
    _save(_model(), tmp_path / "m.onnx", location="w.data")
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    for e in proto.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../w.data"
    with pytest.raises(Exception, match="points outside the directory"):
        read_external_weights(proto, str(tmp_path / "sub"))


def test_length_not_matching_dims_is_named_by_the_ir(tmp_path):
    """A large initializer whose stored length disagrees with its dims is loaded as onnx loads it,
    and the IR names it (as before external data was read into arrays)."""
    _save(_model(), tmp_path / "m.onnx")
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    w = proto.graph.initializer[0]
    del w.dims[:]
    w.dims.extend([160, 159])
    onnx.save(proto, str(tmp_path / "bad.onnx"))
    with pytest.raises(popart.popart_exception, match="Initializer 'w'.*cannot be read"):
        runner.run_model(str(tmp_path / "bad.onnx"), offline=True)


@pytest.mark.parametrize("dims", [[-160, -160], [2 ** 40, 2 ** 40, 2 ** 40, 160 * 160]])
def test_crafted_dims_of_an_external_weight_get_the_irs_error(tmp_path, dims):
    """Negative dims whose product matches the stored length, and dims whose product wraps int64:
    the weight is not allocated from them, and the IR names it (popart_exception, not numpy's
    error or a huge allocation)."""
    _save(_model(), tmp_path / "m.onnx")
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    w = proto.graph.initializer[0]
    del w.dims[:]
    w.dims.extend(dims)
    onnx.save(proto, str(tmp_path / "bad.onnx"))
    with pytest.raises(popart.popart_exception, match="Initializer 'w'"):
        runner.run_model(str(tmp_path / "bad.onnx"), offline=True)
