"""ONNX ops that only re-view their input, lowered as Poplar tensor views (no compute, no copy):
PopART's in-place variants (``ReshapeInplaceOpx``, ``TransposeInplaceOpx``, ``ConcatInplaceOpx``,
``IdentityInplaceOpx`` ...) that its default inplacing pattern selects in inference graphs.

- Reshape, Flatten, Squeeze, Unsqueeze: ``reshape`` to the IR's output shape;
- Transpose: ``dimShuffle(perm)`` (default: reversed dims);
- Identity, and Dropout in inference (opset < 12 without ``is_test=0`` on opset 6, or opset >= 12
  with a constant false ``training_mode`` input / none): the input itself. A requested ``mask``
  output uses the generic lowering;
- Concat: ``poplar.concat`` of the inputs (all of one type).

The outputs alias their inputs; no lowering writes its inputs in place, so aliasing is safe.
"""

from __future__ import annotations

import numpy as np

from openipu import poplar
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import const_value, dtype, live_outputs, shape
from openipu.popart.onnx_ops._common import norm_axis


def _one_in(op, ir):
    return bool(op.inputs) and bool(op.inputs[0]) and live_outputs(op) == 1 and \
        dtype(ir, op.inputs[0]) == dtype(ir, op.outputs[0])


@lowering("Reshape", "Flatten", "Squeeze", "Unsqueeze", accepts=_one_in)
def reshape(ctx, op):
    return [ctx.input(op, 0).reshape(shape(ctx.ir, op.outputs[0]))]


def _perm(op, ir):
    r = len(shape(ir, op.inputs[0]))
    perm = [int(p) for p in (op.attrs.get("perm") or list(range(r))[::-1])]
    return perm if sorted(perm) == list(range(r)) else None


def _accepts_transpose(op, ir):
    return _one_in(op, ir) and _perm(op, ir) is not None


@lowering("Transpose", accepts=_accepts_transpose)
def transpose(ctx, op):
    return [ctx.input(op, 0).dimShuffle(_perm(op, ctx.ir))]


@lowering("Identity", accepts=_one_in)
def identity(ctx, op):
    return [ctx.input(op, 0)]


def _dropout_inference(op, ir) -> bool:
    if op.opset < 12:
        return not (op.opset < 7 and not op.attrs.get("is_test", 0))
    if len(op.inputs) > 2 and op.inputs[2]:
        v = const_value(ir, op.inputs[2])
        return v is not None and not bool(np.asarray(v).reshape(-1)[0])
    return True


def _accepts_dropout(op, ir):
    return _one_in(op, ir) and _dropout_inference(op, ir)


@lowering("Dropout", accepts=_accepts_dropout)
def dropout(ctx, op):
    return [ctx.input(op, 0)]


def _accepts_concat(op, ir):
    ins = [x for x in op.inputs if x]
    if not ins or live_outputs(op) != 1 or len({dtype(ir, x) for x in ins + op.outputs[:1]}) != 1:
        return False
    try:
        norm_axis(op.attrs.get("axis", 1 if op.opset < 4 else 0), len(shape(ir, ins[0])), "Concat")
    except Exception:
        return False
    return True


@lowering("Concat", accepts=_accepts_concat)
def concat(ctx, op):
    ts = [ctx.input(op, i) for i, x in enumerate(op.inputs) if x]
    axis = norm_axis(op.attrs.get("axis", 1 if op.opset < 4 else 0), ts[0].rank(), "Concat")
    return [poplar.concat(ts, axis) if len(ts) > 1 else ts[0]]
