"""Reductions: Reduce{Sum,Mean,Max,Min,Prod,L1,L2,LogSum,LogSumExp,SumSquare}, ArgMax/ArgMin,
CumSum/CumProd."""

from __future__ import annotations

import functools
import math

import torch

from openipu.popart.onnx_ops import onnx_op
from openipu.popart.onnx_ops._common import (
    FLOAT8, ints, narrow, norm_axes, norm_axis, numel, opt, scalar, widen)

# Opset from which `axes` is an input rather than an attribute.
_AXES_INPUT_FROM = {"ReduceSum": 13}


def _reduce_flops(in_shapes, out_shapes, attrs):
    return float(numel(in_shapes[0]))


def attribute_axes_empty(op, attrs, opset) -> bool:
    """PopART's ``ReduceOp``: an ``axes`` attribute that is present but empty (opsets where axes
    is an attribute) reduces over no axis (the output has the input's shape), where an absent
    one reduces over all of them."""
    return opset < _AXES_INPUT_FROM.get(op, 18) and "axes" in attrs and attrs["axes"] is not None \
        and len(attrs["axes"]) == 0


def _reduce_axes(op, inputs, attrs, opset, rank):
    """The axes to reduce ([] for none: the op's map only), or None for 'return the input
    unchanged'."""
    if opset >= _AXES_INPUT_FROM.get(op, 18):
        a = opt(inputs, 1)
        axes = ints(a) if a is not None else []
    else:
        if attribute_axes_empty(op, attrs, opset):
            return []
        axes = list(attrs.get("axes") or [])
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted(set(norm_axes(axes, rank, op)))


_EMPTY = {"ReduceSum": 0.0, "ReduceProd": 1.0, "ReduceMax": -math.inf, "ReduceMin": math.inf,
          "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceLogSum": -math.inf,
          "ReduceLogSumExp": -math.inf, "ReduceSumSquare": 0.0, "ReduceMean": math.nan}


def _reduce(op, inputs, attrs, opset):
    x = inputs[0]
    axes = _reduce_axes(op, inputs, attrs, opset, x.dim())
    if axes is None:
        return [x.clone()]
    keep = bool(attrs.get("keepdims", 1))
    dt = x.dtype
    xw = x.float() if dt in FLOAT8 else widen(x)
    if x.dim() == 0:
        axes = []
    if any(x.shape[a] == 0 for a in axes):
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keep else \
            [d for i, d in enumerate(x.shape) if i not in axes]
        v = _EMPTY[op]
        if not dt.is_floating_point:
            v = {math.inf: torch.iinfo(dt).max, -math.inf: torch.iinfo(dt).min}.get(v, v) \
                if dt != torch.bool else bool(v == math.inf)
        return [torch.full(shape, v, dtype=dt, device=x.device)]
    if not axes:
        r = {"ReduceL1": torch.abs, "ReduceL2": torch.abs, "ReduceSumSquare": lambda t: t * t,
             "ReduceLogSum": torch.log, "ReduceLogSumExp": lambda t: t}.get(op, lambda t: t)(xw)
        return [narrow(r.to(xw.dtype), dt)]
    if op == "ReduceSum":
        r = torch.sum(xw, axes, keepdim=keep, dtype=xw.dtype)
    elif op == "ReduceMean":
        r = torch.sum(xw, axes, keepdim=keep, dtype=xw.dtype)
        n = numel([x.shape[a] for a in axes])
        r = r / n if xw.dtype.is_floating_point else torch.div(r, n, rounding_mode="trunc")
    elif op in ("ReduceMax", "ReduceMin"):
        f = torch.amax if op == "ReduceMax" else torch.amin
        r = f(xw.to(torch.uint8) if dt == torch.bool else xw, axes, keepdim=keep)
        if dt == torch.bool:
            r = r.to(torch.bool)
    elif op == "ReduceProd":
        r = xw
        for a in sorted(axes, reverse=True):
            r = torch.prod(r, a, keepdim=keep)
    elif op == "ReduceL1":
        r = torch.sum(torch.abs(xw), axes, keepdim=keep, dtype=xw.dtype)
    elif op == "ReduceL2":
        r = torch.sqrt(torch.sum((xw * xw).to(torch.float64) if not xw.dtype.is_floating_point
                                 else xw * xw, axes, keepdim=keep))
        if not xw.dtype.is_floating_point:
            r = r.to(xw.dtype)
    elif op == "ReduceSumSquare":
        r = torch.sum(xw * xw, axes, keepdim=keep, dtype=xw.dtype)
    elif op == "ReduceLogSum":
        r = torch.log(torch.sum(xw, axes, keepdim=keep))
    else:  # ReduceLogSumExp
        xf = xw if xw.dtype.is_floating_point else xw.to(torch.float64)
        r = torch.logsumexp(xf, axes, keepdim=keep)
    return [narrow(r.to(xw.dtype), dt) if r.dtype != dt else r]


for _op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
            "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"):
    onnx_op(_op, flops=_reduce_flops)(functools.partial(_reduce, _op))


def _arg(fn, inputs, attrs, opset):
    x = widen(inputs[0])
    axis = norm_axis(attrs.get("axis", 0), x.dim(), "ArgMax/ArgMin")
    keep = bool(attrs.get("keepdims", 1))
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    if attrs.get("select_last_index", 0):
        n = x.shape[axis]
        r = n - 1 - fn(x.flip(axis), axis, keepdim=keep)
    else:
        r = fn(x, axis, keepdim=keep)
    return [r.to(torch.int64)]


onnx_op("ArgMax", flops=_reduce_flops)(functools.partial(_arg, torch.argmax))
onnx_op("ArgMin", flops=_reduce_flops)(functools.partial(_arg, torch.argmin))


def _cum(fn, inputs, attrs, opset):
    x = inputs[0]
    axis = norm_axis(int(scalar(inputs[1])), x.dim(), "CumSum")
    xw = widen(x)
    if attrs.get("reverse", 0):
        xw = xw.flip(axis)
    r = fn(xw, axis)
    if attrs.get("exclusive", 0):
        ident = torch.zeros_like(r.narrow(axis, 0, 1)) if fn is torch.cumsum else \
            torch.ones_like(r.narrow(axis, 0, 1))
        r = torch.cat([ident, r.narrow(axis, 0, r.shape[axis] - 1)], axis)
    if attrs.get("reverse", 0):
        r = r.flip(axis)
    return [narrow(r.to(xw.dtype), x.dtype)]


onnx_op("CumSum")(functools.partial(_cum, torch.cumsum))
onnx_op("CumProd")(functools.partial(_cum, torch.cumprod))
