"""The weight update ops of a training session (PopART's ``SGD0VarUpdateOpx``,
``SGD1AccumulateOpx``, ``SGD1VarUpdateOpx``, ``SGD1AcclUpdateOpx``) through ``popops``'
``scaledAddTo`` / ``scaledSubtractFrom``, writing the weight or velocity in place (one
``ScaledAdd``-family vertex per tile of the tensor). Equations: :mod:`openipu.popart.transforms.optimizer`.

A compound scalar is the op's attribute when const, else its tensor input (after the tensor
inputs, in ``scalar_names`` order).
"""

from __future__ import annotations

from openipu.poplar import program as P
from openipu.poplibs import popops
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import graph, name

GC = "ai.graphcore"


def _scalars(ctx, op, n_tensors: int) -> dict:
    out = {}
    for k, s in enumerate(op.attrs.get("scalar_names", [])):
        i = n_tensors + k
        if i < len(op.inputs) and op.inputs[i]:
            out[s] = ctx.input(op, i)
        else:
            out[s] = float(op.attrs[s])
    return out


@lowering("SGD0VarUpdate", domain=GC)
def sgd0(ctx, op):
    g_, w, grad = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    s = _scalars(ctx, op, 2)
    wdsf, slr = s["weightDecayScaleFactor0"], s["scaledLearningRate0"]
    if isinstance(wdsf, float) and wdsf == 1.0:
        popops.scaledSubtractFrom(g_, w, grad, slr, ctx.prog, name(op))
    else:
        popops.scaledSubtractFrom(g_, w, wdsf, grad, slr, ctx.prog, name(op))
    return [w]


@lowering("SGD1Accumulate", domain=GC)
def sgd1_accumulate(ctx, op):
    v, grad = ctx.input(op, 0), ctx.input(op, 1)
    s = _scalars(ctx, op, 2)
    popops.scaledAddTo(graph(ctx, op), v, grad, s["dampeningScaleFactor1"], ctx.prog, name(op))
    return [v]


@lowering("SGD1VarUpdate", domain=GC)
def sgd1_var_update(ctx, op):
    g_, w, v = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    nesterov = "nesterovGradScaleFactor1" in op.attrs.get("scalar_names", [])
    s = _scalars(ctx, op, 3 if nesterov else 2)
    step = v
    if nesterov:        # step = mm * v + ngsf1 * g + nwd1 * w
        grad = ctx.input(op, 2)
        step = g_.clone(w, f"{name(op)}/nesterov")
        ctx.prog.add(P.Copy(v, step))
        popops.scaledAddTo(g_, step, float(op.attrs["momentum"]), grad, s["nesterovGradScaleFactor1"], ctx.prog,
                           f"{name(op)}/grad")
        popops.scaledAddTo(g_, step, w, s["nesterovWeightDecay1"], ctx.prog, f"{name(op)}/decay")
    popops.scaledSubtractFrom(g_, w, step, s["scaledLearningRate1"], ctx.prog, name(op))
    return [w]


@lowering("SGD1AcclUpdate", domain=GC)
def sgd1_accl_update(ctx, op):
    v, w = ctx.input(op, 0), ctx.input(op, 1)
    s = _scalars(ctx, op, 2)
    popops.scaledAddTo(graph(ctx, op), v, s["scaledMomentum1"], w, s["scaledWeightDecay1"], ctx.prog, name(op))
    return [v]
