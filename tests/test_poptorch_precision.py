"""Options.Precision settings that only IPU hardware honours, on the simulated device: stochastic
rounding of float16 results (unbiased, seeded) and floating-point exceptions (inf / NaN made from
finite inputs stop the run), against numpy references."""

import os

import numpy as np
import pytest
import torch

import poptorch
from openipu.popart.fp_behaviour import check_finite, stochastic_round_half

#: Stochastic rounding and floating-point exceptions are honoured by the IR executor only
#: (popart/options.py); the device-storage emulation (``make test-device``) rounds to nearest and
#: computes IEEE results.
IR_ONLY = pytest.mark.skipif(os.environ.get("OPENIPU_EXECUTION") == "device",
                             reason="honoured by the IR executor only, not by the device-storage emulation")


def _neighbours(x32):
    """numpy reference: the float16 values below and above each float32 value."""
    with np.errstate(over="ignore"):
        near = x32.astype(np.float16)
        up = np.nextafter(near, np.float16(np.inf))
    down = np.nextafter(near, np.float16(-np.inf))
    lo = np.where(near.astype(np.float32) > x32, down, near)
    hi = np.where(near.astype(np.float32) > x32, near, np.where(near.astype(np.float32) < x32, up, near))
    return lo, hi


def test_stochastic_rounding_is_unbiased_and_seeded():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * 3).astype(np.float32)
    x[:10] = [1.0, -2.5, 0.0, 65504.0, 1e-7, 7e5, -7e5, 0.1, 3.0, np.float32(1 + 2 ** -12)]
    out = stochastic_round_half(torch.from_numpy(x), torch.Generator().manual_seed(5)).numpy()
    assert out.dtype == np.float16
    lo, hi = _neighbours(x)
    finite = np.abs(x) < 65504
    assert np.all((out[finite] == lo[finite]) | (out[finite] == hi[finite]))
    assert out[0] == 1.0 and out[1] == -2.5 and out[2] == 0.0 and out[3] == 65504.0     # exact stay
    assert np.isinf(out[5]) and np.isinf(out[6])                                          # beyond: RN
    # P(up) = (x - lo) / (hi - lo): the mean error of many draws of one value is ~0
    v = np.full(40000, np.float32(1 + 2 ** -12), np.float32)                              # a quarter ulp
    r = stochastic_round_half(torch.from_numpy(v), torch.Generator().manual_seed(1)).numpy().astype(np.float64)
    assert abs((r > 1).mean() - 0.25) < 0.01
    assert abs(r.mean() - float(v[0])) < 2e-5
    again = stochastic_round_half(torch.from_numpy(x), torch.Generator().manual_seed(5)).numpy()
    other = stochastic_round_half(torch.from_numpy(x), torch.Generator().manual_seed(6)).numpy()
    assert np.array_equal(out, again) and not np.array_equal(out, other)
    err = out[finite].astype(np.float64) - x[finite]
    assert abs(err.mean()) < 3e-4


def test_stochastic_rounding_at_the_edges_of_float16():
    """Subnormals (fewer mantissa bits), below the smallest subnormal, the top of the range, signed
    zeros and non-finite values."""
    g = torch.Generator().manual_seed(2)
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 7e4, 65533.0, 65510.0, 65504.0], np.float32)
    out = stochastic_round_half(torch.from_numpy(x), g).numpy()
    assert np.isposinf(out[0]) and np.isneginf(out[1]) and np.isnan(out[2])
    assert out[3] == 0 and not np.signbit(out[3]) and out[4] == 0 and np.signbit(out[4])
    assert np.isposinf(out[5]) and np.isposinf(out[6]) and out[7] == 65504.0 and out[8] == 65504.0
    for value in (3.0e-6, -1.0e-6, 1.0e-8, -2.0e-8):    # subnormal steps of 2**-24; below the smallest one
        v = np.full(100000, np.float32(value), np.float32)
        r = stochastic_round_half(torch.from_numpy(v), g).numpy()
        lo, hi = _neighbours(v[:1])
        assert set(np.unique(r).tolist()) <= {float(lo[0]), float(hi[0])}
        step = float(hi[0]) - float(lo[0])
        assert abs(r.astype(np.float64).mean() - float(v[0])) < 4 * step / np.sqrt(len(v))


class Halve(torch.nn.Module):
    def forward(self, x):
        return x.half() * 1.0


@pytest.mark.slow
@IR_ONLY
def test_poptorch_stochastic_rounding_of_a_half_cast():
    x = torch.full((8, 512), 1 + 2 ** -12)
    plain = poptorch.inferenceModel(Halve())(x)
    assert plain.dtype == torch.float16 and bool((plain == 1).all())       # round to nearest
    opts = poptorch.Options().randomSeed(42)
    opts.Precision.enableStochasticRounding(True)
    a = poptorch.inferenceModel(Halve(), opts)(x)
    frac = (a > 1).float().mean().item()
    assert 0.2 < frac < 0.3
    b = poptorch.inferenceModel(Halve(), opts.clone())(x)
    assert torch.equal(a, b)                                                # same seed, same draws


class Divide(torch.nn.Module):
    def forward(self, x, y):
        return x / y, torch.exp(x)


@IR_ONLY
def test_floating_point_exceptions_raise_where_the_ipu_traps():
    x, y = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 0.0, 2.0])
    q, _ = poptorch.inferenceModel(Divide())(x, y)
    assert torch.isinf(q[1])                                                # off: IEEE result
    opts = poptorch.Options()
    opts.Precision.enableFloatingPointExceptions(True)
    model = poptorch.inferenceModel(Divide(), opts)
    with pytest.raises(poptorch.Error, match="Floating point exception: overflow or division by zero"):
        model(x, y)
    q, e = model(x, torch.tensor([1.0, 4.0, 2.0]))                          # finite: runs
    torch.testing.assert_close(q, x / torch.tensor([1.0, 4.0, 2.0]))
    with pytest.raises(poptorch.Error, match="overflow"):
        model(torch.tensor([1.0, 100.0, 3.0]), torch.ones(3))              # exp(100) overflows


def test_check_finite_lets_inputs_inf_propagate():
    inf = torch.tensor([float("inf"), 1.0])
    check_finite("Add", "t", [inf], [inf + 1])                              # made upstream: quiet
    with pytest.raises(Exception, match="invalid operation"):
        check_finite("Sub", "t", [torch.ones(2)], [torch.tensor([float("nan"), 0.0])])
