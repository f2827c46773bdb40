"""ONNX Softmax and LogSoftmax through ``popnn`` (PopART's ``SoftmaxOpx`` / ``LogSoftmaxOpx``).

popnn's softmax works over the innermost dimension. Opset < 13 coerces the input to 2-D at
``axis`` (default 1): a reshape view ``[prod(shape[:axis]), prod(shape[axis:])]``. Opset >= 13
normalises along ``axis`` (default -1): the axis is moved innermost with a ``dimShuffle`` view,
and the result shuffled back. Softmax uses ``SOFTMAX_STABLE`` (max-subtracted) unless the session
option ``enableNonStableSoftmax`` is set (PopART's rule); LogSoftmax uses ``popnn.logSoftmax``.
The result is written over the input when it may be overwritten (PopART's ``SoftmaxInplace``;
see :meth:`LoweringContext.in_place_input`). Float and half only; scalars use the generic lowering.
"""

from __future__ import annotations

import math

from openipu.poplibs import popnn
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import all_float, graph, name, shape
from openipu.popart.onnx_ops._common import norm_axis


def _axis(op, ir):
    r = len(shape(ir, op.inputs[0]))
    try:
        return norm_axis(op.attrs.get("axis", 1 if op.opset < 13 else -1), r, op.op_type)
    except Exception:
        return None


def _accepts(op, ir):
    if len(op.inputs) != 1 or not op.inputs[0] or not all_float(ir, op):
        return False
    xs = shape(ir, op.inputs[0])
    return len(xs) >= 1 and math.prod(xs) > 0 and _axis(op, ir) is not None


@lowering("Softmax", "LogSoftmax", accepts=_accepts)
def softmax(ctx, op):
    g = graph(ctx, op)
    x = ctx.input(op, 0)
    xs = x.shape()
    r = len(xs)
    axis = _axis(op, ctx.ir)
    in_place = ctx.in_place_input(op) is not None
    if op.op_type == "Softmax":
        nl = "SOFTMAX" if getattr(ctx.options, "enableNonStableSoftmax", False) else "SOFTMAX_STABLE"

        def fn(t):
            if not in_place:
                return popnn.nonLinearity(g, nl, t, ctx.prog, name(op))
            popnn.nonLinearityInPlace(g, nl, t, ctx.prog, name(op))
            return t
    else:
        def fn(t):
            if not in_place:
                return popnn.logSoftmax(g, t, ctx.prog, name(op))
            popnn.logSoftmaxInPlace(g, t, ctx.prog, name(op))
            return t
    if op.opset < 13:
        return [fn(x.reshape([math.prod(xs[:axis]), math.prod(xs[axis:])])).reshape(xs)]
    if axis == r - 1:
        return [fn(x)]
    perm = [d for d in range(r) if d != axis] + [axis]
    inv = [perm.index(d) for d in range(r)]
    return [fn(x.dimShuffle(perm)).dimShuffle(inv)]
