"""Normalisations: GroupNormalization (outputs y, mean, inverse std-dev), NormalizeImage and
PopART's ai.graphcore BatchNormalization variant. ``batch_norm_setup`` is the op's ``setup()``
check (``ValueError`` with PopART's message).
"""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops._registry import _gc, pshape


def group_norm_layout(x: torch.Tensor, groups: int, strided: bool) -> torch.Tensor:
    """``x [N, C, ...]`` viewed as ``[N, G, C/G, F]``: contiguous channel groups (``c // (C/G)``),
    or strided ones (``c % G``, PopLibs' ``groupNormStridedChannelGrouping``)."""
    n, c = x.shape[0], x.shape[1]
    if strided:
        return x.reshape(n, c // groups, groups, -1).transpose(1, 2)
    return x.reshape(n, groups, c // groups, -1)


def group_norm(x, scale, bias, groups: int, eps: float, strided: bool):
    """``(y, mean [N*G], invStdDev [N*G])`` of group normalisation (biased variance, float math)."""
    n, c = x.shape[0], x.shape[1]
    if groups < 1 or c % groups:
        raise ValueError(f"GroupNormalization: {c} channels do not split into {groups} groups")
    v = group_norm_layout(x.float(), groups, strided)
    mean = v.mean(dim=(2, 3), keepdim=True)
    var = ((v - mean) ** 2).mean(dim=(2, 3), keepdim=True)
    inv = torch.rsqrt(var + eps)
    w = (v - mean) * inv
    w = (w.transpose(1, 2) if strided else w).reshape(x.shape)
    shape = [1, c] + [1] * (x.dim() - 2)
    y = w * scale.float().reshape(shape) + bias.float().reshape(shape)
    return y, mean.reshape(n * groups), inv.reshape(n * groups)


@_gc("GroupNormalization", flops=lambda i, o, a: 8.0 * math.prod(i[0]))
def group_normalization(inputs, attrs, opset):
    """PopART's ``GroupNormalization``: ``[x [N, C, ...], scale [C], bias [C]] -> [y, mean
    [N*G], invStdDev [N*G]]`` (contiguous groups unless ``stridedChannelGrouping``)."""
    x, scale, bias = inputs
    y, mean, inv = group_norm(x, scale, bias, int(attrs["num_groups"]), float(attrs.get("epsilon", 1e-5)),
                              bool(attrs.get("stridedChannelGrouping", 0)))
    return [y.to(x.dtype), mean.to(x.dtype), inv.to(x.dtype)]


@_gc("NormalizeImage", flops=lambda i, o, a: 3.0 * math.prod(o[0]))
def normalize_image(inputs, attrs, opset):
    """PopART's ``NormalizeImage`` (``popops::normaliseImage``): ``[image [..., 3], offsets [3],
    scales [3]] -> [..., 4]``: ``(image * scale - offsets[c]) * scales[c]``, a zero 4th channel;
    UINT8 images give FLOAT16."""
    img, off, sc = inputs
    if img.shape[-1] != 3:
        raise ValueError(f"NormalizeImage: the image's inner dimension must be 3 channels, got {list(img.shape)}")
    dt = torch.float16 if not img.is_floating_point() else img.dtype
    y = (img.float() * float(attrs.get("scale", 1.0)) - off.float()) * sc.float()
    return [torch.cat([y, torch.zeros(list(y.shape[:-1]) + [1], device=y.device)], -1).to(dt)]


def batch_norm_setup(xs, params: dict, spatial: bool) -> None:
    """PopART's ``BatchNormOp::setup`` checks: ``x`` of rank >= 3, and each of ``params``
    (name -> shape: scale, B, mean, var) ``[C]`` (``spatial``) or ``x.shape[1:]``."""
    if len(xs) < 3:
        raise ValueError(f"batch norm requires X to have a rank >= 3.  x has rank {len(xs)}")
    want, what = ([xs[1]], "dimension 1") if spatial else (list(xs[1:]), "all but the first dimension")
    for name, s in params.items():
        if s is not None and list(s) != want:
            raise ValueError(f"expected shape of batch norm input tensor {name} ({pshape(s)}) to be {pshape(want)} "
                             f"to match {what} of X ({pshape(xs)})")


def _bn_flops(i, o, a):
    return 8.0 * math.prod(i[0])


@_gc("BatchNormalization", flops=_bn_flops)
def gc_batch_norm(inputs, attrs, opset):
    """PopART's ``ai.graphcore`` ``BatchNormalization`` (``aiGraphcore.batchnormalization``):
    ONNX BatchNormalization-9 whose batch variance is the unbiased one (PyTorch's running
    variance). ``[x, scale, B, mean, var]``; one output (inference: the given statistics) or
    five (training, PopART's rule ``outputs > 1``: the batch statistics normalise, and
    ``[y, running mean, running var, saved mean, saved var]`` with ``running = (1 - momentum) *
    batch + momentum * input``). The saved variance is PopART's: the biased batch variance's
    inverse standard deviation scaled by ``sqrt((n - 1) / n)`` and turned back into a variance,
    ``(var_b + eps) n / (n - 1) - eps`` (``n`` values per channel). ``spatial=0`` normalises each
    feature of ``x.shape[1:]`` separately."""
    x, scale, b, mean, var = inputs[:5]
    xs = list(x.shape)
    spatial = bool(attrs.get("spatial", 1))
    batch_norm_setup(xs, {"scale": scale.shape, "B": b.shape, "mean": mean.shape, "var": var.shape}, spatial)
    eps, m = float(attrs.get("epsilon", 1e-5)), float(attrs.get("momentum", 0.9))
    pshape_ = list(scale.shape)
    if not spatial:
        x = x.reshape(xs[0], -1, 1)
    c = x.shape[1]
    bshape = [1, c] + [1] * (x.dim() - 2)
    xf = x.float()
    sc, bi = scale.float().reshape(bshape), b.float().reshape(bshape)
    if int(attrs.get("__num_outputs__", 1)) <= 1:
        y = (xf - mean.float().reshape(bshape)) * torch.rsqrt(var.float().reshape(bshape) + eps) * sc + bi
        return [y.reshape(xs).to(x.dtype)]
    n = x.numel() // max(c, 1)
    if n > 1:
        # one fused pass for the batch statistics and the normalisation (PyTorch's training
        # batch norm: the biased variance's 1 / sqrt(var + eps), as below), not six
        y, bm, inv = torch.ops.aten._native_batch_norm_legit.no_stats(
            xf, sc.reshape(-1), bi.reshape(-1), True, 0.0, eps)
    else:
        dims = [0] + list(range(2, x.dim()))
        bm = xf.mean(dims)
        inv = torch.rsqrt(xf.var(dims, unbiased=False) + eps)
        y = (xf - bm.reshape(bshape)) * inv.reshape(bshape) * sc + bi
    inv_u = inv * math.sqrt((n - 1) / n) if n else inv
    saved_var = 1.0 / (inv_u * inv_u) - eps
    run_mean = (1 - m) * bm + m * mean.float().reshape(-1)
    run_var = (1 - m) * saved_var + m * var.float().reshape(-1)
    outs = [y.reshape(xs).to(x.dtype), run_mean.reshape(pshape_).to(mean.dtype),
            run_var.reshape(pshape_).to(var.dtype), bm.reshape(pshape_).to(mean.dtype),
            saved_var.reshape(pshape_).to(var.dtype)]
    return outs[:int(attrs.get("__num_outputs__", 5))]
