"""popnn.pooling: MAX / AVG / SUM pooling and input gradients vs torch.autograd, 1-3 field dims,
padding and truncation."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popnn

pooling = popnn.pooling
DT = {"float": np.float32, "half": np.float16}
POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def torch_pool(kind, x, k, s, lo, up):
    pads = []
    for a, b in zip(reversed(lo), reversed(up)):
        pads += [a, b]
    d = len(k)
    if kind == "MAX":
        return POOL[d](F.pad(x, pads, value=-np.inf), k, s)
    total = AVG[d](F.pad(x, pads), k, s) * int(np.prod(k))
    if kind == "SUM":
        return total
    cnt = AVG[d](F.pad(torch.ones_like(x), pads), k, s) * int(np.prod(k))
    return total / cnt


CASES = [  # field, kernel, stride, padLower, padUpper
    ([9], [3], [2], [1], [0]),
    ([6, 7], [2, 3], [2, 1], [0, 1], [1, 1]),
    ([8, 8], [3, 3], [2, 2], [-1, 0], [0, -1]),        # truncation
    ([4, 5, 6], [2, 2, 3], [2, 1, 2], [0, 0, 1], [0, 1, 0]),
]


@pytest.mark.parametrize("kind", ["MAX", "AVG", "SUM"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("tname", ["float", "half"])
def test_pool_and_gradient_vs_torch(kind, case, tname):
    field, k, s, lo, up = CASES[case]
    B, C = 2, 3
    h = OpHarness(tiles=8, seed=case)
    n = B * C * int(np.prod(field))      # distinct values (no ties, even in half), so torch's max gradient is ours
    x = (h.rng.permutation(n).reshape([B, C] + field) * (4.0 / n) - 2).astype(DT[tname])
    params = pooling.PoolParams(getattr(pooling.PoolingType, kind), field, k, s, lo, up, C, B,
                                poplar.FLOAT if tname == "float" else poplar.HALF)
    X = h.input("x", x, mapping="random")
    Y = pooling.pool(h.graph, params, X, h.prog)
    assert Y.shape() == [B, C] + params.getOutputFieldShape()
    g = h.rng.standard_normal(Y.shape()).astype(DT[tname])
    G = h.input("g", g, mapping="blocks")
    D = pooling.poolInputGradient(h.graph, params, X, Y, G, False, h.prog)
    outs = {"y": Y, "d": D}
    if kind != "MAX":
        outs["d2"] = pooling.poolInputGradient(h.graph, params, 4, G, h.prog)
    r = h.run(**outs)
    xt = torch.tensor(x.astype(np.float64), requires_grad=True)
    yt = torch_pool(kind, xt, k, s, lo, up)
    (dt,) = torch.autograd.grad(yt, xt, torch.tensor(g.astype(np.float64)))
    tol = 1e-5 if tname == "float" else 1e-2
    np.testing.assert_allclose(r["y"].astype(np.float64), yt.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(r["d"].astype(np.float64), dt.numpy(), rtol=tol * 3, atol=tol * 3)
    if kind != "MAX":
        np.testing.assert_allclose(r["d2"], r["d"], rtol=tol, atol=tol)


@pytest.mark.parametrize("scaled", [False, True])
def test_max_gradient_with_ties(scaled):
    h = OpHarness(tiles=4)
    x = np.array([[[1.0, 3.0, 3.0, 0.0]]], np.float32)
    params = pooling.PoolParams("MAX", [4], [4], [1], [0], [0], 1, 1, poplar.FLOAT)
    X = h.input("x", x)
    Y = pooling.pool(h.graph, params, X, h.prog)
    G = h.input("g", np.array([[[2.0]]], np.float32))
    D = pooling.poolInputGradient(h.graph, params, X, Y, G, scaled, h.prog)
    r = h.run(y=Y, d=D)
    assert r["y"].item() == 3.0
    np.testing.assert_array_equal(r["d"], [[[0, 1, 1, 0]]] if scaled else [[[0, 2, 2, 0]]])


def test_cost_and_flops():
    params = pooling.PoolParams(pooling.PoolingType.MAX, [32, 32], [3, 3], [2, 2], [1, 1], [1, 1], 16, 4,
                                poplar.FLOAT)
    assert params.getOutputFieldShape() == [16, 16]
    assert pooling.getFwdFlops(params) == 4 * 16 * 256 * 9
    cyc = {}
    for mapping in ("tile0", "linear"):
        h = OpHarness(tiles=16)
        X = h.input("x", np.ones([4, 16, 32, 32], np.float32), mapping=mapping)
        pooling.pool(h.graph, params, X, h.prog)
        h.run()
        cyc[mapping] = h.cycles()
    assert 1000 < cyc["linear"] < cyc["tile0"]


def test_errors():
    h = OpHarness(tiles=4)
    X = h.input("x", np.ones([1, 2, 5], np.float32))
    with pytest.raises(popnn.poplibs_error, match="does not fit"):
        pooling.PoolParams("MAX", [5], [7], [1], [0], [0], 2, 1)
    with pytest.raises(popnn.poplibs_error, match="field dimensions"):
        pooling.PoolParams("AVG", [5], [2, 2], [1], [0], [0], 2, 1)
    p = pooling.PoolParams("MAX", [5], [2], [1], [0], [0], 3, 1)
    with pytest.raises(popnn.poplibs_error, match="shape"):
        pooling.pool(h.graph, p, X, h.prog)
    p = pooling.PoolParams("MAX", [5], [2], [1], [0], [0], 2, 1)
    Y = pooling.pool(h.graph, p, X, h.prog)
    with pytest.raises(popnn.poplibs_error, match="MAX pooling needs"):
        pooling.poolInputGradient(h.graph, p, 1, Y, h.prog)
    assert (h.run(y=Y)["y"] == 1).all()
