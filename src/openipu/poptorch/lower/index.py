"""Indexing ATen ops: advanced indexing (``index.Tensor`` with any number of index tensors ->
Gather / GatherND), ``index_put`` (ScatterND; ``accumulate=True`` -> ``ScatterReduce`` Sum on
the flattened indexed dims), ``scatter`` / ``scatter_add`` / ``scatter_reduce``
(ScatterElements, ``ScatterReduce``), ``select_scatter`` / ``slice_scatter`` (a scatter of the
source into its positions), ``masked_scatter`` (a CumSum of the mask and a Gather), ``index_add``,
``index_copy``, ``index_fill`` and ``take_along_dim`` likewise.

PopTorch's supported-ops list: ``index``, ``index_put``, ``gather``, ``scatter``,
``scatter_add``, ``scatter_reduce`` (sum, amax, amin, prod), ``index_select``, ``masked_fill``.
Indices are INT32 on the IPU (int64 indices are cast, as PopTorch does); negative indices are
wrapped with the dimension's size.
"""

from __future__ import annotations

import numpy as np
import torch

from openipu.poptorch.errors import Error
from openipu.poptorch.lower import aten


def _wrap(lw, idx_node, size: int) -> str:
    """Index tensor ``idx_node`` as INT32 with negative values wrapped by ``size``."""
    tid = lw.t(idx_node)
    if lw.dtype(idx_node) != "INT32":
        tid = lw.cast(tid, "INT32")
    neg = lw.onnx.less([tid, lw.const(0, "INT32")], lw._name("neg"))
    return lw.onnx.where([neg, lw.onnx.add([tid, lw.const(size, "INT32")]), tid], lw._name("wrap"))


def _broadcast(lw, tid: str, shape, target) -> str:
    if list(shape) == list(target):
        return tid
    return lw.onnx.expand([tid, lw.shape_const(target)], lw._name("bcast"))


def _nd_indices(lw, x, indices):
    """The indexed dims, the broadcast index shape and the ``[*B, k]`` INT32 index tensor of
    GatherND / ScatterND with the indexed dims moved to the front of ``x``."""
    shape = lw.shape(x)
    dims = [i for i, t in enumerate(indices) if t is not None]
    for d in dims:
        if lw.val(indices[d]).dtype == torch.bool:
            raise Error("Indexing with a boolean mask gives a data-dependent shape, which a static IPU graph cannot "
                        "have: use torch.where or masked_fill instead")
    bshape = list(torch.broadcast_shapes(*[tuple(lw.shape(indices[d])) for d in dims]))
    parts = []
    for d in dims:
        t = _wrap(lw, indices[d], shape[d])
        t = _broadcast(lw, t, lw.shape(indices[d]), bshape)
        parts.append(lw.onnx.unsqueeze([t], axes=[len(bshape)], debugContext=lw._name("k")))
    idx = parts[0] if len(parts) == 1 else lw.onnx.concat(parts, len(bshape), lw._name("stack"))
    return dims, bshape, idx


def _front(lw, x, dims):
    """``x`` with ``dims`` moved to the front (and the permutation)."""
    rank = len(lw.shape(x))
    perm = dims + [d for d in range(rank) if d not in dims]
    tid = lw.t(x)
    if perm != list(range(rank)):
        tid = lw.onnx.transpose([tid], perm, lw._name("front"))
    return tid, perm


@aten("aten.index.Tensor")
def index(lw, n):
    """``x[i0, i1, ...]`` (PyTorch's advanced indexing: the broadcast index dims replace the
    indexed dims in place when these are adjacent, else go first)."""
    x, indices = n.args[0], list(n.args[1])
    dims = [i for i, t in enumerate(indices) if t is not None]
    if len(dims) == 1 and lw.val(indices[dims[0]]).dtype != torch.bool:
        d = dims[0]
        return lw.onnx.gather([lw.t(x), _wrap(lw, indices[d], lw.shape(x)[d])], d, lw._name())
    dims, bshape, idx = _nd_indices(lw, x, indices)
    xt, _ = _front(lw, x, dims)
    out = lw.onnx.gathernd([xt, lw.cast(idx, "INT32")], debugContext=lw._name())
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if adjacent and dims[0] > 0:
        # result [*B, rest...] -> [rest_before..., *B, rest_after...]
        nb, before = len(bshape), dims[0]
        rank = nb + len(lw.shape(x)) - len(dims)
        perm = list(range(nb, nb + before)) + list(range(nb)) + list(range(nb + before, rank))
        out = lw.onnx.transpose([out], perm, lw._name("back"))
    return out


def _mask_put(lw, n, x, indices, values, accumulate):
    """``x[mask] = values`` with one boolean ``mask`` over dims ``d .. d+k-1`` of ``x``: a
    ``Where`` of the mask (broadcast over the other dims) between ``values`` and ``x``
    (``accumulate``: ``x + values``). ``values`` must broadcast to the dims after the mask (a
    scalar, or one row): the count of selected elements is data-dependent. Raises
    :class:`Error` otherwise."""
    shape = lw.shape(x)
    d = next(i for i, t in enumerate(indices) if t is not None)
    mask = indices[d]
    mshape = lw.shape(mask)
    k = len(mshape)
    if mshape != shape[d:d + k]:
        raise Error(f"Boolean mask of shape {mshape} does not match the indexed dims {shape[d:d + k]} of the tensor")
    rest = shape[d + k:]
    vshape = lw.shape(values) if isinstance(values, torch.fx.Node) else []
    vs = [s for s in vshape]
    while vs and vs[0] == 1:
        vs = vs[1:]
    if len(vs) > len(rest) or any(a not in (1, b) for a, b in zip(vs[::-1], rest[::-1])):
        raise Error("Assigning through a boolean mask needs values that broadcast to every selected element (a "
                    f"scalar or a row of shape {rest}): values of shape {vshape} depend on how many elements the "
                    "mask selects, which a static IPU graph cannot know")
    m = lw.b.reshape_const(lw.onnx, [lw.t(mask)], [1] * d + mshape + [1] * len(rest), lw._name("mask"))
    vt = lw.like(values, x)
    if vs != vshape:
        vt = lw.b.reshape_const(lw.onnx, [vt], vs or [1], lw._name("values"))
    if accumulate:
        vt = lw.onnx.add([lw.t(x), vt], lw._name("acc"))
    return lw.onnx.where([m, vt, lw.t(x)], lw._name())


@aten("aten.index_put.default", "aten.index_put_.default", "aten._unsafe_index_put.default")
def index_put(lw, n):
    """``x[indices] = values`` (``accumulate``: ``+=``, duplicates summed); one boolean mask
    index: :func:`_mask_put`."""
    x, indices, values = n.args[0], list(n.args[1]), n.args[2]
    accumulate = bool(n.args[3] if len(n.args) > 3 else n.kwargs.get("accumulate", False))
    given = [t for t in indices if t is not None]
    if len(given) == 1 and lw.val(given[0]).dtype == torch.bool:
        return _mask_put(lw, n, x, indices, values, accumulate)
    shape = lw.shape(x)
    indices = indices + [None] * (len(shape) - len(indices))
    dims, bshape, idx = _nd_indices(lw, x, indices)
    xt, perm = _front(lw, x, dims)
    rest = [shape[d] for d in perm[len(dims):]]
    upd_shape = bshape + rest
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    vt = lw.like(values, x)
    vshape = lw.shape(values) if hasattr(values, "meta") else []
    if adjacent and dims[0] > 0:
        # values broadcast against [before..., *B, after...]: bring B to the front
        before = [shape[d] for d in range(dims[0])]
        after = [shape[d] for d in range(dims[-1] + 1, len(shape))]
        full = before + bshape + after
        vt = _broadcast(lw, vt, vshape, full)
        nb, nbe = len(bshape), len(before)
        p = list(range(nbe, nbe + nb)) + list(range(nbe)) + list(range(nbe + nb, len(full)))
        vt = lw.onnx.transpose([vt], p, lw._name("vfront"))
    else:
        vt = _broadcast(lw, vt, vshape, upd_shape)
    if accumulate:
        # flatten the indexed dims to one: linear index -> ScatterReduce(Sum) + x
        strides = np.cumprod([1] + [shape[d] for d in dims][::-1])[:-1][::-1].astype(np.int32)
        lin = lw.onnx.reducesum([lw.onnx.mul([idx, lw.const(strides, "INT32")])], axes=[len(bshape)], keepdims=0,
                                debugContext=lw._name("lin"))
        nidx = int(np.prod(bshape)) if bshape else 1
        lin = lw.b.reshape_const(lw.onnx, [lin], [nidx])
        upd = lw.b.reshape_const(lw.onnx, [vt], [nidx] + rest)
        size = int(np.prod([shape[d] for d in dims]))
        summed = lw.gc.scatterreduce([upd, lin], size, 0, "Sum", debugContext=lw._name("acc"))
        flat = lw.b.reshape_const(lw.onnx, [xt], [size] + rest)
        out = lw.onnx.add([flat, summed], lw._name("add"))
        out = lw.b.reshape_const(lw.onnx, [out], [shape[d] for d in perm])
    else:
        out = lw.onnx.scatternd([xt, lw.cast(idx, "INT32"), vt], debugContext=lw._name())
    if perm != list(range(len(shape))):
        out = lw.onnx.transpose([out], [int(i) for i in np.argsort(perm)], lw._name("unfront"))
    return out


def _scatter_args(lw, n):
    x, dim, index = n.args[0], int(n.args[1]), n.args[2]
    rank = len(lw.shape(x))
    dim %= rank
    return x, dim, _wrap(lw, index, lw.shape(x)[dim]), lw.shape(index)


def _src(lw, n, src, index_shape, like):
    if isinstance(src, torch.fx.Node):
        tid = lw.like(src, like)
        if lw.shape(src) != list(index_shape):    # src may be larger than index: use its leading part
            tid = lw.onnx.slice([tid, lw.shape_const([0] * len(index_shape)), lw.shape_const(index_shape),
                                 lw.shape_const(range(len(index_shape)))], lw._name("src"))
        return tid
    return lw.const(np.full(index_shape, src, np.float32 if lw.dtype(like) == "FLOAT" else np.int32), lw.dtype(like))


@aten("aten.scatter.src", "aten.scatter.value", "aten.scatter_.src", "aten.scatter_.value", "aten.scatter.reduce",
      "aten.scatter.value_reduce", "aten.scatter_.reduce", "aten.scatter_.value_reduce")
def scatter(lw, n):
    """``scatter`` (last write wins), or with ``reduce="add"`` / ``"multiply"`` the reduction of
    the scattered values into ``x`` (PyTorch's ``scatter(..., reduce=)``: ``scatter_reduce``
    with ``sum`` / ``prod``, ``include_self``)."""
    x, dim, idx, ishape = _scatter_args(lw, n)
    src = _src(lw, n, n.args[3] if len(n.args) > 3 else n.kwargs.get("src", n.kwargs.get("value")), ishape, x)
    reduce = n.args[4] if len(n.args) > 4 else n.kwargs.get("reduce")
    if reduce is not None:
        red = {"add": "sum", "multiply": "prod"}.get(reduce)
        if red is None:
            raise Error(f"scatter: unsupported reduce '{reduce}' (PyTorch's are 'add' and 'multiply')")
        return _scatter_reduce(lw, x, dim, idx, ishape, src, red, True)
    return lw.onnx.scatterelements([lw.t(x), idx, src], dim, lw._name())


@aten("aten.index_reduce.default", "aten.index_reduce_.default")
def index_reduce(lw, n):
    """``x.index_reduce(dim, index, source, reduce, include_self)``: row ``i`` of ``source``
    along ``dim`` is reduced (``prod``, ``mean``, ``amax``, ``amin``) into row ``index[i]`` of
    ``x``: a ``scatter_reduce`` whose index is ``index`` broadcast over ``source``."""
    x, dim, index, source, reduce = n.args[:5]
    include_self = bool(n.args[5] if len(n.args) > 5 else n.kwargs.get("include_self", True))
    shape, sshape = lw.shape(x), lw.shape(source)
    dim = int(dim) % len(shape)
    idx = _wrap(lw, index, shape[dim])
    view = [sshape[d] if d == dim else 1 for d in range(len(sshape))]
    idx = lw.b.reshape_const(lw.onnx, [idx], view, lw._name("index"))
    idx = _broadcast(lw, idx, view, sshape)
    return _scatter_reduce(lw, x, dim, idx, sshape, lw.like(source, x), reduce, include_self)


def _scatter_reduce(lw, x, dim, idx, ishape, src, reduce, include_self):
    """``scatter_reduce`` along ``dim``: the reduction of ``src`` rows into ``x`` (the other
    dims of ``index`` select ``x``'s positions one to one) via ``ScatterReduce``."""
    shape = lw.shape(x)
    rank = len(shape)
    red = {"sum": "Sum", "add": "Sum", "amax": "Max", "amin": "Min", "prod": "Mul", "mean": "Sum"}.get(reduce)
    if red is None:
        raise Error(f"scatter_reduce: unsupported reduction '{reduce}'")
    ishape = list(ishape)
    pad_to = [shape[d] if d != dim else ishape[d] for d in range(rank)]
    size = shape[dim]
    if ishape != pad_to:
        # index smaller than x on the other dims: pad it with a sentinel row (shape[dim], dropped
        # afterwards) and src with zeros, so index, src and x agree off ``dim``
        pads = [0] * rank + [pad_to[d] - ishape[d] for d in range(rank)]
        idx = lw.onnx.pad([idx, lw.shape_const(pads), lw.const(np.int32(shape[dim]), "INT32")],
                          debugContext=lw._name("ipad"))
        src = lw.onnx.pad([src, lw.shape_const(pads)], debugContext=lw._name("spad"))
        ishape, size = pad_to, shape[dim] + 1
    init_val = {"Sum": 0.0, "Mul": 1.0, "Max": -np.inf, "Min": np.inf}[red]
    out_shape = [size if d == dim else shape[d] for d in range(rank)]
    dt = lw.dtype(x)
    init = lw.const(np.full(out_shape, init_val, np.float32 if dt == "FLOAT" else np.int32), dt)
    r = lw.gc.scatterreduce([src, idx, init], size, dim, red, 0, debugContext=lw._name("reduce"))
    if size != shape[dim]:
        r = lw.onnx.slice([r, lw.shape_const([0]), lw.shape_const([shape[dim]]), lw.shape_const([dim])],
                          lw._name("drop"))
    # rows no index hits keep x; rows hit combine with x when include_self
    ones = lw.const(np.ones(ishape, np.float32), "FLOAT")
    count = lw.gc.scatterreduce([ones, idx], size, dim, "Sum", 0, debugContext=lw._name("count"))
    if size != shape[dim]:
        count = lw.onnx.slice([count, lw.shape_const([0]), lw.shape_const([shape[dim]]), lw.shape_const([dim])],
                              lw._name("cdrop"))
    hit = lw.onnx.greater([count, lw.const(0.0)], lw._name("hit"))
    xt = lw.t(x)
    if include_self:
        comb = {"Sum": "add", "Mul": "mul", "Max": "max", "Min": "min"}[red]
        merged = getattr(lw.onnx, comb)([xt, r], lw._name("self"))
        if reduce == "mean":
            c = count if dt == "FLOAT" else lw.cast(count, dt)
            merged = lw.onnx.div([merged, lw.onnx.add([c, lw.const(1, dt)])], lw._name("mean"))
    else:
        merged = r
        if reduce == "mean":
            c = count if dt == "FLOAT" else lw.cast(count, dt)
            merged = lw.onnx.div([r, lw.onnx.max([c, lw.const(1, dt)])], lw._name("mean"))
    return lw.onnx.where([hit, merged, xt], lw._name())


def _row_index(lw, n, x, dim):
    """For a scatter along dim 0 whose index is one row index per ``src`` row broadcast over
    the other dims (PyG's ``index.view(-1, 1).expand_as(src)``): that 1-D index as INT32
    (negative entries made out of range: their rows are dropped), else None. Such scatters lower to one row-wise ``ScatterReduce`` (index broadcast),
    which PopLibs runs as a ``multiUpdateAdd`` (:mod:`openipu.popart.lowering.scatter`)."""
    index, src = n.args[2], n.args[3] if len(n.args) > 3 else None
    if dim != 0 or not isinstance(index, torch.fx.Node) or not isinstance(src, torch.fx.Node):
        return None
    ishape, sshape = lw.shape(index), lw.shape(src)
    if not ishape or ishape != sshape:
        return None
    base = index
    while isinstance(base, torch.fx.Node) and str(base.target) in ("aten.expand.default", "aten.view.default",
                                                                    "aten.unsqueeze.default", "aten.reshape.default"):
        shp = lw.shape(base)
        if len(shp) == 1 and shp[0] == ishape[0] or len(shp) >= 1 and shp[0] == ishape[0] and \
                all(d == 1 for d in shp[1:]) and str(base.target) != "aten.expand.default":
            break
        base = base.args[0]
    if not isinstance(base, torch.fx.Node):
        return None
    shp = lw.shape(base)
    if not shp or shp[0] != ishape[0] or any(d != 1 for d in shp[1:]):
        return None
    row = lw.b.reshape_const(lw.onnx, [lw.t(base)], [ishape[0]], lw._name("rowidx")) if len(shp) > 1 else lw.t(base)
    if lw.dtype(base) != "INT32":
        row = lw.cast(row, "INT32")
    # a negative index (PopTorch Geometric's -1, "no neighbour") becomes out of range, and the
    # row is dropped as PopLibs' multiUpdate drops out-of-range offsets (torch itself rejects
    # negative scatter indices, so no valid torch program is changed)
    size = lw.shape(x)[0]
    neg = lw.onnx.less([row, lw.const(0, "INT32")], lw._name("neg"))
    return lw.onnx.where([neg, lw.const(size, "INT32"), row], lw._name("drop"))


def _row_scatter_sum(lw, n, x, row):
    """``x + scatter_add(src rows at row)``: one row-wise ScatterReduce Sum (no count pass:
    rows nothing hits get 0)."""
    src = lw.like(n.args[3], x)
    size = lw.shape(x)[0]
    r = lw.gc.scatterreduce([src, row], size, 0, "Sum", 1, debugContext=lw._name("rowscatter"))
    return lw.onnx.add([lw.t(x), r], lw._name())


@aten("aten.scatter_add.default", "aten.scatter_add_.default")
def scatter_add(lw, n):
    x0, dim0 = n.args[0], int(n.args[1]) % max(len(lw.shape(n.args[0])), 1)
    row = _row_index(lw, n, x0, dim0)
    if row is not None:
        return _row_scatter_sum(lw, n, x0, row)
    x, dim, idx, ishape = _scatter_args(lw, n)
    src = _src(lw, n, n.args[3], ishape, x)
    return _scatter_reduce(lw, x, dim, idx, ishape, src, "sum", True)


@aten("aten.scatter_reduce.two", "aten.scatter_reduce_.two")
def scatter_reduce(lw, n):
    reduce = n.args[4] if len(n.args) > 4 else n.kwargs["reduce"]
    include_self = bool(n.args[5] if len(n.args) > 5 else n.kwargs.get("include_self", True))
    if reduce in ("sum", "add") and include_self:
        x0, dim0 = n.args[0], int(n.args[1]) % max(len(lw.shape(n.args[0])), 1)
        row = _row_index(lw, n, x0, dim0)
        if row is not None:
            return _row_scatter_sum(lw, n, x0, row)
    x, dim, idx, ishape = _scatter_args(lw, n)
    src = _src(lw, n, n.args[3], ishape, x)
    return _scatter_reduce(lw, x, dim, idx, ishape, src, reduce, include_self)


@aten("aten.select_scatter.default")
def select_scatter(lw, n):
    """``out = x.clone(); out.select(dim, index)[...] = src``."""
    x, src, dim, i = n.args[0], n.args[1], int(n.args[2]), int(n.args[3])
    shape = lw.shape(x)
    dim %= len(shape)
    i %= shape[dim]
    s = lw.onnx.unsqueeze([lw.like(src, x)], axes=[dim], debugContext=lw._name("src"))
    return _splice(lw, x, s, dim, i, i + 1, 1)


@aten("aten.slice_scatter.default")
def slice_scatter(lw, n):
    """``out = x.clone(); out[..., start:end:step, ...] = src`` on ``dim``."""
    x, src = n.args[0], n.args[1]
    shape = lw.shape(x)
    dim = int(n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % len(shape)
    start = n.args[3] if len(n.args) > 3 else n.kwargs.get("start")
    end = n.args[4] if len(n.args) > 4 else n.kwargs.get("end")
    step = int(n.args[5] if len(n.args) > 5 else n.kwargs.get("step", 1))
    start, end, _ = slice(start, end, step).indices(shape[dim])
    return _splice(lw, x, lw.like(src, x), dim, start, end, step)


def _splice(lw, x, src: str, dim: int, start: int, end: int, step: int) -> str:
    """``x`` with positions ``start:end:step`` of ``dim`` replaced by ``src`` (a scatter of
    index rows along ``dim``: ScatterElements)."""
    shape = lw.shape(x)
    rows = np.arange(start, end, step, dtype=np.int32)
    ishape = [len(rows) if d == dim else shape[d] for d in range(len(shape))]
    view = [len(rows) if d == dim else 1 for d in range(len(shape))]
    idx = np.broadcast_to(rows.reshape(view), ishape)
    return lw.onnx.scatterelements([lw.t(x), lw.const(np.ascontiguousarray(idx), "INT32"), src], dim, lw._name())


@aten("aten.masked_scatter.default")
def masked_scatter(lw, n):
    """``x`` with its ``mask`` positions filled by ``source``'s leading elements in order: the
    k-th True takes ``source.flatten()[k]`` (an inclusive CumSum of the mask gives k + 1)."""
    x, mask, source = n.args[:3]
    shape = [int(d) for d in lw.val().shape]
    numel = int(np.prod(shape))
    m = lw.t(mask)
    if lw.shape(mask) != shape:
        m = lw.onnx.expand([m, lw.shape_const(shape)], lw._name("mask"))
    flat_m = lw.b.reshape_const(lw.onnx, [lw.cast(m, "INT32")], [numel])
    pos = lw.onnx.sub([lw.onnx.cumsum([flat_m, lw.const(np.int32(0), "INT32")]), lw.const(1, "INT32")])
    pos = lw.onnx.max([pos, lw.const(0, "INT32")], lw._name("pos"))
    src = lw.b.reshape_const(lw.onnx, [lw.like(source, x)], [int(np.prod(lw.shape(source)))])
    taken = lw.b.reshape_const(lw.onnx, [lw.onnx.gather([src, pos], 0, lw._name("take"))], shape)
    xt = lw.t(x)
    if lw.shape(x) != shape:
        xt = lw.onnx.expand([xt, lw.shape_const(shape)])
    return lw.onnx.where([m, taken, xt], lw._name())


@aten("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default")
def embedding_bag(lw, n):
    """``EmbeddingBag`` (sum, mean, max over each bag of looked-up rows, optional per-sample
    weights): the bag of index position ``j`` is ``#(offsets <= j) - 1`` (computed on the device,
    offsets may be an input), the rows are reduced per bag by ``ScatterReduce``. Returns PyTorch's
    ``(out, offset2bag, bag_size, max_indices)`` (``max_indices``: for ``max``, the weight row
    each maximum came from; zeros for ``sum`` / ``mean``, as PyTorch's)."""
    weight, indices, offsets = n.args[:3]
    mode = int(n.args[4] if len(n.args) > 4 else n.kwargs.get("mode", 0))
    psw = n.args[6] if len(n.args) > 6 else n.kwargs.get("per_sample_weights")
    last = bool(n.args[7] if len(n.args) > 7 else n.kwargs.get("include_last_offset", False))
    padding_idx = n.args[8] if len(n.args) > 8 else n.kwargs.get("padding_idx")
    count = lw.shape(indices)[0]
    nb = lw.shape(offsets)[0] - (1 if last else 0)
    dim = lw.shape(weight)[1]
    idx = lw.cast(lw.t(indices), "INT32")
    rows = lw.onnx.gather([lw.t(weight), idx], 0, lw._name("rows"))
    off = lw.cast(lw.t(offsets), "INT32")
    if last:
        off = lw.onnx.slice([off, lw.shape_const([0]), lw.shape_const([nb]), lw.shape_const([0])], lw._name("off"))
    pos = lw.const(np.arange(count, dtype=np.int32).reshape(count, 1), "INT32")
    started = lw.cast(lw.onnx.logical_not([lw.onnx.less([pos, lw.onnx.unsqueeze([off], axes=[0])])]), "INT32")
    bag = lw.onnx.sub([lw.onnx.reducesum([started], axes=[1], keepdims=0), lw.const(1, "INT32")], lw._name("bag"))
    valid = lw.const(np.ones(count, np.float32))
    if padding_idx is not None and int(padding_idx) >= 0:
        valid = lw.cast(lw.onnx.logical_not([lw.onnx.equal([idx, lw.const(int(padding_idx), "INT32")])]), "FLOAT")
    wdt = lw.dtype(weight)      # the output's type (fp16 for a half model)
    vcol = lw.onnx.unsqueeze([valid], axes=[1])
    if wdt != "FLOAT":
        vcol = lw.cast(vcol, wdt)
    if psw is not None:
        rows = lw.onnx.mul([rows, lw.onnx.unsqueeze([lw.t(psw)], axes=[1])])
    bag2 = lw.onnx.expand([lw.onnx.unsqueeze([bag], axes=[1]), lw.shape_const([count, dim])])
    sizes = lw.gc.scatterreduce([valid, bag], nb, 0, "Sum", 0, debugContext=lw._name("size"))
    if mode == 2:       # max
        vbool = lw.cast(vcol, "BOOL")
        masked = lw.onnx.where([vbool, rows, lw.const(-np.inf, wdt)])
        out = lw.gc.scatterreduce([masked, bag2], nb, 0, "Max", 0, debugContext=lw._name("max"))
        # max_indices: the weight row of the first position whose element is its bag's maximum
        # (PyTorch's strict '>' scan); 0 for empty bags. Positions are scored count - j (>= 1)
        # where they hit, 0 elsewhere, so that a Max scatter finds the first hit.
        hit = lw.onnx.logical_and([lw.onnx.equal([masked, lw.onnx.gather([out, bag], 0)]), vbool])
        score = lw.const((count - np.arange(count, dtype=np.float32)).reshape(count, 1))
        best = lw.gc.scatterreduce([lw.onnx.where([hit, score, lw.const(np.float32(0.0))]), bag2], nb, 0, "Max", 0,
                                   debugContext=lw._name("argmax"))
        first = lw.cast(lw.onnx.min([lw.onnx.sub([lw.const(np.float32(count)), best]),
                                     lw.const(np.float32(count - 1))]), "INT32")
        max_indices = lw.onnx.where([lw.onnx.equal([best, lw.const(np.float32(0.0))]), lw.const(0, "INT32"),
                                     lw.onnx.gather([idx, first], 0)], lw._name("max_indices"))
        empty = lw.onnx.unsqueeze([lw.onnx.equal([sizes, lw.const(0.0)])], axes=[1])
        out = lw.onnx.where([empty, lw.const(0.0, wdt), out], lw._name())
        return [out, bag, lw.cast(sizes, "INT32"), max_indices]
    else:
        out = lw.gc.scatterreduce([lw.onnx.mul([rows, vcol]), bag2], nb, 0, "Sum", 0, debugContext=lw._name("sum"))
        if mode == 1:
            denom = lw.onnx.max([sizes, lw.const(1.0)])
            denom = denom if wdt == "FLOAT" else lw.cast(denom, wdt)
            out = lw.onnx.div([out, lw.onnx.unsqueeze([denom], axes=[1])], lw._name())
    zeros = lw.const(np.zeros(nb, np.int32), "INT32")
    return [out, bag, lw.cast(sizes, "INT32"), zeros]


@aten("poptorch.bincount.default")
def bincount(lw, n):
    """``torch.bincount(x, weights, minlength)`` with ``minlength`` bins: a ScatterReduce (Sum)
    of the weights (ones) at ``x`` (PopTorch's lowering); values outside the bins are dropped."""
    x, weights, size = n.args[0], n.args[1], int(n.args[2])
    length = lw.shape(x)[0]
    dt = lw.out_dtype()
    xt = lw.t(x) if lw.dtype(x) == "INT32" else lw.cast(lw.t(x), "INT32")
    inside = lw.onnx.logical_and([lw.onnx.less([xt, lw.const(size, "INT32")]),
                                  lw.onnx.logical_not([lw.onnx.less([xt, lw.const(0, "INT32")])])])
    w = lw.like(weights, n) if weights is not None else lw.const(np.ones([length], np.int32), dt)
    w = lw.onnx.where([inside, w, lw.const(0, dt) if dt == "INT32" else lw.const(0.0, dt)], lw._name("w"))
    idx = lw.onnx.where([inside, xt, lw.const(0, "INT32")], lw._name("idx"))
    return lw.gc.scatterreduce([w, idx], size, 0, "Sum", debugContext=lw._name())
