"""The ``ai.graphcore`` gradient ops autodiff adds, where PopLibs has their form (PopART's
``*GradOpx``; GatherGrad in :mod:`.gather`); the others (loss and pooling gradients, LogSoftmaxGrad, the generic
``<Op>Grad`` ops) use the generic lowering with their host kernels
(:mod:`openipu.popart.onnx_ops.grad`).

- ReluGrad, SigmoidGrad, TanhGrad (forward output, output gradient), GeluGrad, GeluErfGrad
  (forward input, output gradient): ``popnn.nonLinearityInputGradient``; SoftmaxGrad: the same
  with ``SOFTMAX`` over the innermost dimension (the axis moved there by a view);
- the other unary gradients (LeakyReluGrad, ErfGrad, EluGrad, SeluGrad, SoftPlusGrad, AtanGrad
  ..., ClipGrad with constant bounds; forward input, output gradient): one fused ``popops.map``
  of the derivative (PopART's ``ElementWiseNonLinearUnaryGradOpx`` family);
- LayerNormalizationGrad, BatchNormalizationGrad, InstanceNormalizationGrad,
  GroupNormalizationGrad (x, scale, mean, invStdDev | var, gy -> dx, dscale, dbias): ``popnn``'s
  ``<norm>Whiten``, ``<norm>Gradients`` and ``<norm>ParamGradients`` (PopART's
  ``GroupNormGradOpx`` / ``BatchNormGradOpx``), the statistics recomputed with
  ``<norm>Statistics`` when the forward op does not output them;
- ConvDataGrad (output gradient, weights): ``poplin.convolution`` with the forward op's
  ``getGradientParams`` and ``transposeAndFlipWeights``, PopART's ``ConvDataGradOpx`` after the
  ``ConvDataGrad`` pattern;
- ConvWeightsGrad (output gradient, forward input): ``poplin.calculateWeightDeltas``
  (PopART's ``ConvWeightsGradOpx``).

The convolution gradients are declined (generic lowering) when the forward op is not lowered by
``poplin`` itself.
"""

from __future__ import annotations

import math

from openipu import poplar
from openipu.poplibs import popnn, poplin, popops
from openipu.poplibs.popops import expr as E
from openipu.popart.lowering import conv as conv_lowering
from openipu.popart.lowering import lowering
from openipu.popart.lowering import norm as norm_lowering
from openipu.popart.lowering import unary as unary_lowering
from openipu.popart.lowering._util import all_float, dtype, graph, name, shape

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


# -- elementwise gradients of the unary ops: one popops.map of (forward input, gy) ---------------
def _c(v):
    return E.Const(float(v))


def _hard_swish(x, gy, a):
    inside = E.And(E.Gte(x, _c(-3.0)), E.Lte(x, _c(3.0)))
    d = E.Add(E.Clamp(E.Add(E.Divide(x, _c(6.0)), _c(0.5)), _c(0.0), _c(1.0)),
              E.Select(E.Divide(x, _c(6.0)), _c(0.0), inside))
    return E.Mul(gy, d)


def _mish(x, gy, a):
    t = E.Tanh(E.Log(E.Add(_c(1.0), E.Exp(x))))
    return E.Mul(gy, E.Add(t, E.Mul(E.Mul(x, E.Sigmoid(x)), E.Sub(_c(1.0), E.Square(t)))))


def _swish(x, gy, a):
    al = float(a.get("alpha", 1.0))
    s = E.Sigmoid(E.Mul(_c(al), x))
    return E.Mul(gy, E.Add(s, E.Mul(E.Mul(_c(al), x), E.Mul(s, E.Sub(_c(1.0), s)))))


def _hard_sigmoid(x, gy, a):
    al, be = float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))
    v = E.Add(E.Mul(_c(al), x), _c(be))
    return E.Select(E.Mul(gy, _c(al)), _c(0.0), E.And(E.Gte(v, _c(0.0)), E.Lte(v, _c(1.0))))


_SELU = (1.67326319217681884765625, 1.05070102214813232421875)

#: grad op -> fn(x, gy, forward attrs) -> popops expression of the input gradient
_UNARY_GRAD = {
    "LeakyReluGrad": lambda x, gy, a: E.Select(gy, E.Mul(gy, _c(a.get("alpha", 0.01))), E.Gt(x, _c(0.0))),
    "ErfGrad": lambda x, gy, a: E.Mul(gy, E.Mul(_c(2.0 / math.sqrt(math.pi)), E.Exp(E.Neg(E.Square(x))))),
    "EluGrad": lambda x, gy, a: E.Select(gy, E.Mul(gy, E.Mul(_c(a.get("alpha", 1.0)), E.Exp(x))), E.Gt(x, _c(0.0))),
    "CeluGrad": lambda x, gy, a: E.Select(gy, E.Mul(gy, E.Exp(E.Divide(x, _c(a.get("alpha", 1.0))))),
                                          E.Gt(x, _c(0.0))),
    "SeluGrad": lambda x, gy, a: E.Mul(E.Mul(gy, _c(a.get("gamma", _SELU[1]))),
                                       E.Select(_c(1.0), E.Mul(_c(a.get("alpha", _SELU[0])), E.Exp(x)),
                                                E.Gt(x, _c(0.0)))),
    "HardSigmoidGrad": _hard_sigmoid,
    "SoftSignGrad": lambda x, gy, a: E.Divide(gy, E.Square(E.Add(_c(1.0), E.Abs(x)))),
    "SoftPlusGrad": lambda x, gy, a: E.Mul(gy, E.Sigmoid(x)),
    "ThresholdedReluGrad": lambda x, gy, a: E.Select(gy, _c(0.0), E.Gt(x, _c(a.get("alpha", 1.0)))),
    "ShrinkGrad": lambda x, gy, a: E.Select(gy, _c(0.0), E.Gt(E.Abs(x), _c(a.get("lambd", 0.5)))),
    "HardSwishGrad": _hard_swish,
    "MishGrad": _mish,
    "SwishGrad": _swish,
    "TanGrad": lambda x, gy, a: E.Mul(gy, E.Add(_c(1.0), E.Square(E.Tan(x)))),
    "AsinGrad": lambda x, gy, a: E.Mul(gy, E.Rsqrt(E.Sub(_c(1.0), E.Square(x)))),
    "AcosGrad": lambda x, gy, a: E.Neg(E.Mul(gy, E.Rsqrt(E.Sub(_c(1.0), E.Square(x))))),
    "AtanGrad": lambda x, gy, a: E.Divide(gy, E.Add(_c(1.0), E.Square(x))),
    "SinhGrad": lambda x, gy, a: E.Mul(gy, E.Mul(_c(0.5), E.Add(E.Exp(x), E.Exp(E.Neg(x))))),
    "CoshGrad": lambda x, gy, a: E.Mul(gy, E.Mul(_c(0.5), E.Sub(E.Exp(x), E.Exp(E.Neg(x))))),
    "AsinhGrad": lambda x, gy, a: E.Mul(gy, E.Rsqrt(E.Add(E.Square(x), _c(1.0)))),
    "AcoshGrad": lambda x, gy, a: E.Mul(gy, E.Rsqrt(E.Sub(E.Square(x), _c(1.0)))),
    "AtanhGrad": lambda x, gy, a: E.Divide(gy, E.Sub(_c(1.0), E.Square(x))),
}


def _fwd_attrs(op) -> dict:
    return op.grad_of.attrs if op.grad_of is not None else {}


def _accepts_unary_grad(op, ir):
    x, gy = op.inputs[0], op.inputs[-1]
    return bool(x) and all_float(ir, op, [0, len(op.inputs) - 1]) and shape(ir, x) == shape(ir, gy) == \
        shape(ir, op.outputs[0])


@lowering(*_UNARY_GRAD, domain=GC, accepts=_accepts_unary_grad)
def unary_grad(ctx, op):
    e = _UNARY_GRAD[op.op_type](E._1, E._2, _fwd_attrs(op))
    x, gy = ctx.input(op, 0), ctx.input(op, len(op.inputs) - 1)
    return [popops.map(graph(ctx, op), e, [x, gy], ctx.prog, name(op))]


def _accepts_clip_grad(op, ir):
    fwd = op.grad_of
    return fwd is not None and fwd.op_type == "Clip" and _accepts_unary_grad(op, ir) and \
        unary_lowering._clip_bounds(fwd, ir) is not False


@lowering("ClipGrad", domain=GC, accepts=_accepts_clip_grad)
def clip_grad(ctx, op):
    """``Select(gy, 0, lo <= x <= hi)`` (the gradient passes where the input is not clipped)."""
    lo, hi = unary_lowering._clip_bounds(op.grad_of, ctx.ir)
    cond = None
    for b, cmp in ((lo, E.Gte), (hi, E.Lte)):
        if b is not None and abs(b) != math.inf:
            c = cmp(E._1, _c(b))
            cond = c if cond is None else E.And(cond, c)
    x, gy = ctx.input(op, 0), ctx.input(op, len(op.inputs) - 1)
    if cond is None:
        return [gy]
    return [popops.map(graph(ctx, op), E.Select(E._2, _c(0.0), cond), [x, gy], ctx.prog, name(op))]


# -- normalisation gradients: popnn's (param) gradients of the whitened activations ------------
def _norm_view(op, ir):
    """``(kind, acts shape, groups)``: how popnn sees the forward op's input (LayerNormalization:
    ``[rows, C]``), or None."""
    fwd = op.grad_of
    xs = shape(ir, op.inputs[0])
    if fwd is None or len(xs) < 2 or math.prod(xs) == 0:
        return None
    if op.op_type == "LayerNormalizationGrad":
        axis = norm_lowering._ln_axis(fwd, ir)
        if axis is None:
            return None
        return "ln", [math.prod(xs[:axis]), math.prod(xs[axis:])], 0
    if op.op_type == "GroupNormalizationGrad":
        groups = int(fwd.attrs.get("num_groups", 0))
        if groups < 1 or xs[1] % groups:
            return None
        return "gn", xs, groups
    if op.op_type == "InstanceNormalizationGrad":
        return ("in", xs, 0) if len(xs) >= 3 else None
    return "bn", xs, 0


def _accepts_norm_grad(op, ir):
    v = _norm_view(op, ir)
    if v is None or not all_float(ir, op, [0, 1, 4]) or dtype(ir, op.outputs[0]) != dtype(ir, op.inputs[0]):
        return False
    if any(x and dtype(ir, x) != dtype(ir, op.inputs[0]) for x in op.inputs[2:4]):
        return False
    if op.op_type != "BatchNormalizationGrad" and not norm_lowering._half_stash_ok(op.grad_of, ir):
        return False
    c = v[1][1]
    return math.prod(shape(ir, op.inputs[1])) == c and shape(ir, op.inputs[4]) == shape(ir, op.inputs[0])


_POPNN = {"ln": (popnn.ln, "layerNorm"), "gn": (popnn.gn, "groupNorm"), "in": (popnn.in_, "instanceNorm"),
          "bn": (popnn.bn, "batchNorm")}


@lowering("LayerNormalizationGrad", "BatchNormalizationGrad", "InstanceNormalizationGrad", "GroupNormalizationGrad",
          domain=GC, accepts=_accepts_norm_grad)
def norm_grad(ctx, op):
    """PopART's ``GroupNormGradOpx`` / ``BatchNormGradOpx``: the statistics (the forward op's
    outputs when it has them, else recomputed with ``<norm>Statistics``), the whitened input
    (``<norm>Whiten``), then ``<norm>Gradients`` and ``<norm>ParamGradients``."""
    g, nm = graph(ctx, op), name(op)
    kind, view, groups = _norm_view(op, ctx.ir)
    ns, pre = _POPNN[kind]
    fwd = op.grad_of
    x = ctx.input(op, 0)
    xs = x.shape()
    acts = x.reshape(view)
    gy = ctx.input(op, 4).reshape(view)
    gamma = ctx.input(op, 1).flatten()
    eps = float(fwd.attrs.get("epsilon", 1e-5))
    opts = norm_lowering._GN_OPTS if kind == "gn" else None
    mean, stat = ctx.input(op, 2), ctx.input(op, 3)
    if mean is None or stat is None:
        args = (groups,) if kind == "gn" else ()
        mean, inv = getattr(ns, f"{pre}Statistics")(g, acts, eps, ctx.prog, *args, False, norm_lowering._stable(ctx),
                                                    poplar.FLOAT, f"{nm}/stats", **({"options": opts} if opts else {}))
    elif kind == "bn":          # PopART's convertVarToInvSd
        mean = mean.flatten()
        inv = popops.map(g, E.Rsqrt(E.Add(E._1, _c(eps))), [stat.flatten()], ctx.prog, f"{nm}/invSd")
    else:
        mean, inv = mean.flatten(), stat.flatten()
    kw = {"options": opts} if opts else {}
    white = getattr(ns, f"{pre}Whiten")(g, acts, mean, inv, ctx.prog, f"{nm}/whiten", **kw)
    dx = getattr(ns, f"{pre}Gradients")(g, white, gy, inv, gamma, ctx.prog, debug_name=f"{nm}/operandGrad", **kw)
    dg, db = getattr(ns, f"{pre}ParamGradients")(g, white, gy, ctx.prog, debug_name=f"{nm}/scaleOffsetGrads", **kw)
    return [dx.reshape(xs), dg.reshape(shape(ctx.ir, op.outputs[1])), db.reshape(shape(ctx.ir, op.outputs[2]))]


# -- SoftmaxGrad: popnn's softmax input gradient over the innermost dimension -----------------
def _accepts_softmax_grad(op, ir):
    y, gy = op.inputs
    xs = shape(ir, y)
    return all_float(ir, op) and xs == shape(ir, gy) and len(xs) >= 1 and math.prod(xs) > 0


@lowering("SoftmaxGrad", domain=GC, accepts=_accepts_softmax_grad)
def softmax_grad(ctx, op):
    """PopART's ``SoftmaxGradOpx``: ``popnn.nonLinearityInputGradient(SOFTMAX)`` of the forward
    output, the axis viewed innermost as the forward lowering does (a 2-D view for opset < 13)."""
    g, y, gy = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    xs = y.shape()
    r = len(xs)
    axis = int(op.attrs.get("axis", -1)) % r

    def fn(a, b):
        return popnn.nonLinearityInputGradient(g, "SOFTMAX", a, b, ctx.prog, name(op))
    if op.attrs.get("flatten", 0):
        view = [math.prod(xs[:axis]), math.prod(xs[axis:])]
        return [fn(y.reshape(view), gy.reshape(view)).reshape(xs)]
    if axis == r - 1:
        return [fn(y, gy)]
    perm = [d for d in range(r) if d != axis] + [axis]
    inv = [perm.index(d) for d in range(r)]
    return [fn(y.dimShuffle(perm), gy.dimShuffle(perm)).dimShuffle(inv)]
