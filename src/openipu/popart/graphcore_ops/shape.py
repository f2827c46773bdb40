"""Shape ops of ``ai.graphcore``: Reshape, Subsample, Reverse, Slice, DepthToSpace and Init
(a new tensor of a given shape and ``DATA_TYPES`` type, zero or undefined).
"""

from __future__ import annotations

import torch

from openipu.popart.graphcore_ops._registry import _gc, _ints, DATA_TYPES


@_gc("Reshape")
def reshape(inputs, attrs, opset):
    return [inputs[0].reshape([int(s) for s in attrs["shape"]])]


@_gc("Subsample")
def subsample(inputs, attrs, opset):
    x = inputs[0]
    idx = tuple(slice(None, None, int(s)) for s in attrs.get("strides", []))
    return [x[idx].clone()]


@_gc("Reverse")
def reverse(inputs, attrs, opset):
    return [torch.flip(inputs[0], [int(d) for d in attrs.get("dimensions", [])])]


@_gc("Slice")
def slice_(inputs, attrs, opset):
    x = inputs[0]
    starts, ends = list(attrs.get("starts", [])), list(attrs.get("ends", []))
    axes = list(attrs.get("axes", range(len(starts))))
    idx = [slice(None)] * x.dim()
    for s, e, ax in zip(starts, ends, axes):
        idx[int(ax)] = slice(int(s), int(e))
    return [x[tuple(idx)].clone()]


@_gc("Init")
def init(inputs, attrs, opset):
    """PopART's ``Init``: zeros of ``shape`` and ``data_type`` (PopART's DataType code); NoInit
    leaves memory as it is, which is zeros in openipu's fresh tensors."""
    from openipu.popart.shapes import KERNEL_TORCH_OF
    name = DATA_TYPES[int(attrs.get("data_type", 9))]
    # no input to follow: a CPU tensor, which the IR executor moves to its device
    return [torch.zeros(_ints(attrs.get("shape")), dtype=KERNEL_TORCH_OF.get(name, torch.float32), device="cpu")]


@_gc("DepthToSpace")
def depth_to_space(inputs, attrs, opset):
    """``[N, C, H, W] -> [N, C/B^2, H B, W B]``, DCR (depth-column-row) or CRD order."""
    x = inputs[0]
    b = int(attrs["blocksize"])
    n, c, h, w = x.shape
    if c % (b * b):
        raise ValueError(f"DepthToSpace: {c} channels are not a multiple of blocksize^2 = {b * b}")
    if str(attrs.get("mode", "DCR")) == "CRD":
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    else:
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    return [y.reshape(n, c // (b * b), h * b, w * b)]
