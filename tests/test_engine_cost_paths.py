"""The engine compile's short cuts give the figures of the general exchange costing they skip.

- ``exchange_moves._transfer_pairs``: lattices that are single address intervals take their counts,
  messages and first / last addresses in closed form, and a transfer whose overlaps all stay on
  their tiles returns at once; checked against the general ``count_below`` / ``unrank`` path.
- ``copy_cost`` (the graph compiler's ``tensor_copy_cost``): a copy whose elements stay on their tiles, and a small copy
  costed by the per-element model, skip the transfer's lattice moves; checked against the cost
  with those short cuts turned off (predicted cycles and exchange code per tile).
- ``build_compute_set``: an elementwise read of an operand laid out like the output adds no
  transfer; checked against the compute set's cost with the read costed.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openipu import poplar
from openipu.poplar import copy_cost as CC
from openipu.poplar import cost as costmod
from openipu.poplar import exchange as X
from openipu.poplar import exchange_moves as XM
from openipu.poplar import graph_compiler as GC
from openipu.poplar.options import OptionFlags

TILES = 8
FIELDS = ("recv_bytes", "send_bytes", "recv_msgs", "send_msgs", "global_bytes", "recv_code", "send_code")


@pytest.fixture(autouse=True)
def _no_memo(monkeypatch):
    monkeypatch.setenv("OPENIPU_STRUCTURE_CACHE", "0")     # both sides computed, not memoised


def _graph(num_ipus=1):
    m = poplar.IPUModel("ipu2")
    m.numIPUs, m.tilesPerIPU = num_ipus, TILES
    return poplar.Graph(m.createDevice().getTarget())


def _map_randomly(g, data, v, tiles, runs_max=6):
    """A random run-length tile mapping of the flat variable behind ``v`` (every element mapped)."""
    flat = v.flatten()
    n = flat.numElements()
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=runs_max))) - {n})
    edges = [0] + cuts + [n]
    for a, b in itertools.pairwise(edges):
        g.setTileMapping(flat.slice(a, b), data.draw(st.integers(0, tiles - 1)))


def _view(data, v):
    """A random view of a rank-2 variable: itself, a transpose, a slice, a reversed or
    sub-sampled dim, or a concatenation of two of its slices."""
    r, c = v.shape()
    kind = data.draw(st.sampled_from(["whole", "transpose", "slice", "reverse", "subsample", "concat"]))
    if kind == "transpose":
        return v.transpose()
    if kind == "slice" and r > 1:
        a = data.draw(st.integers(0, r - 2))
        return v.slice(a, r, 0)
    if kind == "reverse":
        return v.reverse(data.draw(st.integers(0, 1)))
    if kind == "subsample" and c > 1:
        return v.subSample(2, 1)
    if kind == "concat" and c > 1:
        k = data.draw(st.integers(1, c - 1))
        return poplar.concat([v.slice(k, c, 1), v.slice(0, k, 1)], 1)
    return v


def _boxes(data, shape, tiles, count, max_side=3):
    """Random (possibly overlapping) boxes of ``shape``'s index space, each on a tile."""
    d = len(shape)
    lo = np.array([[data.draw(st.integers(0, s - 1)) for s in shape] for _ in range(count)], np.int64).reshape(count, d)
    sz = np.array([[data.draw(st.integers(1, max_side)) for _ in shape] for _ in range(count)], np.int64).reshape(count, d)
    sz = np.minimum(sz, np.array(shape, np.int64) - lo)
    t = np.array(data.draw(st.lists(st.integers(0, tiles - 1), min_size=count, max_size=count)), np.int64)
    return X.Boxes(lo, sz, t)


def _pairs_general(tr, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(XM, "_all_intervals", lambda T, n: False)
        return XM._transfer_pairs(tr)


def _same_pairs(a, b):
    """Equal moves: None (nothing moves) matches an empty result."""
    empty = lambda r: r is None or (not isinstance(r, str) and r[0].size == 0)
    if empty(a) or empty(b):
        assert empty(a) and empty(b)
        return
    assert not isinstance(a, str) and not isinstance(b, str)
    for i, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_array_equal(x, y, err_msg=f"field {i}")


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_interval_pairs_match_the_general_path(data):
    g = _graph()
    r, c = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 8))
    v = g.addVariable(poplar.FLOAT, [r, c], "v")
    _map_randomly(g, data, v, TILES)
    view = _view(data, v)
    if data.draw(st.booleans()):
        view = view.flatten()                 # rank 1: contiguous pieces, the closed form's case
    boxes = _boxes(data, view.shape(), TILES, data.draw(st.integers(1, 12)))
    mp = pytest.MonkeyPatch()
    for to_owner in (False, True):
        tr = X.RegionTransfer(view, boxes, to_owner=to_owner)
        _same_pairs(XM._transfer_pairs(tr), _pairs_general(tr, mp))
        spec = g._top._target.spec
        fast = costmod.exchange_volume(spec, [tr])
        with mp.context() as m:
            m.setattr(XM, "_all_intervals", lambda T, n: False)
            slow = costmod.exchange_volume(spec, [tr])
        for f in FIELDS:
            np.testing.assert_array_equal(getattr(fast, f), getattr(slow, f), err_msg=f)


def test_interval_closed_form_is_used():
    """The closed form covers flat reads (a mutation of it must reach the comparison above)."""
    g = _graph()
    v = g.addVariable(poplar.FLOAT, [64], "v")
    for k in range(8):
        g.setTileMapping(v.slice(8 * k, 8 * k + 8), k)
    boxes = X.Boxes(np.array([[0], [5], [20]], np.int64), np.array([[10], [30], [40]], np.int64),
                    np.array([3, 1, 7], np.int64))
    tr = X.RegionTransfer(v, boxes)
    _, _, _, T, n, _ = X.lattices(v, boxes)
    assert XM._all_intervals(T, n)
    res = XM._transfer_pairs(tr)
    assert res is not None and res[0].size > 0


def _copy_cost(g, s, d, fast: bool, monkeypatch):
    comp = GC._Compiler(g, OptionFlags())
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(CC, "_same_tiles", lambda a, b, max_elements=0: (False, None))
        c = comp.tensor_copy_cost(s, d)
    return c, comp.exchange_code.copy()


def _assert_same_cost(a, b):
    (ca, xa), (cb, xb) = a, b
    for k in costmod.CATEGORIES:
        np.testing.assert_array_equal(ca.duration[k], cb.duration[k], err_msg=k)
        np.testing.assert_array_equal(ca.tile_sum[k], cb.tile_sum[k], err_msg=k)
    np.testing.assert_array_equal(ca.tile_sum["compute_excl"], cb.tile_sum["compute_excl"])
    assert ca.by_vertex_type == cb.by_vertex_type and ca.syncs == cb.syncs
    np.testing.assert_array_equal(xa, xb)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.data())
def test_copy_short_cuts_match_the_lattice_moves(data):
    g = _graph(data.draw(st.integers(1, 2)))
    tiles = g._top._target.getNumTiles()
    r, c = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 8))
    a = g.addVariable(poplar.HALF, [r, c], "a")
    b = g.addVariable(poplar.HALF, [r, c], "b")
    _map_randomly(g, data, a, tiles, runs_max=12)
    if data.draw(st.booleans()):
        _map_randomly(g, data, b, tiles, runs_max=12)
    else:
        g.setTileMapping(b, g.getTileMapping(a))         # laid out alike
    s = _view(data, a)
    d = _view(data, b)
    if s.shape() != d.shape():
        d = d.reshape(s.shape()) if d.numElements() == s.numElements() else d
    if s.shape() != d.shape():
        return
    mp = pytest.MonkeyPatch()
    _assert_same_cost(_copy_cost(g, s, d, True, mp), _copy_cost(g, s, d, False, mp))


def test_copy_short_cuts_are_taken(monkeypatch):
    """Both short cuts run on these copies (so the comparison above covers them): a copy between
    two views laid out alike, and a transposing copy of a finely mapped tensor."""
    g = _graph()
    a = g.addVariable(poplar.FLOAT, [4, 6], "a")
    b = g.addVariable(poplar.FLOAT, [4, 6], "b")
    for i in range(24):
        g.setTileMapping(a.flatten().slice(i, i + 1), i % TILES)
        g.setTileMapping(b.flatten().slice(i, i + 1), (i * 3) % TILES)
    seen = []
    orig = costmod.exchange_volume

    def spy(spec, trs, pairs=None):
        seen.append(pairs)
        return orig(spec, trs, pairs)
    monkeypatch.setattr(costmod, "exchange_volume", spy)
    comp = GC._Compiler(g, OptionFlags())
    comp.tensor_copy_cost(a.transpose(), b.reshape([6, 4]))
    assert seen == [None]                        # the per-element copy: no lattice moves passed
    assert CC._same_tiles(a.transpose(), a.transpose())[0]
    with monkeypatch.context() as m:
        m.setattr(CC, "_same_tiles", lambda *x, **k: (_ for _ in ()).throw(AssertionError("not used")))
        with pytest.raises(AssertionError):
            comp.tensor_copy_cost(a, b.reshape([4, 6]).transpose().transpose())


def test_elementwise_read_of_an_alike_operand_adds_no_transfer(monkeypatch):
    """Compute sets reading operands laid out like their outputs (and one that is not): the same
    predicted cost and exchange code with those reads skipped as with them costed."""
    from openipu.poplibs import popops
    g = _graph()
    popops.addCodelets(g)
    x = g.addVariable(poplar.FLOAT, [8, 12], "x")
    for i in range(8):
        g.setTileMapping(x[i], (3 * i) % TILES)
    xc = g.clone(x, "xc")
    y = g.addVariable(poplar.FLOAT, [8, 12], "y")
    g.setTileMapping(y, 0)
    prog = poplar.program.Sequence()
    popops.add(g, x, xc, prog)
    popops.mul(g, x.transpose(), xc.transpose(), prog)
    popops.add(g, x, y, prog)
    skipped = []
    orig = GC._on_own_tiles
    monkeypatch.setattr(GC, "_on_own_tiles", lambda acc: skipped.append(orig(acc)) or skipped[-1])
    results = []
    for skip in (True, False):
        with monkeypatch.context() as m:
            if not skip:
                m.setattr(GC, "_on_own_tiles", lambda acc: False)
            comp = GC.compile_programs(g, [prog], OptionFlags()).compiler
            results.append((comp.exchange_code.copy(), [s_.total.tolist() for s_ in comp.steps]))
    assert any(skipped) and not all(skipped)
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1]


def _per_reader(spec, trs, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(XM, "_add_shared_box_reads", lambda *a, **k: False)
        return costmod.exchange_volume(spec, trs)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.data())
def test_shared_box_reads_match_the_per_reader_moves(data):
    """Reads of a few ranges by many tiles (one box per tile): costed per distinct range, the
    figures of costing every reader's box (1-2 IPUs, supertile scales, multicast or not,
    unmapped sources, views over two variables)."""
    num_ipus = data.draw(st.integers(1, 2))
    g = _graph(num_ipus)
    tiles = TILES * num_ipus
    parts = []
    for i in range(data.draw(st.integers(1, 2))):
        v = g.addVariable(poplar.HALF, [data.draw(st.integers(2, 40))], f"v{i}")
        n = v.numElements()
        if data.draw(st.booleans()):
            # equal chunks on a cycle of tiles: each source's intervals at one stride (code loops)
            chunk, cycle = data.draw(st.integers(1, 4)), data.draw(st.integers(2, 4))
            first = data.draw(st.integers(0, tiles - cycle))
            for j, a in enumerate(range(0, n, chunk)):
                g.setTileMapping(v.slice(a, min(n, a + chunk)), first + j % cycle)
        else:
            cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=8))))
            edges = [0] + cuts + [n]
            for a, b in itertools.pairwise(edges):
                if data.draw(st.integers(0, 9)) > 0:             # sometimes left unmapped
                    g.setTileMapping(v.slice(a, b), data.draw(st.integers(0, tiles - 1)))
        parts.append(v)
    view = poplar.concat(parts, 0) if len(parts) > 1 else parts[0]
    n = view.numElements()
    ranges = [(data.draw(st.integers(0, n - 1)), data.draw(st.integers(1, n))) for _ in range(data.draw(st.integers(1, 3)))]
    readers = data.draw(st.permutations(list(range(tiles))))[:data.draw(st.integers(4, tiles))]
    # each reader's range; the last range is read by one tile only when drawn so
    which = [i % len(ranges) for i in range(len(readers))]
    if len(ranges) > 1 and data.draw(st.booleans()):
        which = [min(w, len(ranges) - 2) for w in which[:-1]] + [len(ranges) - 1]
    lo = np.array([ranges[w][0] for w in which], np.int64)
    sz = np.minimum(np.array([ranges[w][1] for w in which], np.int64), n - lo)
    boxes = X.Boxes(lo[:, None], sz[:, None], np.array(readers, np.int64))
    tr = X.RegionTransfer(view, boxes, count_send=data.draw(st.booleans()),
                          supertile_recv_scale=data.draw(st.sampled_from([1.0, 0.5, 0.25])))
    spec = g._top._target.spec
    taken = XM._add_shared_box_reads(spec, tr, *[np.zeros(tiles) for _ in range(4)], np.zeros(num_ipus),
                                    np.zeros(tiles), np.zeros(tiles))
    assert taken == (len(set(zip(lo.tolist(), sz.tolist()))) <= XM.SHARED_BOX_MAX_FRACTION * len(readers))
    fast = costmod.exchange_volume(spec, [tr])
    slow = _per_reader(spec, [tr], pytest.MonkeyPatch())
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(fast, f), getattr(slow, f), err_msg=f)


def _per_element(spec, trs, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(costmod, "_read_segments", lambda tr: None)
        return costmod.exchange_volume(spec, trs)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_rank_n_read_segments_give_the_per_element_figures(data):
    """Small-box reads of views of rank > 1 (one piece with rows of stride 1, or one dim of more
    than one element) costed from segments: the per-element model's figures."""
    num_ipus = data.draw(st.integers(1, 2))
    g = _graph(num_ipus)
    tiles = TILES * num_ipus
    r, c = data.draw(st.integers(1, 6)), data.draw(st.integers(2, 8))
    v = g.addVariable(poplar.HALF, [r, c], "v")
    _map_randomly(g, data, v, tiles, runs_max=10)
    kind = data.draw(st.sampled_from(["whole", "rows", "expand", "broadcast", "single", "reversed_rows"]))
    if kind == "rows" and r > 1:
        view = v.slice(data.draw(st.integers(0, r - 2)), r, 0)
    elif kind == "expand":
        view = v.reshape([r, 1, c, 1])
    elif kind == "broadcast":
        view = v[0].reshape([1, c]).broadcast(3, 0)
    elif kind == "single":
        view = v[data.draw(st.integers(0, r - 1))].reshape([1, c])
    elif kind == "reversed_rows":
        view = v.reverse(0)
    else:
        view = v
    count = max(1, -(-(2 * view.numElements()) // costmod.ELEMENTS_PER_BOX)) + data.draw(st.integers(0, 20))
    boxes = _boxes(data, view.shape(), tiles, count, max_side=2)
    tr = X.RegionTransfer(view, boxes, count_send=data.draw(st.booleans()))
    spec = g._top._target.spec
    assert costmod.per_element_model(tr)
    assert costmod._read_segments(tr) is not None
    fast = costmod.exchange_volume(spec, [tr])
    slow = _per_element(spec, [tr], pytest.MonkeyPatch())
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(fast, f), getattr(slow, f), err_msg=f)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.data())
def test_copy_between_rows_of_alike_mapped_variables(data):
    """Row slices of two variables mapped alike, at the same or different offsets: only the same
    offsets lie alike (the one-piece comparison of _same_tiles), the figures as with no short cut."""
    g = _graph()
    r, c = data.draw(st.integers(2, 6)), data.draw(st.integers(1, 6))
    a = g.addVariable(poplar.FLOAT, [r, c], "a")
    b = g.addVariable(poplar.FLOAT, [r, c], "b")
    _map_randomly(g, data, a, TILES, runs_max=8)
    g.setTileMapping(b, g.getTileMapping(a))
    h = data.draw(st.integers(1, r - 1))
    i, j = data.draw(st.integers(0, r - h)), data.draw(st.integers(0, r - h))
    s, d = a.slice(i, i + h, 0), b.slice(j, j + h, 0)
    if i == j:
        assert CC._same_tiles(s, d, 0)[0]
    mp = pytest.MonkeyPatch()
    _assert_same_cost(_copy_cost(g, s, d, True, mp), _copy_cost(g, s, d, False, mp))
