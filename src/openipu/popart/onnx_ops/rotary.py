"""RotaryEmbedding (opset 23): rotary position embedding of ``X`` ([B, S, hidden] with
``num_heads``, or [B, heads, S, head]) with cos/sin caches, optionally gathered by
``position_ids``; ``interleaved`` pairs (even, odd) elements instead of (first half, second half);
``rotary_embedding_dim`` rotates only the leading part of each head."""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import opt


def _rotary_flops(i, o, a):
    """3 flops per output element (2 mul, 1 add) [A]"""
    return 3.0 * math.prod(o[0])


@onnx_op("RotaryEmbedding", flops=_rotary_flops)
def rotary_embedding(inputs, attrs, opset):
    x, cos, sin, pos = inputs[0], inputs[1], inputs[2], opt(inputs, 3)
    shape = x.shape
    if x.dim() == 4:
        h = x.transpose(1, 2)                         # [B, S, heads, head]
    elif x.dim() == 3:
        nh = int(attrs.get("num_heads", 0))
        if nh <= 0:
            raise OnnxKernelError("RotaryEmbedding: a 3-D input needs the num_heads attribute")
        h = x.reshape(shape[0], shape[1], nh, shape[2] // nh)
    else:
        raise OnnxKernelError(f"RotaryEmbedding: input must be 3-D or 4-D, got {x.dim()}-D")
    rd = int(attrs.get("rotary_embedding_dim", 0)) or h.shape[-1]
    if pos is not None:
        cos, sin = cos[pos.long()], sin[pos.long()]
    if cos.shape[-1] != rd // 2 or sin.shape[-1] != rd // 2:
        raise OnnxKernelError(f"RotaryEmbedding: cache last dimension {cos.shape[-1]} is not "
                              f"rotary_embedding_dim/2 = {rd // 2}")
    cos, sin = cos.unsqueeze(2).to(x.dtype), sin.unsqueeze(2).to(x.dtype)
    rot, keep = h[..., :rd], h[..., rd:]
    if attrs.get("interleaved", 0):
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., :rd // 2], rot[..., rd // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if attrs.get("interleaved", 0):
        rot = torch.stack((real, imag), dim=-1).reshape(rot.shape)
    else:
        rot = torch.cat((real, imag), dim=-1)
    out = torch.cat((rot, keep), dim=-1)
    return [out.reshape(shape) if x.dim() == 3 else out.transpose(1, 2).contiguous()]
