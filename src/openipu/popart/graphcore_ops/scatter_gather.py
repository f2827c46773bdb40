"""ScatterReduce (sum / max / min / mul / none, with index broadcasting and groups) and
GroupedGather; shapes follow the ops' ``setup()``.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops._registry import _gc, _axis


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
    base = initial.to(src.dtype) if initial is not None else torch.zeros(shape, dtype=src.dtype, device=src.device)
    bad = (idx < 0) | (idx >= shape[axis])
    if bool(bad.any()):         # out-of-range rows are dropped (PopLibs' multiUpdate ignores them)
        extra = list(shape)
        extra[axis] = 1
        base = torch.cat([base, torch.zeros(extra, dtype=base.dtype, device=base.device)], axis)
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
    out = dm[torch.arange(g, device=dm.device)[:, None], i]                   # [G, M, rest...]
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
