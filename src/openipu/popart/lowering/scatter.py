"""PopART's row-wise ``ScatterReduce`` Sum (``ai.graphcore``) through ``popops.multiUpdateAdd``
(the way PopART's ``ScatterReduceOpx`` lowers a sum with a broadcast index): the output is
created sliceable along the scattered axis (:func:`.gather.create_sliceable`), zeroed, and
each ``src`` row is added at its index (repeated indices add up; rows whose index is out of
range, negative included, are dropped, as PopLibs' multiUpdate drops out-of-range offsets). This is the aggregation of every PyG message-passing layer (``scatter_add_`` of the
messages into the target nodes), so its cost is PopLibs' multiUpdate cost, not a generic one.

Accepted: reduction Sum, axis 0, no ``initial`` input, a 1-D index with one entry per ``src``
row and index broadcast enabled, float ``src``. Anything else takes the generic lowering.
"""

from __future__ import annotations

import math

from openipu.poplibs import popops
from openipu.poplibs.popops import expr as E
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import FLOATS, dtype, graph, name, shape
from openipu.popart.lowering.gather import create_sliceable


def _accepts(op, ir):
    if len(op.inputs) != 2 or not all(op.inputs):
        return False
    a = op.attrs
    red = str(a.get("reduction", "sum")).lower()
    if red not in ("sum", "0") or int(a.get("group_size", 1)) != 1 or not int(a.get("enable_index_broadcast", 1)):
        return False
    src, idx = op.inputs
    ss, ish = shape(ir, src), shape(ir, idx)
    if not ss or int(a.get("axis", -1)) % len(ss) != 0 or len(ish) != 1 or ish[0] != ss[0]:
        return False
    if dtype(ir, src) not in FLOATS or dtype(ir, idx) not in ("INT32", "INT64"):
        return False
    return math.prod(ss) > 0 and int(a["axis_size"]) > 0


@lowering("ScatterReduce", domain="ai.graphcore", accepts=_accepts)
def scatter_reduce_sum(ctx, op):
    """``out[index[i]] += src[i]`` for each row i of ``src``, into zeros of ``axis_size`` rows."""
    g = graph(ctx, op)
    nm = name(op)
    src, idx = ctx.input(op, 0), ctx.input(op, 1)
    ss = [int(d) for d in shape(ctx.ir, op.inputs[0])]
    n, rows = ss[0], int(op.attrs["axis_size"])
    out = create_sliceable(g, src.elementType(), [rows] + ss[1:], 0, op.outputs[0], lookups=n)
    popops.zero(g, out, ctx.prog, f"{nm}/zero")
    idx = popops.map(g, E.Select(E.Const(rows), E._1, E.Lt(E._1, E.Const(0))), [idx], ctx.prog, f"{nm}/dropNegative")
    s = src.reshape([n, 1] + ss[1:])
    popops.multiUpdateAdd(g, out, s, idx.reshape([n, 1]), 1.0, [0], [1], ctx.prog, debug_name=nm)
    return [out]
