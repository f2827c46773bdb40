"""Recomputation lowers the predicted peak tile memory and raises the predicted cycles, and the
trained weights are bit for bit those of a session without it.

As PopART's implicit recomputation does, a recomputed op re-runs the program fragment its
forward op was lowered into: the compute sets execute again (their cycles count twice) but exist
once (no new vertex state, vertex code or exchange code), and the forward activations are dead
between their last forward use and the recompute point. Models: a small residual CNN (conv,
batch norm, sigmoid, add, relu) whose activations dominate the tiles, with
``RecomputationType.Standard`` and with ``builder.recomputeOutputInBackwardPass``; and a reduced
BERT encoder (2 layers of hidden 64, 4 heads, sequence 32: attention, GELU feed-forward, group
norm as PopART's BERT lowers LayerNorm), whose repeated layers are outlined.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import popart


def _cnn(manual: bool = False, batch=8, ch=16, hw=16, layers=3, micro_batches=0):
    """``micro_batches`` > 0: pipelined over 2 IPUs (the first half of the layers on IPU 0 /
    stage 0, the rest and the head on IPU 1 / stage 1), fed that many micro-batches a step."""
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [batch, ch, hw, hw]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [batch]), "label")
    h = x
    ids = []

    def stage(i):
        if not micro_batches:
            return contextlib.nullcontext()
        return _on(b, i)

    for i in range(layers):
        with stage(int(i >= layers // 2)):
            w = b.addInitializedInputTensor((rng.standard_normal((ch, ch, 3, 3)) * 0.1).astype(np.float32), f"w{i}")
            sc = b.addInitializedInputTensor(np.ones(ch, np.float32), f"scale{i}")
            bi = b.addInitializedInputTensor(np.zeros(ch, np.float32), f"bias{i}")
            m = b.addInitializedInputTensor(np.zeros(ch, np.float32), f"mean{i}")
            v = b.addInitializedInputTensor(np.ones(ch, np.float32), f"var{i}")
            y = b.aiOnnx.batchnormalization([b.aiOnnx.conv([h, w], pads=[1, 1, 1, 1]), sc, bi, m, v], 5)[0]
            s = b.aiOnnx.sigmoid([y])
            a = b.aiOnnx.add([s, h])
            if manual:
                b.recomputeOutputInBackwardPass({y, s, a})
            h = b.aiOnnx.relu([a])
        ids += [f"w{i}", f"scale{i}", f"bias{i}", f"mean{i}", f"var{i}"]
    with stage(1):
        p = b.aiOnnx.reducemean([h], axes=[2, 3], keepdims=0)
        wf = b.addInitializedInputTensor((rng.standard_normal((ch, 10)) * 0.1).astype(np.float32), "wf")
        loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([b.aiOnnx.matmul([p, wf])], axis=1), lab])
    lead = (micro_batches,) if micro_batches else ()
    feeds = {x: rng.standard_normal(lead + (batch, ch, hw, hw)).astype(np.float32),
             lab: rng.integers(0, 10, lead + (batch,)).astype(np.int32)}
    return b, loss, feeds, ids + ["wf"]


@contextlib.contextmanager
def _on(b, i):
    with b.virtualGraph(i), b.pipelineStage(i):
        yield


def _bert(batch=2, seq=32, hidden=64, heads=4, layers=2):
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [batch * seq, hidden]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [batch * seq]), "label")
    dh = hidden // heads
    ids = []

    def weight(name, shape, scale=0.05):
        ids.append(name)
        return b.addInitializedInputTensor((rng.standard_normal(shape) * scale).astype(np.float32), name)

    def norm(t, name):
        g = b.addInitializedInputTensor(np.ones(hidden, np.float32), f"{name}/gamma")
        be = b.addInitializedInputTensor(np.zeros(hidden, np.float32), f"{name}/beta")
        ids.extend([f"{name}/gamma", f"{name}/beta"])
        return b.aiGraphcore.groupnormalization([t, g, be], 1)[0]

    def heads_of(t):        # [B*S, H] -> [B, heads, S, dh]
        return b.aiOnnx.transpose([b.aiOnnx.reshape([t, b.aiOnnx.constant(np.array([batch, seq, heads, dh], np.int64))])],
                                  perm=[0, 2, 1, 3])

    h = x
    for i in range(layers):
        q, k, v = (heads_of(b.aiOnnx.matmul([h, weight(f"l{i}/{n}", (hidden, hidden))])) for n in "qkv")
        kt = b.aiOnnx.transpose([k], perm=[0, 1, 3, 2])
        att = b.aiOnnx.softmax([b.aiOnnx.mul([b.aiOnnx.matmul([q, kt]),
                                              b.aiOnnx.constant(np.array(dh ** -0.5, np.float32))])], axis=3)
        ctx = b.aiOnnx.reshape([b.aiOnnx.transpose([b.aiOnnx.matmul([att, v])], perm=[0, 2, 1, 3]),
                                b.aiOnnx.constant(np.array([batch * seq, hidden], np.int64))])
        h = norm(b.aiOnnx.add([b.aiOnnx.matmul([ctx, weight(f"l{i}/o", (hidden, hidden))]), h]), f"l{i}/ln1")
        f = b.aiGraphcore.gelu([b.aiOnnx.matmul([h, weight(f"l{i}/ff1", (hidden, 4 * hidden))])])
        h = norm(b.aiOnnx.add([b.aiOnnx.matmul([f, weight(f"l{i}/ff2", (4 * hidden, hidden))]), h]), f"l{i}/ln2")
    logits = b.aiOnnx.matmul([h, weight("head", (hidden, 16))])
    loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([logits], axis=1), lab])
    feeds = {x: rng.standard_normal((batch * seq, hidden)).astype(np.float32),
             lab: rng.integers(0, 16, batch * seq).astype(np.int32)}
    return b, loss, feeds, ids


def _step(make, mode="NoRecompute", tiles=16, **kw):
    """One training step (ConstSGD 0.1) on an IPU Model of ``tiles`` tiles: (session, loss,
    weights after the step, predicted peak tile bytes, predicted cycles)."""
    b, loss, feeds, ids = make(**kw)
    o = popart.SessionOptions()
    o.autoRecomputation = getattr(popart.RecomputationType, mode)
    ipus = 1
    if kw.get("micro_batches"):        # pipelined over 2 IPUs, the micro-batches accumulated
        o.virtualGraphMode = popart.VirtualGraphMode.Manual
        o.enablePipelining = True
        o.enableGradientAccumulation = True
        o.accumulationFactor = kw["micro_batches"]
        ipus = 2
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                               popart.ConstSGD(0.1),
                               popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus, "tilesPerIPU": tiles}),
                               userOptions=o)
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds, a))
    s.weightsToHost()
    w = {i: np.zeros(s.getInfo(i).shape(), np.float32) for i in ids}
    s.readWeights(popart.PyWeightsIO(w))
    return s, a[loss].copy(), w, int(s._engine._compiled.memory.total.max()), s.getCycleCount()


def _compare(base, rec):
    s0, loss0, w0, peak0, cyc0 = base
    s1, loss1, w1, peak1, cyc1 = rec
    assert s1._ir.recomputed > 0 and s0._ir.recomputed == 0
    np.testing.assert_array_equal(loss1, loss0)
    for k in w0:
        np.testing.assert_array_equal(w1[k], w0[k], err_msg=k)
    assert peak1 < peak0, (peak1, peak0)
    assert cyc1 > cyc0, (cyc1, cyc0)
    # re-run, not cloned: not one compute set more than without recomputation
    c0, c1 = (s._engine._compiled.compiler for s in (s0, s1))
    assert len(c1.cs_cache) == len(c0.cs_cache)
    assert len(c1.steps) > len(c0.steps)
    return peak1 / peak0, cyc1 / cyc0


@pytest.fixture(scope="module")
def cnn_base():
    return _step(_cnn)


def test_standard_recomputation_cnn(cnn_base):
    _compare(cnn_base, _step(_cnn, "Standard"))


def test_manual_recomputation_cnn(cnn_base):
    rec = _step(_cnn, manual=True)
    assert rec[0]._ir.recomputed == 6      # BatchNorm and Sigmoid: the backward pass reads no Add output
    mem, cyc = _compare(cnn_base, rec)
    assert mem < 0.95


def test_standard_recomputation_reduced_bert():
    base = _step(_bert)
    rec = _step(_bert, "Standard")
    _compare(base, rec)


def test_recompute_reruns_the_forward_compute_sets(cnn_base):
    """Each Sigmoid compute set executes twice as often as without recomputation (the layers
    are outlined: one compute set serves the three layers); no compute set is added."""
    from collections import Counter
    runs = []
    for s in (cnn_base[0], _step(_cnn, manual=True)[0]):
        comp = s._engine._compiled.compiler
        # executions in the step's run (a step of a block met again is laid out once and runs again)
        runs.append(Counter({k: 0 for k in (getattr(st, "cs_id", None) for st in comp.steps)}))
        for st, n in zip(comp.steps, s._engine._counts):
            if st.name.split("/")[0] == "Sigmoid":
                runs[-1][getattr(st, "cs_id", None)] += int(n)
        runs[-1] = Counter({k: n for k, n in runs[-1].items() if n})
        assert not any("recompute" in st.name for st in comp.steps)
    assert set(runs[0]) == set(runs[1]) and runs[0]
    assert all(runs[1][k] == 2 * runs[0][k] for k in runs[0])


def test_standard_checkpoints_follow_popart_intervals():
    from openipu.popart.transforms.recompute import decreasing_intervals
    assert decreasing_intervals(1) == [(0, 1)]
    assert decreasing_intervals(4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert decreasing_intervals(8)[:2] == [(0, 2), (2, 3)]
    iv = decreasing_intervals(25)
    assert iv[:4] == [(0, 4), (4, 7), (7, 9), (9, 10)] and iv[-1] == (24, 25)
    assert [a for a, _ in iv[1:]] == [b for _, b in iv[:-1]]


def test_recomputing_session_exports_and_loads(tmp_path):
    """The step program holds each re-run fragment twice: an exported executable keeps that and
    trains as the compiled one does (same loss after two steps, same predicted cycles)."""
    def session():
        b, loss, feeds, _ = _cnn(manual=True, batch=2, ch=4, hw=8)
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
                                   loss, popart.ConstSGD(0.1),
                                   popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 16}))
        return s, loss, feeds
    s, _, _ = session()
    s.compileAndExport(str(tmp_path / "m.popef"))
    out = []
    for load in (False, True):
        s, loss, feeds = session()
        if load:
            s.loadExecutable(str(tmp_path / "m.popef"))
        s.prepareDevice()
        s.weightsFromHost()
        a = s.initAnchorArrays()
        for _ in range(2):
            s.run(popart.PyStepIO(feeds, a))
        out.append((float(a[loss]), s.getCycleCount()))
    assert s._ir.recomputed > 0
    assert out[0] == out[1]


def test_recompute_all_adds_no_compute_set():
    """RecomputeAll recomputes every forward op: the recomputation ops are outlined only with
    each other, so the forward layers keep their shared body and no compute set is added; the
    weights are those of a session without recomputation and the cycles grow."""
    base = _step(_cnn, batch=2, ch=4, hw=8)
    rec = _step(_cnn, "RecomputeAll", batch=2, ch=4, hw=8)
    assert rec[0]._ir.recomputed > base[0]._ir.recomputed == 0
    c0, c1 = (s._engine._compiled.compiler for s in (base[0], rec[0]))
    assert len(c1.cs_cache) == len(c0.cs_cache)
    assert rec[4] > base[4]
    for k in base[2]:
        np.testing.assert_array_equal(rec[2][k], base[2][k], err_msg=k)


@pytest.mark.parametrize("mode", ["Pipeline", "Standard"])
def test_pipelined_recomputation_reruns_the_forward_fragments(mode):
    """Pipelined over 2 IPUs (4 layers of the residual CNN, 2 per stage, 4 micro-batches
    accumulated): the backward stage restores the stage's stashed inputs into the forward tensors
    and re-runs the forward fragments (PopART's RestoreInplace and implicit recomputation), so the
    stashes of the recomputed activations go, the predicted peak tile memory falls and no compute
    set is added (fewer: fewer restores); the weights and running statistics after the step are
    those without recomputation, bit for bit. Before the re-run, each recomputed op was lowered on
    its own and the peak rose (Pipeline: 139,448 -> 146,160 B, 172 -> 202 compute sets)."""
    kw = dict(batch=4, ch=8, hw=16, layers=4, micro_batches=4)
    base, rec = _step(_cnn, **kw), _step(_cnn, mode, **kw)
    assert rec[0]._ir.recomputed > 0
    np.testing.assert_array_equal(rec[1], base[1])
    for k in base[2]:
        np.testing.assert_array_equal(rec[2][k], base[2][k], err_msg=k)
    assert rec[3] < base[3], (rec[3], base[3])
    assert rec[4] > base[4]
    c0, c1 = (s._engine._compiled.compiler for s in (base[0], rec[0]))
    assert len(c1.cs_cache) <= len(c0.cs_cache)
    assert not any("recompute" in st.name for st in c1.steps)
    assert not any(st.name.endswith("__re/stash") for st in c1.steps)
