"""Gradients of the reductions and scans (PopART's ``Reduce<Op>GradOp``): the output gradient
(and output) viewed with the reduced dimensions kept, then broadcast back by ONNX ops:

- ReduceSum / ReduceMean: ``Expand`` (divided by the reduced size for the mean);
- ReduceMax / ReduceMin: ``Where(Equal(x, y), gy, 0)`` (every maximal element gets the gradient,
  as PopART's ``ReduceMaxGrad``); ReduceL1: ``gy * Sign(x)``; ReduceL2: ``gy * x / y``;
  ReduceSumSquare: ``2 gy x``; ReduceLogSumExp: ``gy * Exp(x - y)``; ReduceLogSum:
  ``gy / Exp(y)``; ReduceProd: the generic ``ReduceProdGrad`` (vjp, exact with zeros);
- CumSum: the reverse CumSum of the gradient (same ``exclusive``); CumProd: generic.
"""

from __future__ import annotations

import math

from openipu.popart.grads import grad_rule
from openipu.popart.onnx_ops.reduce import attribute_axes_empty


def _axes(g, op):
    r = len(g.shape(g.x(0)))
    if op.op_type == "ReduceSum" and op.opset >= 13 or op.opset >= 18:
        v = g.const_value(op.inputs[1]) if len(op.inputs) > 1 and op.inputs[1] else None
        if v is None:
            if len(op.inputs) > 1 and op.inputs[1]:
                return None
            return [] if op.attrs.get("noop_with_empty_axes", 0) else list(range(r))
        axes = v.reshape(-1).tolist()
        if not axes and op.attrs.get("noop_with_empty_axes", 0):
            return []
    else:
        if attribute_axes_empty(op.op_type, op.attrs, op.opset):     # no axis reduced: the generic vjp
            return None
        axes = list(op.attrs.get("axes", range(r)))
    return sorted(a % r for a in axes) if axes else list(range(r))


def _kept(g, t, xs, axes):
    """``t`` (output-shaped) with the reduced dimensions of ``xs`` kept as 1s."""
    return g.reshape(t, [1 if d in axes else n for d, n in enumerate(xs)])


@grad_rule("ReduceSum", "ReduceMean")
def reduce_(g, op):
    xs = g.shape(g.x(0))
    axes = _axes(g, op)
    if axes is None:        # axes computed on the device
        return [g.vjp(0)] + [None] * (len(op.inputs) - 1)
    gy = _kept(g, g.gy(), xs, axes)
    if op.op_type == "ReduceMean":
        gy = g.scale(gy, 1.0 / max(1, math.prod(xs[d] for d in axes)))
    return [g.expand(gy, xs)] + [None] * (len(op.inputs) - 1)


@grad_rule("ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum")
def reduce_other(g, op):
    x = g.x(0)
    xs, dt = g.shape(x), g.dtype(x)
    axes = _axes(g, op)
    if axes is None:
        return [g.vjp(0)] + [None] * (len(op.inputs) - 1)
    gy, y = _kept(g, g.gy(), xs, axes), _kept(g, g.y(), xs, axes)
    t = op.op_type
    if t in ("ReduceMax", "ReduceMin"):
        hit = g.add("Equal", [x, y], shape=xs, dtype="BOOL")
        gx = g.add("Where", [hit, gy, g.const(0.0, x, "zero")], shape=xs, dtype=dt)
    elif t == "ReduceL1":
        gx = g.add("Mul", [g.add("Sign", [x]), gy], shape=xs)
    elif t == "ReduceL2":
        gx = g.add("Mul", [g.add("Div", [x, y], shape=xs), gy], shape=xs)
    elif t == "ReduceSumSquare":
        gx = g.add("Mul", [g.scale(x, 2.0), gy], shape=xs)
    elif t == "ReduceLogSumExp":
        gx = g.add("Mul", [g.add("Exp", [g.add("Sub", [x, y], shape=xs)]), gy], shape=xs)
    else:
        gx = g.expand(g.add("Div", [gy, g.add("Exp", [y])]), xs)
    return [gx] + [None] * (len(op.inputs) - 1)


@grad_rule("ReduceProd", "CumProd")
def generic_scan(g, op):
    return [g.vjp(0)] + [None] * (len(op.inputs) - 1)


@grad_rule("CumSum")
def cumsum(g, op):
    attrs = {"reverse": 1 - int(op.attrs.get("reverse", 0)), "exclusive": int(op.attrs.get("exclusive", 0))}
    return [g.add("CumSum", [g.gy(), g.x(1)], attrs=attrs, opset=op.opset), None]
