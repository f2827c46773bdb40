"""popops reduce: the first stage's element destinations, planned by structure (sub-boxes of the
input's tile boxes), against the per-piece construction they replaced (rows of boxes, sorted),
kept here as the reference. The kernel is unchanged, so equal chunks mean equal results bit for
bit; results are also checked against numpy."""

import importlib

import numpy as np
import pytest

from libharness import OpHarness
from openipu.poplibs import popops

red = importlib.import_module("openipu.poplibs.popops.reduce")
Op = popops.Operation


def _reference_first_index(boxes, shape, level, num_tiles, chunk):
    """The construction before the structural one: one piece per row of each box, sorted into
    the view's flat order, per-piece searches and a ``np.unique`` per chunk."""
    M, N = shape
    k, row = red._enumerate_ranges(boxes.lo[:, 0], boxes.sz[:, 0])
    order = np.argsort(row * N + boxes.lo[k, 1], kind="stable")
    k, row = k[order], row[order]
    tile, width = boxes.tile[k], boxes.sz[k, 1]
    key = level.cls * num_tiles + level.tiles if level is not None else None
    rows = max(1, chunk // max(N, 1))
    for m0 in range(0, M, rows):
        m1 = min(M, m0 + rows)
        a, z = np.searchsorted(row, [m0, m1])
        r, t, n = row[a:z], tile[a:z], width[a:z]
        if level is None:
            dest = r
        else:
            c = np.searchsorted(level.m0, r, side="right") - 1
            dest = level.position(np.searchsorted(key, c * num_tiles + t), r - level.m0[c])
        if m0 == 0 and m1 == M:
            yield 0, M * N, np.repeat(dest, n), None
            continue
        uniq, inv = np.unique(dest, return_inverse=True)
        yield m0 * N, m1 * N, np.repeat(inv.reshape(-1), n), uniq


def _check(monkeypatch, shape, dims, mapping, tiles, chunk, op=Op.ADD, seed=0):
    calls = []
    real = red._first_index

    def spy(boxes, shp, level, num_tiles):
        calls.append((boxes, shp, level, num_tiles))
        return real(boxes, shp, level, num_tiles)

    finals = []
    real_final = red._final_destinations

    def spy_final(L):
        finals.append(L)
        return real_final(L)

    monkeypatch.setattr(red, "_first_index", spy)
    monkeypatch.setattr(red, "_final_destinations", spy_final)
    monkeypatch.setattr(red, "KERNEL_CHUNK", chunk)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    h = OpHarness(tiles, seed=seed)
    a = h.input("a", x, mapping=mapping)
    out = popops.reduce(h.graph, a, dims, op, h.prog)
    r = h.run(out=out)["out"]
    np.testing.assert_allclose(r, x.astype(np.float64).sum(axis=tuple(dims)) if op == Op.ADD
                               else x.max(axis=tuple(dims)), rtol=1e-5, atol=1e-5)
    assert calls
    levels = 0
    for boxes, shp, level, num_tiles in calls:
        levels += level is not None
        got = list(real(boxes, shp, level, num_tiles))
        want = list(_reference_first_index(boxes, shp, level, num_tiles, chunk))
        assert len(got) == len(want)
        for (b, e, i, d), (b2, e2, i2, d2) in zip(got, want):
            assert (b, e) == (b2, e2)
            np.testing.assert_array_equal(i, i2)
            assert (d is None) == (d2 is None)
            if d is not None:
                np.testing.assert_array_equal(d, d2)
    for L in finals:
        pos, q, i = L.enumerate()
        want = np.empty(L.total, np.int64)
        want[pos] = L.m0[L.cls[q]] + i * L.stride[L.cls[q]]
        np.testing.assert_array_equal(real_final(L), want)
    return levels, calls


@pytest.mark.parametrize("mapping", ["linear", "random", "blocks", "tile0"])
@pytest.mark.parametrize("shape,dims", [((2, 12, 40), [0]), ((3, 50), [1]), ((6, 7, 9), [0, 2]),
                                         ((4, 5, 6), [1]), ((64, 3), [0])])
@pytest.mark.parametrize("chunk", [1 << 22, 37])
def test_first_index_equals_reference(monkeypatch, mapping, shape, dims, chunk):
    _check(monkeypatch, shape, dims, mapping, 16, chunk)


@pytest.mark.parametrize("chunk", [1 << 22, 100])
def test_first_index_with_intermediate_stage(monkeypatch, chunk):
    # each output's inputs spread over more than MAX_FANIN tiles: the level-1 partials are laid
    # out by the intermediate stage's period (not in order)
    levels, calls = _check(monkeypatch, (3, 4 * red.MAX_FANIN), [1], "random", 200, chunk)
    assert levels and any(not c[2].in_order for c in calls if c[2] is not None)


def test_first_index_batch_axis_is_structural(monkeypatch):
    """The batch-axis reduce of a linear weight gradient ([batch, rows, cols] over batch): every
    box of the [M, N] view is one column wide, so the old construction had one piece per element;
    the structural one cuts only the boxes (here split where a tile's run crosses a class)."""
    levels, calls = _check(monkeypatch, (2, 96, 64), [0], "linear", 64, 1 << 22)
    boxes, shp, level, _ = calls[0]
    assert level is not None and shp == [96 * 64, 2]
    assert (boxes.sz[:, 1] == 1).all() and boxes.tile.size < 96 * 64 * 2 // 32
