"""Gradients of the elementwise ops (PopART's ``AddArg0GradOp`` ... after the ``*ArgGradOp``
patterns): products and quotients as ONNX ops, summed back over broadcast dimensions.

- Max, Min (PopART's ``MaxArgGrad`` / ``MinArgGrad``): the output gradient where the input is
  the result (``Where(Equal(x, y), gy, 0)``);
- Clip: ``ClipGrad`` (the gradient where ``min <= x <= max``; a tensor bound gets the gradient
  where it clipped); PRelu, Mod, ``ai.graphcore`` Fmod / Atan2: the generic gradient ops (vjp);
- Dropout: the identity in inference mode; in training mode the output gradient where the
  forward op's mask kept the element, scaled by ``1 / (1 - ratio)`` (PopART's ``DropoutGrad``);
- Sign, Floor, Ceil, Round (``ai.graphcore`` Round, Nearbyint): zero (PopART's ``SignGrad``);
  RandomNormalLike, RandomUniformLike, EyeLike, Bernoulli: no gradient (shape only).
"""

from __future__ import annotations

import numpy as np

from openipu.popart.errors import popart_exception
from openipu.popart.grads import GRAPHCORE, grad_rule


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


@grad_rule("Identity")
def identity(g, op):
    return [g.gy()] + [None] * (len(op.inputs) - 1)


@grad_rule("Dropout")
def dropout(g, op):
    """Inference: the identity. Training mode (opset >= 12 ``training_mode`` true, opset 6
    ``is_test=0``): ``Where(mask, gy / (1 - ratio), 0)`` with the forward op's mask output
    (PopART's ``DropoutGrad``)."""
    rest = [None] * (len(op.inputs) - 1)
    if op.opset < 12:
        training, ratio = op.opset < 7 and not op.attrs.get("is_test", 0), float(op.attrs.get("ratio", 0.5))
    else:
        t = g.const_value(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] else np.zeros(1, bool)
        r = g.const_value(op.inputs[1]) if len(op.inputs) > 1 and op.inputs[1] else np.full(1, 0.5)
        if t is None or r is None:
            raise popart_exception(f"Dropout '{op.name}': openipu differentiates Dropout only with a constant ratio "
                                   "and training_mode")
        training, ratio = bool(np.asarray(t).reshape(-1)[0]), float(np.asarray(r).reshape(-1)[0])
    if not training or ratio == 0:
        return [g.gy()] + rest
    gy, x = g.gy(), g.x(0)
    mask = g.fwd_output(1, g.shape(x), "BOOL")
    gx = g.add("Where", [mask, g.scale(gy, 1.0 / (1.0 - ratio)), g.const(0.0, gy, "zero")], shape=g.shape(x),
               dtype=g.dtype(gy))
    return [gx] + rest


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
    ga = _ub(g, g.add("Where", [c, gy, zero], shape=g.shape(gy), dtype=g.dtype(gy)), 1) if g.needs(1) else None
    gb = _ub(g, g.add("Where", [c, zero, gy], shape=g.shape(gy), dtype=g.dtype(gy)), 2) if g.needs(2) else None
    return [None, ga, gb]


@grad_rule("Max", "Min")
def max_min(g, op):
    gy, y = g.gy(), g.y()
    zero = g.const(0.0, gy, "zero")
    out = []
    for i, x in enumerate(op.inputs):
        if not g.needs(i):
            out.append(None)
            continue
        hit = g.add("Equal", [x, y], shape=g.shape(y), dtype="BOOL")
        out.append(_ub(g, g.add("Where", [hit, gy, zero], shape=g.shape(gy), dtype=g.dtype(gy)), i))
    return out


@grad_rule("Clip")
def clip(g, op):
    gy, x = g.gy(), g.x(0)
    out = [g.vjp(0, op_type="ClipGrad") if g.needs(0) else None]
    zero = g.const(0.0, gy, "zero")
    for i, cmp in ((1, "Less"), (2, "Greater")):       # a tensor bound: where it clipped
        if i < len(op.inputs) and op.inputs[i] and g.needs(i):
            hit = g.add(cmp, [x, g.x(i)], shape=g.shape(x), dtype="BOOL")
            part = g.add("Where", [hit, gy, zero], shape=g.shape(gy), dtype=g.dtype(gy))
            out.append(g.reshape(g.reduce_sum(part, range(len(g.shape(part))), keepdims=False), g.shape(g.x(i))))
        elif i < len(op.inputs):
            out.append(None)
    return out


@grad_rule("PRelu", "Mod")
def generic_binary(g, op):
    return [g.vjp(i) if g.needs(i) else None for i in range(len(op.inputs))]


@grad_rule("Sign", "Floor", "Ceil", "Round")
def zero(g, op):
    return [g.scale(g.gy(), 0.0)]


@grad_rule("Round", "Nearbyint", domain=GRAPHCORE)
def zero_gc(g, op):
    return [g.scale(g.gy(), 0.0)]


@grad_rule("RandomNormalLike", "RandomUniformLike", "EyeLike", "Bernoulli")
def no_gradient(g, op):
    """Ops whose output depends on their input's shape (or a random draw) only: no gradient."""
    return [None] * len(op.inputs)
