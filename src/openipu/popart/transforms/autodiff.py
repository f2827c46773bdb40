"""Autodiff (PopART's ``constructBackwards``, ``research/popart.md`` 3.3): grow the backward ops
of the final loss.

1. The tensors that need a gradient: the trainable weights (float ``Variable`` tensors), every
   float tensor whose gradient ``Gradient___<id>`` is anchored (model inputs and intermediate
   tensors: PopART grows the backward pass from the loss to every tensor on its path, which is
   how its operator tests read an input's gradient, with or without weights), and every float
   op output computed from one of those; ``Detach`` stops the flow.
2. The loss gradient is seeded with the loss scaling (``Gradient___<loss>``: a constant, or the
   optimizer's ``lossScaling_<TYPE>`` tensor when the loss scaling is not const).
3. Ops are visited from the last to the first. An op on a path from a weight to the loss gets
   its gradient ops from its family's rule (:mod:`openipu.popart.grads`); the contributions to
   one tensor's gradient are summed (PopART's ``SumOp``, an ONNX ``Sum``) into
   ``Gradient___<id>``, the id PopART gives it (anchor it to read it).
4. PopART's ``NlllWithSoftmaxGradDirect`` pattern (on unless ``Patterns`` disables it): the
   gradient of ``nll(softmax(x))`` w.r.t. ``x`` is one op, ``(softmax - onehot) * scale``,
   instead of ``-scale / p`` at the label through the softmax gradient.

An op on such a path without a rule raises PopART's error naming it. Weights with no path to
the loss get no gradient (and no update), as in PopART; an anchored gradient of a tensor with no
path to the loss is not made (the anchor check then raises PopART's "Anchor tensor ... not in Ir
Tensors").
"""

from __future__ import annotations

import numpy as np

from openipu.popart.errors import popart_exception
from openipu.popart.grads import GRAPHCORE, GradContext, find_rule
from openipu.popart.tensorinfo import NUMPY_OF

GRADIENT_PREFIX = "Gradient___"
FLOATS = ("FLOAT", "FLOAT16")
#: ops that pass no gradient (PopART's ``Detach``; integer-valued ops need no gradient anyway)
NO_GRADIENT = {(GRAPHCORE, "Detach")}


def trainable(ir) -> list[str]:
    """The trainable weights: float Variable tensors (initializers), in model order."""
    return [t.id for t in ir.tensors.values() if t.kind == "Variable" and t.info.data_type() in FLOATS
            and t.id not in ir.optimizer_tensors]


def anchored_gradients(ir, anchors) -> list[str]:
    """The float, non-constant tensors whose gradient ``Gradient___<id>`` is among ``anchors``
    (ids), in anchor order. Integer tensors (indices, labels) and constants have no gradient."""
    out = []
    for a in anchors:
        if not a.startswith(GRADIENT_PREFIX):
            continue
        t = ir.tensors.get(a[len(GRADIENT_PREFIX):])
        if t is not None and t.kind != "Const" and t.info.data_type() in FLOATS and t.id not in out:
            out.append(t.id)
    return out


def grow(ir, loss: str, seed: str | float, patterns=None, wanted=()) -> dict[str, str]:
    """Append the backward ops of ``loss`` to ``ir.ops``; return ``{weight id: gradient id}``.

    ``seed``: the loss gradient, a float (the const loss scaling) or a tensor id. ``wanted``:
    further tensors (model inputs, op outputs) whose gradient ``Gradient___<id>`` is made, e.g.
    because it is anchored (:func:`anchored_gradients`); PopART's ``TrainingSession`` makes the
    gradient of every tensor on the loss's path, with or without trainable weights.
    Raises ``popart_exception`` for an op without a gradient on such a path.
    """
    order = trainable(ir)
    weights = set(order)
    extra = [t for t in wanted if t not in weights]
    needs: set[str] = weights | set(extra)
    for op in ir.ops:
        if (op.domain, op.op_type) in NO_GRADIENT:
            continue
        if any(x in needs for x in op.inputs if x):
            needs.update(o for o in op.outputs if o and ir.tensors[o].info.data_type() in FLOATS)
    if loss not in needs:
        return {}
    # the ops between the weights and the loss
    to_loss = {loss}
    on_path = []
    for op in reversed(ir.ops):
        if any(o in to_loss for o in op.outputs):
            ins = [x for x in op.inputs if x in needs]
            if ins:
                on_path.append(op)
                to_loss.update(ins)
    partial: dict[str, list[str]] = {}
    if isinstance(seed, str):
        partial[loss] = [seed]
    else:
        info = ir.tensors[loss].info
        partial[loss] = [ir.add_const(f"{GRADIENT_PREFIX}{loss}",
                                      np.full(info.shape(), seed, NUMPY_OF[info.data_type()]))]
    direct = _softmax_nll_pairs(ir, on_path, patterns)
    done: dict[str, str] = {}
    for op in on_path:
        gys = [_total(ir, o, partial, done) if o in partial else None for o in op.outputs]
        if all(g is None for g in gys):
            continue
        want = [bool(x) and x in needs and x in to_loss for x in op.inputs]
        if op.id in direct:     # the gradient of the softmax's input, in one op
            x = direct[op.id].inputs[0]
            gx = GradContext(ir, op, gys, want).add(
                "NlllWithSoftmaxGradDirect", [x, op.inputs[1], gys[0]], shape=ir.tensors[x].info.shape(),
                attrs={"reduction": int(op.attrs.get("reduction", 1)), "ignoreIndex": op.attrs.get("ignoreIndex")},
                domain=GRAPHCORE)
            partial.setdefault(x, []).append(gx)
            continue
        rule = find_rule(op)
        if rule is None:
            reach = sorted(w for w in needs & to_loss if w in weights or w in extra)
            raise popart_exception(
                f"Op {op.opid} ('{op.name}') has no gradient in openipu, but the gradient of the loss '{loss}' "
                f"must pass through it to reach {', '.join(reach[:3])}{'...' if len(reach) > 3 else ''}. "
                "Detach its inputs (builder.aiGraphcore.detach) or replace the op")
        g = GradContext(ir, op, gys, want)
        grads = rule(g, op)
        for x, gx, w in zip(op.inputs, grads, want):
            if w and gx is not None:
                partial.setdefault(x, []).append(gx)
    out = {}
    for w in order:
        if w in partial:
            out[w] = _total(ir, w, partial, done)
    for t in extra:
        if t in partial:
            _total(ir, t, partial, done)
    return out


def _total(ir, tid: str, partial: dict, done: dict) -> str:
    """``Gradient___<tid>``: the sum of the partial gradients of ``tid`` (made once)."""
    if tid in done:
        return done[tid]
    parts = partial[tid]
    name = f"{GRADIENT_PREFIX}{tid}"
    info = ir.tensors[tid].info
    if len(parts) == 1 and name not in ir.tensors and ir.tensors[parts[0]].producer is not None \
            and not parts[0].startswith(GRADIENT_PREFIX):
        # rename the only contribution to PopART's gradient id
        _rename(ir, parts[0], name)
        done[tid] = name
        return name
    if len(parts) == 1:
        # the gradient of another tensor passed on unchanged (Identity, a same-shape Reshape):
        # PopART's id still finds it (anchors)
        ir.grad_alias[name] = parts[0]
        done[tid] = parts[0]
        return parts[0]
    op = ir.add_op("Sum", parts, [(name, info.data_type(), info.shape())], opset=13, name=f"GradSum/{tid}",
                   like=forward_op(ir, parts[0]))
    op.grad_of = forward_op(ir, parts[0])
    done[tid] = op.outputs[0]
    return op.outputs[0]


def _rename(ir, old: str, new: str) -> None:
    t = ir.tensors.pop(old)
    t.id = new
    ir.tensors[new] = t
    if t.producer is not None:
        t.producer.outputs = [new if o == old else o for o in t.producer.outputs]
    for c in t.consumers:
        c.inputs = [new if x == old else x for x in c.inputs]


def _softmax_nll_pairs(ir, on_path, patterns) -> dict:
    """Nll ops whose probabilities are a Softmax output read by nothing else: op id -> softmax
    op (PopART's ``NlllWithSoftmaxGradDirect``)."""
    if patterns is not None and not getattr(patterns, "NlllWithSoftMaxGradDirect", True):
        return {}
    out = {}
    for op in on_path:
        if (op.domain, op.op_type) != (GRAPHCORE, "Nll") or op.attrs.get("inputIsLogProbability", 0):
            continue
        p = ir.tensors[op.inputs[0]]
        sm = p.producer
        if sm is None or sm.op_type != "Softmax" or sm.domain != "" or len(p.consumers) != 1:
            continue
        axis = int(sm.attrs.get("axis", -1 if sm.opset >= 13 else 1))
        rank = len(p.info.shape())
        if axis % rank != rank - 1:
            continue
        out[op.id] = sm
    # the softmax's own gradient is then not grown: drop it from the path
    skip = {id(sm) for sm in out.values()}
    on_path[:] = [op for op in on_path if id(op) not in skip]
    return out


def forward_op(ir, grad: str):
    """The forward op whose gradient ``grad`` is made for (None for the loss seed)."""
    src = ir.tensors[grad].producer
    return src.grad_of if src is not None else None
