"""InferenceSession end to end: the seed example, anchors and batches per step, MatMul / Gemm,
fp16, two-IPU sharding, replication, weights I/O, generic lowering and costs."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch

import popart
from openipu.popart.dataflow import anchor_shape
from openipu.popart.lowering import generic
from openipu.popart.onnx_ops import OpKernel


def _device(ipus=1, tiles=16):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus, "tilesPerIPU": tiles})


def _session(proto, anchors, bps=1, device=None, opts=None, **kw):
    df = popart.DataFlow(bps, anchors)
    s = popart.InferenceSession(fnModel=proto, dataFlow=df, deviceInfo=device or _device(), userOptions=opts, **kw)
    s.prepareDevice()
    return s


def test_seed_add_model_from_file(tmp_path):
    """The seed: a Builder-made add.onnx (x + y, float32 [3,4,5]) run from a file on an acquired IPU."""
    builder = popart.Builder()
    info = popart.TensorInfo("FLOAT", [3, 4, 5])
    x = builder.addInputTensor(info, "x")
    y = builder.addInputTensor(info, "y")
    o = builder.aiOnnx.add([x, y], "sum")       # debugContext names the node; the tensor is "Add:0"
    builder.addOutputTensor(o)
    path = str(tmp_path / "add.onnx")
    with open(path, "wb") as f:
        f.write(builder.getModelProto())
    out_id = onnx.load(path).graph.output[0].name
    assert (x, y, o, out_id) == ("x", "y", "Add:0", "Add:0")
    session = popart.InferenceSession(fnModel=path,
                                      dataFlow=popart.DataFlow(1, {out_id: popart.AnchorReturnType("FINAL")}),
                                      deviceInfo=popart.DeviceManager().acquireAvailableDevice(numIpus=1))
    anchors = session.initAnchorArrays()
    session.prepareDevice()
    rng = np.random.default_rng(0)
    xv, yv = rng.random((3, 4, 5), np.float32), rng.random((3, 4, 5), np.float32)
    session.run(popart.PyStepIO({"x": xv, "y": yv}, anchors))
    np.testing.assert_array_equal(anchors[out_id], xv + yv)
    assert anchors[out_id].shape == (3, 4, 5) and anchors[out_id].dtype == np.float32
    assert session.getCycleCount() > 0
    assert [(op.op_type, op.lowering) for op in session.ops()] == [("Add", "precise")]
    assert "Execution" in session.getSummaryReport() or "Memory" in session.getSummaryReport()
    assert session._engine is not None and session._engine.memory is not None


def _add_relu_model(shape=(2, 3)):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", list(shape)))
    y = b.addInputTensor(popart.TensorInfo("FLOAT", list(shape)))
    r = b.aiOnnx.relu([b.aiOnnx.add([x, y])])
    b.addOutputTensor(r)
    return b.getModelProto(), x, y, r


@pytest.mark.parametrize("bps", [1, 4])
@pytest.mark.parametrize("art", [("ALL",), ("FINAL",), ("SUM",), ("EVERYN", 2), ("EVERYN", 1)])
def test_anchor_return_types(bps, art):
    proto, x, y, r = _add_relu_model()
    if art[0] == "EVERYN" and art[1] > bps:
        with pytest.raises(popart.popart_exception, match="Return period must be <= to the number of batches"):
            popart.DataFlow(bps, {r: popart.AnchorReturnType(*art)})
        return
    s = _session(proto, {r: popart.AnchorReturnType(*art), x: popart.AnchorReturnType("ALL")}, bps=bps)
    anchors = s.initAnchorArrays()
    rng = np.random.default_rng(1)
    xv = rng.standard_normal((bps, 2, 3)).astype(np.float32).reshape([bps, 2, 3] if bps > 1 else [2, 3])
    yv = rng.standard_normal(xv.shape).astype(np.float32)
    s.run(popart.PyStepIO({x: xv, y: yv}, anchors))
    per_batch = np.maximum(xv + yv, 0).reshape(bps, 2, 3)
    want = {"ALL": per_batch, "FINAL": per_batch[-1], "SUM": per_batch.sum(0),
            "EVERYN": per_batch[art[-1] - 1::art[-1]] if art[0] == "EVERYN" else None}[art[0]]
    expect_shape = anchor_shape(popart.AnchorReturnType(*art), [2, 3], bps, 1, 1)
    assert list(anchors[r].shape) == expect_shape
    np.testing.assert_allclose(anchors[r], want.reshape(expect_shape), rtol=1e-6)
    np.testing.assert_array_equal(anchors[x], xv)          # an input may be anchored


def test_anchor_shape_rules():
    A = popart.AnchorReturnType
    assert anchor_shape(A("ALL"), [2, 3], 1, 1, 1) == [2, 3]
    assert anchor_shape(A("ALL"), [2, 3], 4, 1, 1) == [4, 2, 3]
    assert anchor_shape(A("ALL"), [2, 3], 4, 3, 2) == [4, 3, 2, 2, 3]
    assert anchor_shape(A("ALL"), [1, 3], 1, 1, 2) == [2, 1, 3]      # only added leading dims drop
    assert anchor_shape(A("EVERYN", 2), [5], 4, 1, 1) == [2, 5]
    assert anchor_shape(A("EVERYN", 4), [5], 4, 1, 1) == [5]
    assert anchor_shape(A("FINAL"), [5], 8, 2, 1) == [5]
    assert anchor_shape(A("SUM"), [5], 8, 1, 4) == [4, 5]
    with pytest.raises(RuntimeError, match="Invalid anchor period"):
        anchor_shape(A("EVERYN", 3), [5], 4, 1, 1)


@pytest.mark.parametrize("shapes", [((4, 8), (8, 5)), ((2, 3, 8), (8, 6)), ((8,), (8, 3)), ((2, 4, 8), (2, 8, 3)),
                                    ((3, 1, 2, 5), (4, 5, 2))])
def test_matmul_against_numpy(shapes):
    a_shape, b_shape = shapes
    rng = np.random.default_rng(2)
    w = rng.standard_normal(b_shape).astype(np.float32)
    b = popart.Builder()
    a = b.addInputTensor(popart.TensorInfo("FLOAT", list(a_shape)))
    wid = b.addInitializedInputTensor(w)
    o = b.aiOnnx.matmul([a, wid])
    b.addOutputTensor(o)
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL")})
    anchors = s.initAnchorArrays()
    av = rng.standard_normal(a_shape).astype(np.float32)
    s.run(popart.PyStepIO({a: av}, anchors))
    np.testing.assert_allclose(anchors[o], np.matmul(av, w), rtol=1e-5, atol=1e-5)
    assert s.ops()[0].lowering == "precise"


def test_gemm_precise_without_kernel():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((5, 4)).astype(np.float32)
    B = rng.standard_normal((6, 4)).astype(np.float32)
    C = rng.standard_normal((6,)).astype(np.float32)
    b = popart.Builder()
    a = b.addInputTensor(popart.TensorInfo("FLOAT", [5, 4]))
    o = b.aiOnnx.gemm([a, b.addInitializedInputTensor(B), b.addInitializedInputTensor(C)], alpha=0.5, beta=2.0,
                      transB=1)
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL")})
    anchors = s.initAnchorArrays()
    s.run(popart.PyStepIO({a: A}, anchors))
    np.testing.assert_allclose(anchors[o], 0.5 * A @ B.T + 2.0 * C, rtol=1e-5, atol=1e-5)


def test_fp16_model_with_partials():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 8)).astype(np.float16)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT16", [4, 16]))
    m = b.aiOnnx.matmul([x, b.addInitializedInputTensor(w)])
    b.setPartialsType(m, "HALF")
    b.setAvailableMemoryProportion(m, 0.3)
    r = b.aiOnnx.relu([m])
    s = _session(b.getModelProto(), {r: popart.AnchorReturnType("FINAL")}, bps=2)
    anchors = s.initAnchorArrays()
    assert anchors[r].dtype == np.float16
    xv = rng.standard_normal((2, 4, 16)).astype(np.float16)
    s.run(popart.PyStepIO({x: xv}, anchors))
    ref = np.maximum(xv[-1].astype(np.float32) @ w.astype(np.float32), 0)
    np.testing.assert_allclose(anchors[r].astype(np.float32), ref, rtol=2e-2, atol=2e-2)
    assert [op.lowering for op in s.ops()] == ["precise", "precise"]


def test_two_ipu_sharded_model():
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((8, 8)).astype(np.float32)
    w2 = rng.standard_normal((8, 4)).astype(np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 8]))
    with b.virtualGraph(0):
        h = b.aiOnnx.relu([b.aiOnnx.matmul([x, b.addInitializedInputTensor(w1)])])
    with b.virtualGraph(1):
        o = b.aiOnnx.matmul([h, b.addInitializedInputTensor(w2)])
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL")}, device=_device(2, 8), opts=opts)
    assert [op.vgraph for op in s.ops()] == [0, 0, 1]
    anchors = s.initAnchorArrays()
    xv = rng.standard_normal((2, 8)).astype(np.float32)
    s.run(popart.PyStepIO({x: xv}, anchors))
    np.testing.assert_allclose(anchors[o], np.maximum(xv @ w1, 0) @ w2, rtol=1e-5, atol=1e-5)
    # the second matmul's tiles are on IPU 1 (global tiles 8..15) and an inter-IPU copy exists
    steps = s._engine._compiled.compiler.steps
    assert any(st.name == "Copy" for st in steps)
    g = s._lowered.graph
    out_tiles = g.tile_of_elements(s._lowered.graph._state.host_reads.get(o) or _anchor_tensor(s, o))
    assert (out_tiles >= 8).all()
    run = s._engine._runs[-1]
    assert (run["cycles_per_ipu"] > 0).all()


def _anchor_tensor(s, tid):
    step = s._engine._compiled.compiler.steps
    for st in step:
        if getattr(getattr(st, "stream", None), "handle", None) == f"d2h:{tid}":
            acc = st.src
            return _tensor_from_accessor(s, acc)
    raise AssertionError("no anchor copy")


def _tensor_from_accessor(s, acc):
    return acc.t            # the view the step reads


def test_replicated_graphs():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]))
    o = b.aiOnnx.relu([x])
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 2
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL")}, bps=2, device=_device(2, 4), opts=opts)
    anchors = s.initAnchorArrays()
    assert anchors[o].shape == (2, 2, 3)
    xv = np.arange(-6, 6, dtype=np.float32).reshape(2, 2, 3)
    s.run(popart.PyStepIO({x: xv}, anchors))
    np.testing.assert_array_equal(anchors[o], np.maximum(xv, 0))


def test_weights_io_round_trip(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [1, 3]))
    wid = b.addInitializedInputTensor(w)
    o = b.aiOnnx.matmul([x, wid])
    opts = popart.SessionOptions()
    opts.constantWeights = False
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL")}, opts=opts)
    anchors = s.initAnchorArrays()
    xv = np.ones((1, 3), np.float32)
    s.run(popart.PyStepIO({x: xv}, anchors))
    np.testing.assert_array_equal(anchors[o], xv @ w)
    w2 = -2 * w
    s.writeWeights(popart.PyWeightsIO({wid: w2}))
    s.weightsFromHost()
    s.run(popart.PyStepIO({x: xv}, anchors))
    np.testing.assert_array_equal(anchors[o], xv @ w2)
    s.weightsToHost()
    back = np.zeros_like(w)
    s.readWeights(popart.PyWeightsIO({wid: back}))
    np.testing.assert_array_equal(back, w2)
    path = str(tmp_path / "model.onnx")
    s.modelToHost(path)
    saved = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    np.testing.assert_array_equal(saved[wid], w2)



@pytest.mark.parametrize("constant", [True, False])
def test_large_weights_held_once_outside_the_proto(tmp_path, constant):
    """A weight of WEIGHT_BYTES or more is read out of a proto the session parsed (its raw_data
    cleared), still checked and shape-inferred, run in fp16, and written back by modelToHost."""
    from openipu.popart.ir_weights import WEIGHT_BYTES
    rng = np.random.default_rng(0)
    n = WEIGHT_BYTES // 2 // 64          # fp16
    w = rng.standard_normal((64, n)).astype(np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT16", [2, 64]))
    wid = b.addInitializedInputTensor(w.astype(np.float16))
    o = b.aiOnnx.matmul([x, wid])                     # its shape inferred from the weight's dims only
    opts = popart.SessionOptions()
    opts.constantWeights = constant
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL")}, opts=opts)
    init = next(i for i in s._ir.model.graph.initializer if i.name == wid)
    assert len(init.raw_data) == 0 and s._ir.weights[wid].shape == (64, n)
    anchors = s.initAnchorArrays()
    xv = rng.standard_normal((2, 64)).astype(np.float16)
    s.run(popart.PyStepIO({x: xv}, anchors))
    ref = xv.astype(np.float32) @ w.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(anchors[o].astype(np.float32), ref, rtol=1e-2, atol=1e-1)
    path = str(tmp_path / "model.onnx")
    s.modelToHost(path)
    saved = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    np.testing.assert_array_equal(saved[wid], w.astype(np.float16))

def test_constant_weights_fold_and_write_error():
    w = np.ones((3, 2), np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [1, 3]))
    wid = b.addInitializedInputTensor(w)
    one = b.aiOnnx.constant(np.array(1.0, np.float32))
    w2 = b.aiOnnx.add([wid, one])                 # folded on the host: all inputs constant
    o = b.aiOnnx.matmul([x, w2])
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL")})
    assert [op.op_type for op in s.ops()] == ["MatMul"]
    with pytest.raises(popart.popart_exception, match="Cannot call writeWeights when constantWeights is set"):
        s.writeWeights(popart.PyWeightsIO({wid: w}))
    anchors = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.ones((1, 3), np.float32)}, anchors))
    np.testing.assert_array_equal(anchors[o], np.full((1, 2), 6.0, np.float32))


def test_shape_is_folded_and_reshape_runs():
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    sh = b.aiOnnx.shape([x])
    o = b.aiOnnx.add([x, b.aiOnnx.constant(np.ones((2, 3), np.float32))])
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL"), sh: popart.AnchorReturnType("ALL")})
    assert s.getInfo(sh).data_type() == "INT64" and s.getInfo(sh).shape() == [2]
    anchors = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.zeros((2, 3), np.float32)}, anchors))
    np.testing.assert_array_equal(anchors[sh], [2, 3])
    assert anchors[sh].dtype == np.int64


def test_graphcore_ops_run_generic():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 5]))
    g = b.aiGraphcore.expm1([x])
    sc = b.aiGraphcore.scale([g], 3.0)
    s = _session(b.getModelProto(), {sc: popart.AnchorReturnType("ALL")})
    assert [op.lowering for op in s.ops()] == ["generic", "generic"]
    anchors = s.initAnchorArrays()
    xv = np.linspace(-3, 3, 20, dtype=np.float32).reshape(4, 5)
    s.run(popart.PyStepIO({x: xv}, anchors))
    ref = 3 * torch.expm1(torch.from_numpy(xv)).numpy()
    np.testing.assert_allclose(anchors[sc], ref, rtol=1e-5, atol=1e-6)


def test_int64_input_cast_to_int_on_device():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("INT64", [4]))
    o = b.aiOnnx.relu([x])
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL")})
    assert s._lowered.graph._state.streams[s._lowered.inputs[x]].type == popart_poplar_int()
    anchors = s.initAnchorArrays()
    assert anchors[o].dtype == np.int64
    s.run(popart.PyStepIO({x: np.array([-2, -1, 0, 7], np.int64)}, anchors))
    np.testing.assert_array_equal(anchors[o], [0, 0, 0, 7])


def popart_poplar_int():
    from openipu import poplar
    return poplar.INT


def test_generic_cost_shape():
    """Cycles grow with flops and bytes; a flops hint raises the estimate."""
    from openipu import poplar
    target = poplar.IPUModel("ipu2").createDevice().getTarget()
    counts = np.array([100, 200])
    base = generic.generic_cycles(counts, 300, 300.0, 2400.0, poplar.FLOAT, target)
    assert base[1] > base[0] > generic.GENERIC_VERTEX_OVERHEAD_CYCLES
    more = generic.generic_cycles(counts, 300, 3000.0, 2400.0, poplar.FLOAT, target)
    assert (more > base).all()
    half = generic.generic_cycles(counts, 300, 3000.0, 2400.0, poplar.HALF, target)
    assert (half < more).all()          # 4 halves per vector vs 2 floats


def test_generic_kernel_flops_change_cycles(monkeypatch):
    """The same graph costs more when the op's kernel reports more flops."""
    from openipu.popart import graphcore_ops
    proto, x, y, r = _add_relu_model((64, 64))

    def cycles():
        s = _session(proto, {r: popart.AnchorReturnType("ALL")})
        anchors = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: np.ones((64, 64), np.float32), y: np.ones((64, 64), np.float32)}, anchors))
        return s.getCycleCount()
    from openipu.popart import lowering
    lowering._load()
    monkeypatch.delitem(lowering._PRECISE, ("", "Relu"))      # Relu through the generic lowering
    c1 = cycles()
    k = graphcore_ops.find_kernel("", "Relu")
    heavy = OpKernel(k.domain, k.op_type, k.fn, lambda i, o, a: 1000.0 * np.prod(o[0]))
    monkeypatch.setattr(graphcore_ops, "find_kernel",
                        lambda d, t: heavy if t == "Relu" else graphcore_ops.get_kernel(d, t))
    monkeypatch.setattr(generic, "find_kernel", graphcore_ops.find_kernel)
    c2 = cycles()
    assert c2 > c1 + 1000


def test_callbacks_stepio():
    proto, x, y, r = _add_relu_model()
    s = _session(proto, {r: popart.AnchorReturnType("ALL")}, bps=2)
    data = {x: np.arange(12, dtype=np.float32).reshape(2, 2, 3) - 6, y: np.ones((2, 2, 3), np.float32)}
    got, pos = [], {x: 0, y: 0}
    out = np.zeros((2, 3), np.float32)

    def in_cb(tid, prefetch):
        v = data[tid][pos[tid]]
        pos[tid] += 1
        return v

    def out_cb(tid):
        return out

    s.run(popart.PyStepIOCallback(in_cb, lambda t: None, out_cb, lambda t: got.append(out.copy())))
    np.testing.assert_array_equal(np.stack(got), np.maximum(data[x] + data[y], 0))


def test_progress_bar_only_on_terminal(capfd):
    proto, x, y, r = _add_relu_model()
    _session(proto, {r: popart.AnchorReturnType("ALL")})
    assert "Graph compilation" not in capfd.readouterr().err


def test_progress_bar_on_terminal(monkeypatch):
    import io
    import sys

    class Tty(io.StringIO):
        def isatty(self):
            return True
    fake = Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    proto, x, y, r = _add_relu_model()
    _session(proto, {r: popart.AnchorReturnType("ALL")})
    text = fake.getvalue()
    assert "Graph compilation" in text and "100%" in text


def test_logging_env(monkeypatch, capfd):
    monkeypatch.setenv("POPART_LOG_LEVEL", "INFO")
    popart.getLogger().info("hello from the test")
    err = capfd.readouterr().err
    assert "popart:python" in err and "hello from the test" in err
    monkeypatch.setenv("POPART_LOG_LEVEL", "OFF")
    popart.getLogger().info("quiet")
    assert "quiet" not in capfd.readouterr().err


def test_drop_in_module_and_submodules():
    import popart.session
    assert popart.session.InferenceSession is popart.InferenceSession
    assert popart.Builder is popart.builder.Builder
    assert os.path.basename(popart.__file__) == "__init__.py"
    assert ("ai.onnx", "MatMul") in popart.getSupportedOperations(False)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.int8, np.uint8, np.int16, np.uint16,
                                   np.uint32])
def test_add_over_element_types(dtype):
    b = popart.Builder()
    name = popart.TensorInfo(np.zeros(1, dtype)).data_type()
    x = b.addInputTensor(popart.TensorInfo(name, [2, 5]))
    y = b.addInputTensor(popart.TensorInfo(name, [5]))
    o = b.aiOnnx.add([x, y])
    s = _session(b.getModelProto(), {o: popart.AnchorReturnType("ALL")}, bps=2)
    anchors = s.initAnchorArrays()
    assert anchors[o].dtype == dtype and anchors[o].shape == (2, 2, 5)
    xv = (np.arange(20) % 7).astype(dtype).reshape(2, 2, 5)
    yv = (np.arange(10) % 3 + 1).astype(dtype).reshape(2, 5)
    s.run(popart.PyStepIO({x: xv, y: yv}, anchors))
    np.testing.assert_array_equal(anchors[o], xv + yv[:, None, :])
    expect = "precise" if name in ("FLOAT", "FLOAT16", "INT32") else "generic"
    assert s.ops()[0].lowering == expect


def test_two_everyn_periods_and_all_in_one_step():
    proto, x, y, r = _add_relu_model()
    b = popart.Builder(proto)
    r2 = b.aiOnnx.relu([r])
    anchors_spec = {r: popart.AnchorReturnType("EVERYN", 2), r2: popart.AnchorReturnType("EVERYN", 3),
                    y: popart.AnchorReturnType("SUM")}
    s = _session(b.getModelProto(), anchors_spec, bps=6)
    anchors = s.initAnchorArrays()
    assert anchors[r].shape == (3, 2, 3) and anchors[r2].shape == (2, 2, 3) and anchors[y].shape == (2, 3)
    rng = np.random.default_rng(7)
    xv, yv = rng.standard_normal((6, 2, 3)).astype(np.float32), rng.standard_normal((6, 2, 3)).astype(np.float32)
    s.run(popart.PyStepIO({x: xv, y: yv}, anchors))
    per = np.maximum(xv + yv, 0)
    np.testing.assert_allclose(anchors[r], per[1::2], rtol=1e-6)
    np.testing.assert_allclose(anchors[r2], per[2::3], rtol=1e-6)
    np.testing.assert_allclose(anchors[y], yv.sum(0), rtol=1e-5)
    # a second run starts the SUM afresh
    s.run(popart.PyStepIO({x: xv, y: yv}, anchors))
    np.testing.assert_allclose(anchors[y], yv.sum(0), rtol=1e-5)


def test_cycles_grow_with_batches_per_step():
    proto, x, y, r = _add_relu_model((8, 16))
    cyc = {}
    for bps in (1, 4):
        s = _session(proto, {r: popart.AnchorReturnType("ALL")}, bps=bps)
        anchors = s.initAnchorArrays()
        z = np.zeros(bps * 128, np.float32)
        s.run(popart.PyStepIO({x: z, y: z}, anchors))
        cyc[bps] = s.getCycleCount()
    assert 3.5 * cyc[1] < cyc[4] < 4.5 * cyc[1]


def test_seed_anchor_named_by_debug_context(tmp_path, caplog):
    """The seed as written in issue 4: the anchor is the add's debugContext, "sum". openipu
    resolves a node name to the node's output (PopART would raise) and warns."""
    builder = popart.Builder()
    info = popart.TensorInfo("FLOAT", [3, 4, 5])
    x = builder.addInputTensor(info, "x")
    y = builder.addInputTensor(info, "y")
    builder.addOutputTensor(builder.aiOnnx.add([x, y], "sum"))
    path = tmp_path / "add.onnx"
    path.write_bytes(builder.getModelProto())
    session = popart.InferenceSession(fnModel=str(path), dataFlow=popart.DataFlow(1, {"sum": popart.AnchorReturnType("FINAL")}),
                                      deviceInfo=popart.DeviceManager().acquireAvailableDevice(numIpus=1))
    anchors = session.initAnchorArrays()
    session.prepareDevice()
    rng = np.random.default_rng(1)
    xv, yv = rng.random((3, 4, 5), np.float32), rng.random((3, 4, 5), np.float32)
    session.run(popart.PyStepIO({"x": xv, "y": yv}, anchors))
    np.testing.assert_array_equal(anchors["sum"], xv + yv)
