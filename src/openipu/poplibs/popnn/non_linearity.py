"""``popnn``: non-linearities (PopLibs ``include/popnn/NonLinearity.hpp``, ``NonLinearityDef.hpp``,
``LogSoftmax.hpp``).

Elementwise types (SIGMOID, RELU, TANH, GELU, GELU_ERF, SWISH, HARD_SIGMOID) add one compute set
following the tile mapping of the tensor: a ``NonLinearity1D`` (or ``popops::UnaryOp1D`` for
SIGMOID/RELU/TANH, as PopLibs does) MultiVertex per tile, costed with PopLibs'
``nonLinearity1DCycleEstimator`` shape (see :mod:`openipu.poplibs.popnn._common`).

SOFTMAX types work over the innermost dimension, as PopLibs' ``softmaxImpl``: (stable variants)
a max-reduce per row, then ``exp(x - max)`` elementwise, a float add-reduce per row, then a
multiply by ``scale / sum`` (``scale = SOFTMAX_SCALING`` for SOFTMAX_SCALED, else 1). The
gradient is ``g*y - y*sum(g*y)`` (``softmaxInputGradientImpl``).

Gradients (``nonLinearityInputGradient``) take ``out`` = the forward *output* for SIGMOID, RELU,
TANH and the softmaxes, and the forward *input* for GELU, GELU_ERF, SWISH and HARD_SIGMOID (their
derivatives are functions of the input, as in PopLibs' ``nonlinearity_derivative``).
"""

from __future__ import annotations

import enum
import functools
import math

import torch

from openipu import poplar
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popnn._common import (GRAD_OP_CYCLES, add_elementwise, as_rows, check_mapped, output_like,
                                           poplibs_error, row_output)
from openipu.poplibs.popops.reduce import Operation, reduceWithOutput

__all__ = ["NonLinearityType", "SOFTMAX_SCALING", "nonLinearity", "nonLinearityInPlace", "nonLinearityInputGradient",
           "nonLinearityScaling", "sigmoid", "relu", "tanh", "gelu", "swish", "softmax", "softmaxStable",
           "scaledSoftmaxStable", "sigmoidInPlace", "reluInPlace", "tanhInPlace", "geluInPlace", "swishInPlace",
           "softmaxInPlace", "softmaxStableInPlace", "scaledSoftmaxStableInPlace", "logSoftmax", "logSoftmaxInPlace"]

#: Output scale of SOFTMAX_SCALED (PopLibs ``lib/popnn/NonLinearityInternal.hpp``: 62000, kept below
#: max half 65504 so ``exp(log(scale) + rounding)`` cannot overflow).
SOFTMAX_SCALING = 62000.0


class NonLinearityType(enum.Enum):
    """``popnn::NonLinearityType`` (SDK 2.x/3.x ``NonLinearityDef.hpp``)."""

    SIGMOID = "SIGMOID"
    HARD_SIGMOID = "HARD_SIGMOID"   # max(0, min(1, 0.2 x + 0.5))
    RELU = "RELU"
    TANH = "TANH"
    GELU = "GELU"                   # tanh approximation
    GELU_ERF = "GELU_ERF"           # exact, with erf
    SWISH = "SWISH"                 # x * sigmoid(x)
    SOFTMAX = "SOFTMAX"
    SOFTMAX_STABLE = "SOFTMAX_STABLE"
    SOFTMAX_SCALED = "SOFTMAX_SCALED"

    def __str__(self):
        return self.name


_SOFTMAXES = (NonLinearityType.SOFTMAX, NonLinearityType.SOFTMAX_STABLE, NonLinearityType.SOFTMAX_SCALED)
_POPOPS = (NonLinearityType.SIGMOID, NonLinearityType.RELU, NonLinearityType.TANH)
_GELU_A, _GELU_B = 0.7978845608, 0.044715   # PopLibs' tanh approximation constants


def _as_type(nl) -> NonLinearityType:
    if isinstance(nl, NonLinearityType):
        return nl
    try:
        return NonLinearityType[str(nl).split(".")[-1].upper()]
    except KeyError:
        raise poplibs_error(f"Unknown non-linearity type {nl!r}; use one of "
                            f"{', '.join(t.name for t in NonLinearityType)}") from None


def nonLinearityScaling(nl) -> float:  # noqa: N802
    """The output scaling of ``nl``: ``SOFTMAX_SCALING`` for SOFTMAX_SCALED, else 1.0 (what
    PopLibs returns through the ``float &nonLinearityScaling`` overloads)."""
    return SOFTMAX_SCALING if _as_type(nl) == NonLinearityType.SOFTMAX_SCALED else 1.0


def _fwd(nl: str, x: torch.Tensor) -> torch.Tensor:
    if nl == "SIGMOID":
        return torch.sigmoid(x)
    if nl == "RELU":
        return torch.relu(x)
    if nl == "TANH":
        return torch.tanh(x)
    if nl == "GELU":
        return 0.5 * x * (1 + torch.tanh(x * _GELU_A * (1 + _GELU_B * x * x)))
    if nl == "GELU_ERF":
        return 0.5 * x * (1 + torch.erf(x * (1 / math.sqrt(2))))
    if nl == "SWISH":
        return x * torch.sigmoid(x)
    if nl == "HARD_SIGMOID":
        return torch.clamp(0.2 * x + 0.5, 0.0, 1.0)
    raise AssertionError(nl)


def _deriv(nl: str, a: torch.Tensor) -> torch.Tensor:
    """d out / d in as a function of ``a`` (the output for SIGMOID/RELU/TANH, else the input)."""
    if nl == "SIGMOID":
        return a * (1 - a)
    if nl == "RELU":
        return (a > 0).to(a.dtype)
    if nl == "TANH":
        return 1 - a * a
    if nl == "GELU":
        t = torch.tanh(a * _GELU_A * (1 + _GELU_B * a * a))
        return 0.5 * (1 + t + (1 - t * t) * a * (_GELU_A + 3 * a * a * _GELU_A * _GELU_B))
    if nl == "GELU_ERF":
        y = a * (1 / math.sqrt(2))
        return 0.5 * (1 + torch.erf(y) + y * (2 / math.sqrt(math.pi)) * torch.exp(-y * y))
    if nl == "SWISH":
        s = torch.sigmoid(a)
        return s * (1 + a * (1 - s))
    if nl == "HARD_SIGMOID":
        return (a.abs() <= 2.5).to(a.dtype) * 0.2
    raise AssertionError(nl)


@kernel
def _nl_kernel(nl, src, dst, ctx):
    ctx.write(dst, _fwd(nl, ctx.read(src)))


@kernel
def _nl_grad_kernel(nl, out, grad, dst, ctx):
    ctx.write(dst, ctx.read(grad) * _deriv(nl, ctx.read(out)))


def _check_float(t, what):
    if not isinstance(t, poplar.Tensor):
        raise poplibs_error(f"{what}: expected a poplar Tensor, got {type(t).__name__}")
    if t.elementType() not in (poplar.FLOAT, poplar.HALF):
        raise poplibs_error(f"{what}: non-linearities need a float or half tensor, got {t.elementType()}")


def _elementwise(graph, nl: NonLinearityType, t, out, prog, name):
    if nl in _POPOPS:
        vname = f"popops::UnaryOp1D<popops::expr::UnaryOpType::{nl.name},{t.elementType()}>"
    else:
        vname = f"popnn::NonLinearity1D{'InPlace' if out is t else ''}<{t.elementType()},popnn::NonLinearityType::{nl.name}>"
    flops = {"GELU": 8, "SWISH": 2, "GELU_ERF": 8, "HARD_SIGMOID": 3}.get(nl.name, 1)
    add_elementwise(graph, prog, name, vname, out, [t], functools.partial(_nl_kernel, nl.name, t, out),
                    nl.name, flops)
    return out


# -- softmax -------------------------------------------------------------------------------
@kernel
def _exp_kernel(x, mx, out, ctx):
    v = ctx.read(x)
    if mx is not None:
        v = v - ctx.read(mx).to(v.dtype)
    ctx.write(out, torch.exp(v))


@kernel
def _scale_kernel(e, s, out, scale, ctx):
    v = ctx.read(e)
    inv = (scale / ctx.read(s).to(torch.float32)).to(v.dtype)
    ctx.write(out, v * inv)


def _row_reduce(graph, rows, op, out_type, prog, name):
    """``popops.reduceWithOutput`` of each row of ``rows`` into a new ``[rows]`` tensor of ``out_type``."""
    out = row_output(graph, out_type, rows, f"{name}/out")
    reduceWithOutput(graph, rows, out, [1], op, prog, name)
    return out


def _row_view(rows2d_stat, shape):
    """A ``[rows]`` statistic viewed with the shape of the tensor whose rows it summarises."""
    return rows2d_stat.reshape(list(shape[:-1]) + [1])


def _softmax(graph, t, out, stable: bool, scaled: bool, prog, name):
    if t.rank() < 1:
        raise poplibs_error(f"{name}: input tensor to softmax non-linearity must have at least 1 dimension")
    rows = as_rows(t)
    mx = None
    if stable:
        mx = _row_reduce(graph, rows, Operation.MAX, t.elementType(), prog, f"{name}/ReduceMax")
        mx = _row_view(mx, t.shape())
    add_elementwise(graph, prog, f"{name}/Exp", f"popops::BinaryOp1D<SUBTRACT_EXP,{t.elementType()}>", out,
                    [t] + ([mx] if mx is not None else []), functools.partial(_exp_kernel, t, mx, out),
                    "EXP", 2 if stable else 1)
    s = _row_reduce(graph, as_rows(out), Operation.ADD, poplar.FLOAT, prog, f"{name}/ReduceAdd")
    add_elementwise(graph, prog, f"{name}/invScale", f"popops::BinaryOp1DInPlace<MULTIPLY,{t.elementType()}>", out,
                    [out, _row_view(s, t.shape())],
                    functools.partial(_scale_kernel, out, _row_view(s, t.shape()), out,
                                      SOFTMAX_SCALING if scaled else 1.0), "MUL", 1)
    return out


@kernel
def _softmax_grad_mul(y, g, dst, ctx):
    ctx.write(dst, ctx.read(y) * ctx.read(g))


@kernel
def _softmax_grad_final(gy, y, s, dst, ctx):
    v = ctx.read(gy)
    ctx.write(dst, v - ctx.read(y) * ctx.read(s).to(v.dtype))


def _softmax_grad(graph, out, grad, prog, name):
    if list(out.shape()) != list(grad.shape()):
        raise poplibs_error(f"{name}: out and outGradient tensors must have the same shape for softmax gradient "
                            f"calculation (got {out.shape()} and {grad.shape()})")
    gy = output_like(graph, out.elementType(), out.shape(), (grad, out), f"{name}/gXy")
    add_elementwise(graph, prog, f"{name}/gXy", f"popops::BinaryOp1D<MULTIPLY,{out.elementType()}>", gy, [out, grad],
                    functools.partial(_softmax_grad_mul, out, grad, gy), "MUL")
    s = _row_reduce(graph, as_rows(gy), Operation.ADD, out.elementType(), prog, f"{name}/sumgXy")
    sv = _row_view(s, out.shape())
    add_elementwise(graph, prog, f"{name}/sub", f"popops::BinaryOp1DInPlace<SUBTRACT,{out.elementType()}>", gy,
                    [gy, out, sv], functools.partial(_softmax_grad_final, gy, out, sv, gy), "AXPBY", 2)
    return gy


# -- public API ------------------------------------------------------------------------------
def nonLinearity(graph, nonLinearityType, t, prog, debug_name: str = ""):  # noqa: N802
    """Apply ``nonLinearityType`` to ``t``; returns a new tensor mapped like ``t``
    (``popnn::nonLinearity``). Softmax types work over the innermost dimension.

    ``t``: float or half, any shape (rank >= 1 for softmax). Appends 1 compute set (elementwise)
    or 3-4 (softmax) to ``prog``.

    Raises:
        poplibs_error: not a float/half tensor, an unknown type, or a scalar given to softmax.
        poplar.invalid_tile_mapping: ``t`` is not completely mapped.
    """
    nl = _as_type(nonLinearityType)
    name = debug_name or "Nonlinearity"
    _check_float(t, name)
    check_mapped(graph, t, name)
    out = output_like(graph, t.elementType(), t.shape(), (t,), f"{name}/out")
    if nl in _SOFTMAXES:
        return _softmax(graph, t, out, nl != NonLinearityType.SOFTMAX, nl == NonLinearityType.SOFTMAX_SCALED, prog,
                        f"{name}/SoftMax")
    return _elementwise(graph, nl, t, out, prog, name)


def nonLinearityInPlace(graph, nonLinearityType, t, prog, debug_name: str = "") -> None:  # noqa: N802
    """Apply ``nonLinearityType`` to ``t`` in place (``popnn::nonLinearityInPlace``).

    Raises:
        poplibs_error: as :func:`nonLinearity`, or ``t`` cannot be written in parallel
            (contains constants or aliased elements).
    """
    nl = _as_type(nonLinearityType)
    name = debug_name or "Nonlinearity"
    _check_float(t, name)
    check_mapped(graph, t, name)
    if not t.isParallelWriteable():
        raise poplibs_error(f"{name}: Trying to update tensor that cannot be written in parallel "
                            f"({t.shortString()} contains constants or aliased elements); use nonLinearity")
    if nl in _SOFTMAXES:
        _softmax(graph, t, t, nl != NonLinearityType.SOFTMAX, nl == NonLinearityType.SOFTMAX_SCALED, prog,
                 f"{name}/SoftMax")
    else:
        _elementwise(graph, nl, t, t, prog, name)


def nonLinearityInputGradient(graph, nonLinearityType, out, outGradient, prog, debug_name: str = ""):  # noqa: N802,N803
    """Gradient w.r.t. the non-linearity's input (``popnn::nonLinearityInputGradient``).

    ``out``: the forward output (SIGMOID, RELU, TANH, softmaxes) or the forward input (GELU,
    GELU_ERF, SWISH, HARD_SIGMOID); ``outGradient``: gradient w.r.t. the output, same shape and
    type. Returns a new tensor mapped like ``out``. Cost: one ``NonLinearityGrad1D`` MultiVertex
    per tile (3 compute sets for softmax).

    Raises:
        poplibs_error: shapes or types differ, or an unknown type.
    """
    nl = _as_type(nonLinearityType)
    name = debug_name or "NonLinearityGrad"
    _check_float(out, name)
    _check_float(outGradient, name)
    if out.elementType() != outGradient.elementType():
        raise poplibs_error(f"{name}: out ({out.elementType()}) and outGradient ({outGradient.elementType()}) types differ")
    if list(out.shape()) != list(outGradient.shape()):
        raise poplibs_error(f"{name}: out {out.shape()} and outGradient {outGradient.shape()} shapes differ")
    check_mapped(graph, out, name)
    if nl in _SOFTMAXES:
        return _softmax_grad(graph, out, outGradient, prog, f"{name}/SoftMaxGradient")
    g = output_like(graph, out.elementType(), out.shape(), (out,), f"{name}/inGrad")
    vname = f"popnn::NonLinearityGrad1D<{out.elementType()},popnn::NonLinearityType::{nl.name}>"
    flops = {"GELU": 15, "SWISH": 5, "RELU": 1, "SIGMOID": 2, "TANH": 2, "GELU_ERF": 15, "HARD_SIGMOID": 3}[nl.name]
    add_elementwise(graph, prog, name, vname, g, [out, outGradient],
                    functools.partial(_nl_grad_kernel, nl.name, out, outGradient, g), GRAD_OP_CYCLES[nl.name], flops)
    return g


def _named(nl, in_place):
    def f(graph, t, prog, debug_name: str = ""):
        return (nonLinearityInPlace if in_place else nonLinearity)(graph, nl, t, prog, debug_name)
    f.__doc__ = f"``nonLinearity{'InPlace' if in_place else ''}(graph, NonLinearityType.{nl.name}, t, prog)``."
    return f


sigmoid, sigmoidInPlace = _named(NonLinearityType.SIGMOID, False), _named(NonLinearityType.SIGMOID, True)
relu, reluInPlace = _named(NonLinearityType.RELU, False), _named(NonLinearityType.RELU, True)
tanh, tanhInPlace = _named(NonLinearityType.TANH, False), _named(NonLinearityType.TANH, True)
gelu, geluInPlace = _named(NonLinearityType.GELU, False), _named(NonLinearityType.GELU, True)
swish, swishInPlace = _named(NonLinearityType.SWISH, False), _named(NonLinearityType.SWISH, True)
softmax, softmaxInPlace = _named(NonLinearityType.SOFTMAX, False), _named(NonLinearityType.SOFTMAX, True)
softmaxStable = _named(NonLinearityType.SOFTMAX_STABLE, False)
softmaxStableInPlace = _named(NonLinearityType.SOFTMAX_STABLE, True)
scaledSoftmaxStable = _named(NonLinearityType.SOFTMAX_SCALED, False)
scaledSoftmaxStableInPlace = _named(NonLinearityType.SOFTMAX_SCALED, True)


# -- log softmax -----------------------------------------------------------------------------
@kernel
def _log_softmax_final(x, mx, s, dst, ctx):
    v = ctx.read(x)
    ctx.write(dst, v - ctx.read(mx).to(v.dtype) - torch.log(ctx.read(s)).to(v.dtype))


def _log_softmax(graph, t, out, prog, name):
    _check_float(t, name)
    check_mapped(graph, t, name)
    if t.rank() < 1:
        raise poplibs_error(f"{name}: input to logSoftmax must have at least 1 dimension")
    rows = as_rows(t)
    mx = _row_reduce(graph, rows, Operation.MAX, t.elementType(), prog, f"{name}/ReduceMax")
    mxv = _row_view(mx, t.shape())
    e = output_like(graph, t.elementType(), t.shape(), (t,), f"{name}/exp")
    add_elementwise(graph, prog, f"{name}/Exp", f"popops::BinaryOp1D<SUBTRACT_EXP,{t.elementType()}>", e, [t, mxv],
                    functools.partial(_exp_kernel, t, mxv, e), "EXP", 2)
    s = _row_reduce(graph, as_rows(e), Operation.ADD, poplar.FLOAT, prog, f"{name}/ReduceAdd")
    sv = _row_view(s, t.shape())
    add_elementwise(graph, prog, f"{name}/SubLog", f"popops::Map<SUB_LOG,{t.elementType()}>", out, [t, mxv, sv],
                    functools.partial(_log_softmax_final, t, mxv, sv, out), "LOG", 3)
    return out


def logSoftmax(graph, t, prog, debug_name: str = ""):  # noqa: N802
    """``log(softmax(t))`` over the innermost dimension, computed stably as ``x - max - log(sum
    exp(x - max))`` (``popnn::logSoftmax``). Returns a new tensor mapped like ``t``."""
    name = debug_name or "LogSoftmax"
    _check_float(t, name)
    out = output_like(graph, t.elementType(), t.shape(), (t,), f"{name}/out")
    return _log_softmax(graph, t, out, prog, name)


def logSoftmaxInPlace(graph, t, prog, debug_name: str = "") -> None:  # noqa: N802
    """In-place :func:`logSoftmax` (``popnn::logSoftmaxInPlace``)."""
    name = debug_name or "LogSoftmax"
    _check_float(t, name)
    if not t.isParallelWriteable():
        raise poplibs_error(f"{name}: tensor {t.shortString()} cannot be written in parallel")
    _log_softmax(graph, t, t, prog, name)


def _register_records():
    from openipu.poplar.graph_codec import data_enum
    data_enum(NonLinearityType)


_register_records()
