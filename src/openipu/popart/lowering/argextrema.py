"""ONNX ArgMax / ArgMin through ``popnn.argMax`` / ``popnn.argMin`` (PopART's ``ArgMaxOpx`` /
``ArgMinOpx``, both ``ArgExtremaOpx``).

The input ``x`` (float, half or int32, any rank >= 1) is viewed as 2-D ``[rows, n]`` with the
reduced ``axis`` innermost (a ``dimShuffle`` and reshape view, no copy); popnn reduces each row
where its elements already are (a (value, index) partial per row and tile, then the partials of
a row on the tile of its first element), so only the partials cross tiles. The ``UNSIGNED_INT``
indices are cast to the IR's ``INT32`` output (PopART's ArgExtremaOp type) and reshaped to the
output shape (``keepdims`` 1 keeps the axis as size 1). Ties give the first index, as ONNX's
default ``select_last_index = 0``.

Declined (generic lowering): ``select_last_index = 1``, empty tensors, scalars, input types other
than float, half and int32, outputs other than INT32. The generic lowering maps the small index
output linearly (a few tiles) and reads the whole input there: a ``[128, 20256]`` half logits
tensor (GPT-2's accuracy) put 1.3 MB of receive buffers on each of 4 tiles.
"""

from __future__ import annotations

import math

from openipu import poplar
from openipu.poplibs import popnn, popops
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import dtype, graph, name, shape
from openipu.popart.onnx_ops._common import norm_axis


def _axis(op, ir):
    try:
        return norm_axis(op.attrs.get("axis", 0), len(shape(ir, op.inputs[0])), op.op_type)
    except Exception:
        return None


def _accepts(op, ir):
    if len(op.inputs) != 1 or not op.inputs[0] or not op.outputs or not op.outputs[0]:
        return False
    if int(op.attrs.get("select_last_index", 0)):
        return False
    if dtype(ir, op.inputs[0]) not in ("FLOAT", "FLOAT16", "INT32") or dtype(ir, op.outputs[0]) != "INT32":
        return False
    xs = shape(ir, op.inputs[0])
    return len(xs) >= 1 and math.prod(xs) > 0 and _axis(op, ir) is not None


@lowering("ArgMax", "ArgMin", accepts=_accepts)
def arg_extrema(ctx, op):
    """``[rows, n]`` view with ``axis`` innermost -> ``popnn.argMax`` / ``argMin`` ->
    ``UNSIGNED_INT [rows]`` -> ``popops.cast`` to ``INT`` -> the output shape."""
    g = graph(ctx, op)
    nm = name(op)
    x = ctx.input(op, 0)
    xs = list(x.shape())
    axis = _axis(op, ctx.ir)
    if axis != len(xs) - 1:
        x = x.dimShuffle([d for d in range(len(xs)) if d != axis] + [axis])
    n = xs[axis]
    x2 = x.reshape([math.prod(xs) // n, n])
    fn = popnn.argMax if op.op_type == "ArgMax" else popnn.argMin
    idx = fn(g, x2, ctx.prog, nm)
    out = popops.cast(g, idx, poplar.INT, ctx.prog, f"{nm}/cast")
    return [out.reshape(shape(ctx.ir, op.outputs[0]))]
