"""``popnn.pooling``: max, average and sum pooling (PopLibs ``include/popnn/Pooling.hpp``,
``PoolingDef.hpp``).

Inputs are ``[B][C][..field..]`` with 1 to 3 field dimensions. Each output field dimension is
``floor((in + padLower + padUpper - kernel) / stride) + 1``; negative padding truncates the input.
Padded positions never win a max and are not counted by AVG, which divides by the number of
*input* elements in each window [A] (torch's ``count_include_pad=False``).

Work: the output is mapped linearly; each tile runs a ``MaxPooling`` / ``SumPooling`` (AVG is a
scaled SumPooling) vertex over its outputs, reading the window inputs it needs (each input element
is costed as consumed by the tile of the first output whose window holds it). Those reads are
built from structure: per field dim, the segment of inputs whose first output is ``o``; a tile box
of the output maps to a box of inputs (windows with gaps, ``stride > kernel``, to a few strided
views), so host work follows the output's tile boxes, not its elements. Cycle estimate per
tile, in the shape of PopLibs ``getPoolingCycles`` (``lib/popnn/PerformanceEstimation.hpp``):
``7 + 6 + 6 x worker``, ``worker = 19 + 2 + 6 + 2 + 3 + rows x (13 + 20 + 2) + v x (2 + c0 + 3 K + 1)``
with ``v`` the output vectors (vector width of the type) of the busiest worker, ``K`` the window
size, ``c0`` = 4 (max) / 5 (sum) forward and 7 with 5 cycles per element for the max gradient
(``rows``: output rows = outputs / last output field dim, per worker) [A: the row grouping].
"""

from __future__ import annotations

import enum
import functools
import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.exchange import Boxes, tile_boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popnn._common import check_mapped, flat_range_boxes, new_mapped, poplibs_error, tile_counts_of

__all__ = ["PoolingType", "PoolParams", "pool", "poolInputGradient", "getOutputFieldShape", "getFwdFlops",
           "getBwdFlops", "asString"]


class PoolingType(enum.Enum):
    """``popnn::PoolingType``."""

    MAX = "MAX"
    AVG = "AVG"
    SUM = "SUM"

    def __str__(self):
        return self.name


def asString(method) -> str:  # noqa: N802
    return PoolingType(method).name if not isinstance(method, PoolingType) else method.name


@dataclass
class PoolParams:
    """``popnn::pooling::PoolParams``."""

    poolingType: PoolingType  # noqa: N815
    inputFieldShape: list  # noqa: N815
    kernelShape: list  # noqa: N815
    stride: list
    inputTruncationOrPaddingLower: list  # noqa: N815
    inputTruncationOrPaddingUpper: list  # noqa: N815
    numChannels: int  # noqa: N815
    batchSize: int  # noqa: N815
    dType: object = field(default=poplar.FLOAT)  # noqa: N815

    def __post_init__(self):
        if not isinstance(self.poolingType, PoolingType):
            self.poolingType = PoolingType[str(self.poolingType).split(".")[-1]]
        for name in ("inputFieldShape", "kernelShape", "stride", "inputTruncationOrPaddingLower",
                     "inputTruncationOrPaddingUpper"):
            setattr(self, name, [int(v) for v in getattr(self, name)])
        d = len(self.inputFieldShape)
        if not 1 <= d <= 3 or any(len(getattr(self, n)) != d for n in (
                "kernelShape", "stride", "inputTruncationOrPaddingLower", "inputTruncationOrPaddingUpper")):
            raise poplibs_error(f"PoolParams: 1 to 3 field dimensions, with one kernel size, stride and padding each "
                                f"(got field {self.inputFieldShape}, kernel {self.kernelShape}, stride {self.stride})")
        if any(k < 1 for k in self.kernelShape) or any(s < 1 for s in self.stride):
            raise poplibs_error("PoolParams: kernel sizes and strides must be >= 1")
        if any(v < 1 for v in self.getOutputFieldShape()):
            raise poplibs_error(f"PoolParams: the kernel {self.kernelShape} does not fit the padded input field; "
                                f"output field would be {self.getOutputFieldShape()}")

    def getNumFieldDims(self) -> int:  # noqa: N802
        return len(self.inputFieldShape)

    def getOutputFieldShape(self) -> list:  # noqa: N802
        return [(i + lo + up - k) // s + 1 for i, k, s, lo, up in zip(
            self.inputFieldShape, self.kernelShape, self.stride, self.inputTruncationOrPaddingLower,
            self.inputTruncationOrPaddingUpper)]


def getOutputFieldShape(params: PoolParams) -> list:  # noqa: N802
    return params.getOutputFieldShape()


def getFwdFlops(params: PoolParams) -> int:  # noqa: N802
    """Flops of the forward pass: one per window element per output (plus one per output for AVG)."""
    outs = params.batchSize * params.numChannels * int(np.prod(params.getOutputFieldShape()))
    return outs * int(np.prod(params.kernelShape)) + (outs if params.poolingType == PoolingType.AVG else 0)


def getBwdFlops(params: PoolParams) -> int:  # noqa: N802
    return getFwdFlops(params)


# -- functional windows --------------------------------------------------------------------------
def _pad(x: torch.Tensor, p: PoolParams, value: float) -> torch.Tensor:
    pads = []
    for lo, up in zip(reversed(p.inputTruncationOrPaddingLower), reversed(p.inputTruncationOrPaddingUpper)):
        pads += [lo, up]
    return torch.nn.functional.pad(x, pads, value=value)


def _windows(x: torch.Tensor, p: PoolParams) -> torch.Tensor:
    """[R, B, C, *field] -> [R, B, C, *outField, *kernel] (views; truncated to the output field)."""
    d = p.getNumFieldDims()
    out_shape = p.getOutputFieldShape()
    for i in range(d):
        dim = 3 + i
        x = x.unfold(dim, p.kernelShape[i], p.stride[i]).narrow(dim, 0, out_shape[i])
    return x


def _valid_counts(p: PoolParams) -> torch.Tensor:
    ones = torch.ones([1, 1, 1] + p.inputFieldShape, dtype=torch.float32)
    w = _windows(_pad(ones, p, 0.0), p)
    return w.flatten(start_dim=-p.getNumFieldDims()).sum(-1)


@kernel
def _pool_kernel(p: PoolParams, src, out, ctx):
    x = ctx.read(src)
    d = p.getNumFieldDims()
    if p.poolingType == PoolingType.MAX:
        w = _windows(_pad(x, p, -torch.inf), p).flatten(start_dim=-d)
        ctx.write(out, w.amax(-1))
        return
    w = _windows(_pad(x.to(torch.float32), p, 0.0), p).flatten(start_dim=-d)
    s = w.sum(-1)
    if p.poolingType == PoolingType.AVG:
        s = s / _valid_counts(p).clamp(min=1)
    ctx.write(out, s)


@kernel
def _grad_kernel(p: PoolParams, fwd_in, pooled, grad, out, scaled, ctx):
    g = ctx.read(grad).to(torch.float32)
    R = g.shape[0]
    d = p.getNumFieldDims()
    shape = [R, p.batchSize, p.numChannels] + p.inputFieldShape
    base = torch.zeros(shape, dtype=torch.float32, requires_grad=True)
    wins = _windows(_pad(base, p, 0.0), p).flatten(start_dim=-d)      # linear in base
    if p.poolingType == PoolingType.MAX:
        x = ctx.read(fwd_in).to(torch.float32)
        xw = _windows(_pad(x, p, -torch.inf), p).flatten(start_dim=-d)
        hit = (xw == ctx.read(pooled).to(torch.float32).unsqueeze(-1)).to(torch.float32)
        if scaled:
            hit = hit / hit.sum(-1, keepdim=True).clamp(min=1)
        cot = hit * g.unsqueeze(-1)
    else:
        cot = g.unsqueeze(-1).expand_as(wins)
        if p.poolingType == PoolingType.AVG:
            cot = cot / _valid_counts(p).clamp(min=1).unsqueeze(-1)
    (res,) = torch.autograd.grad(wins, base, cot.contiguous())
    ctx.write(out, res)


# -- graph construction -----------------------------------------------------------------------------
# Where each element is used, by structure. Along field dim ``d`` (input size ``n``, kernel ``k``,
# stride ``s``, lower padding ``lo``), output ``o``'s window covers inputs ``[o s - lo, o s - lo + k)``.
# Input ``x``'s *first* output is the smallest ``o`` whose window holds it; the inputs whose first
# output is ``o`` form the segment ``[b_o, e_o)`` (clipped to ``[0, n)``):
# ``b_0 = -lo``, ``b_o = max(o s, (o-1) s + k) - lo``, ``e_o = o s + k - lo``. The windows holding an
# input form a box of outputs, so its first output (in flattened order) is the first one per dim.
# With ``k >= s`` consecutive segments touch, so a box of outputs has a box of inputs as its
# preimage; with ``k < s`` (gaps between windows) the segments are the ``k``-wide bands at stride ``s``.
def _segments(p: PoolParams):
    """Per field dim: ``(b, e)`` (int64 ``[outField_d]``, clipped to the input) of each output's
    segment of first-used inputs. Arrays over one output dim, not over elements."""
    out = []
    for n, k, s, lo, od in zip(p.inputFieldShape, p.kernelShape, p.stride, p.inputTruncationOrPaddingLower,
                               p.getOutputFieldShape()):
        o = np.arange(od, dtype=np.int64)
        b = np.where(o == 0, -lo, np.maximum(o * s, (o - 1) * s + k) - lo)
        e = o * s + k - lo
        out.append((np.clip(b, 0, n), np.clip(e, 0, n)))
    return out


def _gap_parts(n, k, s, lo, od, b, e):
    """The parts of a field dim with gaps (``k < s``): ``(o0, n_o, x0, m, regular)``; outputs
    ``[o0, o0 + n_o)`` use inputs ``x0 + (o - o0) s + j``, ``0 <= j < m``. A regular part's
    inputs are a ``[n_o, s]`` reshape of ``[x0, x0 + n_o s)`` cut to its first ``m = k`` columns;
    the others are single outputs (clipped windows at the edges, the last whole window)."""
    o = np.arange(od, dtype=np.int64)
    full = (o * s - lo >= 0) & (o * s - lo + s <= n)
    parts = []
    idx = np.flatnonzero(full)
    ra, rc = (int(idx[0]), int(idx[-1]) + 1) if idx.size else (od, od)
    for oo in range(od):
        if ra <= oo < rc:
            if oo == ra:
                parts.append((ra, rc - ra, ra * s - lo, k, True))
            continue
        if e[oo] > b[oo]:
            parts.append((oo, 1, int(b[oo]), int(e[oo] - b[oo]), False))
    return parts


def _forward_reads(graph, p: PoolParams, input, out) -> list:
    """Reads of ``input`` for :func:`pool`: each input element on the tile of the first output
    whose window holds it (one box of inputs per tile box of the output); elements in no window
    on their own tile."""
    ob = tile_boxes(out)
    nd = p.getNumFieldDims()
    segs = _segments(p)
    gap = [k < s for k, s in zip(p.kernelShape, p.stride)]
    lo_in, hi_in = ob.lo.copy(), ob.lo + ob.sz
    for d in range(nd):
        if not gap[d]:
            b, e = segs[d]
            L, H = ob.lo[:, 2 + d], ob.lo[:, 2 + d] + ob.sz[:, 2 + d]
            lo_in[:, 2 + d], hi_in[:, 2 + d] = b[L], e[H - 1]
    if not any(gap):
        keep = (hi_in > lo_in).all(axis=1)
        return [Access(input, flat_range_boxes(Boxes(lo_in[keep], (hi_in - lo_in)[keep], ob.tile[keep]),
                                               input.shape()))]
    # gaps: one view per combination of the gap dims' parts, each gap dim split into (o, j)
    gdims = [d for d in range(nd) if gap[d]]
    plist = [_gap_parts(p.inputFieldShape[d], p.kernelShape[d], p.stride[d], p.inputTruncationOrPaddingLower[d],
                        p.getOutputFieldShape()[d], *segs[d]) for d in gdims]
    reads = [Access(input)]                    # every element used here (liveness), none moved
    for combo in itertools.product(*plist):
        view, vlo, vhi, keep = input, [], [], np.ones(len(ob), bool)
        for d in range(nd - 1, -1, -1):        # last dim first: splitting a dim shifts the later ones
            ax = 2 + d
            if not gap[d]:
                continue
            o0, n_o, x0, m, regular = combo[gdims.index(d)]
            s_ = p.stride[d]
            if regular:
                view = view.slice(x0, x0 + n_o * s_, ax).reshapePartial(ax, ax + 1, [n_o, s_]).slice(0, m, ax + 1)
            else:
                view = view.slice(x0, x0 + m, ax).reshapePartial(ax, ax + 1, [1, m])
        cols_lo, cols_hi = [lo_in[:, 0], lo_in[:, 1]], [hi_in[:, 0], hi_in[:, 1]]
        for d in range(nd):
            if not gap[d]:
                cols_lo.append(lo_in[:, 2 + d])
                cols_hi.append(hi_in[:, 2 + d])
                continue
            o0, n_o, x0, m, regular = combo[gdims.index(d)]
            L, H = ob.lo[:, 2 + d], ob.lo[:, 2 + d] + ob.sz[:, 2 + d]
            a, z = np.maximum(L, o0) - o0, np.minimum(H, o0 + n_o) - o0
            cols_lo += [a, np.zeros_like(a)]
            cols_hi += [z, np.full_like(z, m)]
        vlo, vhi = np.stack(cols_lo, axis=1), np.stack(cols_hi, axis=1)
        keep = (vhi > vlo).all(axis=1)
        if keep.any():
            reads.append(Access(view, flat_range_boxes(Boxes(vlo[keep], (vhi - vlo)[keep], ob.tile[keep]),
                                                       view.shape())))
    return reads


def _grad_consumers(graph, p: PoolParams, in_grad):
    """For :func:`poolInputGradient`: output ``(b, c, o)`` is read on the tile of input-gradient
    element ``(b, c, last(o))``, the last input (in flattened order) whose first output is ``o``
    (``last(o) = e_o - 1``). Returns ``(lo, on)``: the corner of the outputs with a non-empty
    segment in every dim and a view of ``in_grad`` (those outputs' shape) holding each one's
    consumer element; or None when no output is any input's first."""
    segs = _segments(p)
    on, corner = in_grad, [0, 0]
    for d, (b, e) in enumerate(segs):
        ax = 2 + d
        valid = np.flatnonzero(e > b)
        if valid.size == 0:
            return None
        va, vb = int(valid[0]), int(valid[-1]) + 1
        n, k, s_, lo = p.inputFieldShape[d], p.kernelShape[d], p.stride[d], p.inputTruncationOrPaddingLower[d]
        # last(o) = o s + k - lo - 1 while the window ends inside the input, then n - 1
        n1 = int(np.clip((n - k + lo) // s_ + 1 - va, 0, vb - va))
        parts = []
        if n1:
            a0 = va * s_ + k - lo - 1
            parts.append(on.slice(a0, a0 + (n1 - 1) * s_ + 1, ax).subSample(s_, ax))
        if vb - va > n1:
            parts.append(on.slice(n - 1, n, ax).broadcast(vb - va - n1, ax))
        on = parts[0] if len(parts) == 1 else poplar.concat(parts, ax)
        corner.append(va)
    return np.array(corner, np.int64), on


def _grad_boxes(graph, p: PoolParams, in_grad, grad) -> Boxes:
    """Where :func:`poolInputGradient` reads each output-gradient (and pooled) element: the
    consumers of :func:`_grad_consumers`; an output that is no input's first is read on the tile
    of its ``grad`` element (a no-op for ``grad``, an exchange for ``pooled`` mapped elsewhere)."""
    shape = grad.shape()
    cons = _grad_consumers(graph, p, in_grad)
    if cons is None:
        return tile_boxes(grad)
    corner, view = cons
    vsz = np.array(view.shape(), np.int64)
    ob = tile_boxes(view)
    parts = [Boxes(ob.lo + corner[None, :], ob.sz, ob.tile)]
    # the complement of the box [corner, corner + vsz): at most two slabs per dim
    for i in range(len(shape)):
        for a, z in ((0, int(corner[i])), (int(corner[i] + vsz[i]), shape[i])):
            if z <= a:
                continue
            begin = [int(c) for c in corner[:i]] + [a] + [0] * (len(shape) - i - 1)
            end = [int(c + v) for c, v in zip(corner[:i], vsz[:i])] + [z] + list(shape[i + 1:])
            sb = tile_boxes(grad.slice(begin, end))
            parts.append(Boxes(sb.lo + np.array(begin, np.int64)[None, :], sb.sz, sb.tile))
    return flat_range_boxes(Boxes(np.concatenate([b.lo for b in parts]), np.concatenate([b.sz for b in parts]),
                                  np.concatenate([b.tile for b in parts])), shape)


def _pool_cycles(counts, p: PoolParams, type_, target, grad: bool) -> np.ndarray:
    vw = target.getVectorWidth(type_)
    w = target.getNumWorkerContexts()
    K = int(np.prod(p.kernelShape))
    last = max(p.getOutputFieldShape()[-1], 1)
    per_worker = -(-np.asarray(counts) // w)
    v = -(-per_worker // vw)
    rows = -(-per_worker // last)
    if grad and p.poolingType == PoolingType.MAX:
        inner = 2 + 7 + 5 * K + 1
    else:
        inner = 2 + (4 if p.poolingType == PoolingType.MAX else 5) + 3 * K + 1
    worker = 19 + 2 + 6 + 2 + 3 + (10 if grad else 0) + rows * (13 + 20 + 2) + v * inner
    return 7 + 6 + w * worker


def _check_input(params, t, what, name="input"):
    if not isinstance(params, PoolParams):
        raise poplibs_error(f"{what}: params must be a popnn.pooling.PoolParams")
    want = [params.batchSize, params.numChannels] + params.inputFieldShape
    if t.shape() != want:
        raise poplibs_error(f"{what}: {name} must have shape [B][C][..field..] = {want}, got {t.shape()}")
    if t.elementType() not in (poplar.FLOAT, poplar.HALF):
        raise poplibs_error(f"{what}: {name} must be float or half, got {t.elementType()}")


def _split_params(p: PoolParams, split: tuple) -> tuple:
    """The two pools of a kernel split: ``split[d]`` pieces of each field dim's kernel (windows
    of ``kernel / split`` with that stride), then windows of ``split`` over their results."""
    k1 = [k // s for k, s in zip(p.kernelShape, split)]
    inner = "MAX" if p.poolingType == PoolingType.MAX else p.poolingType.name
    zeros = [0] * len(split)
    first = PoolParams(inner, p.inputFieldShape, k1, k1, zeros, zeros, p.numChannels, p.batchSize, p.dType)
    mid = first.getOutputFieldShape()
    second = PoolParams(inner, mid, list(split), list(split), zeros, zeros, p.numChannels, p.batchSize, p.dType)
    return first, second


def _linear_max_count(n: int, tiles: int, min_el: int, grain: int) -> int:
    """Elements on the fullest tile when ``n`` are mapped linearly (``mapTensorLinearly``)."""
    per = max(-(-n // tiles), min_el)
    return min(n, -(-per // grain) * grain)


def _kernel_split(graph, p: PoolParams, type_) -> tuple | None:
    """The kernel split PopLibs' pooling planner would take for ``p`` (``lib/popnn/PoolPlan``: the
    kernel partitioned over tiles, partial results pooled again), or ``None`` for none.

    Considered for field dims whose windows do not overlap and are not padded (stride equal to the
    kernel, or one output): each such dim's kernel split by a divisor. The choice minimises the
    estimated cycles of the busiest tile over both pools (:func:`_pool_cycles` on a linear mapping,
    plus receiving its window inputs at the target's exchange rate). Without a split, a global
    pool of a large field over few channels puts every window on the few tiles a linear mapping
    of the small output uses (a 64x64 average over 32x32 outputs: 16 tiles, 512 KiB each)."""
    from openipu.poplibs.poputil import _linear_defaults
    target = graph.getTarget()
    tiles = target.getNumTiles()
    min_el, grain = _linear_defaults(graph, type_, None, None)
    size = target.getTypeSize(type_)
    xbpc = max(1, int(target.getExchangeBytesPerCycle()))
    out_field = p.getOutputFieldShape()
    choices = []
    for d, k in enumerate(p.kernelShape):
        ok = (p.inputTruncationOrPaddingLower[d] == 0 and p.inputTruncationOrPaddingUpper[d] == 0
              and (p.stride[d] == k or out_field[d] == 1) and p.inputFieldShape[d] % k == 0)
        choices.append([s for s in range(1, k + 1) if k % s == 0] if ok and k > 1 else [1])

    def cost(params_list) -> float:
        total = 0.0
        for q in params_list:
            n = q.batchSize * q.numChannels * int(np.prod(q.getOutputFieldShape()))
            c = _linear_max_count(n, tiles, min_el, grain)
            total += float(_pool_cycles(np.array([c]), q, type_, target, False)[0])
            total += c * int(np.prod(q.kernelShape)) * size / xbpc
        return total

    best, best_cost = None, cost([p])
    for split in itertools.product(*choices):
        if np.prod(split) == 1:
            continue
        c = cost(_split_params(p, split))
        if c < best_cost:
            best, best_cost = split, c
    return best


def pool(graph, params: PoolParams, input, prog, debug_name: str = "", options=None):  # noqa: A002
    """Pool ``input`` ``[B][C][..field..]`` (``popnn::pooling::pool``); returns ``[B][C][..outField..]``
    of the input's type, mapped linearly. Appends one compute set, or two when PopLibs' planner
    would split a large kernel over tiles (:func:`_kernel_split`: the partial pools then a pool
    of them; AVG of equal full windows is AVG of their AVGs).

    Raises:
        poplibs_error: params that do not match the input, or a non-float input.
    """
    what = debug_name or "Pool"
    _check_input(params, input, what)
    check_mapped(graph, input, what)
    split = _kernel_split(graph, params, input.elementType())
    if split is not None:
        first, second = _split_params(params, split)
        part = _pool_once(graph, first, input, prog, f"{what}/kernelSplit")
        return _pool_once(graph, second, part, prog, what)
    return _pool_once(graph, params, input, prog, what)


def _pool_once(graph, params: PoolParams, input, prog, what: str):  # noqa: A002
    """One pooling compute set: ``params`` over ``input`` into a new linearly mapped tensor."""
    out = new_mapped(graph, input.elementType(), [params.batchSize, params.numChannels] + params.getOutputFieldShape(),
                     f"{what}/out")
    used, counts = tile_counts_of(graph, out)
    kind = "MaxPooling" if params.poolingType == PoolingType.MAX else "SumPooling"
    cs = graph.addComputeSet(what)
    graph.add_vertex_group(cs, VertexGroup(
        f"popnn::{kind}<{input.elementType()}>", used,
        _pool_cycles(counts, params, input.elementType(), graph.getTarget(), False),
        functools.partial(_pool_kernel, params, input, out), reads=_forward_reads(graph, params, input, out),
        writes=[Access(out)],
        multi=True, flops=float(getFwdFlops(params)), state_bytes=48))
    prog.add(poplar.program.Execute(cs, what))
    return out


def poolInputGradient(graph, params: PoolParams, *args, debug_name: str = "", options=None):  # noqa: N802
    """Gradient w.r.t. the pooling input (``popnn::pooling::poolInputGradient``).

    Overloads::

        poolInputGradient(graph, params, in, pooled, pooledGradient, useScaledGradient, prog, debug_name="")
        poolInputGradient(graph, params, fwdChansPerGroup, pooledGradient, prog, debug_name="")   # AVG / SUM

    MAX passes each output gradient to every window position equal to the pooled value (divided
    by their count when ``useScaledGradient``); SUM passes it to every window position; AVG
    divides it by the window's input count. Returns ``[B][C][..field..]`` mapped like ``in`` (or
    linearly).

    Raises:
        poplibs_error: the second overload with MAX, or shapes that do not match ``params``.
    """
    args = list(args)
    if isinstance(args[0], poplar.Tensor):
        fwd_in, pooled, grad, scaled, prog, *rest = args
    else:
        if params.poolingType == PoolingType.MAX:
            raise poplibs_error("poolInputGradient: MAX pooling needs the forward input and output; use the overload "
                                "(graph, params, in, pooled, pooledGradient, useScaledGradient, prog)")
        _, grad, prog, *rest = args
        fwd_in = pooled = None
        scaled = False
    what = (rest[0] if rest else "") or debug_name or "PoolGrad"
    out_shape = [params.batchSize, params.numChannels] + params.getOutputFieldShape()
    if grad.shape() != out_shape:
        raise poplibs_error(f"{what}: pooledGradient must have shape {out_shape}, got {grad.shape()}")
    et = grad.elementType()
    check_mapped(graph, grad, what)
    if fwd_in is not None:
        _check_input(params, fwd_in, what, "in")
        if pooled.shape() != out_shape:
            raise poplibs_error(f"{what}: pooled must have shape {out_shape}, got {pooled.shape()}")
        out = graph.clone(fwd_in, f"{what}/inGradient")
    else:
        out = new_mapped(graph, et, [params.batchSize, params.numChannels] + params.inputFieldShape,
                         f"{what}/inGradient")
    used, counts = tile_counts_of(graph, out)
    # each input-gradient element is computed on its own tile from the outputs whose windows hold it
    on = _grad_boxes(graph, params, out, grad)
    reads = [Access(grad, on)]
    if fwd_in is not None:
        reads += [Access(fwd_in, out), Access(pooled, on)]
    kind = "MaxPoolingGrad" if params.poolingType == PoolingType.MAX else "SumPooling"
    cs = graph.addComputeSet(what)
    graph.add_vertex_group(cs, VertexGroup(
        f"popnn::{kind}<{et}>", used, _pool_cycles(counts, params, et, graph.getTarget(), True),
        functools.partial(_grad_kernel, params, fwd_in, pooled, grad, out, bool(scaled)), reads=reads,
        writes=[Access(out)], multi=True, flops=float(getBwdFlops(params)), state_bytes=48))
    prog.add(poplar.program.Execute(cs, what))
    return out


def _register_records():
    from openipu.poplar.graph_codec import data_class, data_enum
    data_class(PoolParams)
    data_enum(PoolingType)


_register_records()
