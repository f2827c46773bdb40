"""MultiConv: several convolutions in one op (``builder.aiGraphcore.multiconv``), each with its
own attributes taken from the flattened per-convolution lists.
"""

from __future__ import annotations

import math

from openipu.popart.onnx_ops import get_kernel
from openipu.popart.graphcore_ops._registry import _gc, _ints


def multiconv_attrs(attrs: dict, k: int) -> dict:
    """The ONNX Conv attributes of convolution ``k`` of a MultiConv node (its attributes are the
    per-convolution lists concatenated, ``<name>_lens`` giving each one's length)."""
    out = {}
    for name in ("strides", "pads", "dilations"):
        if name in attrs:
            lens = _ints(attrs.get(f"{name}_lens"))
            start = sum(lens[:k])
            out[name] = _ints(attrs[name])[start:start + lens[k]]
    return out


def _multi_conv_flops(i, o, a):
    return sum(2.0 * math.prod(o[k]) * math.prod(i[3 * k + 1][1:]) for k in range(len(o)))


@_gc("MultiConv", flops=_multi_conv_flops)
def multi_conv(inputs, attrs, opset):
    """PopART's ``MultiConv``: convolution ``k`` of inputs ``3k, 3k+1, 3k+2`` (data, weights,
    bias or None) as an ONNX Conv (group from the shapes). The session splits it into Conv ops."""
    conv = get_kernel("", "Conv").fn
    outs = []
    for k in range(int(attrs.get("num_convs", len(inputs) // 3))):
        x, w, b = inputs[3 * k], inputs[3 * k + 1], inputs[3 * k + 2]
        a = multiconv_attrs(attrs, k)
        a["group"] = x.shape[1] // w.shape[1]
        a["__num_outputs__"] = 1
        outs.append(conv([x, w] + ([b] if b is not None else []), a, 11)[0])
    return outs
