"""Gradients of the indexing ops; indices get none.

- Gather w.r.t. its data (the embedding table): ``GatherGrad`` adds each slice of the output
  gradient into its row (``popops::multiUpdateAdd``);
- ScatterElements / Scatter: ``ScatterDataGrad`` (the gradient with the scattered positions
  zeroed) and ``ScatterUpdateGrad`` (the gradient gathered at the indices), PopART's names;
- GatherElements, GatherND, ScatterND, TopK (values), Compress: the generic ``<Op>Grad`` ops
  (vjp of the forward kernel: a scatter-add of the gradient).
"""

from __future__ import annotations

from openipu.popart.grads import GRAPHCORE, grad_rule


@grad_rule("Gather")
def gather(g, op):
    if not g.needs(0):
        return [None, None]
    return [g.add("GatherGrad", [g.gy(), g.x(1)], shape=g.shape(g.x(0)), domain=GRAPHCORE,
                  attrs={"axis": int(op.attrs.get("axis", 0)), "data_shape": g.shape(g.x(0))}), None]


@grad_rule("ScatterElements", "Scatter")
def scatter(g, op):
    if op.attrs.get("reduction", "none") != "none":
        return [g.vjp(i, op_type="ScatterElementsGrad") if g.needs(i) else None for i in range(3)]
    return [g.vjp(0, op_type="ScatterDataGrad") if g.needs(0) else None, None,
            g.vjp(2, op_type="ScatterUpdateGrad") if g.needs(2) else None]


@grad_rule("ScatterND")
def scatter_nd(g, op):
    return [g.vjp(0) if g.needs(0) else None, None, g.vjp(2) if g.needs(2) else None]


@grad_rule("GatherElements", "GatherND", "Compress")
def gather_generic(g, op):
    return [g.vjp(0) if g.needs(0) else None, None]


@grad_rule("TopK")
def topk(g, op):
    return [g.vjp(0, out=0), None] if g.gy(0) is not None else [None, None]
