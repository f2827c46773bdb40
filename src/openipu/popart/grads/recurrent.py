"""Gradients of the recurrent ops (RNN, GRU, LSTM): the generic ``<Op>Grad`` op per input (the
vector-Jacobian product of the forward kernel, :meth:`GradContext.vjp`), one per output that a
gradient reaches (``Y``, ``Y_h``, ``Y_c``), summed. ``sequence_lens`` (integer) has none.
PopART's ``LSTMGrad`` / ``GRUGrad`` are one op over the whole sequence; these are exact and
costed by the generic lowering."""

from __future__ import annotations

from openipu.popart.grads import grad_rule

SEQUENCE_LENS = 4


@grad_rule("RNN", "GRU", "LSTM")
def recurrent(g, op):
    outs = [k for k, o in enumerate(op.outputs) if o and g.gy(k) is not None]
    grads = []
    for i in range(len(op.inputs)):
        if not g.needs(i) or i == SEQUENCE_LENS or not outs:
            grads.append(None)
            continue
        parts = [g.vjp(i, k) for k in outs]
        grads.append(parts[0] if len(parts) == 1 else g.add("Sum", parts))
    return grads
