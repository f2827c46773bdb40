"""The structural memo of exchange geometry (poplar/structure_cache.py) returns what the
computation returns: translated onto the caller's variables on a hit, recomputed when a tile
mapping changes, and a compiled model predicts the same cycles and memory with it on or off."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from openipu import poplar, runner
from openipu.poplar import exchange as X
from openipu.poplar import exchange_moves as XM
from openipu.poplar import structure_cache as SC


def _graph():
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = 8
    return poplar.Graph(m.createDevice().getTarget())


def _uncached(monkeypatch, fn, *args):
    with monkeypatch.context() as m:
        m.setenv("OPENIPU_STRUCTURE_CACHE", "0")
        return fn(*args)


def _equal(a, b):
    if isinstance(a, X.Boxes):
        a, b = (a.lo, a.sz, a.tile), (b.lo, b.sz, b.tile)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def _pair(g, mapping_b):
    """Two [6, 10] variables with the same mapping pattern; a filler variable between them so
    that their addresses differ by more than their size."""
    a = g.addVariable(poplar.FLOAT, [6, 10], "a")
    g.addVariable(poplar.FLOAT, [7], "filler")
    b = g.addVariable(poplar.FLOAT, [6, 10], "b")
    tiles = np.repeat(np.arange(6) % 4, 10)
    g.setTileMapping(a, tiles)
    g.setTileMapping(b, mapping_b(tiles))
    return a, b


def test_scalar_views_read_by_different_box_counts_do_not_share_a_key(monkeypatch):
    """A scalar's boxes are ``[k, 0]`` arrays with no bytes: the key holds their shapes, so a
    read by one tile does not reuse the lattices of a read by two (it did: an IndexError in the
    next replicated-graph copy of a scalar)."""
    monkeypatch.setenv("OPENIPU_STRUCTURE_CACHE", "1")
    SC.MEMO.clear()
    g = _graph()
    v = g.addVariable(poplar.UNSIGNED_INT, [], "v")
    g.setTileMapping(v, 1)
    for k in (2, 1):
        z = np.zeros((k, 0), np.int64)
        boxes = X.Boxes(z, z, np.arange(k))
        _equal(X.lattices(v, boxes), _uncached(monkeypatch, X.lattices, v, boxes))


def test_a_hit_is_translated_onto_the_callers_variables(monkeypatch):
    monkeypatch.setenv("OPENIPU_STRUCTURE_CACHE", "1")
    SC.MEMO.clear()
    g = _graph()
    a, b = _pair(g, lambda t: t)
    boxes = X.Boxes(np.array([[0, 0], [2, 3]]), np.array([[3, 10], [4, 5]]), np.array([5, 6]))
    views = [t.transpose().slice(1, 9, 0) for t in (a, b)]
    for v in views:
        _equal(X.tile_boxes(v), _uncached(monkeypatch, X.tile_boxes, v))
        _equal(X.lattices(v, boxes), _uncached(monkeypatch, X.lattices, v, boxes))
        tr = X.RegionTransfer(v, X.Boxes(boxes.lo[:, ::-1].copy(), boxes.sz[:, ::-1].copy(), boxes.tile))
        _equal(XM.transfer_pairs(tr), _uncached(monkeypatch, XM.transfer_pairs, tr))
    assert SC.MEMO.hits >= 3                       # b's geometry came from a's
    assert X.lattices(views[1], boxes)[1].tolist() != X.lattices(views[0], boxes)[1].tolist()


def test_a_different_mapping_is_recomputed(monkeypatch):
    monkeypatch.setenv("OPENIPU_STRUCTURE_CACHE", "1")
    SC.MEMO.clear()
    g = _graph()
    a, b = _pair(g, lambda t: (t + 1) % 8)
    ta, tb = X.tile_boxes(a), X.tile_boxes(b)
    _equal(tb, _uncached(monkeypatch, X.tile_boxes, b))
    assert not np.array_equal(ta.tile, tb.tile)
    g.setTileMapping(a, 7)                         # a mapping changed after its geometry was memoised
    np.testing.assert_array_equal(X.tile_boxes(a).tile, [7])


def _mlp(path, layers=3, width=64):
    nodes, inits, x = [], [], "x"
    rng = np.random.default_rng(0)
    for i in range(layers):
        w = helper.make_tensor(f"w{i}", TensorProto.FLOAT, [width, width],
                               rng.standard_normal(width * width).astype(np.float32))
        inits.append(w)
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16, width])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, 16, width])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_identical_layers_predict_the_same_with_the_memo_off(tmp_path, monkeypatch, precision):
    path = str(tmp_path / "mlp.onnx")
    _mlp(path)
    got = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("OPENIPU_STRUCTURE_CACHE", mode)
        SC.MEMO.clear()
        r = runner.run_model(path, offline=True, precision=precision)
        got[mode] = (r.step_cycles, r.tile_bytes_max, r.tile_bytes_mean)
        if mode == "1":
            assert SC.MEMO.hits > 0
    assert got["0"] == got["1"]


def test_blocked_constant_values_land_block_by_block():
    """poplin's blocked layout stores a constant's blocks one after the other, each row-major:
    the vectorised placement equals copying block by block, whatever the block order."""
    import math

    from openipu.poplar import regions as R
    from openipu.poplibs.poplin import layout

    rng = np.random.default_rng(1)
    for _ in range(100):
        shape = rng.integers(1, 9, rng.integers(1, 5))
        edges = [np.r_[0:n:rng.integers(1, n + 1), n] for n in shape]
        lo, sz = R.grid_cells(edges)
        if rng.random() < 0.5:
            order = rng.permutation(lo.shape[0])
            lo, sz = lo[order], sz[order]
        value = rng.standard_normal(shape)
        ref, a = np.empty(value.size), 0
        for c_lo, c_sz in zip(lo.tolist(), sz.tolist()):
            n = math.prod(c_sz)
            ref[a:a + n] = value[tuple(slice(x, x + y) for x, y in zip(c_lo, c_sz))].reshape(-1)
            a += n
        got = np.empty(value.size)
        got[layout._block_order(edges, lo, sz)] = value.reshape(-1)
        np.testing.assert_array_equal(got, ref)


def test_sorted_lattices_of_one_stride_pattern_match_the_row_by_row_sort():
    """The shortcut for views whose pieces share one stride pattern sorts as the general path."""
    from openipu.poplar import regions as R

    rng = np.random.default_rng(0)
    for _ in range(300):
        k, d = int(rng.integers(2, 6)), int(rng.integers(1, 5))
        st = np.tile(rng.choice([-8, -1, 0, 1, 2, 4, 8, 16], d), (k, 1))
        sz = np.tile(rng.integers(1, 4, d), (k, 1))
        sz[0] = np.maximum(sz[0], 1)
        addr = rng.integers(0, 100, k)
        fast = R.sorted_lattices(addr, sz, st)
        # the same rows with a sentinel row of another pattern take the general path
        sz2 = np.vstack([sz, np.full((1, d), 2)])
        st2 = np.vstack([st, np.arange(1, d + 1)[::-1] * 97])
        slow = R.sorted_lattices(np.r_[addr, 0], sz2, st2)
        for a, b in zip(fast, slow):
            np.testing.assert_array_equal(a, b[:k])


def _key_of_bytes(view, with_runs, extra=()):
    """view_key as it was built before the mapping tokens and the per-pieces cache: the full
    mapping bytes of each variable (the reference the short keys must agree with)."""
    p = view.pieces
    variables = view._state.variables
    uv, inv = np.unique(p.var, return_inverse=True)
    inv = inv.reshape(-1)
    starts = np.array([variables[v].start for v in uv.tolist()], np.int64)
    parts = [np.int64(view.rank()).tobytes()]
    parts += SC.array_bytes(inv, p.addr - starts[inv], p.lo, p.sz, np.broadcast_to(p.st, p.sz.shape), *extra)
    if with_runs:
        space = view._state.space(view._type)
        parts += [SC.mapping_bytes(space.vars[variables[v].space_index]) for v in uv.tolist()]
    return b"".join(parts)


def test_short_keys_are_equal_exactly_when_the_full_keys_are():
    """Mapping tokens and the per-pieces cache change how a key is spelled, not which views share
    one: over random views of variables with random mappings (some alike), two views' keys are
    equal exactly when their full-byte keys are, also when a mapping changes after a key was made
    and after the token table and the pieces cache are emptied."""
    rng = np.random.default_rng(7)
    g = _graph()
    vs = []
    for i in range(6):
        v = g.addVariable(poplar.FLOAT, [4, 6], f"v{i}")
        g.setTileMapping(v, np.repeat(rng.integers(0, 3, 4) if i % 2 else np.arange(4) % 3, 6))
        vs.append(v)
    views = []
    for v in vs:
        views += [v, v[1:3], v.transpose(), v.slice(2, 5, 1), v.reshape([6, 4])[::2]]
    views += [poplar.concat([vs[0], vs[1]]), poplar.concat([vs[2], vs[3]]), poplar.concat([vs[4], vs[5]])]

    def check():
        short = [SC.view_key(b"t", w, True)[0] for w in views]
        full = [_key_of_bytes(w, True) for w in views]
        for i in range(len(views)):
            for j in range(len(views)):
                assert (short[i] == short[j]) == (full[i] == full[j]), (i, j)
        assert len(set(short)) < len(views)          # some share a key
        # the pieces cache returns what a fresh key is
        SC.clear_pieces_keys()
        assert [SC.view_key(b"t", w, True)[0] for w in views] == short
        return short

    before = check()
    g.setTileMapping(vs[0], 2)                        # a mapping change after the keys were made
    after = check()
    assert before[0] != after[0] and before[5] == after[5]   # vs[0] changed, vs[1] did not
    SC._INTERNED.ids.clear()                          # the token table emptied: new numbers, no reuse
    SC._INTERNED.nbytes = 0
    for v in vs:
        v_space = g._state.space(v._type).vars[g._state.variables[v.pieces.row[0]].space_index]
        v_space.__dict__.pop("_mapping_token", None)
    again = check()
    assert not set(again) & set(before + after)


def test_the_targets_key_is_its_repr_and_kept_only_for_frozen_targets():
    from dataclasses import dataclass

    from openipu import ipu
    from openipu.poplar import cost as C

    t = ipu.target("ipu2")
    assert C._spec_key(t) == repr(t).encode() and C._spec_key(t) is C._spec_key(t)

    @dataclass
    class Mutable:
        tiles: int

    m = Mutable(4)
    assert C._spec_key(m) == repr(m).encode()
    m.tiles = 8                                     # a mutable target's key follows its fields
    assert C._spec_key(m) == repr(Mutable(8)).encode()
