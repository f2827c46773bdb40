"""``popops::expr``: elementwise expressions (PopLibs ``include/popops/Expr.hpp``, ``ExprOp.hpp``).

An expression is a tree of :class:`Expr` nodes: placeholders ``_1 .. _20`` (the tensors given to
``popops.map``), constants (:class:`Const`, :class:`ConstHalf`), :class:`Cast`, and unary, binary
and ternary operator nodes. Node classes carry PopLibs' names (``Add``, ``Mul``, ``Exp``,
``Select``, ``Clamp`` ...); a few operators that PopLibs only reaches through
``UnaryOp(UnaryOpType.X, e)`` also get a class here (``Relu``, ``Popcount``,
``CountLeadingZeros``, ``NearbyInt``: openipu additions).

Python operators build nodes as PopLibs' C++ operators do: ``+ - * / %``, ``& | ^`` (bitwise),
``<< >>``, unary ``-`` (:class:`Neg`) and ``~`` (:class:`BitwiseNot`), and the comparisons
``== != < <= > >=``. Python numbers on either side become :class:`Const`. Python cannot overload
``not``/``and``/``or``: use :class:`Not`, :class:`And`, :class:`Or`. Because ``==`` builds an
expression, compare trees with :meth:`Expr.deepEquals`; an expression has no truth value.

The enum member lists follow PopLibs' ``ExprOp.hpp`` as of SDK 3.x (``popops/codelets``
``elemwiseUnaryCodelets.cpp`` for ``EXPONENT2``, ``GELU_ERF``, ``RELU``, ``TRUNC``; popart's
``NearbyIntComputex`` for ``NEARBY_INT``).
"""

from __future__ import annotations

import enum

from openipu import poplar
from openipu.poplar.types import Type, as_type


class UnaryOpType(enum.Enum):
    """``popops::expr::UnaryOpType``."""

    ABSOLUTE = enum.auto()
    ASIN = enum.auto()
    BITWISE_NOT = enum.auto()
    CBRT = enum.auto()
    CEIL = enum.auto()
    COS = enum.auto()
    COUNT_LEADING_ZEROS = enum.auto()
    ERF = enum.auto()
    EXPONENT = enum.auto()
    EXPONENT_MINUS_ONE = enum.auto()
    EXPONENT2 = enum.auto()
    FLOOR = enum.auto()
    GELU_ERF = enum.auto()
    INVERSE = enum.auto()
    IS_FINITE = enum.auto()
    IS_INF = enum.auto()
    IS_NAN = enum.auto()
    LOGARITHM = enum.auto()
    LOGARITHM_ONE_PLUS = enum.auto()
    LOGICAL_NOT = enum.auto()
    NEARBY_INT = enum.auto()
    NEGATE = enum.auto()
    POPCOUNT = enum.auto()
    RELU = enum.auto()
    SIGNUM = enum.auto()
    SIN = enum.auto()
    TAN = enum.auto()
    TANH = enum.auto()
    ROUND = enum.auto()
    TRUNC = enum.auto()
    SQRT = enum.auto()
    SQUARE = enum.auto()
    SIGMOID = enum.auto()
    RSQRT = enum.auto()


class BinaryOpType(enum.Enum):
    """``popops::expr::BinaryOpType``."""

    ADD = enum.auto()
    ATAN2 = enum.auto()
    BITWISE_AND = enum.auto()
    BITWISE_OR = enum.auto()
    BITWISE_XOR = enum.auto()
    BITWISE_XNOR = enum.auto()
    DIVIDE = enum.auto()
    EQUAL = enum.auto()
    GREATER_THAN_EQUAL = enum.auto()
    GREATER_THAN = enum.auto()
    INV_STD_DEV_TO_VARIANCE = enum.auto()
    LESS_THAN_EQUAL = enum.auto()
    LOGICAL_AND = enum.auto()
    LOGICAL_OR = enum.auto()
    LESS_THAN = enum.auto()
    MAXIMUM = enum.auto()
    MINIMUM = enum.auto()
    MULTIPLY = enum.auto()
    NOT_EQUAL = enum.auto()
    POWER = enum.auto()
    REMAINDER = enum.auto()
    SHIFT_LEFT = enum.auto()
    SHIFT_RIGHT = enum.auto()
    SHIFT_RIGHT_SIGN_EXTEND = enum.auto()
    SUBTRACT = enum.auto()
    VARIANCE_TO_INV_STD_DEV = enum.auto()


class TernaryOpType(enum.Enum):
    """``popops::expr::TernaryOpType``."""

    CLAMP = enum.auto()
    SELECT = enum.auto()


def _wrap(x) -> "Expr":
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, int, float)) or hasattr(x, "dtype"):
        return Const(x)
    raise TypeError(f"cannot use {type(x).__name__} in a popops expression; use an Expr, an int, a float or a bool")


class Expr:
    """Base of every expression node (``popops::expr::Expr``)."""

    __slots__ = ()

    # -- operators (PopLibs' POPLIBS_DEFINE_EXPR_*_AND_SYMBOL) ---------------------------------
    def __add__(self, o): return Add(self, _wrap(o))  # noqa: E704
    def __radd__(self, o): return Add(_wrap(o), self)  # noqa: E704
    def __sub__(self, o): return Sub(self, _wrap(o))  # noqa: E704
    def __rsub__(self, o): return Sub(_wrap(o), self)  # noqa: E704
    def __mul__(self, o): return Mul(self, _wrap(o))  # noqa: E704
    def __rmul__(self, o): return Mul(_wrap(o), self)  # noqa: E704
    def __truediv__(self, o): return Divide(self, _wrap(o))  # noqa: E704
    def __rtruediv__(self, o): return Divide(_wrap(o), self)  # noqa: E704
    def __mod__(self, o): return Rem(self, _wrap(o))  # noqa: E704
    def __rmod__(self, o): return Rem(_wrap(o), self)  # noqa: E704
    def __and__(self, o): return BitwiseAnd(self, _wrap(o))  # noqa: E704
    def __rand__(self, o): return BitwiseAnd(_wrap(o), self)  # noqa: E704
    def __or__(self, o): return BitwiseOr(self, _wrap(o))  # noqa: E704
    def __ror__(self, o): return BitwiseOr(_wrap(o), self)  # noqa: E704
    def __xor__(self, o): return BitwiseXor(self, _wrap(o))  # noqa: E704
    def __rxor__(self, o): return BitwiseXor(_wrap(o), self)  # noqa: E704
    def __lshift__(self, o): return Shl(self, _wrap(o))  # noqa: E704
    def __rlshift__(self, o): return Shl(_wrap(o), self)  # noqa: E704
    def __rshift__(self, o): return Shr(self, _wrap(o))  # noqa: E704
    def __rrshift__(self, o): return Shr(_wrap(o), self)  # noqa: E704
    def __neg__(self): return Neg(self)  # noqa: E704
    def __invert__(self): return BitwiseNot(self)  # noqa: E704
    def __eq__(self, o): return Equal(self, _wrap(o))  # noqa: E704
    def __ne__(self, o): return NotEqual(self, _wrap(o))  # noqa: E704
    def __lt__(self, o): return Lt(self, _wrap(o))  # noqa: E704
    def __le__(self, o): return Lte(self, _wrap(o))  # noqa: E704
    def __gt__(self, o): return Gt(self, _wrap(o))  # noqa: E704
    def __ge__(self, o): return Gte(self, _wrap(o))  # noqa: E704
    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError("a popops expression has no truth value (== builds an Equal node); use deepEquals()")

    # -- introspection -------------------------------------------------------------------------
    def children(self) -> tuple:
        return ()

    def deepEquals(self, other) -> bool:  # noqa: N802 - PopLibs spelling
        """Structural equality (PopLibs ``expr::deepEquals``)."""
        return type(self) is type(other) and self._key() == other._key() and len(self.children()) == len(
            other.children()) and all(a.deepEquals(b) for a, b in zip(self.children(), other.children()))

    def _key(self):
        return ()

    def clone(self) -> "Expr":
        return self   # nodes are immutable

    def placeholders(self) -> set[int]:
        """Indices (1-based) of the placeholders the expression uses."""
        out: set[int] = set()
        stack = [self]
        while stack:
            e = stack.pop()
            if isinstance(e, PlaceHolder):
                out.add(e.index)
            stack.extend(e.children())
        return out

    def num_ops(self) -> int:
        """Operator nodes (unary, binary, ternary) in the tree: PopLibs' ``numFusedOps``."""
        return int(isinstance(self, (UnaryOp, BinaryOp, TernaryOp))) + sum(c.num_ops() for c in self.children())


class Const(Expr):
    """A constant (``expr::Const``). ``type`` defaults from the Python value (bool -> BOOL,
    int -> INT, float -> FLOAT, numpy scalars by dtype); PopLibs gives an untyped-by-context
    constant the type of the operand beside it, and ``map`` does the same."""

    __slots__ = ("value", "type", "explicit")

    def __init__(self, value, type_=None):
        if hasattr(value, "dtype") and getattr(value, "shape", ()) == ():
            t = as_type(value.dtype)
            value = value.item()
        elif isinstance(value, bool):
            t = poplar.BOOL
        elif isinstance(value, int):
            t = poplar.INT
        elif isinstance(value, float):
            t = poplar.FLOAT
        else:
            raise TypeError(f"Const needs a scalar int, float or bool, got {type(value).__name__}")
        self.value = value
        self.type: Type = as_type(type_) if type_ is not None else t
        self.explicit = type_ is not None

    def getType(self) -> Type:  # noqa: N802
        return self.type

    def getDataAsDouble(self) -> float:  # noqa: N802
        return float(self.value)

    def _key(self):
        return (self.value, self.type.name)

    def __repr__(self):
        return f"Const({self.value!r})"


class ConstHalf(Const):
    """A constant of type half (``expr::ConstHalf``)."""

    __slots__ = ()

    def __init__(self, value: float):
        super().__init__(float(value), poplar.HALF)


class Cast(Expr):
    """``Cast(e, type)``: convert ``e`` to ``type`` (``expr::Cast``)."""

    __slots__ = ("a", "type")

    def __init__(self, a, type_):
        self.a = _wrap(a)
        self.type: Type = as_type(type_)

    def children(self):
        return (self.a,)

    def getLHS(self):  # noqa: N802
        return self.a

    def getRHSType(self) -> Type:  # noqa: N802
        return self.type

    def _key(self):
        return (self.type.name,)

    def __repr__(self):
        return f"Cast({self.a!r}, {self.type})"


class PlaceHolder(Expr):
    """The ``index``-th tensor (1-based) given to ``map`` (``expr::PlaceHolder``)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        if int(index) < 1:
            raise poplar.index_error(f"placeholder index must be >= 1, got {index}")
        self.index = int(index)

    def getIndex(self) -> int:  # noqa: N802
        return self.index

    def _key(self):
        return (self.index,)

    def __repr__(self):
        return f"_{self.index}"


_1, _2, _3, _4, _5, _6, _7, _8, _9, _10 = (PlaceHolder(i) for i in range(1, 11))
_11, _12, _13, _14, _15, _16, _17, _18, _19, _20 = (PlaceHolder(i) for i in range(11, 21))


def _op_repr(e) -> str:
    args = ", ".join(repr(c) for c in e.children())
    return f"{type(e).__name__}({args})" if e.OP else f"{type(e).__name__}({e.op.name}, {args})"


class UnaryOp(Expr):
    """``UnaryOp(UnaryOpType.X, a)`` (``expr::UnaryOp``)."""

    __slots__ = ("op", "a")
    OP: UnaryOpType | None = None

    def __init__(self, *args):
        if self.OP is None:
            op, a = args
        else:
            (a,) = args
            op = self.OP
        if not isinstance(op, UnaryOpType):
            raise TypeError(f"UnaryOp needs a UnaryOpType, got {op!r}")
        self.op, self.a = op, _wrap(a)

    def children(self):
        return (self.a,)

    def getOpType(self) -> UnaryOpType:  # noqa: N802
        return self.op

    def getArg(self):  # noqa: N802
        return self.a

    def _key(self):
        return (self.op,)

    def __repr__(self):
        return _op_repr(self)


class BinaryOp(Expr):
    """``BinaryOp(BinaryOpType.X, a, b)`` (``expr::BinaryOp``)."""

    __slots__ = ("op", "a", "b")
    OP: BinaryOpType | None = None

    def __init__(self, *args):
        if self.OP is None:
            op, a, b = args
        else:
            a, b = args
            op = self.OP
        if not isinstance(op, BinaryOpType):
            raise TypeError(f"BinaryOp needs a BinaryOpType, got {op!r}")
        self.op, self.a, self.b = op, _wrap(a), _wrap(b)

    def children(self):
        return (self.a, self.b)

    def getOpType(self) -> BinaryOpType:  # noqa: N802
        return self.op

    def getLHS(self):  # noqa: N802
        return self.a

    def getRHS(self):  # noqa: N802
        return self.b

    def _key(self):
        return (self.op,)

    def __repr__(self):
        return _op_repr(self)


class TernaryOp(Expr):
    """``TernaryOp(TernaryOpType.X, a, b, c)`` (``expr::TernaryOp``). ``Select(a, b, c)`` is
    ``c ? a : b``; ``Clamp(a, lo, hi)`` is ``max(lo, min(a, hi))``."""

    __slots__ = ("op", "a", "b", "c")
    OP: TernaryOpType | None = None

    def __init__(self, *args):
        if self.OP is None:
            op, a, b, c = args
        else:
            a, b, c = args
            op = self.OP
        if not isinstance(op, TernaryOpType):
            raise TypeError(f"TernaryOp needs a TernaryOpType, got {op!r}")
        self.op, self.a, self.b, self.c = op, _wrap(a), _wrap(b), _wrap(c)

    def children(self):
        return (self.a, self.b, self.c)

    def getOpType(self) -> TernaryOpType:  # noqa: N802
        return self.op

    def getArg0(self):  # noqa: N802
        return self.a

    def getArg1(self):  # noqa: N802
        return self.b

    def getArg2(self):  # noqa: N802
        return self.c

    def _key(self):
        return (self.op,)

    def __repr__(self):
        return _op_repr(self)


def _node_class(name: str, base: type, op) -> type:
    """A PopLibs named node class (Expr.hpp ``POPLIBS_DEFINE_EXPR_*_OP``): ``base`` fixed to ``op``."""
    return type(name, (base,), {"__slots__": (), "OP": op, "__module__": __name__,
                                "__doc__": f"``{name}``: ``{base.__name__}({type(op).__name__}.{op.name}, ...)``."})


# PopLibs' named node classes (Expr.hpp).
Abs = _node_class("Abs", UnaryOp, UnaryOpType.ABSOLUTE)
Asin = _node_class("Asin", UnaryOp, UnaryOpType.ASIN)
BitwiseNot = _node_class("BitwiseNot", UnaryOp, UnaryOpType.BITWISE_NOT)
Cbrt = _node_class("Cbrt", UnaryOp, UnaryOpType.CBRT)
Erf = _node_class("Erf", UnaryOp, UnaryOpType.ERF)
Ceil = _node_class("Ceil", UnaryOp, UnaryOpType.CEIL)
Cos = _node_class("Cos", UnaryOp, UnaryOpType.COS)
Exp = _node_class("Exp", UnaryOp, UnaryOpType.EXPONENT)
Expm1 = _node_class("Expm1", UnaryOp, UnaryOpType.EXPONENT_MINUS_ONE)
Exp2 = _node_class("Exp2", UnaryOp, UnaryOpType.EXPONENT2)
Floor = _node_class("Floor", UnaryOp, UnaryOpType.FLOOR)
GeluErf = _node_class("GeluErf", UnaryOp, UnaryOpType.GELU_ERF)
Inv = _node_class("Inv", UnaryOp, UnaryOpType.INVERSE)
IsFinite = _node_class("IsFinite", UnaryOp, UnaryOpType.IS_FINITE)
IsInf = _node_class("IsInf", UnaryOp, UnaryOpType.IS_INF)
IsNaN = _node_class("IsNaN", UnaryOp, UnaryOpType.IS_NAN)
Log = _node_class("Log", UnaryOp, UnaryOpType.LOGARITHM)
Log1p = _node_class("Log1p", UnaryOp, UnaryOpType.LOGARITHM_ONE_PLUS)
Not = _node_class("Not", UnaryOp, UnaryOpType.LOGICAL_NOT)
Neg = _node_class("Neg", UnaryOp, UnaryOpType.NEGATE)
Signum = _node_class("Signum", UnaryOp, UnaryOpType.SIGNUM)
Sin = _node_class("Sin", UnaryOp, UnaryOpType.SIN)
Tan = _node_class("Tan", UnaryOp, UnaryOpType.TAN)
Tanh = _node_class("Tanh", UnaryOp, UnaryOpType.TANH)
Round = _node_class("Round", UnaryOp, UnaryOpType.ROUND)
Trunc = _node_class("Trunc", UnaryOp, UnaryOpType.TRUNC)
Sqrt = _node_class("Sqrt", UnaryOp, UnaryOpType.SQRT)
Square = _node_class("Square", UnaryOp, UnaryOpType.SQUARE)
Sigmoid = _node_class("Sigmoid", UnaryOp, UnaryOpType.SIGMOID)
Rsqrt = _node_class("Rsqrt", UnaryOp, UnaryOpType.RSQRT)
# openipu additions: PopLibs reaches these only through UnaryOp(UnaryOpType.X, e).
Relu = _node_class("Relu", UnaryOp, UnaryOpType.RELU)
Popcount = _node_class("Popcount", UnaryOp, UnaryOpType.POPCOUNT)
CountLeadingZeros = _node_class("CountLeadingZeros", UnaryOp, UnaryOpType.COUNT_LEADING_ZEROS)
NearbyInt = _node_class("NearbyInt", UnaryOp, UnaryOpType.NEARBY_INT)
Add = _node_class("Add", BinaryOp, BinaryOpType.ADD)
Atan2 = _node_class("Atan2", BinaryOp, BinaryOpType.ATAN2)
BitwiseAnd = _node_class("BitwiseAnd", BinaryOp, BinaryOpType.BITWISE_AND)
BitwiseOr = _node_class("BitwiseOr", BinaryOp, BinaryOpType.BITWISE_OR)
BitwiseXor = _node_class("BitwiseXor", BinaryOp, BinaryOpType.BITWISE_XOR)
BitwiseXnor = _node_class("BitwiseXnor", BinaryOp, BinaryOpType.BITWISE_XNOR)
Divide = _node_class("Divide", BinaryOp, BinaryOpType.DIVIDE)
Equal = _node_class("Equal", BinaryOp, BinaryOpType.EQUAL)
Gte = _node_class("Gte", BinaryOp, BinaryOpType.GREATER_THAN_EQUAL)
Gt = _node_class("Gt", BinaryOp, BinaryOpType.GREATER_THAN)
Lte = _node_class("Lte", BinaryOp, BinaryOpType.LESS_THAN_EQUAL)
And = _node_class("And", BinaryOp, BinaryOpType.LOGICAL_AND)
Or = _node_class("Or", BinaryOp, BinaryOpType.LOGICAL_OR)
Lt = _node_class("Lt", BinaryOp, BinaryOpType.LESS_THAN)
InvStdDevToVariance = _node_class("InvStdDevToVariance", BinaryOp, BinaryOpType.INV_STD_DEV_TO_VARIANCE)
Max = _node_class("Max", BinaryOp, BinaryOpType.MAXIMUM)
Min = _node_class("Min", BinaryOp, BinaryOpType.MINIMUM)
Mul = _node_class("Mul", BinaryOp, BinaryOpType.MULTIPLY)
NotEqual = _node_class("NotEqual", BinaryOp, BinaryOpType.NOT_EQUAL)
Pow = _node_class("Pow", BinaryOp, BinaryOpType.POWER)
Rem = _node_class("Rem", BinaryOp, BinaryOpType.REMAINDER)
Shl = _node_class("Shl", BinaryOp, BinaryOpType.SHIFT_LEFT)
Shr = _node_class("Shr", BinaryOp, BinaryOpType.SHIFT_RIGHT)
ShrSE = _node_class("ShrSE", BinaryOp, BinaryOpType.SHIFT_RIGHT_SIGN_EXTEND)
Sub = _node_class("Sub", BinaryOp, BinaryOpType.SUBTRACT)
VarianceToInvStdDev = _node_class("VarianceToInvStdDev", BinaryOp, BinaryOpType.VARIANCE_TO_INV_STD_DEV)
Select = _node_class("Select", TernaryOp, TernaryOpType.SELECT)
Clamp = _node_class("Clamp", TernaryOp, TernaryOpType.CLAMP)

#: Node class name -> operator, per arity.
UNARY_NODES = {c.__name__: c.OP for c in (
    Abs, Asin, BitwiseNot, Cbrt, Erf, Ceil, Cos, Exp, Expm1, Exp2, Floor, GeluErf, Inv, IsFinite,
    IsInf, IsNaN, Log, Log1p, Not, Neg, Signum, Sin, Tan, Tanh, Round, Trunc, Sqrt, Square, Sigmoid,
    Rsqrt, Relu, Popcount, CountLeadingZeros, NearbyInt)}
BINARY_NODES = {c.__name__: c.OP for c in (
    Add, Atan2, BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseXnor, Divide, Equal, Gte, Gt, Lte, And,
    Or, Lt, InvStdDevToVariance, Max, Min, Mul, NotEqual, Pow, Rem, Shl, Shr, ShrSE, Sub,
    VarianceToInvStdDev)}
TERNARY_NODES = {c.__name__: c.OP for c in (Select, Clamp)}
#: The node class of each operator.
NODE_OF_OP = {op: globals()[name] for table in (UNARY_NODES, BINARY_NODES, TERNARY_NODES)
              for name, op in table.items()}

__all__ = ["Expr", "Const", "ConstHalf", "Cast", "PlaceHolder", "UnaryOp", "BinaryOp", "TernaryOp",
           "UnaryOpType", "BinaryOpType", "TernaryOpType", *[f"_{i}" for i in range(1, 21)],
           *UNARY_NODES, *BINARY_NODES, *TERNARY_NODES]


def _register_records():
    from openipu.poplar.graph_codec import data_enum
    data_enum(UnaryOpType)
    data_enum(BinaryOpType)
    data_enum(TernaryOpType)


_register_records()
