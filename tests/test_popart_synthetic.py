"""``SessionOptions.syntheticDataMode``: inputs filled on the device (no host data, no host I/O in
the prediction), anchors not copied back."""

from __future__ import annotations

import numpy as np
import pytest

import popart

B, N = 512, 64


def _session(mode, bps=1):
    """w [N] trained on loss = sum(x @ w) (identityloss Sum) with ConstSGD(lr): one step moves w
    by -lr * sum_b x[b, :], so w's change shows the statistics of the synthetic x."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [B, N]), "x")
    w = b.addInitializedInputTensor(np.zeros([N, 1], np.float32), "w")
    y = b.aiOnnx.matmul([x, w])
    loss = b.aiGraphcore.identityloss([y], reduction=popart.ReductionType.Sum)
    o = popart.SessionOptions()
    if mode is not None:
        o.syntheticDataMode = getattr(popart.SyntheticDataMode, mode)
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(bps, {y: popart.AnchorReturnType("All")}),
                               loss=loss, optimizer=popart.ConstSGD(1.0),
                               deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}),
                               userOptions=o)
    s.prepareDevice()
    s.weightsFromHost()
    return s, x, y


def _step(s, x, y, bps=1):
    out = s.initAnchorArrays()
    out[y][...] = 7.0
    s.run(popart.PyStepIO({x: np.ones([bps, B, N], np.float32).reshape(-1, N)}, out))
    w = {"w": np.zeros([N, 1], np.float32)}
    s.weightsToHost()
    s.readWeights(popart.PyWeightsIO(w))
    return w["w"].reshape(-1), out[y]


@pytest.mark.parametrize("mode,var", [("RandomNormal", 1.0), ("RandomUniform", 1.0 / 3.0)])
def test_random_inputs_are_made_on_the_device_with_their_distribution(mode, var):
    s, x, y = _session(mode)
    w, anchor = _step(s, x, y)
    z = -w / np.sqrt(B)                       # sum of B draws over sqrt(B): mean 0, variance var
    assert abs(z.mean()) < 0.5 and 0.6 * var < z.var() < 1.5 * var
    assert (anchor == 7.0).all()              # anchors are not copied to the host
    if mode == "RandomUniform":
        assert np.abs(w).max() <= B           # every draw within [-1, 1)


def test_zeros_ignore_the_host_data():
    s, x, y = _session("Zeros")
    w, anchor = _step(s, x, y)
    np.testing.assert_array_equal(w, 0.0)      # host data were ones: they would move w by -B
    assert (anchor == 7.0).all()
    real, xr, yr = _session(None)
    w_real, anchor_real = _step(real, xr, yr)
    np.testing.assert_allclose(w_real, -B)
    assert (anchor_real == 0).all()            # x @ w with w = 0 before the update


def test_synthetic_data_has_no_host_exchange_in_the_prediction():
    from openipu.poplar.profile import run_breakdown
    cycles = {}
    for mode in (None, "Zeros"):
        s, x, y = _session(mode)
        s.run(popart.PyStepIO({x: np.ones([B, N], np.float32)}, s.initAnchorArrays()))
        cycles[mode] = run_breakdown(s._engine)["by_category"]        # the step just run
    assert cycles[None]["host_exchange"] > 0
    assert cycles["Zeros"]["host_exchange"] == 0
