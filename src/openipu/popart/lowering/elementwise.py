"""ONNX binary elementwise ops through ``popops`` (PopART's ``ElementWiseBinaryOpx``).

Add, Sub, Mul, Max, Min (float, half, int32) and Div, Pow (float, half) with numpy broadcasting
go to ``popops.binary_op``: one ``BinaryOp1D`` MultiVertex per tile of the output, the output
mapped like a same-shaped operand (else linearly). When an operand of the output's shape may be
overwritten (PopART's ``AddLhsInplace`` / ``AddRhsInplace`` ...; see
:meth:`LoweringContext.in_place_input`), ``popops.mapInPlace`` writes the result over it
(``BinaryOp1DInPlace``). Other types, variadic Max/Min/Sum and mixed types use the generic
lowering.
"""

from __future__ import annotations

from openipu.poplibs import popops
from openipu.poplibs.popops import expr as E
from openipu.popart.lowering import lowering

_OPS = {"Add": "ADD", "Sub": "SUBTRACT", "Mul": "MULTIPLY", "Div": "DIVIDE", "Pow": "POWER",
        "Max": "MAXIMUM", "Min": "MINIMUM"}
_FLOAT_ONLY = {"Div", "Pow"}


def _accepts(op, ir):
    if len(op.inputs) != 2 or not all(op.inputs):
        return False
    a, b = (ir.tensors[x].info.data_type() for x in op.inputs)
    if a != b or ir.tensors[op.outputs[0]].info.data_type() != a:
        return False
    allowed = ("FLOAT", "FLOAT16") if op.op_type in _FLOAT_ONLY else ("FLOAT", "FLOAT16", "INT32")
    return a in allowed


@lowering(*_OPS, accepts=_accepts)
def binary(ctx, op):
    a, b = ctx.input(op, 0), ctx.input(op, 1)
    g = ctx.graph_of(ctx.vgraph_of(op))
    name = f"{op.op_type}/{op.outputs[0]}"
    i = ctx.in_place_input(op, (0, 1))
    if i is None:
        return [popops.binary_op(g, _OPS[op.op_type], a, b, ctx.prog, name)]
    kind = popops.BinaryOpType[_OPS[op.op_type]]
    if i == 0:
        popops.mapInPlace(g, E.BinaryOp(kind, E._1, E._2), [a, b], ctx.prog, name)
        return [a]
    popops.mapInPlace(g, E.BinaryOp(kind, E._2, E._1), [b, a], ctx.prog, name)
    return [b]
