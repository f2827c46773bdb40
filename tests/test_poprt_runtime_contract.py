"""PopRT's runtime call contract as real clients (Byte MLPerf's IPU backend, PopRT's examples) use it,
from PopRT's documentation (user guide 1.4 "Python API", "Overlap I/O", "Quick start"):

- descriptors: ``shape`` a fresh list at each read, one compiled batch (never x batches_per_step),
  ``numpy_data_type()``;
- ``InputMemoryView`` / ``OutputMemoryView``; results written into the caller's arrays;
- ``batches_per_step``: one batch per ``execute`` from any number of threads, steps shared by the
  concurrent callers, a lone caller served (the step ends at the flush timeout), k batches in one
  call; ``execute_async`` / ``executeAsync`` futures;
- ``RuntimeConfig.timeout_ns`` as int or ``datetime.timedelta``.
"""

import datetime
import threading
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from poprt import runtime
from poprt.compiler import Compiler, CompilerOptions

B, D_IN, D_OUT = 2, 8, 3


def _model():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((D_IN, D_OUT)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "lin",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, D_IN])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, D_OUT])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), w


@pytest.fixture(scope="module")
def step4():
    m, w = _model()
    return Compiler.compile(m, ["y"], CompilerOptions(batches_per_step=4)), w


@pytest.fixture(scope="module")
def step1():
    m, w = _model()
    return Compiler.compile(m, ["y"], CompilerOptions()), w


def _x(seed):
    return np.random.default_rng(seed).standard_normal((B, D_IN)).astype(np.float32)


def test_descriptors_are_one_batch_with_fresh_shape_lists(step4):
    exe, _ = step4
    r = runtime.Runner(exe, runtime.RuntimeConfig())
    (i,), (o,) = r.get_model_inputs(), r.get_model_outputs()
    assert (i.name, i.shape, i.numpy_data_type()) == ("x", [B, D_IN], np.float32)
    assert o.shape == [B, D_OUT] and o.size_in_bytes == B * D_OUT * 4
    shape = o.shape
    shape[0] = 1                                   # Byte MLPerf's benchmark_pack does this
    assert o.shape == [B, D_OUT] and r.get_model_outputs()[0].shape == [B, D_OUT]
    assert [d.name for d in r.get_execute_inputs()] == ["x"]
    r.close()


def test_memory_views_and_results_in_the_callers_arrays(step1):
    exe, w = step1
    r = runtime.Runner(exe)
    x = _x(1)
    out = runtime.OutputMemoryView({"y": np.zeros((B, D_OUT), np.float32)})
    ret = r.execute(runtime.InputMemoryView({"x": x}), out)
    assert ret is out
    np.testing.assert_allclose(out["y"], x @ w, rtol=1e-5, atol=1e-6)
    assert isinstance(runtime.InputMemoryView(), dict)
    r.close()


@pytest.fixture
def device_path(monkeypatch):
    """The Poplar program on the device emulation (its step loop takes the queued calls), not the
    IR executor, which runs each call's batch on its own."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "device")


def test_batches_per_step_one_batch_per_call_from_concurrent_callers(step4, device_path):
    exe, w = step4
    r = runtime.Runner(exe, runtime.RuntimeConfig(timeout_ns=datetime.timedelta(milliseconds=200)))
    xs = [_x(10 + i) for i in range(12)]
    outs = [np.zeros((B, D_OUT), np.float32) for _ in xs]
    errs = []

    def client(i):
        try:
            r.execute({"x": xs[i]}, {"y": outs[i]})
        except Exception as e:  # noqa: BLE001
            errs.append(e)
    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(xs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(o, x @ w, rtol=1e-5, atol=1e-6)
    st = r._stepper
    assert st.steps_run < len(xs)                  # callers' batches shared steps
    assert r.host_stats()["executes"] == len(xs) and r.host_stats()["steps"] == st.steps_run
    r.close()


def test_batches_per_step_lone_caller_async_and_k_batches(step4, device_path):
    exe, w = step4
    r = runtime.Runner(exe, runtime.RuntimeConfig(timeout_ns=5_000_000))
    for i in range(3):                              # fewer than batches_per_step: the flush ends the step
        x = _x(20 + i)
        np.testing.assert_allclose(r.execute({"x": x})["y"], x @ w, rtol=1e-5, atol=1e-6)
    time.sleep(0.5)                                 # no fourth batch: the step ends at the timeout
    assert r._stepper.flushes >= 1
    xs = [_x(30 + i) for i in range(9)]
    outs = [np.zeros((B, D_OUT), np.float32) for _ in xs]
    futs = [r.execute_async({"x": x}, {"y": o}) for x, o in zip(xs, outs)]
    futs.append(r.executeAsync({"x": xs[0]}))
    for f in futs:
        f.wait()
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(o, x @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(futs[-1].get()["y"], xs[0] @ w, rtol=1e-5, atol=1e-6)
    xk = np.stack(xs[:5])                           # [5, B, D]: five batches in one call
    yk = r.execute({"x": xk})["y"]
    assert yk.shape == (5, B, D_OUT)
    np.testing.assert_allclose(yk, xk @ w, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="whole number"):
        r.execute({"x": np.zeros((3, D_IN), np.float32)})
    r.close()
    with pytest.raises(RuntimeError, match="closed"):
        r.execute({"x": xs[0]})


def test_exported_file_with_batches_per_step(tmp_path):
    m, w = _model()
    path = tmp_path / "lin.popef"
    Compiler.compile_and_export(m.SerializeToString(), ["y"], str(path), CompilerOptions(batches_per_step=3))
    r = runtime.Runner(str(path), runtime.RuntimeConfig())
    assert r.get_model_inputs()[0].shape == [B, D_IN] and r.batches_per_step == 3
    from openipu.poprt import compiler
    assert r.executable is compiler._RECENT_EXPORTS[-1]    # this process's compile, not a second one
    x = _x(5)
    np.testing.assert_allclose(r.execute({"x": x})["y"], x @ w, rtol=1e-5, atol=1e-6)
    r.close()


def test_missing_file_names_a_file_differing_in_case(tmp_path):
    (tmp_path / "executable_fp16.popef").write_bytes(b"")
    with pytest.raises(RuntimeError, match="'executable_fp16.popef' is there"):
        runtime.Runner(str(tmp_path / "executable_FP16.popef"), runtime.RuntimeConfig())


def test_a_runner_nobody_holds_is_freed(step4, device_path):
    """Byte MLPerf ``del``s its engine before loading the next batch size: the runner, its step
    thread and its engine go."""
    import gc
    import weakref
    exe, w = step4
    r = runtime.Runner(exe, runtime.RuntimeConfig(timeout_ns=1_000_000))
    x = _x(3)
    np.testing.assert_allclose(r.execute({"x": x})["y"], x @ w, rtol=1e-5, atol=1e-6)
    ref, thread = weakref.ref(r), r._stepper._thread
    del r
    for _ in range(20):
        gc.collect()
        if ref() is None and not thread.is_alive():
            break
        time.sleep(0.2)
    assert ref() is None
    thread.join(2.0)
    assert not thread.is_alive()


def test_ir_executor_runs_each_callers_batch(step4, monkeypatch):
    """With the IR executor (the default) each call's batch runs on its own, from concurrent
    callers, with the same outputs as the program's; the prediction is the compiled program's."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    exe, w = step4
    r = runtime.Runner(exe)
    assert r._fast is not None and r._stepper is None and not hasattr(r, "_engine")
    xs = [_x(30 + i) for i in range(6)]
    outs = [np.zeros((B, D_OUT), np.float32) for _ in xs]
    ts = [threading.Thread(target=r.execute, args=({"x": x}, {"y": o})) for x, o in zip(xs, outs)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(o, x @ w, rtol=1e-5, atol=1e-6)
    assert r.host_stats()["executes"] == len(xs) and r.predicted is exe.prediction
    r.close()
