"""Random ATen ops: ``rand`` / ``rand_like`` / ``uniform`` -> ONNX RandomUniform(Like),
``randn`` / ``randn_like`` / ``normal`` -> RandomNormal(Like), ``bernoulli`` -> Bernoulli (a
tensor of probabilities) or a uniform draw compared with ``p``, ``randint`` / ``randint_like`` ->
a floored uniform draw. PopART's RandomSetup (:mod:`openipu.popart.transforms.random_seed`)
seeds each from the session's seed (``Options.randomSeed``) and its own modifier, so every call
draws new numbers and the same seed repeats the same sequence (PopTorch's behaviour; the
numbers are poprand's stream, not torch's CPU generator's).

PopTorch's supported-ops list: ``rand``, ``randn``, ``normal_``, ``uniform_``, ``bernoulli``,
``dropout`` (in :mod:`.elementwise`), ``randint``.
"""

from __future__ import annotations

import numpy as np
import onnx

from openipu.poptorch.lower import POPART_TYPE, aten

_ONNX_DTYPE = {"FLOAT": onnx.TensorProto.FLOAT, "FLOAT16": onnx.TensorProto.FLOAT16}


def _out(lw):
    v = lw.val()
    return [int(d) for d in v.shape], POPART_TYPE[v.dtype]


def _uniform(lw, shape, low=0.0, high=1.0, dtype="FLOAT"):
    return lw.onnx.randomuniform(shape=shape, dtype=_ONNX_DTYPE.get(dtype, onnx.TensorProto.FLOAT), low=float(low),
                                 high=float(high), debugContext=lw._name())


def _normal(lw, shape, mean=0.0, std=1.0, dtype="FLOAT"):
    return lw.onnx.randomnormal(shape=shape, dtype=_ONNX_DTYPE.get(dtype, onnx.TensorProto.FLOAT), mean=float(mean),
                                scale=float(std), debugContext=lw._name())


def _as(lw, tid, dtype):
    return tid if dtype in _ONNX_DTYPE else lw.cast(tid, dtype)


@aten("aten.rand.default", "aten.rand_like.default")
def rand(lw, n):
    shape, dt = _out(lw)
    return _as(lw, _uniform(lw, shape, dtype=dt), dt)


@aten("aten.randn.default", "aten.randn_like.default")
def randn(lw, n):
    shape, dt = _out(lw)
    return _as(lw, _normal(lw, shape, dtype=dt), dt)


@aten("aten.uniform.default", "aten.uniform_.default")
def uniform(lw, n):
    shape, dt = _out(lw)
    low = n.args[1] if len(n.args) > 1 else n.kwargs.get("from", 0.0)
    high = n.args[2] if len(n.args) > 2 else n.kwargs.get("to", 1.0)
    return _as(lw, _uniform(lw, shape, low, high, dt), dt)


@aten("aten.normal.float_float", "aten.normal_functional.default", "aten.normal.default", "aten.normal_.default")
def normal(lw, n):
    shape, dt = _out(lw)
    first = 0 if str(n.target).startswith("aten.normal.float_float") else 1
    mean = n.args[first] if len(n.args) > first else n.kwargs.get("mean", 0.0)
    std = n.args[first + 1] if len(n.args) > first + 1 else n.kwargs.get("std", 1.0)
    return _as(lw, _normal(lw, shape, mean, std, dt), dt)


@aten("aten.normal.Tensor_Tensor", "aten.normal.Tensor_float", "aten.normal.float_Tensor")
def normal_tensor(lw, n):
    """``mean + std * N(0, 1)`` with tensor means and/or deviations."""
    shape, dt = _out(lw)
    z = _normal(lw, shape, dtype="FLOAT")
    mean = lw.like(n.args[0], n) if len(n.args) > 0 else lw.const(0.0)
    std = lw.like(n.args[1], n) if len(n.args) > 1 else lw.const(1.0)
    return lw.onnx.add([mean, lw.onnx.mul([std, z])], lw._name("normal"))


@aten("aten.bernoulli.default", "aten.bernoulli.p", "aten.bernoulli_.float", "aten.bernoulli.Tensor")
def bernoulli(lw, n):
    shape, dt = _out(lw)
    x = n.args[0]
    p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p")
    if p is None:       # probabilities in x
        return lw.onnx.bernoulli([lw.t(x)], debugContext=lw._name())
    u = _uniform(lw, shape)
    pt = lw.like(p, x) if hasattr(p, "meta") else lw.const(float(p))
    return lw.cast(lw.onnx.less([u, pt], lw._name("lt")), dt)


@aten("aten.randint.low", "aten.randint.default", "aten.randint_like.low_dtype", "aten.randint_like.default")
def randint(lw, n):
    shape, dt = _out(lw)
    name = str(n.target)
    args = list(n.args[1:] if "like" in name else n.args)
    if name.endswith(".low") or name.endswith("low_dtype"):
        low, high = int(args[0]), int(args[1])
    else:
        low, high = 0, int(args[0])
    u = _uniform(lw, shape, float(low), float(high))
    r = lw.onnx.floor([u], lw._name("floor"))
    r = lw.onnx.min([r, lw.const(np.float32(high - 1))], lw._name("clip"))
    return lw.cast(r, dt) if dt != "FLOAT" else r


@aten("aten.randperm.default")
def randperm(lw, n):
    """``torch.randperm(n)``: the order that sorts ``n`` uniform draws (PopTorch's lowering: the
    indices of a TopK of a RandomUniform)."""
    size = int(n.args[0])
    _, dt = _out(lw)
    u = _uniform(lw, [size])
    _, idx = lw.onnx.topk([u, lw.shape_const([size])], axis=0, largest=1, sorted=1, debugContext=lw._name("topk"))
    return lw.cast(idx, dt)
