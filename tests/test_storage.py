"""Host storage follows the memory plan: variables whose lifetimes do not overlap share addresses."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from openipu import poplar
from openipu.poplar import program
from openipu.poplar.memory import host_offsets
from openipu.poplibs import popops, poputil


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 9), st.integers(0, 4), st.booleans()), min_size=1, max_size=14))
def test_host_offsets_never_overlap_live_variables(vs):
    sizes = np.array([v[0] for v in vs])
    first = np.array([v[1] for v in vs])
    last = first + np.array([v[2] for v in vs])
    shared = np.array([v[3] for v in vs])
    off, size = host_offsets(sizes, first, last, shared)
    for i in range(len(vs)):
        assert 0 <= off[i] and off[i] + sizes[i] <= size
        for j in range(i):
            if not sizes[i] or not sizes[j]:
                continue
            mem = off[i] < off[j] + sizes[j] and off[j] < off[i] + sizes[i]
            li = (first[i], last[i]) if shared[i] else (-1, 99)
            lj = (first[j], last[j]) if shared[j] else (-1, 99)
            assert not (mem and li[0] <= lj[1] and lj[0] <= li[1])


def test_temporaries_share_storage_and_results_are_right():
    """A chain of elementwise ops: each temporary dies after the next op, so the host buffer is
    about two temporaries plus the pinned input and output, not the sum of all."""
    dev = poplar.IPUModel("ipu2").createDevice()
    g = poplar.Graph(dev.getTarget())
    n = 100_000
    x = g.addVariable(poplar.FLOAT, [n], "x")
    poputil.mapTensorLinearly(g, x)
    prog = program.Sequence()
    t = x
    for i in range(10):
        t = popops.add(g, t, float(i), prog, f"add{i}")
    out = g.addVariable(poplar.FLOAT, [n], "out")
    poputil.mapTensorLinearly(g, out)
    prog.add(program.Copy(t, out))
    g.createHostWrite("x", x)
    g.createHostRead("out", out)
    e = poplar.Engine(g, prog)
    e.load(dev)
    e.writeTensor("x", np.arange(n, dtype=np.float32))
    e.run(0)
    np.testing.assert_array_equal(e.readTensor("out"), np.arange(n, dtype=np.float32) + 45)
    held = e._storage.bufs["float"].numel()
    assert held <= 4 * n + 64, held              # x, out and two live temporaries
    assert sum(v.numel for v in g._state.spaces["float"].vars) >= 12 * n


def test_offline_prediction_matches_a_real_run_without_storage():
    """predict_run walks the steps without device memory and predicts the same cycles as a run."""
    def build():
        dev = poplar.IPUModel("ipu2").createDevice()
        g = poplar.Graph(dev.getTarget())
        x = g.addVariable(poplar.FLOAT, [50_000], "x")
        poputil.mapTensorLinearly(g, x)
        prog = program.Sequence()
        y = popops.exp(g, popops.add(g, x, 1.0, prog), prog)
        popops.addInPlace(g, x, y, prog)
        g.createHostWrite("x", x)
        return dev, g, program.Repeat(3, prog)
    dev, g, prog = build()
    e = poplar.Engine(g, prog)
    e.load(dev)
    e.writeTensor("x", np.zeros(50_000, np.float32))
    e.run(0)
    real = e.last_run_cycles
    dev2, g2, prog2 = build()
    off = poplar.Engine(g2, prog2)
    assert off._storage is None
    assert off.predict_run(0) == real > 0
    assert off._storage is None


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(1, 9), st.integers(1, 4), st.integers(1, 5), st.integers(0, 6),
       st.booleans(), st.booleans(), st.booleans())
def test_accessor_reads_and_writes_views_of_many_pieces_like_their_addresses(rows, cols, br, bc, view, loop, rep, grow):
    """Views of a blocked tensor (many pieces, some of several shapes; transposed, reversed,
    sub-sampled, broadcast, concatenated): the grouped gathers and the per-piece strided copies
    both read every element at its address and write it there."""
    from openipu.poplar import regions, storage as S
    g = poplar.Graph(poplar.IPUModel("ipu2").createDevice().getTarget())
    lo, sz = regions.grid_cells([np.unique(np.r_[0:rows:br, rows]), np.unique(np.r_[0:cols:bc, cols])])
    order = np.random.default_rng(rows * 10 + cols).permutation(len(lo))
    t = g.add_blocks(poplar.FLOAT, [rows, cols], lo[order], sz[order], "t")
    views = [t, t.transpose(), t.reverse(1), t.subSample(2, 1).reverse(0),
             poplar.concat([t, t.reverse(0)], 1), t.slice(0, 1, 0).broadcast(3, 0), t.transpose().reverse(1)]
    v = views[view]
    if rep:
        v = poplar.concat([v.slice(0, 1, 0), v], 0) if v.shape()[0] else v
    if grow:
        v = v.expand([0])
    st_ = S.Storage(g._state, 2)
    buf = st_.bufs["float"]
    buf.copy_(torch.arange(buf.numel(), dtype=buf.dtype).reshape(buf.shape))
    pos = torch.from_numpy(st_.host_positions("float", v.addresses().reshape(-1)))
    acc = S.Accessor(v)
    old = S.LOOP_MAX_PIECES, S.INDEX_CHUNK
    S.LOOP_MAX_PIECES, S.INDEX_CHUNK = (10**9, old[1]) if loop else (0, 5)   # gathers in chunks
    try:
        got = acc.read(st_)
        assert got.shape == (2, *v.shape())
        np.testing.assert_array_equal(got.reshape(2, -1).numpy(), buf[:, pos].numpy())
        new = torch.rand(2, *v.shape())
        acc = S.Accessor(v)
        acc.write(st_, new)
        flat = new.reshape(2, -1)
        # an address written through several elements holds one of their values; the others one each
        for j, p in enumerate(pos.tolist()):
            cand = flat[:, (pos == p).nonzero()[:, 0]]
            assert any(bool((buf[:, p] == cand[:, c]).all()) for c in range(cand.shape[1]))
    finally:
        S.LOOP_MAX_PIECES, S.INDEX_CHUNK = old



def _blocked(g, rows, cols, br, bc, order):
    from openipu.poplar import regions
    lo, sz = regions.grid_cells([np.unique(np.r_[0:rows:br, rows]), np.unique(np.r_[0:cols:bc, cols])])
    if order == "shuffled":
        perm = np.random.default_rng(rows * 100 + cols).permutation(len(lo))
        lo, sz = lo[perm], sz[perm]
    elif order == "column-major":
        perm = np.lexsort((lo[:, 0], lo[:, 1]))
        lo, sz = lo[perm], sz[perm]
    return g.add_blocks(poplar.FLOAT, [rows, cols], lo, sz, "t")


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 12), st.integers(2, 12), st.integers(1, 4), st.integers(1, 5), st.integers(0, 8),
       st.sampled_from(["row-major", "column-major", "shuffled"]), st.integers(1, 2))
def test_grid_plans_move_blocked_views_like_their_addresses(rows, cols, br, bc, view, order, reps):
    """Blocked tensors stored block after block (row- or column-major over the blocks, or
    shuffled), viewed whole, transposed, reversed, sub-sampled, broadcast and concatenated with
    themselves: the strided grid copies (and the index gathers left for what is not a grid) read
    every element from its address and write every address from one of its elements."""
    from openipu.poplar import storage as S
    g = poplar.Graph(poplar.IPUModel("ipu2").createDevice().getTarget())
    t = _blocked(g, rows, cols, br, bc, order)
    views = [t, t.transpose(), t.reverse(0), t.reverse(1).transpose(), t.subSample(2, 1),
             poplar.concat([t, t], 0), t.slice(0, 1, 0).broadcast(3, 0), poplar.concat([t.reverse(1), t], 1),
             t.reshape([rows, cols, 1]).broadcast(2, 2)]
    v = views[view]
    st_ = S.Storage(g._state, reps)
    buf = st_.bufs["float"]
    buf.copy_(torch.arange(buf.numel(), dtype=buf.dtype).reshape(buf.shape))
    pos = torch.from_numpy(st_.host_positions("float", v.addresses().reshape(-1)))
    old = S.LOOP_MAX_PIECES
    S.LOOP_MAX_PIECES = 0
    try:
        acc = S.Accessor(v)
        np.testing.assert_array_equal(acc.read(st_).reshape(reps, -1).numpy(), buf[:, pos].numpy())
        if order == "row-major" and view in (0, 1, 2, 3):
            assert not acc._groups[0].groups and not acc._groups[1].groups   # all strided, no indices
            assert len(acc._groups[0].grids) <= 4                           # inner, right, bottom, corner
        new = torch.rand(reps, *v.shape())
        acc.write(st_, new)
        flat = new.reshape(reps, -1)
        for p in torch.unique(pos).tolist():
            cand = flat[:, (pos == p).nonzero()[:, 0]]
            assert any(bool((buf[:, p] == cand[:, c]).all()) for c in range(cand.shape[1]))
        # an expanded value (one replica's values broadcast to all) writes every replica
        one = torch.rand(1, *v.shape())
        acc.write(st_, one.expand(reps, *v.shape()))
        np.testing.assert_array_equal(acc.read(st_).numpy(), S.Accessor(v).read(st_).numpy())
    finally:
        S.LOOP_MAX_PIECES = old


def test_grid_plan_holds_integers_per_grid_not_per_element():
    """The plan of a blocked view is a few integers per grid: the same for blocks 64x larger."""
    from openipu.poplar import storage as S
    sizes = []
    for scale in (1, 8):
        g = poplar.Graph(poplar.IPUModel("ipu2").createDevice().getTarget())
        t = _blocked(g, 40 * scale, 30 * scale, 3 * scale, 4 * scale, "row-major")
        st_ = S.Storage(g._state, 1)
        acc = S.Accessor(t.transpose())
        acc.read(st_)
        read, write = acc._groups
        assert not read.groups and not write.groups
        assert all(isinstance(x, (int, tuple)) for grid in read.grids for x in grid)
        sizes.append([tuple(len(x) if isinstance(x, tuple) else 1 for x in grid) for grid in read.grids])
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize("grid", [True, False])
def test_write_of_a_view_of_the_buffer_into_an_overlapping_view(grid):
    """Writing a value that is a view of the device buffer (a one-piece read) over the same
    elements (an in-place transpose), through a strided grid plan or a per-piece copy, moves the
    values as they were."""
    from openipu.poplar import storage as S
    g = poplar.Graph(poplar.IPUModel("ipu2").createDevice().getTarget())
    t = _blocked(g, 6, 6, 3, 3, "row-major")
    st_ = S.Storage(g._state, 2)
    buf = st_.bufs["float"]
    buf.copy_(torch.arange(buf.numel(), dtype=buf.dtype).reshape(buf.shape))
    before = S.Accessor(t).read(st_).clone()
    block = t.slice([0, 0], [3, 3])
    value = S.Accessor(block).read(st_)                 # one piece: a view of the buffer
    assert value.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    old = S.LOOP_MAX_PIECES
    S.LOOP_MAX_PIECES = 0 if grid else old
    try:
        S.Accessor(block.transpose()).write(st_, value)
    finally:
        S.LOOP_MAX_PIECES = old
    after = S.Accessor(t).read(st_)
    np.testing.assert_array_equal(after[:, :3, :3].numpy(), before[:, :3, :3].transpose(1, 2).numpy())
    np.testing.assert_array_equal(after[:, 3:].numpy(), before[:, 3:].numpy())
