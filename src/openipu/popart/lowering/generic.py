"""The generic lowering: any op with an onnx_ops host kernel as ONE costed vertex group.

Layout: each output is mapped linearly over the op's virtual graph (``mapTensorLinearly``); the
vertices are the tiles holding elements of the first (primary) output. The kernel runs over whole
tensors (once per replica).

Exchange assumption [A]: input element ``i`` of an ``n_in``-element input is consumed by the tile
that holds primary-output element ``floor(i * n_out / n_in)``, i.e. inputs are read at the
proportional position of the output. This is exact for elementwise ops, and a stand-in of the
right volume for reductions, gathers and reshapes (whose true access pattern the kernel hides).

Cycle estimate per vertex (tile cycles; one MultiVertex per tile, the shape of PopLibs'
``popopsCycleEstimators``), with ``f`` the op's flops and ``b`` its bytes (inputs read plus
outputs written), shared between tiles in proportion to their primary-output elements::

    cycles = GENERIC_VERTEX_OVERHEAD_CYCLES + ceil(f_tile / vectorWidth(type))
             + ceil(b_tile / (dataPathWidth / 8))

``f`` is ``kernel.flops(in_shapes, out_shapes, attrs)`` when the kernel gives one, else one per
output element; ``vectorWidth`` is the target's elements per 64-bit vector for the output type
(float 2, half 4); the data path moves 8 bytes per cycle.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from openipu import poplar
from openipu.poplar import regions as R
from openipu.poplar.exchange import Boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplibs.popops._common import tile_counts_of
from openipu.popart.graphcore_ops import find_kernel
from openipu.popart.shapes import KERNEL_TORCH_OF, call_kernel

#: Fixed tile cycles of one generic vertex. [A] of the order of PopLibs' BinaryOp1D MultiVertex
#: fixed cost, 6 x (29 + 2) + 11 = 197 (popopsCycleEstimators, float: 29 worker overhead cycles,
#: 2 loop cycles, 11 supervisor cycles).
GENERIC_VERTEX_OVERHEAD_CYCLES = 197
#: Vertex state bytes: a header plus one (pointer, size) pair per connected tensor. [A]
GENERIC_STATE_BYTES = 16
GENERIC_STATE_BYTES_PER_TENSOR = 8


def _generic_kernel(domain, op_type, attrs, opset, ins, in_dtypes, outs, ctx):
    kernel = find_kernel(domain, op_type)
    vals = [None if t is None else ctx.read(t) for t in ins]
    results = [[] for _ in outs]
    for r in range(ctx.replicas):
        args = [None if v is None else v[r].to(dt) for v, dt in zip(vals, in_dtypes)]
        with torch.no_grad():
            res = call_kernel(kernel, args, attrs, opset)
        for k in range(len(outs)):
            results[k].append(res[k])
    for t, rs in zip(outs, results):
        if t is not None and t.numElements():
            ctx.write(t, torch.stack(rs))


def generic_cycles(counts: np.ndarray, n_out: int, flops: float, nbytes: float, type_, target) -> np.ndarray:
    """Tile cycles of the generic vertex on tiles holding ``counts`` primary-output elements."""
    share = counts / max(n_out, 1)
    vw = target.getVectorWidth(type_)
    dpw = target.getDataPathWidth() // 8
    return GENERIC_VERTEX_OVERHEAD_CYCLES + np.ceil(flops * share / vw) + np.ceil(nbytes * share / dpw)


def proportional_boxes(t, n_out: int, ob, oe, otl) -> Boxes:
    """Boxes of input ``t`` on the tiles that read it: element ``i`` (flattened) is used on the
    tile of primary-output element ``floor(i n_out / n_in)``. A run ``[b, e)`` of the output on
    tile ``w`` reads the inputs ``[ceil(b n_in / n_out), ceil(e n_in / n_out))`` (flat ranges, cut
    into boxes of ``t``'s shape): host work per output run, not per element."""
    n_in = t.numElements()
    u = -(-ob.astype(np.int64) * n_in // n_out)
    v = -(-oe.astype(np.int64) * n_in // n_out)
    keep = v > u
    owner, lo, sz = R.range_boxes(u[keep], v[keep], t.shape())
    return Boxes(lo, sz, otl[keep][owner].astype(np.int64))


def lower_generic(ctx, op):
    """Lower ``op`` (an IrOp with a host kernel) as one vertex group; returns its outputs."""
    ir = ctx.ir
    kernel = find_kernel(op.domain, op.op_type)
    vg = ctx.vgraph_of(op)
    g = ctx.graph_of(vg)
    ins = [ctx.input(op, i) for i in range(len(op.inputs))]
    in_dtypes = [KERNEL_TORCH_OF.get(ir.tensors[x].info.data_type(), torch.float32) if x else None for x in op.inputs]
    outs = [ctx.new_output(op, k) if o else None for k, o in enumerate(op.outputs)]
    live = [t for t in outs if t is not None and t.numElements()]
    if not live:
        return outs
    prim = live[0]
    n_out = prim.numElements()
    used, counts = tile_counts_of(g, prim)
    ob, oe, otl = g.tile_runs_of(prim)
    reads = []
    nbytes = 0.0
    for t in ins:
        if t is None or t.numElements() == 0:
            continue
        reads.append(Access(t, proportional_boxes(t, n_out, ob, oe, otl)))
        nbytes += t.numElements() * t.elementType().size
    writes = [Access(t) for t in live]
    nbytes += sum(t.numElements() * t.elementType().size for t in live)
    in_shapes = [ir.tensors[x].info.shape() if x else [] for x in op.inputs]
    out_shapes = [ir.tensors[o].info.shape() if o else [] for o in op.outputs]
    flops = float(kernel.flops(in_shapes, out_shapes, op.attrs)) if kernel.flops else \
        float(sum(math.prod(s) for s in out_shapes))
    cycles = generic_cycles(counts, n_out, flops, nbytes, prim.elementType(), g.getTarget())
    n_conn = sum(t is not None for t in ins) + len(live)
    cs = g.addComputeSet(f"{op.op_type}/{op.outputs[0]}")
    vname = f"openipu::Generic<{op.domain or 'ai.onnx'}.{op.op_type},{prim.elementType()}>"
    g.add_vertex_group(cs, VertexGroup(
        vname, used, cycles,
        functools.partial(_generic_kernel, op.domain, op.op_type, op.attrs, op.opset, ins, in_dtypes, outs),
        reads=reads, writes=writes, multi=True, flops=flops,
        state_bytes=GENERIC_STATE_BYTES + GENERIC_STATE_BYTES_PER_TENSOR * n_conn))
    ctx.prog.add(poplar.program.Execute(cs, debugContext=f"{op.op_type}:{op.outputs[0]}"))
    return outs
