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


def check_ctc_inputs(lp: torch.Tensor, tgt: torch.Tensor, il: torch.Tensor, tl: torch.Tensor, blank: int) -> None:
    """Refuse CTC inputs that torch's ``ctc_loss`` does not check itself before reading memory.

    ``lp`` [T, N, C] log-probabilities, ``tgt`` [N, S] labels, ``il`` / ``tl`` [N] input and
    target lengths. torch reads ``lp`` at each label of the first ``tl[n]`` of row ``n`` without
    a bounds check: a label outside [0, C) makes it read (or write, in the backward pass) outside
    the tensor, which crashes the process (SIGSEGV) or gives garbage. Also refused here, with
    one line naming the rule: ranks other than 3 / 2 / 1 / 1, an empty ``lp``, a batch that
    differs between the inputs, ``blank`` outside [0, C), lengths outside [0, T] / [0, S].
    A target longer than its input (``tl > il``) is valid: its loss is infinite (zero with
    ``zeroInfinity``). Raises ``ValueError`` (a ``popart_exception`` naming the op, through
    ``shapes.call_kernel``)."""
    if lp.dim() != 3 or tgt.dim() != 2 or il.dim() != 1 or tl.dim() != 1:
        raise ValueError(f"Ctc: expected log_probs [T, N, C], targets [N, S], input_lengths [N] and target_lengths "
                         f"[N], got shapes {list(lp.shape)}, {list(tgt.shape)}, {list(il.shape)}, {list(tl.shape)}")
    t, n, c = lp.shape
    if lp.numel() == 0:
        raise ValueError(f"Ctc: log_probs of shape {list(lp.shape)} is empty")
    if tgt.shape[0] != n or il.shape[0] != n or tl.shape[0] != n:
        raise ValueError(f"Ctc: the batch size N={n} of log_probs differs from targets {list(tgt.shape)}, "
                         f"input_lengths {list(il.shape)} or target_lengths {list(tl.shape)}")
    if not 0 <= blank < c:
        raise ValueError(f"Ctc: blank {blank} is outside the classes [0, {c})")
    s = tgt.shape[1]
    il64, tl64 = il.to(torch.int64), tl.to(torch.int64)
    if bool(((il64 < 0) | (il64 > t)).any()):
        raise ValueError(f"Ctc: input_lengths {il64.tolist()[:8]} must be in [0, {t}] (the time steps of log_probs)")
    if bool(((tl64 < 0) | (tl64 > s)).any()):
        raise ValueError(f"Ctc: target_lengths {tl64.tolist()[:8]} must be in [0, {s}] (the columns of targets)")
    used = torch.arange(s).unsqueeze(0) < tl64.unsqueeze(1)
    labels = tgt.to(torch.int64)[used]
    if labels.numel() and bool(((labels < 0) | (labels >= c)).any()):
        bad = labels[(labels < 0) | (labels >= c)][0].item()
        raise ValueError(f"Ctc: target label {bad} is outside the classes [0, {c}) of log_probs")


@_gc("Ctc", flops=_ctc_flops)
def ctc(inputs, attrs, opset):
    """PopART's ``Ctc`` (``aiGraphcore.ctcloss``): ``[log_probs [T, N, C], targets [N, S],
    input_lengths [N], target_lengths [N]] -> [loss, d(sum of per-sample losses)/d(log_probs)]``.

    The loss is ``torch.nn.functional.ctc_loss``'s (blank ``blank``, ``zeroInfinity``), reduced
    as PopART's ReductionType (Mean: each loss over its target length, then the batch mean), in
    ``outDataType`` (UNDEFINED: the log_probs' type). The second output ``[T, N, C]`` (log_probs'
    type) is what ``CtcGrad`` scales by the loss gradient (PopART computes both in one pass)."""
    lp, tgt, il, tl = inputs
    check_ctc_inputs(lp, tgt, il, tl, int(attrs.get("blank", 0)))
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


def scatter_index(src, index, axis: int, broadcast: bool, groups: int = 1):
    """``index`` as a tensor of ``src``'s shape: itself, or a 1-D index broadcast along ``axis``
    (grouped, ``groups > 1``: ``[G, L]``, one 1-D index per group along ``src``'s axis 0)."""
    idx = index.long()
    if idx.shape != src.shape:
        g = 1 if groups > 1 else 0
        if broadcast and idx.dim() == 1 + g and idx.shape[g] == src.shape[axis] and \
                (not g or idx.shape[0] == src.shape[0]):
            shape = [1] * src.dim()
            shape[axis] = -1
            if g:
                shape[0] = src.shape[0]
            idx = idx.reshape(shape).expand(src.shape)
        else:
            idx = idx.expand(src.shape)
    return idx


def scatter_reduce_setup(src_shape, attrs) -> int:
    """PopART's ScatterReduceOp checks (``axis_size``, ``group_size``, the axis range); returns
    the axis, non-negative. Grouped (``group_size > 1``): ``src`` is ``[group_size, ...]`` and
    the axis is not the group axis."""
    axis_size, groups = int(attrs["axis_size"]), int(attrs.get("group_size", 1))
    if axis_size < 1:
        raise ValueError(f"ScatterReduceOp axis_size = {axis_size} is not valid: must be > 0.")
    if groups < 1:
        raise ValueError(f"ScatterReduceOp group_size = {groups} is not valid: must be > 0.")
    r = len(src_shape)
    axis = int(attrs.get("axis", -1))
    if not -r <= axis <= r - 1:
        raise ValueError(f"ScatterReduceOp::setup axis = {axis} is outside the acceptable range [{-r}, {r - 1}]")
    axis %= r
    if groups > 1:
        if src_shape[0] != groups:
            raise ValueError(f"ScatterReduceOp: the grouped data's first dimension ({src_shape[0]}) must be "
                             f"group_size = {groups}")
        if axis == 0:
            raise ValueError("ScatterReduceOp: with group_size > 1 axis 0 is the group axis; scatter along an "
                             "axis >= 1")
    return axis


def scatter_reduce_fn(src, index, initial, attrs):
    """The ScatterReduce computation (differentiable in ``src`` and ``initial``)."""
    axis = scatter_reduce_setup(list(src.shape), attrs)
    shape = list(src.shape)
    shape[axis] = int(attrs["axis_size"])
    idx = scatter_index(src, index, axis, bool(attrs.get("enable_index_broadcast", 1)),
                        int(attrs.get("group_size", 1)))
    red = str(attrs.get("reduction", "sum"))
    red = {"0": "sum", "1": "max", "2": "min", "3": "mul", "4": "none"}.get(red, red)
    base = initial.to(src.dtype) if initial is not None else torch.zeros(shape, dtype=src.dtype)
    bad = (idx < 0) | (idx >= shape[axis])
    if bool(bad.any()):         # out-of-range rows are dropped (PopLibs' multiUpdate ignores them)
        extra = list(shape)
        extra[axis] = 1
        base = torch.cat([base, torch.zeros(extra, dtype=base.dtype)], axis)
        idx = torch.where(bad, torch.full_like(idx, shape[axis]), idx)
        out = base.scatter(axis, idx, src) if red == "none" else \
            base.scatter_reduce(axis, idx, src, reduce=SCATTER_REDUCE[red], include_self=initial is not None)
        return out.narrow(axis, 0, shape[axis])
    if red == "none":
        return base.scatter(axis, idx, src)
    return base.scatter_reduce(axis, idx, src, reduce=SCATTER_REDUCE[red], include_self=initial is not None)


@_gc("ScatterReduce", flops=lambda i, o, a: float(math.prod(i[0])))
def scatter_reduce(inputs, attrs, opset):
    """PopART's ``ScatterReduce``: ``[src, index(, initial)] -> out`` of ``src``'s shape with
    ``axis_size`` along ``axis``: ``out[.., i, ..] = reduce(src[index == i])`` (Sum, Max, Min,
    Mul; ``none`` scatters); rows nothing is scattered to are 0, or ``initial``'s. With
    ``group_size > 1`` (``aiGraphcore.groupedscatterreduce``) ``src`` / ``index`` are
    ``[group_size, ...]`` and each group scatters into its own slice of the output."""
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


def _seeded_draw(seed, attrs, kind, params, shape) -> torch.Tensor:
    """``shape`` numbers of poprand's ``kind`` stream for the seed and ``seedModifier`` (float64)."""
    from openipu.poplibs.poprand import _draw, _generators
    (g,) = _generators(seed.reshape(1, 2).to(torch.int64), int(attrs.get("seedModifier", 0)) & 0xFFFFFFFF)
    return _draw(kind, params, math.prod(shape), g, None).reshape(list(shape))


def _random_dtype(attrs, like=None):
    from openipu.popart.onnx_ops._common import torch_dtype
    if "dtype" in attrs:
        return torch_dtype(attrs["dtype"])
    return like.dtype if like is not None else torch.float32


@_gc("RandomNormal", "RandomNormalLike", flops=lambda i, o, a: 20.0 * math.prod(o[0]))
def seeded_random_normal(inputs, attrs, opset):
    """ONNX ``RandomNormal(Like)`` after RandomSetup: ``[(like,) seed [2] UINT32]`` -> normal
    numbers of ``shape`` (or ``like``'s) with ``mean`` and ``scale``, poprand's stream for the
    seed and ``seedModifier``."""
    like = inputs[0] if len(inputs) > 1 else None
    shape = list(like.shape) if like is not None else _ints(attrs["shape"])
    v = _seeded_draw(inputs[-1], attrs, "normal", (float(attrs.get("mean", 0.0)), float(attrs.get("scale", 1.0))),
                     shape)
    return [v.to(_random_dtype(attrs, like))]


@_gc("RandomUniform", "RandomUniformLike", flops=lambda i, o, a: 4.0 * math.prod(o[0]))
def seeded_random_uniform(inputs, attrs, opset):
    """ONNX ``RandomUniform(Like)`` after RandomSetup: ``[(like,) seed]`` -> U[``low``,
    ``high``) numbers, poprand's stream for the seed and ``seedModifier``."""
    like = inputs[0] if len(inputs) > 1 else None
    shape = list(like.shape) if like is not None else _ints(attrs["shape"])
    v = _seeded_draw(inputs[-1], attrs, "uniform", (float(attrs.get("low", 0.0)), float(attrs.get("high", 1.0))),
                     shape)
    return [v.to(_random_dtype(attrs, like))]


@_gc("Bernoulli", flops=lambda i, o, a: 4.0 * math.prod(o[0]))
def seeded_bernoulli(inputs, attrs, opset):
    """ONNX ``Bernoulli`` after RandomSetup: ``[p, seed]`` -> 1 with probability ``p`` (per
    element), else 0, from poprand's uniform stream for the seed and ``seedModifier``."""
    p = inputs[0]
    u = _seeded_draw(inputs[-1], attrs, "uniform", (0.0, 1.0), list(p.shape))
    return [(u < p.to(torch.float64)).to(_random_dtype(attrs, p))]


@_gc("GetRandomSeed")
def get_random_seed(inputs, attrs, opset):
    """PopART's ``GetRandomSeed``: the next step's seed (the first word incremented, mod 2^32)."""
    s = inputs[0].to(torch.int64).reshape(2).clone()
    s[0] = (s[0] + 1) & 0xFFFFFFFF
    return [s.to(inputs[0].dtype)]


# ----------------------------------------------------------------------------------------------
# BatchNormalization (PopART's ai.graphcore variant), LSTM (PopartLSTMOp), grouped ScatterReduce,
# ReplicatedReduceScatter, CtcBeamSearchDecoder, SplineBasis / SplineWeighting, PackedDataBlock.
# ``*_setup`` functions are the ops' ``setup()`` checks on shapes / types (the builder runs them
# on the inferred shapes, the kernels on their inputs); they raise ``ValueError`` with PopART's
# message.
# ----------------------------------------------------------------------------------------------
def pshape(shape) -> str:
    """A shape as PopART prints one (``[2 3 4]``)."""
    return "[" + " ".join(str(int(d)) for d in shape) + "]"


def batch_norm_setup(xs, params: dict, spatial: bool) -> None:
    """PopART's ``BatchNormOp::setup`` checks: ``x`` of rank >= 3, and each of ``params``
    (name -> shape: scale, B, mean, var) ``[C]`` (``spatial``) or ``x.shape[1:]``."""
    if len(xs) < 3:
        raise ValueError(f"batch norm requires X to have a rank >= 3.  x has rank {len(xs)}")
    want, what = ([xs[1]], "dimension 1") if spatial else (list(xs[1:]), "all but the first dimension")
    for name, s in params.items():
        if s is not None and list(s) != want:
            raise ValueError(f"expected shape of batch norm input tensor {name} ({pshape(s)}) to be {pshape(want)} "
                             f"to match {what} of X ({pshape(xs)})")


def _bn_flops(i, o, a):
    return 8.0 * math.prod(i[0])


@_gc("BatchNormalization", flops=_bn_flops)
def gc_batch_norm(inputs, attrs, opset):
    """PopART's ``ai.graphcore`` ``BatchNormalization`` (``aiGraphcore.batchnormalization``):
    ONNX BatchNormalization-9 whose batch variance is the unbiased one (PyTorch's running
    variance). ``[x, scale, B, mean, var]``; one output (inference: the given statistics) or
    five (training, PopART's rule ``outputs > 1``: the batch statistics normalise, and
    ``[y, running mean, running var, saved mean, saved var]`` with ``running = (1 - momentum) *
    batch + momentum * input``). The saved variance is PopART's: the biased batch variance's
    inverse standard deviation scaled by ``sqrt((n - 1) / n)`` and turned back into a variance,
    ``(var_b + eps) n / (n - 1) - eps`` (``n`` values per channel). ``spatial=0`` normalises each
    feature of ``x.shape[1:]`` separately."""
    x, scale, b, mean, var = inputs[:5]
    xs = list(x.shape)
    spatial = bool(attrs.get("spatial", 1))
    batch_norm_setup(xs, {"scale": scale.shape, "B": b.shape, "mean": mean.shape, "var": var.shape}, spatial)
    eps, m = float(attrs.get("epsilon", 1e-5)), float(attrs.get("momentum", 0.9))
    pshape_ = list(scale.shape)
    if not spatial:
        x = x.reshape(xs[0], -1, 1)
    c = x.shape[1]
    bshape = [1, c] + [1] * (x.dim() - 2)
    xf = x.float()
    sc, bi = scale.float().reshape(bshape), b.float().reshape(bshape)
    if int(attrs.get("__num_outputs__", 1)) <= 1:
        y = (xf - mean.float().reshape(bshape)) * torch.rsqrt(var.float().reshape(bshape) + eps) * sc + bi
        return [y.reshape(xs).to(x.dtype)]
    dims = [0] + list(range(2, x.dim()))
    bm = xf.mean(dims)
    bv = xf.var(dims, unbiased=False)
    inv = torch.rsqrt(bv + eps)
    y = (xf - bm.reshape(bshape)) * inv.reshape(bshape) * sc + bi
    n = x.numel() // max(c, 1)
    inv_u = inv * math.sqrt((n - 1) / n) if n else inv
    saved_var = 1.0 / (inv_u * inv_u) - eps
    run_mean = (1 - m) * bm + m * mean.float().reshape(-1)
    run_var = (1 - m) * saved_var + m * var.float().reshape(-1)
    outs = [y.reshape(xs).to(x.dtype), run_mean.reshape(pshape_).to(mean.dtype),
            run_var.reshape(pshape_).to(var.dtype), bm.reshape(pshape_).to(mean.dtype),
            saved_var.reshape(pshape_).to(var.dtype)]
    return outs[:int(attrs.get("__num_outputs__", 5))]


#: PopART's gate order of the packed LSTM weights (``[forget, input, candidate, output]``,
#: popnn's default ``BasicLstmCellUnit`` order) as indices of ONNX's ``[i, o, f, c]`` order
_POPART_GATE_OF_ONNX = (1, 3, 0, 2)


def lstm_setup(xs, ws, bs=None, init=None) -> None:
    """PopART's ``PopartLSTMOp::setup`` checks (its message, which prints the input index)."""
    if len(xs) != 3:
        raise ValueError(f"Bad input shape 0, should be [seq_length batch_size input_size], got {pshape(xs)}")
    if len(ws) != 3:
        raise ValueError(f"Bad weights shape 1, should be [4 input_size+hidden_size hidden_size], got {pshape(ws)}")
    t, n, i = xs
    h = ws[2]
    for name, idx, got, want in (("weights", 1, ws, [4, i + h, h]), ("bias", 2, bs, [4, h]),
                                 ("initialState", 3, init, [2, n, h])):
        if got is not None and list(got) != want:
            raise ValueError(f"Bad {name} shape {idx}, should be {pshape(want)}")


def _popart_lstm_flops(i, o, a):
    t, n, _ = i[0]
    return 2.0 * t * n * math.prod(i[1]) + 10.0 * t * n * i[1][2] * 4


@_gc("LSTM", flops=_popart_lstm_flops)
def popart_lstm(inputs, attrs, opset):
    """PopART's own LSTM (``PopartLSTMOp``, ``aiGraphcore.lstm``): ``[X [T, N, I], weights
    [4, I + H, H], (biases [4, H]), (initialState [2, N, H]: h then c), (seq_lens [N] INT32)] ->
    [Y, cell state [N, H]]``, ``Y`` ``[T, N, H]`` (``output_full_sequence``, default) or the last
    output ``[N, H]``. Gates in popnn's order forget, input, candidate, output; ``X_t @
    weights[g, :I] + h @ weights[g, I:] + biases[g]``; sigmoid gates, tanh candidate and cell
    output. Steps past a sequence length keep the state and output zeros (ONNX's rule). Runs as
    ONNX LSTM (:mod:`openipu.popart.onnx_ops.recurrent`) on the weights rearranged."""
    from openipu.popart.onnx_ops.recurrent import _run
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    init = inputs[3] if len(inputs) > 3 else None
    lens = inputs[4] if len(inputs) > 4 else None
    lstm_setup(list(x.shape), list(w.shape), None if b is None else list(b.shape),
               None if init is None else list(init.shape))
    n_in, h = x.shape[2], w.shape[2]
    wi, wr = w[:, :n_in, :], w[:, n_in:, :]                      # [4, I, H], [4, H, H]
    order = list(_POPART_GATE_OF_ONNX)
    w_onnx = wi[order].transpose(1, 2).reshape(1, 4 * h, n_in)
    r_onnx = wr[order].transpose(1, 2).reshape(1, 4 * h, h)
    bias = b[order].reshape(4 * h) if b is not None else torch.zeros(4 * h, dtype=x.dtype)
    b_onnx = torch.cat([bias, torch.zeros(4 * h, dtype=bias.dtype)]).reshape(1, 8 * h)
    h0 = init[0:1] if init is not None else None
    c0 = init[1:2] if init is not None else None
    y, yh, yc = _run("LSTM", [x, w_onnx, r_onnx, b_onnx, lens, h0, c0], {"hidden_size": h}, 7)
    out = y[:, 0] if int(attrs.get("output_full_sequence", 1)) else yh[0]
    return [out.contiguous(), yc[0].contiguous()]


@_gc("ReplicatedReduceScatter", flops=lambda i, o, a: float(math.prod(i[0])))
def replicated_reduce_scatter(inputs, attrs, opset):
    """PopART's ``ReplicatedReduceScatter``: the input flattened, reduced over the replicas
    (``op``: Add, Mean, Mul, Min, Max, LogicalAnd, LogicalOr, SquareAdd, Local) and cut into
    ``ceil(n / replicas)``-element pieces, zero-padded, one per replica: ``[ceil(n / replicas)]``.
    ``attrs["__replicas__"]`` is the replication factor (the IR's; 1 by default). One replica:
    the flattened input. On several replicas the session lowers it to ``gcl``'s
    reduce-scatter; this host kernel, which sees one replica's input, gives replica 0's piece
    as if every replica held that input (it serves shape inference)."""
    x = inputs[0].reshape(-1)
    r = max(int(attrs.get("__replicas__", 1)), 1)
    op = str(attrs.get("op", "Add"))
    k = -(-x.numel() // r)
    xw = x if x.is_floating_point() else x.to(torch.int64)
    red = {"Add": xw * r, "Mul": xw ** r, "SquareAdd": xw * xw * r}.get(op, xw) if r > 1 else \
        (xw * xw if op == "SquareAdd" else xw)
    out = torch.zeros(r * k, dtype=red.dtype)
    out[:x.numel()] = red
    return [out[:k].to(x.dtype)]


def ctc_beam_search_setup(lp_shape, lp_type: str, len_shape, len_type: str, name: str) -> None:
    """PopART's ``CtcBeamSearchDecoderOp::setup`` checks (``name``: the op as PopART prints it)."""
    if len(lp_shape) != 3:
        raise ValueError(f"Unsupported shape for input 0 of Op {name} (expected a 'logarithmized probabilities' "
                         f"tensor of rank 3, got a tensor with shape {pshape(lp_shape)}).")
    if lp_type not in ("FLOAT", "FLOAT16"):
        raise ValueError(f"Unsupported data type for input 0 of Op {name} (expected a 'logarithmized probabilities' "
                         f"tensor comprised of floating point data, got {lp_type}).")
    if list(len_shape) != [lp_shape[1]]:
        raise ValueError(f"Unsupported shape for input 1 of Op {name} (expected a 'data lengths' tensor of shape "
                         f"{pshape([lp_shape[1]])}, got {pshape(len_shape)}).")
    if len_type != "UINT32":
        raise ValueError(f"Unsupported data type for input 1 of Op {name} (expected a 'input lengths' tensor of "
                         f"type UINT32, got {len_type}).")


def _lse(a, b):
    """``log(exp(a) + exp(b))`` elementwise, ``-inf`` where both are."""
    m = torch.maximum(a, b)
    ms = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return ms + torch.log(torch.exp(a - ms) + torch.exp(b - ms))


def _scatter_lse(vals, group, n_groups):
    """Per row, ``logsumexp`` of ``vals`` over the entries of each ``group`` id (``[B, K]``)."""
    b = vals.shape[0]
    m = torch.full((b, n_groups), -math.inf, dtype=vals.dtype).scatter_reduce(1, group, vals, "amax")
    ms = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    s = torch.zeros((b, n_groups), dtype=vals.dtype).scatter_add(1, group, torch.exp(vals - ms.gather(1, group)))
    return ms + torch.log(s)


_HASH_P = (1_000_003, 998_244_353)
_HASH_M = 2_147_483_647


def ctc_prefix_beam_search(lp, lengths, blank: int, beam_width: int, top_paths: int):
    """CTC prefix beam search (popnn's ``beamSearchDecoderLogProbabilities``; the algorithm of
    Hannun et al., "distill.pub/2017/ctc"), vectorised over the batch and the beams.

    ``lp`` ``[T, B, C]`` log-probabilities, ``lengths`` ``[B]`` (steps used per batch entry).
    Each step, every beam either stays (a blank, or its last label repeated) or is extended by a
    non-blank class; candidates with equal prefixes merge (``logsumexp`` of their blank / non-blank
    probabilities; prefixes are compared by two 31-bit polynomial hashes of their labels), and
    the ``beam_width`` most probable survive. Returns ``(log probs [B, P], lengths [B, P],
    labels [B, P, T])`` for the ``top_paths`` best prefixes, labels zero-padded."""
    t_max, b, c = lp.shape
    w = beam_width
    lp = lp.float()
    ninf = -math.inf
    labels = torch.zeros(b, w, t_max, dtype=torch.int64)
    plen = torch.zeros(b, w, dtype=torch.int64)
    pb = torch.full((b, w), ninf)
    pb[:, 0] = 0.0
    pnb = torch.full((b, w), ninf)
    keys = torch.zeros(b, w, 2, dtype=torch.int64)
    lengths = lengths.reshape(-1).to(torch.int64)
    classes = torch.arange(c)
    p = torch.tensor(_HASH_P, dtype=torch.int64)
    for t in range(t_max):
        step = lp[t]                                                   # [B, C]
        last = labels.gather(2, (plen - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)   # [B, W]
        has_last = plen > 0
        tot = _lse(pb, pnb)
        # stay: the prefix unchanged
        stay_pb = tot + step[:, blank].unsqueeze(1)
        stay_pnb = torch.where(has_last, pnb + step.gather(1, last), torch.full_like(pnb, ninf))
        # extend by class k (not blank)
        same = has_last.unsqueeze(-1) & (last.unsqueeze(-1) == classes)           # [B, W, C]
        ext_pnb = torch.where(same, pb.unsqueeze(-1), tot.unsqueeze(-1)) + step.unsqueeze(1)
        ext_pnb[:, :, blank] = ninf
        ext_keys = (keys.unsqueeze(2) * p + classes.reshape(1, 1, c, 1) + 1) % _HASH_M   # [B, W, C, 2]
        # candidates: [B, W, 1 + C], slot 0 stays, slot 1 + k extends by k
        cand_pb = torch.cat([stay_pb.unsqueeze(-1), torch.full((b, w, c), ninf)], -1).reshape(b, -1)
        cand_pnb = torch.cat([stay_pnb.unsqueeze(-1), ext_pnb], -1).reshape(b, -1)
        cand_keys = torch.cat([keys.unsqueeze(2), ext_keys], 2).reshape(b, -1, 2)
        key1 = cand_keys[..., 0] * _HASH_M + cand_keys[..., 1]            # < 2^62: exact in int64
        order = torch.argsort(key1, dim=1, stable=True)
        sk = key1.gather(1, order)
        new_group = torch.ones_like(sk, dtype=torch.bool)
        new_group[:, 1:] = sk[:, 1:] != sk[:, :-1]
        gid_sorted = torch.cumsum(new_group.to(torch.int64), 1) - 1
        group = torch.empty_like(gid_sorted).scatter_(1, order, gid_sorted)
        k = key1.shape[1]
        g_pb = _scatter_lse(cand_pb, group, k)
        g_pnb = _scatter_lse(cand_pnb, group, k)
        n_groups = new_group.sum(1, keepdim=True)
        score = _lse(g_pb, g_pnb)
        score = torch.where(torch.arange(k) < n_groups, score, torch.full_like(score, ninf))
        # each group's first candidate (in candidate order) represents it
        rep = torch.full((b, k), k, dtype=torch.int64).scatter_reduce(1, group, torch.arange(k).expand(b, k), "amin")
        top = torch.topk(score, w, dim=1)
        sel = top.indices                                               # [B, W] group ids
        cand = rep.gather(1, sel).clamp(max=k - 1)
        parent, slot = cand // (c + 1), cand % (c + 1)
        valid = torch.isfinite(top.values)
        n_pb = torch.where(valid, g_pb.gather(1, sel), torch.full_like(top.values, ninf))
        n_pnb = torch.where(valid, g_pnb.gather(1, sel), torch.full_like(top.values, ninf))
        n_labels = labels.gather(1, parent.unsqueeze(-1).expand(b, w, t_max)).clone()
        n_len = plen.gather(1, parent)
        extend = slot > 0
        pos = n_len.clamp(max=t_max - 1)
        n_labels.scatter_(2, pos.unsqueeze(-1), torch.where(extend, slot - 1, n_labels.gather(2, pos.unsqueeze(-1))
                                                            .squeeze(-1)).unsqueeze(-1))
        n_len = n_len + extend.to(torch.int64)
        n_keys = cand_keys.gather(1, cand.unsqueeze(-1).expand(b, w, 2))
        active = (t < lengths).reshape(b, 1)
        pb = torch.where(active, n_pb, pb)
        pnb = torch.where(active, n_pnb, pnb)
        labels = torch.where(active.unsqueeze(-1), n_labels, labels)
        plen = torch.where(active, n_len, plen)
        keys = torch.where(active.unsqueeze(-1), n_keys, keys)
    score = _lse(pb, pnb)
    order = torch.argsort(score, dim=1, descending=True, stable=True)[:, :top_paths]
    out_len = plen.gather(1, order)
    out_labels = labels.gather(1, order.unsqueeze(-1).expand(b, top_paths, t_max))
    out_labels = torch.where(torch.arange(t_max) < out_len.unsqueeze(-1), out_labels, torch.zeros_like(out_labels))
    return score.gather(1, order), out_len, out_labels


def _ctc_beam_flops(i, o, a):
    t, n, c = i[0] if len(i[0]) == 3 else (1, 1, 1)
    return 12.0 * t * n * c * int(a.get("beam_width", 100))


@_gc("CtcBeamSearchDecoder", flops=_ctc_beam_flops)
def ctc_beam_search_decoder(inputs, attrs, opset):
    """PopART's ``CtcBeamSearchDecoder`` (``aiGraphcore.ctcbeamsearchdecoder``): ``[logProbs [T,
    N, C] float, dataLengths [N] UINT32] -> [labelProbs [N, P] (logProbs' type), labelLengths
    [N, P] UINT32, decodedLabels [N, P, T] UINT32]``, the ``top_paths`` (P) best label sequences
    of a prefix beam search of ``beam_width`` beams (:func:`ctc_prefix_beam_search`) over each
    entry's first ``dataLengths[n]`` steps, most probable first; labels past a path's length
    are 0."""
    lp, lengths = inputs
    if lp.dim() != 3:
        raise ValueError(f"CtcBeamSearchDecoder: logProbs must be [maxTime, batchSize, numClasses], got "
                         f"{pshape(lp.shape)}")
    blank, width, paths = int(attrs.get("blank", 0)), int(attrs.get("beam_width", 100)), int(attrs.get("top_paths", 1))
    probs, lens, labels = ctc_prefix_beam_search(lp, lengths.to(torch.int64), blank, width, paths)
    return [probs.to(lp.dtype), lens.to(torch.uint32), labels.to(torch.uint32)]


def spline_basis_setup(pseudo_shape, ks_shape, open_shape) -> None:
    """PopART's ``SplineBasisOp::setup`` checks."""
    if len(pseudo_shape) != 2:
        raise ValueError(f"SplineBasisOp::setup: pseudo tensor is not a 2-D tensor. Pseudo tensor rank = "
                         f"{len(pseudo_shape)}.")
    if len(ks_shape) != 1:
        raise ValueError(f"SplineBasisOp::setup: kernelSize tensor is not a 1-D tensor. KernelSize tensor rank = "
                         f"{len(ks_shape)}.")
    if len(open_shape) != 1:
        raise ValueError(f"SplineBasisOp::setup: isOpenSpline tensor is not a 1-D tensor. isOpenSpline tensor rank "
                         f"= {len(open_shape)}.")


def _spline_basis_1d(v, degree: int):
    """The ``degree + 1`` B-spline basis values at fractional positions ``v`` (``[..., degree + 1]``,
    popops / torch_spline_conv's ``Basis::forward`` for ``kMod = 0 .. degree``)."""
    if degree == 1:
        parts = [1 - v, v]
    elif degree == 2:
        parts = [0.5 * v * v - v + 0.5, -v * v + v + 0.5, 0.5 * v * v]
    else:
        parts = [(1 - v) ** 3 / 6, (3 * v ** 3 - 6 * v * v + 4) / 6, (-3 * v ** 3 + 3 * v * v + 3 * v + 1) / 6,
                 v ** 3 / 6]
    return torch.stack(parts, -1)


def _spline_basis_flops(i, o, a):
    return 6.0 * math.prod(o[0]) * max(i[0][-1] if i[0] else 1, 1)


@_gc("SplineBasis", flops=_spline_basis_flops)
def spline_basis(inputs, attrs, opset):
    """PopART's ``SplineBasis`` (``popops::splineBasis``, PyTorch Geometric's ``spline_basis``):
    ``[pseudo [E, D] float, kernel_size [D] INT32, is_open_spline [D] UINT8] -> [basis [E, S],
    weight_index [E, S] INT32]``, ``S = (degree + 1)^D``. Spline ``s`` has digits ``k_d`` (base
    ``degree + 1``, dimension 0 least significant); with ``v = pseudo[e, d] * (kernel_size[d] -
    degree * is_open_spline[d])``, ``basis = prod_d B_{k_d}(v - floor(v))`` and ``weight_index =
    sum_d ((floor(v) + k_d) mod kernel_size[d]) * prod(kernel_size[:d])``. ``degree`` 1, 2 or 3
    (PopART accepts 0, which popops rejects)."""
    pseudo, ks, is_open = inputs
    spline_basis_setup(list(pseudo.shape), list(ks.shape), list(is_open.shape))
    degree = int(attrs.get("degree", 1))
    if degree not in (1, 2, 3):
        raise ValueError("Degree must be 1, 2 or 3")
    e, d = pseudo.shape
    ksl = ks.to(torch.int64)
    n_s = (degree + 1) ** d
    digits = (torch.arange(n_s).unsqueeze(-1) // (degree + 1) ** torch.arange(d)) % (degree + 1)   # [S, D]
    v = pseudo.float() * (ksl - degree * is_open.to(torch.int64)).float()                           # [E, D]
    fl = torch.floor(v)
    offsets = torch.cumprod(torch.cat([torch.ones(1, dtype=torch.int64), ksl[:-1]]), 0)           # [D]
    wi = (((fl.to(torch.int64).unsqueeze(1) + digits) % ksl.clamp(min=1)) * offsets).sum(-1)       # [E, S]
    per_dim = _spline_basis_1d(v - fl, degree)                                                       # [E, D, deg+1]
    picked = per_dim.unsqueeze(1).expand(e, n_s, d, degree + 1).gather(3, digits.expand(e, n_s, d).unsqueeze(-1))
    basis = picked.squeeze(-1).prod(-1)
    return [basis.to(pseudo.dtype), wi.to(torch.int32)]


def spline_weighting_setup(in_shape, w_shape, b_shape, wi_shape, in_type: str, w_type: str, b_type: str) -> None:
    """PopART's ``SplineWeightingOp::setup`` checks."""
    for what, s, r in (("input", in_shape, 2), ("weight", w_shape, 3), ("basis", b_shape, 2),
                       ("weightIndex", wi_shape, 2)):
        if len(s) != r:
            big = what[0].upper() + what[1:] if what != "weightIndex" else what
            raise ValueError(f"SplineWeightingOp::setup: {what} tensor is not a {r}-D tensor. {big} tensor rank = "
                             f"{len(s)}.")
    for what, t in (("weight", w_type), ("basis", b_type)):
        if t != in_type:
            raise ValueError(f"SplineWeightingOp::setup: The input and {what} tensors have different data types. "
                             f"The input tensor data type = {in_type.lower()}. The {what} tensor data type = "
                             f"{t.lower()}.")


def _spline_weighting_flops(i, o, a):
    return 2.0 * math.prod(i[2]) * i[1][1] * i[1][2] if len(i[1]) == 3 else 0.0


@_gc("SplineWeighting", flops=_spline_weighting_flops)
def spline_weighting(inputs, attrs, opset):
    """PopART's ``SplineWeighting`` (``popops::splineWeighting``, PyTorch Geometric's
    ``spline_weighting``): ``[input [E, Cin], weight [K, Cin, Cout], basis [E, S], weight_index
    [E, S] INT32] -> [E, Cout]``, ``out[e] = sum_s basis[e, s] * input[e] @ weight[weight_index[e,
    s]]``; one batched product per spline."""
    x, w, basis, wi = inputs
    from openipu.popart.shapes import NAME_OF_TORCH
    names = [NAME_OF_TORCH.get(t.dtype, str(t.dtype)) for t in (x, w, basis)]
    spline_weighting_setup(list(x.shape), list(w.shape), list(basis.shape), list(wi.shape), *names)
    xf, wf, bf = x.float(), w.float(), basis.float()
    idx = wi.to(torch.int64)
    out = torch.zeros(x.shape[0], w.shape[2])
    for s in range(basis.shape[1]):
        out = out + bf[:, s:s + 1] * torch.bmm(xf.unsqueeze(1), wf[idx[:, s]]).squeeze(1)
    return [out.to(x.dtype)]


def _packed_flops(i, o, a):
    return 4.0 * sum(math.prod(s) for s in i)


@_gc("PackedDataBlock", flops=_packed_flops)
def packed_data_block(inputs, attrs, opset):
    """PopART's ``PackedDataBlock`` (``aiGraphcore.packedDataBlock``): ``[data_0, offsets_0,
    lengths_0, ..., data_N, offsets_N, lengths_N, resultOffsets, resultLengths]``. Sequence ``j``
    of data input ``i`` is ``data_i[offsets_i[j] : + lengths_i[j]]``, zero-padded to
    ``maxSequenceLengths[i]``; the ``callback`` graph runs on ``callbackBatchSize`` sequences of
    each input at a time (inputs ``[callbackBatchSize, maxSequenceLengths[i], ...]``), and row
    ``k < resultLengths[j]`` of its output for sequence ``j`` goes to row ``resultOffsets[j] +
    k`` of the result, ``[resultSize, *out.shape[2:]]``, zeros elsewhere."""
    from openipu.popart.onnx_ops.control_flow import _ctx, _run_body
    opsets, outer = _ctx(attrs, opset)
    callback = attrs["callback"]
    max_lens = _ints(attrs.get("maxSequenceLengths"))
    size, cbs = int(attrs["resultSize"]), int(attrs.get("callbackBatchSize", 1))
    n_data = (len(inputs) - 2) // 3
    if len(inputs) < 5 or (len(inputs) - 2) % 3 or len(max_lens) != n_data:
        raise ValueError(f"PackedDataBlock: {len(inputs)} inputs and {len(max_lens)} maxSequenceLengths; it takes "
                         "3 inputs (data, offsets, lengths) per maxSequenceLength, then resultOffsets and "
                         "resultLengths")
    unpacked = []
    for i in range(n_data):
        data, off, ln = inputs[3 * i], inputs[3 * i + 1].to(torch.int64), inputs[3 * i + 2].to(torch.int64)
        steps = torch.arange(max_lens[i])
        rows = off.reshape(-1, 1) + steps
        keep = (steps < ln.reshape(-1, 1)) & (rows < data.shape[0])
        seq = data[torch.where(keep, rows, torch.zeros_like(rows))]
        mask = keep.reshape(list(keep.shape) + [1] * (data.dim() - 1))
        unpacked.append(torch.where(mask, seq, torch.zeros((), dtype=data.dtype)))
    n_seq = unpacked[0].shape[0]
    results = [_run_body(callback, [u[k * cbs:(k + 1) * cbs] for u in unpacked], opsets, outer)[0]
               for k in range(n_seq // cbs)]
    r = torch.cat(results) if results else torch.zeros([0, 0])
    out = torch.zeros([size] + list(r.shape[2:]), dtype=r.dtype)
    r_off, r_len = inputs[-2].to(torch.int64).reshape(-1)[:r.shape[0]], inputs[-1].to(torch.int64).reshape(-1)
    steps = torch.arange(r.shape[1] if r.dim() > 1 else 0)
    dst = r_off.reshape(-1, 1) + steps
    keep = (steps < r_len[:r.shape[0]].reshape(-1, 1)) & (dst < size)
    out[dst[keep]] = r[keep]
    return [out]
