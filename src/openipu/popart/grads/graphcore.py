"""Gradients of the ``ai.graphcore`` ops (PopART's ``getGradOps`` of each, after its grad
patterns). ONNX ops where they express the gradient; otherwise PopART's ``*Grad`` ops, whose
host kernels are in :mod:`openipu.popart.onnx_ops.graphcore_grad`:

- identities: Nop, TensorRemap, ReplicatedAllReduce (one replica); PrintTensor prints the
  gradient too (a PrintTensor of the gradient) unless ``print_gradient`` is 0;
- ScaledAdd -> Mul / ReduceSum (scale tensors too); Reshape, Reverse (the reverse of the
  gradient), Slice -> ``SliceGrad``; Subsample -> ``SubsampleGrad``;
- Swish -> ``SwishGrad``; Expm1 -> ``gy (y + 1)``; Log1p -> ``gy / (x + 1)``; Atan2 ->
  ``gy x / (x^2 + y^2)``, ``-gy y / (x^2 + y^2)``; Fmod, Remainder -> ``gy`` (dividend only);
- Ctc -> ``CtcGrad`` (the forward op's gradient output, scaled); ReduceMedian ->
  ``ReduceMedianGrad`` (through the indices); GroupNormalization -> ``GroupNormalizationGrad``
  (x, scale, bias; one op, three outputs); Sort -> ``SortGrad``;
- Dropout (training) -> ``DropoutGrad``; ShapedDropout -> a ShapedDropout of the gradient, both
  with the forward op's seed and ``seedModifier`` (the same mask);
- DynamicSlice -> ``DynamicSlicePadGrad``; DynamicUpdate -> DynamicZero (tensor) and
  DynamicSlice (slice); DynamicZero -> DynamicZero; DynamicAdd -> the gradient (tensor) and
  DynamicSlice (slice); SequenceSlice -> ``SequenceSliceGrad`` (source, destination);
- ScatterReduce (grouped too) -> ``ScatterReduceGrad`` (src, initial); GroupedGather ->
  ``GroupedGatherGrad``; DepthToSpace -> ``DepthToSpaceGrad``;
- BatchNormalization (PopART's variant, training mode) -> ``BatchNormalizationGrad``; LSTM
  (``PopartLSTMOp``) -> ``PopartLSTMGrad`` (the generic vjp, per output).

CtcBeamSearchDecoder, ReplicatedReduceScatter, SplineBasis, SplineWeighting and PackedDataBlock
have no gradient in PopART (no ``getGradOps``), so none here.

Detach passes no gradient (:mod:`openipu.popart.transforms.autodiff`); Call and MultiConv are
inlined / split into ordinary ops by the IR, so their gradients are those ops'.
"""

from __future__ import annotations

from openipu.popart.errors import popart_exception
from openipu.popart.grads import GRAPHCORE, grad_rule

GC = GRAPHCORE


def _gc(g, op_type, inputs, shape=None, attrs=None, dtype=None):
    return g.add(op_type, inputs, shape=shape, dtype=dtype, attrs=attrs, domain=GC, opset=1)


def _ub(g, t, i):
    return g.unbroadcast(t, g.shape(g.x(i))) if t is not None else None


@grad_rule("Nop", "TensorRemap", "ReplicatedAllReduce", domain=GC)
def identity(g, op):
    return [g.gy()] + [None] * (len(op.inputs) - 1)


@grad_rule("PrintTensor", domain=GC)
def print_tensor(g, op):
    if not int(op.attrs.get("print_gradient", 1)):
        return [g.gy()]
    return [_gc(g, "PrintTensor", [g.gy()], attrs={"print_gradient": 1, "title": op.attrs.get("title")})]


@grad_rule("ScaledAdd", domain=GC)
def scaled_add(g, op):
    gy = g.gy()
    out = [None] * len(op.inputs)
    for i, k in ((0, 2), (1, 3)):
        s = g.x(k)
        if g.needs(i):
            if s:
                t = g.add("Mul", [gy, g.cast(s, g.dtype(gy))], shape=g.shape(gy))
            else:
                t = g.scale(gy, float(op.attrs.get(f"scale{i}", 1.0)))
            out[i] = _ub(g, t, i)
        if s and g.needs(k):
            t = g.add("Mul", [gy, g.x(i)], shape=g.shape(gy))
            out[k] = g.cast(_ub(g, t, k), g.dtype(s))
    return out


@grad_rule("Reshape", domain=GC)
def reshape(g, op):
    return [g.reshape(g.gy(), g.shape(g.x(0)))]


@grad_rule("Reverse", domain=GC)
def reverse(g, op):
    return [_gc(g, "Reverse", [g.gy()], attrs={"dimensions": list(op.attrs.get("dimensions", []))})]


@grad_rule("Slice", domain=GC)
def slice_(g, op):
    return [_gc(g, "SliceGrad", [g.gy()], shape=g.shape(g.x(0)),
                attrs=g.fwd_attrs(input_shape=g.shape(g.x(0))))]


@grad_rule("Subsample", domain=GC)
def subsample(g, op):
    return [_gc(g, "SubsampleGrad", [g.gy()], shape=g.shape(g.x(0)),
                attrs={"strides": list(op.attrs.get("strides", [])), "input_shape": g.shape(g.x(0))})]


@grad_rule("Swish", domain=GC)
def swish(g, op):
    return [_gc(g, "SwishGrad", [g.x(0), g.gy()])]


@grad_rule("Expm1", domain=GC)
def expm1(g, op):
    y = g.y()
    return [g.add("Mul", [g.gy(), g.add("Add", [y, g.const(1.0, y, "one")])])]


@grad_rule("Log1p", domain=GC)
def log1p(g, op):
    x = g.x(0)
    return [g.add("Div", [g.gy(), g.add("Add", [x, g.const(1.0, x, "one")])])]


@grad_rule("Atan2", domain=GC)
def atan2(g, op):
    gy, a, b = g.gy(), g.x(0), g.x(1)       # y = atan2(a, b)
    shp = g.shape(gy)
    den = g.add("Add", [g.add("Mul", [a, a]), g.add("Mul", [b, b])], shape=shp)
    ga = _ub(g, g.add("Mul", [gy, g.add("Div", [b, den], shape=shp)], shape=shp), 0) if g.needs(0) else None
    gb = _ub(g, g.neg(g.add("Mul", [gy, g.add("Div", [a, den], shape=shp)], shape=shp)), 1) if g.needs(1) else None
    return [ga, gb]


@grad_rule("Fmod", "Remainder", domain=GC)
def fmod(g, op):
    return [_ub(g, g.gy(), 0) if g.needs(0) else None, None]


@grad_rule("Ctc", domain=GC)
def ctc(g, op):
    lp = g.x(0)
    return [_gc(g, "CtcGrad", [g.y(1), g.x(3), g.gy(0)], shape=g.shape(lp), dtype=g.dtype(lp),
                attrs={"reduction": int(op.attrs.get("reduction", 1))}), None, None, None]


@grad_rule("ReduceMedian", domain=GC)
def reduce_median(g, op):
    attrs = {"keepdims": int(op.attrs.get("keepdims", 1)), "input_shape": g.shape(g.x(0))}
    if op.attrs.get("axes") is not None:
        attrs["axes"] = list(op.attrs["axes"])
    return [_gc(g, "ReduceMedianGrad", [g.gy(0), g.y(1)], shape=g.shape(g.x(0)), attrs=attrs)]


@grad_rule("GroupNormalization", domain=GC)
def group_norm(g, op):
    x, scale, bias = g.x(0), g.x(1), g.x(2)
    gy = g.gy(0)
    if gy is None:          # only the statistics reach the loss: PopART ignores their gradients
        return [None, None, None]
    dt = g.dtype(x)
    outs = [(f"GroupNormalizationGrad:{g.tag}", dt, g.shape(x)), (f"GroupNormalizationGrad:{g.tag}/scale", dt,
                                                                    g.shape(scale)),
            (f"GroupNormalizationGrad:{g.tag}/bias", dt, g.shape(bias))]
    gop = g.ir.add_op("GroupNormalizationGrad", [gy, x, scale, g.y(1), g.y(2)], outs,
                      g.fwd_attrs(), domain=GC, opset=1, name=f"GroupNormalizationGrad/{g.tag}", like=op)
    gop.grad_of = op
    return list(gop.outputs)


@grad_rule("Sort", domain=GC)
def sort(g, op):
    if g.gy(0) is None:
        return [None]
    return [_gc(g, "SortGrad", [g.gy(0), g.y(1)], attrs={"axis": int(op.attrs.get("axis", -1))})]


@grad_rule("Dropout", domain=GC)
def dropout(g, op):
    attrs = {"ratio": float(op.attrs.get("ratio", 0.5)), "seedModifier": int(op.attrs.get("seedModifier", 0))}
    return [_gc(g, "DropoutGrad", [g.gy(0), g.x(1)], attrs=attrs), None]


@grad_rule("ShapedDropout", domain=GC)
def shaped_dropout(g, op):
    if len(op.inputs) < 2 or not op.inputs[1]:
        return [g.gy()]
    return [_gc(g, "ShapedDropout", [g.gy(), g.x(1)], attrs=g.fwd_attrs()), None]


def _dyn(op):
    return {"axes": list(op.attrs.get("axes", [])), "sizes": list(op.attrs.get("sizes", []))}


def _dyn_slice(g, op, t):
    x = g.x(2)
    return _gc(g, "DynamicSlice", [t, g.x(1)], shape=g.shape(x), attrs=_dyn(op))


@grad_rule("DynamicSlice", domain=GC)
def dynamic_slice(g, op):
    return [_gc(g, "DynamicSlicePadGrad", [g.gy(), g.x(1)], shape=g.shape(g.x(0)),
                attrs={**_dyn(op), "input_shape": g.shape(g.x(0))}), None]


@grad_rule("DynamicUpdate", domain=GC)
def dynamic_update(g, op):
    gy = g.gy()
    gt = _gc(g, "DynamicZero", [gy, g.x(1)], attrs=_dyn(op)) if g.needs(0) else None
    gs = _dyn_slice(g, op, gy) if g.needs(2) else None
    return [gt, None, gs]


@grad_rule("DynamicZero", domain=GC)
def dynamic_zero(g, op):
    return [_gc(g, "DynamicZero", [g.gy(), g.x(1)], attrs=_dyn(op)), None]


@grad_rule("DynamicAdd", domain=GC)
def dynamic_add(g, op):
    gy = g.gy()
    return [gy if g.needs(0) else None, None, _dyn_slice(g, op, gy) if g.needs(2) else None]


@grad_rule("SequenceSlice", domain=GC)
def sequence_slice(g, op):
    gy = g.gy()
    rest = [g.x(2), g.x(3), g.x(4)]
    zu = int(op.attrs.get("zeroUnused", 0))
    gs = _gc(g, "SequenceSliceGrad", [gy] + rest, shape=g.shape(g.x(0)),
             attrs={"input": "source", "input_shape": g.shape(g.x(0)), "zeroUnused": zu}) if g.needs(0) else None
    gd = _gc(g, "SequenceSliceGrad", [gy] + rest, attrs={"input": "destination", "zeroUnused": zu}) \
        if g.needs(1) else None
    return [gs, gd, None, None, None]


@grad_rule("ScatterReduce", domain=GC)
def scatter_reduce(g, op):
    ins = [g.gy()] + [x for x in op.inputs]
    out = [None] * len(op.inputs)
    for i in (0, 2):
        if i < len(op.inputs) and g.needs(i):
            out[i] = _gc(g, "ScatterReduceGrad", ins, shape=g.shape(g.x(i)), dtype=g.dtype(g.x(i)),
                         attrs=g.fwd_attrs(wrt=i))
    return out


@grad_rule("GroupedGather", domain=GC)
def grouped_gather(g, op):
    return [_gc(g, "GroupedGatherGrad", [g.gy(), g.x(1)], shape=g.shape(g.x(0)),
                attrs={"axis": int(op.attrs.get("axis", 0)), "data_shape": g.shape(g.x(0))}), None]


@grad_rule("DepthToSpace", domain=GC)
def depth_to_space(g, op):
    return [_gc(g, "DepthToSpaceGrad", [g.gy()], shape=g.shape(g.x(0)),
                attrs=g.fwd_attrs(input_shape=g.shape(g.x(0))))]


@grad_rule("BatchNormalization", domain=GC)
def batch_norm(g, op):
    """PopART's ``BatchNormGradOp`` for the ai.graphcore BatchNormalization: one
    ``BatchNormalizationGrad`` (x, scale, B) of the batch statistics, recomputed from ``x`` (the
    exact gradient of the normalisation; the op's saved variance is the unbiased one, which is
    not the normaliser). ``spatial=0``: through ``x`` viewed as ``[N, C*D1*..., 1]``. An op with
    one output (inference mode) raises PopART's error: detach it to train around it."""
    if len(op.outputs) != 5:
        raise popart_exception(
            f"BatchNorm Op \"{op.name}\" has {len(op.outputs)} output(s) which means it is in inference mode, but "
            "its gradient Op is being created. To use the BatchNorm Op in inference mode during training, it has "
            "to be detached first.")
    gy = g.gy(0)
    if gy is None:              # only the statistics reach the loss: PopART ignores their gradients
        return [None] * len(op.inputs)
    x, scale, bias = g.x(0), g.x(1), g.x(2)
    xs, ps = g.shape(x), g.shape(scale)
    spatial = bool(op.attrs.get("spatial", 1))
    if not spatial:
        f = 1
        for d in xs[1:]:
            f *= d
        x, gy = g.reshape(x, [xs[0], f, 1]), g.reshape(gy, [xs[0], f, 1])
        scale = g.reshape(scale, [f])
    vs = g.shape(scale)
    outs = [(g.shape(x), g.dtype(x)), (vs, g.dtype(g.x(1))), (vs, g.dtype(g.x(1)))]
    attrs = g.fwd_attrs(fwd_opset=op.opset, bias_shape=vs)
    dx, ds, db = g.add_n("BatchNormalizationGrad", [x, scale, "", "", gy], outs, attrs)
    if not spatial:
        dx, ds, db = g.reshape(dx, xs), g.reshape(ds, ps), g.reshape(db, g.shape(bias))
    return [dx if g.needs(0) else None, ds if g.needs(1) else None, db if g.needs(2) else None, None, None]


@grad_rule("LSTM", domain=GC)
def popart_lstm(g, op):
    """PopART's ``PopartLSTMGrad`` (X, weights, biases, initialState; not seq_lens): the
    generic vector-Jacobian product of the forward kernel, one per output a gradient reaches
    (the output, the cell state), summed."""
    outs = [k for k, o in enumerate(op.outputs) if o and g.gy(k) is not None]
    grads = []
    for i in range(len(op.inputs)):
        if not g.needs(i) or i == 4 or not outs or not op.inputs[i]:
            grads.append(None)
            continue
        parts = [g.vjp(i, k, op_type="PopartLSTMGrad") for k in outs]
        grads.append(parts[0] if len(parts) == 1 else g.add("Sum", parts))
    return grads
