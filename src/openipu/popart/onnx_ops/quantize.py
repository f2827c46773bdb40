"""Linear quantisation: QuantizeLinear, DequantizeLinear (per-tensor, per-axis, blocked; integer
and float8), DynamicQuantizeLinear."""

from __future__ import annotations

import torch

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import FLOAT8, norm_axis, opt, torch_dtype
from openipu.popart.onnx_ops.elementwise import cast_to


def _expand_param(p, x, attrs):
    """Scale/zero point broadcast against ``x``: scalar, per-axis 1-D, or blocked (same rank)."""
    if p.dim() == 0 or p.numel() == 1:
        return p.reshape(())
    axis = norm_axis(attrs.get("axis", 1), x.dim(), "QuantizeLinear")
    bs = attrs.get("block_size", 0)
    if bs:
        return p.repeat_interleave(bs, dim=axis).narrow(axis, 0, x.shape[axis])
    shape = [1] * x.dim()
    shape[axis] = -1
    return p.reshape(shape)


@onnx_op("QuantizeLinear")
def quantize_linear(inputs, attrs, opset):
    x, scale, zp = inputs[0], inputs[1], opt(inputs, 2)
    if zp is not None:
        out_dt = zp.dtype
    elif attrs.get("output_dtype"):
        out_dt = torch_dtype(attrs["output_dtype"])
    else:
        out_dt = torch.uint8
    comp = torch.float64 if x.dtype == torch.float64 else torch.float32
    s = _expand_param(scale, x, attrs).to(comp)
    v = x.to(comp) / s
    if out_dt in FLOAT8:
        if zp is not None:
            v = v + _expand_param(zp, x, attrs).to(comp)
        return [cast_to(v, out_dt, attrs.get("saturate", 1))]
    if out_dt.is_floating_point:
        raise OnnxKernelError(f"QuantizeLinear: output type {out_dt} is not a quantised type")
    v = torch.round(v)
    if zp is not None:
        v = v + _expand_param(zp, x, attrs).to(comp)
    info = torch.iinfo(out_dt) if out_dt != torch.uint16 and out_dt != torch.uint32 else None
    lo, hi = (info.min, info.max) if info else (0, 65535 if out_dt == torch.uint16 else 2**32 - 1)
    v = v.clamp(lo, hi)
    return [v.to(torch.int64).to(out_dt) if out_dt in (torch.uint16, torch.uint32) else v.to(out_dt)]


@onnx_op("DequantizeLinear")
def dequantize_linear(inputs, attrs, opset):
    x, scale, zp = inputs[0], inputs[1], opt(inputs, 2)
    out_dt = torch_dtype(attrs["output_dtype"]) if attrs.get("output_dtype") else scale.dtype
    comp = torch.float64 if out_dt == torch.float64 else torch.float32
    xv = x.to(torch.int64).to(comp) if x.dtype in (torch.uint16, torch.uint32) else x.to(comp)
    if zp is not None:
        z = _expand_param(zp, x, attrs)
        zv = z.to(torch.int64).to(comp) if z.dtype in (torch.uint16, torch.uint32) else z.to(comp)
        xv = xv - zv
    return [(xv * _expand_param(scale, x, attrs).to(comp)).to(out_dt)]


@onnx_op("DynamicQuantizeLinear")
def dynamic_quantize_linear(inputs, attrs, opset):
    x = inputs[0].to(torch.float32)
    rmin = torch.clamp(x.min(), max=0.0) if x.numel() else torch.tensor(0.0, device=x.device)
    rmax = torch.clamp(x.max(), min=0.0) if x.numel() else torch.tensor(0.0, device=x.device)
    scale = ((rmax - rmin) / 255.0).to(torch.float32)
    s = torch.where(scale == 0, torch.ones_like(scale), scale)
    zp = torch.round((0 - rmin) / s).clamp(0, 255)
    y = (torch.round(x / s) + zp).clamp(0, 255).to(torch.uint8)
    return [y, scale, zp.to(torch.uint8)]
