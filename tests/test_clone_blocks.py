"""``Graph.clone_layout`` of a view of a blocked variable (issue 34): the closed form
(``TileMapping._clone_piece_rows``: the source variable's runs over each row of consecutive
addresses of the pieces, moved to the clone's place of that row) maps the clone exactly as the
general path (the view's tile boxes laid over the clone's pieces), on random grids, mappings and
views (slices, transposes, reversals, repeated blocks); views of too many rows take the general
path."""

import numpy as np
import pytest

from openipu import poplar
from openipu.poplar import graph_mapping as gm
from openipu.poplar.tensor import concat


def _graph(tiles=16):
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = tiles
    return poplar.Graph(m.createDevice().getTarget())


def _grid_cells(rng, shape):
    edges = [np.unique(np.r_[0, rng.integers(1, n, rng.integers(0, n)), n]) if n > 1 else np.array([0, n])
             for n in shape]
    cells = np.stack(np.meshgrid(*[np.arange(e.size - 1) for e in edges], indexing="ij"), -1).reshape(-1, len(shape))
    lo = np.stack([edges[d][cells[:, d]] for d in range(len(shape))], 1).astype(np.int64)
    hi = np.stack([edges[d][cells[:, d] + 1] for d in range(len(shape))], 1).astype(np.int64)
    order = rng.permutation(lo.shape[0])            # blocks stored in a random order
    return lo[order], (hi - lo)[order]


def _random_view(rng, t):
    shape = t.shape()
    for d in range(len(shape)):
        if shape[d] > 1 and rng.random() < 0.5:
            a = int(rng.integers(0, shape[d]))
            t = t.slice(a, int(rng.integers(a + 1, shape[d] + 1)), d)
    r = rng.random()
    if r < 0.25:
        t = t.dimShuffle([int(x) for x in rng.permutation(len(shape))])
    elif r < 0.4:
        t = t.reverse(int(rng.integers(0, len(shape))))          # strides < 0: the general path
    elif r < 0.55:
        d = int(rng.integers(0, len(shape)))
        t = concat([t, t.slice(0, 1, d)], d)                      # a block repeated
    return t


def _clone(g, view, fast, hits):
    saved = gm.TileMapping._clone_piece_rows

    def counted(self, src, out, order):
        ok = saved(self, src, out, order)
        hits.append(ok)
        return ok
    gm.TileMapping._clone_piece_rows = counted if fast else (lambda self, src, out, order: False)
    try:
        c = g.clone_layout(poplar.FLOAT, view, "c")
    finally:
        gm.TileMapping._clone_piece_rows = saved
    return c


@pytest.mark.parametrize("seed", range(3))
def test_clone_of_blocks_maps_as_the_general_path(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    hits = []
    for _ in range(40):
        g = _graph()
        g.setTileMapping(g.addVariable(poplar.FLOAT, [int(rng.integers(1, 40))], "before"), 0)
        shape = [int(x) for x in rng.integers(1, 12, int(rng.integers(2, 4)))]
        lo, sz = _grid_cells(rng, shape)
        w = g.add_blocks(poplar.FLOAT, shape, lo, sz, "w")
        n = int(np.prod(shape))
        cuts = np.unique(np.r_[0, rng.integers(0, n, int(rng.integers(1, 12))), n])
        tiles = rng.integers(-1, 16, cuts.size - 1)
        keep = tiles >= 0                                            # some elements left unmapped
        if keep.any():
            g.set_tile_runs(w, cuts[:-1][keep], cuts[1:][keep], tiles[keep])
        view = _random_view(rng, w)
        if not gm.blocked(view.pieces):
            continue
        monkeypatch.setattr(gm, "CLONE_ROWS_MAX", 4 if rng.random() < 0.2 else 1 << 16)
        a, b = _clone(g, view, True, hits), _clone(g, view, False, hits)
        for x, y in zip(g.tile_runs_of(a), g.tile_runs_of(b)):
            np.testing.assert_array_equal(x, y)
        va, vb = (g._state.variables[int(c.pieces.var[0])] for c in (a, b))
        np.testing.assert_array_equal(va.tile_starts, vb.tile_starts)
        np.testing.assert_array_equal(va.tile_ids, vb.tile_ids)
    assert sum(hits) >= 15 and not all(hits)       # both paths exercised


def test_views_of_many_rows_take_the_general_path(monkeypatch):
    g = _graph()
    lo, sz = np.array([[0, 0], [0, 4]], np.int64), np.array([[6, 4], [6, 4]], np.int64)
    w = g.add_blocks(poplar.FLOAT, [6, 8], lo, sz, "w")
    g.set_tile_runs(w, np.array([0, 20]), np.array([20, 48]), np.array([3, 5]))
    src = w.reverse(1)                                  # 6 rows of 1 element per piece: 48 rows
    out = g.add_blocks(poplar.FLOAT, [6, 8], lo, sz, "o")
    monkeypatch.setattr(gm, "CLONE_ROWS_MAX", 47)
    assert not g._clone_piece_rows(src, out, np.arange(2))
    monkeypatch.setattr(gm, "CLONE_ROWS_MAX", 48)
    assert g._clone_piece_rows(src, out, np.arange(2))
