"""ONNX pooling through ``popnn.pooling.pool`` (PopART's ``MaxPoolOpx``, ``AveragePoolOpx``,
``GlobalAveragePoolOpx``, ``GlobalMaxPoolOpx``).

The ONNX geometry (``kernel_shape``, ``strides``, ``pads`` or ``auto_pad``, ``ceil_mode``) becomes
a :class:`popnn.pooling.PoolParams` whose lower / upper padding are the ONNX begin pads and the end
pads including the ``ceil_mode`` overhang (as the onnx_ops kernels compute them). Padded positions
never win a max and popnn's AVG divides by the number of *input* elements of each window, which
is ONNX's ``count_include_pad=0``. The global pools are a pool whose kernel is the whole field.

Declined (generic lowering): MaxPool's ``Indices`` output, dilations other than 1, AveragePool
with ``count_include_pad=1`` over padded windows, fields of 0 or more than 3 dimensions, non-float
types, and any geometry whose popnn output shape differs from the IR's.
"""

from __future__ import annotations

from types import SimpleNamespace

from openipu import poplar
from openipu.poplibs import popnn
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import all_float, graph, live_outputs, name, shape
from openipu.popart.onnx_ops.pooling import _geometry

P = popnn.pooling


def _params(op, ir, ptype=None):
    """PoolParams of the op, or None when popnn cannot compute it exactly."""
    x = shape(ir, op.inputs[0])
    nd = len(x) - 2
    if not 1 <= nd <= 3:
        return None
    if op.op_type.startswith("Global"):
        kind = P.PoolingType.AVG if op.op_type == "GlobalAveragePool" else P.PoolingType.MAX
        k, s, lo, up = x[2:], [1] * nd, [0] * nd, [0] * nd
    else:
        if "kernel_shape" not in op.attrs or len(op.attrs["kernel_shape"]) != nd:
            return None
        try:
            k, s, dil, lo, up, outs, pad_ends = _geometry(SimpleNamespace(shape=x), op.attrs)
        except Exception:
            return None
        if any(d != 1 for d in dil) or min(lo + up, default=0) < 0:
            return None
        kind = P.PoolingType.MAX if op.op_type == "MaxPool" else P.PoolingType.AVG
        if kind == P.PoolingType.AVG and op.attrs.get("count_include_pad", 0) and any(lo + up):
            return None
    try:
        p = P.PoolParams(kind, x[2:], list(k), list(s), list(lo), list(up), x[1], x[0],
                         ptype if ptype is not None else poplar.FLOAT)
    except Exception:
        return None
    if [x[0], x[1]] + p.getOutputFieldShape() != shape(ir, op.outputs[0]):
        return None
    return p


def _accepts(op, ir):
    if not op.inputs or not op.inputs[0] or live_outputs(op) != 1:
        return False
    return all_float(ir, op, [0]) and _params(op, ir) is not None


@lowering("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", accepts=_accepts)
def pool(ctx, op):
    x = ctx.input(op, 0)
    p = _params(op, ctx.ir, x.elementType())
    return [P.pool(graph(ctx, op), p, x, ctx.prog, name(op))]
