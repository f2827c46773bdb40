"""Gradients of the elementwise ops (PopART's ``AddArg0GradOp`` ... after the ``*ArgGradOp``
patterns): products and quotients as ONNX ops, summed back over broadcast dimensions."""

from __future__ import annotations

from openipu.popart.grads import grad_rule


def _ub(g, t, i):
    """``t`` summed to the shape of input ``i``."""
    return g.unbroadcast(t, g.shape(g.x(i))) if t is not None else None


@grad_rule("Add")
def add(g, op):
    gy = g.gy()
    return [_ub(g, gy, 0) if g.needs(0) else None, _ub(g, gy, 1) if g.needs(1) else None]


@grad_rule("Sub")
def sub(g, op):
    gy = g.gy()
    return [_ub(g, gy, 0) if g.needs(0) else None, _ub(g, g.neg(gy), 1) if g.needs(1) else None]


@grad_rule("Mul")
def mul(g, op):
    gy, a, b = g.gy(), g.x(0), g.x(1)
    return [_ub(g, g.add("Mul", [gy, b], shape=g.shape(gy)), 0) if g.needs(0) else None,
            _ub(g, g.add("Mul", [gy, a], shape=g.shape(gy)), 1) if g.needs(1) else None]


@grad_rule("Div")
def div(g, op):
    gy, b, y = g.gy(), g.x(1), g.y()
    ga = _ub(g, g.add("Div", [gy, b], shape=g.shape(gy)), 0) if g.needs(0) else None
    gb = None
    if g.needs(1):      # d(a/b)/db = -y / b
        t = g.add("Mul", [gy, g.add("Div", [y, b], shape=g.shape(y))])
        gb = _ub(g, g.neg(t), 1)
    return [ga, gb]


@grad_rule("Pow")
def pow_(g, op):
    gy, a, b, y = g.gy(), g.x(0), g.x(1), g.y()
    ga = gb = None
    if g.needs(0):      # b * a^(b-1) = b * y / a (a may be 0: use the power form)
        bm1 = g.add("Sub", [b, g.const(1.0, b, "one")], shape=g.shape(b))
        t = g.add("Mul", [b, g.add("Pow", [a, bm1], shape=g.shape(y))], shape=g.shape(y))
        ga = _ub(g, g.add("Mul", [gy, t]), 0)
    if g.needs(1):      # y * ln(a)
        t = g.add("Mul", [y, g.add("Log", [a])], shape=g.shape(y))
        gb = _ub(g, g.add("Mul", [gy, t]), 1)
    return [ga, gb]


@grad_rule("Neg")
def neg(g, op):
    return [g.neg(g.gy())]


@grad_rule("Sqrt")
def sqrt(g, op):
    return [g.add("Div", [g.gy(), g.scale(g.y(), 2.0)])]


@grad_rule("Exp")
def exp(g, op):
    return [g.add("Mul", [g.gy(), g.y()])]


@grad_rule("Log")
def log(g, op):
    return [g.add("Div", [g.gy(), g.x(0)])]


@grad_rule("Reciprocal")
def reciprocal(g, op):
    y = g.y()
    return [g.neg(g.add("Mul", [g.gy(), g.add("Mul", [y, y])]))]


@grad_rule("Abs")
def abs_(g, op):
    return [g.add("Mul", [g.gy(), g.add("Sign", [g.x(0)])])]


@grad_rule("Sum")
def sum_(g, op):
    return [_ub(g, g.gy(), i) if g.needs(i) else None for i in range(len(op.inputs))]


@grad_rule("Mean")
def mean(g, op):
    t = g.scale(g.gy(), 1.0 / len(op.inputs))
    return [_ub(g, t, i) if g.needs(i) else None for i in range(len(op.inputs))]


@grad_rule("Identity", "Dropout")
def identity(g, op):
    return [g.gy()] + [None] * (len(op.inputs) - 1)


@grad_rule("Scale", domain="ai.graphcore")
def scale(g, op):
    return [g.scale(g.gy(), float(op.attrs.get("scale", 1.0)))]


@grad_rule("Cast")
def cast(g, op):
    return [g.cast(g.gy(), g.dtype(g.x(0)))]


@grad_rule("Where")
def where(g, op):
    gy, c = g.gy(), g.x(0)
    zero = g.const(0.0, gy, "zero")
    ga = _ub(g, g.add("Where", [c, gy, zero], shape=g.shape(gy)), 1) if g.needs(1) else None
    gb = _ub(g, g.add("Where", [c, zero, gy], shape=g.shape(gy)), 2) if g.needs(2) else None
    return [None, ga, gb]
