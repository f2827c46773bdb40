"""popops' per-tile element counts of a view whose pieces each cover an interval of addresses
(``_common.interval_tile_counts``, issue 34) against the general count from the view's tile
boxes (``Graph.tile_element_counts``) on random views and mappings; other views take the
general path."""

import numpy as np
import pytest

from openipu import poplar
from openipu.poplar.tensor import concat
from openipu.poplibs.popops import _common as C


def _graph(tiles=16):
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = tiles
    return poplar.Graph(m.createDevice().getTarget())


def _map_randomly(rng, g, t):
    n = t.numElements()
    cuts = np.unique(np.r_[0, rng.integers(0, n, int(rng.integers(1, 10))), n])
    tiles = rng.integers(-1, 16, cuts.size - 1)
    keep = tiles >= 0
    if keep.any():
        g.set_tile_runs(t, cuts[:-1][keep], cuts[1:][keep], tiles[keep])


def _random_view(rng, g):
    shape = [int(x) for x in rng.integers(1, 7, int(rng.integers(1, 4)))]
    if rng.random() < 0.5 and len(shape) > 1:
        edges = [np.unique(np.r_[0, rng.integers(1, s, 2), s]) if s > 1 else np.array([0, s]) for s in shape]
        cells = np.stack(np.meshgrid(*[np.arange(e.size - 1) for e in edges], indexing="ij"), -1).reshape(-1, len(shape))
        lo = np.stack([edges[d][cells[:, d]] for d in range(len(shape))], 1).astype(np.int64)
        hi = np.stack([edges[d][cells[:, d] + 1] for d in range(len(shape))], 1).astype(np.int64)
        v = g.add_blocks(poplar.FLOAT, shape, lo, hi - lo, "blocks")
    else:
        v = g.addVariable(poplar.FLOAT, shape, "v")
    _map_randomly(rng, g, v)
    t = v
    r = rng.random()
    if r < 0.2 and t.dim(0) > 1:
        t = t.slice(1, t.dim(0), 0)
    elif r < 0.4 and t.rank() > 1:
        t = t.dimShuffle([int(x) for x in rng.permutation(t.rank())])
    elif r < 0.5:
        t = t.reverse(0)
    elif r < 0.6:
        t = concat([t, t.slice(0, 1, 0)], 0)                     # a repeated row: overlapping pieces
    elif r < 0.7 and t.rank() > 1:
        t = t.slice(0, 1, t.rank() - 1)                          # strided
    elif r < 0.75:
        t = t.reshape([t.numElements()]).expand([0]).broadcast(2, 0)
    return t


@pytest.mark.parametrize("seed", range(3))
def test_interval_counts_equal_the_general_counts(seed):
    rng = np.random.default_rng(seed)
    hits = misses = 0
    for _ in range(80):
        g = _graph()
        g.setTileMapping(g.addVariable(poplar.FLOAT, [int(rng.integers(1, 20))], "before"), 0)
        t = _random_view(rng, g)
        got = C.interval_tile_counts(g, t)
        want = g.tile_element_counts(t).astype(np.int64)
        if got is None:
            misses += 1
        else:
            hits += 1
            np.testing.assert_array_equal(got, want)
        used, counts = C.tile_counts_of(g, t)
        np.testing.assert_array_equal(used, np.flatnonzero(want))
        np.testing.assert_array_equal(counts, want[used])
    assert hits >= 30 and misses >= 5


@pytest.mark.parametrize("seed", range(2))
def test_poplin_laid_out_answers_as_with_the_general_counts(seed, monkeypatch):
    """poplin's test whether an operand already has the plan's layout counts elements per tile
    from the runs when it can: the same answers as with the counts from the view's tile boxes."""
    from openipu.poplar.exchange import tile_boxes
    from openipu.poplibs.poplin import core
    rng = np.random.default_rng(10 + seed)
    answers = []
    for _ in range(60):
        g = _graph()
        t = _random_view(rng, g)
        tb = tile_boxes(t)
        keep = tb.tile >= 0
        lo, sz, tiles = tb.lo[keep], tb.sz[keep], tb.tile[keep].copy()
        if tiles.size and rng.random() < 0.4:
            tiles[int(rng.integers(0, tiles.size))] = int(rng.integers(0, 16))     # maybe another tile
        fast = core._laid_out(g, t, lo, sz, tiles)
        with monkeypatch.context() as m:
            m.setattr(core, "interval_tile_counts", lambda graph, t: None)
            general = core._laid_out(g, t, lo, sz, tiles)
        assert fast == general
        answers.append(fast)
    assert True in answers and False in answers
