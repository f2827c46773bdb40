"""Building a planned convolution into the graph: tile layout, vertex groups, torch kernels.

Shared by :mod:`matmul` and :mod:`convolution`. Tensors here are in the *canonical* layout:
input ``[G, N, Ci, *inField]``, weights ``[G, Co, Ci, *kernel]``, output ``[G, N, Co, *outField]``
(views of the caller's tensors, so no data moves to get there).

Tile of a work block: ``(((g * batchSplit + b) * fieldSplit + f) * outChanSplit + o) * inChanSplit + i``
(local tile numbers; input-channel partners are neighbours). A step is one compute set of
partial-sum vertices (one per tile), followed, when input channels are split, by one compute set
of reduce vertices.

Serial splits are a loop, as PopLibs' ``ConvProgramTree`` runs them: ``Repeat`` over the serial
index of one compute-set group for a slice of the problem (a ``batchSplit.serial``-th of the batch
or an ``outChanSplit.serial``-th of the output channels), which ``popops::dynamicSlice`` copies the
operand's slice into and ``popops::dynamicUpdate`` copies the slice's result out of. The tensors
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

import contextlib
import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from openipu import poplar
from openipu.poplar import quarter
from openipu.poplar import regions as R
from openipu.poplar.exchange import Boxes, lattices, tile_boxes
from openipu.poplar.graph import Access, VertexGroup, box_tile_runs
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops import dynamic_slice as dslice
from openipu.poplibs.popops.loop import countedLoop
from openipu.poplibs.poplin import plan as planmod
from openipu.poplibs.poplin.params import ConvParams

#: Vertex state bytes of a partial-sum vertex (worklists, pointers). [A]
PARTIALS_VERTEX_STATE_BYTES = 96
#: Vertex state bytes of a reduce vertex. [A]
REDUCE_VERTEX_STATE_BYTES = 32


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
    nS: int
    coS: int

    @staticmethod
    def of(params: ConvParams, plan: planmod.ConvPlan) -> "Layout":
        G, N = params.numConvGroups, params.batchSize
        Ci, Co = params.inputChannelsPerConvGroup, params.outputChannelsPerConvGroup
        rows = params._strided_size(0)
        nB, coB = _ceil(N, plan.batch_split), _ceil(Co, plan.out_chan_split)
        return Layout(G, N, Ci, Co, rows, _ceil(G, plan.group_split), nB, _ceil(rows, plan.field_split),
                      _ceil(Ci, plan.in_chan_split), coB, _ceil(nB, plan.batch_serial), _ceil(coB, plan.out_chan_serial))


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


def _blocks(n: int, b: int):
    """Blocks of ``b`` over ``range(n)``: ``(start, size)`` arrays (the last one may be short)."""
    if n <= 0 or b <= 0:
        z = np.zeros(0, np.int64)
        return z, z
    start = np.arange(-(-n // b), dtype=np.int64) * b
    return start, np.minimum(b, n - start)


def _input_blocks(params: ConvParams, plan, lay: Layout):
    """The input's work blocks, disjoint: ``gB x nS x ciB x`` (the rows whose primary field block
    is ``f``) ``x rest`` (``nS``: a serial slice of a batch block, the whole block without a
    batch serial split). Returns ``(lo, sz, GB, NB, CB, f)`` (``lo``, ``sz``: ``[k, 5]`` boxes
    of the canonical input ``[G, N, Ci, F0, rest]``; then each block's indices)."""
    F0 = params.inputFieldShape[0]
    rest = int(np.prod(params.inputFieldShape[1:], dtype=np.int64))
    lo_r, hi_r = input_row_ranges(params, plan, lay)
    f_id, r0, r1 = _runs(_primary_block(np.arange(F0), lo_r, hi_r))
    g0, gs = _blocks(lay.G, lay.gB)
    n0, ns = _blocks(lay.N, lay.nS)            # serial slices of the batch blocks
    c0, cs = _blocks(lay.Ci, lay.ciB)
    GB, NB, CB, FR = _cross(g0.size, n0.size, c0.size, f_id.size)
    lo = np.stack([g0[GB], n0[NB], c0[CB], r0[FR], np.zeros_like(GB)], axis=1)
    sz = np.stack([gs[GB], ns[NB], cs[CB], r1[FR] - r0[FR], np.full_like(GB, rest)], axis=1)
    return lo, sz, GB, NB // int(plan.batch_serial), CB, f_id[FR]


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


def output_boxes(params: ConvParams, plan, lay: Layout):
    """The layout of the canonical output ``[G, N, Co, Fo0, rest]`` as boxes ``(lo, sz, local
    tile)``: element ``(g, n, co, row, r)`` lives on the tile that computes it, or with an
    input-channel split on the tile that reduces it: the output block ``gB x nB x coB x`` (rows
    of field block ``f``) ``x rest`` is cut into ``inChanSplit`` shares of consecutive elements
    (:func:`_block_shares`), share ``i`` on ``tile_index(g // gB, n // nB, f, co // coB, i)``. A
    share is one interval of the block as :func:`create_output` stores it, as Poplar's reduction
    gives each tile a contiguous region of the output. Serial slices (``nS`` of a batch block,
    ``coS`` of an output-channel block) are blocks of their own, laid out as the slice problem's
    output."""
    fo = params.getOutputFieldShape()
    rest = int(np.prod(fo[1:], dtype=np.int64))
    f_id, r0, r1 = _out_row_runs(params, lay)
    g0, gs = _blocks(lay.G, lay.gB)
    n0, ns = _blocks(lay.N, lay.nS)
    o0, os_ = _blocks(lay.Co, lay.coS)
    GB, NB, OB, FR = _cross(g0.size, n0.size, o0.size, f_id.size)
    b_lo = np.stack([g0[GB], n0[NB], o0[OB], r0[FR], np.zeros_like(GB)], axis=1)
    b_sz = np.stack([gs[GB], ns[NB], os_[OB], r1[FR] - r0[FR], np.full_like(GB, rest)], axis=1)
    blk, share, lo, sz = _block_shares(int(plan.in_chan_split), b_lo, b_sz)
    tile = tile_index(plan, GB[blk], NB[blk] // int(plan.batch_serial), f_id[FR[blk]],
                      OB[blk] // int(plan.out_chan_serial), share)
    keep = (sz > 0).all(axis=1)
    return lo[keep], sz[keep], tile[keep]


def set_tile_boxes(graph, t, lo: np.ndarray, sz: np.ndarray, local_tiles: np.ndarray) -> None:
    """Map boxes ``lo``, ``sz`` ``[k, rank]`` of the view ``t`` to local tiles ``local_tiles``
    ``[k]`` (disjoint boxes): each box is laid over ``t``'s pieces and mapped as the runs of
    consecutive addresses it covers (a box whose inner dim is contiguous in memory costs one run
    per row of its other dims). Host work follows boxes and runs, never elements."""
    if lo.shape[0] == 0:
        return
    graph.set_tile_boxes(t, Boxes(lo, sz, graph._global_tiles(np.asarray(local_tiles, np.int64)).astype(np.int64)))


def blocked_tensor(graph, type_, edges, name: str, value=None, serial=None):
    """A new tensor cut by ``edges`` (per dim, see :func:`regions.grid_cells`) into blocks that
    each occupy consecutive addresses, as Poplar's convolution and matmul creators store a tile's
    block contiguously (grouped layouts), so a block, or a tile's share of it, is read or mapped
    as one interval. Blocks are stored in row-major order of their positions, or, with
    ``serial`` (a function of the blocks' ``lo`` ``[k, rank]`` giving each block's serial slice),
    slice by slice (stably), so that every serial slice of the tensor is one interval of memory
    laid out as the slice problem's tensor. ``value`` (array of the tensor's shape): a
    constant's value, stored block by block; otherwise a variable. Host work: one copy per block."""
    shape = [int(e[-1]) for e in edges]
    lo, sz = R.grid_cells(edges)
    if serial is not None:
        order = np.argsort(serial(lo), kind="stable")
        lo, sz = lo[order], sz[order]
    mem = None
    if value is not None:
        value = np.asarray(value).reshape(shape)
        mem = np.empty(math.prod(shape), value.dtype)
        mem[_block_order(edges, lo, sz)] = value.reshape(-1)
    return graph.add_blocks(type_, shape, lo, sz, name, mem)


def _block_order(edges, lo: np.ndarray, sz: np.ndarray) -> np.ndarray:
    """Where each element (row-major over the tensor) goes when the blocks ``lo``, ``sz``
    ``[k, d]`` (the non-empty cells of the grid ``edges``, in storage order) are stored one after
    the other, each row-major inside: int64 ``[numel]``. Host work: a few passes over the
    elements, none per block."""
    edges = [np.asarray(e, np.int64) for e in edges]
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
    return (start[cell_of] + dest).reshape(-1)


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
    set_tile_boxes(graph, w, *weight_boxes(params, plan, lay))
    return w


def create_output(graph, type_, params: ConvParams, plan, name: str, lay: Layout | None = None):
    """The canonical output ``[G, N, Co, *outField]`` as the plan produces it: stored block by
    block (``gB x nB x coB x`` field block, each contiguous, as Poplar's output layout keeps a
    tile's results together; with serial splits, slice by slice), mapped by :func:`output_boxes`."""
    lay = lay or Layout.of(params, plan)
    fo = params.getOutputFieldShape()
    _, r0, r1 = _out_row_runs(params, lay)
    edges = [np.r_[0:lay.G:lay.gB, lay.G], np.r_[0:lay.N:lay.nS, lay.N], np.r_[0:lay.Co:lay.coS, lay.Co],
             np.unique(np.r_[0, r0, r1, fo[0]])] + [np.array([0, s_]) for s_ in fo[1:]]
    out = blocked_tensor(graph, type_, edges, name, serial=lambda lo: (
        (lo[:, 1] // lay.nS) % plan.batch_serial * plan.out_chan_serial + (lo[:, 2] // lay.coS) % plan.out_chan_serial))
    o_rest = int(np.prod(fo[1:], dtype=np.int64))
    set_tile_boxes(graph, out.reshape([lay.G, lay.N, lay.Co, fo[0], o_rest]), *output_boxes(params, plan, lay))
    return out


def create_input(graph, type_, params: ConvParams, plan, name: str, lay: Layout | None = None):
    """The canonical input ``[G, N, Ci, *field]`` as ``createInput`` lays it out: stored block by
    block (:func:`_input_blocks`, each contiguous; with a batch serial split, slice by slice) and
    mapped by :func:`input_boxes`."""
    lay = lay or Layout.of(params, plan)
    b_lo, b_sz, *_ = _input_blocks(params, plan, lay)
    order = np.argsort((b_lo[:, 1] // lay.nS) % plan.batch_serial, kind="stable")     # slice by slice
    shape = [lay.G, lay.N, lay.Ci, params.inputFieldShape[0], int(np.prod(params.inputFieldShape[1:], dtype=np.int64))]
    x = graph.add_blocks(type_, shape, b_lo[order], b_sz[order], name)
    set_tile_boxes(graph, x, *input_boxes(params, plan, lay))
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


# --------------------------------------------------------------------------------------------
# torch kernels
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    """What a partial-sum kernel needs (picklable)."""

    in_t: tuple
    k_t: tuple
    out_t: tuple
    plain: bool                 # 1x1 field and kernel, no transforms: use matmul
    ics: int
    ciB: int
    acc_dtype: str
    write_dtype: str            # the destination's element type name
    macs: int = 0               # multiply-accumulates of the vertex group (host threading)


def _apply_input_transform(x: torch.Tensor, t: tuple, first: int) -> torch.Tensor:
    tl, tu, dil, pl, pu, flip = t
    for d in range(len(tl)):
        ax = first + d
        L = x.shape[ax]
        x = x.narrow(ax, tl[d], L - tl[d] - tu[d])
        if dil[d] > 1 and x.shape[ax] > 0:
            shape = list(x.shape)
            shape[ax] = (x.shape[ax] - 1) * dil[d] + 1
            z = x.new_zeros(shape)
            idx = [slice(None)] * x.dim()
            idx[ax] = slice(None, None, dil[d])
            z[tuple(idx)] = x
            x = z
        if pl[d] or pu[d]:
            shape_l = list(x.shape)
            shape_l[ax] = pl[d]
            shape_u = list(x.shape)
            shape_u[ax] = pu[d]
            x = torch.cat([x.new_zeros(shape_l), x, x.new_zeros(shape_u)], dim=ax)
        if flip[d]:
            x = torch.flip(x, (ax,))
    return x


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

#: Host kernels with less work than this (multiply-accumulates, or elements for a reduction) run
#: on one host thread. Tiny BLAS / oneDNN calls gain little from OpenMP and, when other processes
#: share the host's cores, each parallel region can wait a scheduler time slice for its second
#: thread (measured: 26 ms instead of 0.3 ms per conv of a small ResNet on a loaded 2-core host).
#: The choice depends on the problem's shape only, so results do not depend on the host's load.
HOST_SERIAL_WORK = 1 << 26


@contextlib.contextmanager
def host_threads(work: int):
    """Run the enclosed host kernel on one thread when ``work`` is below :data:`HOST_SERIAL_WORK`."""
    n = torch.get_num_threads()
    if work >= HOST_SERIAL_WORK or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _kernel_taps(X: torch.Tensor, W: torch.Tensor, spec: _Spec):
    """The kernel transform without materialising it: ``W`` truncated and flipped (its taps),
    ``X`` narrowed by the output truncation and by the kernel's padding, so that a convolution
    of the two with dilation ``kernel dilation`` (and the output stride) gives the transformed
    convolution. None when a kernel dimension has no taps left."""
    tl, tu, dil, pl, pu, flip = spec.k_t
    otl, otu = spec.out_t[0], spec.out_t[1]
    for d in range(X.dim() - 4):
        ax = 4 + d
        k = W.shape[ax] - tl[d] - tu[d]
        if k <= 0:
            return None
        W = W.narrow(ax, tl[d], k)
        if flip[d]:
            W = torch.flip(W, (ax,))
        lo, hi = (pu[d], pl[d]) if flip[d] else (pl[d], pu[d])
        X = X.narrow(ax, otl[d] + lo, X.shape[ax] - otl[d] - otu[d] - lo - hi)
    return X, W, tuple(dil)


def _grouped_conv(X, W, R, G, N, Co, ics, ciB, stride, dil):
    """``X[R, G, N, C, *F]``, ``W[R, G, Co, C, *K]`` -> ``[R, ics, G, N, Co, *Fo]``, as one direct
    convolution grouped over ``R * G * ics``."""
    nd = X.dim() - 4
    Xc = X.permute(2, 0, 1, 3, *range(4, 4 + nd)).reshape(N, R * G * ics * ciB, *X.shape[4:])
    Wc = W.reshape(R, G, Co, ics, ciB, *W.shape[4:]).permute(0, 1, 3, 2, 4, *range(5, 5 + nd))
    Wc = Wc.reshape(R * G * ics * Co, ciB, *W.shape[4:])
    Y = _CONV[nd](Xc, Wc, stride=stride, dilation=dil, groups=R * G * ics)
    return Y.reshape(N, R, G, ics, Co, *Y.shape[2:]).permute(1, 3, 2, 0, 4, *range(5, 5 + nd))


def _im2col_conv(X, W, R, G, N, Co, ics, ciB, stride, dil):
    """As :func:`_grouped_conv`, as a batched matmul (one per ``R * G * ics`` group) of the
    input's windows (``[N * Fo, ciB * K]``, gathered as strided views) by the kernel."""
    nd = X.dim() - 4
    k = W.shape[4:]
    Xw = X.reshape(R, G, N, ics, ciB, *X.shape[4:])
    for d in range(nd):
        Xw = Xw.unfold(5 + d, (k[d] - 1) * dil[d] + 1, stride[d])
    if any(v > 1 for v in dil):
        Xw = Xw[(Ellipsis, *[slice(None, None, v) for v in dil])]
    fo = Xw.shape[5:5 + nd]
    rows, cols = N * math.prod(fo), ciB * math.prod(k)
    Xm = Xw.permute(0, 1, 3, 2, *range(5, 5 + nd), 4, *range(5 + nd, 5 + 2 * nd)).reshape(R * G * ics, rows, cols)
    Wm = W.reshape(R, G, Co, ics, ciB, *k).permute(0, 1, 3, 4, *range(5, 5 + nd), 2).reshape(R * G * ics, cols, Co)
    Y = torch.bmm(Xm, Wm)                                              # [R*G*ics, N*Fo, Co]
    return Y.reshape(R, G, ics, N, *fo, Co).permute(0, 2, 1, 3, 4 + nd, *range(4, 4 + nd))


def conv_partials(X: torch.Tensor, W: torch.Tensor, spec: _Spec) -> torch.Tensor:
    """``X[R, G, N, Ci, *F]`` (*) ``W[R, G, Co, Ci, *K]`` -> ``[R, ics, G, N, Co, *Fo]``: partial sums
    over each of ``ics`` blocks of ``ciB`` input channels, in ``spec.acc_dtype``.

    The input transform is applied to the input (dilation as inserted zeros); the kernel's
    dilation and padding are not materialised (:func:`_kernel_taps`), so a weight-update pass
    (the gradient as a dilated kernel) costs its taps only. The product is a direct convolution
    grouped over ``R * G * ics`` where oneDNN does that well (large output fields, dense kernels,
    dilated inputs), else a batched matmul of the input's windows (small fields, 1x1 or dilated
    kernels, many channel groups, fp16): a choice by shape only."""
    acc = getattr(torch, spec.acc_dtype)
    X, W = X.to(acc), W.to(acc)
    R, G, N, Ci = X.shape[:4]
    Co = W.shape[2]
    ics, ciB = spec.ics, spec.ciB
    pad = ics * ciB - Ci
    if spec.plain:
        # Matmuls accumulate fp32 on the host in fp64, so every output element is the correctly
        # rounded dot product whatever the split and the BLAS blocking (identical rows and columns
        # give identical results, as a deterministic IPU would). The IPU accumulates in fp32: its
        # results differ from these by rounding (~1e-7 relative).
        wide = torch.float64 if acc == torch.float32 else acc
        nd = X.dim() - 4           # every field and kernel dim is 1 here
        Xm = F.pad(X.reshape(R, G, N, Ci).to(wide), (0, pad)).reshape(R, G, N, ics, ciB)
        Wm = F.pad(W.reshape(R, G, Co, Ci).to(wide), (0, pad)).reshape(R, G, Co, ics, ciB)
        return torch.einsum("rgnic,rgoic->rigno", Xm, Wm).to(acc).reshape(R, ics, G, N, Co, *([1] * nd))
    nd = X.dim() - 4
    otl, otu, stride, opl, opu = spec.out_t
    stride = tuple(stride)
    X = _apply_input_transform(X, spec.in_t, 4)
    taps = _kernel_taps(X, W, spec)
    if taps is None:               # a kernel dimension truncated away: materialise the transform
        W = _apply_input_transform(W, spec.k_t, 4)
        for d in range(nd):
            X = X.narrow(4 + d, otl[d], X.shape[4 + d] - otl[d] - otu[d])
        dil = (1,) * nd
    else:
        X, W, dil = taps
    if pad:
        X = F.pad(X, [0, 0] * nd + [0, pad])
        W = F.pad(W, [0, 0] * nd + [0, pad])
    k = W.shape[4:]
    fo = [(X.shape[4 + d] - (k[d] - 1) * dil[d] - 1) // stride[d] + 1 for d in range(nd)]
    direct = acc != torch.float16 and (any(v > 1 for v in spec.in_t[2]) or (
        math.prod(k) > 1 and all(v == 1 for v in dil) and N * math.prod(fo) >= 128))
    Y = (_grouped_conv if direct else _im2col_conv)(X, W, R, G, N, Co, ics, ciB, stride, dil)
    if any(opl) or any(opu):
        padding = []
        for d in reversed(range(nd)):
            padding += [opl[d], opu[d]]
        Y = F.pad(Y, padding)
    return Y


@kernel
def _partials_kernel(x, w, dst, spec: _Spec, ctx, metas=None):
    with host_threads(spec.macs):
        X, W = ctx.read(x), ctx.read(w)
        Y = conv_partials(X, W, spec)
        if metas is not None:
            # QUARTER operands: the AMP scales the products by 2**(input scale + weight scale)
            s = [quarter.metadata_scale(ctx, m) for m in metas]
            s = [v for v in s if v is not None]
            Y = quarter.scale_by(Y, sum(s[1:], s[0]))
        if spec.ics == 1:
            Y = Y[:, 0]
        ctx.write(dst, Y.to(poplar.types.type_from_name(spec.write_dtype).torch_dtype))


def _meta_reads(kw: dict, tiles) -> list:
    """The reads of the operands' metadata bytes by the partials vertices (QUARTER)."""
    return [quarter.metadata_access(m, tiles) for m in kw.get("metas", ()) if m is not None]


@kernel
def _reduce_kernel(partials, dst, ctx, work: int = 0):
    with host_threads(work):
        P = ctx.read(partials)
        # fp32 partials are summed in fp64 (see conv_partials): torch's vectorised sum over a
        # strided dimension rounds differently per output position.
        ctx.write(dst, P.to(torch.float64).sum(dim=1) if P.dtype == torch.float32 else P.sum(dim=1))


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
    uv = np.unique(vids)
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
    Host work follows boxes and runs."""
    b, _, tl = graph.tile_runs_of(t)
    tiles = graph._global_tiles(np.asarray(local_tiles, np.int64))
    b2, tl2 = box_tile_runs(lo, sz, tiles, t.shape())
    if not (np.array_equal(b, b2) and np.array_equal(tl, tl2)):
        return False
    _, _, base, T, n, _ = lattices(t, Boxes(lo, sz, tiles.astype(np.int64)))
    return R.address_runs(base, n, T)[0].size == lo.shape[0]


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
    x, x_made = _rearranged(graph, x, [lay.G, lay.N, lay.Ci, params.inputFieldShape[0], rest],
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
    if plan.serial_steps > 1:
        made = x_made if plan.batch_serial > 1 else w_made
        _serial_loop(graph, x, w, out, params, plan, lay, partials_type, out_type, prog, name, made, own_out, metas)
    else:
        _build_step(graph, x, w, out, own_out, params, plan, lay, partials_type, out_type, prog, name, metas)
    return out


def _serial_loop(graph, x, w, out, params: ConvParams, plan, lay: Layout, partials_type, out_type, prog, name: str,
                 src_made: bool, out_made: bool, metas=None):
    """The serial splits of ``plan`` as PopLibs' ``ConvProgramTree`` lowers them: a counted loop
    whose body copies serial slice ``i`` of the operand the split cuts (the input for a batch
    split, the weights for an output-channel split) into a buffer laid out for the slice problem
    (``popops::dynamicSlice``), convolves it (:func:`build` of the slice problem, which loops
    again for a second serial split), and copies the slice's output into ``out``
    (``popops::dynamicUpdate``). The tensors the plan lays out hold every slice where the slice
    problem wants it, so both copies stay on their tiles. ``out`` is marked undefined first
    (``WriteUndef``), so that it is not live before the loop.

    ``src_made`` / ``out_made``: the operand / ``out`` was made here by the creators, which
    store it slice by slice, each slice as the slice problem's creator stores its tensor; the
    copies then slice the variables in memory order (one interval per slice), else the
    tensors' own views (host work follows their pieces)."""
    if plan.batch_serial > 1:
        s, par, piece = int(plan.batch_serial), int(plan.batch_split), lay.nS
        sub_params = params._with(batchSize=par * piece)
        sub_plan = dataclasses.replace(plan, batch_serial=1)
        src, out_dim = x, 1

        def make(n):
            return create_input(graph, x.elementType(), sub_params, sub_plan, n)
    else:
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
        sub_x, sub_w = (buf, w) if src is x else (x, buf)
        y = build(graph, sub_x, sub_w, sub_params, sub_plan, partials_type, out_type, seq, name, metas=metas)
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
    p_edges = [np.arange(ics + 1)] + [np.unique(np.r_[0, a, a + b, n_]) for a, b, n_ in
                                      zip(out_lo[:4], out_sz[:4], p_shape[1:5])] + \
        [np.array([0, n_]) for n_ in p_shape[5:]]
    partials = blocked_tensor(graph, ptype, p_edges, f"{name}/partials")
    ib = np.repeat(np.arange(ics, dtype=np.int64), GB.size)
    pt = tile_index(plan, np.tile(GB, ics), np.tile(NB, ics), np.tile(f_out[FR], ics), np.tile(OB, ics), ib)
    set_tile_boxes(graph, partials, np.stack([ib] + [np.tile(a, ics) for a in out_lo], axis=1),
                   np.stack([np.ones_like(ib)] + [np.tile(a, ics) for a in out_sz], axis=1), pt)
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


def _register_records():
    from openipu.poplar.graph_codec import data_class
    data_class(_Spec)
    data_class(Layout)


_register_records()
