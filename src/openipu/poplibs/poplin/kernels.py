"""Host kernels of a planned convolution's vertices: the partial sums of a tile's work blocks and
their reduction, computed with whole-block torch operations in the numerics the plan's types
give (fp32 partials summed in fp64 and rounded once; half partials in half)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from openipu import poplar
from openipu.poplar import quarter
from openipu.poplar.graph_codec import kernel
from openipu.poplar.threads import one_torch_thread


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


def host_threads(work: int):
    """A context running the enclosed host kernel on one thread when ``work`` is below
    :data:`HOST_SERIAL_WORK` (:func:`openipu.poplar.threads.one_torch_thread`), else as it is."""
    return contextlib.nullcontext() if work >= HOST_SERIAL_WORK else one_torch_thread()


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


def _register_records():
    from openipu.poplar.graph_codec import data_class
    data_class(_Spec)


_register_records()
