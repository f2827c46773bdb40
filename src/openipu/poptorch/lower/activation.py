"""Activations and the element-wise maths :mod:`.elementwise` leaves out: ``elu`` (with
``scale`` / ``input_scale``: ``selu``, ``celu``), ``prelu``, ``glu``, ``log_sigmoid``,
``softshrink`` / ``hardshrink``, ``threshold``, inverse hyperbolics, ``atan2``, ``log2`` /
``log10``, ``trunc``, ``isinf``, ``fmod`` / ``remainder``, ``pow`` of a scalar base,
``clamp`` with tensor bounds, ``logical_xor`` and the bitwise ops on bools and scalars.

Each is built from ONNX / ``ai.graphcore`` element-wise ops (``popops`` maps) as PopTorch's
canonicalisation does (e.g. ``remainder(a, b) = a - floor(a / b) * b``).
"""

from __future__ import annotations

import math

import torch

from openipu.popart.builder import method_name
from openipu.poptorch.lower import aten
from openipu.poptorch.lower.elementwise import _operands


def _x(lw, n):
    x = n.args[0]
    dt = lw.out_dtype()
    return lw.t(x) if lw.dtype(x) == dt else lw.cast(lw.t(x), dt)


def _c(lw, v):
    return lw.const(v, lw.out_dtype())


@aten("aten.elu.default")
def elu(lw, n):
    """``scale * (x if x > 0 else alpha * (exp(x * input_scale) - 1))`` (``selu``, ``celu``)."""
    alpha = float(n.args[1] if len(n.args) > 1 else n.kwargs.get("alpha", 1.0))
    scale = float(n.args[2] if len(n.args) > 2 else n.kwargs.get("scale", 1.0))
    iscale = float(n.args[3] if len(n.args) > 3 else n.kwargs.get("input_scale", 1.0))
    x = _x(lw, n)
    if scale == 1.0 and iscale == 1.0:
        return lw.onnx.elu([x], alpha, lw._name())
    if iscale == 1.0 and math.isclose(alpha, 1.6732632423543772) and math.isclose(scale, 1.0507009873554805):
        return lw.onnx.selu([x], alpha=alpha, gamma=scale, debugContext=lw._name())
    neg = lw.onnx.mul([_c(lw, alpha), lw.onnx.sub([lw.onnx.exp([lw.onnx.mul([x, _c(lw, iscale)])]), _c(lw, 1.0)])])
    y = lw.onnx.where([lw.onnx.greater([x, _c(lw, 0.0)]), x, neg])
    return lw.onnx.mul([y, _c(lw, scale)], lw._name())


@aten("aten._prelu_kernel.default", "aten.prelu.default")
def prelu(lw, n):
    x, w = n.args[0], n.args[1]
    shape = lw.shape(x)
    wt = lw.like(w, x)
    if len(shape) > 2 and lw.shape(w) and lw.shape(w)[0] > 1 and len(lw.shape(w)) == 1:
        wt = lw.b.reshape_const(lw.onnx, [wt], [lw.shape(w)[0]] + [1] * (len(shape) - 2))
    return lw.onnx.prelu([lw.t(x), wt], lw._name())


@aten("aten.glu.default")
def glu(lw, n):
    x = n.args[0]
    dim = int(n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", -1)) % len(lw.shape(x))
    h = lw.shape(x)[dim] // 2
    a, b = lw.onnx.split([lw.t(x)], 2, dim, [h, h], lw._name("split"))
    return lw.onnx.mul([a, lw.onnx.sigmoid([b])], lw._name())


@aten("aten.log_sigmoid_forward.default", "aten.log_sigmoid.default")
def log_sigmoid(lw, n):
    """``-softplus(-x)``; the forward op's second output (a CPU buffer) is unused."""
    x = _x(lw, n)
    y = lw.onnx.neg([lw.onnx.softplus([lw.onnx.neg([x])])], lw._name())
    return [y, y] if "forward" in str(n.target) else y


@aten("aten.softshrink.default")
def softshrink(lw, n):
    lam = float(n.args[1] if len(n.args) > 1 else n.kwargs.get("lambd", 0.5))
    return lw.onnx.shrink([_x(lw, n)], bias=lam, lambd=lam, debugContext=lw._name())


@aten("aten.hardshrink.default")
def hardshrink(lw, n):
    lam = float(n.args[1] if len(n.args) > 1 else n.kwargs.get("lambd", 0.5))
    return lw.onnx.shrink([_x(lw, n)], bias=0.0, lambd=lam, debugContext=lw._name())


@aten("aten.threshold.default")
def threshold(lw, n):
    x = _x(lw, n)
    th, value = n.args[1], n.args[2]
    return lw.onnx.where([lw.onnx.greater([x, _c(lw, th)]), x, _c(lw, value)], lw._name())


for _op, _onnx in (("acosh", "acosh"), ("asinh", "asinh"), ("atanh", "atanh")):
    def _mk(onnx_op):
        def fn(lw, n):
            return getattr(lw.onnx, onnx_op)([_x(lw, n)], lw._name())
        return fn
    aten(f"aten.{_op}.default")(_mk(_onnx))


@aten("aten.log2.default", "aten.log10.default")
def log_base(lw, n):
    base = 2.0 if "log2" in str(n.target) else 10.0
    return lw.onnx.div([lw.onnx.log([_x(lw, n)]), _c(lw, math.log(base))], lw._name())


@aten("aten.trunc.default", "aten.fix.default")
def trunc(lw, n):
    x = _x(lw, n)
    return lw.onnx.mul([lw.onnx.floor([lw.onnx.abs([x])]), lw.onnx.sign([x])], lw._name())


@aten("aten.isinf.default")
def isinf(lw, n):
    return lw.onnx.isinf([lw.t(n.args[0])], debugContext=lw._name())


@aten("aten.atan2.default")
def atan2(lw, n):
    """``atan2(y, x)``: ``atan(y / x)`` corrected by ``pi`` in the left half-plane."""
    y, x = _operands(lw, n, n.args[0], n.args[1])
    dt = lw.out_dtype()
    base = lw.onnx.atan([lw.onnx.div([y, x])])
    pi = lw.onnx.where([lw.onnx.less([y, lw.const(0.0, dt)]), lw.const(-math.pi, dt), lw.const(math.pi, dt)])
    left = lw.onnx.less([x, lw.const(0.0, dt)])
    out = lw.onnx.where([left, lw.onnx.add([base, pi]), base])
    # x == 0: +-pi/2 (0 when y == 0 too)
    zero = lw.onnx.equal([x, lw.const(0.0, dt)])
    half = lw.onnx.mul([lw.onnx.sign([y]), lw.const(math.pi / 2, dt)])
    return lw.onnx.where([zero, half, out], lw._name())


@aten("aten.remainder.Tensor", "aten.remainder.Scalar")
def remainder(lw, n):
    """``a - floor(a / b) * b`` (the sign of the divisor, Python's ``%``)."""
    a, b = _operands(lw, n, n.args[0], n.args[1])
    if lw.out_dtype() in ("FLOAT", "FLOAT16"):
        q = lw.onnx.floor([lw.onnx.div([a, b])])
        return lw.onnx.sub([a, lw.onnx.mul([q, b])], lw._name())
    return lw.onnx.mod([a, b], fmod=0, debugContext=lw._name())


@aten("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(lw, n):
    """C's ``fmod`` (the sign of the dividend)."""
    a, b = _operands(lw, n, n.args[0], n.args[1])
    return lw.onnx.mod([a, b], fmod=1, debugContext=lw._name())


@aten("aten.pow.Scalar")
def pow_scalar(lw, n):
    base, e = n.args[0], n.args[1]
    dt = lw.out_dtype()
    et = lw.t(e) if lw.dtype(e) == dt else lw.cast(lw.t(e), dt)
    return lw.onnx.pow([lw.const(base, dt), et], lw._name())


@aten("aten.clamp.Tensor")
def clamp_tensor(lw, n):
    x = _x(lw, n)
    lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
    hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
    if lo is not None:
        x = lw.onnx.max([x, lw.like(lo, n) if isinstance(lo, torch.fx.Node) else _c(lw, lo)], lw._name("min"))
    if hi is not None:
        x = lw.onnx.min([x, lw.like(hi, n) if isinstance(hi, torch.fx.Node) else _c(lw, hi)], lw._name("max"))
    return x


@aten("aten.div.Scalar_mode")
def div_scalar_mode(lw, n):
    from openipu.poptorch.lower.elementwise import div
    return div(lw, n)


def _logic(method: str):
    """A logical op on bool tensors, or PopART's bitwise op (``aiGraphcore.bitwise*``) on
    integer tensors (PopTorch lowers ``&``, ``|``, ``^`` on ints to them)."""
    def fn(lw, n):
        a, b = n.args[0], n.args[1]
        dt = lw.out_dtype()
        if dt == "BOOL":
            ta = lw.like(a, n) if isinstance(a, torch.fx.Node) else lw.const(bool(a), "BOOL")
            tb = lw.like(b, n) if isinstance(b, torch.fx.Node) else lw.const(bool(b), "BOOL")
            return getattr(lw.onnx, method)([ta, tb], lw._name())
        if dt not in ("INT32", "INT16", "INT8", "UINT8"):
            raise_int(n)
        ta = lw.like(a, n) if isinstance(a, torch.fx.Node) else lw.const(int(a), dt)
        tb = lw.like(b, n) if isinstance(b, torch.fx.Node) else lw.const(int(b), dt)
        op = {"logical_and": "bitwiseand", "logical_or": "bitwiseor", "logical_xor": "bitwisexor"}[method]
        return getattr(lw.gc, op)([ta, tb], lw._name())
    return fn


def raise_int(n):
    from openipu.poptorch.errors import Error
    raise Error(f"{n.target}: bitwise operations are supported on bool and integer tensors only (as in PopTorch)")


aten("aten.logical_xor.default", "aten.bitwise_xor.Tensor", "aten.bitwise_xor.Scalar", onnx="Xor")(_logic("logical_xor"))
aten("aten.bitwise_and.Scalar", "aten.bitwise_and.Tensor", onnx="And")(_logic("logical_and"))
aten("aten.bitwise_or.Scalar", "aten.bitwise_or.Tensor", onnx="Or")(_logic("logical_or"))


@aten("aten.bitwise_not.default", "aten.bitwise_not_.default")
def bitwise_not(lw, n):
    """``~x``: logical not on bools, PopART's ``bitwisenot`` on integers."""
    x = n.args[0]
    if lw.dtype(x) == "BOOL":
        return lw.onnx.logical_not([lw.t(x)], lw._name())
    return lw.gc.bitwisenot([lw.t(x)], lw._name())


@aten("aten.__lshift__.Scalar", "aten.__rshift__.Scalar", "aten.bitwise_left_shift.Tensor_Scalar",
      "aten.bitwise_right_shift.Tensor_Scalar", "aten.__lshift__.Tensor", "aten.__rshift__.Tensor",
      "aten.bitwise_left_shift.Tensor", "aten.bitwise_right_shift.Tensor")
def shift(lw, n):
    """``x << k`` / ``x >> k`` on integers: a product / floor division by ``2**k`` (two's
    complement wrap-around, arithmetic right shift: PyTorch's results)."""
    x, k = n.args[0], n.args[1]
    dt = lw.dtype(x)
    if dt not in ("INT32", "INT16", "INT8", "UINT8"):
        raise_int(n)
    left = "lshift" in str(n.target) or "left" in str(n.target)
    if isinstance(k, torch.fx.Node):
        kt = lw.like(k, x)
        p = lw.cast(lw.onnx.pow([lw.const(2.0), lw.cast(kt, "FLOAT")], lw._name("pow2")), dt)
    else:
        p = lw.const(1 << int(k), dt)
    xt = lw.t(x)
    if left:
        return lw.onnx.mul([xt, p], lw._name())
    q = lw.onnx.div([xt, p], lw._name("div"))         # truncates towards zero: fix negative remainders
    fix = lw.onnx.logical_and([lw.onnx.less([xt, lw.const(0, dt)]),
                               lw.onnx.logical_not([lw.onnx.equal([lw.onnx.mul([q, p]), xt])])])
    return lw.onnx.sub([q, lw.cast(fix, dt)], lw._name())


@aten("aten.erfc.default", "prims.erfc.default")
def erfc(lw, n):
    """``erfc(x) = 1 - erf(x)``."""
    x = lw.t(n.args[0])
    return lw.onnx.sub([lw.const(1.0, lw.dtype(n.args[0])), lw.onnx.erf([x])], lw._name())



@aten("aten.rrelu_with_noise_functional.default", "aten.rrelu_with_noise.default")
def rrelu(lw, n):
    """RReLU: at inference the leaky ReLU of slope ``(lower + upper) / 2``; in training each
    negative element's slope ~ U(lower, upper) (the seeded RandomUniformLike). Returns ``(out,
    noise)`` for the functional form."""
    x = _x(lw, n)
    lower = float(n.args[2] if len(n.args) > 2 else n.kwargs.get("lower", 1.0 / 8))
    upper = float(n.args[3] if len(n.args) > 3 else n.kwargs.get("upper", 1.0 / 3))
    training = bool(n.args[4] if len(n.args) > 4 else n.kwargs.get("training", False))
    if training and lw.training:
        slope = lw.onnx.randomuniformlike([x], low=lower, high=upper, debugContext=lw._name("slope"))
    else:
        slope = _c(lw, (lower + upper) / 2)
    neg = lw.onnx.less([x, _c(lw, 0.0)])
    noise = lw.onnx.where([neg, slope, _c(lw, 1.0)])
    if lw.shape(n.args[0]) and not training:
        noise = lw.onnx.expand([noise, lw.shape_const(lw.shape(n.args[0]))])
    y = lw.onnx.mul([x, noise], lw._name())
    return (y, noise) if "functional" in str(n.target) else y


@aten("aten._cdist_forward.default")
def cdist(lw, n):
    """``cdist(x1 [.., P, M], x2 [.., R, M], p)``: the p-norm of every pair's difference (the
    broadcast difference, exact; PopTorch has no cdist)."""
    x1, x2, p = n.args[0], n.args[1], float(n.args[2])
    r1, r2 = len(lw.shape(x1)), len(lw.shape(x2))
    a = lw.onnx.unsqueeze([lw.t(x1)], axes=[r1 - 1], debugContext=lw._name("a"))
    b = lw.onnx.unsqueeze([lw.t(x2)], axes=[r2 - 2], debugContext=lw._name("b"))
    d = lw.onnx.abs([lw.onnx.sub([a, b])])
    last = max(r1, r2)
    if p == 2.0:
        return lw.onnx.sqrt([lw.onnx.reducesum([lw.onnx.mul([d, d])], axes=[last], keepdims=0)], lw._name())
    if p == 1.0:
        return lw.onnx.reducesum([d], axes=[last], keepdims=0, debugContext=lw._name())
    if math.isinf(p):
        return lw.onnx.reducemax([d], axes=[last], keepdims=0, debugContext=lw._name())
    s = lw.onnx.reducesum([lw.onnx.pow([d, _c(lw, p)])], axes=[last], keepdims=0)
    return lw.onnx.pow([s, _c(lw, 1.0 / p)], lw._name())


@aten("aten._pdist_forward.default")
def pdist(lw, n):
    """``pdist(x [N, M], p)``: the p-norm distances of the pairs ``i < j`` in row order (the full
    :func:`cdist` of ``x`` with itself, then a Gather of the upper triangle)."""
    import numpy as np
    x, p = n.args[0], float(n.args[1] if len(n.args) > 1 else 2.0)
    rows = lw.shape(x)[0]
    a = lw.onnx.unsqueeze([lw.t(x)], axes=[1], debugContext=lw._name("a"))
    b = lw.onnx.unsqueeze([lw.t(x)], axes=[0], debugContext=lw._name("b"))
    d = lw.onnx.abs([lw.onnx.sub([a, b])])
    if p == 2.0:
        full = lw.onnx.sqrt([lw.onnx.reducesum([lw.onnx.mul([d, d])], axes=[2], keepdims=0)])
    elif p == 1.0:
        full = lw.onnx.reducesum([d], axes=[2], keepdims=0)
    elif math.isinf(p):
        full = lw.onnx.reducemax([d], axes=[2], keepdims=0)
    else:
        full = lw.onnx.pow([lw.onnx.reducesum([lw.onnx.pow([d, _c(lw, p)])], axes=[2], keepdims=0), _c(lw, 1.0 / p)])
    i, j = np.triu_indices(rows, 1)
    flat = lw.b.reshape_const(lw.onnx, [full], [rows * rows])
    return lw.onnx.gather([flat, lw.const((i * rows + j).astype(np.int32), "INT32")], 0, lw._name())
