"""PopART executables on file: compileAndExport / loadExecutable / saveExecutable and engine caching
(``enableEngineCaching`` + ``cachePath``, ``POPART_CACHE_DIR``) in openipu's safe executable format."""

import os
import time

import numpy as np
import pytest

import popart


def _model():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
    w = b.addInitializedInputTensor(np.linspace(-1, 1, 8 * 3, dtype=np.float32).reshape(8, 3), "w")
    y = b.aiOnnx.relu([b.aiOnnx.matmul([x, w])])
    b.addOutputTensor(y)
    return b.getModelProto(), y


def _session(opts=None):
    proto, y = _model()
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": 4})
    s = popart.InferenceSession(proto, popart.DataFlow(1, {y: popart.AnchorReturnType("All")}), dev,
                                userOptions=opts)
    return s, y


def _run(s, y):
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 10
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x}, a))
    return a[y], np.maximum(x @ np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3), 0)


def test_compile_and_export_then_load_executable(tmp_path):
    s, y = _session()
    s.compileAndExport(str(tmp_path / "m.popef"))
    s2, y2 = _session()
    s2.loadExecutable(str(tmp_path / "m.popef"))
    s2.prepareDevice()
    out, ref = _run(s2, y2)
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    assert s2.getCycleCount() > 0


def test_load_executable_errors(tmp_path):
    s, _ = _session()
    with pytest.raises(popart.popart_exception, match="No executable file"):
        s.loadExecutable(str(tmp_path / "none.popef"))
    (tmp_path / "bad.popef").write_bytes(b"garbage")
    with pytest.raises(popart.popart_exception, match="not an openipu executable"):
        s.loadExecutable(str(tmp_path / "bad.popef"))
    # an executable of another model
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    y = b.aiOnnx.neg([x])
    other = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
                                    popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 4}))
    other.compileAndExport(str(tmp_path / "other.popef"))
    with pytest.raises(popart.popart_exception, match="another model"):
        s.loadExecutable(str(tmp_path / "other.popef"))


@pytest.mark.parametrize("how", ["options", "env"])
def test_engine_cache_is_written_then_used(tmp_path, monkeypatch, how):
    opts = popart.SessionOptions()
    if how == "options":
        opts.enableEngineCaching = True
        opts.cachePath = str(tmp_path / "cache")
    else:
        monkeypatch.setenv("POPART_CACHE_DIR", str(tmp_path / "cache"))
    s, y = _session(opts)
    s.prepareDevice()
    files = os.listdir(tmp_path / "cache")
    assert len(files) == 1 and files[0].endswith(".popef")
    out1, ref = _run(s, y)
    mtime = os.path.getmtime(tmp_path / "cache" / files[0])
    time.sleep(0.01)
    s2, y2 = _session(opts)
    import openipu.popart.session as sess
    calls = []
    monkeypatch.setattr(sess._SessionBase, "_compile", lambda self: calls.append(1))
    s2.prepareDevice()
    assert calls == []                                  # the program s compiled, selected by the cache
    assert os.path.getmtime(tmp_path / "cache" / files[0]) == mtime
    out2, _ = _run(s2, y2)
    np.testing.assert_array_equal(out1, out2)
    np.testing.assert_allclose(out2, ref, rtol=1e-6)


def test_corrupt_cache_file_is_recompiled(tmp_path):
    opts = popart.SessionOptions()
    opts.enableEngineCaching = True
    opts.cachePath = str(tmp_path)
    s, y = _session(opts)
    s.prepareDevice()
    (f,) = [p for p in tmp_path.iterdir() if p.suffix == ".popef"]
    f.write_bytes(f.read_bytes()[:100])
    s2, y2 = _session(opts)
    s2.prepareDevice()
    out, ref = _run(s2, y2)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_poptorch_executable_cache_uses_the_engine_cache(tmp_path):
    import torch

    import poptorch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU()).eval()
    x = torch.randn(2, 6)
    opts = poptorch.Options().enableExecutableCaching(str(tmp_path / "ptcache"))
    first = poptorch.inferenceModel(m, opts)     # alive: its program is this process's compile
    out1 = first(x)
    files = os.listdir(tmp_path / "ptcache")
    assert len(files) == 1 and files[0].endswith(".popef")
    import openipu.popart.session as sess
    compiled = []
    orig = sess._SessionBase._compile
    sess._SessionBase._compile = lambda self: (compiled.append(1), orig(self))[1]
    try:
        out2 = poptorch.inferenceModel(m, opts)(x)
    finally:
        sess._SessionBase._compile = orig
    assert compiled == []
    torch.testing.assert_close(out1, m(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out2, m(x), rtol=1e-5, atol=1e-6)
    # once no model holds that program, a cache hit compiles the model again (files hold no program)
    del first
    import gc
    gc.collect()
    sess._SessionBase._compile = lambda self: (compiled.append(1), orig(self))[1]
    try:
        out3 = poptorch.inferenceModel(m, opts)(x)
    finally:
        sess._SessionBase._compile = orig
    assert compiled == [1]
    torch.testing.assert_close(out3, out1)
