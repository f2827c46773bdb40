"""Elementwise ``ai.graphcore`` ops (PopART ``AiGraphcoreOpset1``): Gelu (tanh form, as
``popnn::NonLinearityType::GELU``), GeluErf (exact erf form), Swish, Scale, ScaledAdd, Round /
Nearbyint, Fmod, Remainder, Atan2, Expm1, Log1p, the Bitwise* family, IncrementMod, and the
identity-shaped ops (Detach, Nop, PrintTensor, CopyVarUpdate, TensorRemap, ReplicatedAllReduce on
one replica). Outputs have the shape and dtype of the (broadcast) inputs.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops._registry import _gc


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


@_gc("IncrementMod", flops=lambda i, o, a: 2.0 * math.prod(o[0]))
def increment_mod(inputs, attrs, opset):
    """PopART's ``IncrementMod``: ``(x + increment) % modulus`` (C ``fmod``), x's type."""
    x = inputs[0]
    y = torch.fmod(x.double() + float(attrs["increment"]), float(attrs["modulus"]))
    return [y.to(x.dtype)]


@_gc("CopyVarUpdate")
def copy_var_update(inputs, attrs, opset):
    """PopART's ``CopyVarUpdate``: ``[variable, updater] ->`` the updater's value (the lowering
    writes it into the variable)."""
    return [inputs[1].clone()]


@_gc("TensorRemap", "ReplicatedAllReduce")
def identity_like(inputs, attrs, opset):
    """TensorRemap (a layout change) and a one-replica ReplicatedAllReduce: the input."""
    return [inputs[0].clone()]
