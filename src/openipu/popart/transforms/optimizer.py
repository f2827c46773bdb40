"""The weight update ops of a training session (PopART's ``Optimizer::createOp`` per weight,
after ``constructBackwards``), in ``ai.graphcore``, each writing its first input in place:

- no momentum: ``SGD0VarUpdate(w, g)``: ``w = w * wdsf0 - slr0 * g``;
- momentum (``SGDAccumulatorAndMomentum.Combined``): ``SGD1Accumulate(v, g)``:
  ``v += dpsf1 * g``; ``SGD1VarUpdate(w, v)``: ``w -= slr1 * v`` (with nesterov
  ``SGD1VarUpdate(w, v, g)``: ``w -= slr1 * (ngsf1 * g + nwd1 * w + mm * v)``);
  ``SGD1AcclUpdate(v, w)``: ``v = v * smm1 + swd1 * w``.

The compound scalars (:func:`openipu.popart.optimizer.sgd_scalars`) are attributes when const;
a non-const one is an optimizer tensor (a scalar FLOAT device variable, written by
``optimizerFromHost``) passed as an extra input, named as PopART names them
(``Default<Name>___FLOAT`` for the session default, ``Specific<Name>___<weight>`` for a weight
with ``insertSpecific`` values). The velocity ``Accl___<weight>`` is a Variable of the weight's
type and shape, initialised to SGD1's initial value.
"""

from __future__ import annotations

import numpy as np

from openipu.popart.errors import popart_exception
from openipu.popart.grads import GRAPHCORE
from openipu.popart.optimizer import SGD, initial_velocity, sgd_scalars
from openipu.popart.transforms.autodiff import forward_op

ACCL_PREFIX = "Accl___"
UPDATED_PREFIX = "UpdatedVar___"
LOSS_SCALING_PREFIX = "lossScaling_"


def _scalar_id(opt, name: str, weight: str) -> str:
    cap = name[0].upper() + name[1:]
    return f"Specific{cap}___{weight}" if opt.hasSpecific(weight) else f"Default{cap}___FLOAT"


def reduction_factors(options) -> tuple[float, float]:
    """``(af, rf)`` of the update equations: the accumulation factor when gradients are meaned
    over it (``accumulationAndReplicationReductionType`` Mean), else 1; the replication factor."""
    mean = str(options.accumulationAndReplicationReductionType).endswith("Mean")
    return (float(options.accumulation_factor()) if mean else 1.0), float(options.replication_factor())


def scalar_values(opt, weights: list[str], af: float, rf: float) -> dict[str, float]:
    """Values of the non-const optimizer tensors: id -> value (for ``optimizerFromHost``)."""
    out = {}
    for w in weights:
        for name, (val, const) in sgd_scalars(opt, w, af, rf).items():
            if not const:
                out[_scalar_id(opt, name, w)] = val
    return out


def loss_scaling_seed(ir, opt, loss: str) -> str | float:
    """The loss gradient: the const loss scaling, or the ``lossScaling_<TYPE>`` tensor."""
    ls = opt.lossScaling()
    if ls.isConst():
        return ls.val()
    dtype = ir.tensors[loss].info.data_type()
    tid = f"{LOSS_SCALING_PREFIX}{dtype}"
    if tid not in ir.tensors:
        from openipu.popart.tensorinfo import NUMPY_OF
        ir._add_tensor(tid, dtype, list(ir.tensors[loss].info.shape()), "Variable",
                       np.full(ir.tensors[loss].info.shape(), ls.val(), NUMPY_OF[dtype]))
        ir.optimizer_tensors.add(tid)
    return tid


def apply(ir, opt, grads: dict[str, str], af: float = 1.0, rf: float = 1.0) -> None:
    """Append the update ops of every weight in ``grads`` (weight id -> gradient id)."""
    if not isinstance(opt, SGD):
        raise popart_exception(f"openipu does not support the {type(opt).__name__} optimizer yet: use popart.SGD "
                               "or popart.ConstSGD")
    for w, g in grads.items():
        wt = ir.tensors[w]
        scal = sgd_scalars(opt, w, af, rf)
        attrs, extra = {}, {}
        for name, (val, const) in scal.items():
            if const:
                attrs[name] = float(val)
            else:
                tid = _scalar_id(opt, name, w)
                if tid not in ir.tensors:
                    ir._add_tensor(tid, "FLOAT", [], "Variable", np.asarray(val, np.float32))
                    ir.optimizer_tensors.add(tid)
                extra[name] = tid
        if ir.tensors[g].info.data_type() != wt.info.data_type():
            raise popart_exception(f"The gradient of weight {w} is {ir.tensors[g].info.data_type()} but the weight is "
                                   f"{wt.info.data_type()}")
        fwd = forward_op(ir, g)
        if not opt.uses_momentum(w):
            _update(ir, "SGD0VarUpdate", [w, g], ["weightDecayScaleFactor0", "scaledLearningRate0"], attrs, extra,
                    f"{UPDATED_PREFIX}{w}", wt, fwd)
            continue
        v = f"{ACCL_PREFIX}{w}"
        ir._add_tensor(v, wt.info.data_type(), list(wt.info.shape()), "Variable", initial_velocity(opt, w, wt.value))
        _update(ir, "SGD1Accumulate", [v, g], ["dampeningScaleFactor1"], attrs, extra, f"AcclUpdated___{w}", wt, fwd)
        if "nesterovGradScaleFactor1" in scal:
            mm = opt.value("defaultMomentum", w)
            if not mm.isConst():
                raise popart_exception("openipu supports nesterov SGD with a const momentum only: give "
                                       "defaultMomentum as (value, True)")
            _update(ir, "SGD1VarUpdate", [w, v, g],
                    ["scaledLearningRate1", "nesterovGradScaleFactor1", "nesterovWeightDecay1"], attrs, extra,
                    f"{UPDATED_PREFIX}{w}", wt, fwd, momentum=mm.val())
        else:
            _update(ir, "SGD1VarUpdate", [w, v], ["scaledLearningRate1"], attrs, extra, f"{UPDATED_PREFIX}{w}", wt, fwd)
        _update(ir, "SGD1AcclUpdate", [v, w], ["scaledMomentum1", "scaledWeightDecay1"], attrs, extra,
                f"AcclFinal___{w}", wt, fwd)


def _update(ir, op_type, inputs, names, attrs, extra, out_id, wt, fwd, **more):
    """One update op writing ``inputs[0]``: its compound scalars ``names`` as attributes (const)
    or trailing tensor inputs (``extra``), placed like the forward op ``fwd``."""
    ins = list(inputs) + [extra.get(n, "") for n in names]
    while ins and not ins[-1]:
        ins.pop()
    a = {n: attrs[n] for n in names if n in attrs}
    a.update(more)
    a["scalar_names"] = list(names)
    op = ir.add_op(op_type, ins, [(out_id, wt.info.data_type(), wt.info.shape())], a, domain=GRAPHCORE,
                   opset=1, name=f"{op_type}/{inputs[0]}", like=fwd, modifies=(0,))
    op.grad_of = fwd
    return op
