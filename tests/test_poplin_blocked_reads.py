"""poplin's closed-form reads of a tensor it lays out block by block
(``core.blocked_runs_access``, the reduction's reads of the partials; issue 34) against the
general path (``core.runs_access``: boxes intersected with the view's pieces, then address
runs): the same runs in the same order on random grids and boxes, None where the form does not
hold, and a mutation of the closed form is caught."""

import numpy as np
import pytest

from openipu import poplar
from openipu.poplar import regions as R
from openipu.poplar.exchange import Boxes
from openipu.poplibs.poplin import core, layout


def _graph(tiles=16):
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = tiles
    return poplar.Graph(m.createDevice().getTarget())


def _random_edges(rng, shape):
    return [np.unique(np.r_[0, rng.integers(1, n, rng.integers(0, n)), n]) if n > 1 else np.array([0, n])
            for n in shape]


def _boxes_inside_cells(rng, edges, k, tiles):
    """``k`` random boxes, each inside one random cell of the grid (some empty)."""
    lo, sz = [], []
    for _ in range(k):
        b_lo, b_sz = [], []
        for e in edges:
            c = rng.integers(0, e.size - 1)
            a, b = int(e[c]), int(e[c + 1])
            x = rng.integers(a, b)
            b_lo.append(x)
            b_sz.append(rng.integers(0 if rng.random() < 0.05 else 1, b - x + 1))
        lo.append(b_lo)
        sz.append(b_sz)
    return Boxes(np.array(lo, np.int64), np.array(sz, np.int64), rng.integers(0, tiles, k).astype(np.int64))


def _same(a, b):
    assert a is not None and b is not None
    assert a.tensor.shape() == b.tensor.shape()
    pa, pb = a.tensor.pieces, b.tensor.pieces
    for f in ("var", "addr", "lo", "sz", "st"):
        np.testing.assert_array_equal(getattr(pa, f), getattr(pb, f))
    for f in ("lo", "sz", "tile"):
        np.testing.assert_array_equal(getattr(a.on, f), getattr(b.on, f))
    assert (a.count_send, a.supertile_recv_scale) == (b.count_send, b.supertile_recv_scale)


@pytest.mark.parametrize("seed", range(4))
def test_blocked_reads_equal_the_general_path(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        g = _graph()
        other = g.addVariable(poplar.FLOAT, [int(rng.integers(1, 50))], "before")   # a non-zero start
        g.setTileMapping(other, 0)
        shape = [int(n) for n in rng.integers(1, 9, rng.integers(1, 5))]
        edges = _random_edges(rng, shape)
        t = layout.blocked_tensor(g, poplar.FLOAT, edges, "p")
        boxes = _boxes_inside_cells(rng, edges, int(rng.integers(1, 60)), 16)
        got = core.blocked_runs_access(t, edges, boxes)
        if not (boxes.sz > 0).all(axis=1).any():
            assert got is None
            continue
        _same(got, core.runs_access(t, boxes))


@pytest.mark.parametrize("seed", range(4))
def test_blocked_reads_of_every_slab_equal_the_general_path(seed):
    """The reduction's form: boxes of slab 0 read in each of ``slabs`` one-index slabs."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(25):
        g = _graph()
        slabs = int(rng.integers(1, 6))
        shape = [slabs] + [int(n) for n in rng.integers(1, 8, rng.integers(1, 4))]
        edges = [np.arange(slabs + 1)] + _random_edges(rng, shape[1:])
        t = layout.blocked_tensor(g, poplar.HALF, edges, "partials")
        b0 = _boxes_inside_cells(rng, edges[1:], int(rng.integers(1, 40)), 16)
        one = np.ones((len(b0), 1), np.int64)
        boxes0 = Boxes(np.concatenate([0 * one, b0.lo], axis=1), np.concatenate([one, b0.sz], axis=1), b0.tile)
        got = core.blocked_runs_access(t, edges, boxes0, slabs=slabs)
        if not (b0.sz > 0).all(axis=1).any():
            assert got is None
            continue
        slab = np.repeat(np.arange(slabs, dtype=np.int64), len(b0))
        full = Boxes(np.concatenate([slab[:, None], np.tile(b0.lo, (slabs, 1))], axis=1),
                     np.concatenate([np.ones((slab.size, 1), np.int64), np.tile(b0.sz, (slabs, 1))], axis=1),
                     np.tile(b0.tile, slabs))
        _same(got, core.runs_access(t, full))


def test_boxes_or_tensors_out_of_form_take_the_general_path():
    g = _graph()
    edges = [np.array([0, 2, 4]), np.array([0, 3, 6])]
    t = layout.blocked_tensor(g, poplar.FLOAT, edges, "p")
    over = Boxes(np.array([[1, 0]]), np.array([[2, 2]]), np.array([0]))           # crosses a block edge
    assert core.blocked_runs_access(t, edges, over) is None
    inside = Boxes(np.array([[0, 3]]), np.array([[2, 3]]), np.array([0]))
    assert core.blocked_runs_access(t, edges, inside) is not None
    assert core.blocked_runs_access(t, [np.array([0, 4]), np.array([0, 3, 6])], inside) is None   # other grid
    assert core.blocked_runs_access(t.transpose(), edges[::-1], inside) is None                 # a view
    plain = g.addVariable(poplar.FLOAT, [4, 6], "plain")                                         # not blocked
    assert core.blocked_runs_access(plain, edges, inside) is None
    serial = layout.blocked_tensor(g, poplar.FLOAT, edges, "s", serial=lambda lo: -lo[:, 0])     # other order
    _same(core.blocked_runs_access(serial, edges, inside), core.runs_access(serial, inside))
    slabbed = [np.array([0, 1, 2]), np.array([0, 3, 6])]
    serial = layout.blocked_tensor(g, poplar.FLOAT, slabbed, "s2", serial=lambda lo: -lo[:, 0])
    assert core.blocked_runs_access(serial, slabbed, Boxes(np.array([[0, 3]]), np.array([[1, 3]]), np.array([0])),
                                    slabs=2) is None                                # slab 1 stored first
    assert core.blocked_runs_access(t, edges, Boxes(np.array([[0, 3]]), np.array([[1, 3]]), np.array([0])),
                                    slabs=2) is None                                            # dim 0 not slabs


def test_a_mutated_closed_form_is_caught(monkeypatch):
    """The comparison sees a one-element shift of the runs (the test above would fail)."""
    rng = np.random.default_rng(7)
    g = _graph()
    edges = [np.array([0, 3, 5]), np.array([0, 2, 7])]
    t = layout.blocked_tensor(g, poplar.FLOAT, edges, "p")
    boxes = _boxes_inside_cells(rng, edges, 30, 16)
    real = R._address_runs

    def shifted(a, s, st):
        owner, start, length = real(a, s, st)
        return owner, start + 1, length

    monkeypatch.setattr(R, "_address_runs", shifted)
    got = core.blocked_runs_access(t, edges, boxes)
    monkeypatch.setattr(R, "_address_runs", real)
    with pytest.raises(AssertionError):
        _same(got, core.runs_access(t, boxes))


@pytest.mark.parametrize("seed", range(3))
def test_blocked_tile_maps_equal_the_general_path(seed):
    """``layout.set_tile_boxes`` with the tensor's grid maps it as without (disjoint boxes inside
    blocks, on random local tiles)."""
    rng = np.random.default_rng(200 + seed)
    for _ in range(20):
        shape = [int(n) for n in rng.integers(1, 9, rng.integers(1, 5))]
        edges = _random_edges(rng, shape)
        cells_lo, cells_sz = R.grid_cells(edges)
        # each cell cut in two along a random dim (disjoint boxes, all inside cells)
        lo, sz = [], []
        for c_lo, c_sz in zip(cells_lo, cells_sz):
            j = int(rng.integers(0, len(shape)))
            cut = int(rng.integers(0, c_sz[j] + 1))
            a, b = c_sz.copy(), c_sz.copy()
            a[j], b[j] = cut, c_sz[j] - cut
            lo += [c_lo, c_lo + np.eye(len(shape), dtype=np.int64)[j] * cut]
            sz += [a, b]
        lo, sz = np.array(lo, np.int64), np.array(sz, np.int64)
        tiles = rng.integers(0, 16, lo.shape[0])
        maps = []
        for grid in (edges, None):
            g = _graph()
            t = layout.blocked_tensor(g, poplar.FLOAT, edges, "p")
            layout.set_tile_boxes(g, t, lo, sz, tiles, edges=grid)
            maps.append(g.getTileMapping(t))
        assert maps[0] == maps[1]


def test_memo_hits_are_moved_to_the_callers_variable_and_tiles():
    """Identical blocked tensors (another variable, other tiles): the second is a memo hit, and
    equals the general path; a tensor of another grid is not taken for it."""
    from openipu.poplar import structure_cache as SC
    SC.MEMO.clear()
    rng = np.random.default_rng(9)
    g = _graph()
    edges = [np.array([0, 2, 5]), np.array([0, 4, 6])]
    boxes = _boxes_inside_cells(rng, edges, 20, 16)
    for i in range(3):
        t = layout.blocked_tensor(g, poplar.FLOAT, edges, f"w{i}")
        b = Boxes(boxes.lo, boxes.sz, rng.integers(0, 16, len(boxes)).astype(np.int64))
        hits = SC.MEMO.hits
        _same(core.blocked_runs_access(t, edges, b), core.runs_access(t, b))
        assert i == 0 or SC.MEMO.hits > hits
    other = [np.array([0, 3, 5]), np.array([0, 4, 6])]
    t = layout.blocked_tensor(g, poplar.FLOAT, other, "o")
    inside = _boxes_inside_cells(rng, other, 20, 16)
    _same(core.blocked_runs_access(t, other, inside), core.runs_access(t, inside))
