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


def _first_output_reference(p, out_tiles):
    """Per input element, the tile of the first output whose window holds it (-1: none): the
    per-element definition the structural reads must reproduce (torch windows over an index grid)."""
    shape = [1, p.batchSize, p.numChannels] + p.inputFieldShape
    idx = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    w = pooling._windows(pooling._pad(idx, p, -1.0), p).flatten(start_dim=-p.getNumFieldDims())
    src = w.reshape(-1).numpy().astype(np.int64)
    outs = np.repeat(np.arange(out_tiles.size), w.shape[-1])
    keep = src >= 0
    first = np.full(int(np.prod(shape)), np.iinfo(np.int64).max)
    np.minimum.at(first, src[keep], outs[keep])
    return np.where(first < np.iinfo(np.int64).max, out_tiles[np.minimum(first, out_tiles.size - 1)], -1)


GAP_CASES = [([9, 10], [1, 1], [2, 2], [0, 0], [0, 0]), ([10, 9], [3, 2], [1, 3], [3, 0], [2, 4]),
             ([12], [2], [5], [-1], [-2])]


@pytest.mark.parametrize("case", range(len(CASES) + len(GAP_CASES)))
def test_window_reads_match_the_per_element_definition(case):
    """The forward read of each input element is costed on the tile of the first output whose
    window holds it, and the gradient's read of output ``o`` on the tile of the last input whose
    first output is ``o`` (else on its own tile): same bytes and messages as the same consumers
    given element by element."""
    from openipu.poplar import cost as costmod
    from openipu.poplar import exchange as X
    field, k, s, lo, up = (CASES + GAP_CASES)[case]
    B, C = 2, 3
    h = OpHarness(tiles=8, seed=case)
    p = pooling.PoolParams("MAX", field, k, s, lo, up, C, B, poplar.FLOAT)
    x = h.input("x", np.zeros([B, C] + field, np.float32), mapping="random")
    y = pooling.pool(h.graph, p, x, h.prog)
    g = h.input("g", np.zeros(y.shape(), np.float32), mapping="blocks")
    pooling.poolInputGradient(h.graph, p, x, y, g, False, h.prog)
    fwd, bwd = (cs.groups[0] for cs in h.graph._state.compute_sets[-2:])
    graph, spec = h.graph, h.graph._top._target.spec

    def volume(accesses):
        return costmod.exchange_volume(spec, [X.RegionTransfer(a.tensor, a.on) for a in accesses
                                              if a.on is not None])

    def reference(t, consumers):
        own = graph.tile_of_elements(t).astype(np.int64)
        return costmod.exchange_volume(spec, [costmod.Transfer(graph._state.space(t._type), t.flat_addresses(),
                                                               np.where(consumers >= 0, consumers, own))])

    cons = _first_output_reference(p, graph.tile_of_elements(y).astype(np.int64))
    got, want = volume(fwd.reads), reference(x, cons)
    exact = all(kk >= ss for kk, ss in zip(k, s)) or case == len(CASES) + 1
    fields = ("recv_bytes", "send_bytes") + (("recv_msgs", "send_msgs") if exact else ())
    for f in fields:
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
    # gradient: output o on the tile of the last input whose first output it is
    n_out = y.numElements()
    first = _first_output_reference(p, np.arange(n_out))
    cons_out = np.full(n_out, -1, np.int64)
    itiles = graph.tile_of_elements(x).astype(np.int64)
    for i in np.flatnonzero(first >= 0):
        cons_out[first[i]] = itiles[i]
    gt = graph.tile_of_elements(g).astype(np.int64)
    cons_out = np.where(cons_out >= 0, cons_out, gt)          # pooled is read where grad lives
    got, want = volume([a for a in bwd.reads if a.tensor is g]), reference(g, cons_out)
    for f in ("recv_bytes", "send_bytes", "recv_msgs", "send_msgs"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
    got, want = volume([a for a in bwd.reads if a.tensor is y]), reference(y, cons_out)
    for f in ("recv_bytes", "send_bytes", "recv_msgs", "send_msgs"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)


def test_graph_construction_has_no_per_element_arrays(monkeypatch):
    """pool and poolInputGradient build their reads from tile boxes and views: no element tiles
    or element addresses."""
    from openipu.poplar.graph import Graph
    from openipu.poplar.tensor import Tensor
    h = OpHarness(tiles=16)
    p = pooling.PoolParams("MAX", [56, 56], [3, 3], [2, 2], [1, 1], [1, 1], 8, 2, poplar.HALF)
    x = h.input("x", np.zeros([2, 8, 56, 56], np.float16))
    q = pooling.PoolParams("AVG", [56, 56], [1, 1], [2, 2], [0, 0], [0, 0], 8, 2, poplar.HALF)
    for name in ("tile_of_elements", "set_global_tile_mapping"):
        monkeypatch.setattr(Graph, name, lambda *a, **k: pytest.fail("per-element tile array"))
    monkeypatch.setattr(Tensor, "addresses", lambda *a, **k: pytest.fail("per-element addresses"))
    for params in (p, q):
        y = pooling.pool(h.graph, params, x, h.prog)
        g = h.graph.clone(y, "g")
        pooling.poolInputGradient(h.graph, params, x, y, g, False, h.prog)


@pytest.mark.parametrize("kind", ["MAX", "AVG", "SUM"])
def test_global_pool_of_a_large_field_splits_its_kernel_over_tiles(kind):
    """A 32x32 global pool over 4x4 outputs: PopLibs' planner splits the kernel (partial pools on
    many tiles, then a pool of the partials) instead of putting every window on the one tile a
    linear mapping of the 16 outputs uses. Same values as torch; the busiest tile's cycles drop."""
    B, C, F_ = 4, 4, [32, 32]
    rng = np.random.default_rng(0)
    x = rng.standard_normal([B, C] + F_).astype(np.float32)
    params = pooling.PoolParams(kind, F_, F_, [1, 1], [0, 0], [0, 0], C, B, poplar.FLOAT)
    runs = {}
    for split in (True, False):
        h = OpHarness(tiles=64)
        X = h.input("x", x, mapping="linear")
        if split:
            assert pooling._kernel_split(h.graph, params, poplar.FLOAT) is not None
            Y = pooling.pool(h.graph, params, X, h.prog)
        else:
            Y = pooling._pool_once(h.graph, params, X, h.prog, "Pool")
        runs[split] = (h.run(y=Y)["y"], h.cycles())
    want = torch_pool(kind, torch.tensor(x.astype(np.float64)), F_, [1, 1], [0, 0], [0, 0]).numpy()
    for y, _ in runs.values():
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-5, atol=1e-5)
    assert runs[True][1] < runs[False][1] / 4
