"""popops cast, castWithOutput, fill, zero, iota, pad and encodeOneHot against numpy."""

import numpy as np
import pytest

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popops


@pytest.mark.parametrize("mapping", ["linear", "random", "blocks"])
def test_cast_between_types(mapping):
    h = OpHarness(tiles=8)
    rng = np.random.default_rng(0)
    x = (rng.uniform(-300, 300, (6, 7))).astype(np.float32)
    tx = h.input("x", x, mapping=mapping)
    ti = h.input("i", rng.integers(-5, 5, 20).astype(np.int32), mapping=mapping)
    tb = h.input("b", rng.random(20) > 0.5, mapping=mapping)
    outs = {"h": popops.cast(h.graph, tx, poplar.HALF, h.prog), "i": popops.cast(h.graph, tx, poplar.INT, h.prog),
            "f": popops.cast(h.graph, ti, poplar.FLOAT, h.prog), "b": popops.cast(h.graph, ti, poplar.BOOL, h.prog),
            "bf": popops.cast(h.graph, tb, poplar.FLOAT, h.prog),
            "u8": popops.cast(h.graph, ti, poplar.UNSIGNED_CHAR, h.prog),
            "hf": popops.cast(h.graph, popops.cast(h.graph, tx, poplar.HALF, h.prog), poplar.FLOAT, h.prog),
            "same": popops.cast(h.graph, tx, poplar.FLOAT, h.prog)}
    res = h.run(**outs)
    np.testing.assert_array_equal(res["h"], x.astype(np.float16))
    assert res["i"].dtype == np.int32
    np.testing.assert_array_equal(res["i"], np.trunc(x).astype(np.int32))
    np.testing.assert_array_equal(res["hf"], x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(res["same"], x)
    ints = res["f"].astype(np.int64)
    np.testing.assert_array_equal(res["b"], ints != 0)
    np.testing.assert_array_equal(res["u8"], (ints & 0xFF).astype(np.uint8))
    assert res["bf"].dtype == np.float32 and set(np.unique(res["bf"])) <= {0.0, 1.0}
    # output mapped like the source
    assert (h.graph.tile_of_elements(outs["h"]) == h.graph.tile_of_elements(tx)).all()


def test_cast_with_output_and_compute_set_form():
    h = OpHarness(tiles=4)
    x = np.linspace(-2, 2, 30).astype(np.float32)
    tx = h.input("x", x, mapping="random")
    out = h.graph.addVariable(poplar.HALF, [30], "out")
    h.map(out, "blocks")
    popops.castWithOutput(h.graph, tx, out, h.prog)
    cs = h.graph.addComputeSet("c")
    o2 = popops.cast(h.graph, tx, poplar.INT, cs)
    o3 = h.graph.addVariable(poplar.HALF, [30], "o3")
    h.map(o3, "linear")
    popops.cast(h.graph, tx, o3, cs)
    h.prog.add(poplar.program.Execute(cs))
    res = h.run(out=out, o2=o2, o3=o3)
    np.testing.assert_array_equal(res["out"], x.astype(np.float16))
    np.testing.assert_array_equal(res["o2"], np.trunc(x).astype(np.int32))
    np.testing.assert_array_equal(res["o3"], x.astype(np.float16))


def test_cast_cycles_follow_poplibs_shape():
    target = OpHarness(tiles=4).graph.getTarget()
    n = np.array([4800])
    f2h = popops.cast_cycles(n, poplar.FLOAT, poplar.HALF, target)[0]
    i2f = popops.cast_cycles(n, poplar.INT, poplar.FLOAT, target)[0]
    # float->half: 4 elements per 2 cycles, + 1 check per remainder bit (2 bits of 4);
    # int->float: 1 element per 2 cycles (+ fixed overheads)
    assert f2h == 19 + 6 * (23 + 19 + 2 * (800 // 4) + 2)
    assert i2f == 19 + 6 * (23 + 19 + 2 * 800)
    big = popops.cast_cycles(np.array([9600]), poplar.FLOAT, poplar.HALF, target)[0]
    assert big > f2h


@pytest.mark.parametrize("np_t,value", [(np.float32, 2.5), (np.float16, -1.25), (np.int32, 7), (np.bool_, True),
                                        (np.uint16, 65535)])
def test_fill_and_zero(np_t, value):
    h = OpHarness(tiles=8)
    t = h.input("t", np.ones((5, 9), np_t) if np_t != np.bool_ else np.zeros((5, 9), bool), mapping="blocks")
    z = h.input("z", np.ones(33, np_t), mapping="random")
    popops.fill(h.graph, t, h.prog, value)
    popops.zero(h.graph, z, h.prog)
    res = h.run(t=t, z=z)
    np.testing.assert_array_equal(res["t"], np.full((5, 9), value, np_t))
    np.testing.assert_array_equal(res["z"], np.zeros(33, np_t))


def test_fill_compute_set_forms_and_cycles():
    h = OpHarness(tiles=4)
    t = h.input("t", np.zeros(40, np.float32), mapping="linear")
    tiles = h.graph.tile_of_elements(t)
    cs = h.graph.addComputeSet("f")
    popops.fill(h.graph, t, int(tiles[0]), cs, 3.0)                 # the elements on one tile only
    popops.fill(h.graph, t, [[], [], [], [(38, 40)]], cs, 5.0)       # a per-tile interval mapping
    h.prog.add(poplar.program.Execute(cs))
    res = h.run(t=t)["t"]
    want = np.zeros(40, np.float32)
    want[tiles == tiles[0]] = 3.0
    want[38:40] = 5.0
    np.testing.assert_array_equal(res, want)
    target = h.graph.getTarget()
    # PopLibs _fillCycleEstimate: float 16 + n/2 + 6 + (n%2==1) + 1; half 26 + n/4; 8-bit 28 + n/4
    assert popops.fill_cycles(np.array([11]), poplar.FLOAT, target)[0] == 16 + 5 + 6 + 1 + 1
    assert popops.fill_cycles(np.array([40]), poplar.HALF, target)[0] == 26 + 10
    assert popops.fill_cycles(np.array([40]), poplar.BOOL, target)[0] == 28 + 10


@pytest.mark.parametrize("np_t,start", [(np.int32, -5), (np.uint32, 3)])
def test_iota(np_t, start):
    h = OpHarness(tiles=8)
    t = h.input("t", np.zeros(50, np_t), mapping="random")
    popops.iota(h.graph, t, start, h.prog)
    res = h.run(t=t)["t"]
    assert res.dtype == np_t
    np.testing.assert_array_equal(res, np.arange(start, start + 50).astype(np_t))


def test_pad_constant_and_views():
    h = OpHarness(tiles=8)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = h.input("x", x, mapping="random")
    p1 = popops.pad(h.graph, t, [1, 0], [2, 3], 9.0)
    p2 = popops.pad(h.graph, t, 2, 1, 1, -1.0)                      # one dim
    p3 = popops.pad(h.graph, t, [-1, 1], [0, -2], 0.0)              # negative = truncate
    v = h.input("v", np.array([4.5], np.float32))
    p4 = popops.pad(h.graph, t, [0, 1], [1, 0], v.reshape([]))      # tensor pad value
    pe = popops.pad(t, [2, 1], [1, 3], popops.padding.Type.EDGE)
    pr = popops.pad(t, [2, 1], [1, 3], popops.padding.Type.REFLECT)
    pr1 = popops.pad(t, 1, 2, 0, popops.padding.Type.REFLECT)
    res = h.run(p1=p1, p2=p2, p3=p3, p4=p4, pe=pe, pr=pr, pr1=pr1)
    np.testing.assert_array_equal(res["p1"], np.pad(x, [(1, 2), (0, 3)], constant_values=9.0))
    np.testing.assert_array_equal(res["p2"], np.pad(x, [(0, 0), (2, 1)], constant_values=-1.0))
    np.testing.assert_array_equal(res["p3"], np.pad(x[1:, :2], [(0, 0), (1, 0)]))
    np.testing.assert_array_equal(res["p4"], np.pad(x, [(0, 1), (1, 0)], constant_values=4.5))
    np.testing.assert_array_equal(res["pe"], np.pad(x, [(2, 1), (1, 3)], mode="edge"))
    np.testing.assert_array_equal(res["pr"], np.pad(x, [(2, 1), (1, 3)], mode="reflect"))
    np.testing.assert_array_equal(res["pr1"], np.pad(x, [(1, 2), (0, 0)], mode="reflect"))
    # views: the unpadded part aliases t
    assert np.array_equal(pe.slice(2, 5, 0).slice(1, 5, 1).flat_addresses(), t.flat_addresses())


def test_pad_mapping_methods():
    h = OpHarness(tiles=8)
    t = h.input("x", np.ones((2, 3), np.float32), mapping="random")
    ttiles = h.graph.tile_of_elements(t).reshape(2, 3)
    pz = popops.pad(h.graph, t, [0, 2], [0, 0], 0.0)
    assert (h.graph.tile_of_elements(pz).reshape(2, 5)[:, :2] == 0).all()
    pe = popops.pad(h.graph, t, [0, 2], [0, 1], 0.0, popops.padding.MappingMethod.EDGE)
    m = h.graph.tile_of_elements(pe).reshape(2, 6)
    assert (m[:, 0] == ttiles[:, 0]).all() and (m[:, 1] == ttiles[:, 0]).all() and (m[:, 5] == ttiles[:, 2]).all()
    pn = popops.pad(h.graph, t, [1, 0], [0, 0], 0.0, popops.padding.MappingMethod.NONE)
    assert (h.graph.tile_of_elements(pn).reshape(3, 3)[0] == -1).all()


def test_encode_one_hot():
    h = OpHarness(tiles=8)
    idx = np.array([0, 4, 2, -1, 7, 4], np.int32)                   # -1 = MASKED_LABEL_CODE as int
    uidx = np.array([1, 0xFFFFFFFF, 3, 0, 5, 2], np.uint32)
    ti, tu = h.input("i", idx, mapping="random"), h.input("u", uidx)
    outs = {}
    for name, t, ty in (("fh", ti, poplar.HALF), ("ff", ti, poplar.FLOAT), ("uh", tu, poplar.HALF),
                        ("ui", tu, poplar.INT)):
        e = h.graph.addVariable(ty, [6, 5], name)
        h.map(e, "random")
        popops.encodeOneHot(h.graph, t, e, h.prog)
        outs[name] = e
    on, off = h.input("on", np.array([3.0], np.float32)), h.input("off", np.array([-1.0], np.float32))
    ec = h.graph.addVariable(poplar.FLOAT, [6, 5], "ec")
    h.map(ec, "blocks")
    popops.encodeOneHot(h.graph, ti, ec, h.prog, on, off)
    outs["ec"] = ec
    res = h.run(**outs)

    def want(ix, on_=1, off_=0):
        ix = ix.astype(np.int64)
        return np.where(ix[:, None] == np.arange(5), on_, off_)
    np.testing.assert_array_equal(res["fh"], want(idx))
    np.testing.assert_array_equal(res["ff"], want(idx))
    np.testing.assert_array_equal(res["uh"], want(uidx))
    np.testing.assert_array_equal(res["ui"], want(uidx))
    np.testing.assert_array_equal(res["ec"], want(idx, 3.0, -1.0))
    assert res["fh"].dtype == np.float16 and res["ui"].dtype == np.int32


def test_bad_input_raises_and_graph_still_works():
    h = OpHarness(tiles=4)
    x = h.input("x", np.ones((2, 3), np.float32))
    i = h.input("i", np.zeros(4, np.int32))
    unmapped = h.graph.addVariable(poplar.FLOAT, [2, 3], "unmapped")
    n_cs = len(h.graph.getComputeSets())
    cases = [
        (poplar.index_error, lambda: popops.castWithOutput(h.graph, x, i, h.prog)),
        (poplar.invalid_tile_mapping, lambda: popops.castWithOutput(
            h.graph, popops.cast(h.graph, x, poplar.HALF, poplar.program.Sequence()), unmapped, h.prog)),
        (poplar.graph_connection_error, lambda: popops.fill(h.graph, i, h.prog, 2.5)),
        (poplar.invalid_tile_mapping, lambda: popops.fill(h.graph, unmapped, h.prog, 1.0)),
        (poplar.graph_connection_error, lambda: popops.iota(h.graph, x, 0, h.prog)),
        (poplar.graph_connection_error, lambda: popops.iota(h.graph, x.flatten(), 0, h.prog)),
        (poplar.index_error, lambda: popops.pad(h.graph, x, [1], [1], 0.0)),
        (poplar.index_error, lambda: popops.pad(h.graph, x, [-3, 0], [0, 0], 0.0)),
        (poplar.index_error, lambda: popops.pad(x, [0, 3], [0, 0], popops.padding.Type.REFLECT)),
        (poplar.index_error, lambda: popops.encodeOneHot(h.graph, i, x, h.prog)),
        (poplar.graph_connection_error, lambda: popops.encodeOneHot(h.graph, x.transpose()[0], x, h.prog)),
        (poplar.graph_connection_error, lambda: popops.fill(h.graph, x.broadcast(2, 0), h.prog, 1.0)),
    ]
    for exc, fn in cases:
        with pytest.raises(exc) as info:
            fn()
        assert str(info.value)
    # the one case above that builds a cast (into a discarded sequence) leaves a compute set; nothing else does
    assert len(h.graph.getComputeSets()) == n_cs + 1
    h.graph.setTileMapping(unmapped, 0)              # the engine needs every variable mapped
    o = popops.cast(h.graph, x, poplar.HALF, h.prog)
    popops.iota(h.graph, i, 2, h.prog)
    res = h.run(o=o, i=i)
    np.testing.assert_array_equal(res["o"], np.ones((2, 3), np.float16))
    np.testing.assert_array_equal(res["i"], np.arange(2, 6))
