"""PopRT's fused ops (``ai.graphcore`` domain) onto Poplar / PopLibs.

- ``FusedAttention(q, k_t, v[, bias])``: ONE vertex group, the way a fused attention codelet works
  on the chip: the output rows are spread over the tiles (``mapTensorLinearly``); each tile
  receives its rows of ``q`` (and ``bias``) and the whole ``k_t`` and ``v`` of the heads it
  serves, computes the scores, the softmax and ``P @ v`` in its own memory, and writes its output
  rows. The ``Sq x Skv`` scores never leave the tile: no exchange, sync, or re-layout between
  the two products and the softmax (the parts pay one superstep each). Tile cycles::

      FUSED_ATTENTION_OVERHEAD + ceil(r (Skv D + Skv Dv) / amp) + ceil(SOFTMAX_OPS r Skv / vw)

  ``r``: the tile's output rows (``elements / Dv``), ``amp``: AMP MACs per cycle per tile for the
  input type with half partials (``Target.getAmpMacsPerCycle``), ``vw``: float vector width (the
  softmax runs in float32).
- ``LayerNorm(x, gamma, beta)``: as ONNX ``LayerNormalization`` over the last axis (``popnn.ln``).
- ``FP8MatMul(x, w[, bias])`` / ``FP8Conv(x, w[, bias])``: ``x`` is quantised on its tiles (one
  vertex group: scale by ``2**in_scale``, round to the fp8 format, saturate; cost of a cast) into
  a ``QUARTER`` tensor whose metadata (``poplar.QuarterMetadata``) names ``in_format`` (F143 =
  E4M3 or F152 = E5M2) and the scale bias ``-in_scale``; ``w`` is a ``QUARTER`` constant in
  ``weight_format`` with scale bias ``-weight_scale``. ``poplin.matMul`` / ``poplin.convolution``
  run on the QUARTER operands, of either format, at the target's fp8 AMP rate (128
  MACs/cycle/tile on ipu21) into float, applying the operands' metadata scales as the AMP does;
  then one output vertex group adds the bias and converts to the output type. ``fp8_weight``
  (``x`` not quantised) runs the product on half operands holding the fp8 weights, at the half
  rate (the IPU's quarter x half AMP path is not modelled [A]).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import Access
from openipu.poplar.exchange import Boxes
from openipu.poplar.graph import VertexGroup
from openipu.poplibs import poplin, popops
from openipu.poplibs.popops._common import tile_counts_of
from openipu.popart import outline
from openipu.popart.lowering import conv as conv_lowering
from openipu.popart.lowering import lowering
from openipu.popart.lowering import norm
from openipu.popart.lowering._util import FLOATS, dtype, graph, name, poplibs_options, shape
from openipu.popart.lowering.generic import generic_cycles, proportional_boxes
from openipu.poplar import quarter
from openipu.poplar.quarter import SCALE_BIAS_MAX, SCALE_BIAS_MIN, quantize_values
from openipu.popart.onnx_ops.fused_attention import fused_attention as _attention_kernel

GC = "ai.graphcore"
#: Fixed tile cycles of the fused attention vertex. [A] a supervisor set-up plus 6 workers'
#: entry, of the order of PopLibs' MultiVertex fixed costs (the generic vertex's 197) plus the
#: softmax's row set-up.
FUSED_ATTENTION_OVERHEAD = 300
#: Vector operations per score of the softmax (max, subtract, exp, sum, scale). [A]
SOFTMAX_OPS = 5
#: Inference weights as QUARTER constants (1 byte each, no per-run cast), as PopRT stores them.
#: Off: the weights are cast on the device at each run. The constants' values are built into
#: the program, so outlining keeps ops with different weights apart (``_baked_weight``).
QUARTER_CONSTANT_WEIGHTS = True

# ------------------------------------------------------------------------------------------
# LayerNorm
# ------------------------------------------------------------------------------------------
lowering("LayerNorm", domain=GC, accepts=norm._accepts_ln)(norm.layer_norm)


# ------------------------------------------------------------------------------------------
# FusedAttention
# ------------------------------------------------------------------------------------------
def _accepts_attention(op, ir):
    if len(op.inputs) < 3 or not all(op.inputs[:3]):
        return False
    if {dtype(ir, x) for x in op.inputs[:3]} - set(FLOATS) or len({dtype(ir, x) for x in op.inputs[:3]}) != 1:
        return False
    q, kt, v, y = (shape(ir, x) for x in (op.inputs[0], op.inputs[1], op.inputs[2], op.outputs[0]))
    return len(q) >= 2 and len(kt) == len(q) and len(v) == len(q) and math.prod(y) > 0


def _attention_kernel_run(attrs, ins, out, ctx):
    vals = [ctx.read(t) for t in ins]
    res = []
    for r in range(ctx.replicas):
        with torch.no_grad():
            res.append(_attention_kernel([v[r] for v in vals], attrs, 0)[0])
    ctx.write(out, torch.stack(res))


def _group_boxes(t3, per_group: int, ob, oe, otl) -> Boxes:
    """Boxes of ``t3`` ``[G, a, b]`` read whole per group by the tiles whose output runs
    ``[ob, oe)`` (on tiles ``otl``) cover groups ``ob // per_group .. (oe - 1) // per_group``."""
    g0 = ob.astype(np.int64) // per_group
    g1 = (oe.astype(np.int64) - 1) // per_group
    n = g0.size
    _, a, b = t3.shape()
    lo = np.zeros((n, 3), np.int64)
    lo[:, 0] = g0
    sz = np.empty((n, 3), np.int64)
    sz[:, 0], sz[:, 1], sz[:, 2] = g1 - g0 + 1, a, b
    return Boxes(lo, sz, otl.astype(np.int64))


@lowering("FusedAttention", domain=GC, accepts=_accepts_attention)
def fused_attention(ctx, op):
    g = graph(ctx, op)
    ir = ctx.ir
    q, kt, v = (ctx.input(op, i) for i in range(3))
    bias = ctx.input(op, 3) if len(op.inputs) > 3 and op.inputs[3] else None
    out = ctx.new_output(op, 0)
    ys = shape(ir, op.outputs[0])
    sq, dv = ys[-2], ys[-1]
    d, skv = kt.shape()[-2], kt.shape()[-1]
    G = math.prod(ys[:-2])
    used, counts = tile_counts_of(g, out)
    ob, oe, otl = g.tile_runs_of(out)
    n_out = out.numElements()
    reads = [Access(q, proportional_boxes(q, n_out, ob, oe, otl))]
    for t, a, b in ((kt, d, skv), (v, skv, dv)):
        if list(t.shape()[:-2]) == list(ys[:-2]):
            reads.append(Access(t.reshape([G, a, b]), _group_boxes(t.reshape([G, a, b]), sq * dv, ob, oe, otl)))
        else:
            reads.append(Access(t, proportional_boxes(t, n_out, ob, oe, otl)))
    if bias is not None:
        reads.append(Access(bias, proportional_boxes(bias, n_out, ob, oe, otl)))
    target = g.getTarget()
    t_in = q.elementType()
    amp = target.getAmpMacsPerCycle(t_in, poplar.HALF if t_in == poplar.HALF else poplar.FLOAT)
    rows = np.ceil(counts / dv)
    vw = target.getVectorWidth(poplar.FLOAT)
    cycles = (FUSED_ATTENTION_OVERHEAD + np.ceil(rows * skv * (d + dv) / amp) +
              np.ceil(SOFTMAX_OPS * rows * skv / vw)).astype(np.int64)
    flops = 2.0 * G * sq * skv * (d + dv) + SOFTMAX_OPS * G * sq * skv
    cs = g.addComputeSet(name(op))
    ins = [q, kt, v] + ([bias] if bias is not None else [])
    g.add_vertex_group(cs, VertexGroup(
        f"popart::FusedAttention<{t_in}>", used, cycles,
        functools.partial(_attention_kernel_run, dict(op.attrs), ins, out),
        reads=reads, writes=[Access(out)], multi=True, flops=flops, state_bytes=16 + 8 * (len(ins) + 1)))
    ctx.prog.add(poplar.program.Execute(cs, debugContext=f"FusedAttention:{op.outputs[0]}"))
    return [out]


# ------------------------------------------------------------------------------------------
# fp8
# ------------------------------------------------------------------------------------------
def _fmt(op, key="in_format", default="F143"):
    f = op.attrs.get(key, default)
    return f.decode() if isinstance(f, bytes) else f


def _quantize_kernel(src, dst, fmt, scale, ctx):
    x = ctx.read(src)
    ctx.write(dst, quantize_values(x, fmt, scale))


def _metadata(g, fmt: str, scale: int, nm: str):
    """A constant metadata tensor for elements stored as ``fp8(t * 2**scale)``: scale bias
    ``-scale``, clamped to Poplar's ``[-32, 31]``. Returns ``(metadata, residual)``: the power of
    two the clamp left out, which the output vertex applies."""
    bias = int(min(max(-scale, SCALE_BIAS_MIN), SCALE_BIAS_MAX))
    return poplar.createConstantMetadataTensor(g, fmt, bias, nm), -scale - bias


def _quantize(g, x, fmt: str, scale: int, prog, nm: str):
    """``fp8_fmt(x * 2**scale)`` into a new QUARTER tensor mapped like ``x``, stored in ``fmt``
    with metadata scale bias ``-scale``. One vertex group; cycles of a scale-and-cast map
    (generic estimate). Returns ``(tensor, residual power of two)`` (see :func:`_metadata`)."""
    md, rest = _metadata(g, fmt, scale, f"{nm}/inMetadata")
    out = g.clone(poplar.QUARTER, md, x, f"{nm}/fp8")           # x's shape and tile mapping
    out_t = out.elementType()
    used, counts = tile_counts_of(g, out)
    n = out.numElements()
    cycles = generic_cycles(counts, n, 3.0 * n, n * (x.elementType().size + out_t.size), x.elementType(), g.getTarget())
    cs = g.addComputeSet(f"{nm}/quantize")
    g.add_vertex_group(cs, VertexGroup(
        f"popops::CastToQuarter<{x.elementType()},{fmt}>", used, cycles.astype(np.int64),
        functools.partial(_quantize_kernel, x, out, fmt, scale),
        reads=[Access(x)], writes=[Access(out)], multi=True, flops=3.0 * n))
    prog.add(poplar.program.Execute(cs, debugContext=f"{nm}/quantize"))
    return out, rest


def _weight_value(ctx, op):
    """The initializer value of the weight when it is a constant (inference with
    ``constantWeights``, PopRT's default), else None: with ``constantWeights=False`` the weight is
    a device variable that ``weightsFromHost`` / ``writeWeights`` set, so it is cast to fp8 on the
    device at each run instead of being built into the program."""
    t = ctx.ir.tensors.get(op.inputs[1])
    if t is None or t.kind != "Const" or t.value is None or getattr(ctx.ir, "training", False):
        return None
    return np.asarray(t.value, np.float32)


def _baked_weight(op, ir) -> tuple:
    """Inputs whose values the fp8 lowerings build into the program (outlining identity)."""
    if not QUARTER_CONSTANT_WEIGHTS or len(op.inputs) < 2:
        return ()
    t = ir.tensors.get(op.inputs[1])
    if t is None or t.kind != "Const" or t.value is None or getattr(ir, "training", False):
        return ()
    return (1,)


for _t in ("FP8MatMul", "FP8Conv"):
    outline.register_value_inputs(GC, _t, _baked_weight)


def _operands(ctx, op, g, nm, create_weight):
    """``(x operand, w operand, scale exponent left to the output vertex)``. With a quantised
    ``x`` both operands are QUARTER tensors whose metadata carry their formats and scales (the
    product applies them); with ``fp8_weight`` they are half and the output vertex scales by
    ``2**-(in_scale + weight_scale)``. The weights of an inference model are fp8 constants, 1 byte
    per element, as PopRT stores them, created by the product's PopLibs creator
    (``create_weight(type, value, name)``: each work block stored contiguously on the tiles the
    plan wants, as the fp16 path's weights are created by their consumer); other weights are cast
    on the device at each run (``popops.cast`` to QUARTER with metadata)."""
    if g.getTarget().getAmpMacsPerCycle(poplar.QUARTER) == 0:
        from openipu.popart.errors import popart_exception
        raise popart_exception(f"{op.op_type} '{op.outputs[0]}': fp8 (quarter) matrix products need an IPU with fp8 "
                               f"(ipu21, C600); the target is {g.getTarget().getTargetArchString()}")
    x = ctx.input(op, 0)
    fin, fw = _fmt(op), _fmt(op, "weight_format")
    sin, sw = int(op.attrs.get("in_scale", 0)), int(op.attrs.get("weight_scale", 0))
    value = _weight_value(ctx, op) if QUARTER_CONSTANT_WEIGHTS else None
    # the initializer as a device tensor only when the product reads it (a constant built into
    # the program is not also held in its ONNX type)
    w = ctx.input(op, 1) if value is None else None
    if not fin:                 # fp8_weight: x is not quantised, only scaled; half products
        xq = x
        if sin:
            xq = popops.mul(g, x, _const(g, x.elementType(), 2.0 ** sin, f"{nm}/inScale"), ctx.prog, f"{nm}/inScale")
        wt = xq.elementType()
        if value is not None:
            wq = create_weight(wt, value, f"{nm}/weights")
        elif w.elementType() != wt:
            wq = popops.cast(g, w, wt, ctx.prog, f"{nm}/weightsCast")
        else:
            wq = w
        return xq, wq, -(sin + sw)
    xq, rest_x = _quantize(g, x, fin, sin, ctx.prog, nm)
    wmd, rest_w = _metadata(g, fw, sw, f"{nm}/weightsMetadata")
    if value is not None:
        # the initializer holds fp8 values already (fp8(w * 2**weight_scale)): stored as they are
        wq = create_weight(quarter.storage_type(fw), value, f"{nm}/weights")
        g.set_quarter_metadata(wq, wmd)
    else:
        # device weights (fp8 values in half): cast to QUARTER with a scale bias 0 metadata
        # (exact), the weight scale applied with the residual
        wmd0 = poplar.createConstantMetadataTensor(g, fw, 0, f"{nm}/weightsMetadata0")
        wq = popops.cast(g, w, poplar.QUARTER, wmd0, ctx.prog, f"{nm}/weightsCast")
        rest_w = -sw
    return xq, wq, rest_x + rest_w


def _const(g, t, value, nm):
    c = g.addConstant(t, [], value, nm)
    g.setTileMapping(c, 0)
    return c


def _epilogue_kernel(y, b, out, scale, ctx):
    v = ctx.read(y).float() * scale
    if b is not None:
        v = v + ctx.read(b).float().reshape((v.shape[0],) + (1,) * (v.dim() - 1 - b.rank()) + tuple(b.shape()))
    ctx.write(out, v.to(out.elementType().torch_dtype))


def _finish(ctx, op, g, y, nm, exponent: int, channel_axis=None):
    """``y * 2**exponent + bias`` in the output type: one vertex group on the tiles of ``y`` (the
    fp8 AMP applied the scales of its operands' metadata as it accumulated; ``exponent`` is what
    is left: 0 unless a scale was outside the metadata's range, or ``fp8_weight``)."""
    out_t = poplar.HALF if dtype(ctx.ir, op.outputs[0]) == "FLOAT16" else poplar.FLOAT
    b = ctx.input(op, 2) if len(op.inputs) > 2 and op.inputs[2] else None
    if b is not None and channel_axis is not None:
        b = b.reshape([b.numElements()] + [1] * (y.rank() - channel_axis - 1))
    out = g.clone(out_t, y, f"{nm}/out")
    used, counts = tile_counts_of(g, out)
    n = out.numElements()
    nbytes = n * (y.elementType().size + out_t.size)
    cycles = generic_cycles(counts, n, 2.0 * n, nbytes, out_t, g.getTarget()).astype(np.int64)
    reads = [Access(y)]
    if b is not None:
        ob, oe, otl = g.tile_runs_of(out)
        reads.append(Access(b, proportional_boxes(b, n, ob, oe, otl)))
    cs = g.addComputeSet(f"{nm}/output")
    g.add_vertex_group(cs, VertexGroup(
        f"poplin::Fp8Output<{out_t}>", used, cycles,
        functools.partial(_epilogue_kernel, y, b, out, 2.0 ** exponent),
        reads=reads, writes=[Access(out)], multi=True, flops=2.0 * n))
    ctx.prog.add(poplar.program.Execute(cs, debugContext=f"{nm}/output"))
    return out


def _accepts_fp8(op, ir):
    if len(op.inputs) < 2 or not op.inputs[0] or not op.inputs[1]:
        return False
    if {dtype(ir, x) for x in op.inputs if x} - set(FLOATS):
        return False
    return _fmt(op) in ("F143", "F152", "") and _fmt(op, "weight_format") in ("F143", "F152")


@lowering("FP8MatMul", domain=GC, accepts=lambda op, ir: _accepts_fp8(op, ir) and len(shape(ir, op.inputs[1])) == 2
          and len(shape(ir, op.inputs[0])) >= 2)
def fp8_matmul(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    opts = poplibs_options(op, ctx.options.matmulOptions, "float")
    xs = shape(ctx.ir, op.inputs[0])
    rows = math.prod(xs[:-1])
    xq, wq, exponent = _operands(ctx, op, g, nm, lambda t, value, wname: poplin.create_matmul_input_rhs(
        g, t, [rows, xs[-1]], list(value.shape), wname, opts, value=value))
    y = poplin.matMul(g, xq.reshape([rows, xs[-1]]), wq, ctx.prog, poplar.FLOAT, f"{nm}/matmul", opts)
    y = _finish(ctx, op, g, y, nm, exponent)
    return [y.reshape(shape(ctx.ir, op.outputs[0]))]


def _accepts_fp8_conv(op, ir):
    return _accepts_fp8(op, ir) and hasattr(poplin, "convolution") and conv_lowering._params(op, ir, "half") is not None


@lowering("FP8Conv", domain=GC, accepts=_accepts_fp8_conv)
def fp8_conv(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    p0 = conv_lowering._params(op, ctx.ir, "half")
    t = poplar.QUARTER if _fmt(op) else poplar.HALF       # fp8_weight: half products
    p = poplin.ConvParams(t, poplar.FLOAT, p0.batchSize, p0.inputFieldShape, p0.kernelShape,
                          p0.inputChannelsPerConvGroup, p0.outputChannelsPerConvGroup, p0.numConvGroups,
                          inputTransform=p0.inputTransform, kernelTransform=p0.kernelTransform,
                          outputTransform=p0.outputTransform)
    G = p.numConvGroups
    opts = poplibs_options(op, ctx.options.convolutionOptions, "float")

    def grouped(w):
        return w.reshape([G, w.dim(0) // G] + w.shape()[1:])

    def create_weight(wt, value, wname):
        w = poplin.create_weights(g, p, wname, opts, value=value.reshape(p.getWeightsShape()), type_=wt)
        return w.reshape(list(value.shape))

    xq, wq, exponent = _operands(ctx, op, g, nm, create_weight)
    if xq.elementType() != t:
        xq = popops.cast(g, xq, t, ctx.prog, f"{nm}/inputCast")
    y = poplin.convolution(g, xq, grouped(wq), p, False, ctx.prog, f"{nm}/conv", opts)
    return [_finish(ctx, op, g, y, nm, exponent, channel_axis=1)]
