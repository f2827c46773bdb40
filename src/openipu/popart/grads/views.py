"""Gradients of the view ops: the output gradient viewed back (Reshape to the input's shape,
the inverse permutation), split for Concat, padded back for Slice."""

from __future__ import annotations

import numpy as np

from openipu.popart.grads import GRAPHCORE, grad_rule


@grad_rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def reshape(g, op):
    return [g.reshape(g.gy(), g.shape(g.x(0)))] + [None] * (len(op.inputs) - 1)


@grad_rule("Reshape", domain=GRAPHCORE)
def reshape_gc(g, op):
    return [g.reshape(g.gy(), g.shape(g.x(0)))]


@grad_rule("Transpose")
def transpose(g, op):
    r = len(g.shape(g.x(0)))
    perm = list(op.attrs.get("perm", list(range(r))[::-1]))
    return [g.transpose(g.gy(), list(np.argsort(perm)))]


@grad_rule("Concat")
def concat(g, op):
    gy = g.gy()
    axis = int(op.attrs["axis"]) % len(g.shape(gy))
    out, start = [], 0
    for i, x in enumerate(op.inputs):
        n = g.shape(x)[axis]
        if g.needs(i):
            shape = g.shape(gy)
            shape[axis] = n
            out.append(g.add("Slice", [gy], shape=shape, domain=GRAPHCORE,
                             attrs={"starts": [start], "ends": [start + n], "axes": [axis]}))
        else:
            out.append(None)
        start += n
    return out


@grad_rule("Slice")
def slice_(g, op):
    """The output gradient placed back into zeros of the input's shape (a ``Pad``)."""
    x, gy = g.x(0), g.gy()
    xs = g.shape(x)
    if op.opset >= 10:
        vals = [g.const_value(t) for t in op.inputs[1:]]
        if any(v is None for v in vals[:2]) or any(v is None for v, t in zip(vals[2:], op.inputs[3:]) if t):
            return [None] * len(op.inputs)
        starts, ends = vals[0].tolist(), vals[1].tolist()
        axes = vals[2].tolist() if len(vals) > 2 and vals[2] is not None else list(range(len(starts)))
        steps = vals[3].tolist() if len(vals) > 3 and vals[3] is not None else [1] * len(starts)
    else:
        starts, ends = list(op.attrs["starts"]), list(op.attrs["ends"])
        axes = list(op.attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    if any(s != 1 for s in steps):
        return [None] * len(op.inputs)
    pads = [0] * (2 * len(xs))
    for s, e, a in zip(starts, ends, axes):
        a %= len(xs)
        n = xs[a]
        s = min(max(s + n if s < 0 else s, 0), n)
        e = min(max(e + n if e < 0 else e, 0), n)
        pads[a], pads[len(xs) + a] = s, n - max(e, s)
    gx = g.add("Pad", [gy, g.int64s(pads, "pads")], shape=xs, opset=11)
    return [gx] + [None] * (len(op.inputs) - 1)
