"""Element-wise ATen ops: arithmetic (with PyTorch's type promotion: the output's type, from the
captured graph, is the operands' type), activations, comparisons, logic, casts, constants
(``full``, ``zeros_like``, ``arange``, ``scalar_tensor``) and dropout (PopART's, seeded by
``Options.randomSeed``, in training; the identity otherwise)."""

from __future__ import annotations

import numpy as np
import torch

from openipu.popart.builder import method_name
from openipu.poptorch.lower import NUMPY_TYPE, POPART_TYPE, aten, broadcasts, op_name


def _operands(lw, n, *args):
    """Tensor ids of ``args`` in the node's output type (comparisons: the promoted input type)."""
    dt = lw.out_dtype()
    out = []
    for a in args:
        tid = lw.t(a) if isinstance(a, torch.fx.Node) else lw.const(a, dt)
        if isinstance(a, torch.fx.Node) and lw.dtype(a) != dt:
            tid = lw.cast(tid, dt)
        out.append(tid)
    return out


def _binary(onnx_op):
    """The lowering of ``a <op> alpha * b`` as ONNX ``onnx_op`` (an op type: ``"Add"``)."""
    method = method_name(onnx_op)

    def fn(lw, n):
        a, b = _operands(lw, n, n.args[0], n.args[1])
        alpha = n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 else 1)
        if alpha != 1:
            b = lw.onnx.mul([b, lw.const(alpha, lw.out_dtype())], lw._name("alpha"))
        return getattr(lw.onnx, method)([a, b], lw._name())
    return fn


for _names, _onnx in ((("aten.add.Tensor", "aten.add.Scalar", "aten.add_.Tensor"), "Add"),
                      (("aten.sub.Tensor", "aten.sub.Scalar"), "Sub"),
                      (("aten.mul.Tensor", "aten.mul.Scalar", "aten.mul_.Tensor"), "Mul"),
                      (("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar"), "Pow"),
                      (("aten.maximum.default",), "Max"), (("aten.minimum.default",), "Min")):
    aten(*_names, onnx=_onnx)(_binary(_onnx))


@aten("aten.rsub.Scalar", "aten.rsub.Tensor", onnx="Sub")
def rsub(lw, n):
    a, b = _operands(lw, n, n.args[0], n.args[1])
    return lw.onnx.sub([b, a], lw._name())


@aten("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", onnx="Div")
def div(lw, n):
    mode = n.kwargs.get("rounding_mode")
    if lw.out_dtype() in ("FLOAT", "FLOAT16"):
        a, b = _operands(lw, n, n.args[0], n.args[1])
        q = lw.onnx.div([a, b], lw._name())
        if mode == "floor":
            return lw.onnx.floor([q], lw._name("floor"))
        if mode == "trunc":
            return lw.onnx.mul([lw.onnx.floor([lw.onnx.abs([q])]), lw.onnx.sign([q])], lw._name("trunc"))
        return q
    # integer operands: true division promotes to float (the output type says so), else floor
    a, b = (lw.cast(lw.t(x), "FLOAT") if isinstance(x, torch.fx.Node) else lw.const(float(x)) for x in n.args[:2])
    q = lw.onnx.div([a, b], lw._name())
    q = lw.onnx.floor([q]) if mode == "floor" else q
    return lw.cast(q, lw.out_dtype())


def _unary(onnx_op, **attrs):
    def fn(lw, n):
        return getattr(lw.onnx, onnx_op)([lw.t(n.args[0])], **attrs, debugContext=lw._name())
    return fn


for _op, _onnx in (("relu", "relu"), ("sigmoid", "sigmoid"), ("tanh", "tanh"), ("neg", "neg"), ("exp", "exp"),
                   ("log", "log"), ("sqrt", "sqrt"), ("abs", "abs"), ("erf", "erf"), ("sin", "sin"), ("cos", "cos"),
                   ("floor", "floor"), ("ceil", "ceil"), ("reciprocal", "reciprocal"), ("sign", "sign"),
                   ("asin", "asin"), ("acos", "acos"), ("atan", "atan"), ("sinh", "sinh"), ("cosh", "cosh"),
                   ("tan", "tan"), ("round", "round"), ("isnan", "isnan"), ("logical_not", "logical_not")):
    aten(f"aten.{_op}.default", f"aten.{_op}_.default")(_unary(_onnx))


@aten("aten.rsqrt.default")
def rsqrt(lw, n):
    return lw.onnx.reciprocal([lw.onnx.sqrt([lw.t(n.args[0])])], lw._name())


@aten("aten.log1p.default")
def log1p(lw, n):
    return lw.gc.log1p([lw.t(n.args[0])], lw._name())


@aten("aten.expm1.default")
def expm1(lw, n):
    return lw.gc.expm1([lw.t(n.args[0])], lw._name())


@aten("aten.gelu.default")
def gelu(lw, n):
    approximate = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
    x = lw.t(n.args[0])
    return lw.gc.gelu([x], lw._name()) if approximate == "tanh" else lw.gc.geluerf([x], lw._name())


@aten("aten.silu.default")
def silu(lw, n):
    return lw.gc.swish([lw.t(n.args[0])], lw._name())


@aten("aten.leaky_relu.default")
def leaky_relu(lw, n):
    return lw.onnx.leakyrelu([lw.t(n.args[0])], float(n.args[1]) if len(n.args) > 1 else 0.01, lw._name())


@aten("aten.hardtanh.default", "aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default")
def clamp(lw, n):
    x = lw.t(n.args[0])
    name = str(n.target)
    lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min", -1.0 if "hardtanh" in name else None)
    hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max", 1.0 if "hardtanh" in name else None)
    if "clamp_max" in name:
        lo, hi = None, n.args[1]
    dt = lw.out_dtype()
    if lo is not None:
        x = lw.onnx.max([x, lw.const(lo, dt)], lw._name("min"))
    if hi is not None:
        x = lw.onnx.min([x, lw.const(hi, dt)], lw._name("max"))
    return x


@aten("aten.softplus.default")
def softplus(lw, n):
    beta = float(n.args[1]) if len(n.args) > 1 else 1.0
    x = lw.t(n.args[0])
    if beta != 1.0:
        x = lw.onnx.mul([x, lw.const(beta, lw.dtype(n.args[0]))])
    y = lw.onnx.softplus([x], lw._name())
    return y if beta == 1.0 else lw.onnx.div([y, lw.const(beta, lw.dtype(n.args[0]))])


def _compare(onnx_op, negate=False):
    """The lowering of a comparison as ONNX ``onnx_op`` (an op type: ``"Less"``), negated or not."""
    method = method_name(onnx_op)

    def fn(lw, n):
        a, b = n.args[0], n.args[1]
        ref = a if isinstance(a, torch.fx.Node) else b
        ta = lw.like(a, ref) if isinstance(a, torch.fx.Node) else lw.const(a, lw.dtype(ref))
        tb = lw.like(b, ref) if isinstance(b, torch.fx.Node) else lw.const(b, lw.dtype(ref))
        if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and lw.dtype(a) != lw.dtype(b):
            # promote to the float one
            fa = lw.dtype(a) in ("FLOAT", "FLOAT16")
            ta, tb = (lw.t(a), lw.cast(lw.t(b), lw.dtype(a))) if fa else (lw.cast(lw.t(a), lw.dtype(b)), lw.t(b))
        out = getattr(lw.onnx, method)([ta, tb], lw._name())
        return lw.onnx.logical_not([out], lw._name("not")) if negate else out
    return fn


for _op, _onnx, _neg in (("eq", "Equal", False), ("ne", "Equal", True), ("lt", "Less", False),
                         ("gt", "Greater", False), ("le", "Greater", True), ("ge", "Less", True)):
    aten(f"aten.{_op}.Tensor", f"aten.{_op}.Scalar", onnx=_onnx)(_compare(_onnx, _neg))


@aten("aten.logical_and.default", onnx="And")
def logical_and(lw, n):
    return lw.onnx.logical_and([lw.like(n.args[0], n), lw.like(n.args[1], n)], lw._name())


@aten("aten.logical_or.default", onnx="Or")
def logical_or(lw, n):
    return lw.onnx.logical_or([lw.like(n.args[0], n), lw.like(n.args[1], n)], lw._name())


@aten("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar", onnx="Where")
def where(lw, n):
    c, a, b = n.args[:3]
    x, y = _operands(lw, n, a, b)
    return lw.onnx.where([lw.t(c), x, y], lw._name())


@aten("aten.masked_fill.Scalar", "aten.masked_fill.Tensor", onnx="Where")
def masked_fill(lw, n):
    x, mask, value = n.args[:3]
    v = lw.like(value, x) if isinstance(value, torch.fx.Node) else lw.const(value, lw.dtype(x))
    return lw.onnx.where([lw.t(mask), v, lw.t(x)], lw._name())


@aten("aten._to_copy.default", "aten.to.dtype", "aten._to_copy")
def to_copy(lw, n):
    want = POPART_TYPE[lw.val().dtype]
    x = lw.t(n.args[0])
    return x if lw.dtype(n.args[0]) == want else lw.cast(x, want)


@aten("aten.clone.default", "aten.alias.default", "aten.contiguous.default", "aten.lift_fresh_copy.default",
      "aten.detach.default", "aten.detach_.default", "aten.copy.default", "aten.copy_.default")
def identity(lw, n):
    src = n.args[1] if str(n.target).startswith("aten.copy") else n.args[0]
    out = [int(d) for d in lw.val().shape]
    if isinstance(src, torch.fx.Node) and lw.shape(src) != out:     # copy: src broadcasts to the destination
        return lw.onnx.expand([lw.like(src, n), lw.shape_const(out)], lw._name())
    return lw.onnx.identity([lw.like(src, n)], lw._name())


@aten("aten.dropout.default", "aten.native_dropout.default")
def dropout(lw, n):
    x = lw.t(n.args[0])
    p = float(n.args[1])
    train = n.args[2] if len(n.args) > 2 else n.kwargs.get("train", True)
    if not train or not lw.training or p == 0.0:
        out = lw.onnx.identity([x], lw._name())
    else:
        out = lw.onnx.dropout([x], 1, p, lw._name())[0]
    return (out, None) if "native_dropout" in str(n.target) else out


#: creation ops that fill a tensor with one value
_FILLS = {"aten.full.default", "aten.zeros.default", "aten.ones.default", "aten.scalar_tensor.default"}


def _broadcast_only(n) -> bool:
    """Whether a filled tensor (``full``, ``zeros_like`` ...) may be lowered as a scalar: every
    user is an element-wise op that broadcasts it (:func:`~openipu.poptorch.lower.broadcasts`), and
    the user's other operands already give the user's output shape. A filled ``[8, 12, 384, 384]`` tensor (``_safe_softmax``'s zeros,
    attention-mask fills) would otherwise become a constant that PopART folds and the device
    keeps always live; as a scalar it costs nothing."""
    if not n.users:
        return False
    for u in n.users:
        if u.op != "call_function" or not broadcasts(u.target) or n in u.kwargs.values():
            return False
        others = [a.meta["val"].shape for a in u.args
                  if isinstance(a, torch.fx.Node) and a is not n and isinstance(a.meta.get("val"), torch.Tensor)]
        want = u.meta.get("val")
        if not isinstance(want, torch.Tensor) or tuple(torch.broadcast_shapes(*others)) != tuple(want.shape):
            return False
    return True


def _constant_of(lw, n):
    """A node's (data-independent) output as an ONNX constant, from the value PyTorch computes
    on the example shapes: ``full``, ``zeros``, ``ones``, ``arange``, ``scalar_tensor``."""
    v = lw.val()
    args = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in n.args]
    kwargs = {k: v_ for k, v_ in n.kwargs.items() if k not in ("device", "pin_memory", "layout")}
    value = n.target(*args, **kwargs) if not any(isinstance(a, torch.Tensor) for a in args) else None
    if value is None or value.shape != v.shape:
        value = torch.zeros(v.shape, dtype=v.dtype)
    dt = POPART_TYPE[v.dtype]
    if op_name(n.target) in _FILLS and value.numel() and _broadcast_only(n):
        return lw.const(value.reshape(-1)[0].detach().cpu().numpy(), dt)
    return lw.const(value.detach().cpu().numpy(), dt)


aten("aten.full.default", "aten.zeros.default", "aten.ones.default", "aten.arange.default", "aten.arange.start",
     "aten.arange.start_step", "aten.scalar_tensor.default", "aten.empty.memory_format")(_constant_of)


def _like(fill):
    def fn(lw, n):
        v = lw.val()
        value = fill(n) if callable(fill) else fill
        shape = [] if _broadcast_only(n) else [int(d) for d in v.shape]
        return lw.const(np.full(shape, value, NUMPY_TYPE[POPART_TYPE[v.dtype]]), POPART_TYPE[v.dtype])
    return fn


aten("aten.zeros_like.default")(_like(0))
aten("aten.ones_like.default")(_like(1))
aten("aten.full_like.default")(_like(lambda n: n.args[1]))
aten("aten.empty_like.default")(_like(0))


@aten("aten.fill.Scalar")
def fill(lw, n):
    return _like(lambda n_: n_.args[1])(lw, n)


@aten("aten.hardsigmoid.default")
def hardsigmoid(lw, n):
    return lw.onnx.hardsigmoid([lw.t(n.args[0])], 1.0 / 6.0, 0.5, lw._name())


@aten("aten.hardswish.default")
def hardswish(lw, n):
    x = lw.t(n.args[0])
    return lw.onnx.mul([x, lw.onnx.hardsigmoid([x], 1.0 / 6.0, 0.5)], lw._name())


@aten("aten.mish.default")
def mish(lw, n):
    x = lw.t(n.args[0])
    return lw.onnx.mul([x, lw.onnx.tanh([lw.onnx.softplus([x])])], lw._name())



@aten("aten._assert_tensor_metadata.default", "aten._assert_async.msg", "aten._assert_async.default",
      "aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default", "aten._functional_assert_async.msg")
def no_op(lw, n):
    """Capture-time checks (dtype / shape assertions): nothing on the device."""
    return None
