"""Order-based ops: Sort (values and PopART's INT32 indices), Bucketize, ReduceMedian."""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops._registry import _gc, _axis


def _median_axes(x, attrs):
    r = x.dim()
    axes = attrs.get("axes")
    axes = list(range(r)) if axes is None else sorted({_axis(int(a), r, "ReduceMedian") for a in axes})
    keep = [d for d in range(r) if d not in axes]
    return axes, keep


@_gc("ReduceMedian", flops=lambda i, o, a: 4.0 * math.prod(i[0]))
def reduce_median(inputs, attrs, opset):
    """PopART's ``ReduceMedian``: ``[x] -> [values, indices]``, the lower median over ``axes``
    (default all) and its index flattened over the reduced axes (INT32), as numpy's ``flat``."""
    x = inputs[0]
    axes, keep = _median_axes(x, attrs)
    xs = list(x.shape)
    flat = x.permute(keep + axes).reshape([xs[d] for d in keep] + [-1])
    vals, idx = torch.median(flat, dim=-1)
    out = [xs[d] if d in keep else 1 for d in range(len(xs))] if int(attrs.get("keepdims", 1)) else \
        [xs[d] for d in keep]
    return [vals.reshape(out), idx.to(torch.int32).reshape(out)]


def _sort_flops(i, o, a):
    n = i[0][int(a.get("axis", -1))] if i[0] else 1
    return 4.0 * math.prod(i[0]) * max(1.0, math.log2(max(n, 2)))


@_gc("Sort", flops=_sort_flops)
def sort(inputs, attrs, opset):
    """PopART's ``Sort`` (a full TopK): ``[x] -> [values, indices (INT64)]`` along ``axis``."""
    x = inputs[0]
    axis = _axis(int(attrs.get("axis", -1)), x.dim(), "Sort")
    v, i = torch.sort(x, dim=axis, descending=bool(attrs.get("descending", 0)), stable=bool(attrs.get("stable", 0)))
    return [v, i.to(torch.int64)]


@_gc("Bucketize")
def bucketize(inputs, attrs, opset):
    """PopART's ``Bucketize`` (``torch.bucketize``): ``[x, boundaries (1-D, sorted)] -> INT32``
    bucket indices; ``right`` puts a value equal to a boundary in the bucket to its right."""
    x, b = inputs
    if b.dim() != 1:
        raise ValueError(f"BucketizeOp::setup The boundaries tensor is not a 1-D tensor. The boundaries tensor rank = "
                         f"{b.dim()}.")
    if x.dtype != b.dtype:
        raise ValueError(f"BucketizeOp::setup The input and boundaries tensors have different data types ({x.dtype}, "
                         f"{b.dtype})")
    return [torch.bucketize(x, b, right=bool(attrs.get("right", 0))).to(torch.int32)]
