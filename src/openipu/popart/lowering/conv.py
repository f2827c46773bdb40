"""ONNX Conv through ``poplin.convolution`` (PopART's ``ConvOpx``), bias through ``poplin.addBias``.

Geometry: ``x`` ``[N, C, *field]``, ``W`` ``[M, C / group, *kernel]`` viewed as poplin's
``[group, M / group, C / group, *kernel]``; ``ConvParams(type, N, field, kernel, C / group,
M / group, group)`` with the ONNX begin / end pads (explicit or from ``auto_pad``) as the input
transform's lower / upper padding, ``dilations`` as the kernel transform's dilation and
``strides`` as the output transform's stride. The bias ``B`` ``[M]`` is added in place per output
channel (``poplin::addBias``, as PopART's ``ConvOpx``).

Options: the session's ``convolutionOptions``, ``__available_memory_proportion``
(``builder.setAvailableMemoryProportion``) and ``__partials_type`` (``builder.setPartialsType``).
Declined (generic lowering): non-float or mixed types, negative pads, more than 3 field
dimensions, and any geometry whose poplin output shape differs from the IR's. Registered only
when ``poplin`` has ``convolution``.
"""

from __future__ import annotations

from openipu.poplibs import poplin
from openipu.popart.lowering import lowering
from openipu.popart.lowering._util import all_float, graph, name, poplibs_options, shape
from openipu.popart.onnx_ops.conv import conv_geometry


def _params(op, ir, in_type=None):
    xs, ws = shape(ir, op.inputs[0]), shape(ir, op.inputs[1])
    nd = len(xs) - 2
    if not 1 <= nd <= 3 or len(ws) != nd + 2:
        return None
    groups = int(op.attrs.get("group", 1))
    n, c = xs[0], xs[1]
    m, cg = ws[0], ws[1]
    if groups < 1 or c != cg * groups or m % groups:
        return None
    k = ws[2:]
    if op.attrs.get("kernel_shape") and list(op.attrs["kernel_shape"]) != list(k):
        return None
    try:
        strides, dil, pads = conv_geometry(xs, k, op.attrs)
    except Exception:
        return None
    if min(pads) < 0 or len(pads) != 2 * nd:
        return None
    t = in_type if in_type is not None else ("half" if ir.tensors[op.inputs[0]].info.data_type() == "FLOAT16"
                                             else "float")
    try:
        p = poplin.ConvParams(t, t, n, xs[2:], k, cg, m // groups, groups,
                              inputTransform=poplin.InputTransform(paddingLower=pads[:nd], paddingUpper=pads[nd:]),
                              kernelTransform=poplin.InputTransform(dilation=dil),
                              outputTransform=poplin.OutputTransform(stride=strides))
    except Exception:
        return None
    if p.getOutputShape() != shape(ir, op.outputs[0]):
        return None
    return p


def _accepts(op, ir):
    if not hasattr(poplin, "convolution") or len(op.inputs) < 2 or not op.inputs[0] or not op.inputs[1]:
        return False
    if not all_float(ir, op):
        return False
    if len(op.inputs) > 2 and op.inputs[2] and shape(ir, op.inputs[2]) != [shape(ir, op.inputs[1])[0]]:
        return False
    return _params(op, ir) is not None


def _options(ctx, op) -> dict:
    return poplibs_options(op, ctx.options.convolutionOptions)


@lowering("Conv", accepts=_accepts)
def conv(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    x, w = ctx.input(op, 0), ctx.input(op, 1)
    p = _params(op, ctx.ir, x.elementType())
    G = p.numConvGroups
    w = w.reshape([G, w.dim(0) // G] + w.shape()[1:])
    if ctx.owns_layout(op, 1):      # a weight this op creates: lay it out for the plan
        poplin.map_weights(g, w, p, _options(ctx, op))
    out = poplin.convolution(g, x, w, p, False, ctx.prog, nm, _options(ctx, op))
    b = ctx.input(op, 2) if len(op.inputs) > 2 else None
    if b is not None:
        poplin.addBias(g, out, b, ctx.prog, f"{nm}/bias")
    return [out]

