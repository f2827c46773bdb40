"""Host kernels for the ``ai.graphcore`` operators an inference session can run, used when
:mod:`openipu.popart.onnx_ops` has no kernel registered for them (same interface:
``fn(inputs, attrs, opset) -> outputs`` on torch tensors, attrs not defaulted).

Semantics follow PopART's op definitions (``willow/include/popart/op/*.hpp``): Gelu is the tanh
approximation (``popnn::NonLinearityType::GELU``), GeluErf the exact erf form; ``reduction``
attributes use PopART's C++ ``ReductionType`` order (Sum 0, Mean 1, NoReduction 2).
"""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import OpKernel, get_kernel
from openipu.popart.onnx_ops._common import nll_rows

_GC: dict[str, OpKernel] = {}
GRAPHCORE = "ai.graphcore"


def _gc(*names, flops=None):
    def reg(fn):
        for n in names:
            _GC[n] = OpKernel(GRAPHCORE, n, fn, flops)
        return fn
    return reg


def find_kernel(domain: str, op_type: str) -> OpKernel | None:
    """The kernel for ``(domain, op_type)``: the onnx_ops registry first, then this module."""
    k = get_kernel(domain, op_type)
    if k is None and domain == GRAPHCORE:
        k = _GC.get(op_type)
    return k


def _float(x):
    return x if x.is_floating_point() else x.float()


@_gc("Gelu", flops=lambda i, o, a: 10.0 * math.prod(o[0]))
def gelu(inputs, attrs, opset):
    return [torch.nn.functional.gelu(inputs[0], approximate="tanh")]


@_gc("GeluErf", flops=lambda i, o, a: 8.0 * math.prod(o[0]))
def gelu_erf(inputs, attrs, opset):
    return [torch.nn.functional.gelu(inputs[0])]


@_gc("Swish", flops=lambda i, o, a: 6.0 * math.prod(o[0]))
def swish(inputs, attrs, opset):
    x = inputs[0]
    return [x * torch.sigmoid(x)]


@_gc("Scale")
def scale(inputs, attrs, opset):
    x = inputs[0]
    return [(x * float(attrs.get("scale", 1.0))).to(x.dtype)]


@_gc("ScaledAdd", flops=lambda i, o, a: 3.0 * math.prod(o[0]))
def scaled_add(inputs, attrs, opset):
    a, b = inputs[0], inputs[1]
    s0 = inputs[2] if len(inputs) > 2 and inputs[2] is not None else float(attrs.get("scale0", 1.0))
    s1 = inputs[3] if len(inputs) > 3 and inputs[3] is not None else float(attrs.get("scale1", 1.0))
    return [(a * s0 + b * s1).to(a.dtype)]


@_gc("Detach", "Nop", "PrintTensor")
def identity(inputs, attrs, opset):
    return [inputs[0].clone()]


@_gc("IdentityLoss")
def identity_loss(inputs, attrs, opset):
    x = inputs[0]
    red = int(attrs.get("reduction", 1))
    return [x.sum() if red == 0 else x.mean() if red == 1 else x.clone()]


def _reduce(x, red: int):
    """PopART's ReductionType (C++ order): Sum 0, Mean 1, NoReduction 2."""
    return x.sum() if red == 0 else x.mean() if red == 1 else x


@_gc("Nll", flops=lambda i, o, a: 2.0 * math.prod(i[1]))
def nll(inputs, attrs, opset):
    """``-log(probs[label])`` per sample (``-probs[label]`` when ``inputIsLogProbability``),
    reduced; probs ``[..., C]``, label ``[...]`` (integers). Rows whose label is ``ignoreIndex``
    count 0 and, for Mean, are left out of the count (as PyTorch's NLLLoss)."""
    p, label = inputs
    p2, lab, keep = nll_rows(p, label, attrs.get("ignoreIndex"))
    picked = p2[torch.arange(p2.shape[0]), lab]
    per = -picked if attrs.get("inputIsLogProbability", 0) else -torch.log(picked)
    per = torch.where(keep, per, torch.zeros(()))
    red = int(attrs.get("reduction", 1))
    if red == 1:
        out = per.sum() / max(int(keep.sum()), 1)
    else:
        out = per.reshape(label.shape) if red == 2 else per.sum()
    return [out.to(p.dtype)]


@_gc("L1", flops=lambda i, o, a: 2.0 * math.prod(i[0]))
def l1(inputs, attrs, opset):
    """``lambda * |x|``, reduced (PopART's ``l1loss``)."""
    x = inputs[0]
    return [(_reduce(torch.abs(x.float()), int(attrs.get("reduction", 1))) * float(attrs.get("lambda", 1.0)))
            .to(x.dtype)]


@_gc("Reshape")
def reshape(inputs, attrs, opset):
    return [inputs[0].reshape([int(s) for s in attrs["shape"]])]


@_gc("Subsample")
def subsample(inputs, attrs, opset):
    x = inputs[0]
    idx = tuple(slice(None, None, int(s)) for s in attrs.get("strides", []))
    return [x[idx].clone()]


@_gc("Reverse")
def reverse(inputs, attrs, opset):
    return [torch.flip(inputs[0], [int(d) for d in attrs.get("dimensions", [])])]


@_gc("Slice")
def slice_(inputs, attrs, opset):
    x = inputs[0]
    starts, ends = list(attrs.get("starts", [])), list(attrs.get("ends", []))
    axes = list(attrs.get("axes", range(len(starts))))
    idx = [slice(None)] * x.dim()
    for s, e, ax in zip(starts, ends, axes):
        idx[int(ax)] = slice(int(s), int(e))
    return [x[tuple(idx)].clone()]


@_gc("Round", "Nearbyint")
def round_(inputs, attrs, opset):
    return [torch.round(inputs[0])]


@_gc("Fmod")
def fmod(inputs, attrs, opset):
    return [torch.fmod(inputs[0], inputs[1])]


@_gc("Remainder")
def remainder(inputs, attrs, opset):
    return [torch.remainder(inputs[0], inputs[1])]


@_gc("Atan2", flops=lambda i, o, a: 20.0 * math.prod(o[0]))
def atan2(inputs, attrs, opset):
    return [torch.atan2(inputs[0], inputs[1])]


@_gc("Expm1", flops=lambda i, o, a: 10.0 * math.prod(o[0]))
def expm1(inputs, attrs, opset):
    return [torch.expm1(inputs[0])]


@_gc("Log1p", flops=lambda i, o, a: 10.0 * math.prod(o[0]))
def log1p(inputs, attrs, opset):
    return [torch.log1p(inputs[0])]


@_gc("BitwiseNot")
def bitwise_not(inputs, attrs, opset):
    return [torch.bitwise_not(inputs[0])]


@_gc("BitwiseAnd")
def bitwise_and(inputs, attrs, opset):
    return [torch.bitwise_and(inputs[0], inputs[1])]


@_gc("BitwiseOr")
def bitwise_or(inputs, attrs, opset):
    return [torch.bitwise_or(inputs[0], inputs[1])]


@_gc("BitwiseXor")
def bitwise_xor(inputs, attrs, opset):
    return [torch.bitwise_xor(inputs[0], inputs[1])]


@_gc("BitwiseXnor")
def bitwise_xnor(inputs, attrs, opset):
    return [torch.bitwise_not(torch.bitwise_xor(inputs[0], inputs[1]))]
