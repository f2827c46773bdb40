"""Gradients of the pooling ops (``popnn::poolInputGradient``): ``MaxPoolGrad`` reads the
forward input and output, ``AveragePoolGrad`` only the output gradient; the global poolings
broadcast the gradient back (divided by the field size for the average). LpPool, GlobalLpPool,
MaxUnpool and RoiAlign use the generic ``<Op>Grad`` ops (vjp of the forward kernel)."""

from __future__ import annotations

import math

from openipu.popart.grads import GRAPHCORE, grad_rule


@grad_rule("MaxPool")
def max_pool(g, op):
    if len(op.outputs) > 1 and op.outputs[1] and g.gy(1) is not None:
        return [None]
    return [g.add("MaxPoolGrad", [g.x(0), g.y(), g.gy()], shape=g.shape(g.x(0)), domain=GRAPHCORE,
                  attrs=g.fwd_attrs())]


@grad_rule("AveragePool")
def average_pool(g, op):
    return [g.add("AveragePoolGrad", [g.gy()], shape=g.shape(g.x(0)), domain=GRAPHCORE,
                  attrs=g.fwd_attrs(input_shape=g.shape(g.x(0))))]


@grad_rule("GlobalAveragePool")
def global_average_pool(g, op):
    xs = g.shape(g.x(0))
    return [g.expand(g.scale(g.gy(), 1.0 / max(1, math.prod(xs[2:]))), xs)]


@grad_rule("GlobalMaxPool")
def global_max_pool(g, op):
    xs = g.shape(g.x(0))
    return [g.add("MaxPoolGrad", [g.x(0), g.y(), g.gy()], shape=xs, domain=GRAPHCORE,
                  attrs={"kernel_shape": xs[2:]})]


@grad_rule("LpPool", "GlobalLpPool", "MaxUnpool", "RoiAlign")
def generic_pool(g, op):
    return [g.vjp(0) if g.needs(0) else None] + [None] * (len(op.inputs) - 1)
