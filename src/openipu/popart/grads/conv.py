"""Gradients of Conv: ``ConvDataGrad`` (the input-gradient convolution, ``poplin`` with
``getGradientParams`` and transposed, flipped weights), ``ConvWeightsGrad`` (the weight-delta
convolution, ``poplin::calculateWeightDeltas``) and a ReduceSum of the output gradient for the
bias. Both grad ops keep the forward op's attributes. ConvTranspose: a Conv for the input
gradient, the generic ``ConvTransposeGrad`` for the weights; Col2Im: generic."""

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


def _convt_pads(g, op):
    """Conv pads (begins + ends) whose convolution of ConvTranspose's output gradient is the
    gradient of its input (the adjoint), or None when a pad would be negative."""
    xs, ws, ys = g.shape(g.x(0)), g.shape(g.x(1)), g.shape(g.y())
    nd = len(ws) - 2
    a = op.attrs
    strides = list(a.get("strides") or [1] * nd)
    dil = list(a.get("dilations") or [1] * nd)
    full = [strides[i] * (xs[2 + i] - 1) + (ws[2 + i] - 1) * dil[i] + 1 for i in range(nd)]
    out = ys[2:]
    auto_pad = a.get("auto_pad", "NOTSET")
    outpad = list(a.get("output_padding") or [0] * nd)
    if a.get("output_shape") or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [full[i] + outpad[i] - out[i] for i in range(nd)]
        begins = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    else:
        pads = list(a.get("pads") or [0] * (2 * nd)) if auto_pad != "VALID" else [0] * (2 * nd)
        begins = pads[:nd]
    ends = [full[i] - begins[i] - out[i] for i in range(nd)]
    if any(p < 0 for p in begins + ends):
        return None
    return strides, dil, begins + ends


@grad_rule("ConvTranspose")
def conv_transpose(g, op):
    """ConvTranspose: the input gradient is the Conv of the output gradient with the same weights
    (lowered by ``poplin``); the weights' gradient is the generic ``ConvTransposeGrad`` (vjp);
    the bias gets a ReduceSum."""
    gy = g.gy()
    grads = [None] * len(op.inputs)
    geo = _convt_pads(g, op)
    if g.needs(0):
        if geo is None:
            grads[0] = g.vjp(0)
        else:
            strides, dil, pads = geo
            grads[0] = g.add("Conv", [gy, g.x(1)], shape=g.shape(g.x(0)), opset=11,
                             attrs={"strides": strides, "dilations": dil, "pads": pads,
                                    "group": int(op.attrs.get("group", 1))})
    if g.needs(1):
        grads[1] = g.vjp(1)
    if len(op.inputs) > 2 and op.inputs[2] and g.needs(2):
        grads[2] = g.reduce_sum(gy, [0] + list(range(2, len(g.shape(gy)))), keepdims=False)
    return grads


@grad_rule("Col2Im")
def col2im(g, op):
    return [g.vjp(0) if g.needs(0) else None] + [None] * (len(op.inputs) - 1)
