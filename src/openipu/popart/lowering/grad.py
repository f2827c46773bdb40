"""The ``ai.graphcore`` gradient ops autodiff adds, where PopLibs has their form (PopART's
``*GradOpx``); the others (softmax, loss and pooling gradients, GatherGrad) use the generic
lowering with their host kernels (:mod:`openipu.popart.onnx_ops.grad`).

- ReluGrad, SigmoidGrad, TanhGrad (forward output, output gradient), GeluGrad, GeluErfGrad
  (forward input, output gradient): ``popnn.nonLinearityInputGradient``;
- ConvDataGrad (output gradient, weights): ``poplin.convolution`` with the forward op's
  ``getGradientParams`` and ``transposeAndFlipWeights``, PopART's ``ConvDataGradOpx`` after the
  ``ConvDataGrad`` pattern;
- ConvWeightsGrad (output gradient, forward input): ``poplin.calculateWeightDeltas``
  (PopART's ``ConvWeightsGradOpx``).

The convolution gradients are declined (generic lowering) when the forward op is not lowered by
``poplin`` itself.
"""

from __future__ import annotations

from openipu.poplibs import popnn, poplin
from openipu.popart.lowering import conv as conv_lowering
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import all_float, graph, name, shape

GC = "ai.graphcore"
_NL = {"ReluGrad": "RELU", "SigmoidGrad": "SIGMOID", "TanhGrad": "TANH", "GeluGrad": "GELU",
       "GeluErfGrad": "GELU_ERF"}


def _accepts_nl(op, ir):
    return all_float(ir, op) and shape(ir, op.inputs[0]) == shape(ir, op.inputs[1])


@lowering(*_NL, domain=GC, accepts=_accepts_nl)
def non_linearity_grad(ctx, op):
    out, gy = ctx.input(op, 0), ctx.input(op, 1)
    return [popnn.nonLinearityInputGradient(graph(ctx, op), _NL[op.op_type], out, gy, ctx.prog, name(op))]


def _fwd_params(op, ir):
    fwd = op.grad_of
    if fwd is None or fwd.op_type != "Conv" or not conv_lowering._accepts(fwd, ir):
        return None
    return conv_lowering._params(fwd, ir)


def _accepts_data(op, ir):
    p = _fwd_params(op, ir)
    return p is not None and all_float(ir, op) and \
        poplin.getGradientParams(p).getOutputShape() == shape(ir, op.outputs[0])


def _accepts_weights(op, ir):
    return _fwd_params(op, ir) is not None and all_float(ir, op)


@lowering("ConvDataGrad", domain=GC, accepts=_accepts_data)
def conv_data_grad(ctx, op):
    g, gy, w = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    p = conv_lowering._params(op.grad_of, ctx.ir, gy.elementType())
    G = p.numConvGroups
    w = w.reshape([G, w.dim(0) // G] + w.shape()[1:])
    return [poplin.convolution(g, gy, w, poplin.getGradientParams(p), True, ctx.prog, name(op),
                               conv_lowering._options(ctx, op.grad_of))]


@lowering("ConvWeightsGrad", domain=GC, accepts=_accepts_weights)
def conv_weights_grad(ctx, op):
    g, gy, x = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    p = conv_lowering._params(op.grad_of, ctx.ir, gy.elementType())
    d = poplin.calculateWeightDeltas(g, gy, x, p, ctx.prog, name(op), conv_lowering._options(ctx, op.grad_of))
    return [d.reshape(shape(ctx.ir, op.outputs[0]))]
