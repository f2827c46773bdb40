"""popops sort / topK against torch, their multi-stage cost, and countedLoop."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from libharness import OpHarness
from openipu import poplar
from openipu.poplar import program as P
from openipu.poplibs import popops

MAPPINGS = ["linear", "random", "blocks", "tile0"]
SO = popops.SortOrder


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_sort_every_dim(mapping, dtype):
    x = (np.random.default_rng(0).standard_normal((4, 9, 6)) * 20).astype(dtype)
    h = OpHarness(16)
    a = h.input("a", x, mapping=mapping)
    outs = {f"s{d}": popops.sort(h.graph, a, d, h.prog) for d in range(3)}
    b = h.input("b", x, mapping=mapping)
    popops.sortInPlace(h.graph, b, 1, h.prog)
    r = h.run(b=b, **outs)
    for d in range(3):
        np.testing.assert_array_equal(r[f"s{d}"], np.sort(x, axis=d))
    np.testing.assert_array_equal(r["b"], np.sort(x, axis=1))


def test_sort_key_value_is_stable():
    keys = np.array([[3, 1, 3, 1, 2], [0, 0, 0, 0, 0]], np.int32)
    vals = np.arange(10, dtype=np.float32).reshape(2, 5)
    h = OpHarness(8)
    k, v = h.input("k", keys, mapping="random"), h.input("v", vals, mapping="random")
    out = popops.sortKeyValue(h.graph, k, v, 1, h.prog)
    k2, v2 = h.input("k2", keys), h.input("v2", vals)
    popops.sortKeyValueInPlace(h.graph, k2, v2, 1, h.prog)
    r = h.run(out=out, k2=k2, v2=v2)
    ref = np.take_along_axis(vals, np.argsort(keys, axis=1, kind="stable"), 1)
    np.testing.assert_array_equal(r["out"], ref)
    np.testing.assert_array_equal(r["v2"], ref)
    np.testing.assert_array_equal(r["k2"], np.sort(keys, axis=1))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("order", [SO.DESCENDING, SO.ASCENDING, SO.NONE])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_topk_against_torch(largest, order, dtype):
    x = np.random.default_rng(1).standard_normal((5, 37)).astype(dtype)
    h = OpHarness(16)
    a = h.input("a", x, mapping="random")
    p = popops.TopKParams(6, largest, order)
    vals_only = popops.topK(h.graph, h.prog, a, p)
    v, i = popops.topKWithPermutation(h.graph, h.prog, a, p)
    payload = h.input("pl", np.arange(5 * 37, dtype=np.int32).reshape(5, 37))
    kk, pv = popops.topKKeyValue(h.graph, h.prog, a, payload, p)
    assert i.elementType() == poplar.UNSIGNED_INT and list(v.shape()) == [5, 6]
    r = h.run(vo=vals_only, v=v, i=i, kk=kk, pv=pv)
    tv, _ = torch.topk(torch.from_numpy(x.astype(np.float32)), 6, dim=1, largest=largest, sorted=True)
    tv = tv.numpy()
    if order == SO.ASCENDING:
        tv = np.sort(tv, axis=1)
    elif order == SO.DESCENDING:
        tv = -np.sort(-tv, axis=1)
    if order == SO.NONE:
        np.testing.assert_array_equal(np.sort(r["v"], 1), np.sort(tv, 1).astype(dtype))
    else:
        np.testing.assert_array_equal(r["v"], tv.astype(dtype))
    np.testing.assert_array_equal(r["vo"], r["v"])
    np.testing.assert_array_equal(np.take_along_axis(x, r["i"].astype(np.int64), 1), r["v"])
    np.testing.assert_array_equal(r["kk"], r["v"])
    np.testing.assert_array_equal(r["pv"], np.take_along_axis(np.arange(5 * 37).reshape(5, 37), r["i"].astype(np.int64), 1))


def test_topk_ties_lower_index_first():
    x = np.array([[1, 5, 5, 2, 5, 0]], np.float32)
    h = OpHarness(4)
    a = h.input("a", x)
    v, i = popops.topKWithPermutation(h.graph, h.prog, a, popops.TopKParams(2, True, SO.DESCENDING, True))
    r = h.run(v=v, i=i)
    np.testing.assert_array_equal(r["i"], [[1, 2]])


@settings(max_examples=10, deadline=None)
@given(shape=st.lists(st.integers(1, 8), min_size=1, max_size=3), data=st.data())
def test_hypothesis_sort_and_topk(shape, data):
    mapping = data.draw(st.sampled_from(MAPPINGS))
    dim = data.draw(st.integers(0, len(shape) - 1))
    k = data.draw(st.integers(0, shape[-1]))
    x = np.random.default_rng(sum(shape)).integers(-50, 50, shape).astype(np.float32)
    h = OpHarness(8)
    a = h.input("a", x, mapping=mapping)
    s = popops.sort(h.graph, a, dim, h.prog)
    t = popops.topK(h.graph, h.prog, a, popops.TopKParams(k, True, SO.DESCENDING))
    r = h.run(s=s, t=t)
    np.testing.assert_array_equal(r["s"], np.sort(x, axis=dim))
    np.testing.assert_array_equal(r["t"], -np.sort(-x, axis=-1)[..., :k])


def test_sort_cost_is_multi_stage():
    x = np.random.default_rng(2).standard_normal((1, 4096)).astype(np.float32)
    cyc = {}
    for mapping in ("tile0", "linear"):
        h = OpHarness(32)
        a = h.input("a", x, mapping=mapping)
        s = popops.sort(h.graph, a, 1, h.prog)
        r = h.run(s=s)
        np.testing.assert_array_equal(r["s"], np.sort(x, 1))
        cyc[mapping] = (h.cycles(), len(h.graph.getComputeSets()))
    assert cyc["tile0"][1] == 1                      # one tile: local sort only
    assert cyc["linear"][1] == 1 + 5 * 6 // 2        # 32 tiles: local sort + 15 bitonic merge steps
    assert cyc["linear"][0] < cyc["tile0"][0]        # spreading the row is faster than one tile


def test_sort_bad_input():
    h = OpHarness(4)
    a = h.input("a", np.ones((3, 4), np.float32))
    with pytest.raises(poplar.index_error):
        popops.sort(h.graph, a, 2, h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.sortKeyValue(h.graph, a, h.input("v", np.ones((4, 3), np.float32)), 0, h.prog)
    with pytest.raises(poplar.index_error):
        popops.topK(h.graph, h.prog, a, popops.TopKParams(5, True, SO.NONE))
    with pytest.raises(poplar.poplar_error):
        popops.topK(h.graph, h.prog, a, 3)
    s = popops.sort(h.graph, a, 0, h.prog)
    np.testing.assert_array_equal(h.run(s=s)["s"], np.ones((3, 4)))


# ----------------------------------------------------------------------------------------------
# countedLoop
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("begin,end,step", [(0, 5, 1), (3, 20, 4), (7, 8, 3)])
def test_counted_loop_runs_body_with_index(begin, end, step):
    h = OpHarness(4)
    acc = h.input("acc", np.zeros(1, np.uint32), mapping="tile0")
    calls = []

    def body(i):
        calls.append(i)
        assert i.elementType() == poplar.UNSIGNED_INT and i.shape() == [1]
        seq = P.Sequence()
        seq.add(P.Copy(popops.add(h.graph, acc, i, seq), acc))
        return seq

    h.prog.add(popops.countedLoop(h.graph, begin, end, step, body))
    r = h.run(acc=acc)
    assert len(calls) == 1
    assert int(r["acc"][0]) == sum(range(begin, end, step))


def test_counted_loop_count_form_and_cost():
    h = OpHarness(4)
    acc = h.input("acc", np.zeros(1, np.uint32), mapping="tile0")
    one = h.graph.addConstant(poplar.UNSIGNED_INT, [1], 1)
    h.graph.setTileMapping(one, 0)

    def body(i):
        seq = P.Sequence()
        seq.add(P.Copy(popops.add(h.graph, acc, one, seq), acc))
        return seq

    h.prog.add(popops.countedLoop(h.graph, 9, body))
    assert int(h.run(acc=acc)["acc"][0]) == 9
    c9 = h.cycles()
    h2 = OpHarness(4)
    acc2 = h2.input("acc", np.zeros(1, np.uint32), mapping="tile0")

    def body2(i):
        seq = P.Sequence()
        seq.add(P.Copy(popops.add(h2.graph, acc2, i, seq), acc2))
        return seq

    h2.prog.add(popops.countedLoop(h2.graph, 3, body2))
    assert int(h2.run(acc=acc2)["acc"][0]) == 0 + 1 + 2
    assert c9 > h2.cycles()


def test_counted_loop_bad_arguments():
    h = OpHarness(4)
    with pytest.raises(poplar.poplar_error):
        popops.countedLoop(h.graph, 0, 5, 0, lambda i: P.Sequence())
    with pytest.raises(poplar.poplar_error):
        popops.countedLoop(h.graph, 5, 5, 1, lambda i: P.Sequence())
    with pytest.raises(poplar.poplar_error):
        popops.countedLoop(h.graph, 0, 5, 1, lambda i: None)
