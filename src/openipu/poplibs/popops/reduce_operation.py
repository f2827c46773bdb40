"""``popops``: the reduction operators and parameters (PopLibs ``include/popops/Operation.hpp``,
``Reduce.hpp``'s ``ReduceParams`` and ``SingleReduceOp``), and the checks :mod:`.reduce` applies to
a reduction's types, dimensions and options before it plans anything."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from openipu import poplar

__all__ = ["Operation", "ReduceParams", "SingleReduceOp", "as_operation"]


class Operation(enum.Enum):
    """``popops::Operation``: the reduction operator."""

    ADD = "ADD"
    MUL = "MUL"
    MIN = "MIN"
    MAX = "MAX"
    LOGICAL_AND = "LOGICAL_AND"   # bool operands only
    LOGICAL_OR = "LOGICAL_OR"     # bool operands only
    SQUARE_ADD = "SQUARE_ADD"     # squares each element, then ADD
    LOG_ADD = "LOG_ADD"           # acc = max + log(1 + exp(min - max)) (log-sum-exp)

    def __str__(self):
        return self.value


SCALABLE = (Operation.ADD, Operation.SQUARE_ADD, Operation.LOG_ADD)
ACCUMULATING = (Operation.ADD, Operation.SQUARE_ADD)
VECTORISED = (Operation.ADD, Operation.SQUARE_ADD, Operation.MUL, Operation.MAX, Operation.MIN)
#: flops per element combined (PopLibs flopsForReduceOp; LOG_ADD [A]: max, sub, exp, add, log).
FLOPS = {Operation.ADD: 1, Operation.MUL: 1, Operation.MIN: 1, Operation.MAX: 1, Operation.LOGICAL_AND: 0,
          Operation.LOGICAL_OR: 0, Operation.SQUARE_ADD: 2, Operation.LOG_ADD: 5}


def as_operation(op) -> Operation:
    if isinstance(op, Operation):
        return op
    try:
        return Operation(str(op).upper().split(".")[-1])
    except ValueError:
        raise poplar.poplar_error(
            f"Unknown reduction operation {op!r}; use one of {', '.join(o.value for o in Operation)}") from None


class ReduceParams:
    """``popops::ReduceParams(op, update=False, scale=None)``.

    ``scale`` (a Python float or a one-element FLOAT/HALF tensor) multiplies the result (for
    LOG_ADD it is added, as in log space); ``update`` makes the reduction ``out += result`` (LOG_ADD:
    ``out = logaddexp(out, result)``). Both are only valid with ADD, SQUARE_ADD and LOG_ADD.
    """

    def __init__(self, op, update: bool = False, scale=None):
        self.op = as_operation(op)
        self.update = bool(update)
        self.scale = scale

    @property
    def useScale(self) -> bool:  # noqa: N802 - PopLibs field name
        return self.scale is not None

    def __repr__(self):
        return f"ReduceParams({self.op}, update={self.update}, scale={self.scale!r})"


@dataclass
class SingleReduceOp:
    """``popops::SingleReduceOp``: one reduction of a :func:`reduceMany` call."""

    in_: poplar.Tensor
    dims: list
    params: ReduceParams
    outType: poplar.Type | None = None  # noqa: N815 - PopLibs field name
    debugName: str = ""  # noqa: N815
    out: poplar.Tensor | None = field(default=None, repr=False)


def check_types(op: Operation, in_type, out_type, name):
    if op in (Operation.LOGICAL_AND, Operation.LOGICAL_OR):
        if in_type != poplar.BOOL or out_type != poplar.BOOL:
            raise poplar.graph_connection_error(
                f"{name}: {op} reduces bool tensors to bool, got {in_type} -> {out_type}; cast the input to BOOL first")
        return
    if in_type == poplar.BOOL:
        raise poplar.graph_connection_error(f"{name}: {op} does not take bool input; use LOGICAL_AND or LOGICAL_OR")
    if op in (Operation.MAX, Operation.MIN) and in_type != out_type:
        raise poplar.graph_connection_error(
            f"{name}: {op} needs the output type to equal the input type ({in_type}), got {out_type}")
    if op == Operation.LOG_ADD and not (in_type.is_float and out_type.is_float):
        raise poplar.graph_connection_error(f"{name}: LOG_ADD needs float or half tensors, got {in_type} -> {out_type}")
    if in_type.is_float != out_type.is_float:
        raise poplar.graph_connection_error(
            f"{name}: cannot reduce {in_type} into {out_type}; supported are float<->half and integer->same type")


def parse_options(options, in_type, op, name):
    opts = dict(options or {})
    known = {"accumType.interTile", "accumType.inVertex"}
    bad = [k for k in opts if k not in known]
    if bad:
        raise poplar.invalid_option(f"{name}: unknown option(s) {bad}; reduce takes {sorted(known)}")
    wide = in_type == poplar.HALF and op in (Operation.ADD, Operation.SQUARE_ADD, Operation.LOG_ADD)
    default = poplar.FLOAT if wide else in_type
    try:
        inter = poplar.types.as_type(opts["accumType.interTile"]) if "accumType.interTile" in opts else default
        invertex = poplar.types.as_type(opts["accumType.inVertex"]) if "accumType.inVertex" in opts else default
    except Exception:
        raise poplar.invalid_option(f"{name}: accumType options take 'float' or 'half'") from None
    if in_type.is_float and (inter not in (poplar.FLOAT, poplar.HALF) or invertex not in (poplar.FLOAT, poplar.HALF)):
        raise poplar.invalid_option(f"{name}: accumType options take 'float' or 'half'")
    if not in_type.is_float:
        inter = invertex = in_type
    return inter, invertex


def check_dims(in_, dims, name):
    try:
        dims = [int(d) for d in dims]
    except TypeError:
        raise poplar.index_error(f"{name}: dims must be a list of dimension indices, got {dims!r}") from None
    r = in_.rank()
    for d in dims:
        if not 0 <= d < r:
            raise poplar.index_error(f"{name}: dimension {d} is out of range for a tensor of rank {r} (shape {in_.shape()})")
    if len(set(dims)) != len(dims):
        raise poplar.index_error(f"{name}: dims {dims} repeat a dimension; list each reduced dimension once")
    return sorted(dims)
