"""Automatic loss scaling (PopART's ``AutomaticLossScale`` transform, ``research/popart.md`` 3.9):
``SessionOptions.automaticLossScalingSettings.enabled`` with a non-const ``lossScaling``.

Each step the fp16 gradients tracked (``gradientTensorTrackingMethod``: every non-view-changing
fp16 gradient that reads no weight and has a consumer, the Conv / MatMul gradients, or the
gradients of ``toTrackTensors``) get a ``Histogram`` of their absolute values with one bin edge
at ``binEdgeLocation * 65504`` (``[lower, upper]`` counts). The counts are summed (over the
micro-batches with gradient accumulation, over the replicas with replication) and
``LossScaleUpdate`` scales the update factor ``lossScaleUpdateFactor`` (a state variable,
starting at 1) by 1/2 when ``upper > t / (1 - t) * lower`` (``t`` =
``thresholdUpperCountProportion``), else by 2, every ``updatePeriod`` steps. The loss gradient
is seeded with ``lossScaling * factor`` (``finalLossScale___<type>``) and every optimizer scalar
that undoes the loss scaling (the ``1 / ls`` in ``scaledLearningRate0``,
``dampeningScaleFactor1``, ``nesterovGradScaleFactor1``, ``gradientScaling``) is divided by the
factor, so the updates do not depend on it.
"""

from __future__ import annotations

import numpy as np
import onnx

from openipu.popart.errors import popart_exception
from openipu.popart.grads import GRAPHCORE
from openipu.popart.ir import OUTER_FRAGMENT

FACTOR_ID = "lossScaleUpdateFactor"
COUNTER_ID = "lossScaleUpdateCounter"
STATS_ID = "autoLossScaleStats"
FINAL_PREFIX = "finalLossScale___"
FP16_MAX = 65504.0
#: the compound scalars holding ``1 / lossScaling`` (module notes)
INVERSE_SCALARS = ("scaledLearningRate0", "dampeningScaleFactor1", "nesterovGradScaleFactor1", "gradientScaling")
#: ops whose output has the statistics of an input (PopART skips them, and the ones that cannot
#: overflow)
VIEW_CHANGING = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Concat",
                 "Slice", "Gather", "GatherGrad", "SliceGrad", "ConcatGrad", "Split"}
HEAVY = {"Conv", "MatMul", "ConvFlipWeights", "ConvWeightsGrad", "ConvDataGrad", "MultiConv", "Gemm"}


def apply(ir, opt, seed) -> None:
    """Add the loss-scaling update to a training IR (after the optimizer's update ops).
    ``seed``: the loss gradient (the ``lossScaling_<type>`` tensor id, or a float when const).

    Raises ``popart_exception`` with PopART's messages: const loss scaling, ``binEdgeLocation``
    or ``thresholdUpperCountProportion`` out of [0, 1], ``toTrackTensors`` without the matching
    tracking method (and the reverse), no fp16 gradient to track, pipelining without gradient
    accumulation; and (openipu) Adam's ``scaled_optimizer_state``."""
    s = ir.options.automaticLossScalingSettings
    if not s.enabled:
        return
    if not isinstance(seed, str):
        raise popart_exception("[AutomaticLossScale transform] The optimizer must have non-const loss scaling")
    if getattr(opt, "scaled_optimizer_state", False):
        raise popart_exception("openipu does not support automatic loss scaling with Adam's scaled_optimizer_state "
                               "(the state would keep a loss scaling the transform changes): pass "
                               "scaled_optimizer_state=False")
    for name in ("binEdgeLocation", "thresholdUpperCountProportion"):
        v = float(getattr(s, name))
        if not 0.0 <= v <= 1.0:
            raise popart_exception(f"[AutomaticLossScale transform] Out of range value for '{name}'. The current value "
                                   f"is {v}, but it should be in the range [0, 1].")
    acc = ir.options.accumulation_factor() > 1
    if ir.options.enablePipelining and not acc:
        raise popart_exception("Automatic loss scaling is not supported with pipelining unless gradient accumulation "
                               "is enabled (enableGradientAccumulation)")
    tracked = _tracked(ir, s)
    ls_info = ir.tensors[seed].info
    factor = _variable(ir, FACTOR_ID, "FLOAT", [], 1.0)
    counter = _variable(ir, COUNTER_ID, "FLOAT", [], 0.0)
    first = len(ir.ops)

    def add(op_type, ins, out, dtype, shape, like=None, context="Normal", **attrs):
        onnx_op = op_type in ("Mul", "Div", "Sum", "Cast")
        op = ir.add_op(op_type, ins, [(out, dtype, shape)], attrs, domain="" if onnx_op else GRAPHCORE,
                       opset=None if onnx_op else 1, name=f"{op_type}/{out}", like=like)
        op.execution_context = context
        return op
    # the loss scale the backward pass starts from, and the optimizer scalars that undo it
    rewire = {}
    ls_factor, prelude = factor, []
    if ls_info.data_type() != "FLOAT":      # an fp16 loss: the factor in its type
        prelude.append(add("Cast", [factor], f"{FACTOR_ID}__{ls_info.data_type()}", ls_info.data_type(), [],
                           to=int(onnx.TensorProto.FLOAT16)))
        ls_factor = prelude[0].outputs[0]
    final_ls = add("Mul", [seed, ls_factor], f"{FINAL_PREFIX}{ls_info.data_type()}", ls_info.data_type(), [])
    rewire[seed] = final_ls
    for tid in sorted(ir.optimizer_tensors):
        if any(tid.startswith((f"Default{n[0].upper()}{n[1:]}___", f"Specific{n[0].upper()}{n[1:]}___"))
               for n in INVERSE_SCALARS):
            users = ir.tensors[tid].consumers
            ctx = users[0].execution_context if users else "Normal"
            rewire[tid] = add("Div", [tid, factor], f"{tid}__final", "FLOAT", [], context=ctx)
    # statistics of the tracked gradients, after their producers
    edge = float(s.binEdgeLocation) * FP16_MAX
    hists = {t: add("Histogram", [t], f"{t}__histogram", "FLOAT", [2], like=ir.tensors[t].producer, levels=[edge],
                    absoluteOfInput=1) for t in tracked}
    stats = [h.outputs[0] for h in hists.values()]
    total = add("Sum", stats, "autoLossScaleStatsSum", "FLOAT", [2]).outputs[0] if len(stats) > 1 else stats[0]
    repl = ir.options.getGlobalReplicationFactor() > 1
    context = OUTER_FRAGMENT if acc else "Normal"
    if acc:     # summed over the micro-batches, then zeroed after the update
        acc_var = _variable(ir, STATS_ID, "FLOAT", [2], 0.0)
        add("Accumulate", [acc_var, total], f"{STATS_ID}__accumulated", "FLOAT", [2], accumulationType="Add",
            n_tensors=2, scalar_names=[]).modifies = (0,)
        total = acc_var
        if repl:
            op = add("ReplicatedAllReduceInplace", [acc_var], f"{STATS_ID}__reduced", "FLOAT", [2], context=context)
            op.modifies = (0,)
            total = op.outputs[0]
    elif repl:
        total = add("ReplicatedAllReduce", [total], f"{STATS_ID}__reduced", "FLOAT", [2]).outputs[0]
    t = float(s.thresholdUpperCountProportion)
    update = add("LossScaleUpdate", [factor, counter, total], f"{FACTOR_ID}__updated", "FLOAT", [], context=context,
                 upperToLowerRatio=t / (1.0 - t) if t < 1.0 else float("inf"), updatePeriod=int(s.updatePeriod))
    update.modifies = (0, 1)
    if acc:
        add("AccumulatorUpdate", [STATS_ID], f"{STATS_ID}__zeroed", "FLOAT", [2], context=context).modifies = (0,)
    # rewire the consumers, and place the new ops: a scale before its first consumer, a
    # histogram after its gradient's producer, the rest at the end
    new = ir.ops[first:]
    made = {id(op) for op in new}
    for src, op in rewire.items():
        out = op.outputs[0]
        for c in list(ir.tensors[src].consumers):
            if id(c) in made:
                continue
            c.inputs = [out if x == src else x for x in c.inputs]
            ir.tensors[src].consumers.remove(c)
            ir.tensors[out].consumers.append(c)
    before: dict = {}
    after: dict = {}
    pos = {id(op): i for i, op in enumerate(ir.ops)}
    for op in rewire.values():
        at = min((pos[id(c)] for c in ir.tensors[op.outputs[0]].consumers), default=first)
        before.setdefault(id(ir.ops[at]) if at < first else None, []).extend(
            (prelude if op is final_ls else []) + [op])
    for t_, h in hists.items():
        after.setdefault(id(ir.tensors[t_].producer), []).append(h)
    placed = {id(op) for lst in list(before.values()) + list(after.values()) for op in lst}
    order = []
    for op in ir.ops[:first]:
        order.extend(before.get(id(op), []))
        order.append(op)
        order.extend(after.get(id(op), []))
    order.extend(before.get(None, []))
    order.extend(op for op in new if id(op) not in placed)
    ir.ops = order
    for i, op in enumerate(ir.ops):
        op.id = i
    ir.auto_loss_scale = {"factor": factor, "final": final_ls.outputs[0], "tracked": list(tracked)}


def _variable(ir, tid: str, dtype: str, shape: list, value: float) -> str:
    if tid not in ir.tensors:
        ir._add_tensor(tid, dtype, shape, "Variable", np.full(shape, value, np.float32))
    return tid


def _tracked(ir, s) -> list[str]:
    method = str(s.gradientTensorTrackingMethod).split(".")[-1]
    if s.toTrackTensors is not None and method != "GradientsOfUserSpecifiedTensors":
        raise popart_exception("[AutomaticLossScale transform] toTrackTensors has been set, but "
                               "gradientTensorTrackingMethod has not been set to "
                               "'GradientTensorTrackingMethod::GradientsOfUserSpecifiedTensors'.")
    if method == "GradientsOfUserSpecifiedTensors":
        if s.toTrackTensors is None:
            raise popart_exception("[AutomaticLossScale transform] gradientTensorTrackingMethod set to "
                                   "'GradientTensorTrackingMethod::GradientsOfUserSpecifiedTensors' but "
                                   "'toTrackTensors' has not been set")
        from openipu.popart.transforms.autodiff import GRADIENT_PREFIX
        out = []
        for t in s.toTrackTensors:
            g = ir.grad_alias.get(f"{GRADIENT_PREFIX}{t}", f"{GRADIENT_PREFIX}{t}")
            if g not in ir.tensors:
                raise popart_exception(f"[AutomaticLossScale transform] Tensor '{t}' in toTrackTensors has no gradient")
            out.append(g)
        return out
    out = []
    for op in ir.ops:
        if op.grad_of is None or op.modifies or op.recomputes is not None or op.execution_context != "Normal":
            continue
        if method == "ConvAndMatmulGradients":
            if op.op_type not in HEAVY:
                continue
        elif (op.op_type in VIEW_CHANGING or any(ir.tensors[x].kind == "Variable" for x in op.inputs if x)):
            continue
        for o in op.outputs:
            if o and ir.tensors[o].info.data_type() == "FLOAT16" and ir.tensors[o].consumers:
                out.append(o)
    if not out:
        raise popart_exception("[AutomaticLossScale transform] No tracked gradient tensors of type fp16 were found.")
    return out
