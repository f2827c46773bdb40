"""ONNX reductions through ``popops.reduce`` (PopART's ``ReduceSumOpx``, ``ReduceMeanOpx`` ...).

ReduceSum / ReduceMean (``ADD``, Mean with ``scale = 1 / n``), ReduceMax / ReduceMin (``MAX`` /
``MIN``), ReduceProd (``MUL``), ReduceSumSquare (``SQUARE_ADD``), ReduceL2 (``SQUARE_ADD`` then a
``popops.map`` ``SQRT``), ReduceL1 (``popops.map`` ``ABSOLUTE`` then ``ADD``), ReduceLogSum
(``ADD`` then ``LOGARITHM``), ReduceLogSumExp (``LOG_ADD``). Half inputs accumulate in float
(popops' default inter-tile accumulation type) and round once. The result is reshaped to the
IR's output shape (``keepdims``).

Declined (generic lowering): axes given as a non-constant input, empty axes with
``noop_with_empty_axes`` or as an empty attribute (PopART: no axis reduced), reduced dimensions
of size 0, scalars, non-float types.
"""

from __future__ import annotations

import math

import numpy as np

from openipu.poplibs import popops
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import all_float, const_value, graph, name, shape
from openipu.popart.onnx_ops._common import norm_axes
from openipu.popart.onnx_ops.reduce import attribute_axes_empty

_OPERATION = {"ReduceSum": "ADD", "ReduceMean": "ADD", "ReduceMax": "MAX", "ReduceMin": "MIN",
              "ReduceProd": "MUL", "ReduceSumSquare": "SQUARE_ADD", "ReduceL2": "SQUARE_ADD", "ReduceL1": "ADD",
              "ReduceLogSum": "ADD", "ReduceLogSumExp": "LOG_ADD"}
_AXES_INPUT_FROM = {"ReduceSum": 13}


def _axes(op, ir):
    """Sorted reduced axes, or None when the lowering cannot take the op."""
    xs = shape(ir, op.inputs[0])
    if op.opset >= _AXES_INPUT_FROM.get(op.op_type, 18):
        a = op.inputs[1] if len(op.inputs) > 1 else ""
        if a:
            v = const_value(ir, a)
            if v is None:
                return None
            axes = [int(i) for i in np.asarray(v).reshape(-1)]
        else:
            axes = []
    else:
        if attribute_axes_empty(op.op_type, op.attrs, op.opset):     # PopART: no axis reduced
            return None
        axes = [int(i) for i in (op.attrs.get("axes") or [])]
    if not axes:
        if op.attrs.get("noop_with_empty_axes", 0):
            return None
        axes = list(range(len(xs)))
    try:
        axes = sorted(set(norm_axes(axes, len(xs), op.op_type)))
    except Exception:
        return None
    if any(xs[a] == 0 for a in axes) or math.prod(xs) == 0:
        return None
    return axes


def _accepts(op, ir):
    if not op.inputs or not op.inputs[0] or not all_float(ir, op, [0]):
        return False
    return len(shape(ir, op.inputs[0])) >= 1 and _axes(op, ir) is not None


@lowering(*_OPERATION, accepts=_accepts)
def reduce(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    x = ctx.input(op, 0)
    axes = _axes(op, ctx.ir)
    t = op.op_type
    if t == "ReduceL1":
        x = popops.map(g, popops.UnaryOpType.ABSOLUTE, x, ctx.prog, f"{nm}/abs")
    scale = None
    if t == "ReduceMean":
        scale = 1.0 / math.prod(x.shape()[a] for a in axes)
    params = popops.ReduceParams(_OPERATION[t], False, scale)
    y = popops.reduce(g, x, axes, params, ctx.prog, f"{nm}/reduce")
    if t == "ReduceL2":
        y = popops.map(g, popops.UnaryOpType.SQRT, y, ctx.prog, f"{nm}/sqrt")
    elif t == "ReduceLogSum":
        y = popops.map(g, popops.UnaryOpType.LOGARITHM, y, ctx.prog, f"{nm}/log")
    return [y.reshape(shape(ctx.ir, op.outputs[0]))]
