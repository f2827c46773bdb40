"""Host kernels for the ``ai.graphcore`` forward operators (PopART's ``AiGraphcoreOpset1``), used
when :mod:`openipu.popart.onnx_ops` has no kernel registered for them (same interface:
``fn(inputs, attrs, opset) -> outputs`` on torch tensors, attrs not defaulted). They give the
builder its shape inference (a run on zeros), constant folding, and the generic lowering; ops
with a PopLibs form also have a precise lowering (:mod:`openipu.popart.lowering.graphcore`).
Their gradients are in :mod:`openipu.popart.grads.graphcore`.

Semantics follow PopART's op definitions (``willow/include/popart/op/*.hpp``): Gelu is the tanh
approximation (``popnn::NonLinearityType::GELU``), GeluErf the exact erf form; ``reduction``
attributes use PopART's C++ ``ReductionType`` order (Sum 0, Mean 1, NoReduction 2).
"""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import OpKernel, get_kernel
from openipu.popart.onnx_ops._common import nll_rows

_GC: dict[str, OpKernel] = {}
GRAPHCORE = "ai.graphcore"


def _gc(*names, flops=None):
    def reg(fn):
        for n in names:
            _GC[n] = OpKernel(GRAPHCORE, n, fn, flops)
        return fn
    return reg


def find_kernel(domain: str, op_type: str) -> OpKernel | None:
    """The kernel for ``(domain, op_type)``: the onnx_ops registry first, then this module."""
    k = get_kernel(domain, op_type)
    if k is None and domain == GRAPHCORE:
        k = _GC.get(op_type)
    return k


def _float(x):
    return x if x.is_floating_point() else x.float()


@_gc("Gelu", flops=lambda i, o, a: 10.0 * math.prod(o[0]))
def gelu(inputs, attrs, opset):
    return [torch.nn.functional.gelu(inputs[0], approximate="tanh")]


@_gc("GeluErf", flops=lambda i, o, a: 8.0 * math.prod(o[0]))
def gelu_erf(inputs, attrs, opset):
    return [torch.nn.functional.gelu(inputs[0])]


@_gc("Swish", flops=lambda i, o, a: 6.0 * math.prod(o[0]))
def swish(inputs, attrs, opset):
    x = inputs[0]
    return [x * torch.sigmoid(x)]


@_gc("Scale")
def scale(inputs, attrs, opset):
    x = inputs[0]
    return [(x * float(attrs.get("scale", 1.0))).to(x.dtype)]


@_gc("ScaledAdd", flops=lambda i, o, a: 3.0 * math.prod(o[0]))
def scaled_add(inputs, attrs, opset):
    a, b = inputs[0], inputs[1]
    s0 = inputs[2] if len(inputs) > 2 and inputs[2] is not None else float(attrs.get("scale0", 1.0))
    s1 = inputs[3] if len(inputs) > 3 and inputs[3] is not None else float(attrs.get("scale1", 1.0))
    return [(a * s0 + b * s1).to(a.dtype)]


@_gc("Detach", "Nop", "PrintTensor")
def identity(inputs, attrs, opset):
    return [inputs[0].clone()]


@_gc("IdentityLoss")
def identity_loss(inputs, attrs, opset):
    x = inputs[0]
    red = int(attrs.get("reduction", 1))
    return [x.sum() if red == 0 else x.mean() if red == 1 else x.clone()]


def _reduce(x, red: int):
    """PopART's ReductionType (C++ order): Sum 0, Mean 1, NoReduction 2."""
    return x.sum() if red == 0 else x.mean() if red == 1 else x


@_gc("Nll", flops=lambda i, o, a: 2.0 * math.prod(i[1]))
def nll(inputs, attrs, opset):
    """``-log(probs[label])`` per sample (``-probs[label]`` when ``inputIsLogProbability``),
    reduced; probs ``[..., C]``, label ``[...]`` (integers). Rows whose label is ``ignoreIndex``
    count 0 and, for Mean, are left out of the count (as PyTorch's NLLLoss)."""
    p, label = inputs
    p2, lab, keep = nll_rows(p, label, attrs.get("ignoreIndex"))
    picked = p2[torch.arange(p2.shape[0]), lab]
    per = -picked if attrs.get("inputIsLogProbability", 0) else -torch.log(picked)
    per = torch.where(keep, per, torch.zeros(()))
    red = int(attrs.get("reduction", 1))
    if red == 1:
        out = per.sum() / max(int(keep.sum()), 1)
    else:
        out = per.reshape(label.shape) if red == 2 else per.sum()
    return [out.to(p.dtype)]


@_gc("L1", flops=lambda i, o, a: 2.0 * math.prod(i[0]))
def l1(inputs, attrs, opset):
    """``lambda * |x|``, reduced (PopART's ``l1loss``)."""
    x = inputs[0]
    return [(_reduce(torch.abs(x.float()), int(attrs.get("reduction", 1))) * float(attrs.get("lambda", 1.0)))
            .to(x.dtype)]


@_gc("Reshape")
def reshape(inputs, attrs, opset):
    return [inputs[0].reshape([int(s) for s in attrs["shape"]])]


@_gc("Subsample")
def subsample(inputs, attrs, opset):
    x = inputs[0]
    idx = tuple(slice(None, None, int(s)) for s in attrs.get("strides", []))
    return [x[idx].clone()]


@_gc("Reverse")
def reverse(inputs, attrs, opset):
    return [torch.flip(inputs[0], [int(d) for d in attrs.get("dimensions", [])])]


@_gc("Slice")
def slice_(inputs, attrs, opset):
    x = inputs[0]
    starts, ends = list(attrs.get("starts", [])), list(attrs.get("ends", []))
    axes = list(attrs.get("axes", range(len(starts))))
    idx = [slice(None)] * x.dim()
    for s, e, ax in zip(starts, ends, axes):
        idx[int(ax)] = slice(int(s), int(e))
    return [x[tuple(idx)].clone()]


@_gc("Round", "Nearbyint")
def round_(inputs, attrs, opset):
    return [torch.round(inputs[0])]


@_gc("Fmod")
def fmod(inputs, attrs, opset):
    return [torch.fmod(inputs[0], inputs[1])]


@_gc("Remainder")
def remainder(inputs, attrs, opset):
    return [torch.remainder(inputs[0], inputs[1])]


@_gc("Atan2", flops=lambda i, o, a: 20.0 * math.prod(o[0]))
def atan2(inputs, attrs, opset):
    return [torch.atan2(inputs[0], inputs[1])]


@_gc("Expm1", flops=lambda i, o, a: 10.0 * math.prod(o[0]))
def expm1(inputs, attrs, opset):
    return [torch.expm1(inputs[0])]


@_gc("Log1p", flops=lambda i, o, a: 10.0 * math.prod(o[0]))
def log1p(inputs, attrs, opset):
    return [torch.log1p(inputs[0])]


@_gc("BitwiseNot")
def bitwise_not(inputs, attrs, opset):
    return [torch.bitwise_not(inputs[0])]


@_gc("BitwiseAnd")
def bitwise_and(inputs, attrs, opset):
    return [torch.bitwise_and(inputs[0], inputs[1])]


@_gc("BitwiseOr")
def bitwise_or(inputs, attrs, opset):
    return [torch.bitwise_or(inputs[0], inputs[1])]


@_gc("BitwiseXor")
def bitwise_xor(inputs, attrs, opset):
    return [torch.bitwise_xor(inputs[0], inputs[1])]


@_gc("BitwiseXnor")
def bitwise_xnor(inputs, attrs, opset):
    return [torch.bitwise_not(torch.bitwise_xor(inputs[0], inputs[1]))]


# ----------------------------------------------------------------------------------------------
# training-era ai.graphcore ops (PopART ``willow/src/op/*.cpp``): shapes follow each op's
# ``setup()``; every kernel works on whole tensors (no per-element Python loops)
# ----------------------------------------------------------------------------------------------
#: PopART's C++ ``DataType`` enum order (Init's ``data_type`` attribute)
DATA_TYPES = ["UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "UINT32", "UINT64", "BOOL", "FLOAT", "FLOAT16",
              "BFLOAT16", "FLOAT8_143", "FLOAT8_152", "DOUBLE", "COMPLEX64", "COMPLEX128", "STRING", "UNDEFINED"]


def _ints(v) -> list[int]:
    return [int(x) for x in (v if v is not None else [])]


def _axis(a: int, rank: int, what: str) -> int:
    if not -rank <= a < max(rank, 1):
        raise ValueError(f"{what}: axis {a} is outside the acceptable range [{-rank}, {rank - 1}]")
    return a % max(rank, 1)


def reduce_loss(per: torch.Tensor, red: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """PopART's loss reduction of per-sample losses (Sum 0, Mean 1, NoReduction 2); Mean
    divides by ``lengths`` (clamped to >= 1) first when given (CTC)."""
    if red == 2:
        return per
    if red == 0:
        return per.sum()
    if lengths is not None:
        per = per / lengths.to(per.dtype).clamp(min=1)
    return per.mean()


def _ctc_flops(i, o, a):
    """The alpha / beta recursions: ~10 operations per (time, batch, extended-label) cell, twice."""
    t, n = (i[0][0], i[0][1]) if len(i[0]) >= 2 else (1, 1)
    s = i[1][-1] if i[1] else 1
    return 20.0 * t * n * (2 * s + 1) + 4.0 * math.prod(i[0])


@_gc("Ctc", flops=_ctc_flops)
def ctc(inputs, attrs, opset):
    """PopART's ``Ctc`` (``aiGraphcore.ctcloss``): ``[log_probs [T, N, C], targets [N, S],
    input_lengths [N], target_lengths [N]] -> [loss, d(sum of per-sample losses)/d(log_probs)]``.

    The loss is ``torch.nn.functional.ctc_loss``'s (blank ``blank``, ``zeroInfinity``), reduced
    as PopART's ReductionType (Mean: each loss over its target length, then the batch mean), in
    ``outDataType`` (UNDEFINED: the log_probs' type). The second output ``[T, N, C]`` (log_probs'
    type) is what ``CtcGrad`` scales by the loss gradient (PopART computes both in one pass)."""
    lp, tgt, il, tl = inputs
    with torch.enable_grad():
        x = lp.detach().float().requires_grad_(True)
        per = torch.nn.functional.ctc_loss(x, tgt.long(), il.long(), tl.long(), blank=int(attrs.get("blank", 0)),
                                           reduction="none", zero_infinity=bool(attrs.get("zeroInfinity", 0)))
        (g,) = torch.autograd.grad(per.sum(), x)
    out = str(attrs.get("outDataType", "UNDEFINED"))
    dt = lp.dtype if out == "UNDEFINED" else (torch.float16 if out == "FLOAT16" else torch.float32)
    loss = reduce_loss(per.detach(), int(attrs.get("reduction", 1)), tl)
    return [loss.to(dt), g.to(lp.dtype)]


@_gc("Init")
def init(inputs, attrs, opset):
    """PopART's ``Init``: zeros of ``shape`` and ``data_type`` (PopART's DataType code); NoInit
    leaves memory as it is, which is zeros in openipu's fresh tensors."""
    from openipu.popart.shapes import KERNEL_TORCH_OF
    name = DATA_TYPES[int(attrs.get("data_type", 9))]
    return [torch.zeros(_ints(attrs.get("shape")), dtype=KERNEL_TORCH_OF.get(name, torch.float32))]


def _median_axes(x, attrs):
    r = x.dim()
    axes = attrs.get("axes")
    axes = list(range(r)) if axes is None else sorted({_axis(int(a), r, "ReduceMedian") for a in axes})
    keep = [d for d in range(r) if d not in axes]
    return axes, keep


@_gc("ReduceMedian", flops=lambda i, o, a: 4.0 * math.prod(i[0]))
def reduce_median(inputs, attrs, opset):
    """PopART's ``ReduceMedian``: ``[x] -> [values, indices]``, the lower median over ``axes``
    (default all) and its index flattened over the reduced axes (INT32), as numpy's ``flat``."""
    x = inputs[0]
    axes, keep = _median_axes(x, attrs)
    xs = list(x.shape)
    flat = x.permute(keep + axes).reshape([xs[d] for d in keep] + [-1])
    vals, idx = torch.median(flat, dim=-1)
    out = [xs[d] if d in keep else 1 for d in range(len(xs))] if int(attrs.get("keepdims", 1)) else \
        [xs[d] for d in keep]
    return [vals.reshape(out), idx.to(torch.int32).reshape(out)]


def group_norm_layout(x: torch.Tensor, groups: int, strided: bool) -> torch.Tensor:
    """``x [N, C, ...]`` viewed as ``[N, G, C/G, F]``: contiguous channel groups (``c // (C/G)``),
    or strided ones (``c % G``, PopLibs' ``groupNormStridedChannelGrouping``)."""
    n, c = x.shape[0], x.shape[1]
    if strided:
        return x.reshape(n, c // groups, groups, -1).transpose(1, 2)
    return x.reshape(n, groups, c // groups, -1)


def group_norm(x, scale, bias, groups: int, eps: float, strided: bool):
    """``(y, mean [N*G], invStdDev [N*G])`` of group normalisation (biased variance, float math)."""
    n, c = x.shape[0], x.shape[1]
    if groups < 1 or c % groups:
        raise ValueError(f"GroupNormalization: {c} channels do not split into {groups} groups")
    v = group_norm_layout(x.float(), groups, strided)
    mean = v.mean(dim=(2, 3), keepdim=True)
    var = ((v - mean) ** 2).mean(dim=(2, 3), keepdim=True)
    inv = torch.rsqrt(var + eps)
    w = (v - mean) * inv
    w = (w.transpose(1, 2) if strided else w).reshape(x.shape)
    shape = [1, c] + [1] * (x.dim() - 2)
    y = w * scale.float().reshape(shape) + bias.float().reshape(shape)
    return y, mean.reshape(n * groups), inv.reshape(n * groups)


@_gc("GroupNormalization", flops=lambda i, o, a: 8.0 * math.prod(i[0]))
def group_normalization(inputs, attrs, opset):
    """PopART's ``GroupNormalization``: ``[x [N, C, ...], scale [C], bias [C]] -> [y, mean
    [N*G], invStdDev [N*G]]`` (contiguous groups unless ``stridedChannelGrouping``)."""
    x, scale, bias = inputs
    y, mean, inv = group_norm(x, scale, bias, int(attrs["num_groups"]), float(attrs.get("epsilon", 1e-5)),
                              bool(attrs.get("stridedChannelGrouping", 0)))
    return [y.to(x.dtype), mean.to(x.dtype), inv.to(x.dtype)]


def dyn_indices(offsets: torch.Tensor, dims: list, sizes: list):
    """Per sliced axis, the indices ``(o + i) mod D`` of a wrapping slice (PopLibs'
    ``dynamicSlice``), and whether every offset is in ``[0, D)``."""
    o = offsets.reshape(-1).to(torch.int64)
    if o.numel() != len(dims):
        raise ValueError(f"the offset tensor has {o.numel()} elements but {len(dims)} axes are sliced")
    ok = bool(((o >= 0) & (o < torch.tensor(dims))).all()) if dims else True
    idx = [(o[j].clamp(0, max(d - 1, 0)) + torch.arange(s)) % max(d, 1) for j, (d, s) in enumerate(zip(dims, sizes))]
    return idx, ok


def _dyn_setup(x, attrs):
    r = x.dim()
    axes = [_axis(int(a), r, "DynamicSlice") for a in _ints(attrs.get("axes"))]
    sizes = _ints(attrs.get("sizes"))
    for a, s in zip(axes, sizes):
        if not 0 <= s <= x.shape[a]:
            raise ValueError(f"slice size {s} along axis {a} exceeds the dimension {x.shape[a]}")
    perm = axes + [d for d in range(r) if d not in axes]
    return axes, sizes, perm


def _grids(idx):
    return tuple(torch.meshgrid(*idx, indexing="ij")) if idx else ()


def dyn_slice(x, offset, attrs):
    """``x[offset]`` with ``attrs`` axes / sizes (zeros for an out-of-range offset)."""
    axes, sizes, perm = _dyn_setup(x, attrs)
    idx, ok = dyn_indices(offset, [x.shape[a] for a in axes], sizes)
    out_shape = list(x.shape)
    for a, s in zip(axes, sizes):
        out_shape[a] = s
    if not ok:
        return torch.zeros(out_shape, dtype=x.dtype)
    for a, i in zip(axes, idx):
        x = x.index_select(a, i)
    return x.contiguous()


def dyn_write(x, offset, s, attrs, mode: str):
    """A copy of ``x`` with the slice at ``offset`` replaced by ``s`` (``"update"``), zeroed
    (``"zero"``) or increased by ``s`` (``"add"``); an out-of-range offset changes nothing."""
    axes, sizes, perm = _dyn_setup(x, attrs)
    idx, ok = dyn_indices(offset, [x.shape[a] for a in axes], sizes)
    out = x.clone()
    if not ok:
        return out
    view = out.permute(perm)
    g = _grids(idx)
    if mode == "zero":
        view[g] = 0
    else:
        sv = s.to(x.dtype).permute(perm)
        if mode == "add":
            view[g] += sv
        else:
            view[g] = sv
    return out


@_gc("DynamicSlice", flops=lambda i, o, a: 0.0)
def dynamic_slice(inputs, attrs, opset):
    """PopART's ``DynamicSlice``: ``[tensor, offset [len(axes)]] -> tensor[offset]`` with
    ``sizes[i]`` elements along ``axes[i]`` (wrapping past the end, as PopLibs)."""
    return [dyn_slice(inputs[0], inputs[1], attrs)]


@_gc("DynamicUpdate", flops=lambda i, o, a: 0.0)
def dynamic_update(inputs, attrs, opset):
    """PopART's ``DynamicUpdate``: ``[tensor, offset, slice] ->`` tensor with ``slice`` at ``offset``."""
    return [dyn_write(inputs[0], inputs[1], inputs[2], attrs, "update")]


@_gc("DynamicZero", flops=lambda i, o, a: 0.0)
def dynamic_zero(inputs, attrs, opset):
    """PopART's ``DynamicZero``: ``[tensor, offset] ->`` tensor with the slice at ``offset`` zeroed."""
    return [dyn_write(inputs[0], inputs[1], None, attrs, "zero")]


@_gc("DynamicAdd")
def dynamic_add(inputs, attrs, opset):
    """PopART's ``DynamicAdd``: ``[tensor, offset, slice] ->`` tensor with ``slice`` added at ``offset``."""
    return [dyn_write(inputs[0], inputs[1], inputs[2], attrs, "add")]


def sequence_rows(n, src_off, dst_off, n_src: int, n_dst: int):
    """Row pairs ``(source row, destination row)`` of a SequenceSlice: ``N[i]`` consecutive rows
    from ``sourceOffset[i]`` / ``destinationOffset[i]`` per entry, rows out of range dropped."""
    n = n.reshape(-1).to(torch.int64).clamp(min=0)
    so, do = src_off.reshape(-1).to(torch.int64), dst_off.reshape(-1).to(torch.int64)
    total = int(n.sum())
    first = torch.repeat_interleave(torch.cumsum(n, 0) - n, n)
    step = torch.arange(total) - first
    src = torch.repeat_interleave(so, n) + step
    dst = torch.repeat_interleave(do, n) + step
    ok = (src >= 0) & (src < n_src) & (dst >= 0) & (dst < n_dst)
    return src[ok], dst[ok]


@_gc("SequenceSlice", flops=lambda i, o, a: 0.0)
def sequence_slice(inputs, attrs, opset):
    """PopART's ``SequenceSlice``: ``[source, destination, N, sourceOffset, destinationOffset]
    ->`` destination with rows ``destinationOffset[i] + j`` set to source rows
    ``sourceOffset[i] + j`` (``j < N[i]``); unreferenced rows zeroed when ``zeroUnused``."""
    src, dst, n, so, do = inputs
    s2, d2 = src.reshape(src.shape[0], -1), dst.reshape(dst.shape[0], -1)
    if s2.shape[1] != d2.shape[1]:
        raise ValueError(f"SequenceSlice: source {list(src.shape)} and destination {list(dst.shape)} inner "
                         "dimensions differ")
    rs, rd = sequence_rows(n, so, do, s2.shape[0], d2.shape[0])
    out = torch.zeros_like(d2) if int(attrs.get("zeroUnused", 0)) else d2.clone()
    out[rd] = s2[rs].to(out.dtype)
    return [out.reshape(dst.shape)]


SCATTER_REDUCE = {"sum": "sum", "max": "amax", "min": "amin", "mul": "prod"}


def scatter_index(src, index, axis: int, broadcast: bool):
    """``index`` as a tensor of ``src``'s shape: itself, or a 1-D index broadcast along ``axis``."""
    idx = index.long()
    if idx.shape != src.shape:
        if broadcast and idx.dim() == 1 and idx.shape[0] == src.shape[axis]:
            shape = [1] * src.dim()
            shape[axis] = -1
            idx = idx.reshape(shape).expand(src.shape)
        else:
            idx = idx.expand(src.shape)
    return idx


def scatter_reduce_fn(src, index, initial, attrs):
    """The ScatterReduce computation (differentiable in ``src`` and ``initial``)."""
    axis = _axis(int(attrs.get("axis", -1)), src.dim(), "ScatterReduceOp::setup")
    shape = list(src.shape)
    shape[axis] = int(attrs["axis_size"])
    idx = scatter_index(src, index, axis, bool(attrs.get("enable_index_broadcast", 1)))
    red = str(attrs.get("reduction", "sum"))
    red = {"0": "sum", "1": "max", "2": "min", "3": "mul", "4": "none"}.get(red, red)
    base = initial.to(src.dtype) if initial is not None else torch.zeros(shape, dtype=src.dtype)
    if red == "none":
        return base.scatter(axis, idx, src)
    return base.scatter_reduce(axis, idx, src, reduce=SCATTER_REDUCE[red], include_self=initial is not None)


@_gc("ScatterReduce", flops=lambda i, o, a: float(math.prod(i[0])))
def scatter_reduce(inputs, attrs, opset):
    """PopART's ``ScatterReduce``: ``[src, index(, initial)] -> out`` of ``src``'s shape with
    ``axis_size`` along ``axis``: ``out[.., i, ..] = reduce(src[index == i])`` (Sum, Max, Min,
    Mul; ``none`` scatters); rows nothing is scattered to are 0, or ``initial``'s."""
    src, index = inputs[0], inputs[1]
    initial = inputs[2] if len(inputs) > 2 else None
    return [scatter_reduce_fn(src, index, initial, attrs)]


def grouped_gather_fn(data, indices, axis: int):
    """``out[g] = take(data[g], indices[g], axis - 1)`` (negative indices count from the end)."""
    if data.shape[0] != indices.shape[0]:
        raise ValueError(f"GroupedGather: data {list(data.shape)} and indices {list(indices.shape)} have different "
                         "group counts")
    axis = _axis(axis, data.dim(), "GroupedGather")
    if axis == 0:
        raise ValueError("GroupedGather: axis 0 is the group axis; gather along an axis >= 1")
    g, d = data.shape[0], data.shape[axis]
    i = indices.long().reshape(g, -1)
    i = torch.where(i < 0, i + d, i)
    dm = data.movedim(axis, 1)                               # [G, D, rest...]
    out = dm[torch.arange(g)[:, None], i]                   # [G, M, rest...]
    ishape = list(indices.shape[1:])
    out = out.reshape([g] + ishape + list(dm.shape[2:]))
    # the index dims go where the gathered axis was
    k = len(ishape)
    perm = [0] + list(range(1 + k, axis + k)) + list(range(1, 1 + k)) + list(range(axis + k, out.dim()))
    return out.permute(perm).contiguous()


@_gc("GroupedGather", flops=lambda i, o, a: 0.0)
def grouped_gather(inputs, attrs, opset):
    """PopART's grouped ``Gather`` (``aiGraphcore.groupedgather``): ``[data [G, ...], indices
    [G, ...]]``, each group gathering from its own data along ``axis``."""
    return [grouped_gather_fn(inputs[0], inputs[1], int(attrs.get("axis", 0)))]


def _sort_flops(i, o, a):
    n = i[0][int(a.get("axis", -1))] if i[0] else 1
    return 4.0 * math.prod(i[0]) * max(1.0, math.log2(max(n, 2)))


@_gc("Sort", flops=_sort_flops)
def sort(inputs, attrs, opset):
    """PopART's ``Sort`` (a full TopK): ``[x] -> [values, indices (INT64)]`` along ``axis``."""
    x = inputs[0]
    axis = _axis(int(attrs.get("axis", -1)), x.dim(), "Sort")
    v, i = torch.sort(x, dim=axis, descending=bool(attrs.get("descending", 0)), stable=bool(attrs.get("stable", 0)))
    return [v, i.to(torch.int64)]


@_gc("Bucketize")
def bucketize(inputs, attrs, opset):
    """PopART's ``Bucketize`` (``torch.bucketize``): ``[x, boundaries (1-D, sorted)] -> INT32``
    bucket indices; ``right`` puts a value equal to a boundary in the bucket to its right."""
    x, b = inputs
    if b.dim() != 1:
        raise ValueError(f"BucketizeOp::setup The boundaries tensor is not a 1-D tensor. The boundaries tensor rank = "
                         f"{b.dim()}.")
    if x.dtype != b.dtype:
        raise ValueError(f"BucketizeOp::setup The input and boundaries tensors have different data types ({x.dtype}, "
                         f"{b.dtype})")
    return [torch.bucketize(x, b, right=bool(attrs.get("right", 0))).to(torch.int32)]


@_gc("IncrementMod", flops=lambda i, o, a: 2.0 * math.prod(o[0]))
def increment_mod(inputs, attrs, opset):
    """PopART's ``IncrementMod``: ``(x + increment) % modulus`` (C ``fmod``), x's type."""
    x = inputs[0]
    y = torch.fmod(x.double() + float(attrs["increment"]), float(attrs["modulus"]))
    return [y.to(x.dtype)]


@_gc("DepthToSpace")
def depth_to_space(inputs, attrs, opset):
    """``[N, C, H, W] -> [N, C/B^2, H B, W B]``, DCR (depth-column-row) or CRD order."""
    x = inputs[0]
    b = int(attrs["blocksize"])
    n, c, h, w = x.shape
    if c % (b * b):
        raise ValueError(f"DepthToSpace: {c} channels are not a multiple of blocksize^2 = {b * b}")
    if str(attrs.get("mode", "DCR")) == "CRD":
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    else:
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    return [y.reshape(n, c // (b * b), h * b, w * b)]


@_gc("CopyVarUpdate")
def copy_var_update(inputs, attrs, opset):
    """PopART's ``CopyVarUpdate``: ``[variable, updater] ->`` the updater's value (the lowering
    writes it into the variable)."""
    return [inputs[1].clone()]


@_gc("TensorRemap", "ReplicatedAllReduce")
def identity_like(inputs, attrs, opset):
    """TensorRemap (a layout change) and a one-replica ReplicatedAllReduce: the input."""
    return [inputs[0].clone()]


@_gc("NormalizeImage", flops=lambda i, o, a: 3.0 * math.prod(o[0]))
def normalize_image(inputs, attrs, opset):
    """PopART's ``NormalizeImage`` (``popops::normaliseImage``): ``[image [..., 3], offsets [3],
    scales [3]] -> [..., 4]``: ``(image * scale - offsets[c]) * scales[c]``, a zero 4th channel;
    UINT8 images give FLOAT16."""
    img, off, sc = inputs
    if img.shape[-1] != 3:
        raise ValueError(f"NormalizeImage: the image's inner dimension must be 3 channels, got {list(img.shape)}")
    dt = torch.float16 if not img.is_floating_point() else img.dtype
    y = (img.float() * float(attrs.get("scale", 1.0)) - off.float()) * sc.float()
    return [torch.cat([y, torch.zeros(list(y.shape[:-1]) + [1])], -1).to(dt)]


def multiconv_attrs(attrs: dict, k: int) -> dict:
    """The ONNX Conv attributes of convolution ``k`` of a MultiConv node (its attributes are the
    per-convolution lists concatenated, ``<name>_lens`` giving each one's length)."""
    out = {}
    for name in ("strides", "pads", "dilations"):
        if name in attrs:
            lens = _ints(attrs.get(f"{name}_lens"))
            start = sum(lens[:k])
            out[name] = _ints(attrs[name])[start:start + lens[k]]
    return out


def _multi_conv_flops(i, o, a):
    return sum(2.0 * math.prod(o[k]) * math.prod(i[3 * k + 1][1:]) for k in range(len(o)))


@_gc("MultiConv", flops=_multi_conv_flops)
def multi_conv(inputs, attrs, opset):
    """PopART's ``MultiConv``: convolution ``k`` of inputs ``3k, 3k+1, 3k+2`` (data, weights,
    bias or None) as an ONNX Conv (group from the shapes). The session splits it into Conv ops."""
    conv = get_kernel("", "Conv").fn
    outs = []
    for k in range(int(attrs.get("num_convs", len(inputs) // 3))):
        x, w, b = inputs[3 * k], inputs[3 * k + 1], inputs[3 * k + 2]
        a = multiconv_attrs(attrs, k)
        a["group"] = x.shape[1] // w.shape[1]
        a["__num_outputs__"] = 1
        outs.append(conv([x, w] + ([b] if b is not None else []), a, 11)[0])
    return outs


# -- random ops: seeded like poprand (the same seed and modifier give the same mask on the host
# and in poprand's vertices, so a gradient regenerates its forward op's mask) -----------------
def seeded_keep_mask(seed: torch.Tensor, modifier: int, keep: float, shape) -> torch.Tensor:
    """Bernoulli(``keep``) mask of ``shape`` (float64 0/1) from a ``[2]`` seed and a modifier:
    ``poprand.bernoulli``'s stream (flattened element order)."""
    from openipu.poplibs.poprand import _draw, _generators
    n = math.prod(shape)
    (g,) = _generators(seed.reshape(1, 2).to(torch.int64), int(modifier) & 0xFFFFFFFF)
    return _draw("bernoulli", (float(keep),), n, g, None).reshape(list(shape))


def _dropout_apply(x, seed, attrs, mask_shape):
    ratio = float(attrs.get("ratio", 0.5))
    keep = 1.0 - ratio
    m = seeded_keep_mask(seed, int(attrs.get("seedModifier", 0)), keep, mask_shape)
    m = m.reshape([1] * (x.dim() - len(mask_shape)) + list(mask_shape))
    return (x * (m.to(x.dtype) * torch.tensor(1.0 / keep, dtype=x.dtype))).to(x.dtype), m


@_gc("Dropout", "DropoutGrad", flops=lambda i, o, a: 3.0 * math.prod(o[0]))
def seeded_dropout(inputs, attrs, opset):
    """Training dropout (PopART's DropoutOp after its RandomSetup): ``[x, seed [2] UINT32] ->
    [x * mask / (1 - ratio)(, mask BOOL)]``, the mask ~ Bernoulli(1 - ratio) from the seed and
    ``seedModifier``. ``DropoutGrad`` (``[gy, seed]``) applies the same mask to the gradient."""
    x, seed = inputs[0], inputs[1]
    y, m = _dropout_apply(x, seed, attrs, list(x.shape))
    out = [y]
    if int(attrs.get("__num_outputs__", 1)) > 1:
        out.append(m.to(torch.bool).reshape(x.shape))
    return out


@_gc("ShapedDropout", flops=lambda i, o, a: 3.0 * math.prod(o[0]))
def shaped_dropout(inputs, attrs, opset):
    """PopART's ``ShapedDropout``: ``[x]`` (inference: the identity) or ``[x, seed]`` (training:
    a Bernoulli(1 - ratio) mask of ``shape``, broadcast over x, scaled by ``1 / (1 - ratio)``)."""
    x = inputs[0]
    if len(inputs) < 2 or inputs[1] is None:
        return [x.clone()]
    shape = _ints(attrs.get("shape"))
    try:
        torch.broadcast_shapes(tuple(shape), tuple(x.shape))
    except RuntimeError:
        raise ValueError(f"ShapedDropout: shape {shape} does not broadcast to the input's {list(x.shape)}") from None
    return [_dropout_apply(x, inputs[1], attrs, shape)[0]]


@_gc("GetRandomSeed")
def get_random_seed(inputs, attrs, opset):
    """PopART's ``GetRandomSeed``: the next step's seed (the first word incremented, mod 2^32)."""
    s = inputs[0].to(torch.int64).reshape(2).clone()
    s[0] = (s[0] + 1) & 0xFFFFFFFF
    return [s.to(inputs[0].dtype)]
