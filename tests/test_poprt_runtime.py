"""PopRT compiler and runtime on a small real ONNX model (an MLP classifier): compile, export, load,
execute, dynamic batch, futures, PackRunner, overlapped I/O, and bad files."""

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import poprt
from poprt import runtime
from poprt.compiler import Compiler, CompilerOptions

BATCH, D_IN, D_HID, D_OUT = 4, 32, 64, 10


def _mlp(batch=BATCH, seed=0):
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((D_IN, D_HID)).astype(np.float32) * 0.2
    b1 = rng.standard_normal(D_HID).astype(np.float32) * 0.1
    w2 = rng.standard_normal((D_HID, D_OUT)).astype(np.float32) * 0.2
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, D_IN])],
                          [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, D_OUT])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
                           numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    return m, (w1, b1, w2)


def _ref(x, w):
    w1, b1, w2 = w
    z = np.maximum(x @ w1 + b1, 0) @ w2
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    m, w = _mlp()
    path = tmp_path_factory.mktemp("poprt") / "mlp.popef"
    opts = CompilerOptions()
    opts.ipu_version = "ipu21"
    Compiler.compile_and_export(m.SerializeToString(), ["probs"], str(path), opts)
    return path, w


def test_runner_descriptors_and_execute_fill_callers_arrays(exported):
    path, w = exported
    r = runtime.Runner(str(path), runtime.RuntimeConfig())
    (i,), (o,) = r.get_model_inputs(), r.get_model_outputs()
    assert (i.name, i.shape, i.numpy_data_type()) == ("x", [BATCH, D_IN], np.float32)
    assert (o.name, o.shape, o.numpy_data_type()) == ("probs", [BATCH, D_OUT], np.float32)
    assert r.get_execute_inputs() == r.get_model_inputs()
    x = np.random.default_rng(1).standard_normal((BATCH, D_IN)).astype(np.float32)
    out = np.zeros((BATCH, D_OUT), np.float32)
    ret = r.execute({"x": x}, {"probs": out})
    assert ret["probs"] is out
    np.testing.assert_allclose(out, _ref(x, w), rtol=1e-5, atol=1e-6)
    # predicted IPU figures beside host figures, labelled
    p = r.predicted
    assert p.latency_cycles > 0 and p.qps > 0 and p.batch_size == BATCH
    text = r.report()
    assert "predicted IPU (ipu21, batch 4)" in text and "host simulation" in text
    assert r.host_stats()["executes"] == 1


def test_compile_returns_an_executable_the_runner_takes(exported):
    m, w = _mlp()
    exe = Compiler.compile(m, options=CompilerOptions(ipu_version="ipu2"))
    r = runtime.Runner(exe)
    x = np.ones((BATCH, D_IN), np.float32)
    np.testing.assert_allclose(r.execute({"x": x})["probs"], _ref(x, w), rtol=1e-5, atol=1e-6)
    assert r.executable.target["ipu_version"] == "ipu2"


def test_execute_async_futures_from_threads(exported):
    path, w = exported
    r = runtime.Runner(str(path))
    xs = [np.random.default_rng(s).standard_normal((BATCH, D_IN)).astype(np.float32) for s in range(6)]
    outs = [np.zeros((BATCH, D_OUT), np.float32) for _ in xs]
    futs = [r.execute_async({"x": x}, {"probs": o}) for x, o in zip(xs, outs)]
    futs.append(r.executeAsync({"x": xs[0]}))
    for f in futs:
        f.wait()
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(o, _ref(x, w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(futs[-1].get()["probs"], outs[0])
    r.close()


@pytest.mark.parametrize("n", [1, 4, 7])
def test_dynamic_batch_pads_and_splits(exported, n):
    path, w = exported
    cfg = runtime.RuntimeConfig()
    cfg.batching_dim = 0
    r = runtime.Runner(str(path), cfg)
    x = np.random.default_rng(n).standard_normal((n, D_IN)).astype(np.float32)
    out = np.zeros((n, D_OUT), np.float32)
    r.execute({"x": x}, {"probs": out})
    np.testing.assert_allclose(out, _ref(x, w), rtol=1e-5, atol=1e-6)
    assert r.host_stats()["executes"] == -(-n // BATCH)


def test_bad_inputs_raise_runtime_errors(exported):
    path, _ = exported
    r = runtime.Runner(str(path))
    with pytest.raises(RuntimeError, match="missing"):
        r.execute({})
    with pytest.raises(RuntimeError, match="not inputs of the model"):
        r.execute({"x": np.zeros((BATCH, D_IN), np.float32), "y": np.zeros(1)})
    with pytest.raises(RuntimeError, match="the model wants"):
        r.execute({"x": np.zeros((3, D_IN), np.float32)})
    with pytest.raises(RuntimeError, match="not outputs"):
        r.execute({"x": np.zeros((BATCH, D_IN), np.float32)}, {"nope": np.zeros(1)})


def test_corrupt_truncated_and_missing_executables(exported, tmp_path):
    path, _ = exported
    data = path.read_bytes()
    bad = tmp_path / "bad.popef"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(RuntimeError, match="truncated or corrupt"):
        runtime.Runner(str(bad))
    with pytest.raises(RuntimeError, match="No executable file"):
        runtime.Runner(str(tmp_path / "none.popef"))
    # a flipped byte inside the stored arrays: the SHA-256 check
    import zipfile
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("model.onnx")
        off = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size // 2
    b = bytearray(data)
    b[off] ^= 0xFF
    bad.write_bytes(bytes(b))
    with pytest.raises(RuntimeError):
        runtime.Runner(str(bad))


def test_compiler_options_fields_and_errors():
    o = CompilerOptions()
    assert (o.num_ipus, o.ipu_version, o.batches_per_step, o.available_memory_proportion, o.num_io_tiles) == \
        (1, "ipu21", 1, 0.6, 0)
    assert o.partials_type == "half"        # PopRT's default (research/poprt.md: CompilerOptions defaults)
    o.enable_prefetch_datastreams = False       # accepted and stored
    o.time_limit_scheduler = 5
    with pytest.raises(AttributeError, match="no attribute 'not_an_option'"):
        o.not_an_option = 1
    o2 = CompilerOptions.from_dict({"num_iotiles": 32, "batches_per_step": 2, "partials_type": "half"})
    assert (o2.num_io_tiles, o2.batches_per_step, o2.partials_type) == (32, 2, "half")
    m, _ = _mlp()
    with pytest.raises(ValueError, match="ipu_version"):
        Compiler.compile(m, options=CompilerOptions(ipu_version="ipu9"))
    with pytest.raises(ValueError, match="num_io_tiles"):
        Compiler.compile(m, options=CompilerOptions(num_io_tiles=5000))
    with pytest.raises(ValueError, match="enable_pipelining"):
        Compiler.compile(m, options=CompilerOptions(enable_pipelining=True))


def test_batches_per_step_and_io_tiles_change_the_prediction():
    m, w = _mlp()
    base = Compiler.compile(m, options=CompilerOptions())
    io = Compiler.compile(m, options=CompilerOptions(num_io_tiles=64))
    assert io.target["compute_tiles_per_ipu"] == 1472 - 64
    pb, pi = base.prediction, io.prediction
    assert pb.host_io_cycles > 0 and pi.io_to_compute_cycles > 0
    # overlapped I/O: the steady-state period is the larger of compute and I/O, not their sum
    assert pi.batch_period_cycles == pytest.approx(max(pi.compute_cycles + pi.io_to_compute_cycles,
                                                       pi.host_io_cycles))
    assert pi.batch_period_cycles < pi.latency_cycles
    assert pb.batch_period_cycles == pytest.approx(pb.compute_cycles + pb.host_io_cycles)
    # two batches per step: the descriptors stay one batch (PopRT's contract); [2, B, D] is two
    # batches, which share a step
    exe = Compiler.compile(m, options=CompilerOptions(batches_per_step=2))
    r = runtime.Runner(exe)
    assert r.get_model_inputs()[0].shape == [BATCH, D_IN]
    x = np.random.default_rng(3).standard_normal((2, BATCH, D_IN)).astype(np.float32)
    out = r.execute({"x": x})["probs"]
    assert out.shape == (2, BATCH, D_OUT)
    np.testing.assert_allclose(out, _ref(x, w), rtol=1e-5, atol=1e-6)
    r.close()


def test_pack_runner_batches_single_samples_from_threads(exported):
    path, w = exported
    cfg = runtime.PackRunnerConfig(timeout_microseconds=200_000)
    pr = runtime.Runner(str(path), cfg)          # a pack config gives a PackRunner
    assert isinstance(pr, runtime.PackRunner)
    xs = [np.random.default_rng(10 + i).standard_normal(D_IN).astype(np.float32) for i in range(8)]
    results = [None] * len(xs)

    def client(i):
        results[i] = pr.executeAsync({"x": xs[i]}).get()["probs"]
    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(xs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    pr.close()
    for x, res in zip(xs, results):
        np.testing.assert_allclose(res.reshape(-1), _ref(x[None], w).reshape(-1), rtol=1e-5, atol=1e-6)
    assert pr.batches_run < len(xs)          # samples shared batches


def test_device_manager_and_drop_in_module():
    assert runtime.DeviceManager().ipu_hardware_version() == "ipu21"
    assert poprt.runtime is runtime and poprt.compiler.Compiler is Compiler
    assert runtime.DeviceManager().get_device().getTarget().getNumTiles() == 1472


def test_stream_buffering_depth_must_fit_the_io_tiles():
    import popart
    m, _ = _mlp(batch=256)
    # 256 x (32 + 10) fp32 = 43,008 bytes a batch; one I/O tile holds 638,976: 14 batches fit, 15 do not
    Compiler.compile(m, options=CompilerOptions(num_io_tiles=1, stream_buffering_depth=14))
    with pytest.raises(popart.popart_exception, match="Out of memory on the I/O tiles"):
        Compiler.compile(m, options=CompilerOptions(num_io_tiles=1, stream_buffering_depth=15))


def test_two_ipus_and_pipelining():
    import popart
    m, w = _mlp()
    r = runtime.Runner(Compiler.compile(m, options=CompilerOptions(num_ipus=2)))
    assert r.executable.target["num_ipus"] == 2
    x = np.ones((BATCH, D_IN), np.float32)
    np.testing.assert_allclose(r.execute({"x": x})["probs"], _ref(x, w), rtol=1e-5, atol=1e-6)
    with pytest.raises(popart.popart_exception, match="batchesPerStep"):
        Compiler.compile(m, options=CompilerOptions(num_ipus=2, enable_pipelining=True))
    exe = Compiler.compile(m, options=CompilerOptions(num_ipus=2, enable_pipelining=True, batches_per_step=4))
    x4 = np.random.default_rng(0).standard_normal((4, BATCH, D_IN)).astype(np.float32)
    r4 = runtime.Runner(exe)
    np.testing.assert_allclose(r4.execute({"x": x4})["probs"], _ref(x4, w), rtol=1e-5, atol=1e-6)
    # one batch alone: the pipeline reads ahead, the step pads the batches nobody sent
    np.testing.assert_allclose(r4.execute({"x": x4[1]})["probs"], _ref(x4[1], w), rtol=1e-5, atol=1e-6)
    r4.close()
