"""multiSlice's two-stage buffers: the closed-form boxes of a variable laid out column by column
and mapped by column runs (``_Cols.column_boxes``, issue 34) against the general path (its tile
boxes cut at the runs, ``_Cols.boxes``) on random runs, and a mutation is caught."""

import numpy as np

from openipu import poplar
from openipu.poplibs.popops._slice_layout import _by_columns, _Cols


def _graph(tiles=16):
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = tiles
    return poplar.Graph(m.createDevice().getTarget())


def _random_runs(rng, cols, tiles):
    cuts = np.unique(np.r_[0, rng.integers(1, cols, rng.integers(0, cols)), cols]) if cols > 1 else np.array([0, cols])
    tl = rng.integers(0, tiles, cuts.size - 1)
    for i in range(1, tl.size):          # adjacent runs on different tiles (as _column_runs gives them)
        while tl[i] == tl[i - 1]:
            tl[i] = rng.integers(0, tiles)
    return _Cols(cuts[:-1].astype(np.int64), cuts[1:].astype(np.int64), tl.astype(np.int64), cols)


def _same(a, b):
    for f in ("lo", "sz", "tile"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))


def test_column_boxes_equal_the_cut_tile_boxes():
    rng = np.random.default_rng(5)
    for _ in range(150):
        g = _graph()
        cols, rows = int(rng.integers(1, 40)), int(rng.integers(0, 9))
        runs = _random_runs(rng, cols, 16)
        if rng.random() < 0.1:
            runs = _Cols(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), cols)
        b = _by_columns(g, poplar.FLOAT, [rows, cols], [0], "buf", runs)
        _same(runs.column_boxes(b, rows), runs.boxes(b))


def test_a_mutated_column_box_is_caught():
    rng = np.random.default_rng(6)
    g = _graph()
    runs = _random_runs(rng, 30, 16)
    b = _by_columns(g, poplar.FLOAT, [4, 30], [0], "buf", runs)
    got = runs.column_boxes(b, 4)
    got.sz[0, 0] -= 1
    try:
        _same(got, runs.boxes(b))
    except AssertionError:
        return
    raise AssertionError("a changed box was not seen")


def _column_major_table(rng, g, R, cols, tiles):
    """A table ``[R, cols]`` stored column by column, each column's rows cut at random partition
    boundaries (the same for all columns) and each segment on a random tile (neighbours in memory
    sometimes on the same tile, so some runs span two columns)."""
    var = g.addVariable(poplar.FLOAT, [cols, R], "table")
    cuts = np.unique(np.r_[0, rng.integers(1, R, rng.integers(0, 4)), R]) if R > 1 else np.array([0, R])
    b = (np.arange(cols)[:, None] * R + cuts[None, :-1]).reshape(-1)
    e = (np.arange(cols)[:, None] * R + cuts[None, 1:]).reshape(-1)
    tl = rng.integers(0, tiles if rng.random() < 0.8 else 2, b.size)
    if rng.random() < 0.15:
        tl[rng.integers(0, tl.size)] = -1                     # a segment left unmapped
    keep = tl >= 0
    g.set_tile_runs(var.flatten(), b[keep], e[keep], tl[keep])
    return var.dimShuffle([1, 0]), cuts


def test_column_tile_boxes_equal_the_general_tile_boxes():
    from openipu.poplar.exchange import tile_boxes
    from openipu.poplibs.popops._slice_layout import _column_tile_boxes
    rng = np.random.default_rng(7)
    hits = misses = 0
    for _ in range(150):
        g = _graph()
        g.setTileMapping(g.addVariable(poplar.FLOAT, [int(rng.integers(1, 30))], "before"), 0)
        R, cols = int(rng.integers(1, 30)), int(rng.integers(1, 20))
        table, cuts = _column_major_table(rng, g, R, cols, 16)
        if rng.random() < 0.7:                        # a row partition, as multiSlice reads it
            k = int(rng.integers(0, cuts.size - 1))
            r0, r1 = int(cuts[k]), int(cuts[k + 1])
        else:                                         # any row range (may cross partitions)
            r0 = int(rng.integers(0, R))
            r1 = int(rng.integers(r0 + 1, R + 1))
        view = table.slice(r0, r1, 0)
        if rng.random() < 0.2 and cols > 2:
            view = view.slice(1, cols, 1)
        got = _column_tile_boxes(view)
        if got is None:
            misses += 1
            continue
        hits += 1
        _same(got, tile_boxes(view))
    assert hits >= 40 and misses >= 10


def test_column_tile_boxes_refuse_other_forms():
    from openipu.poplibs.popops._slice_layout import _column_tile_boxes
    g = _graph()
    t = g.addVariable(poplar.FLOAT, [6, 5], "rowmajor")
    g.setTileMapping(t, 1)
    assert _column_tile_boxes(t) is None                  # strides (5, 1): not column by column
    assert _column_tile_boxes(t.reshape([30])) is None    # rank 1
    c = g.addVariable(poplar.FLOAT, [5, 6], "colmajor")
    g.setTileMapping(c, 2)                                # one run holds every column
    assert _column_tile_boxes(c.dimShuffle([1, 0])) is None
