"""Recomputation in training (``autoRecomputation``, ``recomputeOutputInBackwardPass``): the same
weights as without it, fewer predicted activation bytes at the tile peak, more predicted cycles;
and the NLL loss lowered over the batch's tiles."""

from __future__ import annotations

import numpy as np
import pytest

import popart
from test_popart_training import _weights


def _model(batch=2048, width=256, layers=3, manual=False):
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [batch, width]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [batch]), "label")
    h = x
    for i in range(layers):
        w = b.addInitializedInputTensor((rng.standard_normal((width, width)) * 0.05).astype(np.float32), f"w{i}")
        h = b.aiOnnx.tanh([b.aiOnnx.sigmoid([b.aiOnnx.matmul([h, w])])])
        if manual:
            b.recomputeOutputInBackwardPass(h)
        h = b.aiOnnx.add([h, h])
    loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([h], axis=1), lab])
    rng = np.random.default_rng(1)
    feeds = {x: rng.standard_normal((batch, width)).astype(np.float32),
             lab: rng.integers(0, width, batch).astype(np.int32)}
    return b, loss, feeds, [f"w{i}" for i in range(layers)]


def _train(mode="NoRecompute", manual=False):
    b, loss, feeds, ids = _model(manual=manual)
    o = popart.SessionOptions()
    o.autoRecomputation = mode if isinstance(mode, int) else getattr(popart.RecomputationType, mode)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
                               popart.ConstSGD(0.5), popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 1472}),
                               userOptions=o)
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO(feeds, a))
    return s, float(a[loss]), _weights(s, ids), int(s._engine._compiled.memory.total.max())


def test_standard_recomputation_trades_cycles_for_memory():
    base, loss0, w0, peak0 = _train()
    rec, loss1, w1, peak1 = _train("Standard")
    assert rec._ir.recomputed > 0 and base._ir.recomputed == 0
    assert loss1 == loss0
    for k in w0:
        np.testing.assert_array_equal(w1[k], w0[k])
    # activations freed after the forward (PopART's Standard heuristic recomputes 2 of the 14
    # forward ops of this small model: about 2 % less)
    assert peak1 < peak0
    assert rec.getCycleCount() > base.getCycleCount()            # the recomputed ops run again
    assert any(op.name.endswith("/recompute") for op in rec.ops())
    # as Graphcore's recomputing example checks it, through the session's pva report
    total = [sum(t.memory.total.excludingGaps for t in s.getReport().compilation.tiles) for s in (base, rec)]
    assert total[1] < total[0]
    assert max(t.memory.total.includingGaps for t in rec.getReport().compilation.tiles) == peak1


def test_manual_recomputation_and_mixing_error():
    s, loss, w, _ = _train(manual=True)
    assert s._ir.recomputed == 3
    with pytest.raises(popart.popart_exception, match="A mixture of auto and manual recomputation is not supported"):
        _train("Standard", manual=True)


@pytest.mark.parametrize("reduction", ["Mean", "Sum", "NoReduction"])
def test_nll_with_ignore_index_matches_torch(reduction):
    import torch
    rng = np.random.default_rng(2)
    p0 = rng.random((6, 5)).astype(np.float32) + 0.1
    p0 /= p0.sum(1, keepdims=True)
    lab0 = np.array([0, 3, -1, 4, -1, 2], np.int32)
    b = popart.Builder()
    p = b.addInitializedInputTensor(p0, "p")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [6]), "label")
    out = b.aiGraphcore.nllloss([p, lab], getattr(popart.ReductionType, reduction), ignoreIndex=-1)
    loss = out if reduction != "NoReduction" else b.aiGraphcore.identityloss([out], popart.ReductionType.Sum)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {out: popart.AnchorReturnType("All")}), loss,
                               popart.ConstSGD(0.0), popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({lab: lab0}, a))
    ref = torch.nn.functional.nll_loss(torch.log(torch.tensor(p0)), torch.tensor(lab0).long(), ignore_index=-1,
                                       reduction={"Mean": "mean", "Sum": "sum", "NoReduction": "none"}[reduction])
    np.testing.assert_allclose(a[out], ref.numpy(), rtol=1e-6, atol=1e-7)
    assert next(op for op in s.ops() if op.op_type == "Nll").lowering == "precise"


@pytest.mark.parametrize("reduction", ["Mean", "Sum", "NoReduction"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_l1_loss_lowered_over_the_tiles_matches_torch(reduction, dtype):
    """``l1loss`` runs through popops (map |x|, reduce) on the tiles holding its input, not as one
    generic vertex gathering the whole input on one tile (167 K cycles for a 256 x 256 loss)."""
    import torch
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((64, 48)).astype(dtype)
    b = popart.Builder()
    x = b.addInitializedInputTensor(x0, "x")
    out = b.aiGraphcore.l1loss([x], 0.25, getattr(popart.ReductionType, reduction))
    loss = out if reduction != "NoReduction" else b.aiGraphcore.identityloss([out], popart.ReductionType.Sum)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {out: popart.AnchorReturnType("All")}), loss,
                               popart.ConstSGD(0.0), popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({}, a))
    t = 0.25 * torch.tensor(x0.astype(np.float32)).abs()
    ref = {"Mean": t.mean(), "Sum": t.sum(), "NoReduction": t}[reduction].numpy()
    tol = 1e-6 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(a[out].astype(np.float32), ref, rtol=tol, atol=tol)
    assert a[out].dtype == dtype
    assert next(op for op in s.ops() if op.op_type == "L1").lowering == "precise"


def test_checkpoint_annotation_is_not_recomputed():
    """RecomputeAll with one op annotated Checkpoint: every forward op but that one is cloned
    into the backward pass (PopART's RecomputeType.Checkpoint; PopTorch's recomputationCheckpoint)."""
    counts = {}
    for checkpoint in (False, True):
        b = popart.Builder()
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
        w = b.addInitializedInputTensor(np.ones((8, 8), np.float32) * 0.1, "w")
        h = b.aiOnnx.sigmoid([b.aiOnnx.matmul([x, w])])
        if checkpoint:
            b.recomputeOutputInBackwardPass(h, popart.RecomputeType.Checkpoint)
        loss = b.aiGraphcore.identityloss([b.aiOnnx.tanh([h])])
        o = popart.SessionOptions()
        o.autoRecomputation = popart.RecomputationType.RecomputeAll
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
                                   loss, popart.ConstSGD(0.1), popart.DeviceManager().createIpuModelDevice({}),
                                   userOptions=o)
        counts[checkpoint] = {op.op_type for op in s._ir.ops if op.recomputes is not None}
    assert "Sigmoid" in counts[False] and "Sigmoid" not in counts[True]


def test_recomputation_type_takes_popart_integer_values():
    """PopART's C++ values (None 0, Standard 1, NormOnly 2, Pipeline 3, RecomputeAll 4), as
    Graphcore's examples pass ``int(popart.RecomputationType.Pipeline)`` or ``3`` through
    ``opts._Popart.set("autoRecomputation", ...)``; other values get a PopART error."""
    from openipu.popart.transforms.recompute import _mode
    assert [int(getattr(popart.RecomputationType, m)) for m in ("NoRecompute", "Standard", "NormOnly", "Pipeline",
                                                                 "RecomputeAll")] == [0, 1, 2, 3, 4]
    o = popart.SessionOptions()
    for v, want in [(1, "Standard"), (3, "Pipeline"), (4, "RecomputeAll"), ("RecomputationType.NormOnly", "NormOnly"),
                    (popart.RecomputationType.Standard, "Standard")]:
        o.autoRecomputation = v
        assert _mode(o) == want
    assert popart.RecomputationType.Pipeline == "Pipeline"
    o.autoRecomputation = 7
    with pytest.raises(popart.popart_exception, match="Unknown RecomputationType 7"):
        _mode(o)
    s, loss, w, peak = _train(int(popart.RecomputationType.Standard))
    s2, loss2, w2, peak2 = _train("Standard")
    assert loss == loss2 and peak == peak2 and s._ir.recomputed == s2._ir.recomputed > 0


def test_sharded_recomputation_copies_between_ipus_once():
    """Sharded over 2 IPUs, ``h`` (made on IPU 0) is first read on IPU 1 by a MatMul recomputed
    in the backward pass (``recomputeOutputInBackwardPass``). The copy to IPU 1 is a step of its
    own (PopART's IpuCopyOp), made once per step, not part of the MatMul's fragment that the
    backward pass runs again; the weights after the step are those without recomputation."""
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [8, 16]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [8]), "label")
    w0, w1 = (b.addInitializedInputTensor((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), f"w{i}")
              for i in range(2))
    with b.virtualGraph(0):
        h = b.aiOnnx.sigmoid([b.aiOnnx.matmul([x, w0])])
    with b.virtualGraph(1):
        m1 = b.aiOnnx.matmul([h, w1])
        y = b.aiOnnx.tanh([m1])
        loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([y], axis=1), lab])
    feeds = {x: rng.standard_normal((8, 16)).astype(np.float32), lab: rng.integers(0, 16, 8).astype(np.int32)}
    out = {}
    for mode in ("NoRecompute", "manual"):
        if mode == "manual":
            b.recomputeOutputInBackwardPass({m1, y})
        o = popart.SessionOptions()
        o.virtualGraphMode = popart.VirtualGraphMode.Manual
        s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
                                   loss, popart.ConstSGD(0.5),
                                   popart.DeviceManager().createIpuModelDevice({"numIPUs": 2, "tilesPerIPU": 16}),
                                   userOptions=o)
        s.prepareDevice()
        s.weightsFromHost()
        s.run(popart.PyStepIO(feeds, s.initAnchorArrays()))
        steps = s._engine._compiled.compiler.steps
        copies = sum(int(n) for st, n in zip(steps, s._engine._counts) if st.name == "Copy")
        out[mode] = (bool(s.getIr().recomputed), _weights(s, ["w0", "w1"]), copies)
    assert out["manual"][0] and not out["NoRecompute"][0]
    # the same copies run (to IPU 1 and the gradient back to IPU 0), none again for the recomputation
    assert out["manual"][2] == out["NoRecompute"][2] > 0, (out["manual"][2], out["NoRecompute"][2])
    for k in ("w0", "w1"):
        np.testing.assert_allclose(out["manual"][1][k], out["NoRecompute"][1][k], rtol=1e-6, atol=1e-7)
