"""Attention (opset 23/24): 3-D or 4-D Q/K/V, grouped-query heads, past key/value cache,
boolean or additive masks (short masks padded), causal and sliding-window biases, nonpad_kv_seqlen,
softcap, qk_matmul_output modes, softmax_precision."""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import onnx_op
from openipu.popart.onnx_ops._common import numel, opt, torch_dtype


def _attention_flops(in_shapes, out_shapes, attrs):
    q, k = in_shapes[0], in_shapes[1]
    # QK^T and PV: 2 * B * Sq * Skv * hidden each (hidden = heads * head size).
    skv = k[-2] if len(k) == 4 else k[1]
    return 4.0 * numel(q) * skv


def _split_heads(t, heads):
    b, s, h = t.shape
    return t.reshape(b, s, heads, h // heads).transpose(1, 2)


def _window(base, q, kv, offset, left, right):
    """Bias adding -inf outside ``p - left <= j <= p + right`` with ``p = i + offset``."""
    i = torch.arange(q, device=base.device).reshape(q, 1)
    j = torch.arange(kv, device=base.device).reshape(1, kv)
    if isinstance(offset, torch.Tensor):
        diff = (i + offset.reshape(-1, 1, 1)) - j
    else:
        diff = (i + int(offset)) - j
    allowed = torch.ones_like(diff, dtype=torch.bool)
    if left is not None and left >= 0:
        allowed &= diff <= left
    if right is not None and right >= 0:
        allowed &= -diff <= right
    bias = torch.where(allowed, torch.zeros((), dtype=base.dtype, device=base.device),
                       torch.full((), -math.inf, dtype=base.dtype, device=base.device))
    if bias.dim() == 3:
        bias = bias.reshape(bias.shape[0], 1, q, kv)
    return base + bias


@onnx_op("Attention", flops=_attention_flops)
def attention(inputs, attrs, opset):
    q, k, v = inputs[0], inputs[1], inputs[2]
    mask, past_k, past_v = opt(inputs, 3), opt(inputs, 4), opt(inputs, 5)
    nonpad = opt(inputs, 6)
    dt = q.dtype
    rank3 = q.dim() == 3
    qh, kvh = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
    if rank3:
        q, k, v = _split_heads(q, qh), _split_heads(k, kvh), _split_heads(v, kvh)
    scale = attrs.get("scale")
    if scale is None:
        scale = 1 / math.sqrt(q.shape[3])
    s = torch.tensor(math.sqrt(scale), dtype=torch.float32, device=q.device).to(dt)
    pk = torch.cat([past_k, k], 2) if past_k is not None else k
    pv = torch.cat([past_v, v], 2) if past_v is not None else v
    k, v = pk, pv
    sq, skv = q.shape[2], k.shape[2]
    bias = torch.zeros((sq, skv), dtype=dt, device=q.device)
    if mask is not None and mask.shape[-1] < skv:
        padv = False if mask.dtype == torch.bool else -math.inf
        mask = torch.nn.functional.pad(mask, (0, skv - mask.shape[-1]), value=padv)
    left, right = attrs.get("left_window_size", -1), attrs.get("right_window_size", -1)
    if attrs.get("is_causal", 0):
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.where(mask, torch.zeros((), dtype=dt, device=q.device),
                               torch.full((), -math.inf, dtype=dt, device=q.device))
        base = torch.zeros((sq, skv), dtype=dt, device=q.device) if mask is None else mask.clone()
        if past_k is None and nonpad is not None:
            off = nonpad.reshape(-1).to(torch.int64) - sq
        else:
            off = past_k.shape[2] if past_k is not None else 0
        bias = _window(base, sq, skv, off, -1, 0)  # causal: j <= i + offset
    elif mask is not None:
        if mask.dtype == torch.bool:
            mask = torch.where(mask, torch.zeros((), dtype=dt, device=q.device),
                               torch.full((), -math.inf, dtype=dt, device=q.device))
        bias = bias + mask
    if left >= 0 or right >= 0:
        if past_k is None and nonpad is not None:
            off = nonpad.reshape(-1).to(torch.int64) - sq
        else:
            off = past_k.shape[2] if past_k is not None else 0
        bias = _window(torch.zeros((sq, skv), dtype=dt, device=q.device) + bias, sq, skv, off, left, right)
    if nonpad is not None:
        keep = torch.arange(skv, device=q.device)[None, :] < nonpad.reshape(-1, 1).to(torch.int64)
        bias = bias + torch.where(keep, 0.0, -math.inf).to(bias.dtype).reshape(-1, 1, 1, skv)
    nq = q.shape[1]
    nk = k.shape[1] if kvh is None else kvh
    if nq != nk and nq % nk == 0:
        k = k.repeat_interleave(nq // nk, 1)
        v = v.repeat_interleave(nq // nk, 1)
    qk = torch.matmul(q * s, (k * s).transpose(-1, -2))
    softcap = attrs.get("softcap")
    if softcap is not None and softcap > 0:
        qk = torch.tanh(qk / softcap) * softcap
    with_bias = qk + bias
    mode = attrs.get("qk_matmul_output_mode", 0)
    qk_out = qk
    if mode == 2 or (mode == 1 and softcap is None):
        qk_out = with_bias.clone() if mode == 2 else qk
    if "softmax_precision" in attrs:
        with_bias = with_bias.to(torch_dtype(attrs["softmax_precision"]))
    mx = with_bias.amax(-1, keepdim=True)
    all_masked = torch.isneginf(mx)
    e = torch.exp(with_bias - torch.where(all_masked, torch.zeros_like(mx), mx))
    ssum = e.sum(-1, keepdim=True)
    sm = e / torch.where(ssum == 0, torch.ones_like(ssum), ssum)
    bias_masked = torch.isneginf(bias.amax(-1, keepdim=True)) if bias.numel() else \
        torch.zeros((), dtype=torch.bool, device=sm.device)
    sm = torch.where(bias_masked, torch.zeros((), dtype=sm.dtype, device=sm.device), sm)
    if mode == 3:
        qk_out = sm
    sm = sm.to(dt)
    y = torch.matmul(sm, v)
    if rank3:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    return [y.contiguous(), pk, pv, qk_out.to(dt)]
