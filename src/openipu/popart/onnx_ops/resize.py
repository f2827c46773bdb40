"""Resize and Upsample: nearest (four rounding modes), linear and cubic (optionally antialiased)
interpolation, every coordinate_transformation_mode, axes, roi, keep_aspect_ratio_policy.

Interpolation is separable: each resized axis is one gather of ``n`` neighbours and a weighted sum,
computed in float64 and cast back (integer outputs rounded and saturated)."""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import ints, norm_axes, numel, opt


def _resize_flops(in_shapes, out_shapes, attrs):
    taps = {"nearest": 1, "linear": 2, "cubic": 4}.get(attrs.get("mode", "nearest"), 2)
    return 2.0 * numel(out_shapes[0]) * taps * max(len(in_shapes[0]) - 2, 1)


def _coeffs(mode, ratio, scale, attrs, nearest_mode):
    """Per-output interpolation weights [out, n] for fractional positions ``ratio`` in (0, 1]."""
    integral = ratio == 1.0
    if mode == "nearest":
        if nearest_mode == "round_prefer_floor":
            hi = ratio > 0.5
        elif nearest_mode == "round_prefer_ceil":
            hi = ratio >= 0.5
        elif nearest_mode == "floor":
            hi = torch.zeros_like(ratio, dtype=torch.bool)
        elif nearest_mode == "ceil":
            hi = torch.ones_like(ratio, dtype=torch.bool)
        else:
            raise OnnxKernelError(f"Resize: unknown nearest_mode {nearest_mode!r}")
        hi = hi | integral
        return torch.stack([(~hi).double(), hi.double()], -1)
    antialias = attrs.get("antialias", 0)
    if mode == "linear":
        if not antialias:
            return torch.stack([1 - ratio, ratio], -1)
        s = min(scale, 1.0)
        start = int(math.floor(-1 / s) + 1)
        fp = 2 - 2 * start
        args = (torch.arange(start, start + fp, dtype=torch.float64, device="cpu")[None, :] - ratio[:, None]) * s
        c = (1 - args.abs()).clamp(0, 1)
        return c / c.sum(-1, keepdim=True)
    if mode == "cubic":
        a = attrs.get("cubic_coeff_a", -0.75)
        if not antialias:
            r = ratio
            return torch.stack([
                ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                ((a + 2) * r - (a + 3)) * r * r + 1,
                ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a,
            ], -1)
        s = min(scale, 1.0)
        i0 = int(math.floor(-2 / s) + 1)
        x = (s * (torch.arange(i0, 2 - i0, dtype=torch.float64, device="cpu")[None, :] - ratio[:, None])).abs()
        c = torch.where(x <= 1, (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1,
                        torch.where(x < 2, a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a,
                                    torch.zeros_like(x)))
        return c / c.sum(-1, keepdim=True)
    raise OnnxKernelError(f"Resize: mode must be nearest, linear or cubic, got {mode!r}")


def _x_original(ctm, out_n, scale, in_n, roi):
    # the source coordinates of one axis: a small vector on the CPU (moved where it indexes data)
    y = torch.arange(out_n, dtype=torch.float64, device="cpu")
    out_w = scale * in_n
    extrap = None
    if ctm == "align_corners":
        x = torch.zeros(out_n, dtype=torch.float64, device="cpu") if out_w == 1 else y * (in_n - 1) / (out_w - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        r0, r1 = roi
        if out_w == 1:
            x = torch.full((out_n,), (r1 - r0) * (in_n - 1) / 2, dtype=torch.float64, device="cpu")
        else:
            x = y * (r1 - r0) * (in_n - 1) / (out_w - 1)
        x = x + r0 * (in_n - 1)
        extrap = (x < 0) | (x > in_n - 1)
    elif ctm == "pytorch_half_pixel":
        x = torch.full((out_n,), -0.5, dtype=torch.float64, device="cpu") if out_w == 1 else \
            (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        adj = out_n / out_w
        x = in_n / 2 * (1 - adj) + (y + 0.5) / scale - 0.5
    elif ctm == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    else:
        raise OnnxKernelError(f"Resize: unknown coordinate_transformation_mode {ctm!r}")
    return x, extrap


def _resize_axis(data, axis, scale, out_n, attrs, mode, ctm, nearest_mode, roi, legacy_nearest):
    in_n = data.shape[axis]
    if out_n == 0:
        shape = list(data.shape)
        shape[axis] = 0
        return data.new_empty(shape)
    x, extrap = _x_original(ctm, out_n, scale, in_n, roi)
    if legacy_nearest:  # Upsample / Resize-10: floor when enlarging, ceil when shrinking
        idx = (torch.ceil(x) if scale < 1 else torch.floor(x)).long().clamp(0, in_n - 1)
        return data.index_select(axis, idx.to(data.device))
    xi = torch.floor(x)
    ratio = torch.where(x == xi, torch.ones_like(x), x - xi)
    c = _coeffs(mode, ratio, scale, attrs, nearest_mode)
    n = c.shape[1]
    pad = int(math.ceil(n / 2))
    xp = x + pad
    p = torch.floor(xp).long()
    frac = xp - p
    if n % 2 == 0:
        off = torch.where(frac == 0, torch.full_like(p, -(n // 2)), torch.full_like(p, -(n // 2) + 1))
    else:
        base = -((n - 1) // 2)
        off = torch.where(frac <= 0.5, torch.full_like(p, base), torch.full_like(p, base + 1))
    nb = (p + off)[:, None] + torch.arange(n, device="cpu")[None, :] - pad  # [out, n]
    if attrs.get("exclude_outside", 0):
        c = torch.where((nb < 0) | (nb >= in_n), torch.zeros_like(c), c)
        s = c.sum(-1, keepdim=True)
        c = c / torch.where(s == 0, torch.ones_like(s), s)
    # the coordinates and weights are small per-axis vectors computed on the CPU, moved to data's device
    g = data.index_select(axis, nb.clamp(0, in_n - 1).reshape(-1).to(data.device))
    g = g.reshape(data.shape[:axis] + (out_n, n) + data.shape[axis + 1:])
    cshape = (1,) * axis + (out_n, n) + (1,) * (data.dim() - axis - 1)
    r = (g * c.reshape(cshape).to(data.device)).sum(axis + 1)
    if extrap is not None and bool(extrap.any()):
        m = extrap.reshape((1,) * axis + (out_n,) + (1,) * (data.dim() - axis - 1)).to(data.device)
        r = torch.where(m, torch.tensor(attrs.get("extrapolation_value", 0.0), dtype=r.dtype, device=r.device), r)
    return r


def resize_nd(x, scales, sizes, roi, attrs, mode, ctm, nearest_mode, legacy_nearest=False):
    """Resize ``x`` (any rank) given full-rank ``scales`` or ``sizes`` and an optional ``roi``."""
    r = x.dim()
    axes = norm_axes(attrs.get("axes") or range(r), r, "Resize")
    if roi is not None and len(roi) == 0:
        roi = None
    if roi is not None and len(roi) == 2 * len(axes) and len(axes) != r:
        full = [0.0] * r + [1.0] * r
        for i, a in enumerate(axes):
            full[a], full[r + a] = roi[i], roi[len(axes) + i]
        roi = full
    if sizes:
        if len(sizes) == len(axes) and len(axes) != r:
            s = list(x.shape)
            for i, a in enumerate(axes):
                s[a] = sizes[i]
            sizes = s
        scales = [sizes[i] / x.shape[i] for i in range(r)]
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            sc = pick(scales[a] for a in axes)
            scales = [sc if i in axes else 1.0 for i in range(r)]
            sizes = [int(sc * x.shape[i] + 0.5) if i in axes else x.shape[i] for i in range(r)]
    else:
        if len(scales) == len(axes) and len(axes) != r:
            s = [1.0] * r
            for i, a in enumerate(axes):
                s[a] = scales[i]
            scales = s
        if len(scales) != r:
            raise OnnxKernelError(f"Resize: {len(scales)} scales for a rank-{r} input")
        sizes = [int(scales[i] * x.shape[i]) for i in range(r)]
    dt = x.dtype
    out = x.to(torch.float64)
    for a in axes:
        sc, n = float(scales[a]), int(sizes[a])
        ar = None if roi is None else (float(roi[a]), float(roi[a + r]))
        if math.isclose(sc, 1.0) and n == out.shape[a] and (
                ar is None or (math.isclose(ar[0], 0.0) and math.isclose(ar[1], 1.0))):
            continue
        out = _resize_axis(out, a, sc, n, attrs, mode, ctm, nearest_mode, ar, legacy_nearest)
    if not dt.is_floating_point:
        info = torch.iinfo(dt)
        out = torch.round(out).clamp(info.min, info.max)
    return out.to(dt)


def _floats(t):
    return [] if t is None else [float(v) for v in t.reshape(-1).tolist()]


@onnx_op("Resize", flops=_resize_flops)
def resize(inputs, attrs, opset):
    x = inputs[0]
    mode = attrs.get("mode", "nearest")
    if opset < 11:
        return [resize_nd(x, _floats(inputs[1]), None, None, attrs, mode, "asymmetric", "floor",
                          legacy_nearest=mode == "nearest")]
    roi = _floats(opt(inputs, 1))
    scales = _floats(opt(inputs, 2))
    sizes = ints(opt(inputs, 3))
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest_mode = attrs.get("nearest_mode", "round_prefer_floor")
    if not scales and not sizes:
        raise OnnxKernelError("Resize: one of 'scales' and 'sizes' must be given")
    return [resize_nd(x, scales, sizes, roi, attrs, mode, ctm, nearest_mode)]


@onnx_op("Upsample", flops=_resize_flops)
def upsample(inputs, attrs, opset):
    x = inputs[0]
    scales = attrs.get("scales") if opset < 9 else _floats(inputs[1])
    mode = attrs.get("mode", "nearest")
    if mode == "bilinear":
        mode = "linear"
    return [resize_nd(x, list(scales), None, None, {}, mode, "asymmetric", "floor",
                      legacy_nearest=mode == "nearest")]
