"""Building a planned convolution into the graph: vertex groups and serial loops.

Shared by :mod:`matmul` and :mod:`convolution`. Tensors here are in the *canonical* layout:
input ``[G, N, Ci, *inField]``, weights ``[G, Co, Ci, *kernel]``, output ``[G, N, Co, *outField]``
(views of the caller's tensors, so no data moves to get there); which tile holds which block is
:mod:`.layout`'s, the vertices' host kernels are :mod:`.kernels`'. A step is one compute set of
partial-sum vertices (one per tile), followed, when input channels are split, by one compute set
of reduce vertices.

A serial split of the output channels is a loop, as PopLibs' ``ConvProgramTree`` runs it:
``Repeat`` over the serial index of one compute-set group for an ``outChanSplit.serial``-th of
the output channels, which ``popops::dynamicSlice`` copies the weights' slice into and
``popops::dynamicUpdate`` copies the slice's result out of. (PopLibs' partition has no serial
batch split: ``batchSplit`` is parallel only.) The tensors
the plan creates hold each serial slice in the slice problem's layout, so both copies stay on
their tiles; the slice's exchange code exists once, whatever the number of steps. The planner
keeps only serial splits that divide the split dimension evenly (as PopLibs requires).

Host work follows the plan's structure, never the number of elements: layouts are boxes of the
canonical views (one per work block and share of it), mapped as runs of addresses; the vertex
groups' reads are boxes of the input and weight blocks, one per (block, reading tile), handed to
the exchange as runs of addresses (:func:`runs_access`), so the engine costs the exchange of the
blocks and of the partials from regions; a serial step's output is a view (slices of the output).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from openipu import poplar
from openipu.poplar import regions as R
from openipu.poplar import sets as _sets
from openipu.poplar.exchange import Boxes, lattices, tile_boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_mapping import box_tile_runs
from openipu.poplibs.popops import dynamic_slice as dslice
from openipu.poplibs.popops._common import interval_tile_counts
from openipu.poplibs.popops.loop import countedLoop
from openipu.poplibs.poplin import plan as planmod
from openipu.poplibs.poplin.kernels import _meta_reads, _partials_kernel, _reduce_kernel, _Spec
from openipu.poplibs.poplin.layout import (Layout, _blocks, blocked_runs, _ceil, _cross, _out_row_runs, _primary_block,
                                           blocked_tensor, create_input, create_output, create_weights,
                                           input_boxes, input_row_ranges, set_tile_boxes, tile_index,
                                           weight_boxes)
from openipu.poplibs.poplin.params import ConvParams

#: Vertex state bytes of a partial-sum vertex (worklists, pointers). [A]
PARTIALS_VERTEX_STATE_BYTES = 96
#: Vertex state bytes of a reduce vertex. [A]
REDUCE_VERTEX_STATE_BYTES = 32


# --------------------------------------------------------------------------------------------
def _row_ranges(params: ConvParams, plan, lay: Layout):
    """The input rows (first field dim) each field block reads, split as the reads are: rows of
    the block's own primary range, and halo rows (held by neighbouring blocks). Returns two
    ``(block, begin, end)`` triples (a block has at most one primary and two halo ranges)."""
    lo, hi = input_row_ranges(params, plan, lay)
    prim = _primary_block(np.arange(params.inputFieldShape[0]), lo, hi)
    f = np.arange(plan.field_split, dtype=np.int64)
    a = np.searchsorted(prim, f, side="left")          # rows whose primary block is f: [a, b)
    b = np.searchsorted(prim, f, side="right")
    p0, p1 = np.maximum(lo, a), np.minimum(hi, b)
    h0, h1 = lo, np.minimum(hi, a)                      # halo below the primary range
    u0, u1 = np.maximum(lo, b), hi                      # halo above it
    ok = p1 > p0
    primary = (f[ok], p0[ok], p1[ok])
    hf, hb, he = np.r_[f, f], np.r_[h0, u0], np.r_[h1, u1]
    ok = he > hb
    order = np.lexsort((hb[ok], hf[ok]))
    halo = (hf[ok][order], hb[ok][order], he[ok][order])
    return primary, halo


def runs_access(view, boxes: Boxes, count_send: bool = True, supertile_recv_scale: float = 1.0) -> Access:
    """A read of ``boxes`` of ``view``, given to the exchange as the runs of consecutive addresses
    the boxes cover (1-D boxes of a flat view of the variables they touch).

    Two reasons: the exchange merges a tile's sends of adjacent addresses into one message only
    between runs, not between the strided lattices of different boxes (as runs, a block that
    several tiles read in parts costs the messages a per-address model gives); and a strided
    lattice is costed against every tile-map run inside its address span, most of them other
    blocks' when the view is transposed. Host work follows the runs."""
    bi, var, base, T, n, _ = lattices(view, boxes)
    owner, start, length = R.address_runs(base, n, T)
    vids = var[owner]
    tiles = np.asarray(boxes.tile, np.int64)[bi[owner]]
    variables = view._state.variables
    uv = _sets.unique(vids)
    if uv.size == 0:
        z = np.zeros((0, view.rank()), np.int64)
        return Access(view, Boxes(z, z, np.zeros(0, np.int64)), count_send=count_send,
                      supertile_recv_scale=supertile_recv_scale)
    parts, off, shift = [], 0, np.zeros(uv.size, np.int64)
    for j, v in enumerate(uv.tolist()):
        var_ = variables[v]
        parts.append(poplar.Tensor(view._state, view._type, pieces=R.Pieces.of_variable(v, var_.start, (var_.numel,)),
                                   shape=(var_.numel,)))
        shift[j] = off - var_.start
        off += var_.numel
    flat = parts[0] if len(parts) == 1 else poplar.concat(parts, 0)
    idx = start + shift[np.searchsorted(uv, vids)]
    return Access(flat, Boxes(idx[:, None], length[:, None], tiles), count_send=count_send,
                  supertile_recv_scale=supertile_recv_scale)


def blocked_runs_access(t, edges, boxes: Boxes, slabs: int = 1) -> Access | None:
    """:func:`runs_access` of ``t``, a tensor :func:`blocked_tensor` made from the grid ``edges``,
    for ``boxes`` that each lie inside one block, in closed form (:func:`layout.blocked_runs`:
    each box's address lattice from its block's piece, without intersecting the boxes with the
    pieces (:func:`exchange.lattices`) or the structure memo's keys). ``slabs``: ``boxes`` are
    boxes of slab 0 of ``slabs`` one-index slabs of dim 0, read in every slab (as a reduction
    reads its partials; box ``b`` of slab ``i`` is box ``i * len(boxes) + b`` of the general
    call). Returns the same Access as :func:`runs_access` (the same runs in the same order), or
    None (the caller takes the general path) when ``t`` or the boxes are not of that form."""
    runs = blocked_runs(t, edges, boxes, slabs)
    if runs is None:
        return None
    v, start, length, tiles = runs
    var_ = t._state.variables[v]
    flat = poplar.Tensor(t._state, t._type, pieces=R.Pieces.of_variable(v, var_.start, (var_.numel,)),
                         shape=(var_.numel,))
    return Access(flat, Boxes((start - var_.start)[:, None], length[:, None], tiles))


def _replica_accesses(view, lo, sz, tiles, first, paired=None) -> list:
    """Reads of boxes ``lo``, ``sz`` of ``view`` by global ``tiles`` (as runs, see
    :func:`runs_access`): one Access for the first replica of each block (``first``), whose
    sends are counted, one for the others (the exchange multicasts: their values are already
    sent, so only what each tile receives counts). ``paired`` (bool per box): the reading tile's
    supertile partner reads the same box, so both receive it in the same cycles and what comes
    from outside the supertile counts at half its bytes (:data:`SUPERTILE_INPUT_RECV_SCALE`)."""
    out = []
    paired = np.zeros(len(tiles), bool) if paired is None else paired
    for sel, send in ((first, True), (~first, False)):
        for pr in (False, True):
            s = sel & (paired == pr)
            if s.any():
                out.append(runs_access(view, Boxes(lo[s], sz[s], tiles[s]), send,
                                       SUPERTILE_INPUT_RECV_SCALE if pr else 1.0))
    return out


#: Fraction of its bytes a tile's receive of an input block costs when its supertile partner
#: receives the same block in the same phase: PopLibs ``ExchangeEstimator`` counts input elements
#: at twice the exchange bytes per cycle when the output-channel split is a multiple of the tiles
#: per supertile ("both tiles can receive the same data in the same cycle";
#: ``Target::getTilesPerSharedExchangeBus`` = 2), with the tile order of ``linearizeConvIndices``.
SUPERTILE_INPUT_RECV_SCALE = 0.5


#: Tiles that may read each block of an operand as it is before poplin rearranges the operand
#: into the plan's own layout first (PopLibs' ``inViewMaxBroadcastDests`` and
#: ``weightViewMaxBroadcastDests``, both 7): a block read by more tiles is copied once into a
#: block-contiguous layout and broadcast from there, so its reading tiles each take it as one
#: interval instead of as the operand's own (possibly strided) runs.
MAX_BROADCAST_DESTS = 7


def _laid_out(graph, t, lo: np.ndarray, sz: np.ndarray, local_tiles: np.ndarray) -> bool:
    """Whether the view ``t`` already has the plan's layout: mapped as the boxes ``lo``, ``sz`` on
    ``local_tiles`` (compared as runs of the flattened view), each box one interval of memory.
    Host work follows boxes and runs: first the elements each tile holds (from the boxes, without
    flattening them), which differ in most views that are not laid out so, then the runs."""
    tiles = graph._global_tiles(np.asarray(local_tiles, np.int64))
    have = interval_tile_counts(graph, t)        # a view of whole intervals: from the runs
    if have is not None:
        want = np.bincount(np.asarray(tiles, np.int64), weights=np.prod(np.asarray(sz, np.int64), axis=1),
                           minlength=have.size)
        if want.size != have.size or not np.array_equal(have, want.astype(np.int64)):
            return False
    elif not _same_tile_counts(tile_boxes(t), sz, tiles):
        return False
    b, _, tl = graph.tile_runs_of(t)
    b2, tl2 = box_tile_runs(lo, sz, tiles, t.shape())
    if not (np.array_equal(b, b2) and np.array_equal(tl, tl2)):
        return False
    _, _, base, T, n, _ = lattices(t, Boxes(lo, sz, tiles.astype(np.int64)))
    return R.address_runs(base, n, T)[0].size == lo.shape[0]


def _same_tile_counts(boxes: Boxes, sz: np.ndarray, tiles: np.ndarray) -> bool:
    """Whether the mapped ``boxes`` of a view and the boxes of sizes ``sz`` on (global) ``tiles``
    put as many elements on every tile: a condition of equal tile maps that costs one pass over
    the boxes (a view with unmapped elements has fewer mapped ones, so it fails it too)."""
    keep = boxes.tile >= 0
    have_tiles, have = boxes.tile[keep].astype(np.int64), np.prod(boxes.sz[keep], axis=1, dtype=np.int64)
    want = np.prod(np.asarray(sz, np.int64), axis=1, dtype=np.int64)
    tiles = np.asarray(tiles, np.int64)
    n = int(max(have_tiles.max(initial=-1), tiles.max(initial=-1))) + 1
    a, b = np.zeros(n, np.int64), np.zeros(n, np.int64)
    np.add.at(a, have_tiles, have)
    np.add.at(b, tiles, want)
    return bool(np.array_equal(a, b))


def _rearranged(graph, t, flat_shape, boxes, dests: int, create, prog, name: str):
    """``(t, False)``, or ``(copy, True)``: a copy of ``t`` (added to ``prog``) into
    ``create(name)``, a new tensor in the plan's block-contiguous layout, when more than
    :data:`MAX_BROADCAST_DESTS` tiles read each block and ``t`` (viewed as ``flat_shape``, the
    shape of ``boxes``) is not already mapped that way: Poplar's rearrangement before a
    convolution (``convolutionPreprocess`` with ``rearrangeActs`` / ``rearrangeWeights``)."""
    if dests <= MAX_BROADCAST_DESTS or t.numElements() == 0 or _laid_out(graph, t.reshape(flat_shape), *boxes):
        return t, False
    r = create(name)
    prog.add(poplar.program.Copy(t, r))
    return r, True


def _memory_view(t):
    """The variable ``t`` views all of (a tensor the creators here made) as a flat tensor in
    memory order."""
    v = int(t.variable_ids()[0])
    var = t._state.variables[v]
    return poplar.Tensor(t._state, t._type, pieces=R.Pieces.of_variable(v, var.start, (var.numel,)),
                         shape=(var.numel,))


def build(graph, x, w, params: ConvParams, plan: planmod.ConvPlan, partials_type, out_type, prog, name: str,
          out=None, metas=None):
    """Add the planned convolution of canonical views ``x`` and ``w`` to ``prog``.

    Returns the output: ``out`` if given (canonical ``[G, N, Co, *outField]`` view, written in
    place), else a new variable in that shape mapped the way the plan produces it. A plan with
    serial splits becomes a loop (:func:`_serial_loop`). QUARTER operands with metadata (or
    ``metas``, their ``(x, w)`` metadata tensors) compute with their scaled values: the products
    are multiplied by ``2**(scale_x + scale_w)``; both fp8 formats run at the QUARTER rate.
    Raises ``poplibs_error`` when the plan needs more tiles than the graph has.
    """
    target = graph.getTarget()
    T = target.getNumTiles()
    in_type = x.elementType()
    w_type = w.elementType()          # QUARTER: the weights may hold another fp8 format than x
    if metas is None and (x.hasMetadata() or w.hasMetadata()):
        metas = (x.getMetadata() if x.hasMetadata() else None, w.getMetadata() if w.hasMetadata() else None)
    lay = Layout.of(params, plan)
    if plan.tiles > T:
        raise planmod.poplibs_error(f"{name}: plan uses {plan.tiles} tiles but the graph has {T}")
    # operands that many tiles read are first copied into the plan's layout (unless already so)
    rest = int(np.prod(params.inputFieldShape[1:], dtype=np.int64))
    x, _ = _rearranged(graph, x, [lay.G, lay.N, lay.Ci, params.inputFieldShape[0], rest],
                            input_boxes(params, plan, lay), plan.out_chan_split,
                            lambda n: create_input(graph, in_type, params, plan, n, lay), prog, f"{name}/actsRearranged")
    K = int(np.prod(params.kernelShape, dtype=np.int64))
    w, w_made = _rearranged(graph, w, [lay.G, lay.Co, lay.Ci, K], weight_boxes(params, plan, lay),
                            plan.batch_split * plan.field_split,
                            lambda n: create_weights(graph, w_type, params, plan, n, lay=lay).reshape(w.shape()), prog,
                            f"{name}/weightsRearranged")
    own_out = out is None
    if own_out:
        out = create_output(graph, out_type, params, plan, name, lay)
    if plan.out_chan_serial > 1:
        _serial_loop(graph, x, w, out, params, plan, lay, partials_type, out_type, prog, name, w_made, own_out, metas)
    else:
        _build_step(graph, x, w, out, own_out, params, plan, lay, partials_type, out_type, prog, name, metas)
    return out


def _serial_loop(graph, x, w, out, params: ConvParams, plan, lay: Layout, partials_type, out_type, prog, name: str,
                 src_made: bool, out_made: bool, metas=None):
    """The output-channel serial split of ``plan`` as PopLibs' ``ConvProgramTree`` lowers it: a
    counted loop whose body copies serial slice ``i`` of the weights into a buffer laid out for
    the slice problem (``popops::dynamicSlice``), convolves it (:func:`build` of the slice
    problem), and copies the slice's output into ``out`` (``popops::dynamicUpdate``). The tensors the plan lays out hold every slice where the slice
    problem wants it, so both copies stay on their tiles. ``out`` is marked undefined first
    (``WriteUndef``), so that it is not live before the loop.

    ``src_made`` / ``out_made``: the weights / ``out`` were made here by the creators, which
    store it slice by slice, each slice as the slice problem's creator stores its tensor; the
    copies then slice the variables in memory order (one interval per slice), else the
    tensors' own views (host work follows their pieces)."""
    s, par, piece = int(plan.out_chan_serial), int(plan.out_chan_split), lay.coS
    sub_params = params._with(outputChannelsPerConvGroup=par * piece)
    sub_plan = dataclasses.replace(plan, out_chan_serial=1)
    src, out_dim = w, 2

    def make(n):
        t = create_weights(graph, w.elementType(), sub_params, sub_plan, n)
        return t.reshape([lay.G, par * piece, lay.Ci, *params.kernelShape])
    if par * s * piece != src.dim(1):
        raise planmod.poplibs_error(f"{name}: serial split {s} does not divide {src.dim(1)} evenly in blocks of {par}")

    def split(t, d, n):                    # dim d (par * n * piece) as [par, n, piece]
        sh = list(t.shape())
        return t.reshape(sh[:d] + [par, n, piece] + sh[d + 1:])

    def body(index):
        seq = poplar.program.Sequence()
        buf = make(f"{name}/serialSlice")
        seq.add(poplar.program.WriteUndef(buf))
        if src_made:
            mem = _memory_view(buf)
            dslice.dynamicSliceWithOutput(graph, mem.reshape([1, mem.numElements()]),
                                          _memory_view(src).reshape([s, mem.numElements()]), index, [0], [1], seq,
                                          f"{name}/serialSlice")
        else:
            dslice.dynamicSliceWithOutput(graph, split(buf, 1, 1), split(src, 1, s), index, [2], [1], seq,
                                          f"{name}/serialSlice")
        y = build(graph, x, buf, sub_params, sub_plan, partials_type, out_type, seq, name, metas=metas)
        if out_made:
            mem = _memory_view(y)
            dslice.dynamicUpdate(graph, _memory_view(out).reshape([s, mem.numElements()]),
                                 mem.reshape([1, mem.numElements()]), index, [0], [1], seq, f"{name}/serialUpdate")
        else:
            dslice.dynamicUpdate(graph, split(out, out_dim, s), split(y, out_dim, 1), index, [out_dim + 1], [1], seq,
                                 f"{name}/serialUpdate")
        return seq

    prog.add(poplar.program.WriteUndef(out))
    prog.add(countedLoop(graph, s, body, f"{name}/serialLoop"))


def _build_step(graph, x, w, out, own_out: bool, params: ConvParams, plan, lay: Layout, partials_type, out_type,
                prog, name: str, metas=None) -> None:
    """The compute sets of a plan without serial splits: partial sums on every tile of the plan,
    then (with an input-channel split) their reduction onto the output's tiles."""
    target = graph.getTarget()
    W_ctx = target.getNumWorkerContexts()
    gt = graph._tiles
    in_type = x.elementType()
    ptype = poplar.FLOAT if in_type == poplar.FLOAT else poplar.types.as_type(partials_type)
    fo = params.getOutputFieldShape()
    ics = plan.in_chan_split
    it, kt, ot = params.inputTransform, params.kernelTransform, params.outputTransform
    nd = params.getNumFieldDims()
    plain = (all(s == 1 for s in params.inputFieldShape) and all(s == 1 for s in params.kernelShape)
             and it.key() == type(it)()._fill(nd).key() and kt.key() == type(kt)()._fill(nd).key()
             and ot.key() == type(ot)()._fill(nd).key())
    acc = "float32" if ptype == poplar.FLOAT else ("float16" if in_type == poplar.HALF else "float32")
    one_by_one = params.getTruncatedKernelSize(0) * int(np.prod([params.getTruncatedKernelSize(d)
                                                                 for d in range(1, nd)])) == 1
    vtype = plan.vertex_name(in_type, ptype, one_by_one)
    pb = planmod.Problem.from_params(params)

    # input rows each field block reads (primary rows, then halo rows), as row ranges
    row_sets = [r for r in _row_ranges(params, plan, lay) if r[0].size]
    r_lo = min((int(r[1].min()) for r in row_sets), default=0)
    r_hi = max((int(r[2].max()) for r in row_sets), default=0)
    in_tail = list(params.inputFieldShape[1:])
    k_shape = list(params.kernelShape)
    o_tail = list(fo[1:])
    g0, gs = _blocks(lay.G, lay.gB)
    c0, cs = _blocks(lay.Ci, lay.ciB)
    n0, ns = _blocks(lay.N, lay.nB)
    o0, os_ = _blocks(lay.Co, lay.coB)
    f_out, fr0, fr1 = _out_row_runs(params, lay)
    macs_per_out = lay.Ci * pb.taps * pb.density
    # reads: the input rows, by every out-channel tile of their block; the weights, by every
    # batch x field tile of theirs. Boxes, one per (block, reading tile), handed over as runs of
    # addresses; the sends of a block's first replica are counted, the others' not (the
    # exchange multicasts).
    reads = []
    xs = x.slice(r_lo, r_hi, 3)                                          # [G, N, Ci, rows, *rest]
    for fb, rb, re_ in row_sets:
        GB, NB, CB, RK, OO = _cross(g0.size, n0.size, c0.size, fb.size, plan.out_chan_split)
        lo = np.stack([g0[GB], n0[NB], c0[CB], rb[RK] - r_lo] + [np.zeros_like(GB)] * len(in_tail), axis=1)
        sz = np.stack([gs[GB], ns[NB], cs[CB], (re_ - rb)[RK]] + [np.full_like(GB, s_) for s_ in in_tail], axis=1)
        local = tile_index(plan, GB, NB, fb[RK], OO, CB)
        tiles = gt[local].astype(np.int64)
        paired = None
        if plan.out_chan_split % 2 == 0:
            bus = target.getTilesPerSharedExchangeBus()
            paired = tiles // bus == gt[local ^ 1].astype(np.int64) // bus
        reads += _replica_accesses(xs, lo, sz, tiles, OO == 0, paired)
    GB, OB, CB, BB, FF = _cross(g0.size, o0.size, c0.size, plan.batch_split, plan.field_split)
    lo = np.stack([g0[GB], o0[OB], c0[CB]] + [np.zeros_like(GB)] * len(k_shape), axis=1)
    sz = np.stack([gs[GB], os_[OB], cs[CB]] + [np.full_like(GB, s_) for s_ in k_shape], axis=1)
    tiles = gt[tile_index(plan, GB, BB, FF, OB, CB)].astype(np.int64)
    reads += _replica_accesses(w, lo, sz, tiles, (BB == 0) & (FF == 0))
    kw = {}
    if metas is not None and any(m is not None for m in metas):
        kw["metas"] = tuple(metas)
    # per-tile work
    gi, bi, fi, oi, ii = _cross(plan.group_split, plan.batch_split, plan.field_split, plan.out_chan_split, ics)
    gc = np.clip(lay.G - gi * lay.gB, 0, lay.gB)
    nc = np.clip(lay.N - bi * lay.nB, 0, lay.nB)
    fc = np.clip(lay.out_rows - fi * lay.fB, 0, lay.fB)
    cic = np.clip(lay.Ci - ii * lay.ciB, 0, lay.ciB)
    coc = np.clip(lay.Co - oi * lay.coB, 0, lay.coB)
    busy = (gc > 0) & (nc > 0) & (fc > 0) & (cic > 0) & (coc > 0)
    tiles = tile_index(plan, gi, bi, fi, oi, ii)[busy]
    P = (nc * fc * pb.out_rest)[busy]
    Pw = np.maximum(1, np.ceil(P * pb.density).astype(np.int64))
    fp = ptype == poplar.FLOAT
    if plan.method == "AMP":
        nig = _ceil(cic[busy], plan.in_chans_per_group)
        nog = _ceil(coc[busy], plan.out_chans_per_group)
        if one_by_one:
            cyc = planmod.amp_1x1_cycles(Pw, nig, nog, gc[busy], plan.conv_units, in_type.name, fp, W_ctx)
        else:
            cyc = planmod.amp_nx1_cycles(Pw, nig, nog, gc[busy], plan.conv_units, pb.taps, pb.kernel_outer,
                                         plan.out_chans_per_group, in_type.name, fp, W_ctx, 2 if fp else 4)
    else:
        cyc = planmod.hmac_cycles(P, cic[busy], coc[busy], gc[busy], max(1, math.ceil(pb.taps * pb.density)),
                                  in_type.name, fp, W_ctx, target.getVectorWidth(in_type))
    outs = lay.G * lay.N * lay.Co * pb.out_rows * pb.out_rest
    flops = 2.0 * outs * macs_per_out
    spec = _Spec((tuple(it.truncationLower), tuple(it.truncationUpper), tuple(it.dilation),
                  tuple(it.paddingLower), tuple(it.paddingUpper), tuple(it.flip)),
                 (tuple(kt.truncationLower), tuple(kt.truncationUpper), tuple(kt.dilation),
                  tuple(kt.paddingLower), tuple(kt.paddingUpper), tuple(kt.flip)),
                 (tuple(ot.truncationLower), tuple(ot.truncationUpper), tuple(ot.stride),
                  tuple(ot.paddingLower), tuple(ot.paddingUpper)),
                 plain, ics, lay.ciB, acc, (out_type if ics == 1 else ptype).name, int(flops // 2))
    # the output blocks: (group block, batch block, out-channel block, rows)
    GB, NB, OB, FR = _cross(g0.size, n0.size, o0.size, f_out.size)
    out_lo = [g0[GB], n0[NB], o0[OB], fr0[FR]] + [np.zeros_like(GB)] * len(o_tail)
    out_sz = [gs[GB], ns[NB], os_[OB], (fr1 - fr0)[FR]] + [np.full_like(GB, s_) for s_ in o_tail]
    cs_ = graph.addComputeSet(f"{name}/Conv")
    if ics == 1:
        # the vertices write the output directly (no reduction), from the tiles that compute it:
        # the output's own tiles when it was created here (output_boxes)
        if own_out:
            write = Access(out)
        else:
            wt = gt[tile_index(plan, GB, NB, f_out[FR], OB, 0)].astype(np.int64)
            write = Access(out, Boxes(np.stack(out_lo, axis=1), np.stack(out_sz, axis=1), wt))
        graph.add_vertex_group(cs_, VertexGroup(
            vtype, gt[tiles], cyc, functools.partial(_partials_kernel, x, w, out, spec, **kw),
            reads=reads + _meta_reads(kw, gt[tiles]), writes=[write], multi=True, flops=flops, state_bytes=PARTIALS_VERTEX_STATE_BYTES))
        prog.add(poplar.program.Execute(cs_))
        return
    # partial sums, one slab per input-channel block, on the tiles that compute them, stored
    # block by block (each tile's partials contiguous), as Poplar's partials are
    p_shape = [ics, lay.G, lay.N, lay.Co, *fo]
    p_edges = [np.arange(ics + 1)] + [_sets.unique(np.r_[0, a, a + b, n_]) for a, b, n_ in
                                      zip(out_lo[:4], out_sz[:4], p_shape[1:5])] + \
        [np.array([0, n_]) for n_ in p_shape[5:]]
    partials = blocked_tensor(graph, ptype, p_edges, f"{name}/partials")
    ib = np.repeat(np.arange(ics, dtype=np.int64), GB.size)
    pt = tile_index(plan, np.tile(GB, ics), np.tile(NB, ics), np.tile(f_out[FR], ics), np.tile(OB, ics), ib)
    set_tile_boxes(graph, partials, np.stack([ib] + [np.tile(a, ics) for a in out_lo], axis=1),
                   np.stack([np.ones_like(ib)] + [np.tile(a, ics) for a in out_sz], axis=1), pt, edges=p_edges)
    graph.add_vertex_group(cs_, VertexGroup(
        vtype, gt[tiles], cyc, functools.partial(_partials_kernel, x, w, partials, spec, **kw),
        reads=reads + _meta_reads(kw, gt[tiles]), writes=[Access(partials)], multi=True, flops=flops,
        state_bytes=PARTIALS_VERTEX_STATE_BYTES))
    prog.add(poplar.program.Execute(cs_))
    # reduce across the input-channel split onto the tiles that hold the output: slab i of the
    # partials is read as the output's tile boxes (the blocks' shares)
    ob = tile_boxes(out)
    ob = Boxes(ob.lo[ob.tile >= 0], ob.sz[ob.tile >= 0], ob.tile[ob.tile >= 0])
    rt = ob.tile.astype(np.int64)
    nel = np.prod(ob.sz, axis=1, dtype=np.int64)
    counts = np.bincount(rt, weights=nel, minlength=graph._top.getTarget().getNumTiles()).astype(np.int64)
    used = np.flatnonzero(counts)
    counts = counts[used]
    # the partials are laid out here, block by block: their reads (every slab of each output
    # box) in closed form when each box is inside a block (always, when the output was created
    # here), else as any view's
    one = np.ones((len(ob), 1), np.int64)
    p_read = blocked_runs_access(partials, p_edges, Boxes(np.concatenate([0 * one, ob.lo], axis=1),
                                                          np.concatenate([one, ob.sz], axis=1), rt), slabs=ics)
    if p_read is None:
        slab = np.repeat(np.arange(ics, dtype=np.int64), len(ob))
        p_read = runs_access(partials, Boxes(np.concatenate([slab[:, None], np.tile(ob.lo, (ics, 1))], axis=1),
                                             np.concatenate([np.ones((slab.size, 1), np.int64),
                                                             np.tile(ob.sz, (ics, 1))], axis=1),
                                             np.tile(rt, ics)))
    rcyc = planmod.conv_reduce_cycles(counts, ics, out_type == poplar.FLOAT, ptype == poplar.FLOAT, W_ctx,
                                      target.getDataPathWidth(), target.getBytesPerTile())
    rcs = graph.addComputeSet(f"{name}/Reduce")
    graph.add_vertex_group(rcs, VertexGroup(
        f"poplin::ReduceAdd<{out_type},{ptype}>", used, rcyc,
        functools.partial(_reduce_kernel, partials, out, work=int(outs * ics)),
        reads=[p_read],
        writes=[Access(out)], multi=True, flops=float(outs * (ics - 1)),
        state_bytes=REDUCE_VERTEX_STATE_BYTES))
    prog.add(poplar.program.Execute(rcs))
