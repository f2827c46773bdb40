"""Views and data movement: ``view`` / ``reshape`` / ``flatten`` / ``squeeze`` / ``unsqueeze``
-> ONNX Reshape (to the shape the captured graph recorded), ``permute`` / ``transpose`` / ``t``
-> Transpose, ``expand`` -> Expand, ``slice`` / ``select`` / ``narrow`` -> Slice (+ Reshape),
``cat`` / ``stack`` -> Concat, ``split`` / ``chunk`` -> Split, ``gather`` -> GatherElements,
``index_select`` -> Gather."""

from __future__ import annotations

import numpy as np

from openipu.poptorch.errors import Error
from openipu.poptorch.lower import aten

_INT_MAX = 2 ** 62


def _reshape_to_out(lw, n, src=None):
    src = n.args[0] if src is None else src
    out = [int(d) for d in lw.val().shape]
    if lw.shape(src) == out:
        return lw.onnx.identity([lw.t(src)], lw._name())
    return lw.b.reshape_const(lw.onnx, [lw.t(src)], out, lw._name())


aten("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.flatten.using_ints",
     "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default",
     "aten.view_as.default", "aten.unflatten.int", "aten.alias_copy.default", "aten.view_copy.default",
     "aten._reshape_alias.default")(_reshape_to_out)


@aten("aten.permute.default", "aten.permute_copy.default")
def permute(lw, n):
    rank = len(lw.shape(n.args[0]))
    perm = [int(d) % rank for d in n.args[1]]
    return lw.onnx.transpose([lw.t(n.args[0])], perm, lw._name())


@aten("aten.transpose.int", "aten.t.default", "aten.numpy_T.default")
def transpose(lw, n):
    rank = len(lw.shape(n.args[0]))
    if rank < 2:
        return lw.onnx.identity([lw.t(n.args[0])], lw._name())
    a, b = (int(n.args[1]) % rank, int(n.args[2]) % rank) if len(n.args) > 2 else (0, 1)
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return lw.onnx.transpose([lw.t(n.args[0])], perm, lw._name())


@aten("aten.expand.default", "aten.expand_as.default", "aten.expand_copy.default")
def expand(lw, n):
    out = [int(d) for d in lw.val().shape]
    return lw.onnx.expand([lw.t(n.args[0]), lw.shape_const(out)], lw._name())


@aten("aten.slice.Tensor", "aten.slice_copy.Tensor", "aten.narrow.default")
def slice_(lw, n):
    x = n.args[0]
    dim = int(n.args[1]) if len(n.args) > 1 else 0
    size = lw.shape(x)[dim % len(lw.shape(x))]
    if str(n.target).startswith("aten.narrow"):
        start, end, step = int(n.args[2]), int(n.args[2]) + int(n.args[3]), 1
    else:
        start = n.args[2] if len(n.args) > 2 and n.args[2] is not None else 0
        end = n.args[3] if len(n.args) > 3 and n.args[3] is not None else _INT_MAX
        step = n.args[4] if len(n.args) > 4 else 1
    start, end = max(min(int(start), size), -size), min(int(end), size)
    if start == 0 and end >= size and step == 1:
        return lw.onnx.identity([lw.t(x)], lw._name())
    return lw.onnx.slice([lw.t(x), lw.shape_const([start]), lw.shape_const([end]), lw.shape_const([dim]),
                          lw.shape_const([int(step)])], lw._name())


@aten("aten.select.int", "aten.select_copy.int")
def select(lw, n):
    x, dim, i = n.args[0], int(n.args[1]), int(n.args[2])
    s = lw.onnx.slice([lw.t(x), lw.shape_const([i]), lw.shape_const([i + 1 if i != -1 else _INT_MAX]),
                       lw.shape_const([dim])], lw._name("slice"))
    return lw.b.reshape_const(lw.onnx, [s], [int(d) for d in lw.val().shape], lw._name())


@aten("aten.cat.default", "aten.concat.default", "aten.concatenate.default")
def cat(lw, n):
    xs = [a for a in n.args[0] if 0 not in lw.shape(a)]
    dim = int(n.args[1]) if len(n.args) > 1 else int(n.kwargs.get("dim", 0))
    return lw.onnx.concat([lw.like(a, n) for a in xs], dim, lw._name())


@aten("aten.stack.default")
def stack(lw, n):
    dim = int(n.args[1]) if len(n.args) > 1 else 0
    rank = len(lw.shape(n.args[0][0])) + 1
    dim %= rank
    ins = [lw.onnx.unsqueeze([lw.like(a, n)], [dim]) for a in n.args[0]]
    return lw.onnx.concat(ins, dim, lw._name())


@aten("aten.split.Tensor", "aten.split_with_sizes.default", "aten.split_copy.Tensor", "aten.chunk.default",
      "aten.split_with_sizes_copy.default", "aten.unbind.int")
def split(lw, n):
    outs = lw.val()
    name = str(n.target)
    dim = int(n.args[2]) if len(n.args) > 2 else int(n.kwargs.get("dim", 0))
    if name.startswith("aten.unbind"):
        dim = int(n.args[1]) if len(n.args) > 1 else 0
    sizes = [int(o.shape[dim]) for o in outs]
    parts = lw.onnx.split([lw.t(n.args[0])], len(sizes), dim, sizes, lw._name())
    if name.startswith("aten.unbind"):
        parts = [lw.b.reshape_const(lw.onnx, [p], [int(d) for d in o.shape]) for p, o in zip(parts, outs)]
    return list(parts)


@aten("aten.gather.default")
def gather(lw, n):
    return lw.onnx.gatherelements([lw.t(n.args[0]), lw.t(n.args[2])], int(n.args[1]), lw._name())


@aten("aten.index_select.default")
def index_select(lw, n):
    return lw.onnx.gather([lw.t(n.args[0]), lw.t(n.args[2])], int(n.args[1]), lw._name())


@aten("aten.repeat.default")
def repeat(lw, n):
    """``x.repeat(*reps)`` -> ONNX Tile (leading new dims first added as ones)."""
    x, reps = n.args[0], [int(r) for r in n.args[1]]
    shape = lw.shape(x)
    tid = lw.t(x)
    if len(reps) > len(shape):
        tid = lw.b.reshape_const(lw.onnx, [tid], [1] * (len(reps) - len(shape)) + shape)
    return lw.onnx.tile([tid, lw.shape_const(reps)], lw._name())


@aten("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(lw, n):
    """``x.as_strided(size, stride, storage_offset)`` of a contiguous ``x``: a Gather of the
    flattened tensor at the (constant) element offsets the view reads."""
    x, size, stride = n.args[0], [int(v) for v in n.args[1]], [int(v) for v in n.args[2]]
    offset = int(n.args[3] if len(n.args) > 3 and n.args[3] is not None else n.kwargs.get("storage_offset", 0) or 0)
    numel = int(np.prod(lw.shape(x))) if lw.shape(x) else 1
    idx = np.full(size, offset, np.int64)
    for d, (sz, st) in enumerate(zip(size, stride)):
        view = [1] * len(size)
        view[d] = sz
        idx = idx + (np.arange(sz, dtype=np.int64) * st).reshape(view)
    if idx.size and (idx.min() < 0 or idx.max() >= numel):
        raise Error(f"as_strided: the view {size} / {stride} (offset {offset}) reads outside the tensor's "
                    f"{numel} elements")
    flat = lw.b.reshape_const(lw.onnx, [lw.t(x)], [numel], lw._name("flat"))
    return lw.onnx.gather([flat, lw.const(idx.astype(np.int32), "INT32")], 0, lw._name())
