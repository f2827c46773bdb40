"""ONNX unary elementwise ops and activations through ``popnn.nonLinearity`` / ``popops.map``
(PopART's ``ElementWiseUnaryOpx`` family: ``ReluOpx``, ``SigmoidOpx``, ``GeluOpx``, ``CastOpx`` ...).

- Relu, Sigmoid, Tanh, Gelu (``approximate`` "none" -> GELU_ERF, "tanh" -> GELU): one
  ``popnn.nonLinearity`` compute set (float, half);
- Abs, Neg (also int32), Exp, Log, Sqrt, Floor, Ceil, Sin, Cos, Tan, Asin, Erf, Reciprocal, Sign,
  Round (round half to even: ``NEARBY_INT``, as PopART's ``NearbyInt``): one ``popops.map`` of
  the matching ``UnaryOpType`` (float, half);
- LeakyRelu: ``Select(x, alpha * x, x > 0)``; Clip (min/max as attributes or constant scalar
  inputs): ``Select(x, Min(Max(x, lo), hi), IsNaN(x))`` — NaN propagates as ONNX's Clip does;
  Where: ``Select(a, b, cond)`` (float, half, int32 values): one fused ``popops.map`` each;
- Cast from float, half, int32/int64 (int32 on the device) and bool to float, half or bool,
  and between the integer types: ``popops.cast`` (float to integer uses the generic lowering).

The ops write their result over their input when it may be overwritten (PopART's
``ReluInplace``, ``GeluInplace``, ``ExpInplace`` ...; Where over its X or Y input; see
:meth:`LoweringContext.in_place_input`): ``popnn.nonLinearityInPlace`` / ``popops.mapInPlace``.
Other types and attribute values use the generic lowering.
"""

from __future__ import annotations

import math

import numpy as np

from openipu.poplibs import popnn, popops
from openipu.poplibs.popops import expr as E
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import FLOATS, all_float, const_value, dtype, graph, name

U = popops.UnaryOpType

_NL = {"Relu": "RELU", "Sigmoid": "SIGMOID", "Tanh": "TANH"}
_MAP = {"Abs": U.ABSOLUTE, "Neg": U.NEGATE, "Exp": U.EXPONENT, "Log": U.LOGARITHM, "Sqrt": U.SQRT,
        "Floor": U.FLOOR, "Ceil": U.CEIL, "Sin": U.SIN, "Cos": U.COS, "Tan": U.TAN, "Asin": U.ASIN,
        "Erf": U.ERF, "Reciprocal": U.INVERSE, "Sign": U.SIGNUM, "Round": U.NEARBY_INT}
_INT_OK = {"Abs", "Neg"}


def _accepts_float(op, ir):
    return len(op.inputs) >= 1 and op.inputs[0] and all_float(ir, op, [0])


def _non_linearity(ctx, op, nl):
    x = ctx.input(op, 0)
    if ctx.in_place_input(op) is None:
        return [popnn.nonLinearity(graph(ctx, op), nl, x, ctx.prog, name(op))]
    popnn.nonLinearityInPlace(graph(ctx, op), nl, x, ctx.prog, name(op))
    return [x]


def _map(ctx, op, expr, ins, candidates=(0,)):
    """``expr(slots)`` over the op's inputs ``ins`` (``slots[j]``: the placeholder number of
    ``ins[j]``), written over the first of ``candidates`` that may be overwritten (that input goes
    first, as ``mapInPlace`` writes its first tensor), else into a new tensor."""
    tensors = [ctx.input(op, i) for i in ins]
    i = ctx.in_place_input(op, candidates)
    if i is None:
        return [popops.map(graph(ctx, op), expr(list(range(1, len(ins) + 1))), tensors, ctx.prog, name(op))]
    k = ins.index(i)
    order = [k] + [j for j in range(len(ins)) if j != k]
    slots = [order.index(j) + 1 for j in range(len(ins))]
    popops.mapInPlace(graph(ctx, op), expr(slots), [tensors[j] for j in order], ctx.prog, name(op))
    return [tensors[k]]


def _ph(slots, j):
    return E.PlaceHolder(slots[j])


@lowering(*_NL, accepts=_accepts_float)
def non_linearity(ctx, op):
    return _non_linearity(ctx, op, _NL[op.op_type])


def _accepts_gelu(op, ir):
    return _accepts_float(op, ir) and op.attrs.get("approximate", "none") in ("none", "tanh")


@lowering("Gelu", accepts=_accepts_gelu)
def gelu(ctx, op):
    return _non_linearity(ctx, op, "GELU" if op.attrs.get("approximate", "none") == "tanh" else "GELU_ERF")


def _accepts_map(op, ir):
    if len(op.inputs) != 1 or not op.inputs[0]:
        return False
    t, o = dtype(ir, op.inputs[0]), dtype(ir, op.outputs[0])
    return t == o and (t in FLOATS or (t == "INT32" and op.op_type in _INT_OK))


@lowering(*_MAP, accepts=_accepts_map)
def unary_map(ctx, op):
    kind = _MAP[op.op_type]
    return _map(ctx, op, lambda s: E.UnaryOp(kind, _ph(s, 0)), (0,))


@lowering("LeakyRelu", accepts=_accepts_float)
def leaky_relu(ctx, op):
    alpha = float(op.attrs.get("alpha", 0.01))
    e = E.Select(E._1, E.Mul(E._1, E.Const(alpha)), E.Gt(E._1, E.Const(0.0)))
    return _map(ctx, op, lambda s: e, (0,))


def _clip_bounds(op, ir):
    """(lo, hi) as Python floats (None: unbounded), or False when not constant scalars."""
    if op.opset < 11:
        return op.attrs.get("min"), op.attrs.get("max")
    out = []
    for i in (1, 2):
        x = op.inputs[i] if i < len(op.inputs) else ""
        if not x:
            out.append(None)
            continue
        v = const_value(ir, x)
        if v is None or np.asarray(v).size != 1:
            return False
        out.append(float(np.asarray(v).reshape(())))
    return tuple(out)


def _accepts_clip(op, ir):
    return _accepts_float(op, ir) and _clip_bounds(op, ir) is not False


@lowering("Clip", accepts=_accepts_clip)
def clip(ctx, op):
    lo, hi = _clip_bounds(op, ctx.ir)
    v = E._1
    if lo is not None and lo != -math.inf:
        v = E.Max(v, E.Const(float(lo)))
    if hi is not None and hi != math.inf:
        v = E.Min(v, E.Const(float(hi)))
    x = ctx.input(op, 0)
    if v is E._1:
        return [x]
    e = E.Select(E._1, v, E.IsNaN(E._1))
    return _map(ctx, op, lambda s: e, (0,))


def _accepts_where(op, ir):
    if len(op.inputs) != 3 or not all(op.inputs):
        return False
    c, a, b = (dtype(ir, x) for x in op.inputs)
    return c == "BOOL" and a == b == dtype(ir, op.outputs[0]) and a in FLOATS + ("INT32",)


@lowering("Where", accepts=_accepts_where)
def where(ctx, op):
    return _map(ctx, op, lambda s: E.Select(_ph(s, 0), _ph(s, 1), _ph(s, 2)), (1, 2, 0), (1, 2))


_CAST_FROM = FLOATS + ("INT32", "INT64", "BOOL")


def _accepts_cast(op, ir):
    if len(op.inputs) != 1 or not op.inputs[0]:
        return False
    a, b = dtype(ir, op.inputs[0]), dtype(ir, op.outputs[0])
    if a not in _CAST_FROM:
        return False
    # float -> int (truncation, out-of-range, NaN) stays with the kernel
    return b in FLOATS + ("BOOL",) or (a not in FLOATS and b in ("INT32", "INT64"))


@lowering("Cast", accepts=_accepts_cast)
def cast(ctx, op):
    x = ctx.input(op, 0)
    to = ctx.ptype(op.outputs[0])
    if x.elementType() == to:
        return [x]
    return [popops.cast(graph(ctx, op), x, to, ctx.prog, name(op))]
