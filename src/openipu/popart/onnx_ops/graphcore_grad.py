"""Host kernels of the ``ai.graphcore`` gradient ops of the ai.graphcore forward ops (rules in
:mod:`openipu.popart.grads.graphcore`), named as PopART names them. Element types follow the
forward op's. The gradients of ops that only move data (GroupedGather, DepthToSpace) and of
ScatterReduce are the vector-Jacobian products of the forward kernels (``torch.autograd`` of
:mod:`openipu.popart.graphcore_ops`), so they follow the forward semantics exactly (ties of a
Max / Min scatter share the gradient as in ``torch.scatter_reduce``). Cost hints are
module-level functions (the registry stays picklable).
"""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import onnx_op
from openipu.popart.onnx_ops.grad import _elementwise_flops as _flops
from openipu.popart.onnx_ops._common import numel

GC = "ai.graphcore"


def _gn_grad_flops(i, o, a):
    return 12.0 * numel(i[0])


def _shape(attrs, key):
    return [int(d) for d in attrs[key]]


@onnx_op("SwishGrad", domain=GC, flops=_flops(6))
def swish_grad(inputs, attrs, opset):
    """d(x sigmoid(x)) = ``gy * (s + x s (1 - s))``: ``[x, gy] -> gx``."""
    x, gy = inputs
    s = torch.sigmoid(x.float())
    return [(gy.float() * (s + x.float() * s * (1 - s))).to(gy.dtype)]


@onnx_op("SubsampleGrad", domain=GC, flops=_flops(1))
def subsample_grad(inputs, attrs, opset):
    """``[gy] -> gx`` of ``input_shape``: gy at every ``strides[d]``-th element, zeros elsewhere."""
    (gy,) = inputs
    out = torch.zeros(_shape(attrs, "input_shape"), dtype=gy.dtype, device=gy.device)
    out[tuple(slice(None, None, int(s)) for s in attrs["strides"])] = gy
    return [out]


@onnx_op("SliceGrad", domain=GC, flops=_flops(1))
def slice_grad(inputs, attrs, opset):
    """Gradient of ``aiGraphcore.slice``: ``[gy] -> gx`` of ``input_shape``, gy in the sliced
    region (ONNX clamping of starts / ends), zeros elsewhere."""
    (gy,) = inputs
    shape = _shape(attrs, "input_shape")
    starts, ends = list(attrs.get("starts", [])), list(attrs.get("ends", []))
    axes = list(attrs.get("axes") or range(len(starts)))
    idx = [slice(None)] * len(shape)
    for s, e, ax in zip(starts, ends, axes):
        idx[int(ax)] = slice(int(s), int(e))
    out = torch.zeros(shape, dtype=gy.dtype, device=gy.device)
    out[tuple(idx)] = gy
    return [out]


@onnx_op("CtcGrad", domain=GC, flops=_flops(2))
def ctc_grad(inputs, attrs, opset):
    """PopART's ``CtcGrad``: ``[d(losses)/d(log_probs) [T, N, C], target_lengths [N], gy] ->
    d(loss)/d(log_probs)``, the per-sample gradients scaled by the loss gradient (Mean: over
    each target length (>= 1) and the batch; NoReduction: gy per sample)."""
    g, tl, gy = inputs
    red = int(attrs.get("reduction", 1))
    n = g.shape[1]
    if red == 2:
        scale = gy.float().reshape(1, n, 1)
    elif red == 0:
        scale = gy.float().reshape(())
    else:
        scale = (gy.float().reshape(()) / n / tl.float().clamp(min=1)).reshape(1, n, 1)
    return [(g.float() * scale).to(g.dtype)]


@onnx_op("ReduceMedianGrad", domain=GC, flops=_flops(1))
def reduce_median_grad(inputs, attrs, opset):
    """PopART's ``ReduceMedianGrad``: ``[gy, indices] -> gx`` of ``input_shape``: each gradient at
    its median's position (indices flattened over the reduced axes), zeros elsewhere."""
    gy, idx = inputs
    shape = _shape(attrs, "input_shape")
    r = len(shape)
    axes = attrs.get("axes")
    axes = list(range(r)) if axes is None else sorted({int(a) % r for a in axes})
    keep = [d for d in range(r) if d not in axes]
    lead = [shape[d] for d in keep]
    flat = torch.zeros(lead + [math.prod(shape[d] for d in axes) if axes else 1], dtype=gy.dtype, device=gy.device)
    flat.scatter_(-1, idx.long().reshape(lead + [1]), gy.reshape(lead + [1]))
    perm = keep + axes
    inv = [perm.index(d) for d in range(r)]
    return [flat.reshape([shape[d] for d in perm]).permute(inv).contiguous()]


@onnx_op("GroupNormalizationGrad", domain=GC, flops=_gn_grad_flops)
def group_norm_grad(inputs, attrs, opset):
    """PopART's ``GroupNormalizationGrad`` (``GroupNormGradOp``, the gradient of ai.graphcore
    ``GroupNormalization``, which PopTorch's ``layer_norm`` / ``group_norm`` lower to):
    ``[gy, x [N, C, ...], scale [C], mean [N*G], invStdDev [N*G]] -> [dx (x's shape and type),
    dscale, dbias (scale's shape and type)]``, through the statistics the forward op output, as
    popnn's ``groupNormWhiten`` / ``groupNormGradients`` / ``groupNormParamGradients`` compute
    them (PopLibs' formulas, see :mod:`openipu.poplibs.popnn.norms`):

    - ``w = (x - mean) * invStdDev`` and the products ``gy * w``, ``g = gy * scale``, ``g * w`` in
      x's type (a half product rounded to half, as the IPU's half vertices round);
    - ``dscale[c] = sum(gy * w)``, ``dbias[c] = sum(gy)`` over the batch and field, float
      accumulation, rounded to the type;
    - ``dx = invStdDev * (g - mean_S(g) - w * mean_S(g * w))`` in float over each statistic group
      ``S`` (a ``(batch, group)``), rounded to x's type.

    The sums are whole-tensor float32 sums (another order than the IPU's reduction tree: equal
    within float32 rounding). Channels are grouped contiguously, or strided (``c % G``) with the
    attribute ``stridedChannelGrouping`` (the session option ``groupNormStridedChannelGrouping``).

    The gradient op of ONNX's ``GroupNormalization`` shares the name (openipu's form ``[x,
    scale, "", "", gy]`` with the attributes ``fwd_opset`` / ``bias_shape``: the statistics are
    recomputed): it is :func:`openipu.popart.onnx_ops.grad._norm_grad`'s. Statistics given as
    ``None`` are recomputed as the forward op computes them. Raises ``ValueError`` when the
    channels do not split into ``num_groups`` groups."""
    if "bias_shape" in attrs or "fwd_opset" in attrs:
        from openipu.popart.onnx_ops.grad import _norm_grad
        return _norm_grad("GroupNormalization", inputs, attrs, opset)
    from openipu.popart.graphcore_ops.normalization import group_norm, group_norm_layout
    gy, x, scale, mean, inv = inputs
    groups = int(attrs["num_groups"])
    strided = bool(attrs.get("stridedChannelGrouping", 0))
    n, c = x.shape[0], x.shape[1]
    if groups < 1 or c % groups:
        raise ValueError(f"GroupNormalizationGrad: {c} channels do not split into {groups} groups")
    dt = x.dtype
    if mean is None or inv is None:     # no statistics given: the forward op's, recomputed
        _, mean, inv = group_norm(x, scale, torch.zeros_like(scale), groups, float(attrs.get("epsilon", 1e-5)),
                                  strided)

    def rnd(t):         # a product or difference in x's type, computed in float (the IPU's rounding)
        return t if dt == torch.float32 else t.to(dt).float()

    def back(v):        # the [N, G, C/G, F] view back to x's layout
        return (v.transpose(1, 2) if strided else v).reshape(x.shape)

    stat = [n, groups, 1, 1]
    m = mean.to(dt).float().reshape(stat)
    i = inv.to(dt).float().reshape(stat)
    w = rnd(rnd(group_norm_layout(x.float(), groups, strided) - m) * i)
    w_x = back(w)
    g_in = gy.float().reshape(x.shape)
    chan = [d for d in range(x.dim()) if d != 1]
    dscale = rnd(g_in * w_x).sum(chan)
    dbias = g_in.sum(chan)
    g = rnd(g_in * scale.to(dt).float().reshape([1, c] + [1] * (x.dim() - 2)))
    gw = rnd(g * w_x)
    gv, gwv = group_norm_layout(g, groups, strided), group_norm_layout(gw, groups, strided)
    count = gv.shape[2] * gv.shape[3]
    s1, s2 = gv.sum((2, 3), keepdim=True), gwv.sum((2, 3), keepdim=True)
    dx = back(i * (gv - s1 / count - w * s2 / count))
    return [dx.to(dt), dscale.reshape(scale.shape).to(scale.dtype), dbias.reshape(scale.shape).to(scale.dtype)]


@onnx_op("DynamicSlicePadGrad", domain=GC, flops=_flops(1))
def dynamic_slice_pad_grad(inputs, attrs, opset):
    """PopART's ``DynamicSlicePadGrad``: ``[gy, offset] -> gx`` of ``input_shape``: gy at the
    slice's place (wrapping as the forward slice), zeros elsewhere."""
    from openipu.popart.graphcore_ops import dyn_write
    gy, offset = inputs
    return [dyn_write(torch.zeros(_shape(attrs, "input_shape"), dtype=gy.dtype, device=gy.device), offset, gy, attrs,
                      "add")]


@onnx_op("SequenceSliceGrad", domain=GC, flops=_flops(1))
def sequence_slice_grad(inputs, attrs, opset):
    """Gradient of SequenceSlice w.r.t. ``input`` "source" (``[gy, N, sourceOffset,
    destinationOffset] ->`` rows of gy added back to the rows they came from) or
    "destination" (gy with the rows the slice wrote, or all when ``zeroUnused``, zeroed)."""
    from openipu.popart.graphcore_ops import sequence_rows
    gy, n, so, do = inputs
    g2 = gy.reshape(gy.shape[0], -1)
    if attrs.get("input") == "destination":
        if int(attrs.get("zeroUnused", 0)):
            return [torch.zeros_like(gy)]
        _, rd = sequence_rows(n, so, do, 1 << 62, g2.shape[0])
        out = g2.clone()
        out[rd] = 0
        return [out.reshape(gy.shape)]
    shape = _shape(attrs, "input_shape")
    rs, rd = sequence_rows(n, so, do, shape[0], g2.shape[0])
    out = torch.zeros(shape[0], g2.shape[1], dtype=torch.float32, device=g2.device)
    out.index_add_(0, rs, g2[rd].float())
    return [out.reshape(shape).to(gy.dtype)]


def _vjp(fn, inputs: list, wrt: int, gy: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        ins = [t.detach() if t is not None else None for t in inputs]
        ins[wrt] = ins[wrt].float().requires_grad_(True)
        y = fn(*ins)
        (g,) = torch.autograd.grad(y, ins[wrt], gy.float().reshape(y.shape))
    return g


@onnx_op("ScatterReduceGrad", domain=GC, flops=_flops(2))
def scatter_reduce_grad(inputs, attrs, opset):
    """Gradient of ScatterReduce w.r.t. input ``wrt`` (0: src, 2: initial): ``[gy, src, index(,
    initial)]``, the vector-Jacobian product of the forward kernel."""
    from openipu.popart.graphcore_ops import scatter_reduce_fn
    gy, src, index = inputs[0], inputs[1], inputs[2]
    initial = inputs[3] if len(inputs) > 3 else None
    wrt = int(attrs.get("wrt", 0))
    dt = src.dtype if wrt == 0 else initial.dtype
    args = [src.float(), index, None if initial is None else initial.float()]
    g = _vjp(lambda s, i, init: scatter_reduce_fn(s, i, init, attrs), args, wrt, gy)
    return [g.to(dt)]


@onnx_op("GroupedGatherGrad", domain=GC, flops=_flops(1))
def grouped_gather_grad(inputs, attrs, opset):
    """Gradient of GroupedGather w.r.t. the data: ``[gy, indices] -> gx`` of ``data_shape``
    (each slice of gy added into its group's gathered row)."""
    from openipu.popart.graphcore_ops import grouped_gather_fn
    gy, idx = inputs
    data = torch.zeros(_shape(attrs, "data_shape"), device=gy.device)
    g = _vjp(lambda d, i: grouped_gather_fn(d, i, int(attrs.get("axis", 0))), [data, idx], 0, gy)
    return [g.to(gy.dtype)]


@onnx_op("SortGrad", domain=GC, flops=_flops(1))
def sort_grad(inputs, attrs, opset):
    """Gradient of Sort's values: ``[gy, indices] -> gx`` (each gradient back at its element's
    place along ``axis``)."""
    gy, idx = inputs
    axis = int(attrs.get("axis", -1)) % gy.dim()
    return [torch.zeros_like(gy).scatter(axis, idx.long(), gy)]


@onnx_op("DepthToSpaceGrad", domain=GC, flops=_flops(1))
def depth_to_space_grad(inputs, attrs, opset):
    """Gradient of DepthToSpace: ``[gy] -> gx`` of ``input_shape`` (the inverse rearrangement)."""
    from openipu.popart.graphcore_ops import depth_to_space
    (gy,) = inputs
    x = torch.zeros(_shape(attrs, "input_shape"), device=gy.device)
    g = _vjp(lambda t: depth_to_space([t], attrs, 1)[0], [x], 0, gy)
    return [g.to(gy.dtype)]
