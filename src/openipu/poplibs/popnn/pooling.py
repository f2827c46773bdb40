"""``popnn.pooling``: max, average and sum pooling (PopLibs ``include/popnn/Pooling.hpp``,
``PoolingDef.hpp``).

Inputs are ``[B][C][..field..]`` with 1 to 3 field dimensions. Each output field dimension is
``floor((in + padLower + padUpper - kernel) / stride) + 1``; negative padding truncates the input.
Padded positions never win a max and are not counted by AVG, which divides by the number of
*input* elements in each window [A] (torch's ``count_include_pad=False``).

Work: the output is mapped linearly; each tile runs a ``MaxPooling`` / ``SumPooling`` (AVG is a
scaled SumPooling) vertex over its outputs, reading the window inputs it needs (each input element
is costed as consumed by the tile of the first output whose window holds it). Cycle estimate per
tile, in the shape of PopLibs ``getPoolingCycles`` (``lib/popnn/PerformanceEstimation.hpp``):
``7 + 6 + 6 x worker``, ``worker = 19 + 2 + 6 + 2 + 3 + rows x (13 + 20 + 2) + v x (2 + c0 + 3 K + 1)``
with ``v`` the output vectors (vector width of the type) of the busiest worker, ``K`` the window
size, ``c0`` = 4 (max) / 5 (sum) forward and 7 with 5 cycles per element for the max gradient
(``rows``: output rows = outputs / last output field dim, per worker) [A: the row grouping].
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import VertexGroup
from openipu.poplibs.popnn._common import check_mapped, new_mapped, poplibs_error, tile_counts

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
def _consumer_tiles(p: PoolParams, out_tiles: np.ndarray) -> np.ndarray:
    """For each input element, the tile of the first output whose window reads it (-1: none)."""
    shape = [1, p.batchSize, p.numChannels] + p.inputFieldShape
    n_in = int(np.prod(shape))
    idx = torch.arange(n_in, dtype=torch.float64).reshape(shape)
    w = _windows(_pad(idx, p, -1.0), p).flatten(start_dim=-p.getNumFieldDims())
    src = w.reshape(-1).numpy().astype(np.int64)
    outs = np.repeat(np.arange(out_tiles.size), w.shape[-1])
    keep = src >= 0
    cons = np.full(n_in, -1, np.int64)
    first = np.full(n_in, np.iinfo(np.int64).max)
    np.minimum.at(first, src[keep], outs[keep])
    has = first != np.iinfo(np.int64).max
    cons[has] = out_tiles[first[has]]
    return cons


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


def pool(graph, params: PoolParams, input, prog, debug_name: str = "", options=None):  # noqa: A002
    """Pool ``input`` ``[B][C][..field..]`` (``popnn::pooling::pool``); returns ``[B][C][..outField..]``
    of the input's type, mapped linearly. Appends one compute set.

    Raises:
        poplibs_error: params that do not match the input, or a non-float input.
    """
    what = debug_name or "Pool"
    _check_input(params, input, what)
    check_mapped(graph, input, what)
    out = new_mapped(graph, input.elementType(), [params.batchSize, params.numChannels] + params.getOutputFieldShape(),
                     f"{what}/out")
    otiles = graph.tile_of_elements(out).astype(np.int64)
    used, counts = tile_counts(graph, otiles)
    cons = _consumer_tiles(params, otiles)
    own = graph.tile_of_elements(input).astype(np.int64)
    cons = np.where(cons >= 0, cons, own)
    kind = "MaxPooling" if params.poolingType == PoolingType.MAX else "SumPooling"
    cs = graph.addComputeSet(what)
    graph.add_vertex_group(cs, VertexGroup(
        f"popnn::{kind}<{input.elementType()}>", used,
        _pool_cycles(counts, params, input.elementType(), graph.getTarget(), False),
        functools.partial(_pool_kernel, params, input, out), reads=[(input, cons)], writes=[(out, otiles)],
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
    gtiles = check_mapped(graph, grad, what).astype(np.int64)
    if fwd_in is not None:
        _check_input(params, fwd_in, what, "in")
        if pooled.shape() != out_shape:
            raise poplibs_error(f"{what}: pooled must have shape {out_shape}, got {pooled.shape()}")
        out = graph.clone(fwd_in, f"{what}/inGradient")
    else:
        out = new_mapped(graph, et, [params.batchSize, params.numChannels] + params.inputFieldShape,
                         f"{what}/inGradient")
    itiles = graph.tile_of_elements(out).astype(np.int64)
    used, counts = tile_counts(graph, itiles)
    # each input-gradient element is computed on its own tile from the outputs whose windows hold it
    cons_out = np.full(grad.numElements(), -1, np.int64)
    back = _consumer_tiles(params, np.arange(grad.numElements()))      # first output reading each input
    has = back >= 0
    cons_out[back[has]] = itiles[has]
    cons_out = np.where(cons_out >= 0, cons_out, gtiles)
    reads = [(grad, cons_out)]
    if fwd_in is not None:
        reads += [(fwd_in, itiles), (pooled, cons_out)]
    kind = "MaxPoolingGrad" if params.poolingType == PoolingType.MAX else "SumPooling"
    cs = graph.addComputeSet(what)
    graph.add_vertex_group(cs, VertexGroup(
        f"popnn::{kind}<{et}>", used, _pool_cycles(counts, params, et, graph.getTarget(), True),
        functools.partial(_grad_kernel, params, fwd_in, pooled, grad, out, bool(scaled)), reads=reads,
        writes=[(out, itiles)], multi=True, flops=float(getBwdFlops(params)), state_bytes=48))
    prog.add(poplar.program.Execute(cs, what))
    return out
