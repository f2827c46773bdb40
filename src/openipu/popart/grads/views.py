"""Gradients of the view and data-movement ops: the output gradient viewed back (Reshape to the
input's shape, the inverse permutation), split for Concat, padded back for Slice, and:

- Expand: summed over the broadcast dimensions (PopART's ``ExpandGrad``: ReduceSum); Tile: the
  gradient viewed as ``[repeats, size]`` pairs and summed over the repeats (``TileGrad``);
- Split: the output gradients concatenated (zeros for outputs no gradient reaches;
  PopART's ``SplitGradOpToConcat`` pattern);
- Pad (constant mode, constant non-negative pads): the ``ai.graphcore`` Slice of the gradient
  (PopART's ``PadGrad``); other modes and pads: the generic ``PadGrad`` (vjp);
- DepthToSpace (DCR) / SpaceToDepth: the inverse rearrangement; Trilu, ReverseSequence: the
  same op on the gradient;
- Slice with steps, or bounds computed on the device (``SliceStepsGrad``), Resize, Upsample,
  CenterCropPad, DepthToSpace (CRD, ``DepthToSpaceCrdGrad``): the generic ``<Op>Grad`` ops (vjp
  of the forward kernel; PopART's ``SliceGrad``, ``ResizeGrad``).

The ``ai.graphcore`` view ops (Reshape, Reverse, Slice, Subsample) are in :mod:`.graphcore`.
"""

from __future__ import annotations

import numpy as np

from openipu.popart.grads import GRAPHCORE, grad_rule


@grad_rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def reshape(g, op):
    return [g.reshape(g.gy(), g.shape(g.x(0)))] + [None] * (len(op.inputs) - 1)


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
            return [g.vjp(0, op_type="SliceStepsGrad")] + [None] * (len(op.inputs) - 1)
        starts, ends = vals[0].tolist(), vals[1].tolist()
        axes = vals[2].tolist() if len(vals) > 2 and vals[2] is not None else list(range(len(starts)))
        steps = vals[3].tolist() if len(vals) > 3 and vals[3] is not None else [1] * len(starts)
    else:
        starts, ends = list(op.attrs["starts"]), list(op.attrs["ends"])
        axes = list(op.attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    if any(s != 1 for s in steps):
        return [g.vjp(0, op_type="SliceStepsGrad")] + [None] * (len(op.inputs) - 1)
    pads = [0] * (2 * len(xs))
    for s, e, a in zip(starts, ends, axes):
        a %= len(xs)
        n = xs[a]
        s = min(max(s + n if s < 0 else s, 0), n)
        e = min(max(e + n if e < 0 else e, 0), n)
        pads[a], pads[len(xs) + a] = s, n - max(e, s)
    gx = g.add("Pad", [gy, g.int64s(pads, "pads")], shape=xs, opset=11)
    return [gx] + [None] * (len(op.inputs) - 1)


@grad_rule("Expand")
def expand(g, op):
    return [g.unbroadcast(g.gy(), g.shape(g.x(0))), None]


@grad_rule("Tile")
def tile(g, op):
    xs, gy = g.shape(g.x(0)), g.gy()
    reps = [n // x if x else 1 for n, x in zip(g.shape(gy), xs)]      # from the (static) shapes
    pairs = [v for r, x in zip(reps, xs) for v in (r, x)]
    t = g.reduce_sum(g.reshape(gy, pairs), range(0, 2 * len(xs), 2), keepdims=False)
    return [g.reshape(t, xs)] + [None] * (len(op.inputs) - 1)


@grad_rule("Split")
def split(g, op):
    x = g.x(0)
    axis = int(op.attrs.get("axis", 0)) % len(g.shape(x))
    parts = [g.gy(k) if g.gy(k) is not None else g.zeros(g.shape(y), x) for k, y in enumerate(op.outputs) if y]
    gx = g.add("Concat", parts, shape=g.shape(x), attrs={"axis": axis}, opset=13) if len(parts) > 1 else parts[0]
    return [gx] + [None] * (len(op.inputs) - 1)


def _const_pads(g, op):
    """``(pads, axes)`` of a constant-mode Pad with constant pads, else None."""
    if op.attrs.get("mode", "constant") != "constant":
        return None
    r = len(g.shape(g.x(0)))
    if op.opset < 11:
        return list(op.attrs.get("pads", op.attrs.get("paddings", []))), list(range(r))
    pads = g.const_value(op.inputs[1])
    axes = list(range(r))
    if len(op.inputs) > 3 and op.inputs[3]:
        a = g.const_value(op.inputs[3])
        if a is None:
            return None
        axes = [int(v) % r for v in a.reshape(-1)]
    return (None if pads is None else [int(v) for v in pads.reshape(-1)]), axes


@grad_rule("Pad")
def pad(g, op):
    x = g.x(0)
    cp = _const_pads(g, op)
    rest = [None] * (len(op.inputs) - 1)
    if cp is None or cp[0] is None or any(p < 0 for p in cp[0]):
        return [g.vjp(0)] + rest
    pads, axes = cp
    n = len(axes)
    xs = g.shape(x)
    starts = [pads[j] for j in range(n)]
    ends = [pads[j] + xs[a] for j, a in enumerate(axes)]
    gx = g.add("Slice", [g.gy()], shape=xs, domain=GRAPHCORE, attrs={"starts": starts, "ends": ends, "axes": axes})
    return [gx] + rest


@grad_rule("DepthToSpace", "SpaceToDepth")
def depth_space(g, op):
    if op.op_type == "DepthToSpace" and op.attrs.get("mode", "DCR") != "DCR":
        return [g.vjp(0, op_type="DepthToSpaceCrdGrad")]
    inv = "SpaceToDepth" if op.op_type == "DepthToSpace" else "DepthToSpace"
    return [g.add(inv, [g.gy()], shape=g.shape(g.x(0)), attrs={"blocksize": int(op.attrs["blocksize"])},
                  opset=op.opset)]


@grad_rule("Trilu", "ReverseSequence")
def same_op(g, op):
    """Trilu and ReverseSequence are their own adjoints: the op on the gradient."""
    return [g.add(op.op_type, [g.gy()] + list(op.inputs[1:]), attrs=g.fwd_attrs(), opset=op.opset)] + \
        [None] * (len(op.inputs) - 1)


@grad_rule("Resize", "Upsample", "CenterCropPad", "AffineGrid")
def generic_view(g, op):
    return [g.vjp(0)] + [None] * (len(op.inputs) - 1)
