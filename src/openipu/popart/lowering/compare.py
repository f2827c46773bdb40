"""ONNX comparisons and logical ops through ``popops.map`` (PopART's ``EqualOpx``, ``LessOpx``,
``AndOpx``, ``NotOpx``, ``IsNaNOpx`` ...): one ``popops`` compare / logical op with numpy
broadcasting, BOOL result.

- Equal, Less, Greater, LessOrEqual, GreaterOrEqual: float, half, int32 operands of one type;
- And, Or (bool operands); Xor as ``NOT_EQUAL`` of bools; Not (``LOGICAL_NOT``);
- IsNaN (``IS_NAN``, float and half).

Other operand types (int64 without casting, bool compares ...) use the generic lowering.
"""

from __future__ import annotations

from openipu.poplibs import popops
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import FLOATS, dtype, graph, name

B, U = popops.BinaryOpType, popops.UnaryOpType
_CMP = {"Equal": B.EQUAL, "Less": B.LESS_THAN, "Greater": B.GREATER_THAN, "LessOrEqual": B.LESS_THAN_EQUAL,
        "GreaterOrEqual": B.GREATER_THAN_EQUAL}
_LOGIC = {"And": B.LOGICAL_AND, "Or": B.LOGICAL_OR, "Xor": B.NOT_EQUAL}


def _two(op, ir, allowed):
    if len(op.inputs) != 2 or not all(op.inputs) or dtype(ir, op.outputs[0]) != "BOOL":
        return False
    a, b = (dtype(ir, x) for x in op.inputs)
    return a == b and a in allowed


@lowering(*_CMP, accepts=lambda op, ir: _two(op, ir, FLOATS + ("INT32",)))
def compare(ctx, op):
    return [popops.map(graph(ctx, op), _CMP[op.op_type], ctx.input(op, 0), ctx.input(op, 1), ctx.prog, name(op))]


@lowering(*_LOGIC, accepts=lambda op, ir: _two(op, ir, ("BOOL",)))
def logical(ctx, op):
    return [popops.map(graph(ctx, op), _LOGIC[op.op_type], ctx.input(op, 0), ctx.input(op, 1), ctx.prog, name(op))]


def _one(op, ir, allowed):
    return len(op.inputs) == 1 and bool(op.inputs[0]) and dtype(ir, op.inputs[0]) in allowed and \
        dtype(ir, op.outputs[0]) == "BOOL"


@lowering("Not", accepts=lambda op, ir: _one(op, ir, ("BOOL",)))
def logical_not(ctx, op):
    return [popops.map(graph(ctx, op), U.LOGICAL_NOT, ctx.input(op, 0), ctx.prog, name(op))]


@lowering("IsNaN", accepts=lambda op, ir: _one(op, ir, FLOATS))
def is_nan(ctx, op):
    return [popops.map(graph(ctx, op), U.IS_NAN, ctx.input(op, 0), ctx.prog, name(op))]
