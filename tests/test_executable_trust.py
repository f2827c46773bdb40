"""Crafted executables through each front end that loads them (PopRT's Runner and serving, PopART's
loadExecutable and engine cache, PopTorch's load): no code runs, no file is written, and the
API's own exception says what is wrong in one line."""

import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import popart
from openipu.poplar import exefile
from openipu.poprt import runtime
from openipu.poprt.compiler import Compiler, CompilerOptions


def _model():
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], np.linspace(-1, 1, 12).astype(np.float32))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def popef(tmp_path_factory):
    path = tmp_path_factory.mktemp("exe") / "m.popef"
    Compiler.compile_and_export(_model(), ["y"], str(path), CompilerOptions(ipu_version="ipu2"))
    return path


def _members(path) -> dict:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i.filename) for i in z.infolist()}


def _rewrite(path, out, **changes):
    """``out``: ``path`` with members replaced (``None`` drops one), hashes recomputed."""
    m = _members(path)
    for k, v in changes.items():
        k = k.replace("__", ".")
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v if isinstance(v, bytes) else json.dumps(v).encode()
    man = json.loads(m["manifest.json"])
    man["members"] = {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)}
                      for n, b in m.items() if n != "manifest.json"}
    m["manifest.json"] = json.dumps(man).encode()
    with zipfile.ZipFile(out, "w") as z:
        for n, b in m.items():
            z.writestr(n, b)
    return out


def test_a_file_selects_the_model_it_holds_and_runs_it(popef):
    r = runtime.Runner(str(popef))
    x = np.ones((2, 4), np.float32)
    out = {"y": np.zeros((2, 3), np.float32)}
    r.execute({"x": x}, out)
    np.testing.assert_allclose(out["y"], x @ np.linspace(-1, 1, 12).astype(np.float32).reshape(4, 3),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("change", [
    {"engine_options": {"autoReport.all": "true", "autoReport.directory": "CANARY"}},
    {"popart_options": {"logDir": "CANARY"}},
    {"popart_options": {"cachePath": "CANARY", "enableEngineCaching": True}},
    {"engine_options": {"debug.outputAllSymbols": "true", "target.saveArchive": "CANARY"}},
    {"num_ipus": "1; import os"}, {"num_ipus": True}, {"available_memory_proportion": 1e308 * 10},
    {"no_such_option": 1}, {"__class__": "x"},
])
def test_poprt_options_that_write_files_or_have_the_wrong_type_are_refused(popef, tmp_path, monkeypatch, change):
    monkeypatch.chdir(tmp_path)
    canary = str(tmp_path / "CANARY")
    rec = json.loads(_members(popef)["poprt.json"])
    rec["options"].update(json.loads(json.dumps(change).replace("CANARY", canary).replace("Infinity", "1e999")))
    bad = _rewrite(popef, tmp_path / "bad.popef", poprt__json=json.dumps(rec).encode())
    with pytest.raises(runtime.PopRTRuntimeError) as e:
        runtime.Runner(str(bad))
    assert len(str(e.value).splitlines()) == 1
    assert not os.path.exists(canary) and os.listdir(tmp_path) == ["bad.popef"]


def test_an_engine_cache_option_in_a_file_writes_no_cache(popef, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rec = json.loads(_members(popef)["poprt.json"])
    rec["options"].update({"enable_engine_caching": True, "cache_path": str(tmp_path / "CANARY")})
    good = _rewrite(popef, tmp_path / "c.popef", poprt__json=json.dumps(rec).encode())
    runtime.Runner(str(good))            # a valid file: it loads (compiling the model again)
    assert os.listdir(tmp_path) == ["c.popef"]


@pytest.mark.parametrize("model", [b"not a protobuf", b"", onnx.helper.make_model(
    helper.make_graph([helper.make_node("Conv", ["x", "x"], ["y"], kernel_shape=[-2147483648, 1])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])).SerializeToString()])
def test_a_crafted_model_in_a_file_is_refused_in_poprt_words(popef, tmp_path, model):
    bad = _rewrite(popef, tmp_path / "bad.popef", model__onnx=model)
    with pytest.raises(runtime.PopRTRuntimeError, match="Cannot load the executable"):
        runtime.Runner(str(bad))


def test_old_format_files_say_compile_again(popef, tmp_path):
    m = _members(popef)
    man = json.loads(m["manifest.json"])
    man["version"] = 1
    with zipfile.ZipFile(tmp_path / "old.popef", "w") as z:
        z.writestr("manifest.json", json.dumps(man))
        z.writestr("objects.json", json.dumps({"root": {"r": 0}, "records": [
            {"t": "obj", "f": {"r": 1}, "a": {"r": 2}}, {"t": "name", "m": "os", "q": "system"},
            {"t": "list", "v": ["touch " + str(tmp_path / "CANARY")]}]}))
    with pytest.raises(runtime.PopRTRuntimeError, match="format version 1.*Compile the model again"):
        runtime.Runner(str(tmp_path / "old.popef"))
    assert not (tmp_path / "CANARY").exists()


def test_serving_refuses_a_crafted_executable_in_one_line(popef, tmp_path):
    rec = json.loads(_members(popef)["poprt.json"])
    rec["options"]["engine_options"] = {"autoReport.directory": str(tmp_path / "CANARY")}
    bad = _rewrite(popef, tmp_path / "bad.popef", poprt__json=json.dumps(rec).encode())
    p = subprocess.run([sys.executable, "-m", "openipu.poprt.serving", str(bad), "--port", "0"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert not (tmp_path / "CANARY").exists()


# -- PopART --------------------------------------------------------------------------------------------
def _session(opts=None):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    y = b.aiOnnx.relu([x])
    b.addOutputTensor(y)
    s = popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {y: popart.AnchorReturnType("ALL")}),
                                deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 4}),
                                userOptions=opts or popart.SessionOptions())
    return s, x, y


def test_popart_load_executable_refuses_crafted_files(tmp_path):
    s, x, y = _session()
    s.compileAndExport(str(tmp_path / "m.popef"))
    good = tmp_path / "m.popef"
    for name, change in (("garbage", {"session__json": b"[" * 100000}),
                         ("no fingerprint", {"session__json": {"session": "inference"}}),
                         ("gadget", {"session__json": {"fingerprint": {"__reduce__": ["os.system", ["touch x"]]}}}),
                         ("missing", {"session__json": None})):
        bad = _rewrite(good, tmp_path / "bad.popef", **change)
        s2, _, _ = _session()
        with pytest.raises(popart.popart_exception, match="Cannot load the executable|another model") as e:
            s2.loadExecutable(str(bad))
        assert len(str(e.value).splitlines()) == 1, name
    assert sorted(os.listdir(tmp_path)) == ["bad.popef", "m.popef"]


def test_a_planted_engine_cache_file_is_compiled_over(tmp_path):
    opts = popart.SessionOptions()
    opts.enableEngineCaching = True
    opts.cachePath = str(tmp_path)
    s, x, y = _session(opts)
    name = s._fingerprint()[:32] + ".popef"
    (tmp_path / name).write_bytes(exefile.dumps("popart.Executable", {"session.json": {"fingerprint": "x" * 64}}))
    s.prepareDevice()                    # a warning, a compile, and a fresh cache file in its place
    assert exefile.read(str(tmp_path / name)).json("session.json")["fingerprint"] == s._fingerprint()
    a = {y: np.zeros((2, 3), np.float32)}
    xv = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    s.run(popart.PyStepIO({x: xv}, a))
    np.testing.assert_array_equal(a[y], np.maximum(xv, 0))


# -- PopTorch ------------------------------------------------------------------------------------------
def test_poptorch_load_refuses_pickles_and_old_files(tmp_path):
    import pickle

    import poptorch
    canary = tmp_path / "CANARY"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {canary}",))
    with zipfile.ZipFile(tmp_path / "old.poptorch", "w") as z:
        z.writestr("poptorch.json", json.dumps({"format": "openipu.poptorch.executable", "version": 1}))
        z.writestr("weights.npz", pickle.dumps(Evil()))
        z.writestr("model.onnx", b"")
    (tmp_path / "pickle.poptorch").write_bytes(pickle.dumps(Evil()))
    for f in ("old.poptorch", "pickle.poptorch"):
        with pytest.raises(poptorch.Error, match="Invalid file"):
            poptorch.load(str(tmp_path / f))
    assert not canary.exists()
