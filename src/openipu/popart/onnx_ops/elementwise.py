"""Elementwise ONNX operators: unary math, activations, binary arithmetic with numpy-style
broadcasting, comparisons, logical and bitwise ops, variadic Sum/Mean/Max/Min, Clip, Where, Cast."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import (
    FLOAT8, NARROW_UINT, compute_dtype, narrow, opt, scalar, torch_dtype, widen)


def _unary(fn, x):
    """``fn`` on ``x`` in a dtype torch computes in; result back in ``x``'s dtype."""
    dt = x.dtype
    cd = compute_dtype(dt)
    if dt == torch.bfloat16 or dt == torch.float16:
        return fn(x)
    r = fn(widen(x))
    return narrow(r, dt) if cd != dt and r.dtype == cd else r


def _unary_kernel(fn, inputs, attrs, opset):
    return [_unary(fn, inputs[0])]


_UNARY = {
    "Abs": torch.abs, "Neg": torch.neg, "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt,
    "Floor": torch.floor, "Ceil": torch.ceil, "Round": torch.round, "Sign": torch.sign,
    "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan, "Asin": torch.asin, "Acos": torch.acos,
    "Atan": torch.atan, "Sinh": torch.sinh, "Cosh": torch.cosh, "Asinh": torch.asinh,
    "Acosh": torch.acosh, "Atanh": torch.atanh, "Erf": torch.erf, "Sigmoid": torch.sigmoid,
    "Tanh": torch.tanh, "Relu": torch.relu, "Softsign": F.softsign, "Mish": F.mish,
    "Reciprocal": torch.reciprocal,
}
for _name, _fn in _UNARY.items():
    onnx_op(_name)(functools.partial(_unary_kernel, _fn))


@onnx_op("Softplus")
def softplus(inputs, attrs, opset):
    x = inputs[0]
    return [torch.where(x > 20, x, torch.log1p(torch.exp(x)))]


@onnx_op("IsNaN")
def isnan(inputs, attrs, opset):
    return [torch.isnan(inputs[0].float() if inputs[0].dtype in FLOAT8 else inputs[0])]


@onnx_op("IsInf")
def isinf(inputs, attrs, opset):
    x = inputs[0].float() if inputs[0].dtype in FLOAT8 else inputs[0]
    pos = attrs.get("detect_positive", 1)
    neg = attrs.get("detect_negative", 1)
    r = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    if pos:
        r |= torch.isposinf(x)
    if neg:
        r |= torch.isneginf(x)
    return [r]


# --- activations with attributes -------------------------------------------------------------

@onnx_op("LeakyRelu")
def leaky_relu(inputs, attrs, opset):
    return [F.leaky_relu(inputs[0], attrs.get("alpha", 0.01))]


@onnx_op("Elu")
def elu(inputs, attrs, opset):
    return [F.elu(inputs[0], attrs.get("alpha", 1.0))]


@onnx_op("Celu")
def celu(inputs, attrs, opset):
    return [F.celu(inputs[0], attrs.get("alpha", 1.0))]


@onnx_op("Selu")
def selu(inputs, attrs, opset):
    x = inputs[0]
    alpha = attrs.get("alpha", 1.67326319217681884765625)
    gamma = attrs.get("gamma", 1.05070102214813232421875)
    return [gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))]


@onnx_op("HardSigmoid")
def hard_sigmoid(inputs, attrs, opset):
    x = inputs[0]
    return [torch.clamp(attrs.get("alpha", 0.2) * x + attrs.get("beta", 0.5), 0, 1).to(x.dtype)]


@onnx_op("HardSwish")
def hard_swish(inputs, attrs, opset):
    x = inputs[0]
    return [x * torch.clamp(x / 6 + 0.5, 0, 1)]


@onnx_op("ThresholdedRelu")
def thresholded_relu(inputs, attrs, opset):
    x = inputs[0]
    return [torch.where(x > attrs.get("alpha", 1.0), x, torch.zeros_like(x))]


@onnx_op("Shrink")
def shrink(inputs, attrs, opset):
    x = inputs[0]
    bias, lambd = attrs.get("bias", 0.0), attrs.get("lambd", 0.5)
    xw = widen(x)
    r = torch.where(xw < -lambd, xw + bias, torch.where(xw > lambd, xw - bias, torch.zeros_like(xw)))
    return [narrow(r.to(xw.dtype), x.dtype)]


@onnx_op("PRelu")
def prelu(inputs, attrs, opset):
    x, slope = widen(inputs[0]), widen(inputs[1])
    if opset < 7 and slope.dim() == 1 and x.dim() > 2 and slope.numel() == x.shape[1] > 1:
        slope = slope.reshape((-1,) + (1,) * (x.dim() - 2))  # per channel (axis 1)
    return [narrow(torch.where(x < 0, x * slope, x).to(x.dtype), inputs[0].dtype)]


@onnx_op("Gelu")
def gelu(inputs, attrs, opset):
    return [F.gelu(inputs[0], approximate=attrs.get("approximate", "none"))]


@onnx_op("Swish")
def swish(inputs, attrs, opset):
    x = inputs[0]
    return [x * torch.sigmoid(attrs.get("alpha", 1.0) * x)]


# --- binary arithmetic -------------------------------------------------------------------------

def _binary(fn, a, b):
    """``fn(a, b)`` with broadcasting, computed in a dtype torch supports, result in ``a``'s dtype."""
    dt = a.dtype
    r = fn(widen(a), widen(b))
    if r.dtype != dt and r.dtype == compute_dtype(dt):
        r = narrow(r, dt)
    return r


@onnx_op("Add")
def add(inputs, attrs, opset):
    return [_binary(torch.add, inputs[0], inputs[1])]


@onnx_op("Sub")
def sub(inputs, attrs, opset):
    return [_binary(torch.sub, inputs[0], inputs[1])]


@onnx_op("Mul")
def mul(inputs, attrs, opset):
    return [_binary(torch.mul, inputs[0], inputs[1])]


def int_div_trunc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Integer division rounding toward zero, as ONNX ``Div`` on integers. torch's
    ``div(rounding_mode="trunc")`` traps (SIGFPE, the process dies) on the one overflowing
    quotient, the type's minimum divided by -1: that quotient is computed as ``-a`` instead,
    which wraps to the minimum in two's complement (numpy's and the IPU's result). Division by
    zero stays torch's ``RuntimeError``."""
    minus_one = b == -1
    if not bool(minus_one.any()):
        return torch.div(a, b, rounding_mode="trunc")
    q = torch.div(a, torch.where(minus_one, torch.ones_like(b), b), rounding_mode="trunc")
    return torch.where(minus_one, torch.neg(a).to(q.dtype), q)


def _div(a, b):
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    return int_div_trunc(a, b)


@onnx_op("Div")
def div(inputs, attrs, opset):
    return [_binary(_div, inputs[0], inputs[1])]


@onnx_op("Pow")
def pow_(inputs, attrs, opset):
    a, b = inputs
    if a.dtype.is_floating_point:
        return [torch.pow(a, b.to(a.dtype))]
    if b.dtype.is_floating_point:
        return [narrow(torch.pow(widen(a).double(), b.double()).to(compute_dtype(a.dtype)), a.dtype)]
    return [_binary(torch.pow, a, b.to(a.dtype))]


@onnx_op("Mod")
def mod(inputs, attrs, opset):
    a, b = inputs
    if attrs.get("fmod", 0):
        return [_binary(torch.fmod, a, b)]
    return [_binary(torch.remainder, a, b)]


@onnx_op("BitShift")
def bit_shift(inputs, attrs, opset):
    a, b = inputs
    direction = attrs.get("direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise OnnxKernelError(f"BitShift: direction must be LEFT or RIGHT, got {direction!r}")
    if direction == "LEFT":
        return [_binary(torch.bitwise_left_shift, a, b)]
    if a.dtype == torch.uint64:  # logical shift of a 64-bit unsigned value held as int64
        aw, bw = widen(a), widen(b)
        r = torch.where(bw >= 64, torch.zeros_like(aw),
                        (aw >> bw.clamp(max=63)) & ((1 << (64 - bw.clamp(1, 63))) - 1))
        r = torch.where(bw == 0, aw, r)
        return [narrow(r, a.dtype)]
    return [_binary(torch.bitwise_right_shift, a, b)]


def _binary_kernel(fn, inputs, attrs, opset):
    return [_binary(fn, inputs[0], inputs[1])]


for _name, _fn in {"BitwiseAnd": torch.bitwise_and, "BitwiseOr": torch.bitwise_or,
                   "BitwiseXor": torch.bitwise_xor}.items():
    onnx_op(_name)(functools.partial(_binary_kernel, _fn))


@onnx_op("BitwiseNot")
def bitwise_not(inputs, attrs, opset):
    return [_unary(torch.bitwise_not, inputs[0])]


# --- comparisons and logic ---------------------------------------------------------------------

def _compare_kernel(fn, inputs, attrs, opset):
    a, b = inputs
    if a.dtype in FLOAT8:
        a, b = a.float(), b.float()
    return [fn(widen(a), widen(b))]


for _name, _fn in {"Equal": torch.eq, "Greater": torch.gt, "Less": torch.lt,
                   "GreaterOrEqual": torch.ge, "LessOrEqual": torch.le}.items():
    onnx_op(_name)(functools.partial(_compare_kernel, _fn))

for _name, _fn in {"And": torch.logical_and, "Or": torch.logical_or,
                   "Xor": torch.logical_xor}.items():
    onnx_op(_name)(functools.partial(_binary_kernel, _fn))


@onnx_op("Not")
def not_(inputs, attrs, opset):
    return [torch.logical_not(inputs[0])]


# --- variadic ----------------------------------------------------------------------------------

def _variadic(fn, inputs):
    dt = inputs[0].dtype
    acc = widen(inputs[0])
    for t in inputs[1:]:
        acc = fn(acc, widen(t))
    return narrow(acc, dt) if acc.dtype != dt else acc


@onnx_op("Sum")
def sum_(inputs, attrs, opset):
    return [_variadic(torch.add, inputs)]


@onnx_op("Mean")
def mean(inputs, attrs, opset):
    s = _variadic(torch.add, inputs)
    return [(s / len(inputs)).to(s.dtype)]


@onnx_op("Max")
def max_(inputs, attrs, opset):
    return [_variadic(torch.maximum, inputs)]


@onnx_op("Min")
def min_(inputs, attrs, opset):
    return [_variadic(torch.minimum, inputs)]


# --- Clip, Where -------------------------------------------------------------------------------

@onnx_op("Clip")
def clip(inputs, attrs, opset):
    x = inputs[0]
    if opset < 11:
        lo, hi = attrs.get("min", -math.inf), attrs.get("max", math.inf)
    else:
        lo, hi = scalar(opt(inputs, 1)), scalar(opt(inputs, 2))
    xw = widen(x)
    if lo is not None:
        xw = torch.maximum(xw, torch.tensor(lo, dtype=xw.dtype, device=xw.device))
    if hi is not None:
        xw = torch.minimum(xw, torch.tensor(hi, dtype=xw.dtype, device=xw.device))
    return [narrow(xw, x.dtype)]


@onnx_op("Where")
def where(inputs, attrs, opset):
    c, a, b = inputs
    dt = a.dtype
    return [narrow(torch.where(c, widen(a), widen(b)), dt)]


# --- Cast --------------------------------------------------------------------------------------

_F8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 240.0,
           torch.float8_e5m2: 57344.0, torch.float8_e5m2fnuz: 57344.0}

# |x| from which a non-saturating cast gives NaN: (bound, bound itself included); the bound is the
# midpoint between the largest finite value and the next, which rounds to even.
_F8_NAN_FROM = {torch.float8_e4m3fn: (464.0, False), torch.float8_e4m3fnuz: (248.0, True),
                torch.float8_e5m2fnuz: (61440.0, True)}


def cast_to(x: torch.Tensor, dt: torch.dtype, saturate: int = 1, round_mode: str = "up"):
    """ONNX Cast of ``x`` to torch dtype ``dt`` (float8 saturation per the Cast schema)."""
    if x.dtype == dt:
        return x.clone()
    if dt in _F8_MAX:
        xf = x.float() if x.dtype != torch.float64 else x
        if saturate:
            m = _F8_MAX[dt]
            xf = torch.where(torch.isnan(xf), xf, xf.clamp(-m, m))
        elif dt in _F8_NAN_FROM:  # no saturation: overflow after rounding is NaN
            lim, inclusive = _F8_NAN_FROM[dt]
            over = xf.abs() >= lim if inclusive else xf.abs() > lim
            xf = torch.where(over, torch.full_like(xf, math.nan), xf)
        return xf.to(torch.float32).to(dt)
    if dt == torch.float8_e8m0fnu:
        xf = x.float()
        if round_mode == "up":
            e = torch.ceil(torch.log2(xf))
        elif round_mode == "down":
            e = torch.floor(torch.log2(xf))
        else:
            e = torch.round(torch.log2(xf))
        if saturate:
            e = e.clamp(-127, 127)
        v = torch.where(torch.isnan(xf), xf, torch.exp2(e))
        return v.to(dt)
    if x.dtype in FLOAT8 or x.dtype == torch.bfloat16 and dt in NARROW_UINT:
        x = x.float()
    if dt in NARROW_UINT or x.dtype in NARROW_UINT:
        if x.dtype.is_floating_point and dt in NARROW_UINT:
            x = x.to(torch.int64)
        w = widen(x)
        if dt == torch.uint64:
            return w.to(torch.int64).view(torch.uint64)
        if dt in NARROW_UINT:
            bits = 16 if dt == torch.uint16 else 32
            return (w.to(torch.int64) & ((1 << bits) - 1)).to(dt)
        return w.to(dt)
    if not x.dtype.is_floating_point and x.dtype != torch.bool and \
            not dt.is_floating_point and dt != torch.bool:
        return x.to(torch.int64).to(dt)  # wrap-around of out-of-range integers
    return x.to(dt)


@onnx_op("Cast")
def cast(inputs, attrs, opset):
    if "to" not in attrs:
        raise OnnxKernelError("Cast: attribute 'to' is required")
    return [cast_to(inputs[0], torch_dtype(attrs["to"]), attrs.get("saturate", 1),
                    attrs.get("round_mode", "up"))]


@onnx_op("CastLike")
def cast_like(inputs, attrs, opset):
    return [cast_to(inputs[0], inputs[1].dtype, attrs.get("saturate", 1),
                    attrs.get("round_mode", "up"))]


@onnx_op("BitCast")
def bit_cast(inputs, attrs, opset):
    dt = torch_dtype(attrs["to"])
    x = inputs[0]
    if x.element_size() != dt.itemsize:
        raise OnnxKernelError("BitCast: source and target element sizes must match")
    if x.dtype == torch.bool or dt == torch.bool:
        return [x.view(torch.uint8).to(dt) if dt == torch.bool else x.to(torch.uint8).view(dt)]
    return [x.contiguous().view(dt)]
