"""Gated and cache-update ops of recent opsets: SwiGLU (``swish_alpha(A) * B``, equal shapes, no
broadcasting) and TensorScatter (KV-cache update: ``update`` written into ``past_cache`` along
``axis`` at per-batch ``write_indices``, ``linear`` or ``circular`` mode)."""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import opt


def _swiglu_flops(i, o, a):
    """sigmoid (~4), two multiplies and the alpha scale per element [A]"""
    return 7.0 * math.prod(o[0])


@onnx_op("SwiGLU", flops=_swiglu_flops)
def swiglu(inputs, attrs, opset):
    a, b = inputs[0], inputs[1]
    if a.shape != b.shape or a.dtype != b.dtype:
        raise OnnxKernelError(f"SwiGLU: A and B must have one shape and type (no broadcasting), got "
                              f"{list(a.shape)} {a.dtype} and {list(b.shape)} {b.dtype}")
    alpha = float(attrs.get("alpha", 1.0))
    return [(a * torch.sigmoid(alpha * a).to(a.dtype) * b).to(a.dtype)]


@onnx_op("TensorScatter")
def tensor_scatter(inputs, attrs, opset):
    cache, update, idx = inputs[0], inputs[1], opt(inputs, 2)
    mode = attrs.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise OnnxKernelError(f"TensorScatter: mode must be 'linear' or 'circular', got {mode!r}")
    axis = int(attrs.get("axis", -2)) % cache.dim()
    if axis == 0:
        raise OnnxKernelError("TensorScatter: axis must not be the batch axis 0")
    for d in range(cache.dim()):
        if d != axis and cache.shape[d] != update.shape[d] or d == axis and update.shape[d] > cache.shape[d]:
            raise OnnxKernelError(f"TensorScatter: update shape {list(update.shape)} does not fit cache shape "
                                  f"{list(cache.shape)} along axis {axis}")
    n_batch, max_len, seq = cache.shape[0], cache.shape[axis], update.shape[axis]
    start = idx.to(cache.device, torch.int64) if idx is not None else \
        torch.zeros(n_batch, dtype=torch.int64, device=cache.device)
    pos = start.reshape(-1, 1) + torch.arange(seq, dtype=torch.int64, device=cache.device)          # [batch, seq]
    if mode == "circular":
        pos = pos % max_len
    if ((pos < 0) | (pos >= max_len)).any():
        raise OnnxKernelError("TensorScatter: write_indices + update length run past the cache (linear mode)")
    out = cache.clone()
    shape = [n_batch] + [1] * (cache.dim() - 1)
    shape[axis] = seq
    index = pos.reshape(shape).expand(update.shape)
    out.scatter_(axis, index, update)
    return [out]
