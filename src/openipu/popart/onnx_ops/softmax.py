"""Softmax family (Softmax, LogSoftmax, Hardmax) and the losses built on it
(NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import norm_axis, numel, opt


def _softmax_flops(in_shapes, out_shapes, attrs):
    return 5.0 * numel(in_shapes[0])


def _along(fn, x, attrs, opset):
    """Apply ``fn(t, dim)``: opset < 13 coerces to 2-D at ``axis`` (default 1), >= 13 uses ``axis``
    (default -1)."""
    if x.dim() == 0:
        return fn(x.reshape(1, 1), 1).reshape(())
    if opset < 13:
        axis = norm_axis(attrs.get("axis", 1), x.dim(), "Softmax")
        t = x.reshape(numel(x.shape[:axis]), numel(x.shape[axis:]))
        return fn(t, 1).reshape(x.shape)
    return fn(x, norm_axis(attrs.get("axis", -1), x.dim(), "Softmax"))


def _hardmax(t, dim):
    idx = torch.argmax(t, dim, keepdim=True)
    return torch.zeros_like(t).scatter(dim, idx, 1)


def _kernel(fn, inputs, attrs, opset):
    return [_along(fn, inputs[0], attrs, opset)]


onnx_op("Softmax", flops=_softmax_flops)(functools.partial(_kernel, torch.softmax))
onnx_op("LogSoftmax", flops=_softmax_flops)(functools.partial(_kernel, torch.log_softmax))
onnx_op("Hardmax")(functools.partial(_kernel, _hardmax))


def _nll(logp, target, weight, reduction, ignore_index):
    target = target.to(torch.int64)
    dt = logp.dtype
    lp = logp.float() if dt in (torch.float16, torch.bfloat16) else logp
    w = weight.to(lp.dtype) if weight is not None else None
    if ignore_index is None:
        return F.nll_loss(lp, target, weight=w, reduction=reduction).to(dt)
    # ignore_index may lie outside [0, C): gather at class 0 there and weight it 0.
    mask = target == ignore_index
    safe_t = torch.where(mask, torch.zeros_like(target), target)
    per = -torch.gather(lp, 1, safe_t.unsqueeze(1)).squeeze(1)
    wt = w[safe_t] if w is not None else torch.ones_like(per)
    wt = torch.where(mask, torch.zeros_like(wt), wt)
    per = per * wt
    if reduction == "none":
        return per.to(dt)
    if reduction == "sum":
        return per.sum().to(dt)
    return (per.sum() / wt.sum()).to(dt)


def _reduction(attrs):
    r = attrs.get("reduction", "mean")
    if r not in ("none", "sum", "mean"):
        raise OnnxKernelError(f"reduction must be none, sum or mean, got {r!r}")
    return r


@onnx_op("NegativeLogLikelihoodLoss", flops=_softmax_flops)
def nll_loss(inputs, attrs, opset):
    return [_nll(inputs[0], inputs[1], opt(inputs, 2), _reduction(attrs),
                 attrs.get("ignore_index"))]


@onnx_op("SoftmaxCrossEntropyLoss", flops=_softmax_flops)
def softmax_cross_entropy_loss(inputs, attrs, opset):
    scores = inputs[0]
    logp = torch.log_softmax(scores.float() if scores.dtype == torch.float16 else scores, 1)
    logp = logp.to(scores.dtype)
    loss = _nll(logp, inputs[1], opt(inputs, 2), _reduction(attrs), attrs.get("ignore_index"))
    return [loss, logp]
