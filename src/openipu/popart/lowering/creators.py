"""Weights created by their consumer (PopART's "unwinding": an initializer gets the layout of the
op that reads it first, through that op's PopLibs creator).

:func:`weight_creator` answers, for a Const or Variable, the function that creates it on its
virtual graph, or None when it is created linearly mapped. The creators:

- a Gather's table: :func:`.gather.create_sliceable` (``popops::createSliceableTensor``);
- a MatMul's right operand (2-D): ``poplin::createMatMulInputRHS``;
- a Conv's weights: ``poplin::createWeights``.

Both poplin creators store each work block contiguously (as Poplar does), so the partial-sum
tiles read a block, or a tile's share of it, as one interval.
"""

from __future__ import annotations

import math

import numpy as np

from openipu.poplibs import poplin
from openipu.popart.lowering import conv as conv_lowering
from openipu.popart.lowering import gather as gather_lowering
from openipu.popart.lowering import matmul as matmul_lowering
from openipu.popart.lowering import precise_lowering


def _first_consumer(ir, tid: str, vg: int):
    """``(op, input index)`` of the op that reads weight ``tid`` first, if it reads it once and
    lives on virtual graph ``vg``; else None."""
    it = ir.tensors.get(tid)
    if it is None or it.producer is not None or it.kind not in ("Const", "Variable") or not it.consumers:
        return None
    op = it.consumers[0]
    idx = [i for i, x in enumerate(op.inputs) if x == tid]
    if op.domain or len(idx) != 1 or (op.vgraph if op.vgraph is not None else 0) != vg:
        return None
    return op, idx[0]


def weight_creator(ctx, tid: str, vg: int):
    """A function ``(graph, ptype, value) -> Tensor`` creating weight ``tid`` (``value``: its
    value for a Const, None for a Variable) in its first consumer's layout, or None."""
    ir = ctx.ir
    found = _first_consumer(ir, tid, vg)
    if found is None:
        return None
    op, i = found
    shape = list(ir.tensors[tid].info.shape())
    if op.op_type == "Gather" and i == 0:
        axis = gather_lowering.sliceable_axis(ir, tid, vg)
        if axis is None:
            return None
        return lambda g, ptype, value: gather_lowering.create_sliceable(g, ptype, shape, axis, tid, value)
    if op.op_type == "MatMul" and i == 1 and len(shape) == 2 and precise_lowering(op, ir) is matmul_lowering.matmul:
        a = list(ir.tensors[op.inputs[0]].info.shape())
        m = math.prod(a[:-1]) if len(a) > 1 else 1
        opts = matmul_lowering._options(ctx, op)
        return lambda g, ptype, value: poplin.create_matmul_input_rhs(g, ptype, [m, shape[0]], shape, tid, opts,
                                                                      value=value)
    if op.op_type == "Conv" and i == 1 and precise_lowering(op, ir) is conv_lowering.conv:
        opts = conv_lowering._options(ctx, op)

        def create(g, ptype, value):
            p = conv_lowering._params(op, ir, ptype)
            w = poplin.create_weights(g, p, tid, opts, value=None if value is None else np.asarray(value))
            return w.reshape(shape)
        return create
    return None
