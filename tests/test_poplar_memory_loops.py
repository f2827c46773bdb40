"""Variable liveness inside loops (poplar.memory): a variable first written inside a loop body is
live from that write to its last read, not for the whole loop; values carried into a loop are."""

import numpy as np
import onnx
from onnx import helper

import popart


def _relu_chain(n_ops, n_elems):
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(n_ops)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", onnx.TensorProto.FLOAT, [n_elems])],
                          [helper.make_tensor_value_info(f"t{n_ops}", onnx.TensorProto.FLOAT, [n_elems])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m.SerializeToString()


def test_chain_in_batches_per_step_loop_is_not_all_live_at_once():
    n, tiles, ops = 16 * 1024, 16, 6
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": tiles})
    s = popart.InferenceSession(fnModel=_relu_chain(ops, n), deviceInfo=dev,
                                dataFlow=popart.DataFlow(2, {f"t{ops}": popart.AnchorReturnType("ALL")}))
    s.prepareDevice()
    per_tile = n * 4 / tiles
    peak = s._engine.memory.not_always_live_peak.max()
    # the intermediates t1..t6 are written inside the Repeat(batchesPerStep) body: at most an
    # op's input and output are live together, not all six
    assert peak <= 2 * per_tile + 1
    assert peak >= per_tile
