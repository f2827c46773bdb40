"""Gradient of Gather w.r.t. its data (the embedding table): ``GatherGrad`` adds each slice of
the output gradient into its row (``popops::multiUpdateAdd``); indices get none."""

from __future__ import annotations

from openipu.popart.grads import GRAPHCORE, grad_rule


@grad_rule("Gather")
def gather(g, op):
    if not g.needs(0):
        return [None, None]
    return [g.add("GatherGrad", [g.gy(), g.x(1)], shape=g.shape(g.x(0)), domain=GRAPHCORE,
                  attrs={"axis": int(op.attrs.get("axis", 0)), "data_shape": g.shape(g.x(0))}), None]
