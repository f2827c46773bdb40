"""Reductions and softmax: ``sum`` / ``mean`` / ``amax`` / ``amin`` / ``prod`` -> ONNX Reduce*
(``popops::reduce``), ``max.dim`` / ``min.dim`` -> ReduceMax + ArgMax, ``argmax`` / ``argmin``,
``any`` / ``all`` (via a cast), ``_softmax`` / ``_log_softmax`` -> Softmax / LogSoftmax on the
last axis (other axes transposed there), ``logsumexp``."""

from __future__ import annotations

import numpy as np

from openipu.poptorch.lower import aten


def _axes(lw, x, dims):
    rank = len(lw.shape(x))
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return sorted(int(d) % rank for d in dims) if rank else []


def _reduce(onnx_op):
    def fn(lw, n):
        x = n.args[0]
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        keep = bool(n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False))
        tid = lw.t(x)
        out_dt = lw.out_dtype()
        if lw.dtype(x) != out_dt:
            tid = lw.cast(tid, out_dt)
        axes = _axes(lw, x, dims)
        if not axes:
            return lw.onnx.identity([tid], lw._name())
        return getattr(lw.onnx, onnx_op)([tid], axes=axes, keepdims=int(keep), debugContext=lw._name())
    return fn


aten("aten.sum.dim_IntList", "aten.sum.default")(_reduce("reducesum"))
aten("aten.mean.dim", "aten.mean.default")(_reduce("reducemean"))
aten("aten.amax.default")(_reduce("reducemax"))
aten("aten.amin.default")(_reduce("reducemin"))
aten("aten.prod.dim_int", "aten.prod.default")(_reduce("reduceprod"))
aten("aten.logsumexp.default")(_reduce("reducelogsumexp"))


@aten("aten.max.dim", "aten.min.dim")
def max_dim(lw, n):
    x, dim = n.args[0], int(n.args[1])
    keep = int(bool(n.args[2] if len(n.args) > 2 else False))
    is_max = str(n.target).startswith("aten.max")
    v = (lw.onnx.reducemax if is_max else lw.onnx.reducemin)([lw.t(x)], axes=[dim], keepdims=keep,
                                                               debugContext=lw._name())
    i = (lw.onnx.argmax if is_max else lw.onnx.argmin)([lw.t(x)], axis=dim, keepdims=keep,
                                                       debugContext=lw._name("arg"))
    return (v, lw.cast(i, "INT32"))


@aten("aten.max.default", "aten.min.default")
def max_all(lw, n):
    fn = lw.onnx.reducemax if str(n.target).startswith("aten.max") else lw.onnx.reducemin
    return fn([lw.t(n.args[0])], axes=_axes(lw, n.args[0], None), keepdims=0, debugContext=lw._name())


@aten("aten.argmax.default", "aten.argmin.default")
def argmax(lw, n):
    x = lw.t(n.args[0])
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    keep = int(bool(n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)))
    fn = lw.onnx.argmax if str(n.target).startswith("aten.argmax") else lw.onnx.argmin
    if dim is None:
        x = lw.b.reshape_const(lw.onnx, [x], [-1])
        dim = 0
    return lw.cast(fn([x], axis=int(dim), keepdims=keep, debugContext=lw._name()), "INT32")


@aten("aten.any.dim", "aten.any.default", "aten.any.dims", "aten.all.dim", "aten.all.default")
def any_(lw, n):
    x = lw.cast(lw.t(n.args[0]), "INT32")
    dims = n.args[1] if len(n.args) > 1 else None
    keep = int(bool(n.args[2] if len(n.args) > 2 else False))
    fn = lw.onnx.reducemax if str(n.target).startswith("aten.any") else lw.onnx.reducemin
    return lw.cast(fn([x], axes=_axes(lw, n.args[0], dims), keepdims=keep, debugContext=lw._name()), "BOOL")


def _softmax(onnx_op):
    def fn(lw, n):
        x, dim = n.args[0], int(n.args[1])
        rank = len(lw.shape(x))
        dim %= max(rank, 1)
        tid = lw.t(x)
        if lw.dtype(x) != lw.out_dtype():
            tid = lw.cast(tid, lw.out_dtype())
        if dim == rank - 1:
            return getattr(lw.onnx, onnx_op)([tid], axis=dim, debugContext=lw._name())
        perm = list(range(rank))
        perm[dim], perm[-1] = perm[-1], perm[dim]
        y = getattr(lw.onnx, onnx_op)([lw.onnx.transpose([tid], perm)], axis=rank - 1, debugContext=lw._name())
        return lw.onnx.transpose([y], perm, lw._name("back"))
    return fn


aten("aten._softmax.default", "aten.softmax.int")(_softmax("softmax"))
aten("aten._log_softmax.default", "aten.log_softmax.int")(_softmax("logsoftmax"))


@aten("aten._safe_softmax.default")
def safe_softmax(lw, n):
    """``_safe_softmax(x, dim)`` (what ``scaled_dot_product_attention`` runs): a softmax whose
    rows of only ``-inf`` give zeros instead of NaN. Lowered whole, with a ``[..., 1]`` mask of
    the rows whose maximum is ``-inf``: those rows are zeroed before the Softmax (so that neither
    it nor its gradient makes NaN) and after it, instead of torch's decomposition (full-size
    ``eq``, ``logical_not``, ``any``, a zeros tensor and ``where``)."""
    x, dim = n.args[0], int(n.args[1])
    rank = max(len(lw.shape(x)), 1)
    dim %= rank
    dt = lw.out_dtype()
    xt = lw.t(x) if lw.dtype(x) == dt else lw.cast(lw.t(x), dt)
    rowmax = lw.onnx.reducemax([xt], axes=[dim], keepdims=1, debugContext=lw._name("rowmax"))
    dead = lw.onnx.equal([rowmax, lw.const(-np.inf, dt)], lw._name("masked_row"))
    zero = lw.const(0.0, dt)
    xt = lw.onnx.where([dead, zero, xt], lw._name("finite"))
    if dim == rank - 1:
        y = lw.onnx.softmax([xt], axis=dim, debugContext=lw._name())
    else:
        perm = list(range(rank))
        perm[dim], perm[-1] = perm[-1], perm[dim]
        y = lw.onnx.softmax([lw.onnx.transpose([xt], perm)], axis=rank - 1, debugContext=lw._name())
        y = lw.onnx.transpose([y], perm, lw._name("back"))
    return lw.onnx.where([dead, zero, y], lw._name())


@aten("aten.var.correction", "aten.var.dim", "aten.var.default", "aten.std.correction", "aten.std.dim",
      "prims.var.default")
def var(lw, n):
    """``var`` / ``std`` over ``dim`` with ``correction`` (Bessel's: 1 by default):
    ``sum((x - mean)^2) / (N - correction)``."""
    x = n.args[0]
    name = str(n.target)
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    if name.startswith("prims."):
        correction, keep = float(n.args[2] if len(n.args) > 2 else n.kwargs.get("correction", 1.0)), False
    elif name.endswith(".dim"):
        unbiased = n.args[2] if len(n.args) > 2 else n.kwargs.get("unbiased", True)
        correction = 1.0 if unbiased else 0.0
        keep = bool(n.args[3] if len(n.args) > 3 else n.kwargs.get("keepdim", False))
    else:
        correction = n.kwargs.get("correction")
        correction = 1.0 if correction is None else float(correction)
        keep = bool(n.kwargs.get("keepdim", False))
    axes = _axes(lw, x, dims)
    shape = lw.shape(x)
    count = 1
    for a in axes:
        count *= shape[a]
    dt = lw.out_dtype()
    tid = lw.t(x) if lw.dtype(x) == dt else lw.cast(lw.t(x), dt)
    mean = lw.onnx.reducemean([tid], axes=axes, keepdims=1, debugContext=lw._name("mean"))
    d = lw.onnx.sub([tid, mean])
    ss = lw.onnx.reducesum([lw.onnx.mul([d, d])], axes=axes, keepdims=int(keep), debugContext=lw._name("ss"))
    v = lw.onnx.div([ss, lw.const(max(count - correction, 0.0), dt)], lw._name())
    return lw.onnx.sqrt([v], lw._name("std")) if ".std" in name else v


@aten("aten.var_mean.correction", "aten.var_mean.dim")
def var_mean(lw, n):
    """``(var, mean)`` over ``dim`` (see :func:`var`)."""
    x = n.args[0]
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    keep = bool(n.kwargs.get("keepdim", n.args[3] if str(n.target).endswith(".dim") and len(n.args) > 3 else False))
    v = var(lw, n)
    dt = lw.out_dtype()
    tid = lw.t(x) if lw.dtype(x) == dt else lw.cast(lw.t(x), dt)
    m = lw.onnx.reducemean([tid], axes=_axes(lw, x, dims), keepdims=int(keep), debugContext=lw._name("mean"))
    return [v, m]
