"""PopLibs' conv tile order, supertile input receives and the ReduceAdd estimator (issue 40)."""

import numpy as np
import pytest

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import poplin
from openipu.poplibs.poplin import core, layout
from openipu.poplibs.poplin import plan as PL


def test_tile_order_is_linearize_conv_indices():
    """Output channels innermost, then field, batch, input channels, conv group
    (PopLibs linearizeConvIndices)."""
    plan = PL.ConvPlan("AMP", 16, 16, 16, 2, 3, 5, 7, 4, 1, 0.0, 0.0, 0.0, 0.0, 0, 0)
    assert layout.tile_index(plan, 0, 0, 0, 1, 0) == 1
    assert layout.tile_index(plan, 0, 0, 1, 0, 0) == 4
    assert layout.tile_index(plan, 0, 1, 0, 0, 0) == 4 * 5
    assert layout.tile_index(plan, 0, 0, 0, 0, 1) == 4 * 5 * 3
    assert layout.tile_index(plan, 1, 0, 0, 0, 0) == 4 * 5 * 3 * 7
    assert layout.tile_index(plan, 1, 2, 4, 3, 6) == plan.tiles - 1


def test_reduce_estimate_follows_get_reduce_cycle_estimate():
    """Hand-computed from PopLibs' getReduceCycleEstimate (half partials and output, 64-bit data
    path, 6 workers): single input 6 x (20 + (2 x 7 + 9) x ceil(128 / 6)) + 33 for 1,024 outputs
    of 8 partials; 1,000 outputs (a multiple of 8) the same way; 7 outputs (not a multiple of 8)
    take the multi-input vertex: 6 x (32 + 2 x 3 + 11) for 3 partials."""
    f = PL.conv_reduce_cycles
    out = f(np.array([1024, 1000, 7, 64]), np.array([8, 8, 3, 1]), False, False, 6, 64, 638_976)
    assert out.tolist() == [6 * (20 + 23 * 22) + 33, 6 * (20 + 23 * 21) + 33, 6 * (32 + 6 + 11), 0]
    # too many partials to gather in 1/16 of the tile: multi-input, 3 cycles per vector and partial
    big = int(f(np.array([8000]), np.array([4]), False, False, 6, 64, 100_000)[0])
    assert big == 6 * (32 + (3 * 4 + 8) * (1000 // 6 + 1))


def _conv_exchange(monkeypatch, scale):
    monkeypatch.setattr(core, "SUPERTILE_INPUT_RECV_SCALE", scale)
    p = poplin.ConvParams(poplar.HALF, 4, [8, 8], [1, 1], 64, 64, 1)
    h = OpHarness(tiles=16)
    x = h.input("x", np.ones(p.getInputShape(), np.float16), poplar.HALF, mapping="linear")
    w = h.input("w", np.ones(p.getWeightsShape(), np.float16), poplar.HALF, mapping="random")
    opts = {"partialsType": "half"}
    plan = poplin.plan_convolution(p, h.device.getTarget(), opts)
    y = poplin.convolution(h.graph, x, w, p, False, h.prog, "y", opts)
    out = h.run(out=y)["out"]
    assert np.all(out == 64)
    steps = [s for s in h.engine._exe.compiled.compiler.steps if getattr(s, "name", "").endswith("y/Conv")]
    return plan, sum(float(s.cost.duration["exchange"].max()) for s in steps)


def test_supertile_pairs_receive_inputs_together(monkeypatch):
    """With an even output-channel split, the two tiles of a supertile read the same input block
    and the conv's exchange phase is shorter than if each received it alone."""
    plan, paired = _conv_exchange(monkeypatch, 0.5)
    if plan.out_chan_split % 2:
        pytest.skip(f"the planner chose an odd output-channel split ({plan.out_chan_split})")
    _, alone = _conv_exchange(monkeypatch, 1.0)
    assert paired < alone


def test_planner_counts_inputs_at_twice_the_bandwidth_for_even_out_chan_splits():
    """ExchangeEstimator: input elements at twice the bytes per cycle when outChanSplit is even."""
    t = poplar.IPUModel("ipu2").createDevice().getTarget()
    pb = PL.Problem(1, 8, 64, 64, 8, 8, 8, 8, 1.0, 0.0, 1, 1, 1.0)
    c = {k: np.array([1, 1]) for k in ("gs", "bs", "fs", "ics", "so", "sb")}
    c["ocs"] = np.array([3, 4])
    _, _, exch, *_ = PL._evaluate(pb, c, "AMP", 16, False, poplar.HALF, poplar.HALF, t, 6)
    in_blk = 8 * 64 * 8 * 8 * 2            # bytes; the weights are local (no batch or field split)
    recv3 = in_blk * (1 - 1 / 3)
    recv4 = in_blk * (1 - 1 / 4) * 0.5
    epc = t.getExchangeBytesPerCycle()
    assert exch[0] - exch[1] == pytest.approx(np.ceil(recv3 / epc) - np.ceil(recv4 / epc))
