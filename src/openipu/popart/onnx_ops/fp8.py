"""fp8 operators of PopRT's fp8 conversion (``precision='fp8'`` / ``'fp8_weight'``), ai.graphcore domain.

Formats (PopRT's ``fp8_params`` names): ``F143`` = 1 sign, 4 exponent, 3 mantissa bits (E4M3,
``torch.float8_e4m3fn``, max 448), ``F152`` = E5M2 (``torch.float8_e5m2``, max 57344). A tensor
``t`` with scale ``s`` (an integer, a power of two) is stored as ``fp8(t * 2**s)``, saturated to
the format's range.

- ``FP8MatMul(x, w[, bias])``: ``y = (q(x) @ w) * 2**-(in_scale + weight_scale) + bias`` with
  ``q(x) = fp8_{in_format}(x * 2**in_scale)`` (no quantisation of ``x`` when ``in_format`` is
  empty: fp8_weight). ``w`` holds fp8 values (the codes' values, exact in float16), ``[K, N]``.
- ``FP8Conv(x, w[, bias])``: the same around an ONNX ``Conv`` (its attributes: ``strides``,
  ``pads``, ``dilations``, ``group``, ``kernel_shape``, ``auto_pad``); ``w`` ``[M, C/group, *k]``.

Output type: ``x``'s (float16 after conversion). Products accumulate in float32.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import OnnxKernelError, get_kernel, onnx_op

FORMATS = {"F143": torch.float8_e4m3fn, "F152": torch.float8_e5m2}
MAX = {"F143": 448.0, "F152": 57344.0}


def quantize(x: torch.Tensor, fmt: str, scale: int) -> torch.Tensor:
    """``fp8_fmt(x * 2**scale)`` as float32 values (a real round trip through torch's fp8 type,
    saturating at the format's maximum; NaN stays NaN)."""
    if fmt not in FORMATS:
        raise OnnxKernelError(f"fp8 format must be F143 or F152, got {fmt!r}")
    y = x.float() * (2.0 ** int(scale))
    y = torch.clamp(y, -MAX[fmt], MAX[fmt])
    return y.to(FORMATS[fmt]).float()


def _fp8_args(attrs):
    fin = attrs.get("in_format", "F143")
    if isinstance(fin, bytes):
        fin = fin.decode()
    return fin, int(attrs.get("in_scale", 0)), int(attrs.get("weight_scale", 0))


def _x(x, fin, sin):
    return quantize(x, fin, sin) if fin else x.float() * (2.0 ** sin)


def _fp8_matmul_flops(in_shapes, out_shapes, attrs):
    """2 flops per multiply-accumulate: output elements x the contracted dimension."""
    return 2.0 * math.prod(out_shapes[0]) * in_shapes[1][0]


@onnx_op("FP8MatMul", domain="ai.graphcore", flops=_fp8_matmul_flops)
def fp8_matmul(inputs, attrs, opset):
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    fin, sin, sw = _fp8_args(attrs)
    y = torch.matmul(_x(x, fin, sin), w.float()) * (2.0 ** -(sin + sw))
    if bias is not None:
        y = y + bias.float()
    return [y.to(x.dtype)]


_CONV_ATTRS = ("strides", "pads", "dilations", "group", "kernel_shape", "auto_pad")


def _conv_flops(i, o, a):
    w = i[1]
    return 2.0 * math.prod(o[0]) * math.prod(w[1:])


@onnx_op("FP8Conv", domain="ai.graphcore", flops=_conv_flops)
def fp8_conv(inputs, attrs, opset):
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    fin, sin, sw = _fp8_args(attrs)
    conv = get_kernel("", "Conv")
    cattrs = {k: v for k, v in attrs.items() if k in _CONV_ATTRS}
    (y,) = conv.fn([_x(x, fin, sin), w.float()], cattrs, 11)
    y = y * (2.0 ** -(sin + sw))
    if bias is not None:
        y = y + bias.float().reshape([1, -1] + [1] * (y.dim() - 2))
    return [y.to(x.dtype)]
