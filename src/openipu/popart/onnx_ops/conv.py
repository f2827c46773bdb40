"""Convolutions: Conv, ConvTranspose, ConvInteger, QLinearConv (1-D/2-D/3-D, groups, dilations,
explicit pads and auto_pad)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import numel, opt

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def same_pads(auto_pad, in_sizes, kernel, strides, dilations):
    """Begin/end pads (ONNX order: all begins then all ends) for SAME_UPPER/SAME_LOWER/VALID."""
    n = len(in_sizes)
    if auto_pad == "VALID":
        return [0] * (2 * n)
    begins, ends = [], []
    for i in range(n):
        out = -(-in_sizes[i] // strides[i])
        total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sizes[i], 0)
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def conv_geometry(x_shape, kernel, attrs):
    """(strides, dilations, pads) of a Conv/pool node from its attributes and input shape."""
    n = len(kernel)
    strides = list(attrs.get("strides") or [1] * n)
    dilations = list(attrs.get("dilations") or [1] * n)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        pads = same_pads(auto_pad, list(x_shape[2:]), kernel, strides, dilations)
    elif auto_pad == "NOTSET":
        pads = list(attrs.get("pads") or [0] * (2 * n))
    else:
        raise OnnxKernelError(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, "
                              f"got {auto_pad!r}")
    return strides, dilations, pads


def torch_pad(pads):
    """ONNX pads [b1..bn, e1..en] -> F.pad order (last axis first)."""
    n = len(pads) // 2
    out = []
    for i in reversed(range(n)):
        out += [pads[i], pads[n + i]]
    return out


def _conv_flops(in_shapes, out_shapes, attrs):
    w = in_shapes[1]
    return 2.0 * numel(out_shapes[0]) * numel(w[1:])


def conv_nd(x, w, b, attrs):
    """ONNX Conv of float tensors ``x`` [N, C, *S] and ``w`` [M, C/group, *K]."""
    k = list(w.shape[2:])
    strides, dilations, pads = conv_geometry(x.shape, k, attrs)
    nd = len(k)
    if nd not in _CONV:
        raise OnnxKernelError(f"Conv: {nd}-D convolution is not supported (1-D to 3-D)")
    if list(pads[:nd]) == list(pads[nd:]):     # symmetric: the convolution pads (no padded copy)
        return _CONV[nd](x, w, b, stride=strides, padding=list(pads[:nd]), dilation=dilations,
                         groups=attrs.get("group", 1))
    x = F.pad(x, torch_pad(pads))
    return _CONV[nd](x, w, b, stride=strides, dilation=dilations, groups=attrs.get("group", 1))


@onnx_op("Conv", flops=_conv_flops)
def conv(inputs, attrs, opset):
    x, w, b = inputs[0], inputs[1], opt(inputs, 2)
    return [conv_nd(x, w, b, attrs)]


@onnx_op("ConvInteger", flops=_conv_flops)
def conv_integer(inputs, attrs, opset):
    x, w = inputs[0], inputs[1]
    xz, wz = opt(inputs, 2), opt(inputs, 3)
    xf = x.to(torch.float64) - (xz.to(torch.float64) if xz is not None else 0)
    wf = w.to(torch.float64)
    if wz is not None:
        wz = wz.to(torch.float64)
        wf = wf - (wz.reshape(-1, *[1] * (w.dim() - 1)) if wz.numel() > 1 else wz)
    # Padding contributes the zero point, i.e. zero after the shift.
    return [torch.round(conv_nd(xf, wf, None, attrs)).to(torch.int32)]


@onnx_op("QLinearConv", flops=_conv_flops)
def qlinear_conv(inputs, attrs, opset):
    x, xs, xz, w, ws, wz, ys, yz = inputs[:8]
    b = opt(inputs, 8)
    xf = (x.to(torch.float64) - xz.to(torch.float64)) * xs.to(torch.float64)
    wzf, wsf = wz.to(torch.float64), ws.to(torch.float64)
    shape = (-1,) + (1,) * (w.dim() - 1)
    wf = (w.to(torch.float64) - (wzf.reshape(shape) if wzf.numel() > 1 else wzf)) * \
        (wsf.reshape(shape) if wsf.numel() > 1 else wsf)
    bf = None
    if b is not None:
        bf = b.to(torch.float64) * xs.to(torch.float64) * wsf.reshape(-1)
    y = conv_nd(xf, wf, bf, attrs) / ys.to(torch.float64) + yz.to(torch.float64)
    info = torch.iinfo(yz.dtype)
    return [torch.round(y).clamp(info.min, info.max).to(yz.dtype)]


def _convt_flops(in_shapes, out_shapes, attrs):
    return 2.0 * numel(in_shapes[0]) * numel(in_shapes[1][1:])


@onnx_op("ConvTranspose", flops=_convt_flops)
def conv_transpose(inputs, attrs, opset):
    x, w, b = inputs[0], inputs[1], opt(inputs, 2)
    k = list(w.shape[2:])
    nd = len(k)
    if nd not in _CONVT:
        raise OnnxKernelError(f"ConvTranspose: {nd}-D is not supported (1-D to 3-D)")
    group = attrs.get("group", 1)
    strides = list(attrs.get("strides") or [1] * nd)
    dil = list(attrs.get("dilations") or [1] * nd)
    outpad = list(attrs.get("output_padding") or [0] * nd)
    ins = list(x.shape[2:])
    full = [strides[i] * (ins[i] - 1) + (k[i] - 1) * dil[i] + 1 for i in range(nd)]
    auto_pad = attrs.get("auto_pad", "NOTSET")
    out_shape = attrs.get("output_shape")
    if out_shape:
        out_shape = list(out_shape)[-nd:]
        total = [full[i] + outpad[i] - out_shape[i] for i in range(nd)]
        if auto_pad == "SAME_UPPER":
            begins = [t // 2 for t in total]
        else:
            begins = [t - t // 2 for t in total]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [ins[i] * strides[i] for i in range(nd)]
        total = [full[i] + outpad[i] - out_shape[i] for i in range(nd)]
        if auto_pad == "SAME_UPPER":
            begins = [t // 2 for t in total]
        else:
            begins = [t - t // 2 for t in total]
    else:
        pads = list(attrs.get("pads") or [0] * (2 * nd)) if auto_pad != "VALID" else [0] * 2 * nd
        begins = pads[:nd]
        out_shape = [full[i] + outpad[i] - pads[i] - pads[nd + i] for i in range(nd)]
    y = _CONVT[nd](x, w, None, stride=strides, dilation=dil, groups=group)
    # Extend with zeros where output_padding / output_shape reach past the full result, then crop.
    ext = [max(begins[i] + out_shape[i] - full[i], 0) for i in range(nd)]
    lead = [max(-begins[i], 0) for i in range(nd)]
    if any(ext) or any(lead):
        y = F.pad(y, torch_pad(lead + ext))
    for i in range(nd):
        y = y.narrow(2 + i, begins[i] + lead[i], out_shape[i])
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nd)
    return [y.contiguous()]
