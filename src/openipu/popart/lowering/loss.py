"""The loss ops of training (PopART's ``NllOpx``, ``L1Opx``) through ``popops``, so that a loss
over a large batch is spread over the tiles holding its input (a generic vertex would gather the
whole input on the tile of the scalar output).

- Nll (probs ``[..., C]``, label ``[...]``): ``encodeOneHot`` of the labels, ``mul`` by the
  probabilities and ``reduce`` over C picks ``p[label]``; ``map`` gives ``-log(p)`` (``-p`` when
  ``inputIsLogProbability``), 0 for rows whose label is ``ignoreIndex``; ``reduce`` over the
  rows for Sum / Mean (Mean divides by the rows kept, as PyTorch's NLLLoss);
- L1 (x): ``map`` ``|x|`` and ``reduce`` (ADD, in FLOAT) times ``lambda`` (Mean: over the elements);
  NoReduction: ``map`` ``lambda |x|``.
"""

from __future__ import annotations

from openipu import poplar
from openipu.poplibs import popops
from openipu.poplibs.popops import expr as pe
from openipu.poplibs.popops.reduce import Operation
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import dtype, graph, name

GC = "ai.graphcore"
SUM, MEAN, NO_REDUCTION = 0, 1, 2


def _accepts_nll(op, ir):
    return dtype(ir, op.inputs[0]) in ("FLOAT", "FLOAT16") and ir.tensors[op.inputs[0]].info.rank() >= 2


@lowering("Nll", domain=GC, accepts=_accepts_nll)
def nll(ctx, op):
    g_, prog, n = graph(ctx, op), ctx.prog, name(op)
    p, lab = ctx.input(op, 0), ctx.input(op, 1)
    c = p.dim(p.rank() - 1)
    p2, l1 = p.reshape([p.numElements() // c, c]), lab.flatten()
    if l1.elementType() not in (poplar.INT, poplar.UNSIGNED_INT):
        l1 = popops.cast(g_, l1, poplar.INT, prog, f"{n}/label")
    onehot = g_.clone(p2, f"{n}/onehot")
    popops.encodeOneHot(g_, l1, onehot, prog, debug_name=f"{n}/onehot")
    picked = popops.reduce(g_, popops.mul(g_, p2, onehot, prog, f"{n}/pick"), [1], Operation.ADD, prog,
                           debug_name=f"{n}/pick")
    ftype = p.elementType()
    per = pe.Neg(pe._1) if op.attrs.get("inputIsLogProbability", 0) else pe.Neg(pe.Log(pe._1))
    ignore = op.attrs.get("ignoreIndex")
    red = int(op.attrs.get("reduction", MEAN))
    if ignore is not None:
        keep = pe.NotEqual(pe._2, pe.Const(int(ignore), poplar.INT))
        per = pe.Select(per, pe.Const(0.0, ftype), keep)
        rows = popops.map(g_, per, [picked, l1], prog, f"{n}/rows")
    else:
        rows = popops.map(g_, per, [picked], prog, f"{n}/rows")
    if red == NO_REDUCTION:
        return [rows.reshape(lab.shape())]
    total = popops.reduce(g_, rows, poplar.FLOAT, [0], Operation.ADD, prog, debug_name=f"{n}/sum")
    if red == MEAN:
        if ignore is not None:
            kept = popops.map(g_, pe.Cast(pe.NotEqual(pe._1, pe.Const(int(ignore), poplar.INT)), poplar.FLOAT),
                              [l1], prog, f"{n}/kept")
            count = popops.reduce(g_, kept, poplar.FLOAT, [0], Operation.ADD, prog, debug_name=f"{n}/count")
            total = popops.map(g_, pe._1 / pe.Max(pe._2, pe.Const(1.0)), [total, count], prog, f"{n}/mean")
        else:
            total = popops.map(g_, pe._1 * pe.Const(1.0 / max(l1.numElements(), 1)), [total], prog, f"{n}/mean")
    return [popops.cast(g_, total, ftype, prog, f"{n}/cast") if ftype != poplar.FLOAT else total]


def _accepts_l1(op, ir):
    return dtype(ir, op.inputs[0]) in ("FLOAT", "FLOAT16")


@lowering("L1", domain=GC, accepts=_accepts_l1)
def l1(ctx, op):
    g_, prog, n = graph(ctx, op), ctx.prog, name(op)
    x = ctx.input(op, 0)
    lam = float(op.attrs.get("lambda", 1.0))
    red = int(op.attrs.get("reduction", MEAN))
    ftype = x.elementType()
    if red == NO_REDUCTION:
        return [popops.map(g_, pe.Cast(pe.Abs(pe.Cast(pe._1, poplar.FLOAT)) * pe.Const(lam), ftype), [x], prog,
                           f"{n}/abs")]
    absx = popops.map(g_, pe.Abs(pe._1), [x], prog, f"{n}/abs")
    total = popops.reduce(g_, absx.flatten(), poplar.FLOAT, [0], Operation.ADD, prog, debug_name=f"{n}/sum")
    scale = lam / max(x.numElements(), 1) if red == MEAN else lam
    total = popops.map(g_, pe._1 * pe.Const(scale), [total], prog, f"{n}/scale")
    return [popops.cast(g_, total, ftype, prog, f"{n}/cast") if ftype != poplar.FLOAT else total]
