"""``popops``: elementwise operations (PopLibs ``include/popops/ElementWise.hpp``).

``map(graph, expr, tensors, prog)`` evaluates a :mod:`popops.expr <openipu.poplibs.popops.expr>`
expression elementwise over tensors with numpy broadcasting; ``mapInPlace`` writes the first
tensor, ``mapWithOutput`` a given tensor. The named wrappers (``add``, ``exp``, ``select`` ...,
with ``InPlace`` and ``WithOutput`` variants) are generated from tables below.

Work follows the output's tile mapping (a new output is mapped like the first operand of the
output's shape that is fully mapped, else linearly: PopLibs ``createOutputForElementWiseOp``):
one MultiVertex per tile that owns output elements; operands mapped elsewhere are exchanged in
and the engine costs that exchange.

Cycle estimates (tile cycles per MultiVertex, PopLibs ``lib/popops/popopsCycleEstimators.cpp``,
``ExpressionGenerator.cpp``; poplar.md 4.2):

- ``UnaryOp1D``: ``6 x (W + inner(ceil(n/6))) + 9 + 11``, ``W`` = 33 for EXPONENT else 17 (55
  in place); inner: unrolled table entries cost ``ceil(n/unroll) x cyclesPerLoop``, the others
  ``ceil(n/vw') x (cyclesPerLoop + 4)`` with ``vw'`` the vector width or 1.
- ``BinaryOp1D``: ``6 x ((float ? 29 : 26) + inner(ceil(n/6))) + 11`` (58 in place); inner:
  natural-width entries ``ceil(n/vw) x (cyclesPerLoop + (ADD/SUB/MUL float/half ? 2 : 5))``,
  the others ``ceil(n/unroll) x cyclesPerLoop``.
- ``BroadcastScalar1D`` (one operand a scalar): ``6 x (20 + loops x cyclesPerLoop') + 11`` with
  the broadcast table and +1 (ADD/SUB/MUL float/half) or +4 per natural-width loop.
- ``Select`` / ``Clamp``: PopLibs' single-worker estimates ``5 + 6 + loop(n)`` (select 5 cycles
  per element; clamp 2 cycles per vector for float/half, 7 per element for int), run by 6 workers
  on a sixth of the tile each, i.e. ``6 x (11 + loop(ceil(n/6)))`` tile cycles.
- A multi-op expression (PopLibs' ``enableGenerateCodelet``, default true, when every operand has
  the output's shape or is a scalar) is ONE generated MultiVertex per tile:
  ``24 + 6 x ceil(v/6) x (sum of the ops' cycles per vector + loads + 1 store)``, where
  ``v = n // vw + n % vw`` vectors (PopLibs' count), ``vw`` the vector width when every type is
  float/half/bool and every op vectorises (PopLibs ``supportsVectorization``), else 1; the fixed
  20 of PopLibs' generated estimate is rounded up to a multiple of 6; one load per non-scalar
  input and one store per vector are [A]. An op's cycles per vector come from PopLibs' tables:
  natural-width entries ``cyclesPerLoop``, unrolled ``cyclesPerLoop x vw / unroll``, scalar
  loops ``cyclesPerLoop x vw``.
- With ``enableGenerateCodelet=false`` (or operands of other shapes) the expression runs as one
  compute set per operator, with temporaries, as PopLibs sequences its library codelets.

Ops and types missing from PopLibs' tables use [A] entries marked below. Kernels evaluate the
whole tree on whole tensors in torch, each node in its own result type (fp16 stays fp16).
"""

from __future__ import annotations

import functools
import hashlib
import sys

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.options import OptionFlags
from openipu.poplar.tensor import Tensor
from openipu.poplar.types import Type
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops import expr as E
from openipu.poplibs.popops._common import broadcast_view, output_like, tile_counts_of
from openipu.poplibs.popops.expr import BinaryOpType as B
from openipu.poplibs.popops.expr import TernaryOpType as T
from openipu.poplibs.popops.expr import UnaryOpType as U

F, H = poplar.FLOAT, poplar.HALF
_FLOATS = (F, H)
_INTS = (poplar.INT, poplar.UNSIGNED_INT, poplar.SHORT, poplar.UNSIGNED_SHORT, poplar.CHAR, poplar.SIGNED_CHAR,
         poplar.UNSIGNED_CHAR, poplar.LONGLONG, poplar.UNSIGNED_LONGLONG)
_NUMERIC = _FLOATS + _INTS
_ANY = _NUMERIC + (poplar.BOOL,)
I32, U32 = poplar.INT, poplar.UNSIGNED_INT
I64, U64 = poplar.LONGLONG, poplar.UNSIGNED_LONGLONG
S16, U16 = poplar.SHORT, poplar.UNSIGNED_SHORT

# ----------------------------------------------------------------------------------------------
# PopLibs cycle tables: (op, type) -> (cyclesPerLoop, naturalVectorWidth, loopUnrollFactor)
# (popopsCycleEstimators.hpp unaryOpPerfInfo / binaryOpPerfInfo / broadcastOpPerfInfo and the
# InPlace tables; SDK 3.x). Entries marked [A] are assumptions for ops the tables lack.
# ----------------------------------------------------------------------------------------------
UNARY_PERF = {
    (U.ABSOLUTE, F): (1, False, 0), (U.ABSOLUTE, H): (1, False, 0), (U.ABSOLUTE, I32): (2, False, 0),
    (U.ABSOLUTE, I64): (10, False, 0),
    (U.ASIN, H): (102, False, 0), (U.ASIN, F): (102, False, 0),
    (U.BITWISE_NOT, I32): (1, True, 0), (U.BITWISE_NOT, I64): (3, True, 0), (U.BITWISE_NOT, U32): (1, True, 0),
    (U.BITWISE_NOT, U64): (3, True, 0), (U.BITWISE_NOT, S16): (2, False, 4), (U.BITWISE_NOT, U16): (2, False, 4),
    (U.CBRT, F): (27, True, 0), (U.CBRT, H): (17, True, 0),
    (U.CEIL, F): (2, True, 0), (U.CEIL, H): (2, True, 0),
    (U.COS, F): (2300, False, 0), (U.COS, H): (26, False, 1),
    (U.INVERSE, H): (15, False, 4), (U.INVERSE, F): (6, False, 2),
    (U.COUNT_LEADING_ZEROS, I32): (1, False, 0), (U.COUNT_LEADING_ZEROS, U32): (1, False, 0),
    (U.ERF, F): (18, False, 1), (U.ERF, H): (16, False, 1),
    (U.EXPONENT, F): (6, False, 2), (U.EXPONENT, H): (4, False, 4),
    (U.EXPONENT_MINUS_ONE, F): (4, False, 0), (U.EXPONENT_MINUS_ONE, H): (5, True, 0),
    (U.FLOOR, F): (2, True, 0), (U.FLOOR, H): (2, True, 0),
    (U.IS_FINITE, F): (5, True, 0), (U.IS_FINITE, H): (5, True, 0),
    (U.IS_INF, F): (3, True, 0), (U.IS_INF, H): (5, True, 0),
    (U.IS_NAN, F): (3, True, 0), (U.IS_NAN, H): (3, True, 0),
    (U.LOGARITHM, F): (12, False, 2), (U.LOGARITHM, H): (4, False, 4),
    (U.LOGARITHM_ONE_PLUS, F): (180, True, 0), (U.LOGARITHM_ONE_PLUS, H): (180, True, 0),
    (U.LOGICAL_NOT, poplar.BOOL): (17, False, 0),
    (U.NEGATE, F): (2, False, 2), (U.NEGATE, H): (2, False, 4), (U.NEGATE, I32): (2, False, 0),
    (U.NEGATE, I64): (5, False, 0),
    (U.POPCOUNT, I32): (1, False, 0), (U.POPCOUNT, U32): (1, False, 0),
    (U.ROUND, F): (2, True, 0), (U.ROUND, H): (2, True, 0),
    (U.SIGNUM, F): (5, True, 0), (U.SIGNUM, H): (5, True, 0), (U.SIGNUM, I32): (5, False, 0),
    (U.SIN, F): (2300, False, 0), (U.SIN, H): (26, False, 1),
    (U.SQRT, F): (10, False, 2), (U.SQRT, H): (23, False, 4), (U.SQRT, I32): (110, False, 0),
    (U.SQUARE, F): (2, False, 2), (U.SQUARE, H): (2, False, 4), (U.SQUARE, I32): (1, True, 0),
    (U.SQUARE, U32): (1, True, 0),
    (U.TAN, F): (5100, False, 1), (U.TAN, H): (5700, False, 1),
    (U.TANH, F): (12, False, 2), (U.TANH, H): (4, False, 4),
    (U.SIGMOID, F): (12, False, 2), (U.SIGMOID, H): (6, False, 4),
    (U.RSQRT, F): (8, False, 2), (U.RSQRT, H): (19, False, 4),
    (U.RELU, F): (3, False, 2), (U.RELU, H): (3, False, 4),
    # [A] not in the tables: GELU_ERF from popnn's NonLinearity GELU_ERF op cycles (float 30,
    # half 15 per element); EXPONENT2 like EXPONENT; TRUNC and NEARBY_INT like ROUND.
    (U.GELU_ERF, F): (30, False, 1), (U.GELU_ERF, H): (15, False, 1),
    (U.EXPONENT2, F): (6, False, 2), (U.EXPONENT2, H): (4, False, 4),
    (U.TRUNC, F): (2, True, 0), (U.TRUNC, H): (2, True, 0),
    (U.NEARBY_INT, F): (2, True, 0), (U.NEARBY_INT, H): (2, True, 0),
}
UNARY_INPLACE_PERF = dict(UNARY_PERF)
UNARY_INPLACE_PERF.update({
    (U.ABSOLUTE, F): (1, True, 0), (U.ABSOLUTE, H): (1, True, 0), (U.LOGARITHM, F): (14, False, 2),
    (U.LOGARITHM, H): (6, False, 4), (U.LOGICAL_NOT, poplar.BOOL): (17, True, 0), (U.NEGATE, F): (3, False, 2),
    (U.NEGATE, H): (3, False, 4), (U.TANH, F): (10, False, 2), (U.TANH, H): (2, False, 4),
    (U.SIGMOID, F): (10, False, 2), (U.SIGMOID, H): (4, False, 4), (U.RELU, F): (2, False, 2),
    (U.RELU, H): (2, False, 4),
})


def _ints(op, i32, i64, s16=None):
    d = {(op, I32): i32, (op, U32): i32, (op, I64): i64, (op, U64): i64}
    if s16 is not None:
        d.update({(op, S16): s16, (op, U16): s16})
    return d


BINARY_PERF = {
    (B.ADD, F): (1, True, 0), (B.ADD, H): (1, True, 0), **_ints(B.ADD, (7, False, 1), (11, False, 1)),
    (B.ATAN2, F): (272, False, 2), (B.ATAN2, H): (578, False, 4),
    **_ints(B.BITWISE_AND, (7, False, 1), (9, False, 1), (3, False, 4)),
    **_ints(B.BITWISE_OR, (7, False, 1), (9, False, 1), (3, False, 4)),
    **_ints(B.BITWISE_XOR, (7, False, 1), (9, False, 1), (5, False, 2)),
    **_ints(B.BITWISE_XNOR, (7, False, 1), (9, False, 1), (6, False, 2)),
    (B.DIVIDE, F): (10, False, 2), (B.DIVIDE, H): (21, False, 4), (B.DIVIDE, I32): (277, False, 1),
    (B.DIVIDE, U32): (265, False, 1), (B.DIVIDE, U64): (115, False, 1), (B.DIVIDE, I64): (130, False, 1),
    (B.LOGICAL_AND, poplar.BOOL): (5, False, 4), (B.LOGICAL_OR, poplar.BOOL): (5, False, 4),
    (B.MAXIMUM, F): (4, False, 2), (B.MAXIMUM, H): (4, False, 4), (B.MAXIMUM, I32): (7, False, 1),
    (B.MAXIMUM, U32): (8, False, 1), (B.MAXIMUM, U64): (13, False, 1), (B.MAXIMUM, I64): (15, False, 1),
    (B.MINIMUM, F): (4, False, 2), (B.MINIMUM, H): (4, False, 4), (B.MINIMUM, I32): (7, False, 1),
    (B.MINIMUM, U32): (8, False, 1), (B.MINIMUM, U64): (13, False, 1), (B.MINIMUM, I64): (15, False, 1),
    (B.MULTIPLY, F): (1, True, 0), (B.MULTIPLY, H): (1, True, 0), **_ints(B.MULTIPLY, (7, False, 1), (30, False, 1)),
    (B.POWER, F): (312, False, 1), (B.POWER, H): (325, False, 1),
    (B.REMAINDER, F): (133, False, 2), (B.REMAINDER, H): (300, False, 4), (B.REMAINDER, I32): (292, False, 1),
    (B.REMAINDER, U32): (282, False, 1), (B.REMAINDER, U64): (149, False, 1), (B.REMAINDER, I64): (166, False, 1),
    **_ints(B.SHIFT_LEFT, (7, False, 1), (18, False, 1)),
    (B.SHIFT_RIGHT, I32): (7, False, 1), (B.SHIFT_RIGHT, U32): (7, False, 1), (B.SHIFT_RIGHT, U64): (6, False, 1),
    (B.SHIFT_RIGHT, I64): (6, False, 1),
    (B.SHIFT_RIGHT_SIGN_EXTEND, I32): (7, False, 1), (B.SHIFT_RIGHT_SIGN_EXTEND, I64): (19, False, 1),
    (B.SUBTRACT, F): (1, True, 0), (B.SUBTRACT, H): (1, True, 0), **_ints(B.SUBTRACT, (7, False, 1), (11, False, 1)),
    # comparisons (bool output through _st8)
    **{(op, t): v for op, row in {
        B.EQUAL: ((14, 9, 22, 48, 22, 6)), B.NOT_EQUAL: ((20, 11, 22, 48, 22, 5)),
        B.GREATER_THAN: ((14, 9, 22, 56, None, 31)), B.GREATER_THAN_EQUAL: ((14, 9, 26, 62, None, 28)),
        B.LESS_THAN: ((14, 9, 22, 56, None, 28)), B.LESS_THAN_EQUAL: ((14, 9, 26, 62, None, 28)),
    }.items() for t, v in zip((F, H, I32, U32, I64, U64, S16, U16, poplar.BOOL),
                              [(row[0], False, 4), (row[1], False, 4), (row[2], False, 4), (row[2], False, 4),
                               (row[3], False, 4), (row[3], False, 4),
                               (row[4], False, 4) if row[4] else None, (row[4], False, 4) if row[4] else None,
                               (row[5], False, 4)]) if v is not None},
    # [A] the variance conversions only have broadcast-table entries; use those.
    (B.INV_STD_DEV_TO_VARIANCE, F): (11, False, 2), (B.INV_STD_DEV_TO_VARIANCE, H): (10, False, 2),
    (B.VARIANCE_TO_INV_STD_DEV, F): (12, False, 2), (B.VARIANCE_TO_INV_STD_DEV, H): (24, False, 4),
}
BINARY_INPLACE_PERF = dict(BINARY_PERF)
BINARY_INPLACE_PERF.update({(B.DIVIDE, U32): (264, False, 1), (B.DIVIDE, U64): (113, False, 1),
                            (B.MULTIPLY, U64): (28, False, 1), (B.MULTIPLY, I64): (28, False, 1),
                            (B.REMAINDER, U64): (146, False, 1), (B.REMAINDER, I64): (165, False, 1),
                            (B.SHIFT_LEFT, U64): (16, False, 1), (B.SHIFT_LEFT, I64): (16, False, 1),
                            (B.SHIFT_RIGHT_SIGN_EXTEND, I64): (17, False, 1)})
#: broadcastOpPerfInfo (scalar broadcast vertices); ops it lacks fall back to BINARY_PERF [A].
BROADCAST_PERF = dict(BINARY_PERF)
BROADCAST_PERF.update({
    **_ints(B.ADD, (6, False, 1), (9, False, 1)), **_ints(B.SUBTRACT, (6, False, 1), (9, False, 1)),
    **_ints(B.MULTIPLY, (6, False, 1), (26, False, 1)),
    **_ints(B.BITWISE_AND, (6, False, 1), (7, False, 1), (2, False, 4)),
    **_ints(B.BITWISE_OR, (6, False, 1), (7, False, 1), (2, False, 4)),
    **_ints(B.BITWISE_XOR, (6, False, 1), (7, False, 1), (4, False, 2)),
    **_ints(B.BITWISE_XNOR, (6, False, 1), (7, False, 1), (4, False, 2)),
    (B.DIVIDE, F): (6, False, 2), (B.DIVIDE, H): (8, False, 2), (B.DIVIDE, I32): (277, False, 1),
    (B.DIVIDE, U32): (260, False, 1), (B.DIVIDE, U64): (148, False, 1), (B.DIVIDE, I64): (103, False, 1),
    (B.LOGICAL_AND, poplar.BOOL): (4, False, 4), (B.LOGICAL_OR, poplar.BOOL): (4, False, 4),
    (B.MAXIMUM, F): (3, False, 2), (B.MAXIMUM, H): (3, False, 4), (B.MINIMUM, F): (3, False, 2),
    (B.MINIMUM, H): (3, False, 4), (B.MAXIMUM, I32): (6, False, 1), (B.MINIMUM, I32): (6, False, 1),
    (B.REMAINDER, F): (93, False, 2), (B.REMAINDER, H): (225, False, 4), (B.REMAINDER, I32): (280, False, 1),
    (B.REMAINDER, U32): (267, False, 1), **_ints(B.SHIFT_LEFT, (6, False, 1), (16, False, 1)),
    (B.SHIFT_RIGHT, I32): (6, False, 1), (B.SHIFT_RIGHT, U32): (6, False, 1),
    (B.SHIFT_RIGHT_SIGN_EXTEND, I32): (6, False, 1),
    (B.EQUAL, F): (12, False, 4), (B.EQUAL, H): (8, False, 4), (B.EQUAL, I32): (16, False, 4),
    (B.EQUAL, U32): (16, False, 4),
})
#: [A] any (op, type) missing from a table: a scalar loop of 7 cycles per element (PopLibs' int
#: ADD entry), or 2 cycles per vector for ops the IPU does in one vector instruction.
_DEFAULT_PERF = (7, False, 1)
#: Fused-codelet cycles per vector for nodes outside the op tables: Select and Clamp 2 per vector
#: for float/half (PopLibs clampCycles), Cast 1 per element [A].
_SELECT_PER_ELEM = 5      # PopLibs selectCycles: ld in1, ld in2, ld in3, movz, st

_EXTERNAL = (B.ADD, B.SUBTRACT, B.MULTIPLY)     # hasExternalCodelet: asm fast path for float/half


def _perf(table, op, type_):
    info = table.get((op, type_))
    if info is None:
        base = {poplar.UNSIGNED_INT: I32, S16: I32, U16: I32, poplar.CHAR: I32, poplar.SIGNED_CHAR: I32,
                poplar.UNSIGNED_CHAR: I32, poplar.BOOL: I32}.get(type_)
        info = table.get((op, base), _DEFAULT_PERF) if base is not None else _DEFAULT_PERF
    return info


def _ceil(a, b):
    return -(-np.asarray(a, np.int64) // b)


def unary_inner_cycles(n, info, vw):
    """PopLibs ``unaryOpInnerLoopCycles`` for ``n`` elements (array)."""
    cpl, natural, unroll = info
    if not natural and unroll > 0:
        return _ceil(n, unroll) * cpl
    return _ceil(n, vw if natural else 1) * (cpl + 4)


def binary_inner_cycles(n, info, vw, op, type_, in_place=False):
    """PopLibs ``binaryOpInnerLoopCycles`` for ``n`` elements (array)."""
    cpl, natural, unroll = info
    if natural:
        return _ceil(n, vw) * (cpl + (2 if (op in _EXTERNAL and type_ in _FLOATS) else 5))
    return _ceil(n, unroll or 1) * cpl


def unary_op_cycles(n_per_tile, op, type_, target, in_place=False):
    """Tile cycles of ``popops::UnaryOp1D[InPlace]`` (MultiVertex) for ``n`` elements per tile."""
    info = _perf(UNARY_INPLACE_PERF if in_place else UNARY_PERF, op, type_)
    W = target.getNumWorkerContexts()
    worker = (55 if in_place else (33 if op == U.EXPONENT else 17)) + unary_inner_cycles(
        _ceil(n_per_tile, W), info, target.getVectorWidth(type_))
    return W * worker + 9 + 11


def binary_op_cycles(n_per_tile, type_, cycles_per_loop=None, target=None, op=B.ADD, in_place=False):
    """Tile cycles of ``popops::BinaryOp1D[InPlace]`` (MultiVertex) for ``n`` elements per tile.

    ``binary_op_cycles(n, type, cyclesPerLoop, target)`` (the older form) costs a natural-width
    op of ``cyclesPerLoop``; pass ``op=`` to use PopLibs' table entry for (op, type)."""
    if isinstance(op, str):
        op = B[op]
    info = _perf(BINARY_INPLACE_PERF if in_place else BINARY_PERF, op, type_)
    if cycles_per_loop is not None:
        info = (cycles_per_loop, True, 0)
    W = target.getNumWorkerContexts()
    overhead = 58 if in_place else (29 if type_ == F else 26)
    inner = binary_inner_cycles(_ceil(n_per_tile, W), info, target.getVectorWidth(type_), op, type_, in_place)
    return W * (overhead + inner) + 11


def broadcast_scalar_cycles(n_per_tile, op, type_, target, in_place=False):
    """Tile cycles of ``popops::BroadcastScalar1D[InPlace]`` (PopLibs
    ``broadcastArithmetic1DCycleEstimate``)."""
    info = _perf(BROADCAST_PERF, op, type_)
    cpl, natural, unroll = info
    W = target.getNumWorkerContexts()
    per_worker = _ceil(n_per_tile, W)
    if natural:
        loops = _ceil(per_worker, target.getVectorWidth(type_))
        cpl = cpl + (1 if (op in _EXTERNAL and type_ in _FLOATS) else 4)
    else:
        loops = _ceil(per_worker, unroll or 1)
    return (20 + loops * cpl) * W + 11


def ternary_op_cycles(n_per_tile, op, type_, target):
    """Tile cycles of PopLibs' ``Select`` / ``Clamp`` estimates with a sixth of the tile's elements
    on each of the 6 workers: ``6 x (5 + 6 + loop)``."""
    W = target.getNumWorkerContexts()
    n = _ceil(n_per_tile, W)
    if op == T.SELECT:
        loop = n * _SELECT_PER_ELEM
    elif type_ in _FLOATS:
        loop = _ceil(n, target.getVectorWidth(type_)) * 2
    else:
        loop = n * 7
    return W * (5 + 6 + loop)


# ----------------------------------------------------------------------------------------------
# type rules
# ----------------------------------------------------------------------------------------------
_U_FLOAT_ONLY = {U.ASIN, U.CBRT, U.CEIL, U.COS, U.ERF, U.EXPONENT, U.EXPONENT_MINUS_ONE, U.EXPONENT2, U.FLOOR,
                 U.GELU_ERF, U.INVERSE, U.IS_FINITE, U.IS_INF, U.IS_NAN, U.LOGARITHM, U.LOGARITHM_ONE_PLUS,
                 U.NEARBY_INT, U.RELU, U.SIN, U.TAN, U.TANH, U.ROUND, U.TRUNC, U.SIGMOID, U.RSQRT}
_U_INT_ONLY = {U.BITWISE_NOT, U.POPCOUNT, U.COUNT_LEADING_ZEROS}
_U_BOOL_OUT = {U.IS_FINITE, U.IS_INF, U.IS_NAN, U.LOGICAL_NOT}
_B_FLOAT_ONLY = {B.ATAN2, B.POWER, B.INV_STD_DEV_TO_VARIANCE, B.VARIANCE_TO_INV_STD_DEV}
_B_BITWISE = {B.BITWISE_AND, B.BITWISE_OR, B.BITWISE_XOR}
_B_INT_ONLY = {B.BITWISE_XNOR, B.SHIFT_LEFT, B.SHIFT_RIGHT, B.SHIFT_RIGHT_SIGN_EXTEND}
_B_COMPARE = {B.EQUAL, B.NOT_EQUAL, B.LESS_THAN, B.LESS_THAN_EQUAL, B.GREATER_THAN, B.GREATER_THAN_EQUAL}
_B_LOGICAL = {B.LOGICAL_AND, B.LOGICAL_OR}
#: PopLibs ExprOpUtil ``supportsVectorization`` (unary ops a generated codelet can vectorise).
_U_VECTORISES = {U.ABSOLUTE, U.CEIL, U.COS, U.EXPONENT, U.EXPONENT_MINUS_ONE, U.FLOOR, U.LOGARITHM,
                 U.LOGARITHM_ONE_PLUS, U.SIN, U.TAN, U.TANH, U.ROUND, U.SQRT, U.RSQRT, U.SIGMOID, U.SQUARE,
                 U.INVERSE, U.ASIN, U.EXPONENT2, U.TRUNC, U.NEARBY_INT, U.RELU, U.GELU_ERF}


def _allowed(op) -> tuple:
    if isinstance(op, U):
        if op in _U_FLOAT_ONLY:
            return _FLOATS
        if op in _U_INT_ONLY:
            return _INTS
        if op == U.LOGICAL_NOT:
            return (poplar.BOOL,)
        return _NUMERIC
    if isinstance(op, B):
        if op in _B_FLOAT_ONLY:
            return _FLOATS
        if op in _B_BITWISE:
            return _INTS + (poplar.BOOL,)
        if op in _B_INT_ONLY:
            return _INTS
        if op in _B_LOGICAL:
            return (poplar.BOOL,)
        if op in _B_COMPARE:
            return _ANY
        return _NUMERIC
    return _ANY if op == T.SELECT else _NUMERIC


def _bad_type(op, t):
    return poplar.unknown_vertex_type(
        f"popops has no codelet for {type(op).__name__}.{op.name} on {t} operands; it supports "
        f"{', '.join(str(x) for x in _allowed(op))}. Cast the operands (expr.Cast or popops.cast) first")


class _Compiler:
    """Infers the type of every node and flattens the tree to a picklable instruction list.

    Instructions (register i holds the result of instruction i):
    ("in", k, type) | ("const", value, type) | ("cast", r, from, to) | ("u", op, r, in_t, out_t) |
    ("b", op, r1, r2, in_t, out_t) | ("t", op, r1, r2, r3, t)
    """

    def __init__(self, in_types):
        self.in_types = in_types
        self.code: list = []
        self.types: list = []
        self.node_types: dict = {}     # id(node) -> type (to re-type constants when lowering)

    def emit(self, ins, t):
        self.code.append(ins)
        self.types.append(t)
        return len(self.code) - 1

    def typeof(self, e, hint=None):
        """The type ``e`` evaluates to (without emitting); ``hint`` types untyped constants."""
        if isinstance(e, E.PlaceHolder):
            return self.in_types[e.index - 1]
        if isinstance(e, E.Const):
            return e.type if (e.explicit or hint is None) else hint
        if isinstance(e, E.Cast):
            return e.type
        if isinstance(e, E.UnaryOp):
            return poplar.BOOL if e.op in _U_BOOL_OUT else self.typeof(e.a, hint)
        if isinstance(e, E.BinaryOp):
            if e.op in _B_COMPARE or e.op in _B_LOGICAL:
                return poplar.BOOL
            return self._operand_types(e.a, e.b, hint=hint)[0]
        if isinstance(e, E.TernaryOp):
            return self._operand_types(*(e.children()[:2] if e.op == T.SELECT else e.children()), hint=hint)[0]
        raise TypeError(f"not a popops expression node: {e!r}")

    @classmethod
    def _typed(cls, e) -> bool:
        """Whether ``e``'s value type is fixed without context (it comes from a placeholder, a cast,
        an explicitly typed constant, or is a bool result)."""
        if isinstance(e, (E.PlaceHolder, E.Cast)):
            return True
        if isinstance(e, E.Const):
            return e.explicit
        if isinstance(e, E.UnaryOp):
            return e.op in _U_BOOL_OUT or cls._typed(e.a)
        if isinstance(e, E.BinaryOp):
            return e.op in _B_COMPARE or e.op in _B_LOGICAL or cls._typed(e.a) or cls._typed(e.b)
        if isinstance(e, E.TernaryOp):
            return any(cls._typed(c) for c in (e.children()[:2] if e.op == T.SELECT else e.children()))
        return False

    def _operand_types(self, *args, hint=None):
        """Types of sibling operands: untyped constants (and constant-only subtrees) take the type
        of the first sibling that has one (PopLibs infers constant types from the context)."""
        anchor = next((self.typeof(a) for a in args if self._typed(a)), hint)
        return [self.typeof(a, anchor) for a in args]

    def compile(self, e, hint=None) -> int:
        if isinstance(e, E.PlaceHolder):
            return self.emit(("in", e.index - 1, self.in_types[e.index - 1]), self.in_types[e.index - 1])
        if isinstance(e, E.Const):
            t = self.typeof(e, hint)
            if t not in _ANY:
                raise poplar.unknown_vertex_type(f"constant {e.value!r} of type {t} is not supported in popops.map")
            self.node_types[id(e)] = t
            return self.emit(("const", e.value, t), t)
        if isinstance(e, E.Cast):
            r = self.compile(e.a)
            return self.emit(("cast", r, self.types[r], e.type), e.type)
        if isinstance(e, E.UnaryOp):
            r = self.compile(e.a, poplar.BOOL if e.op == U.LOGICAL_NOT else None if e.op in _U_BOOL_OUT else hint)
            t = self.types[r]
            if t not in _allowed(e.op):
                raise _bad_type(e.op, t)
            out_t = poplar.BOOL if e.op in _U_BOOL_OUT else t
            return self.emit(("u", e.op, r, t, out_t), out_t)
        if isinstance(e, E.BinaryOp):
            cmp = e.op in _B_COMPARE or e.op in _B_LOGICAL
            ta, tb = self._operand_types(e.a, e.b, hint=poplar.BOOL if e.op in _B_LOGICAL else None if cmp else hint)
            if ta != tb:
                raise poplar.graph_connection_error(
                    f"{e.op.name}: operand types differ ({ta} and {tb}); both operands of a binary op must "
                    f"have the same type. Cast one of them (expr.Cast or popops.cast)")
            if ta not in _allowed(e.op):
                raise _bad_type(e.op, ta)
            ra, rb = self.compile(e.a, ta), self.compile(e.b, tb)
            out_t = poplar.BOOL if (e.op in _B_COMPARE or e.op in _B_LOGICAL) else ta
            return self.emit(("b", e.op, ra, rb, ta, out_t), out_t)
        if isinstance(e, E.TernaryOp):
            if e.op == T.SELECT:
                ta, tb = self._operand_types(e.a, e.b, hint=hint)
                tc = self.typeof(e.c, poplar.BOOL)
                if tc != poplar.BOOL:
                    raise poplar.graph_connection_error(
                        f"SELECT: the condition (third operand) must be bool, got {tc}")
            else:
                ta, tb, tc = self._operand_types(e.a, e.b, e.c, hint=hint)
                if tc != ta:
                    raise poplar.graph_connection_error(f"CLAMP: operand types differ ({ta}, {tb}, {tc})")
            if ta != tb:
                raise poplar.graph_connection_error(f"{e.op.name}: operand types differ ({ta} and {tb})")
            if ta not in _allowed(e.op):
                raise _bad_type(e.op, ta)
            ra, rb, rc = self.compile(e.a, ta), self.compile(e.b, tb), self.compile(e.c, tc)
            return self.emit(("t", e.op, ra, rb, rc, ta), ta)
        raise TypeError(f"not a popops expression node: {e!r}")


# ----------------------------------------------------------------------------------------------
# kernels: one torch function per op
# ----------------------------------------------------------------------------------------------
_MASK32 = 0xFFFFFFFF


def _to_type(v: torch.Tensor, t: Type) -> torch.Tensor:
    """An integer result (any int dtype) as type ``t``'s storage, wrapped to ``t``'s width."""
    if t == poplar.BOOL:
        return v != 0
    v = v.to(torch.int64)
    if t.wrap_bits:
        v = v & ((1 << t.wrap_bits) - 1)
    return v.to(t.torch_dtype)


def _u32(v):
    return v.to(torch.int64) & _MASK32


def _popcount(v):
    v = _u32(v)
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return (v * 0x01010101 & _MASK32) >> 24


def _clz(v):
    _, e = torch.frexp(_u32(v).to(torch.float64))
    return 32 - e.to(torch.int64)


def _round_away(x):
    t = torch.trunc(x)
    return torch.where((x - t).abs() >= 0.5, t + torch.sign(x), t)


def _signum(x):
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype) if x.dtype != torch.bool else x


def _int_div(a, b):
    z = b == 0
    # torch's trunc division traps (SIGFPE) on the type's minimum / -1: that quotient is -a,
    # which wraps to the minimum (two's complement, as the IPU's divide)
    m = b == -1
    q = torch.div(a, torch.where(z | m, torch.ones_like(b), b), rounding_mode="trunc")
    q = torch.where(m, torch.neg(a).to(q.dtype), q)
    return torch.where(z, torch.zeros_like(q), q)


def _int_rem(a, b):
    z = b == 0
    r = torch.fmod(a, torch.where(z, torch.ones_like(b), b))
    return torch.where(z, torch.zeros_like(r), r)


def _gelu_erf(x):
    return x * 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))


UNARY_FUNCS = {
    U.ABSOLUTE: torch.abs, U.ASIN: torch.asin, U.BITWISE_NOT: torch.bitwise_not,
    U.CBRT: lambda x: torch.sign(x) * torch.pow(torch.abs(x), 1.0 / 3.0),
    U.CEIL: torch.ceil, U.COS: torch.cos, U.COUNT_LEADING_ZEROS: _clz, U.ERF: torch.erf, U.EXPONENT: torch.exp,
    U.EXPONENT_MINUS_ONE: torch.expm1, U.EXPONENT2: torch.exp2, U.FLOOR: torch.floor, U.GELU_ERF: _gelu_erf,
    U.INVERSE: torch.reciprocal, U.IS_FINITE: torch.isfinite, U.IS_INF: torch.isinf, U.IS_NAN: torch.isnan,
    U.LOGARITHM: torch.log, U.LOGARITHM_ONE_PLUS: torch.log1p, U.LOGICAL_NOT: torch.logical_not,
    U.NEARBY_INT: torch.round, U.NEGATE: torch.neg, U.POPCOUNT: _popcount, U.RELU: torch.relu,
    U.SIGNUM: _signum, U.SIN: torch.sin, U.TAN: torch.tan, U.TANH: torch.tanh, U.ROUND: _round_away,
    U.TRUNC: torch.trunc, U.SQRT: torch.sqrt, U.SQUARE: lambda x: x * x, U.SIGMOID: torch.sigmoid,
    U.RSQRT: torch.rsqrt,
}


def _shl(a, b):
    return a.to(torch.int64) << b.to(torch.int64)


def _shr(a, b):
    return _u32(a) >> b.to(torch.int64)          # PopLibs: (unsigned)a >> (unsigned)b


def _shrse(a, b):
    return a.to(torch.int64) >> b.to(torch.int64)


BINARY_FUNCS = {
    B.ADD: torch.add, B.ATAN2: torch.atan2, B.BITWISE_AND: torch.bitwise_and, B.BITWISE_OR: torch.bitwise_or,
    B.BITWISE_XOR: torch.bitwise_xor, B.BITWISE_XNOR: lambda a, b: torch.bitwise_not(torch.bitwise_xor(a, b)),
    B.DIVIDE: torch.div, B.EQUAL: torch.eq, B.GREATER_THAN_EQUAL: torch.ge, B.GREATER_THAN: torch.gt,
    B.INV_STD_DEV_TO_VARIANCE: lambda a, b: torch.reciprocal(a * a) - b, B.LESS_THAN_EQUAL: torch.le,
    B.LOGICAL_AND: torch.logical_and, B.LOGICAL_OR: torch.logical_or, B.LESS_THAN: torch.lt,
    B.MAXIMUM: torch.fmax, B.MINIMUM: torch.fmin, B.MULTIPLY: torch.mul, B.NOT_EQUAL: torch.ne,
    B.POWER: torch.pow, B.REMAINDER: torch.fmod, B.SHIFT_LEFT: _shl, B.SHIFT_RIGHT: _shr,
    B.SHIFT_RIGHT_SIGN_EXTEND: _shrse, B.SUBTRACT: torch.sub,
    B.VARIANCE_TO_INV_STD_DEV: lambda a, b: torch.rsqrt(a + b),
}
_INT_BINARY = {B.DIVIDE: _int_div, B.REMAINDER: _int_rem, B.MAXIMUM: torch.maximum, B.MINIMUM: torch.minimum}


def _const(value, t: Type):
    if t == poplar.BOOL:
        return torch.tensor(bool(value))
    if t.is_float:
        return torch.tensor(float(value), dtype=t.torch_dtype)
    return _to_type(torch.tensor(int(value) if not isinstance(value, float) else int(np.trunc(value))), t)


def _cast(v, src: Type, dst: Type):
    if dst == poplar.BOOL:
        return v != 0
    if dst.is_float:
        return v.to(dst.torch_dtype)
    if v.is_floating_point():
        v = torch.nan_to_num(torch.trunc(v.to(torch.float64)), nan=0.0)
    return _to_type(v, dst)


def _run(code, values):
    """Evaluate an instruction list; ``values[k]`` is placeholder k's torch tensor."""
    regs = []
    for ins in code:
        kind = ins[0]
        if kind == "in":
            v = values[ins[1]]
        elif kind == "const":
            v = _const(ins[1], ins[2])
        elif kind == "cast":
            v = _cast(regs[ins[1]], ins[2], ins[3])
        elif kind == "u":
            _, op, r, t, ot = ins
            v = UNARY_FUNCS[op](regs[r])
            if not t.is_float and op in (U.POPCOUNT, U.COUNT_LEADING_ZEROS, U.BITWISE_NOT, U.NEGATE, U.ABSOLUTE,
                                         U.SQUARE, U.SQRT, U.SIGNUM):
                v = _to_type(torch.trunc(v) if v.is_floating_point() else v, ot)
        elif kind == "b":
            _, op, ra, rb, t, ot = ins
            a, b = regs[ra], regs[rb]
            fn = _INT_BINARY.get(op) if not t.is_float else None
            v = (fn or BINARY_FUNCS[op])(a, b)
            if ot != poplar.BOOL and not t.is_float:
                v = _to_type(v, ot)
        else:
            _, op, ra, rb, rc, t = ins
            a, b, c = regs[ra], regs[rb], regs[rc]
            if op == T.SELECT:
                v = torch.where(c, a, b)
            elif t.is_float:
                v = torch.fmax(b, torch.fmin(a, c))
            else:
                v = torch.maximum(b, torch.minimum(a, c))
        regs.append(v)
    return regs[-1]


@kernel
def _map_kernel(code, ins, out, ctx):
    values = [None if t is None else ctx.read(t) for t in ins]
    v = _run(code, values)
    shape = (ctx.replicas, *out.shape())
    ctx.write(out, torch.broadcast_to(v, shape))


# ----------------------------------------------------------------------------------------------
# map
# ----------------------------------------------------------------------------------------------
_KNOWN_OPTIONS = {"enableGenerateCodelet", "forceGenerateCodelet", "enableVectorBroadcastOptimisations",
                  "enableExpressionOptimizations"}


def _options(options) -> OptionFlags:
    opts = OptionFlags(options or {})
    for k in opts:
        if k not in _KNOWN_OPTIONS:
            raise poplar.invalid_option(
                f"Unrecognised popops elementwise option '{k}'; valid options are {', '.join(sorted(_KNOWN_OPTIONS))}")
        if opts[k].lower() not in ("true", "false", "1", "0"):
            raise poplar.invalid_option(f"popops option '{k}' must be true or false, got '{opts[k]}'")
    return opts


def _is_leaf(e):
    return isinstance(e, (E.PlaceHolder, E.Const))


def _op_of(e):
    return e.op if isinstance(e, (E.UnaryOp, E.BinaryOp, E.TernaryOp)) else None


def _fused_op_cycles(code, vw) -> float:
    """Sum over the instructions of PopLibs' cycles per vector of ``vw`` elements."""
    total = 0.0
    for ins in code:
        kind = ins[0]
        if kind == "u":
            cpl, natural, unroll = _perf(UNARY_PERF, ins[1], ins[3])
        elif kind == "b":
            cpl, natural, unroll = _perf(BINARY_PERF, ins[1], ins[4])
        elif kind == "t":
            if ins[1] == T.SELECT:
                total += _SELECT_PER_ELEM * vw
            else:
                total += 2 if ins[5] in _FLOATS else 7 * vw
            continue
        elif kind == "cast":
            total += vw     # [A] 1 cycle per element
            continue
        else:
            continue
        total += cpl if natural else cpl * vw / (unroll or 1)
    return total


def _flops(code, n) -> float:
    """PopLibs flopsPerUnaryOpElement / flopsPerBinaryOpElement (float types only), x n elements."""
    per = 0
    for ins in code:
        if ins[0] == "u" and ins[3].is_float:
            per += 0 if ins[1] in (U.BITWISE_NOT, U.COUNT_LEADING_ZEROS, U.LOGICAL_NOT, U.POPCOUNT) else 1
        elif ins[0] == "b" and ins[4].is_float:
            per += 3 if ins[1] == B.REMAINDER else 2 if ins[1] in (B.VARIANCE_TO_INV_STD_DEV,
                                                                     B.INV_STD_DEV_TO_VARIANCE) else 1
        elif ins[0] == "t" and ins[1] == T.CLAMP and ins[5].is_float:
            per += 2
    return float(per * n)


def _check_tensors(tensors):
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise poplar.graph_connection_error(
                f"popops.map: operand {i + 1} is a {type(t).__name__}, not a poplar Tensor")
    return tensors


def _prepare(expr, tensors, name):
    """Validate ``expr`` against ``tensors``: (code, result type, broadcast shape, used indices)."""
    if not isinstance(expr, E.Expr):
        raise TypeError(f"popops.map needs an expression (popops.expr), got {type(expr).__name__}")
    used = sorted(expr.placeholders())
    if used and used[-1] > len(tensors):
        raise poplar.index_error(
            f"{name or 'map'}: the expression uses placeholder _{used[-1]} but only {len(tensors)} tensor(s) were "
            f"given; pass one tensor per placeholder")
    comp = _Compiler([t.elementType() for t in tensors])
    comp.compile(expr)
    shapes = [tuple(tensors[i - 1].shape()) for i in used] or [tuple(t.shape()) for t in tensors[:1]]
    try:
        shape = list(np.broadcast_shapes(*shapes)) if shapes else []
    except ValueError:
        raise poplar.index_error(
            f"{name or 'map'}: operand shapes {[list(s) for s in shapes]} cannot be broadcast together "
            f"(numpy rules: trailing dimensions must match or be 1)") from None
    return comp.code, comp.types[-1], shape, used, comp.node_types


def _vertex_name(expr, code, out_type, in_place):
    op = _op_of(expr)
    sfx = "InPlace" if in_place else ""
    if isinstance(op, U):
        return f"popops::UnaryOp1D{sfx}<popops::expr::UnaryOpType::{op.name},{code[-1][3]}>"
    if isinstance(op, B):
        return f"popops::BinaryOp1D{sfx}<popops::expr::BinaryOpType::{op.name},{code[-1][4]}>"
    if isinstance(op, T):
        return f"popops::{'Select' if op == T.SELECT else 'Clamp'}{sfx}<{out_type}>"
    return None


def _single_op_cycles(expr, code, tensors, counts, target, in_place):
    """(vertex type, tile cycles) for an expression that is one operator over leaves."""
    op = _op_of(expr)
    if isinstance(op, U):
        t = code[-1][3]
        return _vertex_name(expr, code, t, in_place), unary_op_cycles(counts, op, t, target, in_place)
    if isinstance(op, B):
        t = code[-1][4]
        scalar = [isinstance(c, E.Const) or tensors[c.index - 1].numElements() == 1 for c in (expr.a, expr.b)]
        if any(scalar) and not all(scalar):
            sfx = "InPlace" if in_place else ""
            return (f"popops::BroadcastScalar1D{sfx}<popops::expr::BinaryOpType::{op.name},{t}>",
                    broadcast_scalar_cycles(counts, op, t, target, in_place))
        return _vertex_name(expr, code, t, in_place), binary_op_cycles(counts, t, target=target, op=op,
                                                                        in_place=in_place)
    t = code[-1][5]
    return _vertex_name(expr, code, t, in_place), ternary_op_cycles(counts, op, t, target)


def _fused_cycles(code, tensors, used, counts, target):
    types = [ins[-1] for ins in code]
    vectorise = all(t in (F, H, poplar.BOOL) for t in types) and all(
        ins[0] != "cast" and not (ins[0] == "u" and ins[1] not in _U_VECTORISES) for ins in code)
    dtype = tensors[used[0] - 1].elementType() if used else types[-1]
    vw = target.getVectorWidth(dtype) if vectorise else 1
    W = target.getNumWorkerContexts()
    loads = sum(1 for i in used if tensors[i - 1].numElements() != 1)
    per_vector = _fused_op_cycles(code, vw) + loads + 1
    vectors = counts // vw + counts % vw
    return 24 + W * np.ceil(_ceil(vectors, W) * per_vector).astype(np.int64)


def _retyped(e, node_types):
    """``e`` with every constant given the type the whole-expression inference chose."""
    if isinstance(e, E.Const):
        return E.Const(e.value, node_types.get(id(e), e.type))
    if isinstance(e, E.PlaceHolder):
        return e
    kids = [_retyped(c, node_types) for c in e.children()]
    if isinstance(e, E.Cast):
        return E.Cast(kids[0], e.type)
    return type(e)(e.op, *kids) if type(e).OP is None else type(e)(*kids)


def _lower_unfused(graph, expr, tensors, prog, name, options, out, in_place, node_types):
    """Run ``expr`` one operator per compute set (PopLibs without codelet generation)."""
    def leaf(e):
        if isinstance(e, E.PlaceHolder):
            return tensors[e.index - 1]
        if isinstance(e, E.Const) or not e.placeholders():
            return _retyped(e, node_types)
        return lower(e, None)

    def lower(e, dst):
        kids = [leaf(c) for c in e.children()]
        ts, args = [], []
        for k in kids:
            if isinstance(k, Tensor):
                ts.append(k)
                args.append(E.PlaceHolder(len(ts)))
            else:
                args.append(k)
        if isinstance(e, E.Cast):
            sub = E.Cast(args[0], e.type)
        else:
            sub = type(e)(e.op, *args) if type(e).OP is None else type(e)(*args)
        return _map_impl(graph, sub, ts, prog, name, {"enableGenerateCodelet": "false"}, out=dst,
                         in_place=False, _fuse=False)

    if in_place:
        out = tensors[0]
    return lower(expr, out)


def _map_impl(graph, expr, tensors, prog, name="", options=None, out=None, in_place=False, _fuse=True):
    tensors = _check_tensors(tensors)
    opts = _options(options)
    code, rtype, shape, used, node_types = _prepare(expr, tensors, name)
    if in_place:
        if not tensors:
            raise poplar.index_error("mapInPlace needs at least one tensor (the one written)")
        out = tensors[0]
    if out is not None:
        what = "mapInPlace: the first tensor" if in_place else "mapWithOutput: the output"
        if out.elementType() != rtype:
            raise poplar.graph_connection_error(
                f"{what} has type {out.elementType()} but the expression gives {rtype}; use a {rtype} tensor or "
                f"wrap the expression in expr.Cast(..., {out.elementType()})")
        if list(out.shape()) != list(shape):
            raise poplar.index_error(
                f"{what} has shape {out.shape()} but the operands broadcast to {shape}")
        if not out.isParallelWriteable():
            raise poplar.graph_connection_error(
                f"{what} is not parallel writeable (it contains aliases or constants); write to a plain variable")
        if not graph.is_mapped(out):
            raise poplar.invalid_tile_mapping(f"{what} is not completely mapped to tiles; map it first")
    n_nodes = expr.num_ops() + sum(1 for ins in code if ins[0] == "cast")
    simple = _op_of(expr) is not None and all(_is_leaf(c) for c in expr.children())
    fusable = all(list(tensors[i - 1].shape()) == list(shape) or tensors[i - 1].numElements() == 1 for i in used) \
        and not any(tensors[i - 1].containsAliases() for i in used)
    generate = opts.get_bool("enableGenerateCodelet", True) and _fuse
    force = opts.get_bool("forceGenerateCodelet", False)
    progress = any(not _is_leaf(c) and c.placeholders() for c in expr.children())
    if not simple and not force and n_nodes > 1 and progress and not (generate and fusable):
        return _lower_unfused(graph, expr, tensors, prog, name, options, out, in_place, node_types)

    if out is None:
        first = [tensors[i - 1] for i in used]
        cands = first + [t for t in tensors if all(t is not f for f in first)]
        out = output_like(graph, rtype, shape, cands, name or "map")
    tiles, counts = tile_counts_of(graph, out)
    target = graph.getTarget()
    if simple and not force:
        vname, cycles = _single_op_cycles(expr, code, tensors, counts, target, in_place)
    else:
        digest = hashlib.sha1(repr(code).encode()).hexdigest()[:10]
        vname = f"popops::map::MapGenerated_{digest}<{rtype}>"
        cycles = _fused_cycles(code, tensors, used, counts, target)
    ins = [None] * len(tensors)
    reads = []
    for i in used:
        v = broadcast_view(tensors[i - 1], shape)
        ins[i - 1] = v
        reads.append(Access(v, out))
    cs = graph.addComputeSet(name or (vname.split("<")[0].split("::")[-1]))
    graph.add_vertex_group(cs, VertexGroup(
        vname, tiles, np.asarray(cycles, np.int64), functools.partial(_map_kernel, code, ins, out),
        reads=reads, writes=[Access(out)], multi=True, flops=_flops(code, out.numElements()),
        state_bytes=8 + 4 * (len(used) + 1)))
    prog.add(poplar.program.Execute(cs))
    return out


def _expr_args(expr_or_op, args):
    """Split PopLibs' map overloads: (Expr, [tensors], ...) or (OpType, t1[, t2[, t3]], ...)."""
    n = {E.UnaryOpType: 1, E.BinaryOpType: 2, E.TernaryOpType: 3}.get(type(expr_or_op))
    if n is None:
        if not args:
            raise TypeError("popops.map(graph, expr, tensors, prog, ...) needs a list of tensors")
        return expr_or_op, args[0], args[1:]
    ph = [E._1, E._2, E._3][:n]
    node = {1: E.UnaryOp, 2: E.BinaryOp, 3: E.TernaryOp}[n](expr_or_op, *ph)
    return node, list(args[:n]), args[n:]


def map(graph, expr, *args, **kwargs):  # noqa: A001 - PopLibs name
    """``popops::map``: evaluate ``expr`` elementwise over ``tensors``; returns a new tensor.

    Forms: ``map(graph, expr, tensors, prog, debug_name="", options=None)`` and
    ``map(graph, UnaryOpType.X, t, prog, ...)`` / ``(BinaryOpType.X, a, b, prog, ...)`` /
    ``(TernaryOpType.X, a, b, c, prog, ...)``.

    Args:
        expr: a :mod:`popops.expr` expression; placeholder ``_k`` is ``tensors[k-1]``.
        tensors: operands; shapes broadcast with numpy rules.
        options: ``enableGenerateCodelet`` (default true: fuse a multi-op expression into one
            generated vertex per tile), ``forceGenerateCodelet`` (default false).

    Returns:
        A new tensor of the broadcast shape and the expression's type (comparisons and logical
        ops give BOOL, Cast its type), mapped like the first operand of that shape, else linearly.

    Raises:
        poplar.index_error: a placeholder with no tensor, or shapes that do not broadcast.
        poplar.graph_connection_error: operand types that differ.
        poplar.unknown_vertex_type: an op on a type it does not support.
        poplar.invalid_option: an unknown option.
    """
    e, tensors, rest = _expr_args(expr, args)
    prog, rest = rest[0], rest[1:]
    name = kwargs.pop("debug_name", rest[0] if rest else "")
    options = kwargs.pop("options", rest[1] if len(rest) > 1 else None)
    return _map_impl(graph, e, tensors, prog, name, options)


def mapInPlace(graph, expr, *args, **kwargs):  # noqa: N802
    """``popops::mapInPlace``: like :func:`map` but writes the result to the first tensor, which
    must have the broadcast shape and the expression's type. Returns None."""
    e, tensors, rest = _expr_args(expr, args)
    prog, rest = rest[0], rest[1:]
    name = kwargs.pop("debug_name", rest[0] if rest else "")
    options = kwargs.pop("options", rest[1] if len(rest) > 1 else None)
    _map_impl(graph, e, tensors, prog, name, options, in_place=True)


def mapWithOutput(graph, expr, *args, **kwargs):  # noqa: N802
    """``popops::mapWithOutput(graph, expr, tensors, out, prog, debug_name="", options=None)``
    (or the op-type forms ``(graph, UnaryOpType.X, in, out, prog, ...)``): writes ``out``, which
    must be mapped and have the broadcast shape and the expression's type. Returns None."""
    e, tensors, rest = _expr_args(expr, args)
    out, prog, rest = rest[0], rest[1], rest[2:]
    name = kwargs.pop("debug_name", rest[0] if rest else "")
    options = kwargs.pop("options", rest[1] if len(rest) > 1 else None)
    if not isinstance(out, Tensor):
        raise poplar.graph_connection_error(f"mapWithOutput: out must be a Tensor, got {type(out).__name__}")
    _map_impl(graph, e, tensors, prog, name, options, out=out)


# ----------------------------------------------------------------------------------------------
# named wrappers (ElementWise.hpp), generated from tables
# ----------------------------------------------------------------------------------------------
UNARY_WRAPPERS = {
    "abs": U.ABSOLUTE, "asin": U.ASIN, "bitwiseNot": U.BITWISE_NOT, "cbrt": U.CBRT, "ceil": U.CEIL, "cos": U.COS,
    "countLeadingZeros": U.COUNT_LEADING_ZEROS, "erf": U.ERF, "exp": U.EXPONENT, "expm1": U.EXPONENT_MINUS_ONE,
    "exp2": U.EXPONENT2, "floor": U.FLOOR, "geluErf": U.GELU_ERF, "inv": U.INVERSE, "isFinite": U.IS_FINITE,
    "log": U.LOGARITHM, "log1p": U.LOGARITHM_ONE_PLUS, "logicalNot": U.LOGICAL_NOT, "neg": U.NEGATE,
    "popcount": U.POPCOUNT, "signum": U.SIGNUM, "sin": U.SIN, "tan": U.TAN, "tanh": U.TANH, "round": U.ROUND,
    "trunc": U.TRUNC, "sqrt": U.SQRT, "square": U.SQUARE, "sigmoid": U.SIGMOID, "rsqrt": U.RSQRT,
}
BINARY_WRAPPERS = {
    "add": B.ADD, "atan2": B.ATAN2, "bitwiseAnd": B.BITWISE_AND, "bitwiseOr": B.BITWISE_OR,
    "bitwiseXor": B.BITWISE_XOR, "bitwiseXnor": B.BITWISE_XNOR, "div": B.DIVIDE, "eq": B.EQUAL,
    "gteq": B.GREATER_THAN_EQUAL, "gt": B.GREATER_THAN, "invStdDevToVariance": B.INV_STD_DEV_TO_VARIANCE,
    "lteq": B.LESS_THAN_EQUAL, "logicalAnd": B.LOGICAL_AND, "logicalOr": B.LOGICAL_OR, "lt": B.LESS_THAN,
    "max": B.MAXIMUM, "min": B.MINIMUM, "mul": B.MULTIPLY, "neq": B.NOT_EQUAL, "pow": B.POWER,
    "rem": B.REMAINDER, "shiftLeft": B.SHIFT_LEFT, "shiftRight": B.SHIFT_RIGHT,
    "shiftRightSignExtend": B.SHIFT_RIGHT_SIGN_EXTEND, "sub": B.SUBTRACT,
    "varianceToInvStdDev": B.VARIANCE_TO_INV_STD_DEV,
}
TERNARY_WRAPPERS = {"clamp": T.CLAMP, "select": T.SELECT}


def _operands(vals):
    """Tensors and Python scalars -> (expression leaves, tensor list): scalars become Const
    (PopLibs' constant-operand overloads)."""
    ts, leaves = [], []
    for v in vals:
        if isinstance(v, Tensor):
            ts.append(v)
            leaves.append(E.PlaceHolder(len(ts)))
        elif isinstance(v, (bool, int, float, np.generic)):
            leaves.append(E.Const(v))
        else:
            raise poplar.graph_connection_error(f"operand {v!r} is neither a poplar Tensor nor a scalar constant")
    if not ts:
        raise poplar.graph_connection_error("at least one operand must be a Tensor")
    return leaves, ts


def _node(op, leaves):
    return {U: E.UnaryOp, B: E.BinaryOp, T: E.TernaryOp}[type(op)](op, *leaves)


def _make_wrappers(name, op, arity):
    pl = "ElementWise.hpp"
    doc_args = ", ".join("ABC"[:arity])

    def fn(graph, *args, **kw):
        ops, rest = args[:arity], args[arity:]
        prog, rest = rest[0], rest[1:]
        dbg = kw.pop("debug_name", kw.pop("name", rest[0] if rest else ""))
        options = kw.pop("options", rest[1] if len(rest) > 1 else None)
        leaves, ts = _operands(ops)
        return _map_impl(graph, _node(op, leaves), ts, prog, dbg or name, options)

    def fn_in_place(graph, *args, **kw):
        ops, rest = args[:arity], args[arity:]
        prog, rest = rest[0], rest[1:]
        dbg = kw.pop("debug_name", kw.pop("name", rest[0] if rest else ""))
        options = kw.pop("options", rest[1] if len(rest) > 1 else None)
        if not isinstance(ops[0], Tensor):
            raise poplar.graph_connection_error(f"{name}InPlace: the first operand must be the Tensor to update")
        leaves, ts = _operands(ops)
        _map_impl(graph, _node(op, leaves), ts, prog, dbg or name, options, in_place=True)

    def fn_with_output(graph, *args, **kw):
        ops, rest = args[:arity], args[arity:]
        out, prog, rest = rest[0], rest[1], rest[2:]
        dbg = kw.pop("debug_name", kw.pop("name", rest[0] if rest else ""))
        options = kw.pop("options", rest[1] if len(rest) > 1 else None)
        if not isinstance(out, Tensor):
            raise poplar.graph_connection_error(f"{name}WithOutput: out must be a Tensor")
        leaves, ts = _operands(ops)
        _map_impl(graph, _node(op, leaves), ts, prog, dbg or name, options, out=out)

    kind = type(op).__name__
    fn.__name__, fn.__qualname__ = name, name
    fn.__doc__ = (f"``popops::{name}(graph, {doc_args}, prog, debug_name='', options=None)``: "
                  f"``map({kind}.{op.name})`` over {doc_args} ({pl}); operands may be Python scalars. "
                  f"Returns a new tensor. Raises as :func:`map`.")
    fn_in_place.__name__ = fn_in_place.__qualname__ = name + "InPlace"
    fn_in_place.__doc__ = f"``popops::{name}InPlace``: :func:`{name}` written to the first operand."
    fn_with_output.__name__ = fn_with_output.__qualname__ = name + "WithOutput"
    fn_with_output.__doc__ = (f"``popops::{name}WithOutput(graph, {doc_args}, out, prog, ...)``: "
                              f":func:`{name}` written to ``out``.")
    return fn, fn_in_place, fn_with_output


_WRAPPER_NAMES = []
for _table, _arity in ((UNARY_WRAPPERS, 1), (BINARY_WRAPPERS, 2), (TERNARY_WRAPPERS, 3)):
    for _name, _op in _table.items():
        for _f in _make_wrappers(_name, _op, _arity):
            _f.__module__ = __name__
            setattr(sys.modules[__name__], _f.__name__, _f)
            _WRAPPER_NAMES.append(_f.__name__)
del _table, _arity, _name, _op, _f

#: The older string-keyed table: op name -> BinaryOpType (kept for callers of ``binary_op``).
BINARY_OPS = {op.name: op for op in B}


def binary_op(graph, op: str, a, b, prog, name: str = ""):
    """``out = op(a, b)`` with numpy broadcasting (``op`` a BinaryOpType name such as ``"ADD"``);
    appends one compute set to ``prog``. Same as ``map(graph, BinaryOpType[op], a, b, prog)``."""
    return map(graph, B[op], a, b, prog, name or op.lower())


__all__ = ["map", "mapInPlace", "mapWithOutput", "binary_op", "binary_op_cycles", "unary_op_cycles",
           "broadcast_scalar_cycles", "ternary_op_cycles", "BINARY_OPS", "UnaryOpType", "BinaryOpType",
           "TernaryOpType", *_WRAPPER_NAMES]
UnaryOpType, BinaryOpType, TernaryOpType = U, B, T
