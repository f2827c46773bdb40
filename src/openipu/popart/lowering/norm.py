"""ONNX normalisations through ``popnn`` (PopART's ``BatchNormOpx``, ``GroupNormOpx``,
``LayerNormOpx``, ``InstanceNormOpx``).

- BatchNormalization, inference: per channel ``mul = scale * rsqrt(var + eps)`` and
  ``add = B - mean * mul`` (two ``popops.map`` over ``[C]``), then
  ``popnn.bn.batchNormalise(acts, mul, add)`` (PopLibs' combined-multiplicand overload, one
  ``AFFINE`` map over the activations). Training mode (``training_mode=1``, or the 5-output form
  of opsets < 14): ``popnn.bn.batchNormStatistics`` of the batch, the same normalise with them,
  and the running mean / variance (and saved batch mean / variance) by ``popops.map``.
- LayerNormalization: ``x`` viewed as ``[prod(shape[:axis]), prod(shape[axis:])]``;
  ``popnn.ln.layerNormStatistics`` then ``layerNormalise``. The ``Mean`` / ``InvStdDevs``
  outputs are lowered when their type is the input's (float models).
- InstanceNormalization: ``popnn.in_`` statistics and normalise.
- GroupNormalization (scale / bias per channel, opset 21 form): ``popnn.gn`` with contiguous
  channel groups (``groupNormStridedChannelGrouping=false``, ONNX's grouping).

Statistics use float partials; the variance is the one-pass ``E[x^2] - E[x]^2`` unless the
session option ``enableStableNorm`` asks for the two-pass algorithm (PopART's rule). Half inputs
with ``stash_type=0`` (statistics in half) and other types use the generic lowering.
"""

from __future__ import annotations

import math

import numpy as np

from openipu import poplar
from openipu.poplibs import popnn, popops
from openipu.poplibs.popops import expr as E
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import FLOATS, dtype, graph, live_outputs, name, shape
from openipu.popart.onnx_ops._common import norm_axis
from openipu.popart.onnx_ops.normalization import bn_training


def _same_float(ir, ids) -> bool:
    types = {dtype(ir, x) for x in ids if x}
    return len(types) == 1 and next(iter(types)) in FLOATS


def _stable(ctx) -> bool:
    return bool(getattr(ctx.options, "enableStableNorm", False))


# -- BatchNormalization -----------------------------------------------------------------------
def _bn_training(op) -> bool:
    return bn_training(op.attrs, op.opset)


def _accepts_bn(op, ir):
    if len(op.inputs) < 5 or not all(op.inputs[:5]) or _bn_training(op) or live_outputs(op) != 1:
        return False
    if not _same_float(ir, op.inputs[:5] + op.outputs[:1]) or len(shape(ir, op.inputs[0])) < 2:
        return False
    c = shape(ir, op.inputs[0])[1]
    return all(math.prod(shape(ir, x)) == c for x in op.inputs[1:5])


@lowering("BatchNormalization", accepts=_accepts_bn)
def batch_norm(ctx, op):
    g = graph(ctx, op)
    x, scale, b, mean, var = (ctx.input(op, i) for i in range(5))
    scale, b, mean, var = (t.flatten() for t in (scale, b, mean, var))
    eps = float(op.attrs.get("epsilon", 1e-5))
    nm = name(op)
    mul = popops.map(g, E.Mul(E._1, E.Rsqrt(E.Add(E._2, E.Const(eps)))), [scale, var], ctx.prog, f"{nm}/mul")
    add = popops.map(g, E.Sub(E._1, E.Mul(E._2, E._3)), [b, mean, mul], ctx.prog, f"{nm}/add")
    return [popnn.bn.batchNormalise(g, x, mul, add, ctx.prog, nm)]


def _accepts_bn_training(op, ir):
    if len(op.inputs) < 5 or not all(op.inputs[:5]) or not _bn_training(op):
        return False
    if not _same_float(ir, op.inputs[:5] + [o for o in op.outputs if o]) or len(shape(ir, op.inputs[0])) < 2:
        return False
    xs = shape(ir, op.inputs[0])
    return math.prod(xs) > 0 and all(math.prod(shape(ir, x)) == xs[1] for x in op.inputs[1:5])


@lowering("BatchNormalization", accepts=_accepts_bn_training)
def batch_norm_training(ctx, op, unbiased: bool = False):
    """Training mode (PopART's ``BatchNormOpx::growSpatial``): the batch statistics
    (``popnn.bn.batchNormStatistics``), ``batchNormalise`` with them, the batch variance from
    the inverse standard deviation (``unbiased``: the inverse standard deviation first scaled by
    ``sqrt((n - 1) / n)``, PopART's ``unbiased_variance``), and the running statistics ``m *
    input + (1 - m) * batch``."""
    g = graph(ctx, op)
    nm = name(op)
    x, scale, b, mean, var = (ctx.input(op, i) for i in range(5))
    pshape = scale.shape()
    scale, b, mean, var = (t.flatten() for t in (scale, b, mean, var))
    eps = float(op.attrs.get("epsilon", 1e-5))
    m = float(op.attrs.get("momentum", 0.9))
    bm, inv = popnn.bn.batchNormStatistics(g, x, eps, ctx.prog, False, _stable(ctx), poplar.FLOAT, f"{nm}/stats")
    mul = popops.map(g, E.Mul(E._1, E._2), [scale, inv], ctx.prog, f"{nm}/multiplicand")
    add = popops.map(g, E.Sub(E._1, E.Mul(E._2, E._3)), [b, mul, bm], ctx.prog, f"{nm}/addend")
    y = popnn.bn.batchNormalise(g, x, mul, add, ctx.prog, nm)
    if unbiased:
        n = x.numElements() // max(x.dim(1), 1)
        inv = popops.map(g, E.Mul(E._1, E.Const(math.sqrt((n - 1) / n) if n else 1.0)), [inv], ctx.prog,
                         f"{nm}/unbiasedInvSd")
    bv = popops.map(g, E.Sub(E.Inv(E.Square(E._1)), E.Const(eps)), [inv], ctx.prog, f"{nm}/batchVar")
    run = E.Add(E.Mul(E.Const(1.0 - m), E._2), E.Mul(E.Const(m), E._1))
    rm = popops.map(g, run, [mean, bm], ctx.prog, f"{nm}/runningMean")
    rv = popops.map(g, run, [var, bv], ctx.prog, f"{nm}/runningVar")
    outs = [y, rm.reshape(pshape), rv.reshape(pshape), bm.reshape(pshape), bv.reshape(pshape)]
    return [outs[k] if o else None for k, o in enumerate(op.outputs)]


# -- Layer / Instance / Group normalisation ---------------------------------------------------
def _half_stash_ok(op, ir) -> bool:
    return dtype(ir, op.inputs[0]) != "FLOAT16" or op.attrs.get("stash_type", 1) == 1


def _ln_axis(op, ir):
    r = len(shape(ir, op.inputs[0]))
    try:
        return norm_axis(op.attrs.get("axis", -1), r, "LayerNormalization")
    except Exception:
        return None


def _accepts_ln(op, ir):
    if len(op.inputs) < 2 or not op.inputs[0] or not op.inputs[1]:
        return False
    n_out = live_outputs(op)
    if not _same_float(ir, [x for x in op.inputs[:3] if x] + op.outputs[:n_out]) or not _half_stash_ok(op, ir):
        return False
    axis = _ln_axis(op, ir)
    if axis is None:
        return False
    xs = shape(ir, op.inputs[0])
    c = math.prod(xs[axis:])
    if math.prod(xs) == 0 or c == 0:
        return False
    return all(_strip(shape(ir, x)) == _strip(xs[axis:]) for x in op.inputs[1:3] if x)


def _strip(s):
    """A shape without its leading 1s (equal stripped shapes broadcast to each other elementwise)."""
    s = list(s)
    while s and s[0] == 1:
        s.pop(0)
    return s


def _zeros(g, type_, n, nm):
    z = g.addConstant(type_, [n], np.zeros(n, np.float32), nm)
    g.setTileMapping(z, 0)
    return z


@lowering("LayerNormalization", accepts=_accepts_ln)
def layer_norm(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    x = ctx.input(op, 0)
    xs = x.shape()
    axis = _ln_axis(op, ctx.ir)
    rows, c = math.prod(xs[:axis]), math.prod(xs[axis:])
    acts = x.reshape([rows, c])
    gamma = ctx.input(op, 1).flatten()
    beta = ctx.input(op, 2)
    beta = beta.flatten() if beta is not None else _zeros(g, x.elementType(), c, f"{nm}/zeroBias")
    eps = float(op.attrs.get("epsilon", 1e-5))
    mean, inv = popnn.ln.layerNormStatistics(g, acts, eps, ctx.prog, False, _stable(ctx), poplar.FLOAT, f"{nm}/stats")
    out, _ = popnn.ln.layerNormalise(g, acts, gamma, beta, mean, inv, ctx.prog, nm)
    res = [out.reshape(xs)]
    stat_shape = list(xs[:axis]) + [1] * (len(xs) - axis)
    for k, t in ((1, mean), (2, inv)):
        if k < len(op.outputs):
            res.append(t.reshape(stat_shape) if op.outputs[k] else None)
    return res


def _accepts_in(op, ir):
    if len(op.inputs) != 3 or not all(op.inputs) or live_outputs(op) != 1:
        return False
    if not _same_float(ir, op.inputs + op.outputs[:1]):
        return False
    xs = shape(ir, op.inputs[0])
    return len(xs) >= 3 and math.prod(xs) > 0 and all(math.prod(shape(ir, x)) == xs[1] for x in op.inputs[1:])


@lowering("InstanceNormalization", accepts=_accepts_in)
def instance_norm(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    x, gamma, beta = (ctx.input(op, i) for i in range(3))
    eps = float(op.attrs.get("epsilon", 1e-5))
    mean, inv = popnn.in_.instanceNormStatistics(g, x, eps, ctx.prog, False, _stable(ctx), poplar.FLOAT,
                                                 f"{nm}/stats")
    out, _ = popnn.in_.instanceNormalise(g, x, gamma.flatten(), beta.flatten(), mean, inv, ctx.prog, nm)
    return [out]


def _accepts_gn(op, ir):
    if len(op.inputs) != 3 or not all(op.inputs) or live_outputs(op) != 1:
        return False
    if not _same_float(ir, op.inputs + op.outputs[:1]) or not _half_stash_ok(op, ir):
        return False
    xs = shape(ir, op.inputs[0])
    groups = int(op.attrs.get("num_groups", 0))
    if len(xs) < 2 or math.prod(xs) == 0 or groups < 1 or xs[1] % groups:
        return False
    return all(math.prod(shape(ir, x)) == xs[1] for x in op.inputs[1:])


_GN_OPTS = {"groupNormStridedChannelGrouping": "false"}


@lowering("GroupNormalization", accepts=_accepts_gn)
def group_norm(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    x, gamma, beta = (ctx.input(op, i) for i in range(3))
    eps = float(op.attrs.get("epsilon", 1e-5))
    groups = int(op.attrs["num_groups"])
    mean, inv = popnn.gn.groupNormStatistics(g, x, eps, ctx.prog, groups, False, _stable(ctx), poplar.FLOAT,
                                             f"{nm}/stats", _GN_OPTS)
    out, _ = popnn.gn.groupNormalise(g, x, gamma.flatten(), beta.flatten(), mean, inv, ctx.prog, nm, _GN_OPTS)
    return [out]
