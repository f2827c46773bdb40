"""Weights created by their consumer (PopART's "unwinding": an initializer gets the layout of the
op that reads it first, through that op's PopLibs creator).

:func:`weight_creator` answers, for a Const or Variable, the function that creates it on its
virtual graph, or None when it is created linearly mapped. The creators:

- a Gather's table: :func:`.gather.create_sliceable` (``popops::createSliceableTensor``);
- a MatMul's right operand (2-D): ``poplin::createMatMulInputRHS``;
- a Conv's weights: ``poplin::createWeights``;
- an accumulator (optimizer state first updated in place by ``Accumulate`` / ``SGD1Accumulate``
  from a gradient of its shape: SGD's velocity, Adam's and the adaptive optimizers' moments,
  the gradient accumulators): a clone of that gradient's layout, made when the gradient exists
  (:func:`updater_clone`), as PopART's ``AccumulateBaseOpx`` / ``SGD1AccumulateOpx`` create it;
- other optimizer state ``<prefix>___<weight>`` of the weight's shape (SGD2's velocity): a clone
  of its weight's layout (openipu's choice; PopART's creator is not modelled).

A linearly mapped state was exchanged element by element with its weight and gradient at every
update (megabytes of exchange code per tile on BERT-base).
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


#: Ops that update an accumulator in place from an updater (input 1), and create it from the
#: updater's layout in PopART (``AccumulateBaseOpx::createInputTensor``, ``SGD1AccumulateOpx``).
ACCUMULATORS = ("Accumulate", "SGD1Accumulate")


def updater_clone(ctx, tid: str, vg: int):
    """For an accumulator ``tid`` (a Variable first read by an ``ai.graphcore`` op of
    :data:`ACCUMULATORS` as the tensor it updates, from an updater of the same shape that an op
    makes): a function ``(graph, ptype) -> Tensor`` making it as a clone of the updater's layout,
    to call once the updater is lowered (PopART's ``mustExistBeforeCreate``); else None."""
    ir = ctx.ir
    t = ir.tensors.get(tid)
    if t is None or t.kind != "Variable" or not t.consumers:
        return None
    op = t.consumers[0]
    if not op.domain or op.op_type not in ACCUMULATORS or len(op.inputs) < 2 or op.inputs[0] != tid:
        return None
    upd = ir.tensors.get(op.inputs[1])
    if upd is None or upd.producer is None or list(upd.info.shape()) != list(t.info.shape()):
        return None
    return lambda g, ptype: g.clone(ptype, ctx.get(op.inputs[1], vg), tid)


def _state_of(ctx, tid: str, vg: int):
    """The device tensor of the weight whose optimizer state ``tid`` is (``<prefix>___<weight>``,
    same shape, first read by an ``ai.graphcore`` op), when that weight is already created on
    ``vg``; else None."""
    ir = ctx.ir
    t = ir.tensors.get(tid)
    prefix, sep, w = tid.partition("___")
    if not sep or not prefix or t is None or t.kind != "Variable" or not t.consumers or not t.consumers[0].domain:
        return None
    wt = ir.tensors.get(w)
    if wt is None or w not in ir.weight_grads or list(wt.info.shape()) != list(t.info.shape()):
        return None
    if not ctx.has(w) or ctx.home_vgraph(w) != vg:
        return None
    return ctx.get(w, vg)


def weight_creator(ctx, tid: str, vg: int):
    """A function ``(graph, ptype, value) -> Tensor`` creating weight ``tid`` (``value``: its
    value for a Const, None for a Variable) in its first consumer's layout (optimizer state that
    is not an accumulator: its weight's layout), or None."""
    ir = ctx.ir
    weight = _state_of(ctx, tid, vg)
    if weight is not None:
        return lambda g, ptype, value: g.clone(ptype, weight, tid)
    found = _first_consumer(ir, tid, vg)
    if found is None:
        return None
    op, i = found
    shape = list(ir.tensors[tid].info.shape())
    if op.op_type == "Gather" and i == 0:
        axis = gather_lowering.sliceable_axis(ir, tid, vg)
        if axis is None:
            return None
        n = gather_lowering.lookups(ir, tid)
        return lambda g, ptype, value: gather_lowering.create_sliceable(g, ptype, shape, axis, tid, value, n)
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
