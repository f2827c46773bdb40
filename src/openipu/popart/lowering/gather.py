"""ONNX Gather through ``popops.multiSlice`` (PopART's ``GatherOpx``; on axis 0 of a 2-D table it
is the embedding lookup).

``data`` is sliced along ``axis`` at the ``numel(indices)`` offsets (``sizes = [1]``); the result
``[N, *data.shape with axis -> 1]`` is viewed back as ``data.shape[:axis] + indices.shape +
data.shape[axis+1:]`` (reshape and ``dimShuffle`` views, no copies). Negative indices count from
the end as in ONNX: a constant index tensor is checked on the host; a run-time one goes through
one ``popops.map`` ``Select(i + D, i, i < 0)`` first.

Layout (PopART creates a Gather's weight input with ``popops::createSliceableTensor``, its
"unwinding" of the input layout): when ``data`` is a model weight (constant or variable) and this
op is its first consumer, the session creates the weight with :func:`create_sliceable` (see
:mod:`.program`): each column (the elements that differ only in ``axis``) sits on one tile, the
columns spread linearly over the tiles — the layout ``createSliceableTensor`` gives — and the
variable is stored column by column, so that its tile map is one run per tile (a view of the
weight's shape is returned). A table with fewer columns than tiles (BERT's 30522 x 768 word
embedding on 1,472 tiles) has its rows split too, as PopLibs' embedding plan splits the sliced
dimension, so that it fills the tiles evenly; ``multiSlice`` then looks up in two stages.
Without it the linearly mapped table would be exchanged whole to the tiles holding its first row.

Declined (generic lowering): empty tensors, index types other than int32/int64, constant indices
out of range, value types other than float, half and int32.

GatherGrad (the gradient of the data, ``ai.graphcore``): ``popops.multiUpdateAdd`` into zeros laid
out like the sliceable table, so that the table's update reads its gradient on the tile (the
generic op's linear output made BERT-base's word-embedding update exchange every element).
"""

from __future__ import annotations

import math

import numpy as np

from openipu.poplibs import popops
from openipu.poplibs.popops import expr as E
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import FLOATS, const_value, dtype, graph, name, shape
from openipu.popart.onnx_ops._common import norm_axis


def _axis(op, ir):
    try:
        return norm_axis(op.attrs.get("axis", 0), len(shape(ir, op.inputs[0])), "Gather")
    except Exception:
        return None


def _accepts(op, ir):
    if len(op.inputs) != 2 or not all(op.inputs):
        return False
    data, idx = op.inputs
    if dtype(ir, data) not in FLOATS + ("INT32",) or dtype(ir, op.outputs[0]) != dtype(ir, data):
        return False
    if dtype(ir, idx) not in ("INT32", "INT64"):
        return False
    xs, axis = shape(ir, data), _axis(op, ir)
    if axis is None or math.prod(xs) == 0 or math.prod(shape(ir, idx)) == 0:
        return False
    v = const_value(ir, idx)
    if v is not None:
        v = np.asarray(v)
        if ((v < -xs[axis]) | (v >= xs[axis])).any():
            return False
    return True


def sliceable_axis(ir, tid: str, vg: int):
    """The axis along which weight ``tid`` (a Const or Variable living on virtual graph ``vg``)
    is sliced when its first consumer is a Gather lowered here that reads it as ``data``: that op
    creates the weight (PopART's ``createSliceableTensor`` unwinding, :meth:`LoweringContext.owns_layout`).
    None otherwise."""
    from openipu.popart.lowering import precise_lowering
    it = ir.tensors.get(tid)
    if it is None or it.producer is not None or it.kind not in ("Const", "Variable") or not it.consumers:
        return None
    op = it.consumers[0]
    if op.op_type != "Gather" or op.domain or not op.inputs or op.inputs[0] != tid or tid in op.inputs[1:]:
        return None
    if (op.vgraph if op.vgraph is not None else 0) != vg or precise_lowering(op, ir) is not gather:
        return None
    return _axis(op, ir)


def lookups(ir, tid: str) -> int:
    """The number of offsets the first consumer of weight ``tid`` (a Gather, see
    :func:`sliceable_axis`) looks up: its indices' element count."""
    op = ir.tensors[tid].consumers[0]
    return math.prod(shape(ir, op.inputs[1]))


def create_sliceable(g, type_, shape, axis: int, name: str, value=None, lookups: int = 0):
    """A weight of ``shape`` laid out for slicing along ``axis`` at ``lookups`` offsets
    (``createSliceableTensor`` with the op's embedding plan, as PopART's ``GatherOpx`` creates
    it): each *column* (the elements that differ only in ``axis``) on one tile, the columns
    spread linearly over the tiles (grain 1, at least 1 per tile). With fewer columns than tiles
    the rows are split as well where the plan says so (``popops.dynamic_slice.plan_row_split``).

    The variable is created with the columns outermost and ``axis`` innermost, so that every
    column, and every tile's run of columns, is contiguous: its tile map is one run per tile.
    Returns the ``dimShuffle`` view of ``shape``. ``value``: a constant's value (``shape``; the
    IR's array, transposed into the variable's order when the constant is first read), else a
    variable is created."""
    xs = [int(v) for v in shape]
    rest = [d for d in range(len(xs)) if d != axis]
    order = rest + [axis]
    vshape = [xs[d] for d in order]
    if value is not None:
        value = np.asarray(value)
        if value.size != math.prod(xs):
            raise ValueError(f"create_sliceable: a value of {value.size} elements for the shape {xs}")
        var = g.add_deferred_constant(type_, vshape, lambda: value.reshape(xs).transpose(order), name)
    else:
        var = g.addVariable(type_, vshape, name)
    popops.dynamic_slice.map_sliceable(g, var, xs[axis], math.prod(xs[d] for d in rest), type_, lookups)
    inv = [order.index(d) for d in range(len(xs))]
    return var.dimShuffle(inv)


@lowering("Gather", accepts=_accepts)
def gather(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    data, idx = ctx.input(op, 0), ctx.input(op, 1)
    axis = _axis(op, ctx.ir)
    xs = data.shape()
    n = idx.numElements()
    if const_value(ctx.ir, op.inputs[1]) is None or (np.asarray(const_value(ctx.ir, op.inputs[1])) < 0).any():
        # negative indices count from the end
        idx = popops.map(g, E.Select(E.Add(E._1, E.Const(int(xs[axis]))), E._1, E.Lt(E._1, E.Const(0))), [idx],
                         ctx.prog, f"{nm}/wrapIndices")
    offsets = idx.reshape([n, 1])
    out = popops.multiSlice(g, data, offsets, [axis], [1], ctx.prog, debug_name=nm)
    pre, post = list(xs[:axis]), list(xs[axis + 1:])
    out = out.reshape([n] + pre + post)
    if pre:
        out = out.dimShuffle(list(range(1, 1 + len(pre))) + [0] + list(range(1 + len(pre), 1 + len(pre) + len(post))))
    return [out.reshape(shape(ctx.ir, op.outputs[0]))]


def _accepts_grad(op, ir):
    if len(op.inputs) != 2 or not all(op.inputs) or "data_shape" not in op.attrs:
        return False
    xs = [int(d) for d in op.attrs["data_shape"]]
    if dtype(ir, op.inputs[0]) not in FLOATS or dtype(ir, op.inputs[1]) not in ("INT32", "INT64"):
        return False
    return math.prod(xs) > 0 and math.prod(shape(ir, op.inputs[1])) > 0 and -len(xs) <= int(op.attrs.get("axis", 0)) < len(xs)


@lowering("GatherGrad", domain="ai.graphcore", accepts=_accepts_grad)
def gather_grad(ctx, op):
    """The gradient of a Gather's data (PopART's ``GatherGradOpx``): zeros laid out like a
    sliceable table (:func:`create_sliceable`, the layout the forward Gather gives its weight, so
    the weight update stays on the tile), then ``popops.multiUpdateAdd`` of each slice of the
    output gradient at its index (repeated indices add up; negative ones count from the end)."""
    g = graph(ctx, op)
    nm = name(op)
    gy, idx = ctx.input(op, 0), ctx.input(op, 1)
    xs = [int(d) for d in op.attrs["data_shape"]]
    axis = int(op.attrs.get("axis", 0)) % len(xs)
    n = idx.numElements()
    out = create_sliceable(g, gy.elementType(), xs, axis, op.outputs[0], lookups=n)
    popops.zero(g, out, ctx.prog, f"{nm}/zero")
    if const_value(ctx.ir, op.inputs[1]) is None or (np.asarray(const_value(ctx.ir, op.inputs[1])) < 0).any():
        idx = popops.map(g, E.Select(E.Add(E._1, E.Const(int(xs[axis]))), E._1, E.Lt(E._1, E.Const(0))), [idx],
                         ctx.prog, f"{nm}/wrapIndices")
    pre, post = xs[:axis], xs[axis + 1:]
    s = gy.reshape(pre + [n] + post)
    if pre:           # the indexed dimension first: [n, *pre, *post]
        s = s.dimShuffle([len(pre)] + list(range(len(pre))) + list(range(len(pre) + 1, len(pre) + 1 + len(post))))
    s = s.reshape([n] + pre + [1] + post)
    popops.multiUpdateAdd(g, out, s, idx.reshape([n, 1]), 1.0, [axis], [1], ctx.prog, debug_name=nm)
    return [out]
