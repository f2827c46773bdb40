"""Gradients of Conv: ``ConvDataGrad`` (the input-gradient convolution, ``poplin`` with
``getGradientParams`` and transposed, flipped weights), ``ConvWeightsGrad`` (the weight-delta
convolution, ``poplin::calculateWeightDeltas``) and a ReduceSum of the output gradient for the
bias. Both grad ops keep the forward op's attributes."""

from __future__ import annotations

from openipu.popart.grads import GRAPHCORE, grad_rule


@grad_rule("Conv")
def conv(g, op):
    x, w, gy = g.x(0), g.x(1), g.gy()
    grads = [None] * len(op.inputs)
    if g.needs(0):
        grads[0] = g.add("ConvDataGrad", [gy, w], shape=g.shape(x), domain=GRAPHCORE,
                         attrs=g.fwd_attrs(input_shape=g.shape(x)))
    if g.needs(1):
        grads[1] = g.add("ConvWeightsGrad", [gy, x], shape=g.shape(w), domain=GRAPHCORE,
                         attrs=g.fwd_attrs(weights_shape=g.shape(w)))
    if len(op.inputs) > 2 and op.inputs[2] and g.needs(2):
        r = len(g.shape(gy))
        grads[2] = g.reduce_sum(gy, [0] + list(range(2, r)), keepdims=False)
    return grads
