"""Sorting and scans: ``sort`` (PopART's ``Sort``: values and INT32 indices), ``topk``
(ONNX TopK; ``largest=False`` as the top-k of the negation), ``argsort`` (decomposes to
``sort``), ``cumsum`` / ``cumprod`` (ONNX CumSum; the product as ``exp(cumsum(log|x|))`` with
the sign's parity), ``flip`` (a reversed Slice per dim), ``kthvalue`` / ``median`` (a stable
sort and a slice).

PopTorch's supported-ops list: ``sort``, ``topk``, ``argsort``, ``cumsum``, ``flip``. Indices
come back INT32 (int64 outputs are INT32 on the IPU, as PopTorch casts them).
"""

from __future__ import annotations

import numpy as np

from openipu.poptorch.lower import aten


def _dim(lw, x, d):
    return int(d) % max(len(lw.shape(x)), 1)


@aten("aten.sort.default", "aten.sort.stable")
def sort(lw, n):
    x = n.args[0]
    name = str(n.target)
    if name.endswith("stable"):
        stable = bool(n.kwargs.get("stable") or False)
        dim = n.kwargs.get("dim", -1)
        desc = bool(n.kwargs.get("descending", False))
    else:
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", -1)
        desc = bool(n.args[2] if len(n.args) > 2 else n.kwargs.get("descending", False))
        stable = False
    if not lw.shape(x):
        return [lw.onnx.identity([lw.t(x)]), lw.const(np.int32(0), "INT32")]
    vals, idx = lw.gc.sort([lw.t(x)], _dim(lw, x, dim), desc, stable, lw._name())
    return [vals, lw.cast(idx, "INT32")]


@aten("aten.topk.default")
def topk(lw, n):
    x, k = n.args[0], int(n.args[1])
    dim = _dim(lw, x, n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", -1))
    largest = bool(n.args[3] if len(n.args) > 3 else n.kwargs.get("largest", True))
    vals, idx = lw.onnx.topk([lw.t(x), lw.shape_const([k])], axis=dim, largest=int(largest), sorted=1,
                             debugContext=lw._name())
    return [vals, lw.cast(idx, "INT32")]


@aten("aten.cumsum.default")
def cumsum(lw, n):
    x = n.args[0]
    dim = _dim(lw, x, n.args[1] if len(n.args) > 1 else n.kwargs["dim"])
    tid = lw.t(x)
    if lw.dtype(x) != lw.out_dtype():
        tid = lw.cast(tid, lw.out_dtype())
    return lw.onnx.cumsum([tid, lw.const(np.int32(dim), "INT32")], debugContext=lw._name())


@aten("aten.cumprod.default")
def cumprod(lw, n):
    """``cumprod`` as ``sign * exp(cumsum(log|x|))`` (zeros kept by a running zero count)."""
    x = n.args[0]
    dim = _dim(lw, x, n.args[1] if len(n.args) > 1 else n.kwargs["dim"])
    dt = lw.out_dtype()
    tid = lw.t(x) if lw.dtype(x) == dt else lw.cast(lw.t(x), dt)
    axis = lw.const(np.int32(dim), "INT32")
    zero = lw.onnx.equal([tid, lw.const(0.0, dt)])
    safe = lw.onnx.where([zero, lw.const(1.0, dt), tid])
    mag = lw.onnx.exp([lw.onnx.cumsum([lw.onnx.log([lw.onnx.abs([safe])]), axis])])
    neg = lw.cast(lw.onnx.less([safe, lw.const(0.0, dt)]), dt)
    nneg = lw.onnx.cumsum([neg, axis])
    half = lw.onnx.floor([lw.onnx.div([nneg, lw.const(2.0, dt)])])
    parity = lw.onnx.sub([nneg, lw.onnx.mul([lw.const(2.0, dt), half])])
    sign = lw.onnx.sub([lw.const(1.0, dt), lw.onnx.mul([lw.const(2.0, dt), parity])])
    nz = lw.onnx.cumsum([lw.cast(zero, dt), axis])
    alive = lw.onnx.equal([nz, lw.const(0.0, dt)])
    return lw.onnx.where([alive, lw.onnx.mul([sign, mag]), lw.const(0.0, dt)], lw._name())


@aten("aten.flip.default")
def flip(lw, n):
    x = n.args[0]
    dims = sorted({_dim(lw, x, d) for d in n.args[1]})
    if not dims:
        return lw.onnx.identity([lw.t(x)], lw._name())
    big = 2 ** 62
    return lw.onnx.slice([lw.t(x), lw.shape_const([-1] * len(dims)), lw.shape_const([-big] * len(dims)),
                          lw.shape_const(dims), lw.shape_const([-1] * len(dims))], lw._name())


def _sorted_pick(lw, n, x, dim, k, keep):
    """Row ``k`` of ``x`` sorted ascending along ``dim``: ``(values, indices)``."""
    dim = _dim(lw, x, dim)
    vals, idx = lw.gc.sort([lw.t(x)], dim, False, True, lw._name("sort"))
    out = []
    for t in (vals, lw.cast(idx, "INT32")):
        t = lw.onnx.slice([t, lw.shape_const([k]), lw.shape_const([k + 1]), lw.shape_const([dim])], lw._name("k"))
        if not keep:
            t = lw.onnx.squeeze([t], axes=[dim], debugContext=lw._name("sq"))
        out.append(t)
    return out


@aten("aten.kthvalue.default")
def kthvalue(lw, n):
    x, k = n.args[0], int(n.args[1])
    dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", -1)
    keep = bool(n.args[3] if len(n.args) > 3 else n.kwargs.get("keepdim", False))
    return _sorted_pick(lw, n, x, dim, k - 1, keep)


@aten("aten.median.dim", "aten.nanmedian.dim")
def median_dim(lw, n):
    """The lower median (PyTorch's: element ``(n - 1) // 2`` of the sorted row)."""
    x = n.args[0]
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", -1)
    keep = bool(n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False))
    size = lw.shape(x)[_dim(lw, x, dim)]
    return _sorted_pick(lw, n, x, dim, (size - 1) // 2, keep)


@aten("aten.median.default")
def median(lw, n):
    x = n.args[0]
    numel = int(np.prod(lw.shape(x)))
    flat = lw.b.reshape_const(lw.onnx, [lw.t(x)], [numel])
    vals, _ = lw.gc.sort([flat], 0, False, True, lw._name("sort"))
    v = lw.onnx.slice([vals, lw.shape_const([(numel - 1) // 2]), lw.shape_const([(numel - 1) // 2 + 1]),
                       lw.shape_const([0])], lw._name("mid"))
    return lw.b.reshape_const(lw.onnx, [v], [])
