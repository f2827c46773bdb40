"""popops dynamic slicing, multi-slice/update and XLA gather/scatter against numpy; costs; errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popops

MAPPINGS = ["linear", "random", "blocks", "tile0"]
TYPES = [np.float32, np.float16, np.int32]
PTYPE = {np.float32: poplar.FLOAT, np.float16: poplar.HALF, np.int32: poplar.INT}


def _np_dyn_slice(x, offs, dims, sizes):
    for o, d, s in zip(offs, dims, sizes):
        x = np.take(x, (o + np.arange(s)) % x.shape[d], axis=d)
    return x


@pytest.mark.parametrize("mapping", MAPPINGS)
@pytest.mark.parametrize("dtype", TYPES)
def test_dynamic_slice_wraps_and_matches_numpy(mapping, dtype):
    x = (np.random.default_rng(0).standard_normal((9, 5, 6)) * 10).astype(dtype)
    for offs, dims, sizes in [([2], [0], [3]), ([7], [0], [4]), ([4, 1], [2, 1], [3, 5]), ([0, 0, 0], [0, 1, 2], [9, 5, 6])]:
        h = OpHarness(16)
        a = h.input("a", x, mapping=mapping)
        o = h.input("o", np.array(offs, np.uint32), mapping="random")
        out = popops.dynamicSlice(h.graph, a, o, dims, sizes, h.prog)
        np.testing.assert_array_equal(h.run(out=out)["out"], _np_dyn_slice(x, offs, dims, sizes))


def test_dynamic_slice_out_of_range_offset():
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    # default: output left unchanged; remapOutOfBoundIndices: offset 0
    h = OpHarness(8)
    a = h.input("a", x)
    o = h.input("o", np.array([10], np.uint32))
    neg = h.input("n", np.array([-1], np.int32))
    out = h.input("out", np.full((2, 4), 7.0, np.float32))
    popops.dynamicSliceWithOutput(h.graph, out, a, o, [0], [2], h.prog)
    remapped = popops.dynamicSlice(h.graph, a, neg, [0], [2], h.prog, options={"remapOutOfBoundIndices": "true"})
    r = h.run(out=out, rm=remapped)
    np.testing.assert_array_equal(r["out"], np.full((2, 4), 7.0))
    np.testing.assert_array_equal(r["rm"], x[:2])


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_dynamic_update(mapping):
    x = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    s = np.random.default_rng(2).standard_normal((6, 3)).astype(np.float32)
    h = OpHarness(16)
    a = h.input("a", x, mapping=mapping)
    b = h.input("b", x, mapping=mapping)
    u = h.input("u", s, mapping="random")
    o = h.input("o", np.array([6], np.int32))
    bad = h.input("bad", np.array([8], np.int32))
    popops.dynamicUpdate(h.graph, a, u, o, [1], [3], h.prog)
    popops.dynamicUpdate(h.graph, b, u, bad, [1], [3], h.prog)
    r = h.run(a=a, b=b)
    ref = x.copy()
    ref[:, [6, 7, 0]] = s
    np.testing.assert_array_equal(r["a"], ref)
    np.testing.assert_array_equal(r["b"], x)            # out of range: unchanged


def test_sliceable_tensor_slices_without_exchange_and_faster():
    h = OpHarness(16)
    t = popops.createSliceableTensor(h.graph, poplar.FLOAT, [64, 128], [0], [1])
    tiles = h.graph.tile_of_elements(t).reshape(64, 128)
    assert (tiles == tiles[0]).all() and len(set(tiles[0].tolist())) == 16
    h.graph.setInitialValue(t, np.arange(64 * 128).reshape(64, 128))
    o = h.input("o", np.array([5], np.uint32))
    out = popops.dynamicSlice(h.graph, t, o, [0], [1], h.prog)
    np.testing.assert_array_equal(h.run(out=out)["out"][0], np.arange(5 * 128, 6 * 128))
    fast = h.cycles()
    h2 = OpHarness(16)
    t2 = h2.input("t", np.zeros((64, 128), np.float32), mapping="linear")    # rows on tiles: columns span tiles
    o2 = h2.input("o", np.array([5], np.uint32))
    out2 = popops.dynamicSlice(h2.graph, t2, o2, [0], [1], h2.prog)
    h2.run(out=out2)
    assert fast < h2.cycles()


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("mapping", ["sliceable", "random"])
def test_multi_slice_and_updates(dtype, mapping):
    rng = np.random.default_rng(3)
    D, E, N = 20, 12, 7
    x = (rng.standard_normal((D, E)) * 5).astype(dtype)
    s = (rng.standard_normal((N, 1, E)) * 5).astype(dtype)
    idx = np.array([3, 19, 0, 3, 25, 7, 3], np.uint32)
    h = OpHarness(16)
    ts = []
    for nm in ("t0", "t1", "t2", "t3"):
        if mapping == "sliceable":
            t = popops.createSliceableTensor(h.graph, PTYPE[dtype], [D, E], [0], [1], debug_name=nm)
            h.graph.setInitialValue(t, x)
        else:
            t = h.input(nm, x, mapping="random")
        ts.append(t)
    i = h.input("i", idx.reshape(N, 1))
    u = h.input("u", s)
    ms = popops.multiSlice(h.graph, ts[0], i, [0], [1], h.prog, popops.SlicePlan(), {})
    popops.multiUpdate(h.graph, ts[1], u, i, [0], [1], h.prog, popops.SlicePlan(), {})
    scale = h.graph.addConstant(PTYPE[dtype], [], 2)
    h.graph.setTileMapping(scale, 1)
    popops.multiUpdateAdd(h.graph, ts[2], u, i, scale, [0], [1], h.prog, popops.SlicePlan(), {})
    popops.multiUpdateMax(h.graph, ts[3], u, i, [0], [1], h.prog, popops.SlicePlan(), {})
    r = h.run(ms=ms, t1=ts[1], t2=ts[2], t3=ts[3])
    valid = idx < D
    ref_ms = np.zeros((N, 1, E), dtype)
    ref_ms[valid, 0] = x[idx[valid]]
    np.testing.assert_array_equal(r["ms"], ref_ms)
    ref1, ref2, ref3 = x.copy(), x.astype(np.float64), x.copy()
    for n in range(N):
        if valid[n]:
            ref1[idx[n]] = s[n, 0]
            ref2[idx[n]] += 2 * s[n, 0].astype(np.float64)
            ref3[idx[n]] = np.maximum(ref3[idx[n]], s[n, 0])
    np.testing.assert_array_equal(r["t1"], ref1)      # repeated offset 3: the last update wins
    np.testing.assert_allclose(r["t2"].astype(np.float64), ref2, rtol=2e-3, atol=2e-2)
    np.testing.assert_array_equal(r["t3"], ref3)


def test_multi_slice_padding_and_remap_options():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    h = OpHarness(4)
    a = h.input("a", x)
    i = h.input("i", np.array([[1], [4], [9]], np.uint32))
    pad = popops.multiSlice(h.graph, a, i, [0], [1], h.prog, None, {"paddingIndexUsed": "true"})
    rem = popops.multiSlice(h.graph, a, i, [0], [1], h.prog, None, {"remapOutOfBoundIndices": "true"})
    r = h.run(pad=pad, rem=rem)
    np.testing.assert_array_equal(r["pad"][:, 0], [x[1], np.zeros(3), np.zeros(3)])
    np.testing.assert_array_equal(r["rem"][:, 0], [x[1], x[0], x[0]])


def _row_split_table(h, x, parts):
    """A variable holding ``x`` ``[rows, cols]``, stored column by column, its rows split into
    ``parts`` equal ranges (PopLibs' slicedDimSplit) and its columns into pairs: column pair j of
    range p on tile ``p * cols / 2 + j``. Returns its ``[rows, cols]`` view."""
    rows, cols = x.shape
    t = h.graph.addVariable(poplar.FLOAT, [cols, rows], "table")
    per = rows // parts
    for p in range(parts):
        for j in range(cols // 2):
            h.graph.setTileMapping(t.slice(2 * j, 2 * j + 2, 0).slice(p * per, (p + 1) * per, 1), p * cols // 2 + j)
    h.graph.setInitialValue(t, np.ascontiguousarray(x.T))
    return t.dimShuffle([1, 0])


def test_multi_slice_of_a_table_split_along_its_rows_slices_each_part_where_it_lives():
    # Two stages, as PopLibs' planned multiSlice: each row range slices on its own tiles, then
    # each slice is picked from its row's range (the table stays where it is).
    x = np.arange(120, dtype=np.float32).reshape(30, 4)
    ids = np.array([[0], [29], [10], [9], [15], [20], [3], [3], [31]], np.uint32)
    h = OpHarness(8)
    t = _row_split_table(h, x, 3)
    i = h.input("i", ids, mapping=7)
    out = popops.multiSlice(h.graph, t, i, [0], [1], h.prog, None, {"paddingIndexUsed": "true"})
    r = h.run(out=out)
    ref = np.where(ids < 30, x[np.minimum(ids[:, 0], 29)], 0)
    np.testing.assert_array_equal(r["out"][:, 0], ref)
    assert out.shape() == [9, 1, 4]
    # the output is spread over the parts' tiles (lookups 0-2 on part 0's, 3-5 on part 1's, ...)
    assert sorted({tl for tl, iv in enumerate(h.graph.getTileMapping(out)) if iv}) == [0, 1, 2, 3, 4, 5]
    # rows of one part split over two tiles: one stage, as before
    h2 = OpHarness(8)
    t2 = h2.input("t", x)
    out2 = popops.multiSlice(h2.graph, t2, h2.input("i", ids[:8], mapping=7), [0], [1], h2.prog)
    np.testing.assert_array_equal(h2.run(out=out2)["out"][:, 0], x[ids[:8, 0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape,n", [((40, 3), 200), ((400, 2), 60), ((16, 3), 5), ((10, 2), 5), ((12, 40), 30)])
def test_multi_slice_of_an_activation_with_few_columns_splits_the_lookups(shape, n, dtype):
    """A table on one tile with fewer columns than tiles (a GCN's node features gathered at
    its edges): PopLibs' planned multiSlice splits the lookups (and the rows, in two stages
    when that holds less) over the tiles instead of slicing every lookup on the table's tile."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape).astype(dtype)
    ids = rng.integers(0, shape[0], (n, 1)).astype(np.uint32)
    ids[3, 0] = shape[0]                                  # the padding index: zeros
    h = OpHarness(16)
    t = h.input("t", x, mapping="tile0")
    i = h.input("i", ids)
    out = popops.multiSlice(h.graph, t, i, [0], [1], h.prog, None, {"paddingIndexUsed": "true"})
    r = h.run(out=out)
    ref = np.where(ids < shape[0], x[np.minimum(ids[:, 0], shape[0] - 1)], 0)
    np.testing.assert_array_equal(r["out"][:, 0], ref)
    held = [sum(iv.size() for iv in ivs) for ivs in h.graph.getTileMapping(out)]
    assert sum(1 for v in held if v) >= min(8, n) and max(held) <= -(-n * shape[1] // 2)
    stages = {st.name for st in h.engine._compiled.compiler.steps}
    plan = popops.slice_plan.plan_lookup_split(*shape, n, PTYPE[dtype], 16)
    assert plan is not None and ("multiSlice/stage1" in stages) == (plan[1] > 1)


def test_planned_multi_slice_roundtrips_through_an_executable_file():
    """Both stages of a lookup-split multiSlice (rows split too) survive serialize /
    deserialize with the same results and predicted cycles."""
    import io
    x = np.random.default_rng(6).standard_normal((400, 2)).astype(np.float32)
    ids = np.random.default_rng(7).integers(0, 400, (60, 1)).astype(np.uint32)
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = 16
    device = m.createDevice()
    g = poplar.Graph(device.getTarget())
    t = g.addVariable(poplar.FLOAT, [400, 2], "t")
    g.setTileMapping(t, 0)
    i = g.addVariable(poplar.UNSIGNED_INT, [60, 1], "i")
    g.setTileMapping(i, 1)
    prog = poplar.program.Sequence()
    out = popops.multiSlice(g, t, i, [0], [1], prog)
    assert popops.slice_plan.plan_lookup_split(400, 2, 60, poplar.FLOAT, 16)[1] > 1
    g.createHostWrite("t", t)
    g.createHostWrite("i", i)
    g.createHostRead("out", out)
    exe = poplar.compileGraph(g, [prog])
    buf = io.BytesIO()
    exe.serialize(buf)
    buf.seek(0)
    outs, cycles = [], []
    for e in (poplar.Engine(exe), poplar.Engine(poplar.Executable.deserialize(buf))):
        e.load(device)
        e.writeTensor("t", x)
        e.writeTensor("i", ids)
        e.run(0)
        outs.append(e.readTensor("out"))
        cycles.append(e.last_run_cycles)
    np.testing.assert_array_equal(outs[0][:, 0], x[ids[:, 0]])
    np.testing.assert_array_equal(outs[0], outs[1])
    assert cycles[0] == cycles[1]


def test_plan_lookup_split():
    """Tutorial 1's GCN: 2,708 x 7 fp32 node features gathered at 10,492 edges on 1,472 tiles."""
    from openipu.poplibs.popops.slice_plan import plan_lookup_split
    ls, ss, us, grain = plan_lookup_split(2708, 7, 10492, poplar.FLOAT, 1472)
    assert (ls, ss, us, grain) == (42, 5, 7, 1) and ls * ss * us <= 1472
    assert plan_lookup_split(2708, 7, 0, poplar.FLOAT, 1472) is None
    assert plan_lookup_split(1, 7, 10, poplar.FLOAT, 1472) is None
    # half: grains of 2 columns (4 bytes)
    assert plan_lookup_split(512, 384, 15360, poplar.HALF, 1472)[3] % 2 == 0


def test_embedding_plan_and_options():
    h = OpHarness(4)
    p = popops.embedding.plan(h.graph, poplar.HALF, 1000, 64, [16], {"usedForUpdate": "false"})
    assert p.numEntries == 1000 and p == popops.embedding.plan(h.graph, poplar.HALF, 1000, 64, [16], {})
    with pytest.raises(poplar.invalid_option):
        popops.embedding.plan(h.graph, poplar.HALF, 10, 4, [2], {"usedForSlice": "false", "usedForUpdate": "false"})
    with pytest.raises(poplar.invalid_option):
        popops.embedding.plan(h.graph, poplar.HALF, 10, 4, [2], {"nonsense": 1})


def test_plan_row_split_fills_the_tiles():
    """BERT-base's fp32 word embedding (30522 x 768) on 1,472 tiles: unsplit, 768 tiles hold a
    column each (122 KB); planned for 128 lookups, the rows are split 15 ways in groups of 8
    columns (1,440 tiles, 65 KB of table each); a small table with many lookups stays whole."""
    from openipu.poplibs.popops.dynamic_slice import plan_row_split
    assert plan_row_split(30522, 768, poplar.FLOAT, 1472, 128) == (15, 8)
    assert plan_row_split(30522, 768, poplar.FLOAT, 1472) == (23, 12)        # all 1,472 tiles
    assert plan_row_split(512, 768, poplar.FLOAT, 1472, 128) is None
    assert plan_row_split(30522, 1472, poplar.FLOAT, 1472) is None            # a column per tile already
    split, grain = plan_row_split(30522, 768, poplar.FLOAT, 1472, 128)
    assert split * -(-768 // grain) <= 1472
    assert -(-30522 // split) * grain * 4 < 0.55 * 30522 * 4


def test_sliceable_tensor_with_an_embedding_plan_uses_every_tile_and_slices_and_updates():
    """With an embedding plan, a table with fewer columns than tiles is split along its rows
    too (as PopLibs' plans split the sliced dimension): 300 x 8 fp32 on 16 tiles fills all 16
    tiles evenly instead of 8; multiSlice and multiUpdateAdd on it match numpy."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    ids = rng.integers(0, 300, (36, 1)).astype(np.uint32)
    upd = rng.standard_normal((36, 1, 8)).astype(np.float32)
    h = OpHarness(16)
    plan = popops.embedding.plan(h.graph, poplar.FLOAT, 300, 8, [36], {})
    t = popops.createSliceableTensor(h.graph, poplar.FLOAT, [300, 8], [0], [1], plan, {}, "table")
    plain = popops.createSliceableTensor(h.graph, poplar.FLOAT, [300, 8], [0], [1], 0, "plain")
    per_tile = np.array([sum(b - a for a, b in iv) for iv in h.graph.getTileMapping(t)])
    assert (per_tile == 150).all()
    assert sum(1 for iv in h.graph.getTileMapping(plain) if iv) == 8
    h.graph.setInitialValue(t, x)
    i = h.input("i", ids, mapping=3)
    s = h.input("s", upd, mapping="random")
    out = popops.multiSlice(h.graph, t, i, [0], [1], h.prog)
    popops.multiUpdateAdd(h.graph, t, s, i, 0.5, [0], [1], h.prog)
    r = h.run(out=out, t=t)
    np.testing.assert_array_equal(r["out"][:, 0], x[ids[:, 0]])
    ref = x.copy()
    np.add.at(ref, ids[:, 0], 0.5 * upd[:, 0])
    np.testing.assert_allclose(r["t"], ref, rtol=1e-6, atol=1e-6)


def test_multi_update_of_a_row_split_table_updates_each_range_where_it_lives():
    """Each row range of a planned table is updated on its own tiles, reading the slices: the
    update's exchange does not grow with the table's rows (it moved the whole table to the
    first range's tiles before)."""
    def exchange(rows):
        h = OpHarness(16)
        plan = popops.embedding.plan(h.graph, poplar.FLOAT, rows, 8, [0], {})
        t = popops.createSliceableTensor(h.graph, poplar.FLOAT, [rows, 8], [0], [1], plan, {}, "table")
        h.graph.setInitialValue(t, 0)
        i = h.input("i", np.arange(6, dtype=np.uint32).reshape(6, 1), mapping=0)
        s = h.input("s", np.ones((6, 1, 8), np.float32), mapping=0)
        popops.multiUpdateAdd(h.graph, t, s, i, 1.0, [0], [1], h.prog, debug_name="upd")
        r = h.run(t=t)
        assert r["t"][:6].sum() == 48 and r["t"][6:].sum() == 0
        assert sum(1 for iv in h.graph.getTileMapping(t) if iv) == 16
        (st,) = [st for st in h.engine._compiled.compiler.steps if st.name == "upd"]
        return float(st.cost.duration["exchange"].max())
    assert exchange(6000) == exchange(600) > 0


def test_multi_slice_cost_grows_with_offsets():
    def cycles(n):
        h = OpHarness(16)
        t = popops.createSliceableTensor(h.graph, poplar.FLOAT, [256, 64], [0], [1])
        h.graph.setInitialValue(t, 0)
        i = h.input("i", np.zeros((n, 1), np.uint32))
        popops.multiSlice(h.graph, t, i, [0], [1], h.prog)
        h.run()
        return h.cycles()
    assert cycles(8) < cycles(64) < cycles(512)


# ----------------------------------------------------------------------------------------------
# gather / scatter (XLA semantics)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mapping", ["linear", "random", "blocks"])
@pytest.mark.parametrize("dtype", TYPES)
def test_gather_onnx_forms(mapping, dtype):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((5, 6, 4)) * 10).astype(dtype)
    h = OpHarness(16)
    a = h.input("a", x, mapping=mapping)
    # ONNX Gather axis=1 with indices [2, 3]
    ind = np.array([[5, 0, 2], [1, 1, 4]], np.int32)
    i1 = h.input("i1", ind, mapping=mapping)
    g1 = popops.gather(h.graph, a, i1, 2, [0, 3], [5, 1, 4], [1], [1], h.prog)
    # GatherND: indices [..., 2] over dims (0, 1) -> slices of dim 2
    nd = np.array([[0, 1], [4, 5], [2, 2]], np.uint32)
    i2 = h.input("i2", nd)
    g2 = popops.gather(h.graph, a, i2, 1, [1], [1, 1, 4], [0, 1], [0, 1], h.prog)
    # XLA doc example: windows of 2x2 with clamping (start 4 in dim 0 clamps to 3)
    st_ = np.array([[4, 1], [0, 5]], np.int32)
    i3 = h.input("i3", st_)
    g3 = popops.gather(h.graph, a, i3, 1, [1, 2, 3], [2, 2, 4], [], [0, 1], h.prog)
    r = h.run(g1=g1, g2=g2, g3=g3)
    np.testing.assert_array_equal(r["g1"], x[:, ind, :])
    np.testing.assert_array_equal(r["g2"], x[nd[:, 0], nd[:, 1]])
    ref3 = np.stack([x[3:5, 1:3], x[0:2, 4:6]])
    np.testing.assert_array_equal(r["g3"], ref3)


def test_scatter_nd_elements_and_combiners():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    h = OpHarness(8)
    ops = {k: h.input(k, x, mapping="random") for k in ("set", "add", "max", "fn", "oob")}
    # ScatterND: rows [3, 0] replaced
    rows = h.input("rows", np.array([[3], [0]], np.int32))
    upd_rows = rng.standard_normal((2, 5)).astype(np.float32)
    u1 = h.input("u1", upd_rows)
    popops.scatter(h.graph, ops["set"], rows, u1, 1, [1], [0], [0], h.prog)
    # ScatterElements-like with reduction add: single elements (i, j), repeats accumulate
    pts = np.array([[1, 2], [1, 2], [3, 4]], np.int32)
    u2v = np.array([1.0, 2.0, 5.0], np.float32)
    p = h.input("p", pts)
    u2 = h.input("u2", u2v)
    popops.scatter(h.graph, ops["add"], p, u2, 1, [], [0, 1], [0, 1], "add", h.prog)
    popops.scatter(h.graph, ops["max"], p, u2, 1, [], [0, 1], [0, 1], "max", h.prog)
    popops.scatter(h.graph, ops["fn"], rows, u1, 1, [1], [0], [0],
                   lambda g, cur, upd, prog: popops.mul(g, cur, upd, prog), h.prog)
    oob = h.input("oobi", np.array([[7], [2]], np.int32))
    popops.scatter(h.graph, ops["oob"], oob, u1, 1, [1], [0], [0], h.prog)
    r = h.run(**ops)
    ref = x.copy(); ref[[3, 0]] = upd_rows
    np.testing.assert_array_equal(r["set"], ref)
    ref = x.copy(); ref[1, 2] += 3; ref[3, 4] += 5
    np.testing.assert_allclose(r["add"], ref, rtol=1e-6)
    ref = x.copy(); ref[1, 2] = max(ref[1, 2], 2); ref[3, 4] = max(ref[3, 4], 5)
    np.testing.assert_array_equal(r["max"], ref)
    ref = x.copy(); ref[[3, 0]] *= upd_rows
    np.testing.assert_allclose(r["fn"], ref, rtol=1e-6)
    ref = x.copy(); ref[2] = upd_rows[1]             # index 7 is out of bounds: skipped
    np.testing.assert_array_equal(r["oob"], ref)


@settings(max_examples=10, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=3), data=st.data())
def test_hypothesis_gather_along_axis(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    n = data.draw(st.integers(1, 4))
    idx = np.array(data.draw(st.lists(st.integers(0, shape[axis] - 1), min_size=n, max_size=n)), np.uint32)
    mapping = data.draw(st.sampled_from(MAPPINGS))
    x = np.random.default_rng(n).standard_normal(shape).astype(np.float32)
    h = OpHarness(8)
    a = h.input("a", x, mapping=mapping)
    i = h.input("i", idx)
    sizes = list(shape)
    sizes[axis] = 1
    offset_dims = [d for d in range(len(shape)) if d != axis]
    # output = x.shape with ``axis`` replaced by the n indices: the batch dim sits at ``axis``
    g = popops.gather(h.graph, a, i, 1, offset_dims, sizes, [axis], [axis], h.prog)
    ref = np.take(x, idx, axis=axis)
    np.testing.assert_array_equal(h.run(g=g)["g"], ref)


# ----------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------
def test_bad_input_raises_and_graph_stays_usable():
    h = OpHarness(4)
    a = h.input("a", np.arange(12, dtype=np.float32).reshape(3, 4))
    off = h.input("o", np.array([1], np.uint32))
    foff = h.input("fo", np.array([1.0], np.float32))
    two = h.input("two", np.array([1, 1], np.uint32))
    with pytest.raises(poplar.index_error):
        popops.dynamicSlice(h.graph, a, off, [2], [1], h.prog)
    with pytest.raises(poplar.index_error):
        popops.dynamicSlice(h.graph, a, off, [0], [4], h.prog)
    with pytest.raises(poplar.index_error):
        popops.dynamicSlice(h.graph, a, off, [0], [1, 1], h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.dynamicSlice(h.graph, a, foff, [0], [1], h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.dynamicSlice(h.graph, a, two, [0], [1], h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.dynamicUpdate(h.graph, a, h.input("s", np.zeros((2, 4), np.float32)), off, [0], [1], h.prog)
    with pytest.raises(poplar.invalid_option):
        popops.dynamicSlice(h.graph, a, off, [0], [1], h.prog, options={"bogus": 1})
    with pytest.raises(poplar.index_error):
        popops.multiSlice(h.graph, a, two.reshape([2, 1]), [0], [2], h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.multiSlice(h.graph, a, two.reshape([1, 2]), [0], [1], h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.multiUpdateAdd(h.graph, a, h.input("s2", np.zeros((2, 1, 4), np.float16)), two.reshape([2, 1]), 1.0,
                              [0], [1], h.prog)
    with pytest.raises(poplar.index_error):
        popops.gather(h.graph, a, two, 0, [0], [1, 4], [1], [0], h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.gather(h.graph, a, foff, 1, [1], [1, 4], [0], [0], h.prog)
    with pytest.raises(poplar.graph_connection_error):
        popops.scatter(h.graph, a, two.reshape([2, 1]), h.input("u", np.zeros((3, 4), np.float32)), 1, [1], [0], [0],
                       h.prog)
    out = popops.dynamicSlice(h.graph, a, off, [0], [2], h.prog)
    np.testing.assert_array_equal(h.run(out=out)["out"], np.arange(4, 12).reshape(2, 4))
