"""popnn batch / group / layer / instance norm: statistics, normalise, and gradients vs torch.autograd."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popnn

PREFIX = {"bn": "batchNorm", "gn": "groupNorm", "ln": "layerNorm", "in": "instanceNorm"}
DT = {"float": np.float32, "half": np.float16}


def torch_norm(kind, x, gamma, beta, groups, eps, strided):
    C = x.shape[1]
    if kind == "bn":
        return F.batch_norm(x, None, None, gamma, beta, training=True, eps=eps)
    if kind == "gn":
        if strided:   # channel c in group c % G: permute channels so groups are contiguous for torch
            perm = np.argsort(np.arange(C) % groups, kind="stable")
            inv = np.argsort(perm)
            y = F.group_norm(x[:, perm], groups, gamma[perm], beta[perm], eps)
            return y[:, inv]
        return F.group_norm(x, groups, gamma, beta, eps)
    return F.group_norm(x, 1 if kind == "ln" else C, gamma, beta, eps)


@pytest.mark.parametrize("kind", ["bn", "gn", "ln", "in"])
@pytest.mark.parametrize("tname", ["float", "half"])
@pytest.mark.parametrize("shape,mapping,stable,strided", [((4, 6, 3, 5), "random", False, True),
                                                         ((3, 6, 7), "linear", True, False),
                                                         ((8, 6), "blocks", False, False)])
def test_forward_and_gradients_vs_torch(kind, tname, shape, mapping, stable, strided):
    h = OpHarness(tiles=8, seed=len(shape))
    groups, eps = 3, 1e-4
    x = (h.rng.standard_normal(shape) * 2 + 1).astype(DT[tname])
    g = h.rng.standard_normal(shape).astype(DT[tname])
    gam = (h.rng.random(shape[1]) + 0.5).astype(DT[tname])
    bet = h.rng.standard_normal(shape[1]).astype(DT[tname])
    X, G = h.input("x", x, mapping=mapping), h.input("g", g, mapping="random")
    GAM, BET = h.input("gam", gam), h.input("bet", bet, mapping="random")
    ns, pre = getattr(popnn, "in" if kind == "in" else kind), PREFIX[kind]
    opts = {"groupNormStridedChannelGrouping": "true" if strided else "false"}
    extra = (groups,) if kind == "gn" else ()
    mean, inv = getattr(ns, pre + "Statistics")(h.graph, X, eps, h.prog, *extra, False, stable, poplar.FLOAT,
                                                "stats", opts)
    out, wh = getattr(ns, pre + "alise")(h.graph, X, GAM, BET, mean, inv, h.prog, "norm", opts)
    gd, bd = getattr(ns, pre + "ParamGradients")(h.graph, wh, G, h.prog)
    gd2, bd2 = getattr(ns, pre + "ParamGradients")(h.graph, X, G, mean, inv, h.prog, poplar.FLOAT, debug_name="pg2",
                                                   options=opts)
    dx = getattr(ns, pre + "Gradients")(h.graph, wh, G, inv, GAM, h.prog, options=opts)
    dx2 = getattr(ns, pre + "Gradients")(h.graph, X, G, mean, inv, GAM, h.prog, options=opts)
    r = h.run(out=out, gd=gd, bd=bd, dx=dx, dx2=dx2, gd2=gd2, mean=mean)
    xt = torch.tensor(x.astype(np.float64), requires_grad=True)
    gt = torch.tensor(gam.astype(np.float64), requires_grad=True)
    bt = torch.tensor(bet.astype(np.float64), requires_grad=True)
    y = torch_norm(kind, xt, gt, bt, groups, eps, strided)
    dxr, dgr, dbr = torch.autograd.grad(y, (xt, gt, bt), torch.tensor(g.astype(np.float64)))
    tol = 1e-4 if tname == "float" else 3e-2
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    np.testing.assert_allclose(f64(r["out"]), y.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(f64(r["gd"]), dgr.numpy(), rtol=tol, atol=tol * 10)
    np.testing.assert_allclose(f64(r["bd"]), dbr.numpy(), rtol=tol, atol=tol * 10)
    np.testing.assert_allclose(f64(r["gd2"]), f64(r["gd"]), rtol=tol, atol=tol * 10)
    np.testing.assert_allclose(f64(r["dx"]), dxr.numpy(), rtol=tol * 2, atol=tol * 10)
    np.testing.assert_allclose(f64(r["dx2"]), dxr.numpy(), rtol=tol * 2, atol=tol * 10)
    B, C = shape[:2]
    S = {"bn": C, "gn": B * groups, "ln": B, "in": B * C}[kind]
    assert r["mean"].shape == (S,)


def test_unbiased_variance_and_param_update():
    h = OpHarness(tiles=4)
    x = h.rng.standard_normal((5, 2, 4)).astype(np.float32)
    X = h.input("x", x, mapping="random")
    mean, inv = popnn.bn.batchNormStatistics(h.graph, X, 0.0, h.prog, True)
    gam, bet = h.input("gam", np.ones(2, np.float32)), h.input("bet", np.zeros(2, np.float32))
    gd, bd = h.input("gd", np.array([1.0, 2.0], np.float32)), h.input("bd", np.array([3.0, 4.0], np.float32))
    popnn.bn.batchNormParamUpdate(h.graph, gd, bd, -0.5, gam, bet, h.prog)
    r = h.run(mean=mean, inv=inv, gam=gam, bet=bet)
    xc = x.transpose(1, 0, 2).reshape(2, -1)
    np.testing.assert_allclose(r["mean"], xc.mean(1), rtol=1e-5)
    np.testing.assert_allclose(r["inv"], 1 / xc.std(1, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(r["gam"], [0.5, 0.0])
    np.testing.assert_allclose(r["bet"], [-1.5, -2.0])


def test_combined_batch_normalise_and_errors():
    h = OpHarness(tiles=4)
    x = h.rng.standard_normal((3, 4, 2)).astype(np.float32)
    X = h.input("x", x)
    mul, add = h.input("m", np.arange(4, dtype=np.float32)), h.input("a", np.ones(4, np.float32))
    out = popnn.bn.batchNormalise(h.graph, X, mul, add, h.prog)
    with pytest.raises(popnn.poplibs_error, match="groups"):
        popnn.gn.groupNormStatistics(h.graph, X, 1e-5, h.prog, 3, False)
    with pytest.raises(popnn.poplibs_error, match="rank"):
        popnn.ln.layerNormStatistics(h.graph, X.flatten(), 1e-5, h.prog)
    with pytest.raises(popnn.poplibs_error, match="one per channel"):
        popnn.bn.batchNormalise(h.graph, X, add.slice(0, 3), add, h.prog)
    with pytest.raises(poplar.invalid_option):
        popnn.gn.groupNormStatistics(h.graph, X, 1e-5, h.prog, 2, False, options={"nope": 1})
    np.testing.assert_allclose(h.run(out=out)["out"], x * np.arange(4).reshape(1, 4, 1) + 1, rtol=1e-6)


def test_statistics_cost_grows_with_rows_spread_over_tiles():
    cyc = {}
    for mapping in ("tile0", "linear"):
        h = OpHarness(tiles=16)
        X = h.input("x", h.rng.standard_normal((16, 8, 64)).astype(np.float32), mapping=mapping)
        popnn.bn.batchNormStatistics(h.graph, X, 1e-5, h.prog, False)
        h.run()
        cyc[mapping] = h.cycles()
    assert cyc["linear"] < cyc["tile0"]


@pytest.mark.parametrize("kind", ["bn", "gn", "gnc", "ln"])
def test_whiten_and_normalise_use_views_not_element_arrays(kind, monkeypatch):
    """Statistics and per-channel parameters reach the activations as broadcast views of the
    expanded shape (no gathered element addresses, no element tiles)."""
    from openipu.poplar.graph import Graph
    from openipu.poplar.tensor import Tensor
    h = OpHarness(tiles=16)
    B, C = 4, 6
    x = h.input("x", np.ones([B, C, 8, 8], np.float32), mapping="random")
    S = C if kind == "bn" else B * (1 if kind == "ln" else 3)
    mean = h.input("mean", np.zeros(S, np.float32))
    inv = h.input("inv", np.ones(S, np.float32))
    gam = h.input("gamma", np.full(C, 2.0, np.float32))
    bet = h.input("beta", np.full(C, 0.5, np.float32))
    for name in ("tile_of_elements", "set_global_tile_mapping"):
        monkeypatch.setattr(Graph, name, lambda *a, **k: pytest.fail("per-element tile array"))
    monkeypatch.setattr(Tensor, "addresses", lambda *a, **k: pytest.fail("per-element addresses"))
    ns = {"bn": popnn.bn, "gn": popnn.gn, "gnc": popnn.gn, "ln": popnn.ln}[kind]
    pre = {"bn": "batchNorm", "gn": "groupNorm", "gnc": "groupNorm", "ln": "layerNorm"}[kind]
    opts = {"groupNormStridedChannelGrouping": "false"} if kind == "gnc" else None
    w = getattr(ns, pre + "Whiten")(h.graph, x, mean, inv, h.prog, options=opts)
    out, _ = getattr(ns, pre + "alise")(h.graph, x, gam, bet, mean, inv, h.prog, options=opts)
    monkeypatch.undo()
    r = h.run(w=w, out=out)
    np.testing.assert_array_equal(r["w"], 1.0)
    np.testing.assert_array_equal(r["out"], 2.5)


def test_batch_norm_reductions_are_mapped_like_poplibs():
    """PopLibs' normReduce maps batch norm's statistics and the parameter gradients
    ("JointGammaDelta") as broadcast operands of the activations' channel dimension (dithered),
    and normGradients' reductions as clones of invStdDev: each channel's result lies on a tile
    holding that channel's activations, not gathered onto the first tiles (before: linearly from
    tile 0, which put every batch norm's reductions of a training ResNet-50 on tiles 0-7)."""
    from openipu.poplibs import poputil
    h = OpHarness(tiles=16, seed=0)
    shape = (2, 16, 4, 4)               # linearly: each channel's 32 elements on 2 tiles (one per batch row)
    X = h.graph.addVariable(poplar.FLOAT, list(shape), "x")
    poputil.mapTensorLinearly(h.graph, X)
    G = h.graph.clone(X, "g")
    GAM = h.input("gam", np.ones(16, np.float32))
    mean, inv = popnn.bn.batchNormStatistics(h.graph, X, 1e-5, h.prog, False, False, poplar.FLOAT, "stats")
    gd, bd = popnn.bn.batchNormParamGradients(h.graph, X, G, mean, inv, h.prog, poplar.FLOAT)
    dx = popnn.bn.batchNormGradients(h.graph, X, G, mean, inv, GAM, h.prog)
    assert dx.shape() == list(shape)

    def tiles_of(t):
        return np.concatenate([np.full(sum(i.size() for i in ivs), tile) for tile, ivs in
                               enumerate(h.graph.getTileMapping(t)) if ivs])[np.argsort(np.concatenate(
                                   [np.concatenate([np.arange(i.begin(), i.end()) for i in ivs])
                                    for ivs in h.graph.getTileMapping(t) if ivs]))]
    holds = [set() for _ in range(16)]         # the tiles holding each channel
    for tile, ivs in enumerate(h.graph.getTileMapping(X)):
        for iv in ivs:
            for e in range(iv.begin(), iv.end()):
                holds[(e // 16) % 16].add(tile)
    for t in (mean, inv, gd, bd):
        tl = tiles_of(t.flatten())
        assert len(set(tl.tolist())) > 2, t
        start = tl[0] - min(holds[0])            # the dither rotates the mapping as a whole
        assert all(((tile - start) % 16) in holds[c] for c, tile in enumerate(tl.tolist())), (t, tl)
