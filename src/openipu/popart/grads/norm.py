"""Gradients of the normalisations: one ``ai.graphcore`` ``<Norm>Grad`` op for the input, scale
and bias gradients (PopART's ``BatchNormGradOp`` / ``GroupNormGradOp`` /
``InstanceNormGradOp``; inputs ``(x, scale, mean, invStdDev | var, gy)``, outputs ``(dx, dscale,
dbias)``), lowered through ``popnn``'s ``<norm>Gradients`` / ``<norm>ParamGradients``:

- LayerNormalization (ONNX-17): ``LayerNormalizationGrad``. The forward op keeps its ``Mean`` /
  ``InvStdDev`` outputs for it (added to a float op that does not output them, as PopART's
  GroupNorm does); with half inputs the statistics are recomputed in the grad op;
- BatchNormalization in training mode (``training_mode=1``, or the 5-output form of opsets < 14):
  ``BatchNormalizationGrad`` of the batch statistics (the saved mean / variance outputs when the
  op has them, else recomputed). In inference mode it has no gradient, as in PopART (detach it);
- InstanceNormalization, GroupNormalization: ``InstanceNormalizationGrad`` /
  ``GroupNormalizationGrad`` (statistics recomputed: the ONNX ops do not output them);
- RMSNormalization, LpNormalization, MeanVarianceNormalization, LRN: the generic gradient ops
  (``LRNGrad`` ..., the vjp of their host kernels).
"""

from __future__ import annotations

from openipu.popart.errors import popart_exception
from openipu.popart.grads import grad_rule
from openipu.popart.onnx_ops._common import norm_axis
from openipu.popart.onnx_ops.normalization import bn_training


def _norm_grad(g, op, kind: str, stats: list):
    x, scale = g.x(0), g.x(1)
    bias = g.x(2)
    bshape = g.shape(bias) if bias else g.shape(scale)
    outs = [(g.shape(x), g.dtype(x)), (g.shape(scale), g.dtype(scale)), (bshape, g.dtype(scale))]
    attrs = g.fwd_attrs(fwd_opset=op.opset, bias_shape=bshape)
    dx, ds, db = g.add_n(kind, [x, scale, stats[0], stats[1], g.gy()], outs, attrs)
    grads = [dx if g.needs(0) else None, ds if g.needs(1) else None, db if bias and g.needs(2) else None]
    return (grads + [None] * len(op.inputs))[:len(op.inputs)]


def _saved_stats(g, op, k0: int):
    """The forward op's statistics outputs ``k0``, ``k0 + 1`` when it has them (in ``x``'s
    dtype), else ``["", ""]``."""
    outs = op.outputs
    if len(outs) > k0 + 1 and outs[k0] and outs[k0 + 1] and g.dtype(outs[k0]) == g.dtype(g.x(0)):
        return [outs[k0], outs[k0 + 1]]
    return ["", ""]


@grad_rule("LayerNormalization")
def layer_norm(g, op):
    stats = _saved_stats(g, op, 1)
    if not stats[0] and g.dtype(g.x(0)) == "FLOAT":
        xs = g.shape(g.x(0))
        axis = norm_axis(op.attrs.get("axis", -1), len(xs), "LayerNormalization")
        stat_shape = xs[:axis] + [1] * (len(xs) - axis)
        stats = [g.fwd_output(k, stat_shape, "FLOAT") for k in (1, 2)]
    return _norm_grad(g, op, "LayerNormalizationGrad", stats)


@grad_rule("BatchNormalization")
def batch_norm(g, op):
    if not bn_training(op.attrs, op.opset):
        raise popart_exception(
            f"BatchNorm Op \"{op.name}\" has {len(op.outputs)} output(s) which means it is in inference mode, but "
            "its gradient Op is being created. To use the BatchNorm Op in inference mode during training, it has "
            "to be detached first.")
    stats = _saved_stats(g, op, 3) if op.opset < 14 else ["", ""]
    return _norm_grad(g, op, "BatchNormalizationGrad", stats)


@grad_rule("InstanceNormalization")
def instance_norm(g, op):
    return _norm_grad(g, op, "InstanceNormalizationGrad", ["", ""])


@grad_rule("GroupNormalization")
def group_norm(g, op):
    return _norm_grad(g, op, "GroupNormalizationGrad", ["", ""])


@grad_rule("RMSNormalization", "LpNormalization", "MeanVarianceNormalization", "LRN")
def generic_norm(g, op):
    return [g.vjp(i) if g.needs(i) else None for i in range(len(op.inputs))]

