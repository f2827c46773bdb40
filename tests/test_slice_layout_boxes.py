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
