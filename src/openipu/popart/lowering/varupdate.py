"""The weight update ops of a training session (PopART's ``SGD0VarUpdateOpx``,
``SGD1*Opx``, ``AccumulateOpx``, ``AccumulatorUpdateOpx``, ``AdamUpdaterOpx``, ``LambSquareOpx``,
``AdamVarUpdateOpx``, ``RMSPropUpdaterOpx``, ``AdaDeltaUpdaterOpx``, ``ScaledVarUpdateOpx``,
``ReplicatedAllReduceInplaceOpx``) through ``popops``: ``scaledAddTo`` / ``scaledSubtractFrom`` where
the update is a scaled add (one ``ScaledAdd``-family vertex per tile), else ``map`` /
``mapInPlace`` of the update expression (one generated vertex per tile), ``reduce`` for Lamb's
norms and a ``gcl`` all-reduce across replicas (the gradient's ReplicatedAllReduce is lowered in
:mod:`.graphcore`). State is written in place. Equations:
:mod:`openipu.popart.transforms.optimizer`.

A compound scalar is the op's attribute (named by its role) when const, else a tensor input
(after the ``n_tensors`` tensor inputs, in ``scalar_names`` order). Expressions compute in FLOAT
and cast the result to the written tensor's type (fp16 weights with fp32 state).
"""

from __future__ import annotations

from openipu import poplar
from openipu.poplibs import gcl, popops
from openipu.poplibs.popops import expr as pe
from openipu.poplibs.popops.reduce import Operation
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import comm_group, graph, name

GC = "ai.graphcore"


def _scalars(ctx, op) -> dict:
    """role -> float (const) or scalar tensor (non-const) of ``op``'s compound scalars."""
    out = {}
    n = int(op.attrs["n_tensors"])
    for k, s in enumerate(op.attrs.get("scalar_names", [])):
        i = n + k
        if i < len(op.inputs) and op.inputs[i]:
            out[s] = ctx.input(op, i)
        else:
            out[s] = float(op.attrs[s])
    return out


class _Expr:
    """The operands of one ``popops`` map: tensors become placeholders (cast to FLOAT), const
    scalars ``Const``."""

    def __init__(self):
        self.tensors = []

    def t(self, t):
        self.tensors.append(t)
        ph = pe.PlaceHolder(len(self.tensors))
        return ph if t.elementType() == poplar.FLOAT else pe.Cast(ph, poplar.FLOAT)

    def s(self, v):
        return pe.Const(float(v)) if isinstance(v, float) else self.t(v)


def _is(v, value: float) -> bool:
    return isinstance(v, float) and v == value


def _grad_term(e, ctx, op, sc, g_index: int, w_index: int):
    """``s = gradientScaling * g (+ weightDecay * w)``: the un-scaled gradient (input
    ``g_index``) with the L2 term (weight: input ``w_index``) when the op has one."""
    s = e.t(ctx.input(op, g_index))
    if "gradientScaling" in sc and not _is(sc["gradientScaling"], 1.0):
        s = s * e.s(sc["gradientScaling"])
    if "weightDecay" in sc:
        s = s + e.s(sc["weightDecay"]) * e.t(ctx.input(op, w_index))
    return s


@lowering("SGD0VarUpdate", domain=GC)
def sgd0(ctx, op):
    g_, w, grad = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    s = _scalars(ctx, op)
    wdsf, slr = s["weightDecayScaleFactor0"], s["scaledLearningRate0"]
    if isinstance(wdsf, float) and wdsf == 1.0:
        popops.scaledSubtractFrom(g_, w, grad, slr, ctx.prog, name(op))
    else:
        popops.scaledSubtractFrom(g_, w, wdsf, grad, slr, ctx.prog, name(op))
    return [w]


@lowering("SGD1Accumulate", domain=GC)
def sgd1_accumulate(ctx, op):
    v, grad = ctx.input(op, 0), ctx.input(op, 1)
    s = _scalars(ctx, op)
    popops.scaledAddTo(graph(ctx, op), v, grad, s["dampeningScaleFactor1"], ctx.prog, name(op))
    return [v]


@lowering("SGD1VarUpdate", "SGD2VarUpdate", domain=GC)
def sgd1_var_update(ctx, op):
    g_, w, v = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    nesterov = "nesterovGradScaleFactor1" in op.attrs.get("scalar_names", [])
    s = _scalars(ctx, op)
    step = v
    if nesterov:        # step = mm * v + ngsf1 * a + nwd1 * w (PopART's SGD1NesterovOpx: one map)
        e = _Expr()
        x = e.s(s["momentum"]) * e.t(v) + e.s(s["nesterovGradScaleFactor1"]) * e.t(ctx.input(op, 2))
        if not _is(s["nesterovWeightDecay1"], 0.0):
            x = x + e.s(s["nesterovWeightDecay1"]) * e.t(w)
        step = popops.map(g_, pe.Cast(x, w.elementType()), e.tensors, ctx.prog, f"{name(op)}/nesterov")
    popops.scaledSubtractFrom(g_, w, step, s["scaledLearningRate1"], ctx.prog, name(op))
    return [w]


@lowering("SGD1AcclUpdate", "SGD2PartialAcclUpdate", domain=GC)
def sgd1_accl_update(ctx, op):
    """``v = smm1 * v + swd1 * w`` in place. With a const zero ``swd1`` the weight is not read:
    ``v *= smm1`` (zeroed when ``smm1`` is 0), as PopART's ``SGD1AcclUpdateOpx`` does; the
    velocity, laid out like the gradient, then needs no exchange from the weight's layout."""
    g_, v = graph(ctx, op), ctx.input(op, 0)
    s = _scalars(ctx, op)
    smm, swd = s["scaledMomentum1"], s["scaledWeightDecay1"]
    if not _is(swd, 0.0):
        popops.scaledAddTo(g_, v, smm, ctx.input(op, 1), swd, ctx.prog, name(op))
    elif _is(smm, 0.0):
        popops.zero(g_, v, ctx.prog, name(op))
    elif not _is(smm, 1.0):
        e = _Expr()
        popops.mapInPlace(g_, pe.Cast(e.t(v) * e.s(smm), v.elementType()), e.tensors, ctx.prog, name(op))
    return [v]


# -- gradient accumulation and replication ----------------------------------------------------
@lowering("Accumulate", domain=GC)
def accumulate(ctx, op):
    """``accl = f(accl, s)`` in place, ``s = gradientScaling * g (+ weightDecay * w)``; ``f`` by
    ``accumulationType`` (PopART's ``AccumulationType``; ``Mean``: the running mean
    ``(c * accl + s) / (c + 1)`` with ``c`` the micro-batch counter, input 2)."""
    g_, acc, grad = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    sc = _scalars(ctx, op)
    kind = op.attrs["accumulationType"]
    if kind == "Mean":
        sc["factor"] = ctx.input(op, 2)
    if kind == "Add" and "gradientScaling" not in sc and "weightDecay" not in sc:
        popops.scaledAddTo(g_, acc, grad, 1.0, ctx.prog, name(op))
        return [acc]
    e = _Expr()
    a = e.t(acc)
    if "rescaleRatio" in sc:    # a scaled optimizer state follows a new loss scaling (RescaleAccumulate)
        r = e.s(sc["rescaleRatio"])
        a = a * (r * r if kind == "MovingAverageSquare" else r)
    s = _grad_term(e, ctx, op, sc, 1, 2)
    fv = sc.get("factor", 1.0)
    f = e.s(fv)
    # a const factor's complement is taken on the host, in double, before it becomes a float32
    # constant (0.001 for beta2 = 0.999, not 1 - float32(0.999)), as the IR executor's kernel does
    c = e.s(1.0 - fv) if isinstance(fv, float) else 1.0 - f
    expr = {"Add": lambda: a + s, "DampenedAdd": lambda: a + f * s, "DampenedAddSquare": lambda: a + f * s * s,
            "DecayAdd": lambda: f * a + s, "DecayAddSquare": lambda: f * a + s * s,
            "Mean": lambda: (f * a + s) / (f + 1.0),
            "MovingAverage": lambda: f * a + c * s,
            "MovingAverageSquare": lambda: f * a + c * s * s,
            "Infinity": lambda: pe.Max(f * a, pe.Abs(s))}[kind]()
    popops.mapInPlace(g_, pe.Cast(expr, acc.elementType()), e.tensors, ctx.prog, name(op))
    return [acc]


@lowering("AccumulatorUpdate", domain=GC)
def accumulator_update(ctx, op):
    """Zero the gradient accumulator after the update (PopART's ``AccumulatorUpdateOp``)."""
    acc = ctx.input(op, 0)
    popops.zero(graph(ctx, op), acc, ctx.prog, name(op))
    return [acc]


@lowering("ReplicatedAllReduceInplace", domain=GC)
def replicated_all_reduce_inplace(ctx, op):
    """Sum (attribute ``op`` Mean: mean) over the replicas in place
    (``gcl::allReduceInPlaceCrossReplica``)."""
    t = ctx.input(op, 0)
    operator = gcl.CollectiveOperator.MEAN if op.attrs.get("op") == "Mean" else gcl.CollectiveOperator.ADD
    gcl.allReduceInPlaceCrossReplica(graph(ctx, op), t, operator, ctx.prog, comm_group(op), debug_name=name(op))
    return [t]


# -- Adam / Lamb ----------------------------------------------------------------------------
@lowering("AdamUpdater", domain=GC)
def adam_updater(ctx, op):
    """``t += 1``; ``x = mc / (sqrt(vc) + eps) [+ wd w]`` (AdaMax ``mc / (v + eps)``), with the
    bias corrections of the mode. Returns ``x`` (the weight's type)."""
    g_ = graph(ctx, op)
    m, v, t = (ctx.input(op, i) for i in range(3))
    sc = _scalars(ctx, op)
    mode = op.attrs["mode"]
    popops.mapInPlace(g_, pe.Add(pe._1, pe.Const(1.0)), [t], ctx.prog, f"{name(op)}/step")
    e = _Expr()
    mh, vh, step = e.t(m), e.t(v), e.t(t)
    if op.attrs.get("eps_before_correction") and mode == "Adam":     # Keras's Adam: eps added to sqrt(v)
        x = mh / (pe.Sqrt(vh) + e.s(sc["eps"])) * (pe.Sqrt(1.0 - pe.Pow(e.s(sc["beta2"]), step)) /
                                                   (1.0 - pe.Pow(e.s(sc["beta1"]), step)))
    else:
        if mode in ("Adam", "Lamb", "AdaMax"):
            mh = mh / (1.0 - pe.Pow(e.s(sc["beta1"]), step))
        if mode in ("Adam", "Lamb"):
            vh = vh / (1.0 - pe.Pow(e.s(sc["beta2"]), step))
        x = mh / ((vh if mode == "AdaMax" else pe.Sqrt(vh)) + e.s(sc["eps"]))
    if "weightDecay" in sc:
        x = x + e.s(sc["weightDecay"]) * e.t(ctx.input(op, 3))
    wtype = ctx.input(op, 3).elementType() if "weightDecay" in sc else ctx.ptype(op.outputs[0])
    return [popops.map(g_, pe.Cast(x, wtype), e.tensors, ctx.prog, name(op))]


@lowering("LambSquare", domain=GC)
def lamb_square(ctx, op):
    """The sum of squares of a tensor, in FLOAT (``popops::reduce`` SQUARE_ADD)."""
    x = ctx.input(op, 0)
    return [popops.reduce(graph(ctx, op), x.flatten(), poplar.FLOAT, [0], Operation.SQUARE_ADD, ctx.prog,
                          debug_name=name(op))]


@lowering("AdamVarUpdate", domain=GC)
def adam_var_update(ctx, op):
    """``w -= lr * x``; Lamb: ``* min(sqrt(r1sq), mwn) / sqrt(r2sq)`` (1 when either is 0)."""
    g_, w, x = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    sc = _scalars(ctx, op)
    lr = sc["learningRate"]
    if int(op.attrs["n_tensors"]) == 4:
        e = _Expr()
        r1, r2 = pe.Sqrt(e.t(ctx.input(op, 2))), pe.Sqrt(e.t(ctx.input(op, 3)))
        phi = pe.Min(r1, e.s(sc["maxWeightNorm"]))
        ok = pe.And(pe.Gt(phi, pe.Const(0.0)), pe.Gt(r2, pe.Const(0.0)))
        ratio = pe.Select(phi / r2, pe.Const(1.0), ok)
        lr = popops.map(g_, ratio * e.s(lr), e.tensors, ctx.prog, f"{name(op)}/trust")
    popops.scaledSubtractFrom(g_, w, x, lr, ctx.prog, name(op))
    return [w]


# -- Adaptive ---------------------------------------------------------------------------------
@lowering("RMSPropUpdater", domain=GC)
def rmsprop_updater(ctx, op):
    """``x = s / (sqrt(v1 [- v2^2]) + eps)`` (TF variant ``s / sqrt(v1 [- v2^2] + eps)``)."""
    sc = _scalars(ctx, op)
    centered = bool(op.attrs.get("centered", 0))
    e = _Expr()
    s = _grad_term(e, ctx, op, sc, 0, 3 if centered else 2)
    d = e.t(ctx.input(op, 1))
    if centered:
        v2 = e.t(ctx.input(op, 2))
        d = d - v2 * v2
    eps = e.s(sc["eps"])
    x = s / (pe.Sqrt(d + eps) if op.attrs.get("tf_variant") else pe.Sqrt(d) + eps)
    return [popops.map(graph(ctx, op), pe.Cast(x, ctx.ptype(op.outputs[0])), e.tensors, ctx.prog, name(op))]


@lowering("AdaDeltaUpdater", domain=GC)
def adadelta_updater(ctx, op):
    """``x = s * sqrt(v2 + eps) / sqrt(v1 + eps)``."""
    sc = _scalars(ctx, op)
    e = _Expr()
    s = _grad_term(e, ctx, op, sc, 0, 3)
    v1, v2, eps = e.t(ctx.input(op, 1)), e.t(ctx.input(op, 2)), e.s(sc["eps"])
    x = s * pe.Sqrt(v2 + eps) / pe.Sqrt(v1 + eps)
    return [popops.map(graph(ctx, op), pe.Cast(x, ctx.ptype(op.outputs[0])), e.tensors, ctx.prog, name(op))]


@lowering("ScaledVarUpdate", domain=GC)
def scaled_var_update(ctx, op):
    """``w -= lr * (x + wd * w)`` (no ``wd`` term in L2 mode; ``lr`` 1 when absent)."""
    g_, w, x = graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1)
    sc = _scalars(ctx, op)
    lr = sc.get("learningRate", 1.0)
    if "weightDecay" not in sc:
        popops.scaledSubtractFrom(g_, w, x, lr, ctx.prog, name(op))
        return [w]
    e = _Expr()
    wv = e.t(w)
    expr = wv - e.s(lr) * (e.t(x) + e.s(sc["weightDecay"]) * wv)
    popops.mapInPlace(g_, pe.Cast(expr, w.elementType()), e.tensors, ctx.prog, name(op))
    return [w]
