"""popnn non-linearities, softmax and logSoftmax: forward and input gradients against torch.autograd."""


import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popnn
from openipu.poplibs.popnn._common import elementwise_cycles

NLT = popnn.NonLinearityType
DT = {"float": np.float32, "half": np.float16}


def torch_fn(nl):
    return {
        NLT.SIGMOID: torch.sigmoid, NLT.RELU: torch.relu, NLT.TANH: torch.tanh,
        NLT.GELU: lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
        NLT.GELU_ERF: torch.nn.functional.gelu, NLT.SWISH: torch.nn.functional.silu,
        NLT.HARD_SIGMOID: lambda x: torch.clamp(0.2 * x + 0.5, 0, 1),
        NLT.SOFTMAX: lambda x: torch.softmax(x, -1), NLT.SOFTMAX_STABLE: lambda x: torch.softmax(x, -1),
        NLT.SOFTMAX_SCALED: lambda x: 62000.0 * torch.softmax(x, -1),
    }[nl]


GRAD_FROM_INPUT = {NLT.GELU, NLT.GELU_ERF, NLT.SWISH, NLT.HARD_SIGMOID}


def _run(nl, shape, tname, mapping, seed=0, in_place=False):
    h = OpHarness(tiles=8, seed=seed)
    x = (h.rng.standard_normal(shape) * 2).astype(DT[tname])
    g = h.rng.standard_normal(shape).astype(DT[tname])
    X = h.input("x", x, mapping=mapping)
    G = h.input("g", g, mapping="random")
    if in_place:
        Xc = h.graph.clone(X, "xc")
        h.prog.add(poplar.program.Copy(X, Xc))
        popnn.nonLinearityInPlace(h.graph, nl, Xc, h.prog)
        Y = Xc
    else:
        Y = popnn.nonLinearity(h.graph, nl, X, h.prog)
    D = popnn.nonLinearityInputGradient(h.graph, nl, X if nl in GRAD_FROM_INPUT else Y, G, h.prog)
    r = h.run(y=Y, d=D, x=X)
    assert (r["x"] == x).all(), "the input must not change"
    r["g"] = g
    xt = torch.tensor(x.astype(np.float64), requires_grad=True)
    yt = torch_fn(nl)(xt)
    (dt,) = torch.autograd.grad(yt, xt, torch.tensor(g.astype(np.float64)))
    return r, yt.detach().numpy(), dt.numpy(), h


@pytest.mark.parametrize("nl", list(NLT))
@pytest.mark.parametrize("tname", ["float", "half"])
def test_forward_and_gradient_vs_torch(nl, tname):
    shape = (3, 4, 11)
    r, y_ref, d_ref, h = _run(nl, shape, tname, "random", seed=list(NLT).index(nl))
    assert r["y"].dtype == DT[tname] and r["y"].shape == shape
    scale = 62000.0 if nl == NLT.SOFTMAX_SCALED else 1.0
    rt = 1e-5 if tname == "float" else 1e-2
    at = (1e-5 if tname == "float" else 5e-3) * scale
    if nl == NLT.SOFTMAX_SCALED and tname == "half":
        rt, at = 2e-2, 60.0
    np.testing.assert_allclose(r["y"].astype(np.float64), y_ref, rtol=rt, atol=at)
    if nl == NLT.SOFTMAX_SCALED:
        # PopLibs takes the gradient with the *scaled* output: g*y - y*sum(g*y) (softmaxInputGradientImpl),
        # which is scale x the true gradient; in half sum(g*y) can overflow, as on the IPU.
        if tname == "half":
            return
        gy = r["g"].astype(np.float64) * y_ref
        d_ref = gy - y_ref * gy.sum(-1, keepdims=True)
        rt, at = 1e-4, 1e-3 * np.abs(d_ref).max()
    np.testing.assert_allclose(r["d"].astype(np.float64), d_ref, rtol=rt * 2, atol=at * 4)


@pytest.mark.parametrize("nl", [NLT.RELU, NLT.GELU, NLT.SOFTMAX_STABLE])
def test_in_place_matches(nl):
    r, y_ref, _, _ = _run(nl, (6, 9), "float", "blocks", in_place=True)
    np.testing.assert_allclose(r["y"], y_ref, rtol=1e-5, atol=1e-6)


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 40), mapping=st.sampled_from(["linear", "random", "blocks", "tile0"]),
       stable=st.booleans())
def test_softmax_shapes_and_mappings(rows, cols, mapping, stable):
    nl = NLT.SOFTMAX_STABLE if stable else NLT.SOFTMAX
    r, y_ref, d_ref, _ = _run(nl, (rows, cols), "float", mapping, seed=rows * 100 + cols)
    np.testing.assert_allclose(r["y"], y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r["d"], d_ref, rtol=1e-4, atol=1e-6)


def test_softmax_1d_and_stable_handles_large_inputs():
    h = OpHarness(tiles=4)
    x = np.array([1000.0, 1001.0, 999.0], np.float32)
    X = h.input("x", x)
    Y = popnn.nonLinearity(h.graph, NLT.SOFTMAX_STABLE, X, h.prog)
    U = popnn.nonLinearity(h.graph, "SOFTMAX", X, h.prog)
    r = h.run(y=Y, u=U)
    np.testing.assert_allclose(r["y"], torch.softmax(torch.tensor(x), 0).numpy(), rtol=1e-5)
    assert not np.isfinite(r["u"]).all()      # the unstable algorithm overflows exp, as on the IPU


@pytest.mark.parametrize("tname", ["float", "half"])
def test_log_softmax(tname):
    h = OpHarness(tiles=8)
    x = (h.rng.standard_normal((4, 17)) * 3).astype(DT[tname])
    X = h.input("x", x, mapping="random")
    Y = popnn.logSoftmax(h.graph, X, h.prog)
    Z = h.graph.clone(X, "z")
    h.prog.add(poplar.program.Copy(X, Z))
    popnn.logSoftmaxInPlace(h.graph, Z, h.prog)
    r = h.run(y=Y, z=Z)
    ref = torch.log_softmax(torch.tensor(x.astype(np.float64)), -1).numpy()
    tol = 1e-5 if tname == "float" else 2e-2
    np.testing.assert_allclose(r["y"].astype(np.float64), ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(r["z"], r["y"])


def test_named_wrappers_and_scaling():
    h = OpHarness(tiles=4)
    x = np.linspace(-3, 3, 12, dtype=np.float32)
    X = h.input("x", x)
    outs = {"relu": popnn.relu(h.graph, X, h.prog), "tanh": popnn.tanh(h.graph, X, h.prog),
            "sig": popnn.sigmoid(h.graph, X, h.prog)}
    r = h.run(**outs)
    np.testing.assert_allclose(r["relu"], np.maximum(x, 0))
    np.testing.assert_allclose(r["tanh"], np.tanh(x), rtol=1e-6)
    np.testing.assert_allclose(r["sig"], 1 / (1 + np.exp(-x)), rtol=1e-6)
    assert popnn.nonLinearityScaling(NLT.SOFTMAX_SCALED) == popnn.SOFTMAX_SCALING == 62000.0
    assert popnn.nonLinearityScaling("RELU") == 1.0


def test_cost_scales_with_tiles_and_op():
    target = OpHarness(tiles=4).graph.getTarget()
    # NonLinearity1D shape: 9 + 6*(20 + 3 + 2op + (v-1)vec + remainder)
    n = np.array([2 * 6 * 5])     # float: 5 vectors per worker, no remainder
    assert elementwise_cycles(n, poplar.FLOAT, 5, 10, target)[0] == 9 + 6 * (20 + 3 + 10 + 4 * 10 + 3)
    cyc = {}
    for nl in (NLT.RELU, NLT.GELU_ERF):
        for mapping in ("tile0", "linear"):
            h = OpHarness(tiles=16)
            X = h.input("x", np.ones(8192, np.float32), mapping=mapping)
            popnn.nonLinearity(h.graph, nl, X, h.prog)
            h.run()
            cyc[nl, mapping] = h.cycles()
    assert cyc[NLT.GELU_ERF, "tile0"] > 5 * cyc[NLT.RELU, "tile0"]
    assert cyc[NLT.RELU, "linear"] < cyc[NLT.RELU, "tile0"] / 4


def test_errors():
    h = OpHarness(tiles=4)
    xi = h.input("xi", np.ones(4, np.int32))
    x = h.input("x", np.ones((2, 3), np.float32))
    c = h.graph.addConstant(poplar.FLOAT, [3], 1.0)
    h.graph.setTileMapping(c, 0)
    with pytest.raises(popnn.poplibs_error, match="float or half"):
        popnn.nonLinearity(h.graph, NLT.RELU, xi, h.prog)
    with pytest.raises(popnn.poplibs_error, match="Unknown non-linearity"):
        popnn.nonLinearity(h.graph, "NOPE", x, h.prog)
    with pytest.raises(popnn.poplibs_error, match="written in parallel"):
        popnn.nonLinearityInPlace(h.graph, NLT.RELU, c, h.prog)
    with pytest.raises(popnn.poplibs_error, match="shape"):
        popnn.nonLinearityInputGradient(h.graph, NLT.SOFTMAX, x, x.transpose(), h.prog)
    unmapped = h.graph.addVariable(poplar.FLOAT, [3], "unmapped")
    with pytest.raises(poplar.invalid_tile_mapping):
        popnn.nonLinearity(h.graph, NLT.RELU, unmapped, h.prog)
    h.graph.setTileMapping(unmapped, 1)
    y = popnn.nonLinearity(h.graph, NLT.RELU, x, h.prog)
    assert (h.run(y=y)["y"] == 1).all()


def test_graph_construction_has_no_per_element_arrays(monkeypatch):
    """Elementwise non-linearities and their gradients cost and connect their work from the
    output's tile counts and views (no element tiles or element addresses)."""
    from openipu.poplar.graph import Graph
    from openipu.poplar.tensor import Tensor
    h = OpHarness(tiles=16)
    x = h.input("x", np.zeros([4, 3, 64, 64], np.float16))
    for name in ("tile_of_elements", "set_global_tile_mapping"):
        monkeypatch.setattr(Graph, name, lambda *a, **k: pytest.fail("per-element tile array"))
    monkeypatch.setattr(Tensor, "addresses", lambda *a, **k: pytest.fail("per-element addresses"))
    for nl in ("GELU", "RELU", "SWISH"):
        y = popnn.nonLinearity(h.graph, nl, x, h.prog)
        popnn.nonLinearityInputGradient(h.graph, nl, x if nl in ("GELU", "SWISH") else y, y, h.prog)
    popnn.nonLinearityInPlace(h.graph, "TANH", y, h.prog)
