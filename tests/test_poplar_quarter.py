"""Poplar's fp8 type with its metadata: ``poplar.QuarterMetadata`` (format F143 / F152, scale
bias), metadata tensors, ``popops.cast`` to and from QUARTER with metadata, and poplin matrix
products on QUARTER operands of either format at the ipu21 fp8 rate, against torch float8
references."""

import numpy as np
import pytest
import torch

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import poplin, popops

F143, F152 = poplar.QuarterMetadata.Format.F143, poplar.QuarterMetadata.Format.F152
TORCH = {F143: (torch.float8_e4m3fn, 448.0), F152: (torch.float8_e5m2, 57344.0)}


def _fp8(x: np.ndarray, fmt, scale: int) -> np.ndarray:
    """The value of ``x`` cast to QUARTER with metadata ``(fmt, scale)``: ``fp8(x * 2**-scale) * 2**scale``."""
    dt, mx = TORCH[fmt]
    t = torch.from_numpy(np.asarray(x, np.float32)) * 2.0 ** -scale
    return (t.clamp(-mx, mx).to(dt).float() * 2.0 ** scale).numpy()


def test_quarter_metadata_api_and_errors():
    m = poplar.QuarterMetadata(F152, -3)
    assert m.getFormat() == F152 and m.getScale() == -3
    assert m == poplar.QuarterMetadata("F152", -3) and m != poplar.QuarterMetadata(F143, -3)
    assert poplar.QuarterMetadata().getFormat() == F143 and poplar.QuarterMetadata().getScale() == 0
    with pytest.raises(poplar.poplar_error, match=r"scale bias 32 is outside \[-32, 31\]"):
        poplar.QuarterMetadata(F143, 32)
    with pytest.raises(poplar.poplar_error, match="unknown format"):
        poplar.QuarterMetadata("F161", 0)
    assert poplar.QUARTER.requiresMetadata() and not poplar.HALF.requiresMetadata()
    h = OpHarness(tiles=4, version="ipu21")
    md = poplar.createVariableMetadataTensor(h.graph, F152, 1)
    assert md.elementType() == poplar.QUARTER_METADATA and md.shape() == [1]
    x = h.input("x", np.ones(8, np.float16))
    with pytest.raises(poplar.graph_connection_error, match="only a cast to QUARTER takes metadata"):
        popops.cast(h.graph, x, poplar.HALF, md, h.prog)
    with pytest.raises(poplar.graph_connection_error, match="QUARTER_METADATA"):
        popops.cast(h.graph, x, poplar.QUARTER, x, h.prog)
    q = h.graph.addVariable(poplar.QUARTER, md, [4, 2], "q")
    assert q.hasMetadata() and q.elementType() == poplar.QUARTER and q.elementType().torch_dtype == torch.float8_e5m2
    assert q.reshape([8])[2:5].hasMetadata()                      # views keep it
    c = h.graph.clone(q, "c")
    assert c.hasMetadata() and c.elementType().torch_dtype == torch.float8_e5m2
    assert not h.graph.addVariable(poplar.QUARTER, [3], "plain").hasMetadata()
    with pytest.raises(poplar.poplar_error, match="no metadata"):
        h.graph.addVariable(poplar.QUARTER, [3], "plain2").getMetadata()


@pytest.mark.parametrize("fmt,scale", [(F143, 0), (F143, -4), (F152, 0), (F152, 3)])
def test_cast_to_quarter_and_back_is_a_torch_fp8_round_trip(fmt, scale):
    rng = np.random.default_rng(7)
    X = (rng.standard_normal(200) * 2.0 ** rng.integers(-6, 8, 200)).astype(np.float16)
    X[:3] = [1e4, -6e4, 0.0]                                          # saturate / zero
    h = OpHarness(tiles=4, version="ipu21")
    x = h.input("x", X)
    md = poplar.createVariableMetadataTensor(h.graph, fmt, scale)
    q = popops.cast(h.graph, x, poplar.QUARTER, md, h.prog, "toQuarter")
    assert q.hasMetadata() and q.elementType() == poplar.QUARTER
    out = h.run(y=popops.cast(h.graph, q, poplar.FLOAT, h.prog, "fromQuarter"))["y"]
    ref = _fp8(X.astype(np.float32), fmt, scale)
    np.testing.assert_array_equal(out, ref)
    assert len(np.unique(out)) > 50


def test_scale_tensor_sets_the_metadata_at_run_time():
    """``createVariableMetadataTensor(graph, format, scaleTensor, prog)``: the scale is an INT
    tensor read when the program runs; casts with that metadata use it."""
    X = np.linspace(-3000, 3000, 64).astype(np.float16)      # saturates F143 at scale 0
    h = OpHarness(tiles=2, version="ipu21")
    x = h.input("x", X)
    s = h.input("s", np.array(5, np.int32), mapping=0)
    md = poplar.createVariableMetadataTensor(h.graph, F143, s, h.prog, "md")
    q = popops.cast(h.graph, x, poplar.QUARTER, md, h.prog)
    out = h.run(y=popops.cast(h.graph, q, poplar.HALF, h.prog))["y"]
    np.testing.assert_array_equal(out.astype(np.float32), _fp8(X.astype(np.float32), F143, 5).astype(np.float16))
    assert not np.array_equal(out, _fp8(X.astype(np.float32), F143, 0).astype(np.float16))   # the scale matters


def _conv_compute_cycles(h) -> float:
    return float(sum(s.cost.duration["compute"].sum() for s in h.engine._exe.compiled.compiler.steps
                     if s.name.endswith("/Conv")))


def _quarter_matmul(fa, sa, fb, sb, A, B):
    h = OpHarness(tiles=16, version="ipu21")
    a, b = h.input("a", A), h.input("b", B)
    qa = popops.cast(h.graph, a, poplar.QUARTER, poplar.createVariableMetadataTensor(h.graph, fa, sa), h.prog)
    qb = popops.cast(h.graph, b, poplar.QUARTER, poplar.createVariableMetadataTensor(h.graph, fb, sb), h.prog)
    c = poplin.matMul(h.graph, qa, qb, h.prog, poplar.FLOAT, "c", {"partialsType": "float"})
    return h.run(out=c)["out"], _conv_compute_cycles(h)


def test_quarter_matmul_runs_both_formats_at_the_fp8_rate_with_their_scales():
    """poplin.matMul on QUARTER operands: F143 x F143, F152 x F152 and F143 x F152 take the same
    AMP cycles, fewer than half's, and compute with the operands' values: the fp8 elements times
    their metadata scales (torch float8_e4m3fn / float8_e5m2 references)."""
    rng = np.random.default_rng(11)
    m, k, n = 96, 512, 128
    A = (rng.standard_normal((m, k)) * 20).astype(np.float16)
    B = (rng.standard_normal((k, n)) / 30).astype(np.float16)
    res, cyc = {}, {}
    for fa, sa, fb, sb in [(F143, 0, F143, -6), (F152, 2, F152, -5), (F143, 1, F152, -7)]:
        out, cyc[(fa, fb)] = _quarter_matmul(fa, sa, fb, sb, A, B)
        ref = _fp8(A, fa, sa).astype(np.float64) @ _fp8(B, fb, sb).astype(np.float64)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        res[(fa, fb)] = out
    assert cyc[(F152, F152)] == cyc[(F143, F143)] == cyc[(F143, F152)]
    h = OpHarness(tiles=16, version="ipu21")
    c = poplin.matMul(h.graph, h.input("a", A), h.input("b", B), h.prog, poplar.FLOAT, "c", {"partialsType": "float"})
    h.run(out=c)
    half = _conv_compute_cycles(h)
    print(f"matMul {m}x{k}x{n} on 16 ipu21 tiles, predicted AMP compute cycles: half {half:,.0f}, "
          f"quarter F143 {cyc[(F143, F143)]:,.0f}, F152 {cyc[(F152, F152)]:,.0f}")
    assert cyc[(F152, F152)] < 0.75 * half
    # E5M2 rounds coarser than E4M3: the products differ
    assert np.abs(res[(F152, F152)] - res[(F143, F143)]).max() > 1e-3 * np.abs(res[(F143, F143)]).max()


def test_quarter_constant_with_metadata_stores_the_scaled_fp8_values():
    h = OpHarness(tiles=2, version="ipu21")
    V = np.array([0.3, -5.0, 1000.0, 1e6], np.float32)
    c = h.graph.addConstant(poplar.QUARTER, poplar.QuarterMetadata(F152, 4), [4], V, "c")
    h.graph.setTileMapping(c, 0)
    assert c.hasMetadata()
    out = h.run(y=popops.cast(h.graph, c, poplar.FLOAT, h.prog))["y"]
    np.testing.assert_array_equal(out, _fp8(V, F152, 4))


@pytest.mark.parametrize("m,k,n,amp,serial", [(512, 128, 512, 0.04, 4), (1024, 64, 256, 0.01, 16)])
def test_quarter_matmul_in_serial_splits_keeps_the_scales(m, k, n, amp, serial):
    """A plan with serial splits copies slices of the operands into buffers without metadata: the
    products still apply the operands' metadata scales."""
    h = OpHarness(tiles=16, version="ipu21")
    plan = poplin.plan_matmul(1, m, k, n, poplar.QUARTER, h.device.getTarget(), {"availableMemoryProportion": amp})
    assert plan.out_chan_serial == serial
    rng = np.random.default_rng(0)
    A = rng.standard_normal((m, k)).astype(np.float16)
    B = rng.standard_normal((k, n)).astype(np.float16)
    qa = popops.cast(h.graph, h.input("a", A), poplar.QUARTER, poplar.createVariableMetadataTensor(h.graph, F152, 1),
                     h.prog)
    qb = popops.cast(h.graph, h.input("b", B), poplar.QUARTER, poplar.createVariableMetadataTensor(h.graph, F143, -2),
                     h.prog)
    c = poplin.matMul(h.graph, qa, qb, h.prog, poplar.FLOAT, "c", {"availableMemoryProportion": amp})
    out = h.run(out=c)["out"]
    ref = _fp8(A, F152, 1).astype(np.float64) @ _fp8(B, F143, -2).astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
