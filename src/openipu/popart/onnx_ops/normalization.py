"""Normalisations: BatchNormalization, InstanceNormalization, LayerNormalization, GroupNormalization,
RMSNormalization, LpNormalization, MeanVarianceNormalization, LRN."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from openipu.popart.onnx_ops import onnx_op
from openipu.popart.onnx_ops._common import norm_axis, numel, opt


def _norm_flops(in_shapes, out_shapes, attrs):
    return 8.0 * numel(in_shapes[0])


def _stash(x, attrs):
    """The dtype statistics are computed in: float32 for half types unless stash_type says so."""
    if attrs.get("stash_type", 1) == 1 and x.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return x.dtype


def _bshape(t, rank):
    """A per-channel vector [C] as [1, C, 1, ...] for an input of ``rank``."""
    return t.reshape((1, -1) + (1,) * (rank - 2))


def bn_training(attrs, opset: int) -> bool:
    """Whether a BatchNormalization node runs in training mode: its ``training_mode`` (opset >= 14),
    else whether it has the running-statistics outputs (opsets 7-13; opset 6 also needs
    ``is_test=0``), as PopART's ``BatchNormOp`` decides."""
    if opset >= 14:
        return bool(attrs.get("training_mode", 0))
    return (opset >= 7 or not attrs.get("is_test", 0)) and attrs.get("__num_outputs__", 1) > 1


@onnx_op("BatchNormalization", flops=_norm_flops)
def batch_norm(inputs, attrs, opset):
    """Inference: the given statistics. Training: the batch statistics; outputs ``Y``, the
    running mean and variance (``input * momentum + batch * (1 - momentum)``, the batch variance
    biased), and for opsets < 14 the saved batch mean and variance (PopART's ``savedMean`` /
    ``savedVar``)."""
    x, scale, b, mean, var = inputs[:5]
    eps = attrs.get("epsilon", 1e-5)
    r = x.dim()
    if not bn_training(attrs, opset):
        y = (x - _bshape(mean, r)) / torch.sqrt(_bshape(var, r) + eps) * _bshape(scale, r) \
            + _bshape(b, r)
        return [y.to(x.dtype)]
    m = attrs.get("momentum", 0.9)
    dims = [0] + list(range(2, r))
    bm = x.mean(dims)
    bv = x.var(dims, unbiased=False)
    y = (x - _bshape(bm, r)) / torch.sqrt(_bshape(bv, r) + eps) * _bshape(scale, r) + _bshape(b, r)
    run_mean = mean * m + bm * (1 - m)
    run_var = var * m + bv * (1 - m)
    outs = [y.to(x.dtype), run_mean.to(mean.dtype), run_var.to(var.dtype), bm.to(mean.dtype), bv.to(var.dtype)]
    return outs[:5 if opset < 14 else 3]


@onnx_op("InstanceNormalization", flops=_norm_flops)
def instance_norm(inputs, attrs, opset):
    x, scale, b = inputs
    eps = attrs.get("epsilon", 1e-5)
    dims = list(range(2, x.dim()))
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    m = xf.mean(dims, keepdim=True)
    v = xf.var(dims, unbiased=False, keepdim=True)
    y = (xf - m) / torch.sqrt(v + eps) * _bshape(scale, x.dim()) + _bshape(b, x.dim())
    return [y.to(x.dtype)]


@onnx_op("LayerNormalization", flops=_norm_flops)
def layer_norm(inputs, attrs, opset):
    x, scale, b = inputs[0], inputs[1], opt(inputs, 2)
    axis = norm_axis(attrs.get("axis", -1), x.dim(), "LayerNormalization")
    eps = attrs.get("epsilon", 1e-5)
    st = _stash(x, attrs)
    xf = x.to(st)
    dims = list(range(axis, x.dim()))
    m = xf.mean(dims, keepdim=True)
    d = xf - m                  # computed once (a pass over x less), scaled in place below
    v = (d ** 2).mean(dims, keepdim=True)
    inv = 1.0 / torch.sqrt(v + eps)
    # in place unless autograd needs d (the gradient kernels differentiate this forward)
    y = (d * inv if d.requires_grad else d.mul_(inv)).to(x.dtype) * scale
    if b is not None:
        y = y + b
    return [y.to(x.dtype), m, inv]


@onnx_op("RMSNormalization", flops=_norm_flops)
def rms_norm(inputs, attrs, opset):
    x, scale = inputs[0], inputs[1]
    axis = norm_axis(attrs.get("axis", -1), x.dim(), "RMSNormalization")
    eps = attrs.get("epsilon", 1e-5)
    xf = x.to(_stash(x, attrs))
    dims = list(range(axis, x.dim()))
    inv = 1.0 / torch.sqrt((xf * xf).mean(dims, keepdim=True) + eps)
    return [((xf * inv).to(x.dtype) * scale).to(x.dtype)]


@onnx_op("GroupNormalization", flops=_norm_flops)
def group_norm(inputs, attrs, opset):
    x, scale, b = inputs
    g = attrs["num_groups"]
    eps = attrs.get("epsilon", 1e-5)
    n, c = x.shape[:2]
    xf = x.to(_stash(x, attrs))
    t = xf.reshape(n, g, -1)
    m = t.mean(-1, keepdim=True)
    v = t.var(-1, unbiased=False, keepdim=True)
    t = ((t - m) / torch.sqrt(v + eps)).reshape(x.shape).to(x.dtype)
    r = x.dim()
    if opset < 21 and scale.numel() == g and g != c:  # opset 18: one scale/bias per group
        scale = scale.repeat_interleave(c // g)
        b = b.repeat_interleave(c // g)
    return [t * _bshape(scale, r) + _bshape(b, r)]


@onnx_op("LpNormalization", flops=_norm_flops)
def lp_norm(inputs, attrs, opset):
    x = inputs[0]
    axis = norm_axis(attrs.get("axis", -1), x.dim(), "LpNormalization")
    p = attrs.get("p", 2)
    n = x.abs().sum(axis, keepdim=True) if p == 1 else torch.sqrt((x * x).sum(axis, keepdim=True))
    return [torch.where(n == 0, torch.zeros_like(x), x / torch.where(n == 0, 1, n)).to(x.dtype)]


@onnx_op("MeanVarianceNormalization", flops=_norm_flops)
def mean_variance_norm(inputs, attrs, opset):
    x = inputs[0]
    axes = list(attrs.get("axes", [0, 2, 3]))
    m = x.mean(axes, keepdim=True)
    std = torch.sqrt((x * x).mean(axes, keepdim=True) - m * m)
    return [((x - m) / (std + 1e-9)).to(x.dtype)]


@onnx_op("LRN", flops=_norm_flops)
def lrn(inputs, attrs, opset):
    x = inputs[0]
    size = attrs["size"]
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = (x * x).movedim(1, -1)
    sq = F.pad(sq, (lo, hi))
    win = sq.unfold(-1, size, 1).sum(-1).movedim(-1, 1)  # [N, C, ...]
    return [(x / (bias + alpha / size * win) ** beta).to(x.dtype)]
