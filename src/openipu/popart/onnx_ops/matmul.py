"""Matrix-product ONNX operators: MatMul, Gemm, MatMulInteger, QLinearMatMul, Einsum, Det."""

from __future__ import annotations

import math
import re

import torch

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import numel, opt


def _matmul_flops(in_shapes, out_shapes, attrs):
    k = in_shapes[0][-1] if len(in_shapes[0]) else 1
    return 2.0 * math.prod(out_shapes[0]) * k


def _mm(a, b):
    """torch.matmul in a dtype with CPU kernels (integers through int64, low floats as given)."""
    if not a.dtype.is_floating_point:
        return torch.matmul(a.to(torch.int64), b.to(torch.int64)).to(a.dtype)
    return torch.matmul(a, b)


@onnx_op("MatMul", flops=_matmul_flops)
def matmul(inputs, attrs, opset):
    return [_mm(inputs[0], inputs[1])]


def _gemm_flops(in_shapes, out_shapes, attrs):
    a = in_shapes[0]
    k = a[0] if attrs.get("transA", 0) else a[-1]
    return 2.0 * math.prod(out_shapes[0]) * k + 2.0 * math.prod(out_shapes[0])


@onnx_op("Gemm", flops=_gemm_flops)
def gemm(inputs, attrs, opset):
    a, b = inputs[0], inputs[1]
    c = opt(inputs, 2)
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    y = _mm(a, b)
    if alpha != 1.0:
        y = (alpha * y).to(y.dtype)
    if c is not None:
        y = y + (beta * c).to(y.dtype) if beta != 1.0 else y + c
    return [y]


def _zp(zp, t, axis_rows):
    """Zero point as a broadcastable int64 tensor (per-row for A, per-column for B, or scalar)."""
    if zp is None:
        return torch.zeros((), dtype=torch.int64, device=t.device)
    zp = zp.to(torch.int64)
    if zp.dim() >= 1 and zp.numel() > 1:
        if axis_rows:  # A: one per row (M) -> [..., M, 1]
            return zp.reshape(zp.shape + (1,)) if zp.dim() == 1 else zp
        return zp if zp.dim() > 1 else zp.reshape(1, -1)
    return zp.reshape(())


@onnx_op("MatMulInteger", flops=_matmul_flops)
def matmul_integer(inputs, attrs, opset):
    a, b = inputs[0], inputs[1]
    a = a.to(torch.int64) - _zp(opt(inputs, 2), a, True)
    b = b.to(torch.int64) - _zp(opt(inputs, 3), b, False)
    return [torch.matmul(a, b).to(torch.int32)]


def _scale(s, rows):
    s = s.to(torch.float64)
    if s.numel() > 1 and s.dim() == 1:
        return s.reshape(-1, 1) if rows else s.reshape(1, -1)
    return s


def saturate_cast(v: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """Round half to even and clamp into integer dtype ``dt``."""
    info = torch.iinfo(dt)
    return torch.round(v).clamp(info.min, info.max).to(dt)


@onnx_op("QLinearMatMul", flops=_matmul_flops)
def qlinear_matmul(inputs, attrs, opset):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs
    if a.dtype.is_floating_point or b.dtype.is_floating_point:
        raise OnnxKernelError("QLinearMatMul: float8 inputs are not supported")
    av = (a.to(torch.float64) - _zp(a_zp, a, True).to(torch.float64)) * _scale(a_s, True)
    bv = (b.to(torch.float64) - _zp(b_zp, b, False).to(torch.float64)) * _scale(b_s, False)
    y = torch.matmul(av, bv) / y_s.to(torch.float64) + y_zp.to(torch.float64)
    return [saturate_cast(y, y_zp.dtype)]


def _einsum_flops(in_shapes, out_shapes, attrs):
    eq = attrs.get("equation", "").replace(" ", "")
    lhs = eq.split("->")[0].split(",")
    sizes = {}
    for term, shape in zip(lhs, in_shapes):
        letters = [c for c in term if c.isalpha()]
        for c, d in zip(letters, shape[len(shape) - len(letters):] if "..." in term else shape):
            sizes[c] = d
    return 2.0 * max(math.prod(sizes.values()) if sizes else 1, numel(out_shapes[0]))


@onnx_op("Einsum", flops=_einsum_flops)
def einsum(inputs, attrs, opset):
    eq = re.sub(r"\s+", "", attrs["equation"])
    xs = list(inputs)
    if not xs[0].dtype.is_floating_point:
        dt = xs[0].dtype
        return [torch.einsum(eq, *[x.to(torch.int64) for x in xs]).to(dt)]
    return [torch.einsum(eq, *xs)]


@onnx_op("Det")
def det(inputs, attrs, opset):
    x = inputs[0]
    return [torch.linalg.det(x.double() if x.dtype in (torch.float16, torch.bfloat16) else x)
            .to(x.dtype)]
