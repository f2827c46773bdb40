"""Gradients of PopART's losses (``ai.graphcore`` Nll, L1, IdentityLoss). The loss gradient
(the loss scaling, or its tensor) is an input, so the reduction's scale is applied once."""

from __future__ import annotations

from openipu.popart.grads import GRAPHCORE, grad_rule


@grad_rule("Nll", domain=GRAPHCORE)
def nll(g, op):
    attrs = {k: op.attrs.get(k) for k in ("reduction", "ignoreIndex", "inputIsLogProbability")}
    return [g.add("NllGrad", [g.x(0), g.x(1), g.gy()], shape=g.shape(g.x(0)), domain=GRAPHCORE, attrs=attrs), None]


@grad_rule("L1", domain=GRAPHCORE)
def l1(g, op):
    attrs = {"lambda": float(op.attrs.get("lambda", 1.0)), "reduction": int(op.attrs.get("reduction", 1))}
    return [g.add("L1Grad", [g.x(0), g.gy()], shape=g.shape(g.x(0)), domain=GRAPHCORE, attrs=attrs)]


@grad_rule("IdentityLoss", domain=GRAPHCORE)
def identity_loss(g, op):
    attrs = {"reduction": int(op.attrs.get("reduction", 1))}
    return [g.add("IdentityLossGrad", [g.x(0), g.gy()], shape=g.shape(g.x(0)), domain=GRAPHCORE, attrs=attrs)]
