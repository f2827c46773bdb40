"""Pooling: ``max_pool*`` -> ONNX MaxPool (``*_with_indices``: its indices output, made
per-plane as PyTorch's),
``avg_pool*`` -> AveragePool, ``adaptive_avg_pool*`` -> GlobalAveragePool (output 1) or an
AveragePool whose kernel divides the input evenly."""

from __future__ import annotations

import numpy as np

from openipu.poptorch.errors import Error
from openipu.poptorch.lower import aten


def _k(v, k):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * k if len(v) == 1 else v)]


@aten("aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default",
      "aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default")
def max_pool(lw, n):
    x = n.args[0]
    k = len(lw.shape(x)) - 2
    a = list(n.args[1:]) + [None] * 5
    kernel = _k(a[0], k)
    stride = _k(a[1] if a[1] else kernel, k)
    pad = _k(a[2] or 0, k)
    dil = _k(a[3] or 1, k)
    ceil = int(bool(a[4]))
    if "with_indices" in str(n.target):
        # ONNX's indices count over the whole (N, C, *spatial) tensor, PyTorch's over each plane
        y, idx = lw.onnx.maxpool([lw.t(x)], 2, kernel, ceil_mode=ceil, dilations=dil, pads=pad + pad,
                                 strides=stride, debugContext=lw._name())
        shape = lw.shape(x)
        plane = int(np.prod(shape[2:]))
        offs = (np.arange(shape[0] * shape[1], dtype=np.int32) * plane).reshape(shape[:2] + [1] * k)
        idx = lw.onnx.sub([lw.cast(idx, "INT32"), lw.const(offs, "INT32")], lw._name("plane"))
        return (y, idx)
    return lw.onnx.maxpool([lw.t(x)], 1, kernel, ceil_mode=ceil, dilations=dil, pads=pad + pad, strides=stride,
                           debugContext=lw._name())[0]


@aten("aten.avg_pool1d.default", "aten.avg_pool2d.default", "aten.avg_pool3d.default")
def avg_pool(lw, n):
    x = n.args[0]
    k = len(lw.shape(x)) - 2
    a = list(n.args[1:]) + [None] * 6
    kernel = _k(a[0], k)
    stride = _k(a[1] if a[1] else kernel, k)
    pad = _k(a[2] or 0, k)
    ceil = int(bool(a[3]))
    include_pad = 1 if a[4] is None else int(bool(a[4]))
    if a[5] is not None:
        raise Error("avg_pool with divisor_override is not supported")
    return lw.onnx.averagepool([lw.t(x)], kernel, ceil_mode=ceil, count_include_pad=include_pad, pads=pad + pad,
                               strides=stride, debugContext=lw._name())


@aten("aten.adaptive_avg_pool1d.default", "aten.adaptive_avg_pool2d.default", "aten.adaptive_avg_pool3d.default",
      "aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default")
def adaptive_avg_pool(lw, n):
    x = n.args[0]
    shape = lw.shape(x)
    k = len(shape) - 2
    out = _k(n.args[1], k)
    if all(o == 1 for o in out):
        return lw.onnx.globalaveragepool([lw.t(x)], lw._name())
    if any(s % o for s, o in zip(shape[2:], out)):
        raise Error(f"adaptive_avg_pool to {out} from {shape[2:]} is not supported: the input must divide evenly")
    kernel = [s // o for s, o in zip(shape[2:], out)]
    return lw.onnx.averagepool([lw.t(x)], kernel, strides=kernel, debugContext=lw._name())
