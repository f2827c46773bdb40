"""poplin's structural layouts and exchange: the boxes of ``layout.input_boxes`` / ``weight_boxes`` /
``output_boxes`` and the reads ``core.build`` declares (boxes and runs, no per-element arrays)
against per-element references: the layout formulas, and the per-address exchange model applied
to the elements each tile reads (one transfer per replica of a block, the first counting sends)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openipu import poplar
from openipu.poplar import cost as costmod
from openipu.poplar import program as P
from openipu.poplar.graph_compiler import _boxes_of
from openipu.poplar.exchange import RegionTransfer
from openipu.poplibs import poplin, poputil
from openipu.poplibs.poplin import core, layout
from openipu.poplibs.poplin.convolution import _canon_input
from openipu.poplibs.poplin.plan import plan_convolution


# ---------------------------------------------------------------------------------------------
# per-element references (the formulas the boxes implement)
def _block_sizes(idx, n, b):
    """The size of the block of ``b`` (the last one short) that index ``idx`` of ``range(n)`` is in."""
    return np.minimum(b, n - idx // b * b)


def ref_input_tiles(params, plan, lay):
    """Share ``o = q * outChanSplit // L`` of element ``q`` of its block (row-major over the
    block's sizes, ``L`` elements: g x n x c x the rows whose primary field block is f x rest)."""
    F0 = params.inputFieldShape[0]
    rest = int(np.prod(params.inputFieldShape[1:], dtype=np.int64))
    lo, hi = layout.input_row_ranges(params, plan, lay)
    fr = layout._primary_block(np.arange(F0), lo, hi)
    r0 = np.searchsorted(fr, fr, side="left")
    nr = np.searchsorted(fr, fr, side="right") - r0
    g = np.arange(lay.G)[:, None, None, None, None]
    n = np.arange(lay.N)[None, :, None, None, None]
    c = np.arange(lay.Ci)[None, None, :, None, None]
    row = np.arange(F0)[None, None, None, :, None]
    f, r0, nr = (a_[None, None, None, :, None] for a_ in (fr, r0, nr))
    r = np.arange(rest)[None, None, None, None, :]
    gs, ns, cs = _block_sizes(g, lay.G, lay.gB), _block_sizes(n, lay.N, lay.nB), _block_sizes(c, lay.Ci, lay.ciB)
    q = ((((g % lay.gB) * ns + n % lay.nB) * cs + c % lay.ciB) * nr + row - r0) * rest + r
    o = q * plan.out_chan_split // (gs * ns * cs * nr * rest)
    t = layout.tile_index(plan, g // lay.gB, n // lay.nB, f, o, c // lay.ciB)
    return np.broadcast_to(t, (lay.G, lay.N, lay.Ci, F0, rest)).reshape(-1)


def ref_weight_tiles(params, plan, lay):
    """Share ``h = q * batchSplit * fieldSplit // L`` of element ``q`` of its block ``g x co x c x K``
    (co: a serial slice of an output-channel block)."""
    K = int(np.prod(params.kernelShape, dtype=np.int64))
    g = np.arange(lay.G)[:, None, None, None]
    co = np.arange(lay.Co)[None, :, None, None]
    c = np.arange(lay.Ci)[None, None, :, None]
    k = np.arange(K)[None, None, None, :]
    share = plan.batch_split * plan.field_split
    gs, os_, cs = _block_sizes(g, lay.G, lay.gB), _block_sizes(co, lay.Co, lay.coS), _block_sizes(c, lay.Ci, lay.ciB)
    q = (((g % lay.gB) * os_ + co % lay.coS) * cs + c % lay.ciB) * K + k
    h = q * share // (gs * os_ * cs * K)
    t = layout.tile_index(plan, g // lay.gB, h // plan.field_split, h % plan.field_split, co // lay.coB, c // lay.ciB)
    return np.broadcast_to(t, (lay.G, lay.Co, lay.Ci, K)).reshape(-1)


def ref_output_tiles(params, plan, lay):
    """Share ``i = q * inChanSplit // L`` of element ``q`` of its output block (row-major over the
    block's actual sizes, ``L`` elements: block g x n x co x rows of its field block x rest)."""
    fo = params.getOutputFieldShape()
    rest = int(np.prod(fo[1:], dtype=np.int64))
    rows = np.clip(np.arange(fo[0]) - params.outputTransform.paddingLower[0], 0, max(lay.out_rows - 1, 0))
    fr = rows // max(lay.fB, 1)
    r0 = np.searchsorted(fr, fr, side="left")
    nr = np.searchsorted(fr, fr, side="right") - r0
    g = np.arange(lay.G)[:, None, None, None, None]
    n = np.arange(lay.N)[None, :, None, None, None]
    co = np.arange(lay.Co)[None, None, :, None, None]
    row = np.arange(fo[0])[None, None, None, :, None]
    f, r0, nr = (a[None, None, None, :, None] for a in (fr, r0, nr))
    r = np.arange(rest)[None, None, None, None, :]
    gs, ns, cs = _block_sizes(g, lay.G, lay.gB), _block_sizes(n, lay.N, lay.nB), _block_sizes(co, lay.Co, lay.coS)
    q = ((((g % lay.gB) * ns + n % lay.nB) * cs + co % lay.coS) * nr + row - r0) * rest + r
    i = q * plan.in_chan_split // (gs * ns * cs * nr * rest)
    t = layout.tile_index(plan, g // lay.gB, n // lay.nB, f, co // lay.coB, i)
    return np.broadcast_to(t, (lay.G, lay.N, lay.Co, fo[0], rest)).reshape(-1)


def _graph(tiles, vtiles=None):
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = tiles
    top = poplar.Graph(m.createDevice().getTarget())
    return top, (top.createVirtualGraph(vtiles) if vtiles is not None else top)


def _local(graph, t):
    return graph._local_tiles(graph.tile_of_elements(t).astype(np.int64))


_conv_params = st.fixed_dictionaries({
    "N": st.integers(1, 5), "G": st.integers(1, 3), "Ci": st.integers(1, 40), "Co": st.integers(1, 40),
    "H": st.integers(1, 12), "W": st.integers(1, 7), "kh": st.integers(1, 4), "kw": st.integers(1, 3),
    "pad": st.integers(0, 2), "stride": st.integers(1, 3), "tiles": st.sampled_from([4, 16, 64]),
    "amp": st.sampled_from([0.6, 0.05, 0.005]), "half": st.booleans()})


def _params(d):
    t = poplar.HALF if d["half"] else poplar.FLOAT
    kh, kw = min(d["kh"], d["H"] + 2 * d["pad"]), min(d["kw"], d["W"] + 2 * d["pad"])
    return poplin.ConvParams(t, t, d["N"], [d["H"], d["W"]], [kh, kw], d["Ci"], d["Co"], d["G"],
                             inputTransform=poplin.InputTransform(paddingLower=[d["pad"]] * 2,
                                                                  paddingUpper=[d["pad"]] * 2),
                             outputTransform=poplin.OutputTransform(stride=[d["stride"], 1]))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(d=_conv_params)
def test_conv_layouts_match_the_per_element_formulas(d):
    p = _params(d)
    _, g = _graph(d["tiles"])
    opts = {"availableMemoryProportion": d["amp"]}
    try:
        plan = plan_convolution(p, g.getTarget(), opts, None)
    except poplin.poplibs_error:
        return
    lay = layout.Layout.of(p, plan)
    x = poplin.createInput(g, p, "x", opts)
    w = poplin.createWeights(g, p, "w", opts)
    np.testing.assert_array_equal(_local(g, _canon_input(x, p)), ref_input_tiles(p, plan, lay))
    np.testing.assert_array_equal(_local(g, w), ref_weight_tiles(p, plan, lay))
    out = g.addVariable(p.outputType, [lay.G, lay.N, lay.Co, *p.getOutputFieldShape()], "o")
    layout.map_output(g, out, p, plan, lay)
    np.testing.assert_array_equal(_local(g, out), ref_output_tiles(p, plan, lay))


@pytest.mark.parametrize("shape,tiles,vtiles", [((50, 96, 70), 64, None), ((3, 40, 300, 20), 16, None),
                                                ((40, 50, 60), 32, [3, 1, 7, 5, 20, 11, 12, 13, 30, 31])])
def test_matmul_layouts_match_the_per_element_formulas(shape, tiles, vtiles):
    grouped = len(shape) == 4
    gr, m, k, n = shape if grouped else (1, *shape)
    _, g = _graph(tiles, vtiles)
    a_shape, b_shape = ([gr, m, k], [gr, k, n]) if grouped else ([m, k], [k, n])
    if grouped:
        A = poplin.createMatMulGroupedInputLHS(g, poplar.HALF, a_shape, b_shape, "a")
        B = poplin.createMatMulGroupedInputRHS(g, poplar.HALF, a_shape, b_shape, "b")
        C = poplin.createMatMulGroupedOutput(g, poplar.HALF, poplar.HALF, a_shape, b_shape, "c")
    else:
        A = poplin.createMatMulInputLHS(g, poplar.HALF, a_shape, b_shape, "a")
        B = poplin.createMatMulInputRHS(g, poplar.HALF, a_shape, b_shape, "b")
        C = poplin.createMatMulOutput(g, poplar.HALF, poplar.HALF, a_shape, b_shape, "c")
    plan = poplin.plan_matmul(gr, m, k, n, poplar.HALF, g.getTarget(), None, None)
    params = poplin.ConvParams(poplar.HALF, poplar.HALF, m, [1], [1], k, n, gr)
    lay = layout.Layout.of(params, plan)
    np.testing.assert_array_equal(_local(g, A.reshape([gr, m, k])), ref_input_tiles(params, plan, lay))
    np.testing.assert_array_equal(_local(g, B.reshape([gr, k, n]).dimShuffle([0, 2, 1])),
                                  ref_weight_tiles(params, plan, lay))
    np.testing.assert_array_equal(_local(g, C.reshape([gr, m, n])), ref_output_tiles(params, plan, lay))


# ---------------------------------------------------------------------------------------------
# reads: the structural Accesses against the per-address model of the same reads
def _ref_read_transfers(graph, x, w, params, plan, so):
    """The per-element transfers of one serial step's reads, as poplin built them before boxes:
    per operand part (primary input rows, halo rows, weights) one transfer per replica of each
    block, addresses in increasing order, the first replica counting sends."""
    lay = layout.Layout.of(params, plan)
    gt = graph._tiles
    space = x._state.space(x._type)
    lo, hi = layout.input_row_ranges(params, plan, lay)
    rows = np.concatenate([np.arange(a, b) for a, b in zip(lo.tolist(), hi.tolist())] + [np.zeros(0, int)])
    fblk = np.repeat(np.arange(plan.field_split), hi - lo)
    prim = fblk == layout._primary_block(rows, lo, hi)
    F0, rest = params.inputFieldShape[0], int(np.prod(params.inputFieldShape[1:]))
    K = int(np.prod(params.kernelShape))
    xa = x.addresses().reshape(lay.G, lay.N, lay.Ci, F0, rest)
    wa = w.addresses().reshape(lay.G, lay.Co, lay.Ci, K)
    n_idx = np.arange(lay.N)
    co_idx = np.flatnonzero((np.arange(lay.Co) % lay.coB) // lay.coS == so)
    g_t = (np.arange(lay.G) // lay.gB)[:, None, None, None, None]
    n_t = (n_idx // lay.nB)[None, :, None, None, None]
    c_t = (np.arange(lay.Ci) // lay.ciB)[None, None, :, None, None]
    out = []

    def replicas(addr, base, offsets):
        a, b = addr.reshape(-1), np.broadcast_to(base, addr.shape).reshape(-1)
        order = np.argsort(a, kind="stable")
        return [costmod.Transfer(space, a[order], gt[b[order] + off], count_send=k == 0)
                for k, off in enumerate(offsets)]

    for sel in (prim, ~prim):
        if sel.any():
            a_in = xa[:, n_idx][:, :, :, rows[sel]]
            base = layout.tile_index(plan, g_t, n_t, fblk[sel][None, None, None, :, None], 0, c_t)
            out += replicas(a_in, base, [int(layout.tile_index(plan, 0, 0, 0, o, 0)) for o in range(plan.out_chan_split)])
    base = layout.tile_index(plan, (np.arange(lay.G) // lay.gB)[:, None, None, None], 0, 0,
                           (co_idx // lay.coB)[None, :, None, None],
                           (np.arange(lay.Ci) // lay.ciB)[None, None, :, None])
    offs = [int(layout.tile_index(plan, 0, b, f, 0, 0))
            for b in range(plan.batch_split) for f in range(plan.field_split)]
    return out + replicas(wa[:, co_idx], base, offs)


def _volume(spec, transfers):
    v = costmod.exchange_volume(spec, transfers)
    return np.stack([v.recv_bytes, v.send_bytes, v.recv_msgs, v.send_msgs])


def _structural(accesses):
    """The region transfers the engine makes of a group's reads."""
    out = []
    for a in accesses:
        boxes = _boxes_of(a)
        if boxes is not None:
            out.append(RegionTransfer(a.tensor, boxes, count_send=a.count_send))
    return out


_READ_CASES = {
    "conv_halo": dict(N=2, G=1, Ci=6, Co=10, H=20, W=5, kh=5, kw=3, pad=2, stride=1, tiles=64, amp=0.6, half=False),
    "conv_stride_split": dict(N=3, G=2, Ci=40, Co=24, H=9, W=6, kh=3, kw=3, pad=1, stride=2, tiles=16, amp=0.05,
                              half=True),
    "conv_serial": dict(N=5, G=1, Ci=33, Co=37, H=8, W=4, kh=3, kw=1, pad=1, stride=1, tiles=4, amp=0.05, half=False),
}


_MM_CASES = {"mm_linear": (64, 300, 40, 64, 0.6), "mm_serial": (64, 256, 128, 16, 0.02)}


def _setup_reads(case, mapping):
    """(top graph, graph, canonical x, w, params, plan, options) of a read case."""
    rng = np.random.default_rng(1)
    if case in _MM_CASES:
        m, k, n, tiles, amp = _MM_CASES[case]
        top, g = _graph(tiles)
        opts = {"availableMemoryProportion": amp}
        if mapping == "created":
            A = poplin.createMatMulInputLHS(g, poplar.HALF, [m, k], [k, n], "a", opts)
            B = poplin.createMatMulInputRHS(g, poplar.HALF, [m, k], [k, n], "b", opts)
        else:
            A, B = g.addVariable(poplar.HALF, [m, k], "a"), g.addVariable(poplar.HALF, [k, n], "b")
            poputil.mapTensorLinearly(g, A)
            g.setTileMapping(B, rng.integers(0, tiles, B.numElements()))
        p = poplin.ConvParams(poplar.HALF, poplar.HALF, m, [1], [1], k, n, 1)
        plan = poplin.plan_matmul(1, m, k, n, poplar.HALF, g.getTarget(), opts, None)
        return top, g, A.reshape([1, m, k, 1]), B.dimShuffle([1, 0]).reshape([1, n, k, 1]), p, plan
    d = _READ_CASES[case]
    p = _params(d)
    top, g = _graph(d["tiles"])
    opts = {"availableMemoryProportion": d["amp"]}
    if mapping == "created":
        x = poplin.createInput(g, p, "x", opts)
        w = poplin.createWeights(g, p, "w", opts)
    else:
        x = g.addVariable(p.inputType, p.getInputShape(), "x")
        w = g.addVariable(p.inputType, p.getWeightsShape(), "w")
        for t in (x, w):
            g.setTileMapping(t, rng.integers(0, d["tiles"], t.numElements()))
    return top, g, _canon_input(x, p), w, p, plan_convolution(p, g.getTarget(), opts, None)


@pytest.mark.parametrize("case", sorted(_READ_CASES) + sorted(_MM_CASES))
@pytest.mark.parametrize("mapping", ["created", "other"])
def test_reads_cost_what_the_per_element_model_gives(case, mapping):
    top, g, xc, w, p, plan = _setup_reads(case, mapping)
    prog = P.Sequence()
    out = core.build(g, xc, w, p, plan, "float", p.outputType, prog, "y")
    spec = top._target.spec
    conv_sets = [cs for cs in top._state.compute_sets if cs.name.endswith("/Conv")]
    # serial splits are one loop body: it convolves one serial slice (the slice problem)
    assert len(conv_sets) == 1
    p_step = p._with(outputChannelsPerConvGroup=p.outputChannelsPerConvGroup // plan.out_chan_serial)
    plan_step = dataclasses.replace(plan, out_chan_serial=1)
    for cs in conv_sets:
        group = cs.groups[0]
        xr, wr = group.kernel.args[:2]      # the operands as read (after any rearrangement)
        np.testing.assert_array_equal(_volume(spec, _structural(group.reads)),
                                      _volume(spec, _ref_read_transfers(g, xr, wr, p_step, plan_step, 0)))
        if plan.in_chan_split > 1:
            # the reduce reads every partial slab on the tiles that hold the output
            partials = group.writes[0].tensor
            red = next(c for c in top._state.compute_sets if c.name == cs.name[:-len("Conv")] + "Reduce").groups[0]
            dst = red.writes[0].tensor
            ref = costmod.Transfer(top._state.space(partials._type), partials.flat_addresses(),
                                   np.tile(g.tile_of_elements(dst), plan.in_chan_split))
            np.testing.assert_array_equal(_volume(spec, _structural(red.reads)), _volume(spec, [ref]))
            counts = np.bincount(g.tile_of_elements(dst), minlength=spec.num_tiles)
            np.testing.assert_array_equal(np.sort(red.tiles), np.flatnonzero(counts))
    assert out.shape() == [p.numConvGroups, p.batchSize, p.outputChannelsPerConvGroup, *p.getOutputFieldShape()]


def test_bias_and_scaled_add_read_by_regions():
    """addBias reads a broadcast view of the biases (no address array), createBiases picks the
    tile holding most of each channel, and matMulAcc's update reads the product on C's tiles."""
    top, g = _graph(16)
    acts = g.addVariable(poplar.FLOAT, [3, 5, 4, 4], "acts")
    rng = np.random.default_rng(0)
    g.setTileMapping(acts, rng.integers(0, 16, acts.numElements()))
    b = poplin.createBiases(g, acts, "b")
    tiles = g.tile_of_elements(acts.dimShuffle([1, 0, 2, 3])).reshape(5, -1)
    for c in range(5):
        cnt = np.bincount(tiles[c], minlength=16)
        assert g.tile_of_elements(b[c:c + 1])[0] == int(np.argmax(cnt))
    prog = P.Sequence()
    poplin.addBias(g, acts, b, prog, "bias")
    grp = top._state.compute_sets[-1].groups[0]
    spec = top._target.spec
    ref = [costmod.Transfer(top._state.space(b._type),
                            np.broadcast_to(b.flat_addresses()[None, :, None, None], acts.shape()).reshape(-1),
                            g.tile_of_elements(acts))]
    np.testing.assert_array_equal(_volume(spec, _structural(grp.reads)), _volume(spec, ref))
    C = g.addVariable(poplar.FLOAT, [6, 7], "C")
    poputil.mapTensorLinearly(g, C)
    A = g.addVariable(poplar.FLOAT, [6, 9], "A")
    B = g.addVariable(poplar.FLOAT, [9, 7], "B")
    for t in (A, B):
        poputil.mapTensorLinearly(g, t)
    poplin.matMulAcc(g, C, 0.5, A, B, prog, "acc")
    grp = top._state.compute_sets[-1].groups[0]
    X = grp.reads[1].tensor
    assert X.numElements() >= C.numElements()
    used = np.flatnonzero(np.bincount(g.tile_of_elements(C), minlength=spec.num_tiles))
    np.testing.assert_array_equal(grp.tiles, used)


def _copies_into(prog, suffix):
    return [c for c in prog.programs if isinstance(c, P.Copy) and c.dst._state.variables[
        int(c.dst.variable_ids()[0])].name.endswith(suffix)]


def _lhs_case(created: bool):
    """A 64 x 64 @ 64 x 512 matmul on 64 tiles: (copies into a rearranged LHS, messages each tile
    receives in the Conv compute set, the product run on the engine, the inputs)."""
    model = poplar.IPUModel("ipu2")
    model.tilesPerIPU = 64
    dev = model.createDevice()
    g = poplar.Graph(dev.getTarget())
    m, k, n = 64, 64, 512
    if created:
        A = poplin.createMatMulInputLHS(g, poplar.FLOAT, [m, k], [k, n], "a")
    else:
        A = g.addVariable(poplar.FLOAT, [k, m], "a").transpose()      # column-major, mapped linearly
        poputil.mapTensorLinearly(g, A)
    B = poplin.createMatMulInputRHS(g, poplar.FLOAT, [m, k], [k, n], "b")
    prog = P.Sequence()
    C = poplin.matMul(g, A, B, prog, "c")
    reads = next(cs for cs in g._state.compute_sets if cs.name.endswith("/Conv")).groups[0].reads
    recv_msgs = _volume(g._target.spec, _structural(reads))[2]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    for name, t in (("a", A), ("b", B)):
        g.createHostWrite(name, t)
    g.createHostRead("c", C)
    e = poplar.Engine(g, prog)
    e.load(dev)
    e.writeTensor("a", a)
    e.writeTensor("b", b)
    e.run(0)
    return len(_copies_into(prog, "actsRearranged")), recv_msgs, e.readTensor("c"), a @ b


def test_an_operand_many_tiles_read_is_rearranged_once_into_the_plans_layout(monkeypatch):
    """A matmul whose plan reads each LHS block on more than 7 tiles (outChanSplit 32): an LHS
    mapped another way is first copied into the plan's block-contiguous layout (Poplar's
    rearrangement) and then read exactly as one made by createMatMulInputLHS, which is read as
    it is; without the rearrangement its column-major runs cost more messages. The product is
    right either way."""
    made = _lhs_case(True)
    other = _lhs_case(False)
    assert (made[0], other[0]) == (0, 1)
    np.testing.assert_array_equal(other[1], made[1])
    for copies, _, got, want in (made, other):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    monkeypatch.setattr(core, "MAX_BROADCAST_DESTS", 10**6)
    unarranged = _lhs_case(False)
    assert unarranged[0] == 0 and unarranged[1].sum() > 2 * other[1].sum()
    np.testing.assert_allclose(unarranged[2], unarranged[3], rtol=1e-5, atol=1e-4)


def test_laid_out_rejects_on_tile_counts_and_compares_runs_otherwise(monkeypatch):
    """``core._laid_out``: a view whose tiles hold other element counts than the plan's boxes is
    rejected without flattening either side to runs; equal counts still compare the runs (the
    same counts on a transposed arrangement are not the plan's layout), and a view mapped as the
    boxes is accepted."""
    g = _graph(4)[0]
    t = g.addVariable(poplar.FLOAT, [4, 8], "t")
    for r in range(4):
        g.setTileMapping(t[r], r)                   # row r on tile r
    rows = (np.array([[r, 0] for r in range(4)]), np.full((4, 2), [1, 8]), np.arange(4))
    cols = (np.array([[0, 2 * c] for c in range(4)]), np.full((4, 2), [4, 2]), np.arange(4))   # 8 per tile
    halves = (np.array([[0, 0], [2, 0]]), np.full((2, 2), [2, 8]), np.array([0, 1]))
    flattened = []
    real = type(g).tile_runs_of
    monkeypatch.setattr(type(g), "tile_runs_of", lambda self, v, perm=None: flattened.append(1) or real(self, v, perm))
    assert core._laid_out(g, t, *halves) is False and not flattened
    assert core._laid_out(g, t, *cols) is False and flattened
    assert core._laid_out(g, t, *rows) is True
    g.setTileMapping(t[3], 2)                       # tile 2 holds rows 2 and 3 now
    assert core._laid_out(g, t, *rows) is False
    u = g.addVariable(poplar.FLOAT, [4, 8], "u")    # unmapped: fewer mapped elements than the boxes
    assert core._laid_out(g, u, *rows) is False
