"""A planned convolution's tile layout: which tile holds which block of the input, weights,
output and partials, and the creators that make tensors laid out that way.

Tensors here are in the *canonical* layout: input ``[G, N, Ci, *inField]``, weights
``[G, Co, Ci, *kernel]``, output ``[G, N, Co, *outField]`` (views of the caller's tensors).
Tiles of work blocks are ordered as PopLibs' ``linearizeConvIndices`` orders them
(:func:`tile_index`). Layouts are boxes of the canonical views (one per work block and share of
it), mapped as runs of addresses: host work follows the plan's structure, never the number of
elements. The tensors the creators make for a plan with a serial split hold each serial slice in
the slice problem's layout (see :mod:`openipu.poplibs.poplin.core`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from openipu.poplar import regions as R
from openipu.poplar import sets as _sets
from openipu.poplar import structure_cache as SC
from openipu.poplar.deferred import DeferredValue
from openipu.poplar.exchange import Boxes
from openipu.poplar.types import as_type
from openipu.poplibs.poplin import plan as planmod
from openipu.poplibs.poplin.params import ConvParams


def _ceil(a, b):
    return -(-a // b)


@dataclass(frozen=True)
class Layout:
    """Block sizes of a plan for one problem (elements)."""

    G: int
    N: int
    Ci: int
    Co: int
    out_rows: int
    gB: int
    nB: int
    fB: int
    ciB: int
    coB: int
    coS: int

    @staticmethod
    def of(params: ConvParams, plan: planmod.ConvPlan) -> "Layout":
        G, N = params.numConvGroups, params.batchSize
        Ci, Co = params.inputChannelsPerConvGroup, params.outputChannelsPerConvGroup
        rows = params._strided_size(0)
        nB, coB = _ceil(N, plan.batch_split), _ceil(Co, plan.out_chan_split)
        return Layout(G, N, Ci, Co, rows, _ceil(G, plan.group_split), nB, _ceil(rows, plan.field_split),
                      _ceil(Ci, plan.in_chan_split), coB, _ceil(coB, plan.out_chan_serial))


def tile_index(plan, g, b, f, o, i):
    """Local tile of block (g, b, f, o, i) (numpy arrays broadcast), as int32 (a tile number, and
    every partial sum of one, is below the plan's tile count). The order is PopLibs'
    ``linearizeConvIndices``: conv group outermost, then input channels, batch, field, and the
    output channels innermost, so that the tiles of a supertile (consecutive tile pairs) read the
    same input block when the output-channel split is even."""
    g, b, f, o, i = (np.asarray(v).astype(np.int32, copy=False) for v in (g, b, f, o, i))
    return (((g * int(plan.in_chan_split) + i) * int(plan.batch_split) + b) * int(plan.field_split) + f) \
        * int(plan.out_chan_split) + o


def input_row_ranges(params: ConvParams, plan, lay: Layout):
    """For each field block j: the half-open range ``[lo_j, hi_j)`` of input rows (first field
    dimension, untransformed coordinates) its output rows need."""
    it, ot = params.inputTransform, params.outputTransform
    j = np.arange(plan.field_split)
    o0 = np.minimum(j * lay.fB, lay.out_rows)
    o1 = np.minimum((j + 1) * lay.fB, lay.out_rows)
    s, tl = ot.stride[0], ot.truncationLower[0]
    keff = params.getTransformedKernelSize(0)
    u0 = o0 * s + tl
    u1 = (o1 - 1) * s + tl + keff - 1          # inclusive, transformed-input coordinates
    lt = params.getTransformedInputSize(0)
    if it.flip[0]:
        u0, u1 = lt - 1 - u1, lt - 1 - u0
    dil = it.dilation[0]
    trunc = params.getTruncatedInputSize(0)
    ld = (trunc - 1) * dil + 1
    a = np.clip(u0 - it.paddingLower[0], 0, ld)
    b = np.clip(u1 - it.paddingLower[0], -1, ld - 1)
    lo = -(-a // dil) + it.truncationLower[0]
    hi = b // dil + 1 + it.truncationLower[0]
    empty = (o1 <= o0) | (hi <= lo)
    return np.where(empty, 0, lo), np.where(empty, 0, hi)


def _primary_block(rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The field block that holds each input row in a plan-made layout (the first whose range
    contains it, else the nearest). Non-decreasing in the row."""
    lo_eff = np.where(hi > lo, lo, np.iinfo(np.int64).max)
    j = np.searchsorted(np.minimum.accumulate(lo_eff[::-1])[::-1], rows, side="right") - 1
    return np.clip(j, 0, lo.size - 1)


# --------------------------------------------------------------------------------------------
# layouts as boxes
#
# Every layout below is a set of boxes of a canonical index space, each on one (local) tile:
# one box per (work block, share of the block), a few more where a share's flat range of the
# block is not a box. Host work follows the number of blocks, never the number of elements.
# Per-row arrays over the first field dimension (bounded by an image's height) are the only
# arrays indexed by coordinates.
# --------------------------------------------------------------------------------------------
def _runs(values: np.ndarray):
    """Runs of equal values of a 1-D array: ``(value, begin, end)`` per run."""
    values = np.asarray(values)
    if values.size == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    b = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    return values[b].astype(np.int64), b.astype(np.int64), np.append(b[1:], values.size).astype(np.int64)


def _share_boxes(parts: int, radices):
    """The elements of a row-major block of ``radices`` that share ``p`` of ``parts`` takes when
    element ``q`` (flat index) goes to ``q * parts // L`` (``L`` = the block's size), as boxes:
    ``(share, lo, sz)`` (``[k]``, ``[k, len(radices)]``). Share ``p`` is the flat range
    ``[ceil(p L / parts), ceil((p + 1) L / parts))``: at most ``2 d - 1`` boxes each."""
    L = int(np.prod(radices, dtype=np.int64))
    p = np.arange(parts, dtype=np.int64)
    u, v = -(-p * L // parts), -(-(p + 1) * L // parts)
    owner, lo, sz = R.range_boxes(u, v, radices)
    return p[owner], lo, sz


def _cross(*sizes):
    """Flat index arrays of the cartesian product of ``range(s)`` for each size (row-major)."""
    grids = np.meshgrid(*[np.arange(int(s), dtype=np.int64) for s in sizes], indexing="ij")
    return [g_.reshape(-1) for g_ in grids]


def _memo_boxes(fn):
    """``fn(params, plan, lay)`` -> ``(lo, sz, tile)`` memoised on the problem, the plan and the
    layout (in the structure memo, :mod:`openipu.poplar.structure_cache`; read-only arrays), so
    identical layers (a transformer's query, key and value weights, its six encoder layers) lay
    out their operands once."""

    @functools.wraps(fn)
    def boxes(params: ConvParams, plan, lay: Layout):
        if not SC.enabled():
            return fn(params, plan, lay)
        key = repr((fn.__name__, params.key(), plan, lay)).encode()
        hit = SC.MEMO.get(key)
        if hit is None:
            hit = tuple(fn(params, plan, lay))
            for a in hit:
                a.setflags(write=False)
            SC.MEMO.put(key, hit)
        return hit

    return boxes


def _blocks(n: int, b: int):
    """Blocks of ``b`` over ``range(n)``: ``(start, size)`` arrays (the last one may be short)."""
    if n <= 0 or b <= 0:
        z = np.zeros(0, np.int64)
        return z, z
    start = np.arange(-(-n // b), dtype=np.int64) * b
    return start, np.minimum(b, n - start)


def _input_blocks(params: ConvParams, plan, lay: Layout):
    """The input's work blocks, disjoint: ``gB x nB x ciB x`` (the rows whose primary field block
    is ``f``) ``x rest``. Returns ``(lo, sz, GB, NB, CB, f)`` (``lo``, ``sz``: ``[k, 5]`` boxes
    of the canonical input ``[G, N, Ci, F0, rest]``; then each block's indices)."""
    F0 = params.inputFieldShape[0]
    rest = int(np.prod(params.inputFieldShape[1:], dtype=np.int64))
    lo_r, hi_r = input_row_ranges(params, plan, lay)
    f_id, r0, r1 = _runs(_primary_block(np.arange(F0), lo_r, hi_r))
    g0, gs = _blocks(lay.G, lay.gB)
    n0, ns = _blocks(lay.N, lay.nB)
    c0, cs = _blocks(lay.Ci, lay.ciB)
    GB, NB, CB, FR = _cross(g0.size, n0.size, c0.size, f_id.size)
    lo = np.stack([g0[GB], n0[NB], c0[CB], r0[FR], np.zeros_like(GB)], axis=1)
    sz = np.stack([gs[GB], ns[NB], cs[CB], r1[FR] - r0[FR], np.full_like(GB, rest)], axis=1)
    return lo, sz, GB, NB, CB, f_id[FR]


@_memo_boxes
def input_boxes(params: ConvParams, plan, lay: Layout):
    """The layout the plan wants for the canonical input ``[G, N, Ci, F0, rest]`` (``rest``: the
    other field dims flattened), as boxes: ``(lo, sz, local tile)`` (``createInput``).

    Each input block (:func:`_input_blocks`: the rows a field block reads first) is cut into
    ``outChanSplit`` shares of consecutive elements (:func:`_block_shares`), share ``o`` on
    ``tile_index(g // gB, n // nB, f, o, c // ciB)``: a block is spread over the out-channel
    tiles that read it, each holding one interval of it as :func:`create_input` stores it."""
    b_lo, b_sz, GB, NB, CB, F = _input_blocks(params, plan, lay)
    blk, share, lo, sz = _block_shares(int(plan.out_chan_split), b_lo, b_sz)
    tile = tile_index(plan, GB[blk], NB[blk], F[blk], share, CB[blk])
    keep = (sz > 0).all(axis=1)
    return lo[keep], sz[keep], tile[keep]


@_memo_boxes
def weight_boxes(params: ConvParams, plan, lay: Layout):
    """The layout of the canonical weights ``[G, Co, Ci, K]`` (``K``: the kernel flattened) as
    boxes ``(lo, sz, local tile)`` (``createWeights``): each block ``gB x coB x ciB x K`` is cut
    into ``batchSplit x fieldSplit`` shares of consecutive elements (:func:`_block_shares`),
    share ``h`` on ``tile_index(g // gB, h // fieldSplit, h % fieldSplit, co // coB, c // ciB)``:
    a block is spread over the batch x field tiles that read it. With an output-channel serial
    split, each serial slice (``coS`` channels) of a block is a block of its own, so every slice
    is laid out as the slice problem's weights."""
    K = int(np.prod(params.kernelShape, dtype=np.int64))
    fs = int(plan.field_split)
    g0, gs = _blocks(lay.G, lay.gB)
    o0, os_ = _blocks(lay.Co, lay.coS)
    c0, cs = _blocks(lay.Ci, lay.ciB)
    GB, OB, CB = _cross(g0.size, o0.size, c0.size)
    b_lo = np.stack([g0[GB], o0[OB], c0[CB], np.zeros_like(GB)], axis=1)
    b_sz = np.stack([gs[GB], os_[OB], cs[CB], np.full_like(GB, K)], axis=1)
    blk, h, lo, sz = _block_shares(int(plan.batch_split) * fs, b_lo, b_sz)
    tile = tile_index(plan, GB[blk], h // fs, h % fs, OB[blk] // int(plan.out_chan_serial), CB[blk])
    keep = (sz > 0).all(axis=1)
    return lo[keep], sz[keep], tile[keep]


def _out_row_runs(params: ConvParams, lay: Layout):
    """Runs of output rows (first output field dim) by the field block that computes them:
    ``(block, begin, end)``."""
    fo0 = params.getOutputFieldShape()[0]
    row = np.clip(np.arange(fo0) - params.outputTransform.paddingLower[0], 0, max(lay.out_rows - 1, 0))
    return _runs(row // max(lay.fB, 1))


def _block_shares(parts: int, lo: np.ndarray, sz: np.ndarray):
    """Cut each block ``lo``, ``sz`` ``[k, d]`` (stored row-major and contiguously) into ``parts``
    shares of consecutive elements (:func:`_share_boxes` over the block's own sizes, so a short
    edge block is shared as evenly as a full one and every share is one address interval).
    Returns ``(block, share, lo, sz)`` per share box. Host work: one :func:`_share_boxes` per
    distinct block shape (a few), then array ops over the boxes."""
    if lo.shape[0] == 0:
        z = np.zeros(0, np.int64)
        return z, z, lo, sz
    shapes, inv = np.unique(sz, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    blk, shr, blo, bsz = [], [], [], []
    for j, shape in enumerate(shapes):
        members = np.flatnonzero(inv == j)
        sp, slo, ssz = _share_boxes(parts, shape.tolist())
        B, S = _cross(members.size, sp.size)
        blk.append(members[B])
        shr.append(sp[S])
        blo.append(lo[members[B]] + slo[S])
        bsz.append(ssz[S])
    return np.concatenate(blk), np.concatenate(shr), np.concatenate(blo), np.concatenate(bsz)


@_memo_boxes
def output_boxes(params: ConvParams, plan, lay: Layout):
    """The layout of the canonical output ``[G, N, Co, Fo0, rest]`` as boxes ``(lo, sz, local
    tile)``: element ``(g, n, co, row, r)`` lives on the tile that computes it, or with an
    input-channel split on the tile that reduces it: the output block ``gB x nB x coB x`` (rows
    of field block ``f``) ``x rest`` is cut into ``inChanSplit`` shares of consecutive elements
    (:func:`_block_shares`), share ``i`` on ``tile_index(g // gB, n // nB, f, co // coB, i)``. A
    share is one interval of the block as :func:`create_output` stores it, as Poplar's reduction
    gives each tile a contiguous region of the output. Serial slices (``coS`` of an output-channel
    block) are blocks of their own, laid out as the slice problem's output."""
    fo = params.getOutputFieldShape()
    rest = int(np.prod(fo[1:], dtype=np.int64))
    f_id, r0, r1 = _out_row_runs(params, lay)
    g0, gs = _blocks(lay.G, lay.gB)
    n0, ns = _blocks(lay.N, lay.nB)
    o0, os_ = _blocks(lay.Co, lay.coS)
    GB, NB, OB, FR = _cross(g0.size, n0.size, o0.size, f_id.size)
    b_lo = np.stack([g0[GB], n0[NB], o0[OB], r0[FR], np.zeros_like(GB)], axis=1)
    b_sz = np.stack([gs[GB], ns[NB], os_[OB], r1[FR] - r0[FR], np.full_like(GB, rest)], axis=1)
    blk, share, lo, sz = _block_shares(int(plan.in_chan_split), b_lo, b_sz)
    tile = tile_index(plan, GB[blk], NB[blk], f_id[FR[blk]], OB[blk] // int(plan.out_chan_serial), share)
    keep = (sz > 0).all(axis=1)
    return lo[keep], sz[keep], tile[keep]


def blocked_runs(t, edges, boxes: Boxes, slabs: int = 1):
    """The runs of consecutive addresses that ``boxes`` cover in ``t``, a tensor
    :func:`blocked_tensor` made from the grid ``edges`` (one piece per grid cell, each stored
    row-major), when every box lies inside one cell, in closed form: each box's address lattice
    comes from its cell's piece (a few passes over the pieces and the boxes), not from
    intersecting the boxes with the pieces (:func:`exchange.lattices`).

    ``slabs`` > 1: ``edges[0]`` cuts dim 0 into ``slabs`` slabs of one index (a reduction's
    partials ``[inChanSplit, ...]``), ``boxes`` are boxes of slab 0 and the runs are those of
    every slab, slab by slab: slab ``i``'s are slab 0's moved by ``i`` slab sizes, computed once
    (the slabs must be stored in order, as a blocked tensor without serial order stores them).

    Returns ``(variable id, start, length, tile)`` (absolute addresses; per run, ordered by box,
    then address, as :func:`regions.address_runs` of the boxes' lattices orders them; empty boxes
    give none), or None when ``t`` or the boxes are not of that form. Memoised on the grid, the
    pieces relative to their variable and the boxes (:mod:`openipu.poplar.structure_cache`), so
    the weights of identical layers find their runs once."""
    p = t.pieces
    d = len(edges)
    if len(p) == 0 or len(boxes) == 0 or t.rank() != d or slabs < 1:
        return None
    var = p.var
    if not (var == var[0]).all():
        return None
    v = int(var[0])
    v_start = t._state.variables[v].start
    if not SC.enabled():
        runs = _blocked_runs(t, edges, boxes, slabs)
    else:
        key = b"".join([b"blocked_runs", np.array([d, slabs, t._state.variables[v].numel], np.int64).tobytes(),
                        *SC.array_bytes(*edges, p.addr - v_start, p.lo, p.sz, np.broadcast_to(p.st, p.sz.shape),
                                        boxes.lo, boxes.sz)])
        hit = SC.MEMO.get(key)
        if hit is None:
            runs = _blocked_runs(t, edges, boxes, slabs)
            SC.MEMO.put(key, (None,) if runs is None else (runs[0] - v_start, runs[1], runs[2]))
        else:
            runs = None if hit[0] is None else (hit[0] + v_start, hit[1].copy(), hit[2])
    if runs is None:
        return None
    start, length, box = runs
    tiles = np.asarray(boxes.tile, np.int64)[box]
    if slabs > 1:
        numel = t._state.variables[v].numel
        start = (start[None, :] + np.arange(slabs, dtype=np.int64)[:, None] * (numel // slabs)).reshape(-1)
        length, tiles = np.tile(length, slabs), np.tile(tiles, slabs)
    return v, start, length, tiles


def _blocked_runs(t, edges, boxes: Boxes, slabs: int):
    """:func:`blocked_runs` without the memo and the slabs' repetition: ``(start, length, box)``
    per run of slab 0 (``box``: the index of its box), or None. ``t`` is one variable's view of
    rank ``len(edges)`` and there are boxes (:func:`blocked_runs` checked)."""
    p = t.pieces
    d = len(edges)
    edges = [np.asarray(e, np.int64) for e in edges]
    counts = [e.size - 1 for e in edges]
    if slabs > 1 and not np.array_equal(edges[0], np.arange(slabs + 1)):
        return None
    plo, psz = p.lo, p.sz
    pc = [np.searchsorted(edges[j], plo[:, j], side="right") - 1 for j in range(d)]
    if any(((c < 0) | (c >= n_)).any() for c, n_ in zip(pc, counts)):
        return None
    total = math.prod(counts)
    # the pieces must be the cells: one per cell, at its corner, of its size
    if len(p) != total or not all((plo[:, j] == edges[j][pc[j]]).all() and
                                  (psz[:, j] == edges[j][pc[j] + 1] - edges[j][pc[j]]).all() for j in range(d)):
        return None
    piece_of = np.full(total, -1, np.int64)
    piece_of[np.ravel_multi_index(pc, counts)] = np.arange(len(p), dtype=np.int64)
    if (piece_of < 0).any():
        return None
    v = int(p.var[0])
    numel = t._state.variables[v].numel
    slab_size = numel // slabs
    if slabs > 1:      # slab i's cells stored as slab 0's, i slab sizes later
        a = p.addr[piece_of].reshape(slabs, -1)
        if numel % slabs or not (a - a[:1] == np.arange(slabs, dtype=np.int64)[:, None] * slab_size).all():
            return None
    lo, sz = np.asarray(boxes.lo, np.int64), np.asarray(boxes.sz, np.int64)
    if lo.shape[1] != d or slabs > 1 and ((lo[:, 0] != 0) | (sz[:, 0] != 1)).any():
        return None
    keep = np.flatnonzero((sz > 0).all(axis=1))
    lo, sz = lo[keep], sz[keep]
    bc = [np.searchsorted(edges[j], lo[:, j], side="right") - 1 for j in range(d)]
    for j in range(d):
        c = bc[j]
        if ((c < 0) | (c >= counts[j])).any() or (lo[:, j] + sz[:, j] > edges[j][np.minimum(c + 1, counts[j])]).any():
            return None          # a box outside the tensor or over a cell boundary
    pi = piece_of[np.ravel_multi_index(bc, counts)]
    st = p.st[pi]
    owner, start, length = R._address_runs(p.addr[pi] + ((lo - plo[pi]) * st).sum(axis=1), sz, st)
    if owner.size == 0:
        return None
    return start, length, keep[owner]


def set_tile_boxes(graph, t, lo: np.ndarray, sz: np.ndarray, local_tiles: np.ndarray, edges=None) -> None:
    """Map boxes ``lo``, ``sz`` ``[k, rank]`` of the view ``t`` to local tiles ``local_tiles``
    ``[k]`` (disjoint boxes): each box is laid over ``t``'s pieces and mapped as the runs of
    consecutive addresses it covers (a box whose inner dim is contiguous in memory costs one run
    per row of its other dims). ``edges``: the grid ``t`` was made from by :func:`blocked_tensor`,
    whose runs are then found in closed form (:func:`blocked_runs`) when every box lies inside
    one of its blocks. Host work follows boxes and runs, never elements."""
    if lo.shape[0] == 0:
        return
    boxes = Boxes(lo, sz, graph._global_tiles(np.asarray(local_tiles, np.int64)).astype(np.int64))
    runs = blocked_runs(t, edges, boxes) if edges is not None else None
    if runs is None:
        graph.set_tile_boxes(t, boxes)
        return
    v, start, length, tiles = runs
    graph._assign_address_runs(t, np.array([v], np.int64), start, length, tiles)


def blocked_tensor(graph, type_, edges, name: str, value=None, serial=None):
    """A new tensor cut by ``edges`` (per dim, see :func:`regions.grid_cells`) into blocks that
    each occupy consecutive addresses, as Poplar's convolution and matmul creators store a tile's
    block contiguously (grouped layouts), so a block, or a tile's share of it, is read or mapped
    as one interval. Blocks are stored in row-major order of their positions, or, with
    ``serial`` (a function of the blocks' ``lo`` ``[k, rank]`` giving each block's serial slice),
    slice by slice (stably), so that every serial slice of the tensor is one interval of memory
    laid out as the slice problem's tensor. ``value`` (array of the tensor's shape): a
    constant's value, stored block by block when the constant is first read (device storage,
    saving; an offline compile never places it), so the caller must not change it afterwards;
    otherwise a variable. Host work: one scatter of the elements, when placed."""
    shape = [int(e[-1]) for e in edges]
    lo, sz = R.grid_cells(edges)
    if serial is not None:
        order = np.argsort(serial(lo), kind="stable")
        lo, sz = lo[order], sz[order]
    mem = None
    if value is not None:
        value = np.asarray(value).reshape(shape)
        edges, t = tuple(np.array(e, np.int64) for e in edges), as_type(type_)
        if value.dtype.kind in "fiub" and value.dtype.itemsize <= t.size:
            mem = DeferredValue(lambda: _placed(t, value, edges, lo, sz), value.size)
        else:       # a wider host array than the storage: placed now rather than kept
            mem = _placed(t, value, edges, lo, sz)
    return graph.add_blocks(type_, shape, lo, sz, name, mem)


def _placed(t, value: np.ndarray, edges, lo: np.ndarray, sz: np.ndarray) -> np.ndarray:
    """``value`` (the tensor's shape) flat in the storage order of the blocks ``lo``, ``sz``; a
    float value for a float16 / float32 type already in that dtype (one cast, rounding to nearest
    even, as ``addConstant``)."""
    dt = value.dtype
    if t.is_float and dt.kind == "f" and t.numpy_dtype in (np.float16, np.float32):
        dt = t.numpy_dtype
    mem = np.empty(value.size, dt)
    mem[_block_order(edges, lo, sz)] = value.reshape(-1)
    return mem


def _block_order(edges, lo: np.ndarray, sz: np.ndarray) -> np.ndarray:
    """Where each element (row-major over the tensor) goes when the blocks ``lo``, ``sz``
    ``[k, d]`` (the non-empty cells of the grid ``edges``, in storage order) are stored one after
    the other, each row-major inside: int32 ``[numel]`` (int64 from 2**31 elements), read-only.
    Host work: a few passes over the elements, none per block; memoised on the grid and the block
    order (:mod:`openipu.poplar.structure_cache`), so the weights of identical layers compute it
    once."""
    edges = [np.asarray(e, np.int64) for e in edges]
    if not SC.enabled():
        return _compute_block_order(edges, lo, sz)
    key = b"".join([b"block_order", np.int64(len(edges)).tobytes(), *SC.array_bytes(*edges, lo, sz)])
    hit = SC.MEMO.get(key)
    if hit is None:
        hit = (_compute_block_order(edges, lo, sz),)
        SC.MEMO.put(key, hit)
    return hit[0]


def _compute_block_order(edges, lo: np.ndarray, sz: np.ndarray) -> np.ndarray:
    """:func:`_block_order` without the memo (``edges``: int64 arrays)."""
    d = len(edges)
    counts = [e.size - 1 for e in edges]
    cell = np.ravel_multi_index([np.searchsorted(edges[j], lo[:, j], side="right") - 1 for j in range(d)], counts)
    nel = np.prod(sz, axis=1, dtype=np.int64)
    start = np.zeros(math.prod(counts), np.int64)
    start[cell] = np.cumsum(nel) - nel
    inner = np.ones((math.prod(counts), d), np.int64)      # row-major strides inside each block
    for j in range(d - 2, -1, -1):
        inner[cell, j] = inner[cell, j + 1] * sz[:, j + 1]
    dest = None
    cell_of = None
    for j, e in enumerate(edges):
        i = np.arange(int(e[-1]), dtype=np.int64)
        c = np.searchsorted(e, i, side="right") - 1
        bshape = [1] * d
        bshape[j] = i.size
        c = c.reshape(bshape)
        cell_of = c if cell_of is None else cell_of * counts[j] + c
    for j, e in enumerate(edges):
        i = np.arange(int(e[-1]), dtype=np.int64)
        off = i - e[np.searchsorted(e, i, side="right") - 1]
        bshape = [1] * d
        bshape[j] = i.size
        term = off.reshape(bshape) * inner[cell_of, j]
        dest = term if dest is None else dest + term
    out = (start[cell_of] + dest).reshape(-1)
    return out.astype(np.int32) if out.size < (1 << 31) else out


def create_weights(graph, type_, params: ConvParams, plan, name: str, value=None, lay: Layout | None = None):
    """The canonical weights ``[G, Co, Ci, K]`` (``K``: the kernel flattened) as ``createWeights``
    lays them out: one block of ``gB x coB x ciB x K`` per work block, stored contiguously and
    mapped over the tiles that share it (:func:`weight_boxes`); with an output-channel serial
    split, stored slice by slice (:func:`blocked_tensor`). ``value``: a constant's value in that
    shape. openipu's creator behind ``createWeights`` and ``createMatMulInputRHS``."""
    lay = lay or Layout.of(params, plan)
    K = int(np.prod(params.kernelShape, dtype=np.int64))
    edges = [np.r_[0:lay.G:lay.gB, lay.G], np.r_[0:lay.Co:lay.coS, lay.Co], np.r_[0:lay.Ci:lay.ciB, lay.Ci],
             np.array([0, K])]
    w = blocked_tensor(graph, type_, edges, name, value, lambda lo: (lo[:, 1] // lay.coS) % plan.out_chan_serial)
    set_tile_boxes(graph, w, *weight_boxes(params, plan, lay), edges=edges)
    return w


def create_output(graph, type_, params: ConvParams, plan, name: str, lay: Layout | None = None):
    """The canonical output ``[G, N, Co, *outField]`` as the plan produces it: stored block by
    block (``gB x nB x coB x`` field block, each contiguous, as Poplar's output layout keeps a
    tile's results together; with serial splits, slice by slice), mapped by :func:`output_boxes`."""
    lay = lay or Layout.of(params, plan)
    fo = params.getOutputFieldShape()
    _, r0, r1 = _out_row_runs(params, lay)
    edges = [np.r_[0:lay.G:lay.gB, lay.G], np.r_[0:lay.N:lay.nB, lay.N], np.r_[0:lay.Co:lay.coS, lay.Co],
             _sets.unique(np.r_[0, r0, r1, fo[0]])] + [np.array([0, s_]) for s_ in fo[1:]]
    out = blocked_tensor(graph, type_, edges, name, serial=lambda lo: (lo[:, 2] // lay.coS) % plan.out_chan_serial)
    o_rest = int(np.prod(fo[1:], dtype=np.int64))
    set_tile_boxes(graph, out.reshape([lay.G, lay.N, lay.Co, fo[0], o_rest]), *output_boxes(params, plan, lay),
                   edges=edges[:4] + [np.array([0, o_rest])])
    return out


def create_input(graph, type_, params: ConvParams, plan, name: str, lay: Layout | None = None):
    """The canonical input ``[G, N, Ci, *field]`` as ``createInput`` lays it out: stored block by
    block (:func:`_input_blocks`, each contiguous) and mapped by :func:`input_boxes`."""
    lay = lay or Layout.of(params, plan)
    b_lo, b_sz, *_ = _input_blocks(params, plan, lay)
    shape = [lay.G, lay.N, lay.Ci, params.inputFieldShape[0], int(np.prod(params.inputFieldShape[1:], dtype=np.int64))]
    x = graph.add_blocks(type_, shape, b_lo, b_sz, name)
    grid = [_sets.unique(np.r_[b_lo[:, j], b_lo[:, j] + b_sz[:, j]]) for j in range(len(shape))]
    set_tile_boxes(graph, x, *input_boxes(params, plan, lay), edges=grid)   # the blocks are a grid's cells
    return x.reshape([lay.G, lay.N, lay.Ci, *params.inputFieldShape])


def map_weights(graph, w, params: ConvParams, plan, lay: Layout | None = None) -> None:
    """Map the canonical weights view ``w`` ``[G, Co, Ci, *kernel]`` as the plan lays it out."""
    lay = lay or Layout.of(params, plan)
    w4 = w.reshape([lay.G, lay.Co, lay.Ci, int(np.prod(params.kernelShape, dtype=np.int64))])
    set_tile_boxes(graph, w4, *weight_boxes(params, plan, lay))


def map_output(graph, out, params: ConvParams, plan, lay: Layout | None = None) -> None:
    """Map the canonical output view ``out`` ``[G, N, Co, *outField]`` as the plan produces it."""
    lay = lay or Layout.of(params, plan)
    fo = params.getOutputFieldShape()
    o5 = out.reshape([lay.G, lay.N, lay.Co, fo[0], int(np.prod(fo[1:], dtype=np.int64))])
    set_tile_boxes(graph, o5, *output_boxes(params, plan, lay))




def _register_records():
    from openipu.poplar.graph_codec import data_class
    data_class(Layout)


_register_records()
