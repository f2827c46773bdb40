"""Regions, the structural tensor representation: pieces, range boxes, address runs and
run-length tile maps, each checked against a per-element numpy reference."""

import numpy as np
from hypothesis import given, settings, strategies as st

from openipu import poplar
from openipu.poplar import regions as R
from openipu.poplar import tilemap


def _graph():
    return poplar.Graph(poplar.IPUModel("ipu2").createDevice().getTarget())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_range_boxes_cover_exactly_the_range(radices, data):
    n = int(np.prod(radices))
    u = data.draw(st.integers(0, n))
    v = data.draw(st.integers(u, n))
    owner, lo, sz = R.range_boxes(np.array([u]), np.array([v]), radices)
    grid = np.arange(n).reshape(radices)
    got = []
    for k in range(owner.size):
        box = tuple(slice(a, a + b) for a, b in zip(lo[k], sz[k]))
        got.extend(grid[box].reshape(-1).tolist())
    assert got == list(range(u, v))                  # in flat order, no overlap
    assert owner.size <= max(0, 2 * len(radices) - 1)


def _view_chain(data, shape):
    """A random chain of views with its numpy reference over an arange variable."""
    ref = np.arange(int(np.prod(shape))).reshape(shape)
    ops = []
    for _ in range(data.draw(st.integers(1, 5))):
        kind = data.draw(st.sampled_from(["reverse", "slice", "perm", "sub", "reshape", "bcast", "expand", "concat"]))
        if ref.ndim == 0 or ref.size == 0:
            break
        d = data.draw(st.integers(0, ref.ndim - 1))
        n = ref.shape[d]
        if kind == "reverse":
            ops.append(lambda t, d=d: t.reverse(d)); ref = np.flip(ref, d)
        elif kind == "slice":
            b = data.draw(st.integers(0, n - 1)); e = data.draw(st.integers(b + 1, n))
            ops.append(lambda t, d=d, b=b, e=e: t.slice(b, e, d)); ref = np.take(ref, range(b, e), d)
        elif kind == "perm":
            perm = data.draw(st.permutations(range(ref.ndim)))
            ops.append(lambda t, p=perm: t.dimShuffle(p)); ref = ref.transpose(perm)
        elif kind == "sub":
            s = data.draw(st.integers(1, 3))
            ops.append(lambda t, d=d, s=s: t.subSample(s, d)); ref = np.take(ref, range(0, n, s), d)
        elif kind == "reshape":
            size = ref.size
            dims, rest = [], size
            for f in (2, 3, 5):
                while rest % f == 0 and data.draw(st.booleans()):
                    dims.append(f); rest //= f
            dims.append(rest)
            dims = data.draw(st.permutations(dims))
            if data.draw(st.booleans()):
                dims = list(dims) + [1]
            ops.append(lambda t, s=list(dims): t.reshape(s)); ref = ref.reshape(dims)
        elif kind == "bcast":
            if ref.shape[d] == 1:
                ops.append(lambda t, d=d: t.broadcast(3, d)); ref = np.repeat(ref, 3, d)
            else:
                ops.append(lambda t, d=d: t.broadcast(2, d)); ref = np.concatenate([ref, ref], d)
        elif kind == "expand":
            ops.append(lambda t, d=d: t.expand([d])); ref = np.expand_dims(ref, d)
        else:
            ops.append(lambda t, d=d: poplar.concat([t, t.reverse(d)], d)); ref = np.concatenate([ref, np.flip(ref, d)], d)
    return ops, ref


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_view_chains_match_numpy_addresses(shape, data):
    g = _graph()
    g.addVariable(poplar.FLOAT, [7], "before")                # the variable does not start at 0
    v = g.addVariable(poplar.FLOAT, shape, "v")
    base = int(v.flat_addresses()[0])
    ops, ref = _view_chain(data, shape)
    t = v
    for op in ops:
        t = op(t)
    assert t.shape() == list(ref.shape)
    np.testing.assert_array_equal(t.addresses(), ref + base)
    # the address runs of the pieces cover each piece's addresses (as a set)
    p = t.pieces
    owner, start, length = R.address_runs(p.addr, p.sz, p.st)
    got = np.sort(np.concatenate([np.arange(s, s + n) for s, n in zip(start, length)])) if owner.size else np.zeros(0)
    assert set(got.tolist()) == set((ref + base).reshape(-1).tolist())
    if np.unique(ref).size == ref.size:
        assert got.size == np.unique(got).size                # without aliases, runs never overlap
    # the address-array constructor gives the same view
    u = poplar.Tensor(v._state, v._type, ref + base)
    np.testing.assert_array_equal(u.addresses(), ref + base)
    assert t.containsAliases() == (np.unique(ref).size != ref.size)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_two_views_intersect_exactly_when_they_share_an_address(shape, data):
    # slices of two view chains of one variable: the region test agrees with the address sets
    g = _graph()
    v = g.addVariable(poplar.FLOAT, shape, "v")
    base = int(v.flat_addresses()[0])
    views = []
    for _ in range(2):
        ops, ref = _view_chain(data, shape)
        t = v
        for op in ops:
            t = op(t)
        if ref.ndim and ref.size:
            d = data.draw(st.integers(0, ref.ndim - 1))
            b = data.draw(st.integers(0, ref.shape[d] - 1))
            e = data.draw(st.integers(b + 1, ref.shape[d]))
            t, ref = t.slice(b, e, d), np.take(ref, range(b, e), d)
        views.append((t, ref + base))
    (a, ra), (b_, rb) = views
    assert a.intersectsWith(b_) == (np.intersect1d(ra, rb).size > 0)
    assert a.containsAliases() == (np.unique(ra).size != ra.size)


def test_a_view_whose_strides_fold_onto_themselves_contains_aliases():
    g = _graph()
    v = g.addVariable(poplar.FLOAT, [8], "v")
    a0 = int(v.flat_addresses()[0])
    folded = poplar.Tensor(v._state, v._type, a0 + np.array([[0, 1], [1, 2]]))   # strides (1, 1)
    assert folded.containsAliases()
    assert poplar.concat([folded, v.slice(4, 8).reshape([2, 2])], 0).containsAliases()
    assert not poplar.concat([v.slice(0, 4).reshape([2, 2]).transpose(), v.slice(4, 8).reshape([2, 2])], 0).containsAliases()


def test_transposed_reshape_splits_only_outer_dims():
    g = _graph()
    v = g.addVariable(poplar.HALF, [40, 384, 12, 64], "x")
    t = v.dimShuffle([0, 2, 1, 3]).reshape([40 * 12, 384, 64])
    assert len(t.pieces) == 40                                 # one piece per batch, not per element
    np.testing.assert_array_equal(t.addresses(), v.addresses().transpose(0, 2, 1, 3).reshape(480, 384, 64))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.data())
def test_tilemap_assign_matches_per_element(n, data):
    ref = np.full(n, -1)
    starts, tiles = tilemap.unmapped()
    for _ in range(data.draw(st.integers(1, 6))):
        k = data.draw(st.integers(1, 4))
        b = np.array(data.draw(st.lists(st.integers(0, n), min_size=k, max_size=k)))
        e = np.minimum(b + np.array(data.draw(st.lists(st.integers(0, 10), min_size=k, max_size=k))), n)
        t = np.array(data.draw(st.lists(st.integers(0, 3), min_size=k, max_size=k)))
        for bb, ee, tt in zip(b, e, t):
            ref[bb:ee] = tt
        starts, tiles = tilemap.assign(starts, tiles, n, b, e, t)
        assert starts[0] == 0 and np.all(np.diff(starts) > 0) and np.all(tiles[1:] != tiles[:-1])
        np.testing.assert_array_equal(tilemap.lookup(starts, tiles, np.arange(n)), ref)


def test_set_tile_mapping_of_views_is_run_length():
    g = _graph()
    v = g.addVariable(poplar.FLOAT, [300, 200], "v")
    g.setTileMapping(v.transpose(), 5)                          # a view's address set is contiguous
    var = g._state.variables[int(v.pieces.var[0])]
    assert var.tile_starts.tolist() == [0] and var.tile_ids.tolist() == [5]
    g.setTileMapping(v.slice(10, 20, 1), 7)                   # one run per row of the column slice
    assert var.tile_starts.size == 2 * 300 + 1
    ref = np.full((300, 200), 5)
    ref[:, 10:20] = 7
    np.testing.assert_array_equal(g.tile_of_elements(v).reshape(300, 200), ref)
    np.testing.assert_array_equal(g.tile_of_elements(v.transpose()), ref.T.reshape(-1))
    m = g.getTileMapping(v.transpose())
    assert [(iv.begin(), iv.end()) for iv in m[7]] == [(3000, 6000)]   # rows 10..19 of the transpose


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_piece_indexes_find_the_same_intersections_as_all_pairs(data):
    g = _graph()
    rows = data.draw(st.lists(st.integers(1, 4), min_size=2, max_size=6))
    width = data.draw(st.integers(4, 12))
    regular = data.draw(st.booleans())          # a grid of pieces, or cuts that differ by row
    cut = sorted(set(data.draw(st.lists(st.integers(1, width - 1), min_size=1, max_size=5))))
    grid_rows = []
    for r in rows:
        if not regular:
            cut = sorted(set(data.draw(st.lists(st.integers(1, width - 1), min_size=1, max_size=5))))
        edges = [0] + cut + [width]
        grid_rows.append(poplar.concat([g.addVariable(poplar.FLOAT, [r, b - a], "p")
                                        for a, b in zip(edges[:-1], edges[1:])], 1))
    grid = poplar.concat(grid_rows, 0)
    if data.draw(st.booleans()):
        grid = grid.transpose()
    shape = grid.shape()
    k = data.draw(st.integers(1, 12))
    lo = np.array([[data.draw(st.integers(0, s - 1)) for s in shape] for _ in range(k)])
    sz = np.array([[data.draw(st.integers(0, s - a)) for a, s in zip(r, shape)] for r in lo])
    boxes = X.Boxes(lo, sz, np.zeros(k, np.int64))
    old, grid_of = X.SLAB_MIN_PIECES, X._GridIndex.of
    try:
        X.SLAB_MIN_PIECES = 0
        if data.draw(st.booleans()):
            X._GridIndex.of = staticmethod(lambda p: None)       # the slab index
        slab = X.lattices(grid, boxes)
        X.SLAB_MIN_PIECES = 1 << 30
        ref = X.lattices(grid, boxes)
    finally:
        X.SLAB_MIN_PIECES, X._GridIndex.of = old, grid_of

    def rows_of(res):
        bi, var, base, T, n, el = res
        return sorted(zip(bi.tolist(), var.tolist(), base.tolist(), map(tuple, T.tolist()), map(tuple, n.tolist()),
                          el.tolist()))
    assert rows_of(slab) == rows_of(ref)


def test_clone_preserves_the_memory_order_of_a_transposed_view():
    g = _graph()
    v = g.addVariable(poplar.FLOAT, [200, 300], "v")           # each tile holds rows of v:
    g.setTileMapping(v, [[(0, 20000)], [(20000, 60000)]])    # columns of the transpose
    src = v.transpose()
    ref = g.tile_of_elements(src)
    c = g.clone(src, "c")
    assert c.shape() == [300, 200]
    np.testing.assert_array_equal(g.tile_of_elements(c), ref)
    var = g._state.variables[int(c.pieces.var[0])]
    assert var.tile_ids.tolist() == [0, 1]                     # stored in v's order: 2 runs, not 300
    assert g.clone(src, "c2", poplar.TensorCloneMethod.CREATE_NEW_ORDER).isContiguous()
    b = g.clone(v.slice(0, 1, 0).broadcast(7, 0))             # aliases: a new (natural) order
    assert b.isContiguous() and b.shape() == [7, 300]
    h = g.clone(poplar.HALF, src, "h")
    assert h.elementType() == poplar.HALF
    np.testing.assert_array_equal(g.tile_of_elements(h), ref)


# ----------------------------------------------------------------------------------------------
# structural exchange volumes against the per-element model
# ----------------------------------------------------------------------------------------------
from openipu.poplar import cost as costmod  # noqa: E402
from openipu.poplar import exchange as X  # noqa: E402
from openipu.poplar import exchange_moves as XM  # noqa: E402


def _spec(g):
    return g._top._target.spec


def _volumes(spec, transfers):
    structural = costmod.exchange_volume(spec, transfers)
    reference = costmod.exchange_volume(spec, [e for tr in transfers for e in costmod._elements_of(tr)])
    return structural, reference


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_tile_boxes_partition_the_view_by_tile(shape, data):
    g = _graph()
    v = g.addVariable(poplar.FLOAT, shape, "v")
    n = v.numElements()
    g.setTileMapping(v, np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))))
    ops, ref = _view_chain(data, shape)
    t = v
    for op in ops:
        t = op(t)
    b = X.tile_boxes(t)
    got = np.full(ref.shape, -9)
    for k in range(len(b)):
        box = tuple(slice(a, a + s) for a, s in zip(b.lo[k], b.sz[k]))
        assert (got[box] == -9).all()                          # boxes do not overlap
        got[box] = b.tile[k]
    np.testing.assert_array_equal(got.reshape(-1), g.tile_of_elements(t))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_tile_counts_match_per_element_tiles(shape, data):
    """Both paths of tile_counts (consecutive-address ranges, tile boxes) count as the per-element
    tiles do; a second variable, partly unmapped, sits beside the first in the space."""
    g = _graph()
    v = g.addVariable(poplar.FLOAT, shape, "v")
    w = g.addVariable(poplar.FLOAT, shape, "w")
    n = v.numElements()
    g.setTileMapping(v, np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))))
    g.setTileMapping(w.reshape([n]).slice(0, max(1, n // 2)), 2)
    ops, _ = _view_chain(data, shape)
    k = data.draw(st.integers(0, shape[0]))     # rows [0, k) from v, the rest from w
    t = v if k == shape[0] else w if k == 0 else poplar.concat([v.slice(0, k, 0), w.slice(k, shape[0], 0)], 0)
    for op in ops:
        t = op(t)
    tiles = g.tile_of_elements(t)
    want = np.bincount(tiles[tiles >= 0], minlength=4).astype(np.float64)
    np.testing.assert_array_equal(X.tile_counts(t, 4), want)

@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_region_exchange_matches_per_element_model(shape, data):
    g = _graph()
    g.addVariable(poplar.FLOAT, [5], "pad")
    v = g.addVariable(poplar.FLOAT, shape, "v")
    n = v.numElements()
    g.setTileMapping(v, np.array(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))))
    ops, ref = _view_chain(data, shape)
    t = v
    for op in ops:
        t = op(t)
    # consumers: the tile boxes of a same-shaped variable mapped at random, or explicit boxes
    c = g.addVariable(poplar.FLOAT, list(ref.shape), "c")
    m = c.numElements()
    g.setTileMapping(c, np.array(data.draw(st.lists(st.integers(0, 7), min_size=m, max_size=m))))
    boxes = X.tile_boxes(c)
    to_owner = data.draw(st.booleans()) and not t.containsAliases()   # writes never alias
    if not to_owner and data.draw(st.booleans()):                # multicast: every box read twice
        boxes = X.Boxes(np.concatenate([boxes.lo, boxes.lo]), np.concatenate([boxes.sz, boxes.sz]),
                        np.concatenate([boxes.tile, (boxes.tile + 3) % 8]))
    tr = X.RegionTransfer(t, boxes, to_owner=to_owner, count_send=data.draw(st.booleans()))
    s, r = _volumes(_spec(g), [tr])
    for f in ("recv_bytes", "send_bytes", "recv_msgs", "send_msgs", "global_bytes"):
        np.testing.assert_array_equal(getattr(s, f), getattr(r, f), err_msg=f)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_mapping_apis_on_any_view(shape, data):
    """setTileMapping by intervals, tile_runs_of and copy_tile_mapping on arbitrary views match a
    per-element reference."""
    g = _graph()
    v = g.addVariable(poplar.FLOAT, shape, "v")
    g.setTileMapping(v, 9)
    ops, ref = _view_chain(data, shape)
    t = v
    for op in ops:
        t = op(t)
    n = t.numElements()
    if n == 0 or t.containsAliases():
        return
    per = np.array(data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    g.setTileMapping(t, [[(i, i + 1) for i in np.flatnonzero(per == tl).tolist()] for tl in range(5)])
    np.testing.assert_array_equal(g.tile_of_elements(t), per)
    b, e, tl = g.tile_runs_of(t)
    np.testing.assert_array_equal(np.repeat(tl, e - b), per)
    c = g.addVariable(poplar.FLOAT, list(ref.shape), "c")
    g.copy_tile_mapping(c, t)
    np.testing.assert_array_equal(g.tile_of_elements(c), per)
    assert g.is_mapped(c)
    np.testing.assert_array_equal(g.tile_element_counts(t)[:5], np.bincount(per, minlength=5))


def test_a_strided_read_across_many_runs_is_costed_per_point(monkeypatch):
    """A transposed read of a weight mapped in column blocks: each lattice of the read steps over
    every run of the rows it crosses. The overlaps enumerated grow with the points read (one per
    point), not with runs x lattices, and the volumes stay those of the per-element model."""
    g = _graph()
    w = g.addVariable(poplar.FLOAT, [48, 48], "w")
    for t in range(8):                                          # columns in blocks of 6 per tile
        g.setTileMapping(w.slice(6 * t, 6 * t + 6, 1), t)
    wt = w.transpose()                                          # [48, 48], strides (1, 48)
    c = g.addVariable(poplar.FLOAT, [48, 48], "c")
    for t in range(8):                                          # the reader's boxes: 3 x 16 blocks
        for r in range(0, 48, 16):
            g.setTileMapping(c.slice([6 * t, r], [6 * t + 6, r + 16]), (t + 1 + r // 16) % 8)
    tr = X.RegionTransfer(wt, X.tile_boxes(c))
    seen = []
    overlaps = X._run_overlaps
    monkeypatch.setattr(X, "_run_overlaps", lambda *a, **k: seen.append(overlaps(*a, **k)) or seen[-1])
    monkeypatch.setenv("OPENIPU_STRUCTURE_CACHE", "0")          # computed, not a memo hit
    XM.transfer_pairs(tr)
    assert seen[0][0].size <= 48 * 48                           # at most one overlap per point read
    monkeypatch.undo()
    s, r = _volumes(_spec(g), [tr])
    for f in ("recv_bytes", "send_bytes", "recv_msgs", "send_msgs"):
        np.testing.assert_array_equal(getattr(s, f), getattr(r, f), err_msg=f)


def test_clone_of_a_transposed_blocked_view_keeps_its_memory_order():
    # a blocked tensor (two row blocks, each row-major; each block's rows split over two tiles)
    # seen transposed: the clone stores each block in the source's memory order, so its tile map
    # has the source's four runs, not one run per 50 elements; copying the mapping onto a
    # transposed view also works by runs, not by elements
    g = _graph()
    lo = np.array([[0, 0], [100, 0]])
    sz = np.array([[100, 300], [100, 300]])
    v = g.add_blocks(poplar.FLOAT, [200, 300], lo, sz, "v")
    for k, t in enumerate((0, 2, 1, 3)):
        g.setTileMapping(v.slice(50 * k, 50 * (k + 1), 0), t)
    src = v.transpose()
    ref = g.tile_of_elements(src)
    c = g.clone(src, "c")
    np.testing.assert_array_equal(g.tile_of_elements(c), ref)
    var = g._state.variables[int(c.pieces.var[0])]
    assert var.tile_ids.tolist() == [0, 2, 1, 3]
    d = g.addVariable(poplar.FLOAT, [200, 300], "d").transpose()
    g.copy_tile_mapping(d, src)
    dv = g._state.variables[int(d.pieces.var[0])]
    assert sum(np.size(p[0]) for p in dv._pending) == 4
    np.testing.assert_array_equal(g.tile_of_elements(d), ref)
