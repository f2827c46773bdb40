"""``ai.graphcore::FusedAttention`` (PopRT's fused attention, produced by the ``fused_attention``
pass): ``softmax(scale * q @ k_t + bias, axis=-1) @ v``.

Inputs: ``q[..., Sq, D]``, ``k_t[..., D, Skv]``, ``v[..., Skv, Dv]``, optional ``bias``
broadcastable to ``[..., Sq, Skv]`` (additive mask). Attributes: ``scale`` (float, 1.0),
``nan_to_zero`` (int, 0: if 1, rows that are all ``-inf`` give 0, not NaN). Output
``[..., Sq, Dv]`` in ``q``'s type; the scores and softmax are computed in float32.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import onnx_op


def _flops(in_shapes, out_shapes, attrs):
    q, kt = in_shapes[0], in_shapes[1]
    return 4.0 * math.prod(q) * kt[-1] + 5.0 * math.prod(q[:-1]) * kt[-1]


@onnx_op("FusedAttention", domain="ai.graphcore", flops=_flops)
def fused_attention(inputs, attrs, opset):
    q, kt, v = inputs[0], inputs[1], inputs[2]
    bias = inputs[3] if len(inputs) > 3 else None
    s = torch.matmul(q.float(), kt.float()) * float(attrs.get("scale", 1.0))
    if bias is not None:
        s = s + bias.float()
    p = torch.softmax(s, dim=-1)
    if int(attrs.get("nan_to_zero", 0)):
        p = torch.nan_to_num(p, nan=0.0)
    return [torch.matmul(p, v.float()).to(q.dtype)]


def _layer_norm_flops(in_shapes, out_shapes, attrs):
    """About 8 flops per output element (mean, variance, normalise, scale and shift)."""
    return 8.0 * math.prod(out_shapes[0])


@onnx_op("LayerNorm", domain="ai.graphcore", flops=_layer_norm_flops)
def layer_norm(inputs, attrs, opset):
    """``ai.graphcore::LayerNorm(x, gamma, beta)`` over the last axis (``layer_norm_pattern`` on
    models older than opset 17); ``epsilon`` attribute (1e-5)."""
    x, gamma, beta = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    y = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), gamma.float().reshape(-1),
                                       None if beta is None else beta.float().reshape(-1), float(attrs.get("epsilon", 1e-5)))
    return [y.to(x.dtype)]
