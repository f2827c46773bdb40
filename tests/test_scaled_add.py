"""popops.scaledAddTo / scaledSubtractFrom against numpy, over types, mappings and overloads."""

import numpy as np
import pytest

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popops
from openipu.poplibs.popops.scaled_add import scaled_add_cycles

TYPES = {"float": np.float32, "half": np.float16, "int": np.int32}


def _data(h, dt, shape):
    if dt == np.int32:
        return h.rng.integers(-50, 50, shape).astype(dt)
    return h.rng.standard_normal(shape).astype(dt)


@pytest.mark.parametrize("tname", ["float", "half", "int"])
@pytest.mark.parametrize("form", ["const", "tensor", "ab_const", "ab_tensor", "x_minus_ax", "sub", "sub_tensor"])
@pytest.mark.parametrize("mapping", ["linear", "random", "blocks"])
def test_scaled_add_forms(tname, form, mapping):
    dt = TYPES[tname]
    h = OpHarness(tiles=8, seed=hash((tname, form, mapping)) % 1000)
    shape = (5, 13)
    a0, b0 = _data(h, dt, shape), _data(h, dt, shape)
    A = h.input("A", a0, mapping=mapping)
    B = h.input("B", b0, mapping="random")
    sa, sb = (3, -2) if dt == np.int32 else (0.75, -1.5)
    sa_t = h.input("sa", np.array([sa], dt), mapping=5)
    sb_t = h.input("sb", np.array([sb], dt), mapping=2)
    g, p = h.graph, h.prog
    a, b = a0.astype(np.float64), b0.astype(np.float64)
    if form == "const":
        popops.scaledAddTo(g, A, B, sb, p)
        ref = a + sb * b
    elif form == "tensor":
        popops.scaledAddTo(g, A, B, sb_t, p, "withTensor")
        ref = a + sb * b
    elif form == "ab_const":
        popops.scaledAddTo(g, A, sa, B, sb, p)
        ref = sa * a + sb * b
    elif form == "ab_tensor":
        popops.scaledAddTo(g, A, sa_t, B, sb_t, p)
        ref = sa * a + sb * b
    elif form == "x_minus_ax":
        popops.scaledAddTo(g, A, sa_t, B, sb_t, p, popops.ScaledAddSpecialisation.X_MINUS_AX_PLUS_BY)
        ref = a - sa * a + sb * b
    elif form == "sub":
        popops.scaledSubtractFrom(g, A, B, sb, p)
        ref = a - sb * b
    else:
        popops.scaledSubtractFrom(g, A, sa_t, B, sb_t, p)
        ref = sa * a - sb * b
    out = h.run(A=A)["A"]
    assert out.dtype == dt
    tol = {"float": 1e-5, "half": 2e-2, "int": 0}[tname]
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol * 10)
    assert h.cycles() > 0


def test_half_a_float_b_and_repeated_updates():
    h = OpHarness(tiles=4)
    a0 = np.linspace(-1, 1, 40).astype(np.float16)
    b0 = np.linspace(0, 2, 40).astype(np.float32)
    A = h.input("A", a0)
    B = h.input("B", b0, mapping="random")
    body = poplar.program.Sequence()
    popops.scaledAddTo(h.graph, A, B, 0.5, body)
    h.prog.add(poplar.program.Repeat(3, body))
    out = h.run(A=A)["A"]
    np.testing.assert_allclose(out, a0.astype(np.float32) + 1.5 * b0, rtol=2e-3, atol=2e-3)


def test_estimator_matches_poplibs_formula():
    target = OpHarness(tiles=4).graph.getTarget()
    # float, n=12: 6 vectors, 1 per worker, no remainder
    # supervisor 21 + 6 + 11 + 7 + 12 = 57; worker 15 + 6 + 2 + 1 + 1 = 25; total 57 + 6*25
    assert scaled_add_cycles(np.array([12]), poplar.FLOAT, poplar.FLOAT, target)[0] == 57 + 6 * 25
    # half, n=4*6*3+2: 3 vectors per worker (inner loop 3 cycles), remainder of 2
    n = np.array([74])
    exp = (21 + 6 + 11 + 13 + 12) + 6 * (15 + 6 + 3 * 2 + 2 + 1 + 5 + 7 + 1)
    assert scaled_add_cycles(n, poplar.HALF, poplar.HALF, target)[0] == exp
    # int: 53 + 26*(n//3) + 6 + 26*(n%3) + 8
    assert scaled_add_cycles(np.array([10]), poplar.INT, poplar.INT, target)[0] == 53 + 26 * 3 + 6 + 26 + 8
    # monotone in n; optimizeForSpeed (memory constrained inner loop 2) is faster on big tiles
    ns = np.arange(1, 2000, 37)
    c = scaled_add_cycles(ns, poplar.FLOAT, poplar.FLOAT, target)
    assert np.all(np.diff(c) >= 0)
    fast = scaled_add_cycles(np.array([4000]), poplar.FLOAT, poplar.FLOAT, target, mem_constrained=True)
    assert fast[0] < scaled_add_cycles(np.array([4000]), poplar.FLOAT, poplar.FLOAT, target)[0]


def test_cost_follows_a_mapping():
    cycles = {}
    for mapping in ("tile0", "linear"):
        h = OpHarness(tiles=16)
        A = h.input("A", np.ones(4096, np.float32), mapping=mapping)
        B = h.graph.clone(A, "B")
        h.graph.setInitialValue(B, np.ones(4096, np.float32))
        popops.scaledAddTo(h.graph, A, B, 2.0, h.prog, "", {"optimizeForSpeed": "true"})
        assert (h.run(A=A)["A"] == 3).all()
        cycles[mapping] = h.cycles()
    assert cycles["linear"] < cycles["tile0"] / 4


def test_errors_leave_graph_usable():
    h = OpHarness(tiles=4)
    A = h.input("A", np.zeros((2, 3), np.float32))
    B = h.input("B", np.ones((3, 2), np.float32))
    Bi = h.input("Bi", np.ones((2, 3), np.int32))
    C = h.graph.addConstant(poplar.FLOAT, [2, 3], 1.0)
    h.graph.setTileMapping(C, 0)
    with pytest.raises(poplar.index_error, match="shape"):
        popops.scaledAddTo(h.graph, A, B, 1.0, h.prog)
    with pytest.raises(poplar.graph_connection_error, match="cast"):
        popops.scaledAddTo(h.graph, A, Bi, 1.0, h.prog)
    with pytest.raises(poplar.graph_connection_error, match="in place"):
        popops.scaledAddTo(h.graph, C, A, 1.0, h.prog)
    with pytest.raises(poplar.invalid_option, match="unknown option"):
        popops.scaledAddTo(h.graph, A, A, 1.0, h.prog, "", {"bogus": "1"})
    with pytest.raises(poplar.graph_connection_error, match="scalar"):
        popops.scaledAddTo(h.graph, A, A, A, h.prog)
    popops.scaledAddTo(h.graph, A, B.transpose(), 2.0, h.prog)
    assert (h.run(A=A)["A"] == 2).all()
