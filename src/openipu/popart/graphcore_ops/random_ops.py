"""Random ops seeded like poprand: Dropout / ShapedDropout masks, RandomNormal / RandomUniform
(and ``*Like``), Bernoulli, GetRandomSeed. The same seed and modifier give the same mask on the
host and in poprand's vertices, so a gradient regenerates its forward op's mask.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops._registry import _gc, _ints


def seeded_keep_mask(seed: torch.Tensor, modifier: int, keep: float, shape) -> torch.Tensor:
    """Bernoulli(``keep``) mask of ``shape`` (float64 0/1) from a ``[2]`` seed and a modifier:
    ``poprand.bernoulli``'s stream (flattened element order), on ``seed``'s device: drawn with
    poprand's CPU generator and moved, so that every device draws the same mask."""
    from openipu.poplibs.poprand import _draw, _generators
    n = math.prod(shape)
    (g,) = _generators(seed.reshape(1, 2).to(torch.int64), int(modifier) & 0xFFFFFFFF)
    return _draw("bernoulli", (float(keep),), n, g, None).reshape(list(shape)).to(seed.device)


def _dropout_apply(x, seed, attrs, mask_shape):
    ratio = float(attrs.get("ratio", 0.5))
    keep = 1.0 - ratio
    m = seeded_keep_mask(seed, int(attrs.get("seedModifier", 0)), keep, mask_shape)
    m = m.reshape([1] * (x.dim() - len(mask_shape)) + list(mask_shape))
    return (x * (m.to(x.dtype) * torch.tensor(1.0 / keep, dtype=x.dtype, device=x.device))).to(x.dtype), m


@_gc("Dropout", "DropoutGrad", flops=lambda i, o, a: 3.0 * math.prod(o[0]))
def seeded_dropout(inputs, attrs, opset):
    """Training dropout (PopART's DropoutOp after its RandomSetup): ``[x, seed [2] UINT32] ->
    [x * mask / (1 - ratio)(, mask BOOL)]``, the mask ~ Bernoulli(1 - ratio) from the seed and
    ``seedModifier``. ``DropoutGrad`` (``[gy, seed]``) applies the same mask to the gradient."""
    x, seed = inputs[0], inputs[1]
    y, m = _dropout_apply(x, seed, attrs, list(x.shape))
    out = [y]
    if int(attrs.get("__num_outputs__", 1)) > 1:
        out.append(m.to(torch.bool).reshape(x.shape))
    return out


@_gc("ShapedDropout", flops=lambda i, o, a: 3.0 * math.prod(o[0]))
def shaped_dropout(inputs, attrs, opset):
    """PopART's ``ShapedDropout``: ``[x]`` (inference: the identity) or ``[x, seed]`` (training:
    a Bernoulli(1 - ratio) mask of ``shape``, broadcast over x, scaled by ``1 / (1 - ratio)``)."""
    x = inputs[0]
    if len(inputs) < 2 or inputs[1] is None:
        return [x.clone()]
    shape = _ints(attrs.get("shape"))
    try:
        torch.broadcast_shapes(tuple(shape), tuple(x.shape))
    except RuntimeError:
        raise ValueError(f"ShapedDropout: shape {shape} does not broadcast to the input's {list(x.shape)}") from None
    return [_dropout_apply(x, inputs[1], attrs, shape)[0]]


def _seeded_draw(seed, attrs, kind, params, shape) -> torch.Tensor:
    """``shape`` numbers of poprand's ``kind`` stream for the seed and ``seedModifier`` (float64),
    on ``seed``'s device (drawn on the CPU and moved: the same numbers on every device)."""
    from openipu.poplibs.poprand import _draw, _generators
    (g,) = _generators(seed.reshape(1, 2).to(torch.int64), int(attrs.get("seedModifier", 0)) & 0xFFFFFFFF)
    return _draw(kind, params, math.prod(shape), g, None).reshape(list(shape)).to(seed.device)


def _random_dtype(attrs, like=None):
    from openipu.popart.onnx_ops._common import torch_dtype
    if "dtype" in attrs:
        return torch_dtype(attrs["dtype"])
    return like.dtype if like is not None else torch.float32


@_gc("RandomNormal", "RandomNormalLike", flops=lambda i, o, a: 20.0 * math.prod(o[0]))
def seeded_random_normal(inputs, attrs, opset):
    """ONNX ``RandomNormal(Like)`` after RandomSetup: ``[(like,) seed [2] UINT32]`` -> normal
    numbers of ``shape`` (or ``like``'s) with ``mean`` and ``scale``, poprand's stream for the
    seed and ``seedModifier``."""
    like = inputs[0] if len(inputs) > 1 else None
    shape = list(like.shape) if like is not None else _ints(attrs["shape"])
    v = _seeded_draw(inputs[-1], attrs, "normal", (float(attrs.get("mean", 0.0)), float(attrs.get("scale", 1.0))),
                     shape)
    return [v.to(_random_dtype(attrs, like))]


@_gc("RandomUniform", "RandomUniformLike", flops=lambda i, o, a: 4.0 * math.prod(o[0]))
def seeded_random_uniform(inputs, attrs, opset):
    """ONNX ``RandomUniform(Like)`` after RandomSetup: ``[(like,) seed]`` -> U[``low``,
    ``high``) numbers, poprand's stream for the seed and ``seedModifier``."""
    like = inputs[0] if len(inputs) > 1 else None
    shape = list(like.shape) if like is not None else _ints(attrs["shape"])
    v = _seeded_draw(inputs[-1], attrs, "uniform", (float(attrs.get("low", 0.0)), float(attrs.get("high", 1.0))),
                     shape)
    return [v.to(_random_dtype(attrs, like))]


@_gc("Bernoulli", flops=lambda i, o, a: 4.0 * math.prod(o[0]))
def seeded_bernoulli(inputs, attrs, opset):
    """ONNX ``Bernoulli`` after RandomSetup: ``[p, seed]`` -> 1 with probability ``p`` (per
    element), else 0, from poprand's uniform stream for the seed and ``seedModifier``."""
    p = inputs[0]
    u = _seeded_draw(inputs[-1], attrs, "uniform", (0.0, 1.0), list(p.shape))
    return [(u < p.to(torch.float64)).to(_random_dtype(attrs, p))]


@_gc("GetRandomSeed")
def get_random_seed(inputs, attrs, opset):
    """PopART's ``GetRandomSeed``: the next step's seed (the first word incremented, mod 2^32)."""
    s = inputs[0].to(torch.int64).reshape(2).clone()
    s[0] = (s[0] + 1) & 0xFFFFFFFF
    return [s.to(inputs[0].dtype)]
