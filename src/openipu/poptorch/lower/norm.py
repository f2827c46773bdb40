"""Normalisations: batch normalisation -> PopART's ``batchnormalization`` (training: batch
statistics, the running statistics updated in place by the session, PyTorch's unbiased running
variance; eval: the running statistics), layer normalisation -> ``groupnormalization`` with one
group over the normalised (last) dimensions (PopTorch's lowering, ``popnn``'s norm), group
normalisation -> ``groupnormalization``."""

from __future__ import annotations

import numpy as np

from openipu.poptorch.errors import Error
from openipu.poptorch.lower import aten


def _affine(lw, n, arg, c, value):
    """The scale or bias (a parameter, or ones / zeros when the layer has none)."""
    if arg is not None:
        return lw.t(arg)
    return lw.const(np.full([c], value, np.float32), lw.dtype(n.args[0]))


@aten("aten._native_batch_norm_legit_functional.default", "aten._native_batch_norm_legit_no_training.default",
      "aten._native_batch_norm_legit.default", "aten.batch_norm.default", "aten.native_batch_norm.default")
def batch_norm(lw, n):
    name = str(n.target)
    x, w, b, rm, rv = n.args[:5]
    if "no_training" in name:
        training, momentum, eps = False, n.args[5], n.args[6]
    elif name.startswith("aten.batch_norm"):
        training, momentum, eps = n.args[5], n.args[6], n.args[7]
    else:
        training, momentum, eps = n.args[5], n.args[6], n.args[7]
    c = lw.shape(x)[1]
    if rm is None or rv is None:
        raise Error("BatchNorm without running statistics (track_running_stats=False) is not supported")
    xs = lw.shape(x)
    xt = lw.t(x)
    if len(xs) == 2:        # BatchNorm1d on [N, C]: PopART's BatchNormalization wants [N, C, ...]
        xt = lw.b.reshape_const(lw.onnx, [xt], xs + [1], lw._name("to3d"))
    ins = [xt, _affine(lw, n, w, c, 1.0), _affine(lw, n, b, c, 0.0), lw.t(rm), lw.t(rv)]
    if training and lw.training:
        y, mean, var, *_ = lw.gc.batchnormalization(ins, 5, float(eps), 1.0 - float(momentum), lw._name())
        if len(xs) == 2:
            y = lw.b.reshape_const(lw.onnx, [y], xs, lw._name("to2d"))
        # (y, saved mean, saved rstd, new running mean, new running var) in PyTorch's order;
        # the session writes the running statistics back itself
        return (y, mean, var, mean, var) if "functional" in name or "native" in name else y
    y = lw.gc.batchnormalization(ins, 1, float(eps), 1.0 - float(momentum), lw._name())[0]
    if len(xs) == 2:
        y = lw.b.reshape_const(lw.onnx, [y], xs, lw._name("to2d"))
    return y if name.startswith("aten.batch_norm") else (y, None, None)


@aten("aten.native_layer_norm.default", "aten.layer_norm.default")
def layer_norm(lw, n):
    x, shape = n.args[0], list(n.args[1])
    w = n.args[2] if len(n.args) > 2 else None
    b = n.args[3] if len(n.args) > 3 else None
    eps = float(n.args[4]) if len(n.args) > 4 else 1e-5
    xs = lw.shape(x)
    k = len(shape)
    inner = int(np.prod(shape))
    outer = int(np.prod(xs[:-k])) if len(xs) > k else 1
    flat = lw.b.reshape_const(lw.onnx, [lw.t(x)], [outer, inner], lw._name("flatten"))
    scale = _affine(lw, n, w, inner, 1.0)
    bias = _affine(lw, n, b, inner, 0.0)
    if w is not None and k > 1:
        scale = lw.b.reshape_const(lw.onnx, [scale], [inner])
    if b is not None and k > 1:
        bias = lw.b.reshape_const(lw.onnx, [bias], [inner])
    y, mean, inv_std = lw.gc.groupnormalization([flat, scale, bias], 1, eps, lw._name())
    y = lw.b.reshape_const(lw.onnx, [y], xs, lw._name("reshape"))
    if str(n.target).startswith("aten.layer_norm"):
        return y
    stat_shape = xs[:-k] + [1] * k
    return (y, lw.b.reshape_const(lw.onnx, [mean], stat_shape), lw.b.reshape_const(lw.onnx, [inv_std], stat_shape))


@aten("aten.native_group_norm.default", "aten.group_norm.default")
def group_norm(lw, n):
    name = str(n.target)
    x = n.args[0]
    if name.startswith("aten.group_norm"):
        groups, w, b, eps = n.args[1], n.args[2] if len(n.args) > 2 else None, \
            n.args[3] if len(n.args) > 3 else None, float(n.args[4]) if len(n.args) > 4 else 1e-5
    else:
        w, b, _, c, _, groups, eps = n.args[1:8]
    c = lw.shape(x)[1]
    y, mean, inv_std = lw.gc.groupnormalization([lw.t(x), _affine(lw, n, w, c, 1.0), _affine(lw, n, b, c, 0.0)],
                                                int(groups), float(eps), lw._name())
    if name.startswith("aten.group_norm"):
        return y
    nb = lw.shape(x)[0]
    return (y, lw.b.reshape_const(lw.onnx, [mean], [nb, int(groups)]),
            lw.b.reshape_const(lw.onnx, [inv_std], [nb, int(groups)]))


@aten("aten._native_batch_norm_legit.no_stats")
def batch_norm_no_stats(lw, n):
    """Batch statistics without running ones (``InstanceNorm``, ``track_running_stats=False``):
    ``(x - mean) / sqrt(var + eps) * w + b`` over every dim but the channels; returns ``(y,
    mean, rstd)``."""
    x, w, b = n.args[:3]
    eps = float(n.args[5])
    shape = lw.shape(x)
    c = shape[1]
    axes = [0] + list(range(2, len(shape)))
    xt = lw.t(x)
    mean = lw.onnx.reducemean([xt], axes=axes, keepdims=1, debugContext=lw._name("mean"))
    d = lw.onnx.sub([xt, mean])
    var = lw.onnx.reducemean([lw.onnx.mul([d, d])], axes=axes, keepdims=1, debugContext=lw._name("var"))
    rstd = lw.onnx.reciprocal([lw.onnx.sqrt([lw.onnx.add([var, lw.const(eps, lw.dtype(x))])])], lw._name("rstd"))
    bshape = [c] + [1] * (len(shape) - 2)
    y = lw.onnx.mul([d, rstd])
    y = lw.onnx.mul([y, lw.b.reshape_const(lw.onnx, [_affine(lw, n, w, c, 1.0)], bshape)])
    y = lw.onnx.add([y, lw.b.reshape_const(lw.onnx, [_affine(lw, n, b, c, 0.0)], bshape)], lw._name())
    return (y, lw.b.reshape_const(lw.onnx, [mean], [c]), lw.b.reshape_const(lw.onnx, [rstd], [c]))
