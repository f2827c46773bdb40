"""Resizing and padding: ``upsample_nearest{1,2,3}d``, ``_upsample_nearest_exact*``,
``upsample_{linear1d,bilinear2d,trilinear3d,bicubic2d}`` (``torch.nn.functional.interpolate``,
``torch.nn.Upsample``) -> ONNX Resize with PyTorch's coordinate rules (nearest: ``asymmetric`` +
``floor``; linear / cubic: ``pytorch_half_pixel``, or ``align_corners``; cubic ``a = -0.75``),
the given scale factors kept as Resize scales so that the source coordinates are PyTorch's;
``constant_pad_nd``, ``reflection_pad*`` and ``replication_pad*`` -> ONNX Pad (``constant``,
``reflect``, ``edge``), negative padding as a Slice.

PopTorch's supported-ops list: ``upsample_nearest*``, ``upsample_bilinear2d``, ``constant_pad_nd``,
``reflection_pad*``, ``replication_pad*``.
"""

from __future__ import annotations

import numpy as np

from openipu.poptorch.lower import aten


def _resize(lw, n, mode, align_corners=False, scale_factors=None, nearest_mode="floor", ctm=None):
    x = n.args[0]
    in_shape = lw.shape(x)
    out_shape = [int(d) for d in lw.val().shape]
    k = len(in_shape) - 2
    roi = lw.const(np.zeros(0, np.float32))
    if ctm is None:
        ctm = "asymmetric" if mode == "nearest" else "align_corners" if align_corners else "pytorch_half_pixel"
    attrs = dict(coordinate_transformation_mode=ctm, mode=mode, nearest_mode=nearest_mode,
                 cubic_coeff_a=-0.75)
    if scale_factors and not align_corners:
        scales = lw.const(np.asarray([1.0, 1.0] + [float(s) for s in scale_factors][-k:], np.float32))
        return lw.onnx.resize([lw.t(x), roi, scales], **attrs, debugContext=lw._name())
    empty = lw.const(np.zeros(0, np.float32))
    return lw.onnx.resize([lw.t(x), roi, empty, lw.shape_const(out_shape)], **attrs, debugContext=lw._name())


def _arg(n, i, name, default=None):
    return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)


@aten("aten.upsample_nearest1d.vec", "aten.upsample_nearest2d.vec", "aten.upsample_nearest3d.vec")
def upsample_nearest(lw, n):
    return _resize(lw, n, "nearest", scale_factors=_arg(n, 2, "scale_factors"))


@aten("aten._upsample_nearest_exact1d.vec", "aten._upsample_nearest_exact2d.vec", "aten._upsample_nearest_exact3d.vec")
def upsample_nearest_exact(lw, n):
    return _resize(lw, n, "nearest", scale_factors=_arg(n, 2, "scale_factors"), nearest_mode="floor",
                   ctm="tf_half_pixel_for_nn")


@aten("aten.upsample_nearest1d.default", "aten.upsample_nearest2d.default", "aten.upsample_nearest3d.default")
def upsample_nearest_sizes(lw, n):
    return _resize(lw, n, "nearest")


@aten("aten.upsample_linear1d.vec", "aten.upsample_bilinear2d.vec", "aten.upsample_trilinear3d.vec")
def upsample_linear(lw, n):
    return _resize(lw, n, "linear", bool(_arg(n, 2, "align_corners", False)), _arg(n, 3, "scale_factors"))


@aten("aten.upsample_bicubic2d.vec")
def upsample_bicubic(lw, n):
    return _resize(lw, n, "cubic", bool(_arg(n, 2, "align_corners", False)), _arg(n, 3, "scale_factors"))


@aten("aten.upsample_linear1d.default", "aten.upsample_bilinear2d.default", "aten.upsample_trilinear3d.default")
def upsample_linear_sizes(lw, n):
    return _resize(lw, n, "linear", bool(_arg(n, 2, "align_corners", False)))


def _pad(lw, x, pad, mode, value=0.0):
    """ONNX Pad of ``x`` by PyTorch's ``pad`` list (last dim first, ``(before, after)`` pairs)."""
    rank = len(lw.shape(x))
    pad = [int(p) for p in pad]
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        d = rank - 1 - i
        begins[d], ends[d] = pad[2 * i], pad[2 * i + 1]
    tid = lw.t(x)
    if any(p < 0 for p in begins + ends):   # negative padding crops
        shape = lw.shape(x)
        starts = [max(0, -b) for b in begins]
        stops = [shape[d] - max(0, -ends[d]) for d in range(rank)]
        tid = lw.onnx.slice([tid, lw.shape_const(starts), lw.shape_const(stops), lw.shape_const(range(rank))],
                            lw._name("crop"))
        begins, ends = [max(0, b) for b in begins], [max(0, e) for e in ends]
    if not any(begins + ends):
        return lw.onnx.identity([tid], lw._name())
    inputs = [tid, lw.shape_const(begins + ends)]
    if mode == "constant":
        inputs.append(lw.const(np.asarray(value).astype(np.float32 if lw.dtype(x) == "FLOAT" else np.int32)
                               .reshape(()), lw.dtype(x)))
    return lw.onnx.pad(inputs, mode=mode, debugContext=lw._name())


@aten("aten.constant_pad_nd.default")
def constant_pad_nd(lw, n):
    return _pad(lw, n.args[0], n.args[1], "constant", _arg(n, 2, "value", 0.0))


@aten("aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default")
def reflection_pad(lw, n):
    return _pad(lw, n.args[0], n.args[1], "reflect")


@aten("aten.replication_pad1d.default", "aten.replication_pad2d.default", "aten.replication_pad3d.default")
def replication_pad(lw, n):
    return _pad(lw, n.args[0], n.args[1], "edge")
