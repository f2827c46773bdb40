"""Pipelining (``enablePipelining``): results, the stale-weights schedule, predicted overlap of the
stages, and PopART's errors."""

from __future__ import annotations

import numpy as np
import pytest

import popart
from test_popart_training import _weights

ALL = popart.AnchorReturnType("ALL")


def _mlp(stages=((0, 0), (1, 1)), seed=0, batch=4, width=8):
    """x -> matmul w0 -> relu -> matmul w1 -> softmax -> nll; layer ``i`` on (virtual graph,
    pipeline stage) ``stages[i]`` (None: not annotated)."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [batch, width]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [batch]), "lab")
    w0 = b.addInitializedInputTensor(np.random.RandomState(seed + 1).randn(width, 16).astype(np.float32), "w0")
    w1 = b.addInitializedInputTensor(np.random.RandomState(seed + 2).randn(16, 5).astype(np.float32), "w1")

    def annotate(ids, i):
        vg, ps = stages[i]
        for t in ids:
            if vg is not None:
                b.virtualGraph(t, vg)
            if ps is not None:
                b.pipelineStage(t, ps)
    m0 = b.aiOnnx.matmul([x, w0])
    h = b.aiOnnx.relu([m0])
    annotate([m0, h], 0)
    y = b.aiOnnx.matmul([h, w1])
    p = b.aiOnnx.softmax([y], axis=1)
    loss = b.aiGraphcore.nllloss([p, lab], popart.ReductionType.Sum)
    annotate([y, p, loss], 1)
    return b, x, lab, p, loss


def _options(pipelined=True, af=1, recompute=None):
    o = popart.SessionOptions()
    o.virtualGraphMode = popart.VirtualGraphMode.Manual
    o.enablePipelining = pipelined
    if af > 1:
        o.enableGradientAccumulation = True
        o.accumulationFactor = af
    if recompute is not None:
        o.autoRecomputation = recompute
    return o


def _device(n=2, tiles=16):
    return popart.DeviceManager().createIpuModelDevice({"numIPUs": n, "tilesPerIPU": tiles})


def _data(bps, af=1, batch=4, width=8, seed=5):
    rs = np.random.RandomState(seed)
    shp = [bps] + ([af] if af > 1 else [])
    return rs.randn(*shp, batch, width).astype(np.float32), rs.randint(0, 5, size=shp + [batch]).astype(np.int32)


def _step(s, feeds, names):
    """Prepare session ``s`` and run one step on ``feeds``: its anchors and the weights ``names``
    after it."""
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds, a))
    return a, _weights(s, names)


def _train(pipelined, bps, af=1, lr=0.01, recompute=None, anchors=None, optimizer=None, strategy=None):
    b, x, lab, p, loss = _mlp()
    o = _options(pipelined, af, recompute)
    if strategy:
        o.accumulationAndReplicationReductionType = popart.ReductionType.Mean
        o.meanAccumulationAndReplicationReductionStrategy = getattr(popart.MeanReductionStrategy, strategy)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(bps, anchors or {loss: ALL, p: ALL}), loss=loss,
                               optimizer=optimizer or popart.ConstSGD(lr), deviceInfo=_device(), userOptions=o)
    xs, ls = _data(bps, af)
    out, w = _step(s, {x: xs, lab: ls}, ["w0", "w1"])
    out = {k: v.copy() for k, v in out.items()}
    out.update(w)
    return out, s


def test_pipelined_inference_matches_sharded():
    res = []
    for pipelined in (False, True):
        b, x, lab, p, loss = _mlp()
        s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(6, {p: ALL}), _device(),
                                    userOptions=_options(pipelined))
        s.prepareDevice()
        out = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: _data(6)[0]}, out))
        res.append(out[p].copy())
    np.testing.assert_array_equal(res[0], res[1])


def test_pipelined_training_with_accumulation_matches_sharded():
    """With gradient accumulation the weights change once per batch, after the flush: the
    pipelined run computes exactly what the sharded one does."""
    a, _ = _train(False, bps=2, af=4)
    b, s = _train(True, bps=2, af=4)
    assert s.getIr().num_stages == 3
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("strategy", ["Post", "Running"])
def test_pipelined_adam_with_a_mean_over_micro_batches_matches_sharded(strategy):
    """Adam's gradient accumulators, meaned after the batch (Post) or as a running mean whose
    micro-batch counter is one per IPU and pipeline stage (Running), give the sharded run's
    weights."""
    def adam():
        return popart.Adam({"defaultLearningRate": (0.02, True)})
    a, _ = _train(False, bps=2, af=4, optimizer=adam(), strategy=strategy)
    b, s = _train(True, bps=2, af=4, optimizer=adam(), strategy=strategy)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=k)
    counters = sorted(t for t in s.getTensorIds() if t.startswith("Counter___"))
    assert counters == (["Counter____VGraph0_PStage0", "Counter____VGraph1_PStage1"] if strategy == "Running" else [])


def test_pipelined_training_without_accumulation_updates_stale_weights():
    """Without accumulation each stage updates its weights every micro-batch (PopART's stale
    weights): forward stage 0 of micro-batch m runs with w0 before the updates of micro-batches
    m-1 and m-2 reach it. A numpy replay of the 3-stage schedule gives the same losses and weights."""
    bps, lr = 8, 0.01
    out, _ = _train(True, bps=bps, lr=lr)
    xs, ls = _data(bps)
    w0 = np.random.RandomState(1).randn(8, 16)
    w1 = np.random.RandomState(2).randn(16, 5)
    pre, h, gh, losses = {}, {}, {}, {}
    for t in range(bps + 2):            # cycle t: stage 0 on micro-batch t, stage 1 on t-1, stage 2 on t-2
        if t < bps:
            pre[t] = xs[t] @ w0
            h[t] = np.maximum(pre[t], 0)
        if 0 <= t - 1 < bps:
            m = t - 1
            y = h[m] @ w1
            e = np.exp(y - y.max(1, keepdims=True))
            prob = e / e.sum(1, keepdims=True)
            losses[m] = -np.log(prob[np.arange(4), ls[m]]).sum()
            gy = prob.copy()
            gy[np.arange(4), ls[m]] -= 1
            gh[m] = gy @ w1.T
            w1 = w1 - lr * h[m].T @ gy
        if 0 <= t - 2 < bps:
            m = t - 2
            w0 = w0 - lr * xs[m].T @ (gh[m] * (pre[m] > 0))
    np.testing.assert_allclose(out["Nll:0"], [losses[m] for m in range(bps)], rtol=1e-5)
    np.testing.assert_allclose(out["w0"], w0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["w1"], w1, rtol=1e-5, atol=1e-6)
    # and it differs from the sharded run, where every micro-batch sees all earlier updates
    sharded, _ = _train(False, bps=bps, lr=lr)
    assert np.abs(sharded["w0"] - out["w0"]).max() > 1e-4


def test_replicated_pipeline_matches_replicated_sharding():
    """2 replicas of a 2-IPU pipeline (4 IPUs): the accumulated gradients are all-reduced after
    the flush, as without pipelining."""
    res = []
    for pipelined in (False, True):
        b, x, lab, p, loss = _mlp()
        o = _options(pipelined, af=4)
        o.enableReplicatedGraphs = True
        o.replicatedGraphCount = 2
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(2, {loss: ALL}), loss=loss,
                                   optimizer=popart.ConstSGD(0.01), deviceInfo=_device(4), userOptions=o)
        s.prepareDevice()
        s.weightsFromHost()
        out = s.initAnchorArrays()
        rs = np.random.RandomState(3)
        s.run(popart.PyStepIO({x: rs.randn(2, 4, 2, 4, 8).astype(np.float32),
                               lab: rs.randint(0, 5, size=(2, 4, 2, 4)).astype(np.int32)}, out))
        w = {"w0": np.zeros((8, 16), np.float32)}
        s.weightsToHost()
        s.readWeights(popart.PyWeightsIO(w))
        res.append((out[loss].copy(), w["w0"]))
    np.testing.assert_allclose(res[1][0], res[0][0], rtol=1e-6)
    np.testing.assert_allclose(res[1][1], res[0][1], rtol=1e-6, atol=1e-7)


def test_stages_inferred_from_virtual_graphs_and_recompute_keeps_results():
    """No pipelineStage annotations: the stage is the virtual graph id (InferPipelineStages);
    recomputation (Standard, and Pipeline: every forward op within its stage) changes nothing
    in the results."""
    b, x, lab, p, loss = _mlp(stages=((0, None), (1, None)))
    ref, _ = _train(True, bps=2, af=4)
    for mode in (popart.RecomputationType.Standard, popart.RecomputationType.Pipeline):
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(2, {loss: ALL}), loss=loss,
                                   optimizer=popart.ConstSGD(0.01), deviceInfo=_device(),
                                   userOptions=_options(True, 4, mode))
        assert s.getIr().num_stages == 3
        # Standard: h (read by stage 1) is a checkpoint and the softmax gradient is direct, so
        # nothing is recomputed here; Pipeline recomputes the first matmul for the relu gradient
        assert s.getIr().recomputed == (mode == popart.RecomputationType.Pipeline)
        s.prepareDevice()
        s.weightsFromHost()
        out = s.initAnchorArrays()
        xs, ls = _data(2, 4)
        s.run(popart.PyStepIO({x: xs, lab: ls}, out))
        np.testing.assert_allclose(out[loss], ref[loss], rtol=1e-5)


def test_sum_and_final_anchors_when_pipelined():
    b, x, lab, p, loss = _mlp()
    ref, _ = _train(False, bps=2, af=4)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(2, {loss: popart.AnchorReturnType("Sum"),
                                                                       p: popart.AnchorReturnType("Final")}),
                               loss=loss, optimizer=popart.ConstSGD(0.01), deviceInfo=_device(),
                               userOptions=_options(True, 4))
    s.prepareDevice()
    s.weightsFromHost()
    out = s.initAnchorArrays()
    xs, ls = _data(2, 4)
    s.run(popart.PyStepIO({x: xs, lab: ls}, out))
    np.testing.assert_allclose(out[loss].reshape(-1), [ref[loss].sum()], rtol=1e-5)
    np.testing.assert_allclose(out[p].reshape(ref[p].shape[-2:]), ref[p][-1, -1], rtol=1e-5)


def _deep(pipelined, n=4, width=256, batch=64):
    """A compute-heavy fp16 MLP, one layer per IPU: (session, predicted cycles of a step)."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT16", [batch, width]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [batch]), "lab")
    h = x
    for i in range(n):
        w = b.addInitializedInputTensor((np.random.RandomState(i).randn(width, width) * 0.05).astype(np.float16))
        with b.virtualGraph(i), b.pipelineStage(i):
            h = b.aiOnnx.relu([b.aiOnnx.matmul([h, w])])
            if i == n - 1:
                loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([h], axis=1), lab], popart.ReductionType.Sum)
    dev = popart.DeviceManager().createOfflineIPUDevice({"numIPUs": n, "tilesPerIPU": 64})
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("Final")}),
                               loss=loss, optimizer=popart.ConstSGD(0.01), deviceInfo=dev,
                               userOptions=_options(pipelined, af=16))
    s.prepareDevice()
    s._engine.predict_run(0)
    from openipu.poplar.profile import run_breakdown
    return s, run_breakdown(s._engine)["cycles"]


def test_four_stage_pipeline_predicts_a_speed_up_over_sharding():
    """The same 4-IPU model, 16 micro-batches: sharded, each micro-batch crosses the IPUs one
    after the other; pipelined, the stages overlap (IPU clocks advance independently between
    the copies of a cycle). The stashes cost tile memory."""
    sharded, c_sharded = _deep(False)
    pipelined, c_pipelined = _deep(True)
    assert pipelined.getIr().num_stages == 7
    assert c_pipelined < c_sharded / 1.5


@pytest.mark.parametrize("case,match", [
    ("off", r"Pipelining requires more than 1 IPU \(currently 1\) and the 'virtualGraphMode' session option"),
    ("partial", r"^Only some ops have had their pipeline stage set\. Ops missing the pipeline stage:"),
    ("mixed", r"Ops \[.*\] have the same pipeline stage 1, but different virtual graph ids \[0, 1\]"),
    ("depth_bps", r"For pipelining, depth \(batchesPerStep\) must equal at least the number of pipeline stages \(3\)"),
    ("depth_af", r"For pipelining, depth \(gradient accumulation factor\) must equal at least the number of "
                 r"pipeline stages \(3\)"),
    ("manual_recompute", r"When pipelining is enabled, user annotation for recomputation is not allowed"),
    ("backwards", r"in pipeline stage 0 reads .* made in the later pipeline stage 1"),
])
def test_pipeline_errors(case, match):
    stages = {"partial": ((0, 0), (1, None)), "mixed": ((0, 1), (1, 1)), "backwards": ((0, 1), (1, 0))}
    b, x, lab, p, loss = _mlp(stages=stages.get(case, ((0, 0), (1, 1))))
    o = _options(True, af=2 if case == "depth_af" else 1)
    dev = _device()
    bps = 2 if case == "depth_bps" else 4
    if case == "off":
        o.virtualGraphMode = popart.VirtualGraphMode.Off
        dev = _device(1)
    if case == "manual_recompute":
        b.recomputeOutputInBackwardPass(p)
    with pytest.raises(popart.popart_exception, match=match):
        popart.TrainingSession(b.getModelProto(), popart.DataFlow(bps, {loss: ALL}), loss=loss,
                               optimizer=popart.ConstSGD(0.01), deviceInfo=dev, userOptions=o)


def test_a_weight_on_two_ipus_is_refused():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 4]), "x")
    w = b.addInitializedInputTensor(np.ones((4, 4), np.float32), "w")
    with b.virtualGraph(0), b.pipelineStage(0):
        h = b.aiOnnx.matmul([x, w])
    with b.virtualGraph(1), b.pipelineStage(1):
        y = b.aiOnnx.matmul([h, w])
    o = _options(True)
    o.constantWeights = False       # the weight is a variable
    with pytest.raises(popart.popart_exception, match=r"Can not copy variable tensor w between virtual graphs when "
                                                      r"pipelining"):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(4, {y: ALL}), _device(), userOptions=o)


def test_an_input_read_on_two_ipus_is_streamed_to_one_and_copied():
    """A streamed input read in stage 0 on IPU 0 and in stage 1 on IPU 1 is streamed onto IPU 0
    (its earliest stage) and copied to IPU 1, as PopART's InterIpuCopy does before its Pipeline
    checks: y = relu(x) + x for each of the 4 batches."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 4]), "x")
    with b.virtualGraph(0), b.pipelineStage(0):
        h = b.aiOnnx.relu([x])
    with b.virtualGraph(1), b.pipelineStage(1):
        y = b.aiOnnx.add([h, x])
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(4, {y: ALL}), _device(),
                                userOptions=_options(True))
    assert s._ir.home_vgraph(x) == 0
    s.prepareDevice()
    out = s.initAnchorArrays()
    xs = np.random.RandomState(3).randn(4, 2, 4).astype(np.float32)
    s.run(popart.PyStepIO({x: xs}, out))
    np.testing.assert_array_equal(out[y], np.maximum(xs, 0) + xs)


def _mlp_reading_x_on_both_ipus(pipelined):
    """The MLP of :func:`_mlp` whose stage-1 logits also add ``x @ w2`` (w2 on IPU 1): the input
    is read in forward stage 0 (IPU 0), forward stage 1 and backward stage 2 (IPU 1)."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [4]), "lab")
    rs = np.random.RandomState(7)
    w0 = b.addInitializedInputTensor(rs.randn(8, 16).astype(np.float32), "w0")
    w1 = b.addInitializedInputTensor(rs.randn(16, 5).astype(np.float32), "w1")
    w2 = b.addInitializedInputTensor(rs.randn(8, 5).astype(np.float32), "w2")
    with b.virtualGraph(0), b.pipelineStage(0):
        h = b.aiOnnx.relu([b.aiOnnx.matmul([x, w0])])
    with b.virtualGraph(1), b.pipelineStage(1):
        y = b.aiOnnx.add([b.aiOnnx.matmul([h, w1]), b.aiOnnx.matmul([x, w2])])
        p = b.aiOnnx.softmax([y], axis=1)
        loss = b.aiGraphcore.nllloss([p, lab], popart.ReductionType.Sum)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(2, {loss: ALL}), loss=loss,
                               optimizer=popart.ConstSGD(0.01), deviceInfo=_device(),
                               userOptions=_options(pipelined, af=4))
    xs, ls = _data(2, 4)
    out, w = _step(s, {x: xs, lab: ls}, ["w0", "w1", "w2"])
    return {**{k: v.copy() for k, v in out.items()}, **w}, s


def test_pipelined_training_with_an_input_read_on_two_ipus_matches_sharded():
    a, _ = _mlp_reading_x_on_both_ipus(False)
    b, s = _mlp_reading_x_on_both_ipus(True)
    assert s.getIr().num_stages == 3
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-6, err_msg=k)


def test_every_n_anchor_is_refused_when_pipelined_without_accumulation():
    b, x, lab, p, loss = _mlp()
    s = popart.InferenceSession(b.getModelProto(), popart.DataFlow(4, {p: popart.AnchorReturnType("EveryN", 2)}),
                                _device(), userOptions=_options(True))
    with pytest.raises(popart.popart_exception, match="EveryN with pipelining without gradient accumulation"):
        s.prepareDevice()


@pytest.mark.parametrize("pipelined", [True, False])
def test_every_n_all_and_sum_anchors_with_accumulation(pipelined):
    """EVERYN(2) over 4 batches of 4 micro-batches: every micro-batch of batches 2 and 4 (shape
    [bps / 2, af, ...]); ALL: all of them; SUM: their sum; the same with and without pipelining
    as in a reference run that returns ALL."""
    bps, af = 4, 4
    b, x, lab, p, loss = _mlp()
    ref, _ = _train(False, bps=bps, af=af)
    arts = {p: popart.AnchorReturnType("EveryN", 2), loss: popart.AnchorReturnType("Sum"), "lab": ALL}
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(bps, arts), loss=loss,
                               optimizer=popart.ConstSGD(0.01), deviceInfo=_device(),
                               userOptions=_options(pipelined, af))
    s.prepareDevice()
    s.weightsFromHost()
    out = s.initAnchorArrays()
    assert out[p].shape == (bps // 2, af, 4, 5)
    assert out["lab"].shape == (bps, af, 4)
    xs, ls = _data(bps, af)
    s.run(popart.PyStepIO({x: xs, lab: ls}, out))
    np.testing.assert_allclose(out[p], ref[p][1::2], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(out["lab"], ls)
    np.testing.assert_allclose(out[loss].reshape(-1), [ref[loss].sum()], rtol=1e-5)


def test_skip_connection_across_stages_sums_its_gradients_on_the_earlier_ipu():
    """``h`` made on stage 0 is read on stage 0 and again on stage 1 (a skip connection, as in
    ResNet's residual blocks cut between stages): the sum of its two gradients runs in backward
    stage 2 on IPU 0, where its later input is made (it was left on IPU 1 in stage 2, and the
    lowering failed with "reads ... before stage 3 makes it available"). Pipelined with
    accumulation, the step matches the sharded one."""
    def model():
        rs = np.random.RandomState(0)
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
        lab = b.addInputTensor(popart.TensorInfo("INT32", [4]), "lab")
        w0, w1, w2 = (b.addInitializedInputTensor(rs.randn(8, 8).astype(np.float32) * 0.3, f"w{i}") for i in range(3))
        with b.virtualGraph(0), b.pipelineStage(0):
            h = b.aiOnnx.relu([b.aiOnnx.matmul([x, w0])])
            g = b.aiOnnx.matmul([h, w2])
        with b.virtualGraph(1), b.pipelineStage(1):
            y = b.aiOnnx.add([b.aiOnnx.matmul([g, w1]), h])
            loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([y], axis=1), lab], popart.ReductionType.Sum)
        return b, x, lab, loss

    xs, labs = _data(1, af=4)
    results = []
    for pipelined in (False, True):
        b, x, lab, loss = model()
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss, popart.ConstSGD(0.1),
                                   _device(), userOptions=_options(pipelined, af=4))
        a, w = _step(s, {x: xs, lab: labs.clip(0, 7)}, [f"w{i}" for i in range(3)])
        results.append((a[loss], w))
        if pipelined:
            (gs,) = [op for op in s.ops() if op.op_type == "Sum" and op.grad_of is not None]
            assert (gs.vgraph, gs.pipeline_stage) == (0, 2)
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6)
    for k in results[0][1]:
        np.testing.assert_allclose(results[1][1][k], results[0][1][k], rtol=1e-6, atol=1e-7)


def _transposed_weight_session(width, af=4):
    """x @ w0 -> relu -> @ Transpose(w1) on IPU 0 (stage 0), softmax and NLL on IPU 1 (stage 1):
    the backward stage on IPU 0 reads the forward stage's transposed weight, which is stashed."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, width]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [4]), "lab")
    rs = np.random.RandomState(0)
    w0 = b.addInitializedInputTensor(rs.randn(width, width).astype(np.float32) / width ** 0.5, "w0")
    w1 = b.addInitializedInputTensor(rs.randn(width, width).astype(np.float32) / width ** 0.5, "w1")
    with b.virtualGraph(0), b.pipelineStage(0):
        h = b.aiOnnx.relu([b.aiOnnx.matmul([x, w0])])
        y = b.aiOnnx.matmul([h, b.aiOnnx.transpose([w1], perm=[1, 0])])
    with b.virtualGraph(1), b.pipelineStage(1):
        p = b.aiOnnx.softmax([y], axis=1)
        loss = b.aiGraphcore.nllloss([p, lab], popart.ReductionType.Sum)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss=loss,
                               optimizer=popart.ConstSGD(0.01), deviceInfo=_device(),
                               userOptions=_options(True, af))
    s.prepareDevice()
    return s


def _stash_boxes(s):
    """Regions (boxes) that the stash update and restore of the transposed weight read and write."""
    from openipu.poplar.exchange import Boxes
    g = s._lowered.graph
    return sum(len(a.on) for cs in g.getComputeSets() if cs.name.startswith("Transpose:0/")
               for grp in cs.groups for a in grp.reads + grp.writes if isinstance(a.on, Boxes))


def test_stash_of_a_transposed_weight_costs_its_structure_not_its_elements():
    """A stashed transposed view is stashed in memory order (as PopART's stash is made from the
    slice): its update and restore read and write a few regions per tile, however wide the
    weight, not one region per element (which made BERT-base's pipelined compile take > 12 GB)."""
    small, big = _stash_boxes(_transposed_weight_session(32)), _stash_boxes(_transposed_weight_session(128))
    assert 0 < big <= small * 1.5, (small, big)


def test_compiled_pipeline_does_not_grow_with_the_accumulation_factor():
    """The main cycles of the pipeline are one Repeat: the compiled steps (and so the memory plan,
    which is made over them) are the same for 4 and for 16 micro-batches."""
    steps = {af: len(_transposed_weight_session(32, af)._engine._exe.compiled.compiler.steps) for af in (4, 16)}
    assert steps[4] == steps[16] > 0, steps


def test_pipeline_stages_are_laid_out_once_not_per_cycle():
    """Each stage's fragment is one block of steps that every pipeline cycle running the stage
    runs again (as on Poplar, where a program tree's repeated parts are the same program): the
    pipelined program compiles to about as many steps as the sharded one (plus the stash, restore
    and counter steps of each stage), not one copy per fill, main and flush cycle; every
    occurrence still runs and is counted."""
    steps, runs = {}, {}
    for pipelined in (True, False):
        _, s = _train(pipelined, 1, af=8)
        steps[pipelined] = len(s._engine._compiled.compiler.steps)
        runs[pipelined] = int(s._engine._counts.sum())
    stages = 3          # forward 0, forward 1 with backward 1, backward 0
    assert steps[True] <= steps[False] + 4 * stages, steps
    # the pipeline runs many more steps than it lays out: 8 micro-batches through 3 stages
    assert runs[True] > 5 * steps[True], (runs, steps)


def test_each_stage_is_one_function_whose_code_is_counted_once():
    """As PopART adds each stage's main fragment with ``addFunction`` and calls it in every
    pipeline cycle, each stage is one function: its steps have control code once, however many
    cycles run it (the fragments that are plain Sequences, the copies and streams of a cycle, are
    code again in each cycle). The pipelined program has little more code than the sharded one
    and much less than it runs (3 stages, 8 micro-batches)."""
    from openipu.poplar import calibration as cal
    code, runs = {}, {}
    for pipelined in (True, False):
        _, s = _train(pipelined, 1, af=8)
        comp = s._engine._compiled.compiler
        code[pipelined], runs[pipelined] = comp.code_steps, comp.occurrences
        control = s._engine._compiled.memory.categories["Control Code"]
        assert (control == cal.CONTROL_CODE_BYTES_PER_STEP * comp.code_steps).all()
        if pipelined:
            names = [f.program.debug_name for f in s._lowered.graph._state.functions]
            assert [n for n in names if n.endswith("/main")] == [f"pipelineStage{k}/main" for k in range(3)]
    assert code[False] == runs[False]
    assert code[True] <= code[False] + 8 * 3 and code[True] < 0.6 * runs[True], (code, runs)


def test_pipeline_recomputation_restores_a_stashed_input_at_the_backward_stage():
    """A tensor made on IPU 0 (``m``, one value per micro-batch) is read by a recomputed op on
    IPU 2 (the Mul before a Relu, inside stage 2): stage 2 restores it from its stash, and the
    backward stage on IPU 2 re-runs the Mul's fragment for an older micro-batch. The restore is a
    step of the stage, not of the Mul's fragment: re-run in the backward stage, the fragment must
    read the backward stage's restore, not slice the stash again at stage 2's counter (a newer
    micro-batch: pipelined BERT-base's attention mask, the embedding gradients off by 5 %).
    Pipeline recomputation gives the sharded step's weights."""
    def model():
        rs = np.random.RandomState(0)
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
        lab = b.addInputTensor(popart.TensorInfo("INT32", [4]), "lab")
        w = [b.addInitializedInputTensor(rs.randn(8, 8).astype(np.float32) * 0.5, f"w{i}") for i in range(4)]
        with b.virtualGraph(0), b.pipelineStage(0):
            a0 = b.aiOnnx.matmul([x, w[0]])
            m = b.aiOnnx.sigmoid([a0])
        with b.virtualGraph(1), b.pipelineStage(1):
            h = b.aiOnnx.matmul([b.aiOnnx.tanh([a0]), w[1]])
        with b.virtualGraph(2), b.pipelineStage(2):
            z = b.aiOnnx.matmul([b.aiOnnx.relu([b.aiOnnx.mul([b.aiOnnx.matmul([h, w[2]]), m])]), w[3]])
        with b.virtualGraph(3), b.pipelineStage(3):
            loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([z], axis=1), lab], popart.ReductionType.Sum)
        return b, x, lab, loss

    xs, labs = _data(1, af=8)
    results = []
    for pipelined, mode in ((False, None), (True, popart.RecomputationType.Pipeline)):
        b, x, lab, loss = model()
        o = _options(pipelined, af=8, recompute=mode)
        o.enableOutlining = False       # the Mul's fragment is re-run (an outlined call's outputs keep theirs)
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss, popart.ConstSGD(0.1),
                                   _device(4), userOptions=o)
        assert bool(s.getIr().recomputed) == pipelined
        a, w = _step(s, {x: xs, lab: labs.clip(0, 7)}, [f"w{i}" for i in range(4)])
        results.append((a[loss], w))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6)
    for k in results[0][1]:
        np.testing.assert_allclose(results[1][1][k], results[0][1][k], rtol=1e-5, atol=1e-7, err_msg=k)
