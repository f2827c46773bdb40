"""Building a planned convolution into the graph: tile layout, vertex groups, torch kernels.

Shared by :mod:`matmul` and :mod:`convolution`. Tensors here are in the *canonical* layout:
input ``[G, N, Ci, *inField]``, weights ``[G, Co, Ci, *kernel]``, output ``[G, N, Co, *outField]``
(views of the caller's tensors, so no data moves to get there).

Tile of a work block: ``(((g * batchSplit + b) * fieldSplit + f) * outChanSplit + o) * inChanSplit + i``
(local tile numbers; input-channel partners are neighbours). Each serial step is one compute set
of partial-sum vertices (one per tile), followed, when input channels are split, by one compute
set of reduce vertices; the vertex groups' reads name, per element, the tiles that read it, so the
engine costs the exchange of the input and weight blocks and of the partials.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from openipu import poplar
from openipu.poplar.graph import VertexGroup
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
    every partial sum of one, is below the plan's tile count)."""
    g, b, f, o, i = (np.asarray(v).astype(np.int32, copy=False) for v in (g, b, f, o, i))
    return (((g * int(plan.batch_split) + b) * int(plan.field_split) + f) * int(plan.out_chan_split) + o) \
        * int(plan.in_chan_split) + i


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
    contains it, else the nearest)."""
    lo_eff = np.where(hi > lo, lo, np.iinfo(np.int64).max)
    j = np.searchsorted(np.minimum.accumulate(lo_eff[::-1])[::-1], rows, side="right") - 1
    return np.clip(j, 0, lo.size - 1)


def input_tiles(params: ConvParams, plan, lay: Layout) -> np.ndarray:
    """Local tile of each canonical input element ``[G, N, Ci, *field]`` in the layout the plan
    wants (``createInput``): a block is spread over the out-channel tiles that share it."""
    F0 = params.inputFieldShape[0]
    rest = int(np.prod(params.inputFieldShape[1:], dtype=np.int64))
    lo, hi = input_row_ranges(params, plan, lay)
    g = np.arange(lay.G)[:, None, None, None, None]
    n = np.arange(lay.N)[None, :, None, None, None]
    c = np.arange(lay.Ci)[None, None, :, None, None]
    f = _primary_block(np.arange(F0), lo, hi)[None, None, None, :, None]
    r = np.arange(rest)[None, None, None, None, :]
    o = (((n % lay.nB) * lay.ciB + c % lay.ciB) * rest + r) * plan.out_chan_split // (lay.nB * lay.ciB * rest)
    t = tile_index(plan, g // lay.gB, n // lay.nB, f, o, c // lay.ciB)
    return np.broadcast_to(t, (lay.G, lay.N, lay.Ci, F0, rest)).reshape(-1)


def weight_tiles(params: ConvParams, plan, lay: Layout) -> np.ndarray:
    """Local tile of each canonical weight element ``[G, Co, Ci, *kernel]`` (``createWeights``):
    a block is spread over the batch x field tiles that share it."""
    K = int(np.prod(params.kernelShape, dtype=np.int64))
    g = np.arange(lay.G)[:, None, None, None]
    co = np.arange(lay.Co)[None, :, None, None]
    c = np.arange(lay.Ci)[None, None, :, None]
    k = np.arange(K)[None, None, None, :]
    share = plan.batch_split * plan.field_split
    h = (((co % lay.coB) * lay.ciB + c % lay.ciB) * K + k) * share // (lay.coB * lay.ciB * K)
    t = tile_index(plan, g // lay.gB, h // plan.field_split, h % plan.field_split, co // lay.coB, c // lay.ciB)
    return np.broadcast_to(t, (lay.G, lay.Co, lay.Ci, K)).reshape(-1)


def output_tiles(params: ConvParams, plan, lay: Layout) -> np.ndarray:
    """Local tile of each canonical output element ``[G, N, Co, *outField]``: the tile that
    computes it, or with an input-channel split the tile that reduces it."""
    fo = params.getOutputFieldShape()
    rest = int(np.prod(fo[1:], dtype=np.int64))
    row = np.clip(np.arange(fo[0]) - params.outputTransform.paddingLower[0], 0, max(lay.out_rows - 1, 0))
    g = np.arange(lay.G)[:, None, None, None, None]
    n = np.arange(lay.N)[None, :, None, None, None]
    co = np.arange(lay.Co)[None, None, :, None, None]
    f = (row // lay.fB)[None, None, None, :, None]
    r = np.arange(rest)[None, None, None, None, :]
    i = (((n % lay.nB) * lay.coB + co % lay.coB) * rest + r) * plan.in_chan_split // (lay.nB * lay.coB * rest)
    t = tile_index(plan, g // lay.gB, n // lay.nB, f, co // lay.coB, i)
    return np.broadcast_to(t, (lay.G, lay.N, lay.Co, fo[0], rest)).reshape(-1)


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
    n_idx: tuple
    co_idx: tuple
    ics: int
    ciB: int
    acc_dtype: str
    write_dtype: str            # the destination's element type name


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


def conv_partials(X: torch.Tensor, W: torch.Tensor, spec: _Spec) -> torch.Tensor:
    """``X[R, G, N, Ci, *F]`` (*) ``W[R, G, Co, Ci, *K]`` -> ``[R, ics, G, N, Co, *Fo]``: partial sums
    over each of ``ics`` blocks of ``ciB`` input channels, in ``spec.acc_dtype``."""
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
    X = _apply_input_transform(X, spec.in_t, 4)
    W = _apply_input_transform(W, spec.k_t, 4)
    otl, otu, stride, opl, opu = spec.out_t
    for d in range(nd):
        ax = 4 + d
        X = X.narrow(ax, otl[d], X.shape[ax] - otl[d] - otu[d])
    if pad:
        X = torch.cat([X, X.new_zeros((R, G, N, pad, *X.shape[4:]))], dim=3)
        W = torch.cat([W, W.new_zeros((R, G, Co, pad, *W.shape[4:]))], dim=3)
    fx = X.shape[4:]
    Xc = X.permute(2, 0, 1, 3, *range(4, 4 + nd)).reshape(N, R * G * ics * ciB, *fx)
    Wc = W.reshape(R, G, Co, ics, ciB, *W.shape[4:]).permute(0, 1, 3, 2, 4, *range(5, 5 + nd))
    Wc = Wc.reshape(R * G * ics * Co, ciB, *W.shape[4:])
    Y = _CONV[nd](Xc, Wc, stride=tuple(stride), groups=R * G * ics)
    fo = Y.shape[2:]
    Y = Y.reshape(N, R, G, ics, Co, *fo).permute(1, 3, 2, 0, 4, *range(5, 5 + nd))
    if any(opl) or any(opu):
        padding = []
        for d in reversed(range(nd)):
            padding += [opl[d], opu[d]]
        Y = F.pad(Y, padding)
    return Y


def _partials_kernel(x, w, dst, spec: _Spec, ctx):
    X, W = ctx.read(x), ctx.read(w)
    n_idx = torch.as_tensor(spec.n_idx, dtype=torch.long)
    co_idx = torch.as_tensor(spec.co_idx, dtype=torch.long)
    if n_idx.numel() != X.shape[2]:
        X = X.index_select(2, n_idx)
    if co_idx.numel() != W.shape[2]:
        W = W.index_select(2, co_idx)
    Y = conv_partials(X, W, spec)
    if spec.ics == 1:
        Y = Y[:, 0]
    ctx.write(dst, Y.to(poplar.types.type_from_name(spec.write_dtype).torch_dtype))


def _reduce_kernel(partials, dst, ctx):
    P = ctx.read(partials)
    # fp32 partials are summed in fp64 (see conv_partials): torch's vectorised sum over a strided
    # dimension rounds differently per output position.
    ctx.write(dst, P.to(torch.float64).sum(dim=1) if P.dtype == torch.float32 else P.sum(dim=1))


def _replica_reads(t, addr: np.ndarray, base_tiles: np.ndarray, offsets, gt) -> list:
    """Reads of the elements ``addr`` of ``t`` by tiles ``base_tiles + offset`` for each offset:
    one read per offset, elements in increasing address order (so the engine needs no sort),
    the sends counted once."""
    a = addr.reshape(-1)
    b = base_tiles.reshape(-1)
    if a.size > 1 and not np.all(a[1:] > a[:-1]):
        order = np.argsort(a, kind="stable")
        a, b = a[order], b[order]
    view = _gather(t, a)
    n = gt.size
    if n and int(gt[-1]) - int(gt[0]) == n - 1 and np.all(np.diff(gt) == 1):
        # the graph's tiles are one range: tile k is gt[0] + k, so no per-element gather
        b = b.astype(np.int32, copy=False)
        return [(view, b + np.int32(int(gt[0]) + off), k == 0) for k, off in enumerate(offsets)]
    return [(view, gt[b + off], k == 0) for k, off in enumerate(offsets)]


def _take(a: np.ndarray, axis: int, idx: np.ndarray) -> np.ndarray:
    """``a`` indexed by ``idx`` along ``axis``: ``a`` itself for the whole axis, a view for a
    range, a copy otherwise (the same values as ``np.take``)."""
    n = a.shape[axis]
    if idx.size and idx[0] >= 0 and int(idx[-1]) - int(idx[0]) == idx.size - 1 and \
            (idx.size == 1 or np.all(np.diff(idx) == 1)):
        if idx.size == n:
            return a
        sl = [slice(None)] * a.ndim
        sl[axis] = slice(int(idx[0]), int(idx[-1]) + 1)
        return a[tuple(sl)]
    return np.take(a, idx, axis=axis)


def _gather(t, addr: np.ndarray):
    """A view of ``t``'s elements at the given addresses (repeats allowed)."""
    return poplar.Tensor(t._state, t._type, np.ascontiguousarray(addr))


# --------------------------------------------------------------------------------------------
def build(graph, x, w, params: ConvParams, plan: planmod.ConvPlan, partials_type, out_type, prog, name: str,
          out=None):
    """Add the planned convolution of canonical views ``x`` and ``w`` to ``prog``.

    Returns the output: ``out`` if given (canonical ``[G, N, Co, *outField]`` view, written in
    place), else a new variable in that shape mapped the way the plan produces it.
    """
    target = graph.getTarget()
    T = target.getNumTiles()
    W_ctx = target.getNumWorkerContexts()
    gt = graph._tiles
    in_type = x.elementType()
    ptype = poplar.FLOAT if in_type == poplar.FLOAT else poplar.types.as_type(partials_type)
    lay = Layout.of(params, plan)
    if plan.tiles > T:
        raise planmod.poplibs_error(f"{name}: plan uses {plan.tiles} tiles but the graph has {T}")
    fo = params.getOutputFieldShape()
    if out is None:
        out = graph.addVariable(out_type, [lay.G, lay.N, lay.Co, *fo], name)
        graph.setTileMapping(out, output_tiles(params, plan, lay))
    out_tile = graph._local_tiles(graph.tile_of_elements(out).astype(np.int64)).reshape(lay.G, lay.N, lay.Co, -1)
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

    # input rows each field block reads
    lo, hi = input_row_ranges(params, plan, lay)
    lens = hi - lo
    pair_rows = np.concatenate([np.arange(a, b) for a, b in zip(lo.tolist(), hi.tolist())]) if lens.sum() else \
        np.zeros(0, np.int64)
    pair_f = np.repeat(np.arange(plan.field_split), lens)
    prim = pair_f == _primary_block(pair_rows, lo, hi)
    prim_rows, prim_f, halo_rows, halo_f = pair_rows[prim], pair_f[prim], pair_rows[~prim], pair_f[~prim]
    F0 = params.inputFieldShape[0]
    in_rest = int(np.prod(params.inputFieldShape[1:], dtype=np.int64))
    K = int(np.prod(params.kernelShape, dtype=np.int64))
    xa = x._addr.reshape(lay.G, lay.N, lay.Ci, F0, in_rest)
    wa = w._addr.reshape(lay.G, lay.Co, lay.Ci, K)
    oa = out._addr.reshape(lay.G, lay.N, lay.Co, -1)
    n_all, co_all = np.arange(lay.N), np.arange(lay.Co)
    g_ar = np.arange(lay.G)
    macs_per_out = lay.Ci * pb.taps * pb.density

    for sb in range(plan.batch_serial):
        n_idx = n_all[(n_all % lay.nB) // lay.nS == sb]
        for so in range(plan.out_chan_serial):
            co_idx = co_all[(co_all % lay.coB) // lay.coS == so]
            if n_idx.size == 0 or co_idx.size == 0:
                continue
            step = f"{name}/s{sb}_{so}" if plan.serial_steps > 1 else name
            # reads: the input rows of this step, by every out-channel tile of its block; the
            # weights of this step, by every batch x field tile of theirs. One read per replica
            # of a block, in address order, sends counted once (the exchange multicasts).
            reads = []
            g_t = (g_ar // lay.gB)[:, None, None, None, None]
            n_t = (n_idx // lay.nB)[None, :, None, None, None]
            c_t = (np.arange(lay.Ci) // lay.ciB)[None, None, :, None, None]
            for rows, fblk in ((prim_rows, prim_f), (halo_rows, halo_f)):
                if rows.size == 0:
                    continue
                a_in = _take(_take(xa, 1, n_idx), 3, rows)                              # [G, nn, Ci, P, rest]
                base = tile_index(plan, g_t, n_t, fblk[None, None, None, :, None], 0, c_t)
                reads += _replica_reads(x, a_in, np.broadcast_to(base, a_in.shape),
                                        [o * plan.in_chan_split for o in range(plan.out_chan_split)], gt)
            a_w = _take(wa, 1, co_idx)                                                 # [G, cc, Ci, K]
            base = tile_index(plan, (g_ar // lay.gB)[:, None, None, None], 0, 0,
                              (co_idx // lay.coB)[None, :, None, None], (np.arange(lay.Ci) // lay.ciB)[None, None, :, None])
            offs = [(b * plan.field_split + f) * plan.out_chan_split * plan.in_chan_split
                    for b in range(plan.batch_split) for f in range(plan.field_split)]
            reads += _replica_reads(w, a_w, np.broadcast_to(base, a_w.shape), offs, gt)
            # per-tile work of this step
            gi, bi, fi, oi, ii = np.meshgrid(np.arange(plan.group_split), np.arange(plan.batch_split),
                                             np.arange(plan.field_split), np.arange(plan.out_chan_split),
                                             np.arange(ics), indexing="ij")
            gi, bi, fi, oi, ii = (a.reshape(-1) for a in (gi, bi, fi, oi, ii))
            gc = np.clip(lay.G - gi * lay.gB, 0, lay.gB)
            nc = np.clip(np.clip(lay.N - bi * lay.nB, 0, lay.nB) - sb * lay.nS, 0, lay.nS)
            fc = np.clip(lay.out_rows - fi * lay.fB, 0, lay.fB)
            cic = np.clip(lay.Ci - ii * lay.ciB, 0, lay.ciB)
            coc = np.clip(np.clip(lay.Co - oi * lay.coB, 0, lay.coB) - so * lay.coS, 0, lay.coS)
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
            step_outs = lay.G * n_idx.size * co_idx.size * pb.out_rows * pb.out_rest
            flops = 2.0 * step_outs * macs_per_out
            o_step = _take(_take(oa, 1, n_idx), 2, co_idx)                                # [G, nn, cc, Fo]
            dst_out = poplar.Tensor(out._state, out._type, np.ascontiguousarray(o_step).reshape(
                lay.G, n_idx.size, co_idx.size, *fo))
            dst_tiles = _take(_take(out_tile, 1, n_idx), 2, co_idx).reshape(-1)
            spec = _Spec((tuple(it.truncationLower), tuple(it.truncationUpper), tuple(it.dilation),
                          tuple(it.paddingLower), tuple(it.paddingUpper), tuple(it.flip)),
                         (tuple(kt.truncationLower), tuple(kt.truncationUpper), tuple(kt.dilation),
                          tuple(kt.paddingLower), tuple(kt.paddingUpper), tuple(kt.flip)),
                         (tuple(ot.truncationLower), tuple(ot.truncationUpper), tuple(ot.stride),
                          tuple(ot.paddingLower), tuple(ot.paddingUpper)),
                         plain, tuple(n_idx.tolist()), tuple(co_idx.tolist()), ics, lay.ciB, acc,
                         (out_type if ics == 1 else ptype).name)
            cs = graph.addComputeSet(f"{step}/Conv")
            if ics == 1:
                # the vertices write the output directly (no reduction), on the tiles that hold it
                rows_o = np.clip(np.arange(fo[0]) - ot.paddingLower[0], 0, max(lay.out_rows - 1, 0)) // lay.fB
                wt = tile_index(plan, (g_ar // lay.gB)[:, None, None, None, None],
                                (n_idx // lay.nB)[None, :, None, None, None],
                                rows_o[None, None, None, :, None], (co_idx // lay.coB)[None, None, :, None, None], 0)
                wt = np.broadcast_to(wt, (lay.G, n_idx.size, co_idx.size, fo[0], o_step.shape[-1] // fo[0])).reshape(-1)
                graph.add_vertex_group(cs, VertexGroup(
                    vtype, gt[tiles], cyc, functools.partial(_partials_kernel, x, w, dst_out, spec),
                    reads=reads, writes=[(dst_out, gt[wt])], multi=True, flops=flops,
                    state_bytes=PARTIALS_VERTEX_STATE_BYTES))
                prog.add(poplar.program.Execute(cs))
                continue
            # partial sums, one slab per input-channel block, on the tiles that compute them
            partials = graph.addVariable(ptype, [ics, lay.G, n_idx.size, co_idx.size, *fo], f"{step}/partials")
            rows_o = np.clip(np.arange(fo[0]) - ot.paddingLower[0], 0, max(lay.out_rows - 1, 0)) // lay.fB
            pt = tile_index(plan, (g_ar // lay.gB)[None, :, None, None, None, None],
                            (n_idx // lay.nB)[None, None, :, None, None, None],
                            rows_o[None, None, None, None, :, None],
                            (co_idx // lay.coB)[None, None, None, :, None, None],
                            np.arange(ics)[:, None, None, None, None, None])
            pt = np.broadcast_to(pt, (ics, lay.G, n_idx.size, co_idx.size, fo[0],
                                      o_step.shape[-1] // fo[0])).reshape(-1)
            graph.setTileMapping(partials, pt)
            graph.add_vertex_group(cs, VertexGroup(
                vtype, gt[tiles], cyc, functools.partial(_partials_kernel, x, w, partials, spec),
                reads=reads, writes=[(partials, gt[pt])], multi=True, flops=flops,
                state_bytes=PARTIALS_VERTEX_STATE_BYTES))
            prog.add(poplar.program.Execute(cs))
            # reduce across the input-channel split onto the tiles that hold the output
            counts = np.bincount(dst_tiles, minlength=T)
            used = np.flatnonzero(counts)
            vw = target.getVectorWidth(ptype)
            rcyc = W_ctx * (planmod.REDUCE_WORKER_OVERHEAD + 2 * int(math.log2(vw))
                            + planmod.REDUCE_CYCLES_PER_VECTOR * ics * _ceil(counts[used], vw * W_ctx))
            p_cons = np.broadcast_to(dst_tiles[None, :], (ics, dst_tiles.size)).reshape(-1)
            rcs = graph.addComputeSet(f"{step}/Reduce")
            graph.add_vertex_group(rcs, VertexGroup(
                f"poplin::ReduceAdd<{out_type},{ptype}>", gt[used], rcyc,
                functools.partial(_reduce_kernel, partials, dst_out), reads=[(partials, gt[p_cons])],
                writes=[(dst_out, gt[dst_tiles])], multi=True, flops=float(step_outs * (ics - 1)),
                state_bytes=REDUCE_VERTEX_STATE_BYTES))
            prog.add(poplar.program.Execute(rcs))
    return out
