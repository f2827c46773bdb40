"""poputil: PopLibs' linear mapping rules, tile imbalance, multi-IPU clones and broadcast operands."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplar.tensor import Interval
from openipu.poplibs import poputil


def _graph(tiles=16, ipus=1):
    m = poplar.IPUModel()
    m.numIPUs, m.tilesPerIPU = ipus, tiles
    dev = m.createDevice()
    return dev, poplar.Graph(dev.getTarget())


def _ivs(mapping):
    return [[(i.begin(), i.end()) for i in tile] for tile in mapping]


def test_split_regions_follows_poplibs_example():
    # the worked example of PopLibs lib/poputil/Util.cpp (splitRegionsAux): 42 elements, grain 4,
    # at most 8 parts of at least 6 -> 11 grains in 4 parts. The code puts grains
    # [v*11//4, (v+1)*11//4) in part v, i.e. (2, 3, 3, 3) grains (its comment says (3, 3, 3, 2)).
    out = poputil.splitRegions([Interval(0, 10), Interval(15, 20), Interval(33, 60)], 4, 8, 6)
    assert _ivs(out) == [[(0, 8)], [(8, 10), (15, 20), (33, 38)], [(38, 50)], [(50, 60)]]
    assert poputil.splitRegions([], 4, 8) == []
    with pytest.raises(poputil.poplibs_error):
        poputil.splitRegions([(0, 4)], 0, 8)


def test_linear_mapping_defaults_grain_and_minimum():
    dev, g = _graph(16)
    f = g.addVariable(poplar.FLOAT, [100], "f")
    # float: grain 2, at least 32 elements (128 bytes) per tile -> 3 tiles of 32, 34, 34
    assert _ivs(poputil.calcLinearTileMapping(g, f))[:4] == [[(0, 32)], [(32, 66)], [(66, 100)], []]
    h = g.addVariable(poplar.HALF, [1000], "h")
    counts = [sum(i.size() for i in t) for t in poputil.calcLinearTileMapping(g, h)]
    # half: grain 4, at least 64 elements per tile: 250 grains over 16 tiles -> 15 or 16 grains each
    assert sum(counts) == 1000 and min(c for c in counts if c) >= 60 and all(c % 4 == 0 for c in counts[:-1])
    poputil.mapTensorLinearly(g, h)
    assert g.getTileMapping(h) == poputil.calcLinearTileMapping(g, h)
    # explicit minimum and grain; the shape form
    assert _ivs(poputil.calcLinearTileMapping(g, [10], 1, 5))[:3] == [[(0, 5)], [(5, 10)], []]
    poputil.mapTensorLinearly(g, f, 0, 1)
    # grain 1: at most ceil(100/16) = 7 per tile, and as few tiles as that allows (15)
    assert [sum(i.size() for i in t) for t in g.getTileMapping(f)] == list(np.diff(np.arange(16) * 100 // 15)) + [0]
    poputil.mapTensorLinearly(g, f, grain_size=50)       # PEP 8 alias: two tiles of 50 (min 32)
    assert [sum(i.size() for i in t) for t in g.getTileMapping(f)][:3] == [50, 50, 0]
    with pytest.raises(poputil.poplibs_error):
        poputil.calcLinearTileMapping(g, [10])


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 3000), tiles=st.sampled_from([1, 4, 16, 37]), half=st.booleans())
def test_linear_mapping_invariants(n, tiles, half):
    dev, g = _graph(tiles)
    t = g.addVariable(poplar.HALF if half else poplar.FLOAT, [n], "t")
    poputil.mapTensorLinearly(g, t)
    grain, min_el = (4, 64) if half else (2, 32)
    tl = g.tile_of_elements(t)
    if n:
        assert np.all(np.diff(tl) >= 0)                          # index order
        counts = np.bincount(tl)
        used = counts[counts > 0]
        assert np.all(used[:-1] % grain == 0)                    # whole grains (the last may be short)
        if n >= min_el * 2:
            assert used.min() >= min_el - grain                  # minimum bytes per tile
        assert poputil.getTileImbalance(g, t, min_el, grain) <= grain + (min_el if n < min_el * tiles else 0)


def test_tile_imbalance_follows_poplibs_rule():
    dev, g = _graph(16)
    t = g.addVariable(poplar.FLOAT, [160], "t")
    g.setTileMapping(t, 0)
    assert poputil.getTileImbalance(g, t) == 160 - 10              # balanced = ceil(160 / 16)
    assert poputil.getTileImbalance(g, t, 32, 2) == 160 - 32
    g.setTileMapping(t, np.arange(160) % 16)
    assert poputil.getTileImbalance(g, t) == 0
    u = g.addVariable(poplar.FLOAT, [3], "u")
    with pytest.raises(poplar.invalid_tile_mapping):
        poputil.getTileImbalance(g, u)


def test_clone_and_copy_to_ipu():
    dev, g = _graph(tiles=4, ipus=2)
    t = g.addVariable(poplar.FLOAT, [8], "t")
    g.setTileMapping(t, np.array([0, 1, 2, 3, 4, 5, 6, 7]))    # half on each IPU
    c = poputil.cloneToIpu(g, t, 1, "c")
    assert g.tile_of_elements(c).tolist() == [4, 5, 6, 7, 4, 5, 6, 7]
    g.setInitialValue(t, np.arange(8.0))
    prog = P.Sequence()
    d = poputil.copyToIpu(g, t, prog, 0, "d")
    assert g.tile_of_elements(d).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    g.createHostRead("d", d)
    e = poplar.Engine(g, prog)
    e.load(dev)
    e.run()
    np.testing.assert_array_equal(e.readTensor("d"), np.arange(8.0))
    assert e.getProfile()["execution"]["tileAverage"]["global_exchange"] > 0
    with pytest.raises(poputil.poplibs_error, match="IPU 2 does not exist"):
        poputil.cloneToIpu(g, t, 2)


def test_clone_to_graph_keeps_local_tiles():
    dev, g = _graph(tiles=8)
    v0, v1, small = g.createVirtualGraph(0, 4), g.createVirtualGraph(4, 8), g.createVirtualGraph(6, 8)
    t = v0.addVariable(poplar.HALF, [6], "t")
    v0.setTileMapping(t, np.array([0, 0, 1, 1, 3, 3]))
    c = poputil.cloneToGraph(v0, v1, t, "c")
    assert g.tile_of_elements(c).tolist() == [4, 4, 5, 5, 7, 7]
    with pytest.raises(poputil.poplibs_error, match="fewer tiles"):
        poputil.cloneToGraph(v0, small, t)


@pytest.mark.parametrize("rows,cols", [(64, 16), (3, 40), (5, 7)])
def test_broadcast_operand_sits_on_tiles_that_use_it(rows, cols):
    dev, g = _graph(16)
    full = g.addVariable(poplar.FLOAT, [rows, cols], "full")
    poputil.mapTensorLinearly(g, full)
    ft = g.tile_of_elements(full).reshape(rows, cols)
    for dim in (0, 1):
        op = poputil.createBroadcastOperand(g, full, poplar.FLOAT, dim, name="b")
        assert op.shape() == [full.dim(dim)]
        users = ft.T if dim == 1 else ft
        ot = g.tile_of_elements(op)
        # every element sits on a tile that holds a slice element with its index
        on_user = np.array([ot[c] in users[c] for c in range(full.dim(dim))])
        assert on_user.all()


def test_broadcast_operand_spreads_over_users_and_dithers():
    dev, g = _graph(16)
    full = g.addVariable(poplar.FLOAT, [256, 8], "full")
    poputil.mapTensorLinearly(g, full)           # every tile holds whole rows: all tiles use all 8
    op = poputil.createBroadcastOperand(g, full, poplar.FLOAT, 1)
    assert g.tile_of_elements(op).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]       # grain 2 over the users
    dith = poputil.createBroadcastOperand(g, full, poplar.FLOAT, 1, ditherMapping=True)
    start = poputil._boost_hash_range([256, 8]) % 16
    assert g.tile_of_elements(dith).tolist() == [(t + start) % 16 for t in [0, 0, 1, 1, 2, 2, 3, 3]]
    hp = poputil.createBroadcastOperand(g, full, poplar.HALF, 1)
    assert g.tile_of_elements(hp).tolist() == [0] * 4 + [1] * 4                # grain 4 for half
    with pytest.raises(poplar.index_error):
        poputil.createBroadcastOperand(g, full, poplar.FLOAT, 2)


def test_dim_split_queries():
    dev, g = _graph(tiles=4, ipus=2)
    t = g.addVariable(poplar.FLOAT, [2, 4], "t")
    g.setTileMapping(t, np.array([0, 1, 2, 3, 4, 5, 6, 7]))
    assert poputil.dimIsSplitOverTiles(g, t, 0) and poputil.dimIsSplitOverTiles(g, t, 1)
    assert poputil.dimIsSplitOverIPUs(g, t, 0) and not poputil.dimIsSplitOverIPUs(g, t, 1)
    g.setTileMapping(t, np.array([0, 1, 2, 3, 0, 1, 2, 3]))
    assert not poputil.dimIsSplitOverTiles(g, t, 0)
