"""Dynamic slicing (popops ``dynamicSlice`` family): DynamicSlice / Update / Zero / Add, whose
offsets are a runtime tensor, and SequenceSlice (rows copied by runtime offsets and counts).
"""

from __future__ import annotations

import torch

from openipu.popart.graphcore_ops._registry import _gc, _ints, _axis


def dyn_indices(offsets: torch.Tensor, dims: list, sizes: list):
    """Per sliced axis, the indices ``(o + i) mod D`` of a wrapping slice (PopLibs'
    ``dynamicSlice``), and whether every offset is in ``[0, D)``."""
    o = offsets.reshape(-1).to(torch.int64)
    if o.numel() != len(dims):
        raise ValueError(f"the offset tensor has {o.numel()} elements but {len(dims)} axes are sliced")
    ok = bool(((o >= 0) & (o < torch.tensor(dims, device=o.device))).all()) if dims else True
    idx = [(o[j].clamp(0, max(d - 1, 0)) + torch.arange(s, device=o.device)) % max(d, 1)
           for j, (d, s) in enumerate(zip(dims, sizes))]
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
        return torch.zeros(out_shape, dtype=x.dtype, device=x.device)
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
    step = torch.arange(total, device=n.device) - first
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
