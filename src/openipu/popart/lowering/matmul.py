"""MatMul and Gemm through ``poplin.matMul`` (PopART's ``MatMulOpx`` / Gemm decomposition).

``poplin.matMul`` is 2-D; ONNX MatMul is numpy ``matmul``:

- 1-D operands are promoted (``[k] -> [1, k]`` / ``[k, 1]``) and the added dim dropped after;
- when the right operand is 2-D, the left operand's batch dims are flattened into its rows
  (``[..., m, k] -> [prod(...) * m, k]``, a view) — one matMul;
- otherwise both are broadcast over their batch dims (views) and flattened to ``[groups, m, k]``
  / ``[groups, k, n]``: one ``poplin.matMulGrouped`` (PopART's ``MatMulOpx`` for batched
  operands), the groups planned side by side. With a poplin that has no ``matMulGrouped``, each
  batch element is one ``matMul``, run one after the other (up to ``MAX_BATCH_LOOP`` of them;
  larger batched products then use the generic lowering).

Options from the node: ``__available_memory_proportion`` (``builder.setAvailableMemoryProportion``)
and ``__partials_type`` (``builder.setPartialsType``), else ``SessionOptions.partialsTypeMatMuls``
and ``matmulOptions``. Gemm = ``alpha * op(A) @ op(B) + beta * C`` with ``popops`` for the scale
and the (broadcast) addition of C.
"""

from __future__ import annotations

import math

import numpy as np

from openipu import poplar
from openipu.poplibs import poplin, popops
from openipu.popart.lowering._util import poplibs_options
from openipu.popart.lowering import lowering

MAX_BATCH_LOOP = 16
_FLOATS = ("FLOAT", "FLOAT16")


def _options(ctx, op) -> dict:
    return poplibs_options(op, ctx.options.matmulOptions, ctx.options.partialsTypeMatMuls)


def _batch_count(ir, op):
    a, b = (ir.tensors[x].info.shape() for x in op.inputs[:2])
    if len(b) <= 2 or len(a) < 2:
        return 1
    return math.prod(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])))


def _accepts_matmul(op, ir):
    if len(op.inputs) != 2:
        return False
    dts = {ir.tensors[x].info.data_type() for x in op.inputs} | {ir.tensors[op.outputs[0]].info.data_type()}
    if len(dts) != 1 or dts.pop() not in _FLOATS:
        return False
    shapes = [ir.tensors[x].info.shape() for x in op.inputs]
    if any(len(s) == 0 or 0 in s for s in shapes):
        return False
    return hasattr(poplin, "matMulGrouped") or _batch_count(ir, op) <= MAX_BATCH_LOOP


def _mm2d(ctx, g, a, b, op, name):
    if ctx.owns_layout(op, 1):      # a weight this op creates: lay it out for the plan
        poplin.map_matmul_input_rhs(g, b, a.shape(), options=_options(ctx, op))
    return poplin.matMul(g, a, b, ctx.prog, name, options=_options(ctx, op))


@lowering("MatMul", accepts=_accepts_matmul)
def matmul(ctx, op):
    vg = ctx.vgraph_of(op)
    g = ctx.graph_of(vg)
    a, b = ctx.input(op, 0), ctx.input(op, 1)
    out_shape = ctx.ir.tensors[op.outputs[0]].info.shape()
    name = f"MatMul/{op.outputs[0]}"
    a_vec, b_vec = a.rank() == 1, b.rank() == 1
    if a_vec:
        a = a.reshape([1, a.dim(0)])
    if b_vec:
        b = b.reshape([b.dim(0), 1])
    if b.rank() == 2:
        k = a.dim(a.rank() - 1)
        lead = a.shape()[:-1]
        c = _mm2d(ctx, g, a.reshape([math.prod(lead), k]), b, op, name)
        return [c.reshape(out_shape)]
    # batched: broadcast batch dims, one matMul per batch element
    batch = list(np.broadcast_shapes(tuple(a.shape()[:-2]), tuple(b.shape()[:-2])))
    av = _broadcast(a, batch + a.shape()[-2:])
    bv = _broadcast(b, batch + b.shape()[-2:])
    nb = math.prod(batch)
    av = av.reshape([nb] + av.shape()[-2:])
    bv = bv.reshape([nb] + bv.shape()[-2:])
    if hasattr(poplin, "matMulGrouped"):
        c = poplin.matMulGrouped(g, av, bv, ctx.prog, name, options=_options(ctx, op))
        return [c.reshape(out_shape)]
    parts = [_mm2d(ctx, g, av[i], bv[i], op, f"{name}/{i}").expand([0]) for i in range(nb)]
    return [poplar.concat(parts, 0).reshape(out_shape)]


def _broadcast(t, shape):
    from openipu.poplibs.popops._common import broadcast_view
    return broadcast_view(t.reshape([1] * (len(shape) - t.rank()) + t.shape()), shape)


def _accepts_gemm(op, ir):
    if len(op.inputs) < 2:
        return False
    dts = {ir.tensors[x].info.data_type() for x in op.inputs if x}
    return len(dts) == 1 and dts.pop() in _FLOATS


def _scalar_const(g, type_, value, name):
    c = g.addConstant(type_, [], value, name)
    g.setTileMapping(c, 0)
    return c


@lowering("Gemm", accepts=_accepts_gemm)
def gemm(ctx, op):
    g = ctx.graph_of(ctx.vgraph_of(op))
    a, b = ctx.input(op, 0), ctx.input(op, 1)
    if op.attrs.get("transA", 0):
        a = a.transpose()
    if op.attrs.get("transB", 0):
        b = b.transpose()
    name = f"Gemm/{op.outputs[0]}"
    y = _mm2d(ctx, g, a, b, op, name)
    alpha, beta = float(op.attrs.get("alpha", 1.0)), float(op.attrs.get("beta", 1.0))
    t = y.elementType()
    if alpha != 1.0:
        y = popops.mul(g, y, _scalar_const(g, t, alpha, f"{name}/alpha"), ctx.prog, f"{name}/scaleA")
    c = ctx.input(op, 2) if len(op.inputs) > 2 else None
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = popops.mul(g, c, _scalar_const(g, t, beta, f"{name}/beta"), ctx.prog, f"{name}/scaleC")
        y = popops.add(g, y, c, ctx.prog, f"{name}/addC")
    if y.shape() != ctx.ir.tensors[op.outputs[0]].info.shape():
        y = y.reshape(ctx.ir.tensors[op.outputs[0]].info.shape())
    return [y]

