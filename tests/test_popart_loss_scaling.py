"""Automatic loss scaling (``automaticLossScalingSettings``): the factor doubles while the fp16
gradients stay low and halves when too many reach the top bin; the weight updates do not depend
on it; PopART's errors."""

from __future__ import annotations

import numpy as np
import pytest

import popart

ALL = popart.AnchorReturnType("All")
FACTOR, FINAL = "lossScaleUpdateFactor", "finalLossScale___FLOAT16"


def _model(dtype="FLOAT16", x_scale=1.0):
    b = popart.Builder()
    np_t = np.float16 if dtype == "FLOAT16" else np.float32
    x = b.addInputTensor(popart.TensorInfo(dtype, [8, 16]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [8]), "lab")
    w0 = b.addInitializedInputTensor((np.random.RandomState(1).randn(16, 32) * 0.3).astype(np_t), "w0")
    w1 = b.addInitializedInputTensor((np.random.RandomState(2).randn(32, 4) * 0.3).astype(np_t), "w1")
    h = b.aiOnnx.relu([b.aiOnnx.matmul([b.aiOnnx.mul([x, b.aiOnnx.constant(np.array(x_scale, np_t))]), w0])])
    p = b.aiOnnx.softmax([b.aiOnnx.matmul([h, w1])], axis=1)
    loss = b.aiGraphcore.nllloss([p, lab], popart.ReductionType.Sum)
    return b, x, lab, loss


def _session(als=True, ls=(8.0, False), af=1, rf=1, x_scale=1.0, dtype="FLOAT16", **settings):
    b, x, lab, loss = _model(dtype, x_scale)
    o = popart.SessionOptions()
    o.automaticLossScalingSettings = popart.AutomaticLossScalingSettings(enabled=als, **settings)
    if af > 1:
        o.enableGradientAccumulation, o.accumulationFactor = True, af
    if rf > 1:
        o.enableReplicatedGraphs, o.replicatedGraphCount = True, rf
    anchors = {loss: ALL}
    if als:
        anchors.update({FINAL: ALL, FACTOR: popart.AnchorReturnType("Final")})
    opt = popart.SGD({"defaultLearningRate": (0.01, False), "lossScaling": ls})
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, anchors), loss, opt,
                               popart.DeviceManager().createIpuModelDevice({"numIPUs": rf}), userOptions=o)
    return s, x, lab, loss


def _steps(s, x, lab, n, af=1, rf=1, seed=0):
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    rs = np.random.RandomState(seed)
    shp = [d for d in (af, rf) if d > 1]
    out = []
    for _ in range(n):
        s.run(popart.PyStepIO({x: rs.randn(*shp, 8, 16).astype(np.float16),
                               lab: rs.randint(0, 4, shp + [8]).astype(np.int32)}, a))
        out.append({k: v.copy() for k, v in a.items()})
    return out


def test_the_factor_doubles_while_gradients_stay_small_and_updates_do_not_depend_on_it():
    s, x, lab, loss = _session()
    out = _steps(s, x, lab, 4)
    assert [float(o[FINAL]) for o in out] == [8.0, 16.0, 32.0, 64.0]
    assert float(out[-1][FACTOR]) == 16.0
    assert {op.op_type for op in s.ops()} >= {"Histogram", "LossScaleUpdate"}
    # the same steps with the loss scaling fixed at 8: the same weights, within fp16 rounding
    ref, x2, lab2, _ = _session(als=False)
    _steps(ref, x2, lab2, 4)
    w = {}
    for sess in (s, ref):
        sess.weightsToHost()
        buf = {"w0": np.zeros((16, 32), np.float16), "w1": np.zeros((32, 4), np.float16)}
        sess.readWeights(popart.PyWeightsIO(buf))
        w[sess is s] = buf
    for k in ("w0", "w1"):
        np.testing.assert_allclose(w[True][k].astype(np.float32), w[False][k].astype(np.float32), rtol=2e-2,
                                   atol=2e-3)


def test_the_factor_halves_when_gradients_reach_the_top_bin():
    """Inputs scaled by 1000 and a loss scaling of 64: the weight gradients pass 0.125 x 65504
    (the bin edge), so the factor halves each step."""
    s, x, lab, loss = _session(ls=(64.0, False), x_scale=1000.0)
    out = _steps(s, x, lab, 2)
    assert [float(o[FINAL]) for o in out] == [64.0, 32.0]


def test_update_period_accumulation_and_replication():
    """With gradient accumulation the statistics of the micro-batches are summed and the factor
    changes once per batch (after the flush of the outer fragment); replicas all-reduce them;
    updatePeriod 2 changes it every second step."""
    s, x, lab, loss = _session(af=2, rf=2, updatePeriod=2)
    out = _steps(s, x, lab, 4, af=2, rf=2)
    finals = [float(np.asarray(o[FINAL]).reshape(-1)[0]) for o in out]
    assert finals == [8.0, 8.0, 16.0, 16.0]
    ops = s.ops()
    assert [op.execution_context for op in ops if op.op_type == "LossScaleUpdate"] == ["AccumulateOuterFragment"]
    assert any(op.op_type == "ReplicatedAllReduceInplace" and op.inputs[0] == "autoLossScaleStats" for op in ops)


@pytest.mark.parametrize("case,match", [
    ("const", r"^\[AutomaticLossScale transform\] The optimizer must have non-const loss scaling"),
    ("edge", r"\[AutomaticLossScale transform\] Out of range value for 'binEdgeLocation'"),
    ("fp32", r"\[AutomaticLossScale transform\] No tracked gradient tensors of type fp16 were found"),
    ("track", r"toTrackTensors has been set, but gradientTensorTrackingMethod has not been set"),
])
def test_automatic_loss_scaling_errors(case, match):
    kw = {"const": {"ls": (8.0, True)}, "edge": {"binEdgeLocation": 1.5}, "fp32": {"dtype": "FLOAT"},
          "track": {"toTrackTensors": ["w0"]}}[case]
    with pytest.raises(popart.popart_exception, match=match):
        _session(**kw)
