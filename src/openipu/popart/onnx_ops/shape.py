"""Shape and tensor-manipulation ONNX operators: Reshape, Flatten, (Un)Squeeze, Transpose, Concat,
Split, Slice, Gather*, Scatter*, Expand, Tile, Pad, Shape, Size, Identity, Constant*, Range, OneHot,
NonZero, TopK, DepthToSpace, SpaceToDepth, ReverseSequence, Trilu, EyeLike, Compress, Unique,
CenterCropPad."""

from __future__ import annotations

import math

import numpy as np
import torch

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import (
    ints,
    narrow,
    norm_axes,
    norm_axis,
    numel,
    opt,
    scalar,
    torch_dtype,
    widen,
)


def _idx(i: torch.Tensor, dim: int) -> torch.Tensor:
    """Indices with negative values counted from the end, as int64."""
    i = i.to(torch.int64)
    return torch.where(i < 0, i + dim, i)


@onnx_op("Identity")
def identity(inputs, attrs, opset):
    x = inputs[0]
    if isinstance(x, list):
        return [list(x)]
    return [x]


@onnx_op("Reshape")
def reshape(inputs, attrs, opset):
    x = inputs[0]
    shape = ints(attrs.get("shape")) if opset < 5 else ints(inputs[1])
    allowzero = attrs.get("allowzero", 0)
    out = []
    for i, s in enumerate(shape):
        if s == 0 and not allowzero:
            if i >= x.dim():
                raise OnnxKernelError(f"Reshape: 0 at position {i} has no input dimension to copy")
            out.append(x.shape[i])
        else:
            out.append(s)
    if out.count(-1) > 1:
        raise OnnxKernelError("Reshape: at most one -1 in the shape")
    return [x.reshape(out)]


@onnx_op("Flatten")
def flatten(inputs, attrs, opset):
    x = inputs[0]
    axis = attrs.get("axis", 1)
    if axis < 0:
        axis += x.dim()
    return [x.reshape(numel(x.shape[:axis]), numel(x.shape[axis:]))]


@onnx_op("Squeeze")
def squeeze(inputs, attrs, opset):
    x = inputs[0]
    axes = attrs.get("axes") if opset < 13 else (ints(inputs[1]) if opset_input(inputs, 1) else None)
    if axes is None:
        return [x.reshape([d for d in x.shape if d != 1])]
    axes = set(norm_axes(axes, x.dim(), "Squeeze"))
    for a in axes:
        if x.shape[a] != 1:
            raise OnnxKernelError(f"Squeeze: dimension {a} has size {x.shape[a]}, not 1")
    return [x.reshape([d for i, d in enumerate(x.shape) if i not in axes])]


def opset_input(inputs, i) -> bool:
    return len(inputs) > i and inputs[i] is not None


@onnx_op("Unsqueeze")
def unsqueeze(inputs, attrs, opset):
    x = inputs[0]
    axes = attrs.get("axes") if opset < 13 else ints(inputs[1])
    rank = x.dim() + len(axes)
    axes = sorted(norm_axes(axes, rank, "Unsqueeze"))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [x.reshape(shape)]


def transpose_view(x: torch.Tensor, attrs) -> torch.Tensor:
    """``x`` permuted by ``perm`` (default: the dims reversed), as a view of ``x`` (no copy)."""
    perm = attrs.get("perm") or list(range(x.dim()))[::-1]
    return x.permute(*perm)


@onnx_op("Transpose")
def transpose(inputs, attrs, opset):
    return [transpose_view(inputs[0], attrs).contiguous()]


@onnx_op("Concat")
def concat(inputs, attrs, opset):
    xs = [t for t in inputs if t is not None]
    axis = norm_axis(attrs.get("axis", 1 if opset < 4 else 0), xs[0].dim(), "Concat")
    return [torch.cat(xs, axis)]


@onnx_op("Split")
def split(inputs, attrs, opset):
    x = inputs[0]
    axis = norm_axis(attrs.get("axis", 0), x.dim(), "Split")
    dim = x.shape[axis]
    if opset < 13:
        sizes = attrs.get("split") or (ints(inputs[1]) if opset_input(inputs, 1) else None)
    else:
        sizes = ints(inputs[1]) if opset_input(inputs, 1) else None
    if not sizes:
        n = attrs.get("num_outputs") or attrs.get("__num_outputs__")
        if not n:
            raise OnnxKernelError("Split: needs 'split', 'num_outputs' or the node's output count "
                                  "(attrs['__num_outputs__'])")
        if opset >= 18 and attrs.get("num_outputs"):
            chunk = -(-dim // n)
            sizes = [min(chunk, dim - i * chunk) for i in range(n)]
        else:
            if dim % n:
                raise OnnxKernelError(f"Split: dimension {dim} does not split into {n} equal parts")
            sizes = [dim // n] * n
    if sum(sizes) != dim:
        raise OnnxKernelError(f"Split: sizes {sizes} do not add up to dimension {dim}")
    return [t.clone() for t in torch.split(x, sizes, axis)]


def _slice_axis(x, axis, start, end, step):
    dim = x.shape[axis]
    if step == 0:
        raise OnnxKernelError("Slice: steps must not be 0")
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    if step == 1:
        return x.narrow(axis, start, max(end - start, 0))
    idx = torch.arange(start, end, step, dtype=torch.int64, device=x.device)
    return x.index_select(axis, idx)


@onnx_op("Slice")
def slice_(inputs, attrs, opset):
    x = inputs[0]
    if opset < 10:
        starts, ends = attrs["starts"], attrs["ends"]
        axes, steps = attrs.get("axes"), None
    else:
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes = ints(inputs[3]) if opset_input(inputs, 3) else None
        steps = ints(inputs[4]) if opset_input(inputs, 4) else None
    axes = norm_axes(axes if axes is not None else range(len(starts)), x.dim(), "Slice")
    steps = steps or [1] * len(starts)
    for a, s, e, st in zip(axes, starts, ends, steps):
        x = _slice_axis(x, a, s, e, st)
    return [x.clone()]


@onnx_op("Gather")
def gather(inputs, attrs, opset):
    """ONNX Gather as the device runs it (``popops::multiSlice``): an index outside
    ``[-n, n)`` raises nothing and gives a slice of zeros, as PopLibs returns for its padding
    index (``n``, which PopTorch Geometric's padding edges use when a batch has no padding node
    left) and for offsets past the table."""
    x, i = inputs
    axis = norm_axis(attrs.get("axis", 0), x.dim(), "Gather")
    n = x.shape[axis]
    idx = _idx(i, n).reshape(-1)
    valid = (idx >= 0) & (idx < n)
    if bool(valid.all()) or n == 0:
        out = x.index_select(axis, idx)
    else:
        out = x.index_select(axis, torch.where(valid, idx, 0))
        keep = valid.reshape([1] * axis + [-1] + [1] * (x.dim() - axis - 1))
        out = torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return [out.reshape(x.shape[:axis] + i.shape + x.shape[axis + 1:])]


@onnx_op("GatherElements")
def gather_elements(inputs, attrs, opset):
    x, i = inputs
    axis = norm_axis(attrs.get("axis", 0), x.dim(), "GatherElements")
    return [torch.gather(x, axis, _idx(i, x.shape[axis]))]


@onnx_op("GatherND")
def gather_nd(inputs, attrs, opset):
    x, i = inputs
    b = attrs.get("batch_dims", 0)
    k = i.shape[-1]
    bshape = x.shape[:b]
    nb = numel(bshape)
    xb = x.reshape((nb,) + x.shape[b:])
    ib = i.reshape(nb, -1, k).to(torch.int64)
    dims = torch.tensor(x.shape[b:b + k], dtype=torch.int64, device=x.device)
    ib = torch.where(ib < 0, ib + dims, ib)
    sel = (torch.arange(nb, device=x.device)[:, None],) + tuple(ib[..., j] for j in range(k))
    out = xb[sel]
    return [out.reshape(i.shape[:-1] + x.shape[b + k:])]


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@onnx_op("ScatterND")
def scatter_nd(inputs, attrs, opset):
    x, i, u = inputs
    red = attrs.get("reduction", "none")
    k = i.shape[-1]
    lead = numel(x.shape[:k])
    out = x.clone().reshape((lead,) + x.shape[k:])
    idx = i.reshape(-1, k).to(torch.int64)
    dims = torch.tensor(x.shape[:k], dtype=torch.int64, device=x.device)
    idx = torch.where(idx < 0, idx + dims, idx)
    strides = torch.tensor([numel(x.shape[j + 1:k]) for j in range(k)], dtype=torch.int64, device=x.device)
    lin = (idx * strides).sum(-1)
    upd = u.reshape((lin.numel(),) + x.shape[k:])
    if red == "none":
        out[lin] = upd
    else:
        ow, uw = widen(out), widen(upd)
        index = lin.reshape((-1,) + (1,) * (ow.dim() - 1)).expand(uw.shape)
        out = narrow(ow.scatter_reduce(0, index, uw, _REDUCE[red], include_self=True), x.dtype)
    return [out.reshape(x.shape)]


@onnx_op("ScatterElements", "Scatter")
def scatter_elements(inputs, attrs, opset):
    x, i, u = inputs
    axis = norm_axis(attrs.get("axis", 0), x.dim(), "ScatterElements")
    idx = _idx(i, x.shape[axis])
    red = attrs.get("reduction", "none")
    if red == "none":
        return [x.scatter(axis, idx, u)]
    xw = widen(x)
    return [narrow(xw.scatter_reduce(axis, idx, widen(u), _REDUCE[red], include_self=True),
                   x.dtype)]


@onnx_op("Expand")
def expand(inputs, attrs, opset):
    x = inputs[0]
    # numpy's broadcast rule is ONNX's; torch.broadcast_shapes would import sympy (~2 s) on
    # its first call, which the compile of any model with an Expand paid
    try:
        shape = np.broadcast_shapes(tuple(x.shape), tuple(ints(inputs[1])))
    except ValueError as e:
        raise OnnxKernelError(f"Expand: shape {list(ints(inputs[1]))} cannot be broadcast with the input's "
                           f"{list(x.shape)}") from e
    return [x.expand(shape).clone()]


@onnx_op("Tile")
def tile(inputs, attrs, opset):
    x = inputs[0]
    if opset < 6:
        reps = [1] * x.dim()
        reps[int(scalar(inputs[2]))] = int(scalar(inputs[1]))
    else:
        reps = ints(inputs[1])
    return [x.repeat(*reps) if reps else x.clone()]


def _pad_index(n, before, after, mode, device):
    """Source index per output position along an axis of size n (-1: constant fill), on ``device``."""
    pos = torch.arange(-before, n + after, dtype=torch.int64, device=device)
    if mode == "constant":
        return torch.where((pos >= 0) & (pos < n), pos, torch.full_like(pos, -1))
    if mode == "edge":
        return pos.clamp(0, n - 1)
    if mode == "wrap":
        return torch.remainder(pos, n)
    if mode == "reflect":
        if n == 1:
            return torch.zeros_like(pos)
        period = 2 * (n - 1)
        p = torch.remainder(pos, period)
        return torch.where(p < n, p, period - p)
    raise OnnxKernelError(f"Pad: unknown mode {mode!r}")


@onnx_op("Pad")
def pad(inputs, attrs, opset):
    x = inputs[0]
    mode = attrs.get("mode", "constant")
    r = x.dim()
    if opset < 11:
        pads = attrs.get("pads", attrs.get("paddings"))
        value = attrs.get("value", 0.0)
        axes = list(range(r))
    else:
        pads = ints(inputs[1])
        value = scalar(opt(inputs, 2), 0)
        axes = norm_axes(ints(inputs[3]), r, "Pad") if opset_input(inputs, 3) else list(range(r))
    n = len(axes)
    if len(pads) != 2 * n:
        raise OnnxKernelError(f"Pad: {len(pads)} pads for {n} axes (need 2 per axis)")
    out = x
    mask = None
    for j, a in enumerate(axes):
        b, e = pads[j], pads[n + j]
        if b == 0 and e == 0:
            continue
        idx = _pad_index(out.shape[a], b, e, mode, x.device)
        if mode == "constant":
            valid = idx >= 0
            out = out.index_select(a, idx.clamp(min=0))
            shape = [1] * r
            shape[a] = idx.numel()
            vm = valid.reshape(shape)
            mask = vm if mask is None else (mask & vm)
        else:
            out = out.index_select(a, idx)
    if mask is not None:
        fill = torch.tensor(value, device=out.device).to(out.dtype)
        out = torch.where(mask, out, fill)
    return [out.contiguous()]


@onnx_op("Shape")
def shape(inputs, attrs, opset):
    s = list(inputs[0].shape)
    r = len(s)
    start = attrs.get("start", 0)
    end = attrs.get("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return [torch.tensor(s[start:end], dtype=torch.int64, device=inputs[0].device)]


@onnx_op("Size")
def size(inputs, attrs, opset):
    return [torch.tensor(inputs[0].numel(), dtype=torch.int64, device=inputs[0].device)]


@onnx_op("Constant")
def constant(inputs, attrs, opset):
    # no input to follow: CPU tensors, which the IR executor moves to its device
    if "value" in attrs:
        return [attrs["value"].clone()]
    if "sparse_value" in attrs:
        return [attrs["sparse_value"].clone()]
    if "value_float" in attrs:
        return [torch.tensor(attrs["value_float"], dtype=torch.float32, device="cpu")]
    if "value_floats" in attrs:
        return [torch.tensor(attrs["value_floats"], dtype=torch.float32, device="cpu")]
    if "value_int" in attrs:
        return [torch.tensor(attrs["value_int"], dtype=torch.int64, device="cpu")]
    if "value_ints" in attrs:
        return [torch.tensor(attrs["value_ints"], dtype=torch.int64, device="cpu")]
    raise OnnxKernelError("Constant: needs a numeric value attribute (strings are not supported)")


@onnx_op("ConstantOfShape")
def constant_of_shape(inputs, attrs, opset):
    v = attrs.get("value")
    shape = ints(inputs[0])
    if v is None:
        return [torch.zeros(shape, dtype=torch.float32, device=inputs[0].device)]
    return [v.reshape(-1)[:1].reshape([]).expand(shape).clone().to(inputs[0].device)]


@onnx_op("Range")
def range_(inputs, attrs, opset):
    start, limit, delta = inputs
    s, l, d = scalar(start), scalar(limit), scalar(delta)
    n = max(int(math.ceil((l - s) / d)), 0)
    dt = start.dtype
    out = s + torch.arange(n, dtype=torch.float64 if dt.is_floating_point else torch.int64, device=start.device) * d
    return [out.to(dt)]


@onnx_op("OneHot")
def one_hot(inputs, attrs, opset):
    ind, depth, values = inputs
    d = int(scalar(depth))
    ind = ind.to(torch.int64) if not ind.dtype.is_floating_point else ind.trunc().to(torch.int64)
    ind = torch.where(ind < 0, ind + d, ind)
    valid = (ind >= 0) & (ind < d)
    oh = (ind.unsqueeze(-1) == torch.arange(d, device=ind.device)) & valid.unsqueeze(-1)
    axis = attrs.get("axis", -1)
    r = ind.dim() + 1
    axis = norm_axis(axis, r, "OneHot")
    oh = oh.movedim(-1, axis)
    off, on = values.reshape(-1)[0], values.reshape(-1)[1]
    return [torch.where(oh, on, off)]


@onnx_op("NonZero")
def nonzero(inputs, attrs, opset):
    x = inputs[0]
    if x.dim() == 0:
        return [torch.zeros((0, int(bool(x.item()))), dtype=torch.int64, device=x.device)]
    return [torch.nonzero(widen(x)).T.contiguous()]


@onnx_op("TopK")
def topk(inputs, attrs, opset):
    x = inputs[0]
    k = attrs["k"] if opset < 10 else int(scalar(inputs[1]))
    axis = norm_axis(attrs.get("axis", -1), x.dim(), "TopK")
    largest = attrs.get("largest", 1)
    xw = widen(x)
    vals, idx = torch.sort(xw, dim=axis, descending=bool(largest), stable=True)
    vals, idx = vals.narrow(axis, 0, k), idx.narrow(axis, 0, k)
    return [narrow(vals.contiguous(), x.dtype), idx.contiguous()]


@onnx_op("DepthToSpace")
def depth_to_space(inputs, attrs, opset):
    x = inputs[0]
    b = attrs["blocksize"]
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return [t.reshape(n, c // (b * b), h * b, w * b).contiguous()]


@onnx_op("SpaceToDepth")
def space_to_depth(inputs, attrs, opset):
    x = inputs[0]
    b = attrs["blocksize"]
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    if attrs.get("mode", "DCR") == "DCR":
        t = t.permute(0, 3, 5, 1, 2, 4)
    else:
        t = t.permute(0, 1, 3, 5, 2, 4)
    return [t.reshape(n, c * b * b, h // b, w // b).contiguous()]


@onnx_op("ReverseSequence")
def reverse_sequence(inputs, attrs, opset):
    x, lens = inputs
    ta, ba = attrs.get("time_axis", 0), attrs.get("batch_axis", 1)
    T = x.shape[ta]
    t = torch.arange(T, device=x.device)[:, None]
    L = lens.to(x.device, torch.int64)[None, :]
    src = torch.where(t < L, L - 1 - t, t)  # [T, B]
    shape = [1] * x.dim()
    shape[ta], shape[ba] = T, x.shape[ba]
    if ta > ba:
        src = src.T
    idx = src.reshape(shape).expand(x.shape)
    return [torch.gather(x, ta, idx)]


@onnx_op("Trilu")
def trilu(inputs, attrs, opset):
    x = inputs[0]
    k = int(scalar(opt(inputs, 1), 0))
    return [torch.triu(x, k) if attrs.get("upper", 1) else torch.tril(x, k)]


@onnx_op("EyeLike")
def eye_like(inputs, attrs, opset):
    x = inputs[0]
    dt = torch_dtype(attrs["dtype"]) if "dtype" in attrs else x.dtype
    n, m = x.shape
    k = attrs.get("k", 0)
    e = torch.arange(m, device=x.device)[None, :] - torch.arange(n, device=x.device)[:, None] == k
    return [e.to(dt)]


@onnx_op("Compress")
def compress(inputs, attrs, opset):
    x, cond = inputs
    axis = attrs.get("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = norm_axis(axis, x.dim(), "Compress")
    sel = torch.nonzero(cond.reshape(-1).to(torch.bool)).reshape(-1)
    sel = sel[sel < x.shape[axis]]
    return [x.index_select(axis, sel)]


@onnx_op("Unique")
def unique(inputs, attrs, opset):
    x = inputs[0]
    axis = attrs.get("axis")
    xw = widen(x)
    if axis is None:
        xw = xw.reshape(-1)
        y, inv, cnt = torch.unique(xw, sorted=True, return_inverse=True, return_counts=True)
        n = xw.numel()
    else:
        axis = norm_axis(axis, x.dim(), "Unique")
        y, inv, cnt = torch.unique(xw, sorted=True, return_inverse=True, return_counts=True,
                                   dim=axis)
        n = x.shape[axis]
    first = torch.full((cnt.numel(),), n, dtype=torch.int64, device=inv.device).scatter_reduce(
        0, inv, torch.arange(n, device=inv.device), "amin", include_self=True)
    if not attrs.get("sorted", 1):
        perm = torch.argsort(first)
        rank = torch.argsort(perm)
        y = y.index_select(0 if axis is None else axis, perm)
        first, cnt, inv = first[perm], cnt[perm], rank[inv]
    return [narrow(y, x.dtype), first, inv.to(torch.int64), cnt.to(torch.int64)]


@onnx_op("CenterCropPad")
def center_crop_pad(inputs, attrs, opset):
    x = inputs[0]
    target = ints(inputs[1])
    axes = norm_axes(attrs.get("axes") or range(x.dim()), x.dim(), "CenterCropPad")
    out = x
    for a, t in zip(axes, target):
        d = out.shape[a]
        if t < d:
            out = out.narrow(a, (d - t) // 2, t)
        elif t > d:
            before = (t - d) // 2
            shape = list(out.shape)
            shape[a] = t
            z = torch.zeros(shape, dtype=out.dtype, device=out.device)
            z.narrow(a, before, d).copy_(out)
            out = z
    return [out.contiguous()]
