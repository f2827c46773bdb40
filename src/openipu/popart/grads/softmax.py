"""Gradients of Softmax and LogSoftmax (PopART's ``SoftmaxGradOp``): ``y * (dy - sum(dy * y))``
and ``dy - exp(y) * sum(dy)`` along the axis (opset < 13: over the dimensions from ``axis`` on,
the input viewed as a matrix)."""

from __future__ import annotations

from openipu.popart.grads import GRAPHCORE, grad_rule


def _attrs(op):
    if op.opset >= 13:
        return {"axis": int(op.attrs.get("axis", -1)), "flatten": 0}
    return {"axis": int(op.attrs.get("axis", 1)), "flatten": 1}


@grad_rule("Softmax")
def softmax(g, op):
    return [g.add("SoftmaxGrad", [g.y(), g.gy()], domain=GRAPHCORE, attrs=_attrs(op))]


@grad_rule("LogSoftmax")
def log_softmax(g, op):
    return [g.add("LogSoftmaxGrad", [g.y(), g.gy()], domain=GRAPHCORE, attrs=_attrs(op))]
