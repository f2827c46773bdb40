"""The PopART IR learns the output shapes ONNX shape inference cannot give (ops after a Graphcore
op it does not know) by probing kernels: large inputs shape-only (meta tensors), small ones and
value-reading kernels on real values."""

import numpy as np
import pytest
from onnx import TensorProto as P
from onnx import helper, numpy_helper

from openipu import popart
from openipu.popart import ir as ir_mod
from openipu.popart import ir_probe

ROWS, COLS = 1024, 1025          # 1,049,600 elements: above PROBE_ELEMENTS_LIMIT (2**20)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.graphcore", 1)])


def _ir(m, anchors):
    df = popart.DataFlow(1, {a: popart.AnchorReturnType("All") for a in anchors})
    return ir_mod.Ir(m.SerializeToString(), df, None, popart.SessionOptions())


@pytest.fixture
def probes(monkeypatch):
    seen = []
    real = ir_mod.probe

    def spy(kernel, in_infos, attrs, opset, const_values=None, fill="zeros"):
        seen.append((kernel.op_type, fill))
        return real(kernel, in_infos, attrs, opset, const_values, fill)
    monkeypatch.setattr(ir_mod, "probe", spy)          # probes on values
    monkeypatch.setattr(ir_probe, "probe", spy)        # shape-only probes
    return seen


def test_large_ops_after_a_graphcore_op_are_probed_shape_only(probes):
    w = numpy_helper.from_array(np.ones((COLS, 8), np.float32), "w")
    m = _model([helper.make_node("Scale", ["x"], ["y"], domain="ai.graphcore", scale=2.0),
                helper.make_node("MatMul", ["y", "w"], ["z"]),
                helper.make_node("Relu", ["z"], ["r"])],
               [helper.make_tensor_value_info("x", P.FLOAT, [ROWS, COLS])],
               [helper.make_tensor_value_info("r", P.FLOAT, ["a", "b"])], [w])
    ir = _ir(m, ["r"])
    assert ir.tensors["z"].info.shape() == [ROWS, 8]
    assert ir.tensors["r"].info.shape() == [ROWS, 8]
    assert ir.tensors["z"].info.data_type() == "FLOAT"
    assert ("MatMul", "meta") in probes
    assert ("MatMul", "zeros") not in probes and ("MatMul", "arange") not in probes
    assert ("Relu", "zeros") in probes          # [1024, 8]: small, probed on values as before


def test_a_large_op_that_reads_values_is_probed_on_values(probes):
    # Reshape by a shape given at run time: the kernel reads the shape's values, which meta
    # tensors do not have, so the probe falls back to values (zeros, then other values)
    m = _model([helper.make_node("Scale", ["x"], ["y"], domain="ai.graphcore", scale=2.0),
                helper.make_node("Reshape", ["y", "s"], ["z"])],
               [helper.make_tensor_value_info("x", P.FLOAT, [ROWS, COLS]),
                helper.make_tensor_value_info("s", P.INT64, [2])],
               [helper.make_tensor_value_info("z", P.FLOAT, ["a", "b"])])
    _ir(m, ["z"])
    assert [f for op, f in probes if op == "Reshape"] == ["meta", "meta", "zeros", "arange"]
