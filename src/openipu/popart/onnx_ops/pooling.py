"""Pooling: MaxPool (with indices), AveragePool (count_include_pad), LpPool, Global{Average,Max,Lp}Pool,
MaxUnpool, RoiAlign."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import numel, opt
from openipu.popart.onnx_ops.conv import conv_geometry, torch_pad

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _pool_flops(in_shapes, out_shapes, attrs):
    k = attrs.get("kernel_shape") or [1]
    return float(numel(out_shapes[0]) * math.prod(k))


def _geometry(x, attrs):
    """(kernel, strides, dilations, begin pads, end pads incl. ceil overhang, output sizes, explicit
    end pads)."""
    k = list(attrs["kernel_shape"])
    nd = len(k)
    strides, dil, pads = conv_geometry(x.shape, k, attrs)
    ins = list(x.shape[2:])
    ceil = attrs.get("ceil_mode", 0)
    outs, ends = [], []
    for i in range(nd):
        span = (k[i] - 1) * dil[i] + 1
        size = (ins[i] + pads[i] + pads[nd + i] - span) / strides[i] + 1
        o = math.ceil(size) if ceil else math.floor(size)
        if ceil and (o - 1) * strides[i] >= ins[i] + pads[i]:
            o -= 1
        outs.append(max(o, 0))
        need = (o - 1) * strides[i] + span - ins[i] - pads[i]
        ends.append(max(need, pads[nd + i]))
    return k, strides, dil, pads[:nd], ends, outs, pads[nd:]


def _window_sum(x, k, strides, dil):
    """Sum over each window: depthwise convolution with a ones kernel ([N, C, *S] -> [N, C, *O])."""
    nd = len(k)
    n, c = x.shape[:2]
    w = torch.ones((c, 1) + tuple(k), dtype=x.dtype, device=x.device)
    return _CONV[nd](x, w, stride=strides, dilation=dil, groups=c)


@onnx_op("AveragePool", flops=_pool_flops)
def average_pool(inputs, attrs, opset):
    x = inputs[0]
    k, s, d, begins, ends, outs, pad_ends = _geometry(x, attrs)
    dt = x.dtype
    xf = x.float() if dt in (torch.float16, torch.bfloat16) else x
    pads = torch_pad(begins + ends)
    total = _window_sum(F.pad(xf, pads), k, s, d)
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=xf.dtype, device=xf.device)
    if attrs.get("count_include_pad", 0):
        ones = F.pad(ones, torch_pad(begins + pad_ends), value=1.0)
        extra = [e - p for e, p in zip(ends, pad_ends)]
        mask = F.pad(ones, torch_pad([0] * len(k) + extra))
    else:
        mask = F.pad(ones, pads)
    count = _window_sum(mask, k, s, d)
    return [(total / count).to(dt)]


@onnx_op("LpPool", flops=_pool_flops)
def lp_pool(inputs, attrs, opset):
    x = inputs[0]
    p = attrs.get("p", 2)
    k, s, d, begins, ends, outs, _ = _geometry(x, attrs)
    xf = x.abs().to(torch.float64 if x.dtype == torch.float64 else torch.float32) ** p
    y = _window_sum(F.pad(xf, torch_pad(begins + ends)), k, s, d) ** (1.0 / p)
    return [y.to(x.dtype)]


def implicit_pads(k, begins, ends) -> bool:
    """Whether torch's pooling can pad itself (pads ``begins`` / ``ends`` equal, each at most half
    its kernel size ``k``): the windows then hold the same inputs as over an input padded with
    -inf, none of them padding alone."""
    return list(begins) == list(ends) and all(0 <= p <= kk // 2 for p, kk in zip(begins, k))


@onnx_op("MaxPool", flops=_pool_flops)
def max_pool(inputs, attrs, opset):
    x = inputs[0]
    k, s, d, begins, ends, outs, _ = _geometry(x, attrs)
    nd = len(k)
    dt = x.dtype
    xf = x.to(torch.float64) if not dt.is_floating_point or dt == torch.float64 else x.float()
    pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
    values_only = int(attrs.get("__num_outputs__", 2)) < 2
    if values_only and implicit_pads(k, begins, ends):     # the same maxima, without a padded copy
        return [pool(xf, k, s, list(begins), d, ceil_mode=False).to(dt)]
    padded = F.pad(xf, torch_pad(begins + ends), value=-math.inf)
    if values_only:        # no Indices output: the values only
        return [pool(padded, k, s, 0, d, ceil_mode=False).to(dt)]
    y, idx = pool(padded, k, s, 0, d, ceil_mode=False, return_indices=True)
    # idx: flat over the padded spatial dims -> ONNX flat index over the whole unpadded input.
    pshape = list(padded.shape[2:])
    ins = list(x.shape[2:])
    coords = []
    rem = idx
    for i in reversed(range(nd)):
        coords.append(torch.remainder(rem, pshape[i]) - begins[i])
        rem = torch.div(rem, pshape[i], rounding_mode="floor")
    coords = coords[::-1]
    order = range(nd) if not attrs.get("storage_order", 0) else reversed(range(nd))
    flat = torch.zeros_like(idx)
    for i in order:
        flat = flat * ins[i] + coords[i]
    n, c = x.shape[:2]
    base = torch.arange(n * c, dtype=torch.int64, device=x.device).reshape(n, c, *[1] * nd) * numel(ins)
    return [y.to(dt), flat + base]


@onnx_op("MaxUnpool", flops=_pool_flops)
def max_unpool(inputs, attrs, opset):
    x, idx = inputs[0], inputs[1]
    out_shape = opt(inputs, 2)
    k = list(attrs["kernel_shape"])
    nd = len(k)
    s = list(attrs.get("strides") or [1] * nd)
    pads = list(attrs.get("pads") or [0] * (2 * nd))
    inferred = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * s[i] + k[i] - pads[i] - pads[nd + i]
                                    for i in range(nd)]
    out = torch.zeros(numel(inferred), dtype=x.dtype, device=x.device)
    out.scatter_(0, idx.reshape(-1).to(torch.int64), x.reshape(-1))
    out = out.reshape(inferred)
    if out_shape is not None:  # indices address the inferred shape; it sits at the origin
        shape = [int(v) for v in out_shape.tolist()]
        big = torch.zeros(shape, dtype=x.dtype, device=x.device)
        big[tuple(slice(0, d) for d in inferred)] = out
        out = big
    return [out]


def _global(fn, inputs, attrs, opset):
    x = inputs[0]
    dims = list(range(2, x.dim()))
    return [fn(x, dims, attrs).to(x.dtype)]


def _gavg(x, dims, attrs):
    return torch.mean(x.float() if x.dtype == torch.float16 else x, dims, keepdim=True)


def _gmax(x, dims, attrs):
    return torch.amax(x, dims, keepdim=True)


def _glp(x, dims, attrs):
    p = attrs.get("p", 2)
    return torch.sum(x.abs() ** p, dims, keepdim=True) ** (1.0 / p)


def _global_flops(in_shapes, out_shapes, attrs):
    return float(numel(in_shapes[0]))


onnx_op("GlobalAveragePool", flops=_global_flops)(functools.partial(_global, _gavg))
onnx_op("GlobalMaxPool", flops=_global_flops)(functools.partial(_global, _gmax))
onnx_op("GlobalLpPool", flops=_global_flops)(functools.partial(_global, _glp))


def _roi_flops(in_shapes, out_shapes, attrs):
    return 4.0 * numel(out_shapes[0]) * max(attrs.get("sampling_ratio", 2), 1) ** 2


@onnx_op("RoiAlign", flops=_roi_flops)
def roi_align(inputs, attrs, opset):
    """Bilinear ROI align; one Python iteration per ROI (vectorised over channels and bins)."""
    x, rois, bidx = inputs
    mode = attrs.get("mode", "avg")
    oh, ow = attrs.get("output_height", 1), attrs.get("output_width", 1)
    ratio = attrs.get("sampling_ratio", 0)
    scale = attrs.get("spatial_scale", 1.0)
    half = attrs.get("coordinate_transformation_mode", "half_pixel") == "half_pixel" and opset >= 16
    n, c, h, w = x.shape
    xf = x.to(torch.float64)
    out = torch.zeros((rois.shape[0], c, oh, ow), dtype=torch.float64, device=x.device)
    offset = 0.5 if half else 0.0
    for r in range(rois.shape[0]):
        x1, y1, x2, y2 = [float(v) * scale - offset for v in rois[r].tolist()]
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = ratio if ratio > 0 else int(math.ceil(rh / oh))
        gw = ratio if ratio > 0 else int(math.ceil(rw / ow))
        gh, gw = max(gh, 1), max(gw, 1)
        f64 = {"dtype": torch.float64, "device": x.device}
        ys = y1 + torch.arange(oh, **f64)[:, None] * bh + (torch.arange(gh, **f64)[None, :] + 0.5) * bh / gh  # [oh, gh]
        xs = x1 + torch.arange(ow, **f64)[:, None] * bw + (torch.arange(gw, **f64)[None, :] + 0.5) * bw / gw  # [ow, gw]
        img = xf[int(bidx[r])]  # [C, H, W]
        vals = _bilinear_terms(img, ys.reshape(-1), xs.reshape(-1), h, w)  # [4, C, oh*gh, ow*gw]
        vals = vals.reshape(4, c, oh, gh, ow, gw)
        if mode == "avg":
            out[r] = vals.sum(0).mean(dim=(2, 4))
        elif mode == "max":
            out[r] = vals.amax(0).amax(dim=(2, 4))
        else:
            raise OnnxKernelError(f"RoiAlign: mode must be avg or max, got {mode!r}")
    return [out.to(x.dtype)]


def _bilinear_terms(img, ys, xs, h, w):
    """The four weighted corner terms of bilinear sampling at the grid ys x xs (0 outside)."""
    valid_y = (ys >= -1.0) & (ys <= h)
    valid_x = (xs >= -1.0) & (xs <= w)
    y = ys.clamp(min=0)
    x = xs.clamp(min=0)
    y0 = torch.floor(y).long().clamp(max=h - 1)
    x0 = torch.floor(x).long().clamp(max=w - 1)
    y = torch.where(y0 >= h - 1, y0.double(), y)
    x = torch.where(x0 >= w - 1, x0.double(), x)
    y1 = (y0 + 1).clamp(max=h - 1)
    x1 = (x0 + 1).clamp(max=w - 1)
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    v = torch.stack([
        img[:, y0][:, :, x0] * (hy[:, None] * hx[None, :]),
        img[:, y0][:, :, x1] * (hy[:, None] * lx[None, :]),
        img[:, y1][:, :, x0] * (ly[:, None] * hx[None, :]),
        img[:, y1][:, :, x1] * (ly[:, None] * lx[None, :]),
    ])
    valid = (valid_y[:, None] & valid_x[None, :]).to(v.dtype)
    return v * valid
