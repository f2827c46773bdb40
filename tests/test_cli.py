"""``openipu run`` (the main job) on small ONNX models: output, prediction block, exit codes."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from openipu import cli, runner


def _mlp(path, batch=8, hidden=512, seed=0):
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((256, hidden)).astype(np.float32) / 16
    w2 = rng.standard_normal((hidden, 10)).astype(np.float32) / 16
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "W2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return w1, w2


def test_run_prints_outputs_prediction_and_host_time(tmp_path, capsys):
    model = tmp_path / "mlp.onnx"
    w1, w2 = _mlp(model)
    x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    code = cli.main(["run", str(model), "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"),
                     "--report", str(tmp_path / "rep")])
    text = capsys.readouterr().out
    assert code == 0
    for needle in ("Outputs", "Prediction for the IPU", "not host time", "latency", "throughput",
                   "time shares", "tile memory", "fits: yes", "Host (this machine"):
        assert needle in text, needle
    with np.load(tmp_path / "out.npz") as f:
        np.testing.assert_allclose(f["y"], np.maximum(x @ w1, 0) @ w2, rtol=1e-4, atol=1e-5)
    assert (tmp_path / "rep" / "summary.txt").read_text().strip()


def test_run_options_batch_bps_fp16_two_ipus(tmp_path):
    model = tmp_path / "mlp.onnx"
    _mlp(model)
    res = runner.run_model(str(model), batch_size=32, batches_per_step=3, precision="fp16", num_ipus=2, ipu="bow")
    assert res.fits and res.outputs["y"].shape == (3, 32, 10) and res.outputs["y"].dtype == np.float16
    assert res.batch_size == 32 and res.num_ipus == 2 and res.target == "bow"
    assert res.by_category["global_exchange"] > 0          # the shards talk over IPU-Links
    assert res.throughput == pytest.approx(96 / res.step_seconds)


def test_model_that_does_not_fit_names_worst_tiles_and_suggests(tmp_path, capsys):
    model = tmp_path / "big.onnx"
    _mlp(model, hidden=4096)
    code = cli.main(["run", str(model), "--tiles-per-ipu", "4"])
    text = capsys.readouterr().out
    assert code == 3
    assert "fits: NO" in text and "worst tiles" in text and "tile 0" in text
    assert "latency" in text and "if it fitted" in text           # the prediction is still made
    assert "--num-ipus 2" in text and "--precision fp16" in text
    assert "--available-memory-proportion 0.3 " in text           # half the default
    assert cli.main(["run", str(model), "--tiles-per-ipu", "4", "--available-memory-proportion", "0.2"]) == 3
    assert "--available-memory-proportion 0.1 " in capsys.readouterr().out


def test_bad_model_path_and_bad_input_name(tmp_path, capsys):
    assert cli.main(["run", str(tmp_path / "missing.onnx")]) == 1
    assert "light_resnet50" in capsys.readouterr().err
    model = tmp_path / "mlp.onnx"
    _mlp(model)
    np.savez(tmp_path / "in.npz", nope=np.zeros(3, np.float32))
    assert cli.main(["run", str(model), "--input", str(tmp_path / "in.npz")]) == 1
    assert "not an input of the model" in capsys.readouterr().err


def test_batch_size_follows_a_hard_coded_reshape(tmp_path):
    """--batch-size rewrites a Reshape whose constant shape starts with the old batch (to 0)."""
    w = np.random.default_rng(2).standard_normal((8, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["flat"]), helper.make_node("MatMul", ["flat", "W"], ["y"])], "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(np.array([1, 8], np.int64), "shape"), numpy_helper.from_array(w, "W")])
    path = tmp_path / "r.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    x = np.random.default_rng(3).standard_normal((5, 8, 1, 1)).astype(np.float32)
    res = runner.run_model(str(path), batch_size=5, inputs={"x": x})
    np.testing.assert_allclose(res.outputs["y"], x.reshape(5, 8) @ w, rtol=1e-5, atol=1e-6)


def test_a_model_popart_rejects_is_reported_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not an ONNX model")
    assert cli.main(["run", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("openipu run:") and "Traceback" not in err
