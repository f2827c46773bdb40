"""Gradients of ReduceSum / ReduceMean: the output gradient broadcast back (``Expand``) over the
reduced dimensions, divided by their size for the mean."""

from __future__ import annotations

import math

from openipu.popart.grads import grad_rule


def _axes(g, op):
    r = len(g.shape(g.x(0)))
    if op.op_type == "ReduceSum" and op.opset >= 13 or op.opset >= 18:
        v = g.const_value(op.inputs[1]) if len(op.inputs) > 1 and op.inputs[1] else None
        if v is None:
            if len(op.inputs) > 1 and op.inputs[1]:
                return None
            return [] if op.attrs.get("noop_with_empty_axes", 0) else list(range(r))
        axes = v.tolist()
    else:
        axes = list(op.attrs.get("axes", range(r)))
    return sorted(a % r for a in axes) if axes else list(range(r))


@grad_rule("ReduceSum", "ReduceMean")
def reduce_(g, op):
    xs = g.shape(g.x(0))
    axes = _axes(g, op)
    if axes is None:
        return [None] * len(op.inputs)
    gy = g.reshape(g.gy(), [1 if d in axes else n for d, n in enumerate(xs)])
    if op.op_type == "ReduceMean":
        gy = g.scale(gy, 1.0 / max(1, math.prod(xs[d] for d in axes)))
    return [g.expand(gy, xs)] + [None] * (len(op.inputs) - 1)
