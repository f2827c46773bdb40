"""Issue 33 ("Trust"): models are checked before they compile, no host kernel crashes the
process, and ``openipu run`` answers every bad flag, path or input file with one line and a
documented exit status (0 ok, 1 error, 2 usage, 3 does not fit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import popart
from openipu import cli, runner
from openipu.popart import model_check

SRC = Path(__file__).resolve().parents[1] / "src"


def _conv_model(path=None, xshape=(1, 3, 8, 8), ks=(3, 3), **attrs):
    w = nh.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["c"], kernel_shape=list(ks), **attrs),
                      h.make_node("Relu", ["c"], ["y"])], "tiny",
                     [h.make_tensor_value_info("x", T.FLOAT, list(xshape))],
                     [h.make_tensor_value_info("y", T.FLOAT, ["a", "b", "c", "d"])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    if path is not None:
        onnx.save(m, str(path))
    return m


def _session(m):
    return popart.InferenceSession(fnModel=m.SerializeToString(),
                                   dataFlow=popart.DataFlow(1, {m.graph.output[0].name:
                                                                popart.AnchorReturnType("ALL")}),
                                   deviceInfo=popart.DeviceManager().createOfflineIPUDevice({"numIPUs": 1}))


# -- models are checked at session creation -------------------------------------------------
@pytest.mark.parametrize("attrs, match", [
    ({"ks": (-2147483648, 1)}, "kernel_shape must only contain positive values"),
    ({"strides": [0, 1]}, "strides must only contain positive values"),
    ({"pads": [-5, 0, 0, 0]}, "pads must not contain negative values"),
    ({"dilations": [0, 1]}, "dilations must only contain positive values"),
    ({"group": 0}, "group = 0 must be at least 1"),
    ({"group": -1}, "group = -1 must be at least 1"),
    ({"group": 2}, "group = 2 does not divide the 3 input channels"),
    ({"xshape": (1, 0, 8, 8)}, "zero-sized channel or spatial dimension"),
    ({"pads": [1 << 40, 0, 0, 0]}, "more than the 2,147,483,647"),
    ({"ks": (9, 3)}, "differs from the spatial dimensions"),
    ({"ks": (3, 3), "dilations": [5, 1]}, "negative dimension"),
    ({"ks": (3, 3), "dilations": [4, 1]}, "window .* is larger than the padded input"),
])
def test_session_refuses_bad_conv_attributes(attrs, match):
    with pytest.raises(popart.popart_exception, match=match):
        _session(_conv_model(**attrs))


def test_session_refuses_axis_beyond_rank_and_names_the_node():
    g = h.make_graph([h.make_node("Softmax", ["x"], ["y"], axis=5, name="sm")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [2, 3])], [h.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    # PopART's own wording (its Op::setup check, issue 35), then the node
    with pytest.raises(popart.popart_exception, match=r"Softmax axis, 5, is outside of acceptable range \[-2, 1\] "
                                                      r"\(node 'sm'\)"):
        _session(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]))


def test_a_wrong_declared_output_shape_is_a_hint_not_an_error():
    """onnxruntime only warns when a model's declared output shape is wrong: the inferred one is used."""
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [7])])
    s = _session(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]))
    assert s._ir.tensors["y"].info.shape() == [2, 3]


def test_session_refuses_oversized_constant_of_shape_before_allocating():
    shape = nh.from_array(np.array([1 << 20, 1 << 20], np.int64), "s")
    g = h.make_graph([h.make_node("ConstantOfShape", ["s"], ["c"]), h.make_node("Add", ["x", "c"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [1])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["a", "b"])],
                     [shape])
    with pytest.raises(popart.popart_exception, match="more than the 2,147,483,647"):
        _session(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]))


def test_kernel_allocation_bound_for_value_driven_sizes():
    import torch
    with pytest.raises(ValueError, match="Range"):
        model_check.check_kernel_allocation("Range", [torch.tensor(0.0), torch.tensor(1e12), torch.tensor(1.0)], {})
    with pytest.raises(ValueError, match="no finite number"):
        model_check.check_kernel_allocation("Range", [torch.tensor(0), torch.tensor(5), torch.tensor(0)], {})
    with pytest.raises(ValueError, match="Tile"):
        model_check.check_kernel_allocation("Tile", [torch.zeros(2, 3), torch.tensor([1 << 20, 1 << 20])], {})
    with pytest.raises(ValueError, match="Expand"):
        model_check.check_kernel_allocation("Expand", [torch.zeros(1), torch.tensor([1 << 16, 1 << 16])], {})
    model_check.check_kernel_allocation("Expand", [torch.zeros(3), torch.tensor([4, 3])], {})     # small: fine


def test_graphcore_ops_pass_the_onnx_checks():
    """onnx skips nodes of domains it does not register (ai.graphcore): Builder models with
    aiGraphcore ops are not refused by the checker or strict shape inference."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    y = b.aiOnnx.relu([b.aiGraphcore.gelu([b.aiGraphcore.scale([x], 2.0)])])
    b.addOutputTensor(y)
    s = popart.InferenceSession(fnModel=b.getModelProto(),
                                dataFlow=popart.DataFlow(1, {y: popart.AnchorReturnType("ALL")}),
                                deviceInfo=popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.ones((2, 3), np.float32)}, a))
    assert a[y].shape == (2, 3)


# -- no host kernel may crash the process ---------------------------------------------------
_CTC = """
import json, sys, numpy as np, popart
T, N, C, S = 4, 2, 5, 6
for label, tl, zi in json.loads(sys.argv[1]):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [T, N, C]), "x")
    tg = b.addInputTensor(popart.TensorInfo("INT32", [N, S]), "tg")
    il = b.addInputTensor(popart.TensorInfo("INT32", [N]), "il")
    tlen = b.addInputTensor(popart.TensorInfo("INT32", [N]), "tl")
    w = b.addInitializedInputTensor(np.ones([T, N, C], np.float32), "w")
    lp = b.aiOnnx.logsoftmax([b.aiOnnx.mul([x, w])], axis=2)
    loss = b.aiGraphcore.ctcloss([lp, tg, il, tlen], popart.ReductionType.Mean, 0, zeroInfinity=bool(zi))
    s = popart.TrainingSession(fnModel=b.getModelProto(),
                               dataFlow=popart.DataFlow(1, {loss: popart.AnchorReturnType("ALL")}), loss=loss,
                               optimizer=popart.ConstSGD(0.1), deviceInfo=popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    feeds = {x: np.random.default_rng(0).standard_normal((T, N, C)).astype(np.float32),
             tg: np.full((N, S), label, np.int32), il: np.array([4, 4], np.int32), tlen: np.array(tl, np.int32)}
    try:
        s.run(popart.PyStepIO(feeds, a))
        print("ran", a[loss], flush=True)
    except popart.popart_exception as e:
        print("refused", e, flush=True)
"""


def test_ctc_bad_targets_are_refused_not_a_crash(tmp_path):
    """A training step through aiGraphcore.ctcloss with bad targets (one subprocess, so that a
    crash is a failure with its signal, not the end of the test run)."""
    cases = [(100_000_000, [6, 6], 1, "outside the classes"),     # torch reads out of bounds: SIGSEGV unguarded
             (-3, [6, 6], 1, "outside the classes"),
             (1, [7, 6], 1, "must be in \\[0, 6\\]"),
             (1, [6, 6], 1, "ran"),                               # target longer than input: loss 0 (zeroInfinity)
             (1, [6, 6], 0, "ran")]                               # ... or inf
    script = tmp_path / "ctc.py"
    script.write_text(_CTC)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    import json
    import re
    p = subprocess.run([sys.executable, str(script), json.dumps([c[:3] for c in cases])], capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-2000:])
    lines = p.stdout.strip().splitlines()
    assert len(lines) == len(cases), p.stdout
    for line, case in zip(lines, cases):
        assert re.search(case[3], line), (case, line)


_INT_DIV = """
import numpy as np, popart
b = popart.Builder()
x = b.addInputTensor(popart.TensorInfo("INT32", [4]), "x")
y = b.addInputTensor(popart.TensorInfo("INT32", [4]), "y")
o = b.aiOnnx.div([x, y])
b.addOutputTensor(o)
s = popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}),
                            deviceInfo=popart.DeviceManager().createIpuModelDevice({}))
s.prepareDevice()
a = s.initAnchorArrays()
s.run(popart.PyStepIO({x: np.array([-2**31, 7, -7, 5], np.int32), y: np.array([-1, 2, 2, -1], np.int32)}, a))
print(a[o].tolist())
"""


def test_integer_minimum_divided_by_minus_one_wraps_instead_of_sigfpe(tmp_path):
    """torch's trunc division traps (SIGFPE) on INT_MIN / -1; ONNX Div on integers must not."""
    script = tmp_path / "div.py"
    script.write_text(_INT_DIV)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert p.stdout.strip() == "[-2147483648, 3, -3, -5]"
    import torch
    from openipu.popart.onnx_ops.elementwise import int_div_trunc
    q = int_div_trunc(torch.tensor([-2**63, 9, -9]), torch.tensor([-1, -2, 4]))
    assert q.tolist() == [-2**63, -4, -2]


# -- the CLI: one line, documented exit statuses --------------------------------------------
@pytest.fixture()
def tiny(tmp_path):
    path = tmp_path / "tiny.onnx"
    _conv_model(path, pads=[1, 1, 1, 1])
    return path


def _run(capsys, *args):
    code = cli.main(["run", *map(str, args)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _one_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("openipu") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("flags, match", [
    (["--tiles-per-ipu", "0"], "between 1 and 1,472"),
    (["--tiles-per-ipu", "-5"], "between 1 and 1,472"),
    (["--tiles-per-ipu", "1000000000"], "between 1 and 1,472"),
    (["--ipu", "ipu1", "--tiles-per-ipu", "1300"], "between 1 and 1,216"),
    (["--num-ipus", "0"], "--num-ipus"),
    (["--num-ipus", "100000"], "--num-ipus"),
    (["--batch-size", "0"], "--batch-size"),
    (["--batches-per-step", "-1"], "--batches-per-step"),
    (["--available-memory-proportion", "1.5"], "--available-memory-proportion"),
    (["--seed", "-1"], "--seed"),
    (["--tiles-per-ipu", "many"], "invalid int value"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_flag_values_are_usage_errors(tiny, capsys, flags, match):
    code, out, err = _run(capsys, tiny, *flags)
    assert code == cli.EXIT_USAGE == 2
    assert match in _one_line(err)


def _npz(tmp_path, name, **arrays):
    p = tmp_path / name
    np.savez(p, **arrays)
    return p


def test_bad_input_files_are_one_line_errors(tiny, tmp_path, capsys):
    good = np.zeros((1, 3, 8, 8), np.float32)
    cases = {
        "empty": (_npz(tmp_path, "empty.npz"), "holds no arrays"),
        "complex": (_npz(tmp_path, "c.npz", x=good.astype(np.complex64)), "no complex type"),
        "object": (_npz(tmp_path, "o.npz", x=np.array([object()], dtype=object)), "Python objects"),
        "string": (_npz(tmp_path, "s.npz", x=np.array(["a"])), "not a number type"),
        "shape": (_npz(tmp_path, "sh.npz", x=np.zeros((2, 3, 8, 8), np.float32)), "the model wants [1, 3, 8, 8]"),
        "float for int": None,
        "name": (_npz(tmp_path, "n.npz", x=good, nope=good), "not an input of the model"),
        "missing": None,
        "missing file": (tmp_path / "nothere.npz", "does not exist"),
        "directory": (tmp_path, "is a directory"),
    }
    notnpz = tmp_path / "not.npz"
    notnpz.write_bytes(b"hello, not a zip")
    cases["not npz"] = (notnpz, "is not an .npz file")
    npy = tmp_path / "one.npy"
    np.save(npy, good)
    cases["npy"] = (npy, "single array")
    import io
    import zipfile
    hdr = io.BytesIO()      # a small file whose header declares a 64 GiB array
    np.lib.format.write_array_header_1_0(hdr, {"descr": "<f4", "fortran_order": False, "shape": (1 << 34,)})
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w") as z:
        z.writestr("x.npy", hdr.getvalue() + b"\0" * 64)
    cases["declared huge"] = (tmp_path / "bomb.npz", "of host memory available")
    data = _npz(tmp_path, "full.npz", x=good).read_bytes()
    trunc = tmp_path / "trunc.npz"
    trunc.write_bytes(data[:len(data) // 2])
    cases["truncated"] = (trunc, "npz")
    for what, case in cases.items():
        if case is None:
            continue
        path, match = case
        code, out, err = _run(capsys, tiny, "--input", path)
        assert code == cli.EXIT_ERROR, (what, err)
        assert match in _one_line(err), (what, err)


def test_input_types_and_missing_inputs(tmp_path, capsys):
    emb = nh.from_array(np.ones((10, 4), np.float32), "emb")
    g = h.make_graph([h.make_node("Gather", ["emb", "ids"], ["e"]), h.make_node("Add", ["e", "x"], ["y"])], "g",
                     [h.make_tensor_value_info("ids", T.INT64, [2]), h.make_tensor_value_info("x", T.FLOAT, [2, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 4])], [emb])
    path = tmp_path / "g.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), str(path))
    x = np.zeros((2, 4), np.float32)
    code, _, err = _run(capsys, path, "--input", _npz(tmp_path, "a.npz", x=x))
    assert code == 1 and "no array for the model input(s) 'ids'" in _one_line(err)
    code, _, err = _run(capsys, path, "--input", _npz(tmp_path, "b.npz", x=x, ids=np.array([0.5, 1.0])))
    assert code == 1 and "is float64; the model wants int64" in _one_line(err)
    code, _, err = _run(capsys, path, "--input", _npz(tmp_path, "c.npz", x=x.astype(np.float64),
                                                       ids=np.array([1, 2], np.int32)))
    assert code == 0, err                       # float64 -> float32 and int32 -> int64 are fine
    # random ids stay in the table's range
    feeds = runner.random_inputs(onnx.load(str(path)), seed=3)
    assert feeds["ids"].dtype == np.int64 and feeds["ids"].max() < 10 and feeds["x"].dtype == np.float32


def test_zero_sized_input_is_refused(tmp_path, capsys):
    path = tmp_path / "z.onnx"
    g = h.make_graph([h.make_node("ReduceMean", ["x"], ["y"], keepdims=0)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [0, 3])], [h.make_tensor_value_info("y", T.FLOAT, [])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), str(path))
    code, out, err = _run(capsys, path)
    assert code == 1 and "zero-sized dimension" in _one_line(err) and not out


def test_output_folder_is_created_and_report_onto_a_file_is_refused(tiny, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "out.npz"
    code, text, err = _run(capsys, tiny, "--output", out)
    assert code == 0 and out.is_file(), err
    code, _, err = _run(capsys, tiny, "--report", tiny)
    assert code == 1 and "is a file" in _one_line(err)
    code, _, err = _run(capsys, tiny, "--output", tmp_path)
    assert code == 1 and "is a directory" in _one_line(err)


def test_offline_builds_no_inputs(tiny, capsys, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("random inputs made for an offline run")
    monkeypatch.setattr(runner, "random_inputs", boom)
    code, out, err = _run(capsys, tiny, "--offline", "--batch-size", "64")
    assert code == 0, err and "latency" in out


def test_not_enough_host_memory_suggests_offline(tiny, capsys, monkeypatch):
    monkeypatch.setattr(runner, "host_memory_available", lambda: 1000)
    code, out, err = _run(capsys, tiny)
    assert code == 1 and "--offline" in _one_line(err) and "host memory" in err
    code, out, err = _run(capsys, tiny, "--offline")            # offline needs no such memory
    assert code == 0, err


def test_unexpected_errors_are_one_line_with_the_traceback_behind_openipu_debug(tiny, capsys, monkeypatch):
    def bug(*a, **k):
        raise KeyError("an openipu bug")
    monkeypatch.setattr(runner, "run_model", bug)
    code, out, err = _run(capsys, tiny)
    assert code == 1 and "unexpected error: KeyError" in _one_line(err) and "OPENIPU_DEBUG=1" in err
    monkeypatch.setenv("OPENIPU_DEBUG", "1")
    code, out, err = _run(capsys, tiny)
    assert code == 1 and "Traceback" in err


def test_help_documents_the_exit_statuses(capsys):
    assert cli.main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    for needle in ("exit status", "0  the model ran", "1  error", "2  usage", "3  the model does not fit",
                   "OPENIPU_DEBUG"):
        assert needle in text, needle


def test_cli_subprocess_bad_model_one_line(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 not a model")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "openipu.cli", "run", str(bad)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "not a readable ONNX model" in p.stderr
