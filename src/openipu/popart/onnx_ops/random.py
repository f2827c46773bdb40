"""Random ops (RandomNormal/Uniform(Like), Bernoulli, Multinomial) and Dropout.

Random streams are torch's (a ``seed`` attribute seeds a private generator), so values differ
from other runtimes' for the same seed; shapes, dtypes and distributions follow ONNX. The numbers
are drawn on the CPU (torch's CPU generator) and moved to the input's device (the CPU for the
ops without inputs), so that every device draws the same stream."""

from __future__ import annotations

import torch

from openipu.popart.onnx_ops import onnx_op
from openipu.popart.onnx_ops._common import opt, scalar, torch_dtype


def _gen(attrs):
    seed = attrs.get("seed")
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(int(seed) & 0xFFFFFFFFFFFF if seed >= 0 else int(abs(seed)))
    return g


def _dtype(attrs, like=None, default=torch.float32):
    if "dtype" in attrs:
        return torch_dtype(attrs["dtype"])
    return like.dtype if like is not None else default


@onnx_op("RandomNormal")
def random_normal(inputs, attrs, opset):
    dt = _dtype(attrs)
    t = torch.randn(list(attrs["shape"]), generator=_gen(attrs), dtype=torch.float64, device="cpu")
    return [(t * attrs.get("scale", 1.0) + attrs.get("mean", 0.0)).to(dt)]


@onnx_op("RandomNormalLike")
def random_normal_like(inputs, attrs, opset):
    dt = _dtype(attrs, inputs[0])
    t = torch.randn(list(inputs[0].shape), generator=_gen(attrs), dtype=torch.float64, device="cpu")
    return [(t * attrs.get("scale", 1.0) + attrs.get("mean", 0.0)).to(inputs[0].device, dt)]


@onnx_op("RandomUniform")
def random_uniform(inputs, attrs, opset):
    dt = _dtype(attrs)
    lo, hi = attrs.get("low", 0.0), attrs.get("high", 1.0)
    t = torch.rand(list(attrs["shape"]), generator=_gen(attrs), dtype=torch.float64, device="cpu")
    return [(lo + t * (hi - lo)).to(dt)]


@onnx_op("RandomUniformLike")
def random_uniform_like(inputs, attrs, opset):
    dt = _dtype(attrs, inputs[0])
    lo, hi = attrs.get("low", 0.0), attrs.get("high", 1.0)
    t = torch.rand(list(inputs[0].shape), generator=_gen(attrs), dtype=torch.float64, device="cpu")
    return [(lo + t * (hi - lo)).to(inputs[0].device, dt)]


@onnx_op("Bernoulli")
def bernoulli(inputs, attrs, opset):
    p = inputs[0]
    dt = _dtype(attrs, p)
    return [torch.bernoulli(p.to("cpu", torch.float64), generator=_gen(attrs)).to(p.device, dt)]


@onnx_op("Multinomial")
def multinomial(inputs, attrs, opset):
    logits = inputs[0].to("cpu", torch.float64)
    dt = torch_dtype(attrs.get("dtype", 6))
    n = attrs.get("sample_size", 1)
    probs = torch.softmax(logits, -1)
    return [torch.multinomial(probs, n, replacement=True, generator=_gen(attrs)).to(inputs[0].device, dt)]


@onnx_op("Dropout")
def dropout(inputs, attrs, opset):
    x = inputs[0]
    if opset < 12:
        ratio = attrs.get("ratio", 0.5)
        # Dropout-7..11 has no training input (inference graphs: identity); Dropout-6 has is_test.
        training = opset < 7 and not attrs.get("is_test", 0)
    else:
        ratio = float(scalar(opt(inputs, 1), 0.5))
        training = bool(scalar(opt(inputs, 2), False))
    if not training or ratio == 0:
        return [x.clone(), torch.ones(x.shape, dtype=torch.bool, device=x.device)]
    keep = (torch.rand(x.shape, generator=_gen(attrs), dtype=torch.float64, device="cpu") >= ratio).to(x.device)
    return [(x * keep / (1.0 - ratio)).to(x.dtype), keep]
