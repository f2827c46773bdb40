"""popnn.calcLoss / calcAccuracy / argMax family / topK against torch."""

import numpy as np
import pytest
import torch

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popnn

DT = {"float": np.float32, "half": np.float16}


def _setup(h, B, C, tname, mapping, transposed=False):
    logits = h.rng.standard_normal((B, C)) * 2
    p = torch.softmax(torch.tensor(logits), -1).numpy()
    if transposed:
        P = h.input("p", p.T.astype(DT[tname]), mapping=mapping).transpose()
    else:
        P = h.input("p", p.astype(DT[tname]), mapping=mapping)
    return logits, p.astype(DT[tname]).astype(np.float64), P


def _outputs(h, B, C, type_):
    loss = h.graph.addVariable(type_, [B], "loss")
    h.map(loss, "random")
    d = h.graph.addVariable(type_, [B, C], "deltas")
    h.map(d, "random")
    return loss, d


@pytest.mark.parametrize("tname", ["float", "half"])
@pytest.mark.parametrize("label_type", [np.uint32, np.int32])
@pytest.mark.parametrize("mapping,transposed", [("linear", False), ("random", False), ("blocks", True)])
def test_cross_entropy_vs_autograd(tname, label_type, mapping, transposed):
    h = OpHarness(tiles=8, seed=3)
    B, C = 7, 10
    logits, p, P = _setup(h, B, C, tname, mapping, transposed)
    labels = h.rng.integers(0, C, B).astype(label_type)
    labels[2] = np.array(popnn.MASKED_LABEL_CODE, np.uint32).astype(label_type)   # masked row
    E = h.input("e", labels, mapping="random")
    loss, d = _outputs(h, B, C, poplar.FLOAT if tname == "float" else poplar.HALF)
    nc = h.input("nc", np.array([0], np.uint32), mapping=3)
    h.prog.add(popnn.calcLoss(h.graph, P, E, loss, d, nc, popnn.CROSS_ENTROPY_LOSS))
    r = h.run(loss=loss, d=d, nc=nc)
    keep = np.arange(B) != 2
    lab = labels.astype(np.int64)
    x = torch.tensor(logits, requires_grad=True)
    per_row = torch.nn.functional.cross_entropy(x[keep], torch.tensor(lab[keep]), reduction="none")
    (grad,) = torch.autograd.grad(per_row.sum(), x)
    tol = 1e-5 if tname == "float" else 1e-2
    np.testing.assert_allclose(r["loss"][keep].astype(np.float64), per_row.detach().numpy(), rtol=tol, atol=tol)
    assert r["loss"][2] == 0 and (r["d"][2] == 0).all()
    np.testing.assert_allclose(r["d"].astype(np.float64), grad.numpy(), rtol=tol, atol=tol)
    assert r["nc"][0] == int(((p.argmax(1) == lab) & keep).sum())


def test_cross_entropy_scaled():
    h = OpHarness(tiles=4, seed=1)
    B, C, mos, ds = 5, 6, 100.0, 1000.0
    _, p, _ = _setup(h, B, C, "float", "linear")
    P = h.input("p", (p * mos).astype(np.float32), mapping="random")
    labels = h.rng.integers(0, C, B).astype(np.uint32)
    E = h.input("e", labels)
    DS = h.input("ds", np.array(ds, np.float32), mapping=1)
    MOS = h.input("mos", np.array(mos, np.float32), mapping=2)
    loss, d = _outputs(h, B, C, poplar.FLOAT)
    h.prog.add(popnn.calcLoss(h.graph, P, E, loss, d, DS, MOS, popnn.CROSS_ENTROPY_LOSS, "scaled"))
    r = h.run(loss=loss, d=d)
    onehot = np.eye(C)[labels]
    np.testing.assert_allclose(r["d"], (p - onehot) * ds, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(r["loss"], -np.log(p[np.arange(B), labels]), rtol=1e-5)


@pytest.mark.parametrize("tname", ["float", "half"])
def test_sum_squared_vs_autograd_and_one_hot_targets(tname):
    h = OpHarness(tiles=8, seed=5)
    B, C = 6, 4
    out = h.rng.standard_normal((B, C))
    labels = h.rng.integers(0, C, B)
    O = h.input("o", out.astype(DT[tname]), mapping="random")
    E = h.input("e", labels.astype(np.uint32))
    T = h.input("t", np.eye(C)[labels].astype(DT[tname]), mapping="blocks")
    type_ = O.elementType()
    loss, d = _outputs(h, B, C, type_)
    loss2, d2 = _outputs(h, B, C, type_)
    h.prog.add(popnn.calcLoss(h.graph, O, E, loss, d, popnn.SUM_SQUARED_LOSS))
    h.prog.add(popnn.calcLoss(h.graph, O, T, loss2, d2, "SUM_SQUARED_LOSS"))
    r = h.run(loss=loss, d=d, loss2=loss2, d2=d2)
    x = torch.tensor(out.astype(DT[tname]).astype(np.float64), requires_grad=True)
    per_row = 0.5 * ((x - torch.tensor(np.eye(C)[labels])) ** 2).sum(-1)
    (grad,) = torch.autograd.grad(per_row.sum(), x)
    tol = 1e-5 if tname == "float" else 1e-2
    np.testing.assert_allclose(r["loss"].astype(np.float64), per_row.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(r["d"].astype(np.float64), grad.numpy(), rtol=tol, atol=tol)
    np.testing.assert_array_equal(r["loss2"], r["loss"])
    np.testing.assert_array_equal(r["d2"], r["d"])


def test_accuracy_accumulates_in_a_loop():
    h = OpHarness(tiles=4)
    acts = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.3, 0.3, 0.4]], np.float32)
    A = h.input("a", acts, mapping="random")
    E = h.input("e", np.array([1, 2, 2], np.int32))
    nc = h.input("nc", np.array([0], np.uint32), mapping=2)
    h.prog.add(poplar.program.Repeat(4, popnn.calcAccuracy(h.graph, A, E, nc)))
    assert h.run(nc=nc)["nc"][0] == 4 * 2


@pytest.mark.parametrize("tname", ["float", "half", "int"])
@pytest.mark.parametrize("mapping", ["linear", "random", "blocks"])
def test_arg_max_min_family(tname, mapping):
    h = OpHarness(tiles=8, seed=7)
    R, C = 9, 23
    if tname == "int":
        x = h.rng.integers(-5, 5, (R, C)).astype(np.int32)          # many ties: first index wins
    else:
        x = h.rng.standard_normal((R, C)).astype(DT[tname])
        x[0, 3] = x[0, 17] = 50                                     # a tie
    X = h.input("x", x, mapping=mapping)
    am = popnn.argMax(h.graph, X, h.prog)
    an = popnn.argMin(h.graph, X, h.prog)
    mv, mi = popnn.maxAndArgMax(h.graph, X, h.prog)
    nv, ni = popnn.minAndArgMin(h.graph, X, h.prog)
    r = h.run(am=am, an=an, mv=mv, mi=mi, nv=nv, ni=ni)
    assert r["am"].dtype == np.uint32
    np.testing.assert_array_equal(r["am"], x.argmax(1))
    np.testing.assert_array_equal(r["an"], x.argmin(1))
    np.testing.assert_array_equal(r["mi"], x.argmax(1))
    np.testing.assert_array_equal(r["ni"], x.argmin(1))
    np.testing.assert_array_equal(r["mv"], x.max(1))
    np.testing.assert_array_equal(r["nv"], x.min(1))
    assert r["am"][0] == 3 or tname == "int"


@pytest.mark.parametrize("sort", [True, False])
def test_top_k(sort):
    h = OpHarness(tiles=8, seed=2)
    x = h.rng.standard_normal((5, 30)).astype(np.float32)
    X = h.input("x", x, mapping="random")
    v, i = popnn.topK(h.graph, X, 4, sort, h.prog)
    r = h.run(v=v, i=i)
    tv, ti = torch.topk(torch.tensor(x), 4, -1)
    if sort:
        np.testing.assert_array_equal(r["i"], ti.numpy())
        np.testing.assert_array_equal(r["v"], tv.numpy())
    else:
        np.testing.assert_array_equal(r["i"], np.sort(ti.numpy(), -1))
        np.testing.assert_array_equal(r["v"], np.take_along_axis(x, r["i"].astype(np.int64), -1))


def test_cost_reduction_has_two_stages_when_rows_span_tiles():
    cyc = {}
    for mapping in ("tile0", "random"):
        h = OpHarness(tiles=16)
        X = h.input("x", h.rng.standard_normal((8, 256)).astype(np.float32), mapping=mapping)
        popnn.argMax(h.graph, X, h.prog)
        h.run()
        cyc[mapping] = h.cycles()
        names = [cs.name for cs in h.graph.getComputeSets()]
        assert names == ["argMax/gather", "argMax/sparse"]
    assert cyc["random"] < cyc["tile0"]


def test_errors():
    h = OpHarness(tiles=4)
    P = h.input("p", np.full((3, 4), 0.25, np.float32))
    E = h.input("e", np.zeros(3, np.uint32))
    Ef = h.input("ef", np.zeros(3, np.float32))
    loss, d = _outputs(h, 3, 4, poplar.FLOAT)
    with pytest.raises(popnn.poplibs_error, match="LossType"):
        popnn.calcLoss(h.graph, P, E, loss, d)
    with pytest.raises(popnn.poplibs_error, match="UNSIGNED_INT or INT"):
        popnn.calcLoss(h.graph, P, Ef, loss, d, popnn.CROSS_ENTROPY_LOSS)
    with pytest.raises(popnn.poplibs_error, match="deltas"):
        popnn.calcLoss(h.graph, P, E, loss, d.transpose(), popnn.CROSS_ENTROPY_LOSS)
    with pytest.raises(popnn.poplibs_error, match="K=9"):
        popnn.topK(h.graph, P, 9, True, h.prog)
    with pytest.raises(popnn.poplibs_error, match="2-D"):
        popnn.argMax(h.graph, E, h.prog)
    h.prog.add(popnn.calcLoss(h.graph, P, E, loss, d, popnn.CROSS_ENTROPY_LOSS))
    np.testing.assert_allclose(h.run(loss=loss)["loss"], np.log(4), rtol=1e-6)


def test_arg_reduce_and_top_k_build_from_tile_boxes(monkeypatch):
    """argMax / maxAndArgMax / topK place their partials and outputs from the input's tile boxes
    and runs (no element tiles or element addresses while the graph is built)."""
    from openipu.poplar.graph import Graph
    from openipu.poplar.tensor import Tensor
    h = OpHarness(tiles=16)
    x = h.rng.standard_normal((12, 300)).astype(np.float32)
    X = h.input("x", x, mapping="blocks")
    for name in ("tile_of_elements", "set_global_tile_mapping"):
        monkeypatch.setattr(Graph, name, lambda *a, **k: pytest.fail("per-element tile array"))
    monkeypatch.setattr(Tensor, "addresses", lambda *a, **k: pytest.fail("per-element addresses"))
    am = popnn.argMax(h.graph, X, h.prog)
    mv, mi = popnn.maxAndArgMax(h.graph, X, h.prog)
    tv, ti = popnn.topK(h.graph, X, 5, True, h.prog)
    monkeypatch.undo()
    r = h.run(am=am, mv=mv, mi=mi, tv=tv, ti=ti)
    np.testing.assert_array_equal(r["am"], x.argmax(1))
    np.testing.assert_array_equal(r["mi"], x.argmax(1))
    np.testing.assert_array_equal(r["mv"], x.max(1))
    np.testing.assert_array_equal(r["ti"], np.argsort(-x, 1)[:, :5])
