"""Lowerings of automatic loss scaling's ops (:mod:`openipu.popart.transforms.loss_scaling`):

- Histogram: ``[lower, upper]`` counts of the input's (absolute) values below / at or above
  the single level: ``popops.map`` of the comparison (half-precision 0/1), then a
  ``popops.reduce`` ADD with float partials (PopART's ``HistogramOpx`` uses ``popops::histogram``;
  the counts are FLOAT, exact to 2^24 elements per tensor);
- LossScaleUpdate: the update factor scaled by 1/2 when ``upper > ratio * lower``, else by 2,
  on every ``updatePeriod``-th step (a step counter beside it): one ``popops.map`` on the two
  scalars (``LossScaleUpdateOpx``).
"""

from __future__ import annotations

from openipu import poplar
from openipu.poplibs import popops
from openipu.poplibs.popops import expr as pe
from openipu.popart.grads import GRAPHCORE as GC
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import graph, name


@lowering("Histogram", domain=GC)
def histogram(ctx, op):
    g = graph(ctx, op)
    x = ctx.input(op, 0)
    (level,) = [float(v) for v in op.attrs["levels"]]
    v = pe.Cast(pe._1, poplar.FLOAT)
    if int(op.attrs.get("absoluteOfInput", 1)):
        v = pe.Abs(v)
    hit = popops.map(g, pe.Cast(pe.Gte(v, pe.Const(level)), poplar.HALF), [x], ctx.prog,
                     f"{name(op)}/upper")
    upper = popops.reduce(g, hit.flatten(), poplar.FLOAT, [0], popops.Operation.ADD, ctx.prog,
                          debug_name=f"{name(op)}/count")
    counts = popops.map(g, pe.Sub(pe.Const(float(x.numElements())), pe._1), [upper], ctx.prog, f"{name(op)}/lower")
    return [poplar.concat([counts.reshape([1]), upper.reshape([1])], 0)]


@lowering("LossScaleUpdate", domain=GC)
def loss_scale_update(ctx, op):
    g = graph(ctx, op)
    factor, counter, stats = (ctx.input(op, i) for i in range(3))
    period = float(max(int(op.attrs.get("updatePeriod", 1)), 1))
    ratio = float(op.attrs["upperToLowerRatio"])
    name_ = name(op)
    # the step counter, modulo the period: the factor changes when it comes back to 0
    popops.mapInPlace(g, pe.Rem(pe.Add(pe._1, pe.Const(1.0)), pe.Const(period)), [counter], ctx.prog,
                      f"{name_}/step")
    lower, upper = stats.slice(0, 1, 0).reshape([]), stats.slice(1, 2, 0).reshape([])
    down = pe.Gt(pe._3, pe.Mul(pe.Const(ratio), pe._2))
    new = pe.Select(pe.Mul(pe._1, pe.Const(0.5)), pe.Mul(pe._1, pe.Const(2.0)), down)
    popops.mapInPlace(g, pe.Select(new, pe._1, pe.Equal(pe._4, pe.Const(0.0))), [factor, lower, upper, counter],
                      ctx.prog, name_)
    return [factor]
