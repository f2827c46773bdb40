"""ONNX variadic Sum and Mean through one fused ``popops.map`` (PopART's ``SumOpx`` /
``MeanOpx``): ``((x1 + x2) + x3) + ...`` in the inputs' type (numpy broadcasting), Mean divided
by the input count — the kernels' order of operations. One input is the input itself. Float,
half and int32 (Sum) only; mixed types use the generic lowering.
"""

from __future__ import annotations

from openipu.poplibs import popops
from openipu.poplibs.popops import expr as E
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import FLOATS, dtype, graph, name, shape


def _accepts(op, ir):
    ins = list(op.inputs)
    if not ins or not all(ins) or len(ins) > 20:
        return False
    types = {dtype(ir, x) for x in ins + op.outputs[:1]}
    ok = FLOATS + (("INT32",) if op.op_type == "Sum" else ())
    return len(types) == 1 and next(iter(types)) in ok


@lowering("Sum", "Mean", accepts=_accepts)
def variadic(ctx, op):
    ts = [ctx.input(op, i) for i in range(len(op.inputs))]
    if len(ts) == 1:
        return [ts[0]]
    e = E.PlaceHolder(1)
    for k in range(2, len(ts) + 1):
        e = E.Add(e, E.PlaceHolder(k))
    if op.op_type == "Mean":
        e = E.Divide(e, E.Const(float(len(ts))))
    out = popops.map(graph(ctx, op), e, ts, ctx.prog, name(op))
    return [out.reshape(shape(ctx.ir, op.outputs[0]))]
