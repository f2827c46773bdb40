"""popops reductions: results against numpy over ops, dims, types and tile mappings; costs; errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popops
from openipu.poplibs.popops.reduce import MAX_FANIN

Op = popops.Operation
MAPPINGS = ["linear", "random", "blocks", "tile0"]


def _ref(x, dims, op):
    ax = tuple(dims)
    x64 = x.astype(np.float64) if x.dtype.kind == "f" else x
    if op == Op.ADD:
        return x64.sum(axis=ax)
    if op == Op.SQUARE_ADD:
        return (x64 * x64).sum(axis=ax)
    if op == Op.MUL:
        return x64.prod(axis=ax)
    if op == Op.MAX:
        return x.max(axis=ax) if ax else x
    if op == Op.MIN:
        return x.min(axis=ax) if ax else x
    if op == Op.LOGICAL_AND:
        return x.all(axis=ax) if ax else x
    if op == Op.LOGICAL_OR:
        return x.any(axis=ax) if ax else x
    if op == Op.LOG_ADD:
        m = x64.max(axis=ax, keepdims=True)
        return (np.log(np.exp(x64 - m).sum(axis=ax, keepdims=True)) + m).reshape(np.delete(x.shape, ax))
    raise AssertionError(op)


def _run(x, dims, params, mapping="linear", tiles=16, out_type=None, options=None):
    h = OpHarness(tiles)
    a = h.input("a", x, mapping=mapping)
    args = (out_type,) if out_type is not None else ()
    out = popops.reduce(h.graph, a, *args, dims, params, h.prog, options=options)
    return h.run(out=out)["out"], h, out


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("dims", [[0], [1], [2], [0, 2], [2, 0, 1], []])
def test_add_float_all_dims_and_mappings(mapping, dims):
    x = np.random.default_rng(1).standard_normal((5, 7, 9)).astype(np.float32)
    r, _, out = _run(x, dims, Op.ADD, mapping)
    assert list(out.shape()) == [d for i, d in enumerate(x.shape) if i not in dims]
    np.testing.assert_allclose(r, _ref(x, dims, Op.ADD), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", [Op.ADD, Op.SQUARE_ADD, Op.MUL, Op.MAX, Op.MIN, Op.LOG_ADD])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float_ops(op, dtype):
    rng = np.random.default_rng(2)
    x = (rng.uniform(0.5, 1.5, (6, 40)) if op == Op.MUL else rng.standard_normal((6, 40))).astype(dtype)
    for dims in ([1], [0], [0, 1]):
        r, _, out = _run(x, dims, op, "random")
        assert out.elementType() == (poplar.HALF if dtype == np.float16 else poplar.FLOAT)
        tol = 2e-2 if dtype == np.float16 else 1e-5
        np.testing.assert_allclose(r.astype(np.float64), _ref(x, dims, op), rtol=tol, atol=tol * 4)


@pytest.mark.parametrize("op", [Op.ADD, Op.MUL, Op.MAX, Op.MIN, Op.SQUARE_ADD])
def test_int_ops(op):
    x = np.random.default_rng(3).integers(-3, 4, (4, 33)).astype(np.int32)
    for dims in ([1], [0], [0, 1]):
        r, _, _ = _run(x, dims, op, "blocks")
        np.testing.assert_array_equal(r, _ref(x, dims, op).astype(np.int32))


@pytest.mark.parametrize("op", [Op.LOGICAL_AND, Op.LOGICAL_OR])
def test_logical_ops(op):
    x = np.random.default_rng(4).random((9, 20)) > 0.15
    for dims in ([1], [0], [0, 1]):
        r, _, out = _run(x, dims, op, "random")
        assert out.elementType() == poplar.BOOL
        np.testing.assert_array_equal(r, _ref(x, dims, op))


def test_half_input_float_partials_and_float_output():
    # 4096 ones and one 2048: in half, 2048 + 1 == 2048, so half partials would lose the ones.
    x = np.ones((4097,), np.float16)
    x[0] = 2048
    r, _, _ = _run(x, [0], Op.ADD, "tile0", out_type=poplar.FLOAT)
    assert float(r) == 2048 + 4096
    _, h2, _ = _run(x.reshape(1, -1), [1], Op.ADD, "random", options={"accumType.interTile": "half"})
    assert {v.type for v in h2.graph._state.variables if "partials" in v.name} == {poplar.HALF}
    _, h3, _ = _run(x.reshape(1, -1), [1], Op.ADD, "random")
    assert {v.type for v in h3.graph._state.variables if "partials" in v.name} == {poplar.FLOAT}
    r3, _, out = _run(x.reshape(1, -1), [1], Op.ADD, "random", out_type=poplar.FLOAT)
    assert out.elementType() == poplar.FLOAT and float(r3[0]) == 2048 + 4096


def test_log_add_is_stable():
    x = np.array([[1000.0, 1000.0, -np.inf], [-1000.0, -1001.0, -1002.0], [-np.inf] * 3], np.float32)
    r, _, _ = _run(x, [1], Op.LOG_ADD, "random")
    np.testing.assert_allclose(r[:2], [1000 + np.log(2), -1000 + np.log(1 + np.exp(-1) + np.exp(-2))], rtol=1e-6)
    assert r[2] == -np.inf
    assert np.isfinite(r[:2]).all()


def test_scale_and_update():
    x = np.random.default_rng(5).standard_normal((8, 30)).astype(np.float32)
    h = OpHarness(16)
    a = h.input("a", x, mapping="random")
    acc = h.input("acc", np.arange(8, dtype=np.float32), mapping="linear")
    k = h.graph.addConstant(poplar.FLOAT, [], 0.5)
    h.graph.setTileMapping(k, 3)
    popops.reduceWithOutput(h.graph, a, acc, [1], popops.ReduceParams(Op.ADD, True, k), h.prog)
    sq = popops.reduce(h.graph, a, [0], popops.ReduceParams(Op.SQUARE_ADD, scale=2.0), h.prog)
    la = h.input("la", np.zeros(8, np.float32), mapping="tile0")
    popops.reduceWithOutput(h.graph, a, la, [1], popops.ReduceParams(Op.LOG_ADD, True, -1.0), h.prog)
    res = h.run(acc=acc, sq=sq, la=la)
    np.testing.assert_allclose(res["acc"], np.arange(8) + 0.5 * x.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res["sq"], 2 * (x * x).sum(0), rtol=1e-5)
    lse = _ref(x, [1], Op.LOG_ADD) - 1.0
    np.testing.assert_allclose(res["la"], np.logaddexp(0.0, lse), rtol=1e-5)


def test_reduce_with_output_keeps_mapping_and_reduce_many():
    x = np.random.default_rng(6).standard_normal((12, 16)).astype(np.float32)
    y = np.random.default_rng(7).standard_normal((3, 5, 4)).astype(np.float32)
    h = OpHarness(16)
    a, b = h.input("a", x, mapping="linear"), h.input("b", y, mapping="blocks")
    out = h.graph.addVariable(poplar.FLOAT, [12], "o")
    h.graph.setTileMapping(out, 5)
    popops.reduceWithOutput(h.graph, a, out, [1], Op.MAX, h.prog)
    assert set(h.graph.tile_of_elements(out).tolist()) == {5}
    outs = popops.reduceMany(h.graph, [popops.SingleReduceOp(a, [0], popops.ReduceParams(Op.ADD)),
                                       popops.SingleReduceOp(b, [0, 2], popops.ReduceParams(Op.MIN))], h.prog)
    n_cs = len(h.graph.getComputeSets())
    res = h.run(o=out, s=outs[0], m=outs[1])
    np.testing.assert_allclose(res["o"], x.max(1))
    np.testing.assert_allclose(res["s"], x.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res["m"], y.min((0, 2)))
    # the two reductions of reduceMany share their compute sets: at most 3 stages for both
    assert n_cs <= 2 + 3


def test_compute_set_list_form_and_empty_reduction():
    h = OpHarness(4)
    a = h.graph.addVariable(poplar.FLOAT, [3, 0], "a")   # (setInitialValue of an empty tensor fails in storage.py)
    css = []
    out = popops.reduce(h.graph, a, [1], Op.MUL, css)
    for cs in css:
        h.prog.add(poplar.program.Execute(cs))
    assert len(css) == 1
    np.testing.assert_array_equal(h.run(out=out)["out"], np.ones(3))


@settings(max_examples=12, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_hypothesis_shapes(shape, data):
    rank = len(shape)
    dims = data.draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank))
    mapping = data.draw(st.sampled_from(MAPPINGS))
    op = data.draw(st.sampled_from([Op.ADD, Op.MAX, Op.SQUARE_ADD]))
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    r, _, _ = _run(x, dims, op, mapping, tiles=8)
    np.testing.assert_allclose(r, _ref(x, dims, op), rtol=1e-5, atol=1e-5)


def test_many_tiles_not_slower_than_one_tile():
    x = np.random.default_rng(8).standard_normal((256, 256)).astype(np.float32)
    for dims in ([1], [0], [0, 1]):
        _, h1, _ = _run(x, dims, Op.ADD, "tile0", tiles=64)
        _, hn, _ = _run(x, dims, Op.ADD, "linear", tiles=64)
        assert hn.cycles() < h1.cycles() / 4, dims


def test_large_fan_in_adds_an_intermediate_stage():
    n = 4 * MAX_FANIN
    x = np.ones((1, n * 8), np.float32)
    r, h, _ = _run(x, [1], Op.ADD, "random", tiles=n)
    assert float(r[0]) == n * 8
    names = [cs.name for cs in h.graph.getComputeSets()]
    assert len(names) == 3, names      # input tiles -> intermediate -> output tile


def test_cost_follows_estimator_shape():
    # on one tile, an innermost-dims reduction (ContinuousReduce) is cheaper per element than a
    # strided one (Reduce), and cycles grow with the element count
    x = np.ones((64, 64), np.float32)
    _, hc, _ = _run(x, [1], Op.ADD, "tile0")
    _, hs, _ = _run(x, [0], Op.ADD, "tile0")
    _, hb, _ = _run(np.ones((64, 256), np.float32), [1], Op.ADD, "tile0")
    assert hc.cycles() < hs.cycles()
    assert hb.cycles() > 2 * hc.cycles()


def test_bad_input_raises_and_graph_stays_usable():
    h = OpHarness(4)
    a = h.input("a", np.ones((3, 4), np.float32))
    b = h.input("b", np.ones(3, np.bool_))
    i = h.input("i", np.ones(3, np.int32))
    n_vars = len(h.graph._state.variables)
    with pytest.raises(poplar.index_error):
        popops.reduce(h.graph, a, [2], Op.ADD, h.prog)
    with pytest.raises(poplar.index_error):
        popops.reduce(h.graph, a, [1, 1], Op.ADD, h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.reduce(h.graph, a, [1], Op.LOGICAL_AND, h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.reduce(h.graph, b, [0], Op.ADD, h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.reduce(h.graph, a, poplar.HALF, [1], Op.MAX, h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.reduce(h.graph, i, [0], Op.LOG_ADD, h.prog)
    with pytest.raises(poplar.poplar_error):
        popops.reduce(h.graph, a, [1], popops.ReduceParams(Op.MAX, update=True), h.prog)
    with pytest.raises(poplar.invalid_option):
        popops.reduce(h.graph, a, [1], Op.ADD, h.prog, options={"accumType.bogus": "float"})
    with pytest.raises(poplar.graph_connection_error):
        popops.reduceWithOutput(h.graph, a, h.input("w", np.zeros(4, np.float32)), [1], Op.ADD, h.prog)
    with pytest.raises(poplar.poplar_error):
        popops.ReduceParams("NOT_AN_OP")
    assert len(h.graph._state.variables) == n_vars + 1   # only the test's own output variable "w"
    out = popops.reduce(h.graph, a, [0], Op.ADD, h.prog)
    np.testing.assert_array_equal(h.run(out=out)["out"], np.full(4, 3.0))


def _row_tiles(h, t, rows):
    return h.graph.tile_of_elements(t).reshape(rows, -1)


@pytest.mark.parametrize("shape,mapping", [((64, 1000), "linear"), ((32, 384), "columns")])
def test_multi_stage_output_mapped_as_poplibs_and_not_slower(shape, mapping):
    rows, cols = shape
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    results = {}
    for how in ("created", "unmapped", "linear"):
        h = OpHarness(1472)
        if mapping == "columns":       # each column on its own tile (as after an embedding lookup)
            a = h.graph.addVariable(poplar.FLOAT, list(shape), "a")
            h.graph.setTileMapping(a, np.tile(np.arange(cols), rows))
            h.graph.setInitialValue(a, x)
        else:
            a = h.input("a", x, mapping=mapping)
        if how == "created":
            out = popops.reduce(h.graph, a, [1], Op.ADD, h.prog)
        else:
            out = h.graph.addVariable(poplar.FLOAT, [rows], "o")
            if how == "linear":        # poputil's default (>= 128 bytes per tile): 2 tiles
                h.map(out, "linear")
            popops.reduceWithOutput(h.graph, a, out, [1], Op.ADD, h.prog)
        r = h.run(out=out)["out"]
        np.testing.assert_allclose(r, x.sum(1), rtol=1e-4, atol=1e-4)
        assert len(h.graph.getComputeSets()) >= 2            # a multi-stage reduction
        results[how] = (h.cycles(), h.graph.tile_of_elements(out), _row_tiles(h, a, rows))
    c_new, otiles, _ = results["created"]
    # PopLibs intermediateToOutput: linear, at least 4 vectors (8 floats on ipu2) per tile
    np.testing.assert_array_equal(np.bincount(otiles)[np.unique(otiles)], np.full(rows // 8, 8))
    np.testing.assert_array_equal(results["unmapped"][1], otiles)
    assert np.unique(results["linear"][1]).size <= 2
    assert c_new < results["linear"][0], (c_new, results["linear"][0])
