"""Internal exchange code: one unit per region, except that a run of equal regions at one address
stride (a strided or transposed read) is one loop (``exchange_moves.code_units``)."""

import numpy as np
from hypothesis import given, settings, strategies as st

from openipu import poplar
from openipu.poplar import cost as costmod
from openipu.poplar import exchange as X
from openipu.poplar import exchange_moves as XM
from openipu.poplar import program as P


def _graph():
    return poplar.Graph(poplar.IPUModel("ipu2").createDevice().getTarget())


def _spec(g):
    return g._top._target.spec


def test_code_units_count_arithmetic_progressions_per_group():
    # group 0: 5 regions of 2 elements every 4 addresses (a loop: 2 units), then an odd one out;
    # group 1: irregular regions (one unit each)
    group = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1])
    start = np.array([0, 4, 8, 12, 16, 30, 0, 3, 10])
    length = np.array([2, 2, 2, 2, 2, 2, 1, 2, 1])
    unit = XM.code_units(group, start, length)
    assert unit.tolist() == [True, True, False, False, False, True, True, True, True]
    assert XM.code_units(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)).size == 0
    # a progression never continues across groups
    assert XM.code_units(np.array([0, 0, 1]), np.array([0, 2, 4]), np.array([1, 1, 1])).tolist() == [True, True, True]


def test_a_transposed_read_costs_a_loop_per_partner_not_a_region_per_element():
    """A [48, 48] weight mapped in blocks of 6 columns per tile, read transposed in blocks of 6
    rows: a reader needs the 48 rows of one block of columns, 48 regions at one stride on the
    source tile. The time model counts 48 messages; the code is one loop (2 units)."""
    g = _graph()
    w = g.addVariable(poplar.FLOAT, [48, 48], "w")
    for t in range(8):
        g.setTileMapping(w.slice(6 * t, 6 * t + 6, 1), t)
    c = g.addVariable(poplar.FLOAT, [48, 48], "c")
    for t in range(8):
        g.setTileMapping(c.slice(6 * t, 6 * t + 6, 0), (t + 1) % 8)
    v = costmod.exchange_volume(_spec(g), [X.RegionTransfer(w.transpose(), X.tile_boxes(c))])
    tiles = np.arange(8)
    np.testing.assert_array_equal(v.recv_msgs[tiles], 48)
    np.testing.assert_array_equal(v.send_msgs[tiles], 48)
    np.testing.assert_array_equal(v.recv_code[tiles], 2)
    np.testing.assert_array_equal(v.send_code[tiles], 2)
    assert (v.code_units() <= v.recv_msgs + v.send_msgs).all()


def test_irregular_regions_cost_one_unit_each():
    g = _graph()
    a = g.addVariable(poplar.FLOAT, [64], "a")
    g.setTileMapping(a, 0)
    b = g.addVariable(poplar.FLOAT, [64], "b")
    g.setTileMapping(b, 1)
    idx = [0, 1, 5, 12, 13, 14, 30, 63]          # gaps 5, 7, 16, 33: no two alike
    for i in idx:
        g.setTileMapping(b.slice(i, i + 1), 2)
    v = costmod.exchange_volume(_spec(g), [X.RegionTransfer(a, X.tile_boxes(b))])
    np.testing.assert_array_equal(v.recv_code, v.recv_msgs)
    np.testing.assert_array_equal(v.send_code, v.send_msgs)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.data())
def test_code_never_exceeds_the_regions_and_exists_where_data_moves(shape, data):
    g = _graph()
    v = g.addVariable(poplar.FLOAT, shape, "v")
    n = v.numElements()
    g.setTileMapping(v, np.array(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))))
    t = v.dimShuffle(list(range(len(shape)))[::-1]) if data.draw(st.booleans()) else v
    c = g.addVariable(poplar.FLOAT, t.shape(), "c")
    g.setTileMapping(c, np.array(data.draw(st.lists(st.integers(0, 7), min_size=n, max_size=n))))
    per_element = data.draw(st.booleans())
    tr = X.RegionTransfer(t, X.tile_boxes(c))
    vol = costmod.exchange_volume(_spec(g), costmod._elements_of(tr) if per_element else [tr])
    for code, msgs in ((vol.recv_code, vol.recv_msgs), (vol.send_code, vol.send_msgs)):
        assert (code <= msgs).all()
        assert ((code > 0) == (msgs > 0)).all()


def test_a_strided_copy_adds_less_exchange_code_than_regions():
    """Engine level: a copy of every second element (a stride-2 read, as a strided convolution's
    input) into a tensor on another tile: the Internal Exchange Code category holds a loop, not a
    region per element."""
    g = _graph()
    a = g.addVariable(poplar.HALF, [4096], "a")
    g.setTileMapping(a, 0)
    b = g.addVariable(poplar.HALF, [2048], "b")
    g.setTileMapping(b, 1)
    prog = P.Sequence(P.Copy(a.subSample(2, 0), b))
    e = poplar.Engine(g, prog, poplar.OptionFlags({"debug.allowOutOfMemory": "true"}))
    code = e.memory.categories["Internal Exchange Code"]
    vol = costmod.exchange_volume(_spec(g), [X.RegionTransfer(a.subSample(2, 0), X.tile_boxes(b))])
    assert vol.send_msgs[0] == 2048                          # one region per element sent
    assert code[0] < 10 * 8 and code[1] < 10 * 8             # a few units of 8 bytes
