"""Matrix products, convolutions and embeddings: ``linear`` / ``addmm`` / ``mm`` / ``bmm`` /
``bilinear`` / ``_trilinear`` /
``matmul`` -> ONNX MatMul (+ Add) (PopART lowers them through ``poplin``'s matmul planner);
``convolution`` / ``conv2d`` ... -> ONNX Conv or ConvTranspose (``poplin`` convolutions);
``embedding`` -> ONNX Gather on axis 0 (PopTorch's lowering; ``padding_idx`` is ignored, so that
row is trained too)."""

from __future__ import annotations

import numpy as np

from openipu.poptorch.errors import Error
from openipu.poptorch.lower import aten


def _matmul(lw, a, b):
    return lw.onnx.matmul([a, b], lw._name())


def _transpose_last2(lw, tid, rank):
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return lw.onnx.transpose([tid], perm, lw._name("transpose"))


@aten("aten.linear.default")
def linear(lw, n):
    x, w = n.args[0], n.args[1]
    bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
    y = _matmul(lw, lw.t(x), _transpose_last2(lw, lw.t(w), 2))
    return lw.onnx.add([y, lw.t(bias)], lw._name("bias")) if bias is not None else y


@aten("aten.addmm.default", "aten.addbmm.default", "aten.baddbmm.default")
def addmm(lw, n):
    bias, m1, m2 = n.args[:3]
    beta = n.kwargs.get("beta", 1)
    alpha = n.kwargs.get("alpha", 1)
    y = _matmul(lw, lw.t(m1), lw.t(m2))
    dt = lw.out_dtype()
    if "addbmm" in str(n.target):
        y = lw.onnx.reducesum([y], axes=[0], keepdims=0, debugContext=lw._name("sum"))
    if alpha != 1:
        y = lw.onnx.mul([y, lw.const(alpha, dt)])
    if beta == 0:
        return y
    b = lw.t(bias)
    if beta != 1:
        b = lw.onnx.mul([b, lw.const(beta, dt)])
    return lw.onnx.add([y, b], lw._name("bias"))


@aten("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def mm(lw, n):
    return _matmul(lw, lw.t(n.args[0]), lw.t(n.args[1]))


def _pairs(v, k):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * k if len(v) == 1 else v


@aten("aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default",
      "aten.conv_transpose1d.default", "aten.conv_transpose2d.input", "aten.conv_transpose3d.input",
      "aten.conv1d.padding", "aten.conv2d.padding", "aten.conv3d.padding")
def convolution(lw, n):
    name = str(n.target)
    x, w = n.args[0], n.args[1]
    bias = n.args[2] if len(n.args) > 2 else n.kwargs.get("bias")
    k = len(lw.shape(w)) - 2
    if name.startswith("aten.convolution"):
        stride, padding, dilation, transposed, out_pad, groups = n.args[3:9]
    elif "conv_transpose" in name:
        a = list(n.args[3:]) + [None] * 5
        stride, padding, out_pad, groups, dilation = (a[0] or 1, a[1] or 0, a[2] or 0, a[3] or 1, a[4] or 1)
        transposed = True
    else:
        a = list(n.args[3:]) + [None] * 4
        stride, padding, dilation, groups = a[0] or 1, a[1] if a[1] is not None else 0, a[2] or 1, a[3] or 1
        transposed, out_pad = False, 0
    stride, dilation = _pairs(stride, k), _pairs(dilation, k)
    if isinstance(padding, str):
        if padding == "valid":
            padding = [0] * k
        else:       # "same" (stride 1): pad the kernel's dilated extent, the extra at the end
            ks = lw.shape(w)[2:]
            total = [d * (s - 1) for d, s in zip(dilation, ks)]
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
            return _conv(lw, n, x, w, bias, stride, pads, dilation, int(groups), False, None)
    padding = _pairs(padding, k)
    return _conv(lw, n, x, w, bias, stride, padding + padding, dilation, int(groups), bool(transposed),
                 _pairs(out_pad, k))


def _conv(lw, n, x, w, bias, stride, pads, dilation, groups, transposed, out_pad):
    ins = [lw.t(x), lw.t(w)] + ([lw.t(bias)] if bias is not None else [])
    ks = lw.shape(w)[2:]
    if transposed:
        if any(d != 1 for d in dilation):
            raise Error("ConvTranspose with dilation is not supported (PopTorch: conv-transpose without dilation)")
        return lw.onnx.convtranspose(ins, dilations=dilation, group=groups, kernel_shape=ks,
                                     output_padding=out_pad, pads=pads, strides=stride, debugContext=lw._name())
    return lw.onnx.conv(ins, dilations=dilation, group=groups, kernel_shape=ks, pads=pads, strides=stride,
                        debugContext=lw._name())


@aten("aten.embedding.default")
def embedding(lw, n):
    w, idx = n.args[0], n.args[1]
    padding_idx = n.args[2] if len(n.args) > 2 else n.kwargs.get("padding_idx", -1)
    rows = lw.onnx.gather([lw.t(w), lw.t(idx)], 0, lw._name())
    if padding_idx is None or int(padding_idx) < 0 or not lw.training:
        return rows
    # padding_idx: the row looks up as usual but gets no gradient (PyTorch's rule): the rows of
    # that index come through a Detach
    keep = lw.onnx.unsqueeze([lw.onnx.logical_not([lw.onnx.equal([lw.cast(lw.t(idx), "INT32"),
                                                                  lw.const(int(padding_idx), "INT32")])])],
                             axes=[len(lw.shape(idx))], debugContext=lw._name("pad"))
    return lw.onnx.where([keep, rows, lw.gc.detach([rows], lw._name("detach"))], lw._name("padding_idx"))


@aten("aten.bilinear.default")
def bilinear(lw, n):
    """``F.bilinear(x1, x2, W, b)``: ``y[..., o] = x1[..., i] W[o, i, j] x2[..., j] + b[o]``, as
    a MatMul of ``x1`` with ``W`` laid out ``[i, o*j]``, a product with ``x2`` and a sum over
    ``j`` (PopTorch lowers ``torch.nn.Bilinear`` to matmuls too)."""
    x1, x2, w = n.args[:3]
    b = n.args[3] if len(n.args) > 3 else None
    s1, s2, ws = lw.shape(x1), lw.shape(x2), lw.shape(w)
    o, i, j = ws
    rows = int(np.prod(s1[:-1])) if len(s1) > 1 else 1
    a = lw.b.reshape_const(lw.onnx, [lw.t(x1)], [rows, i], lw._name("x1"))
    wt = lw.onnx.transpose([lw.t(w)], [1, 0, 2], lw._name("w"))
    wt = lw.b.reshape_const(lw.onnx, [wt], [i, o * j], lw._name("wflat"))
    t = lw.b.reshape_const(lw.onnx, [lw.onnx.matmul([a, wt], lw._name("mm"))], [rows, o, j], lw._name("t"))
    c = lw.b.reshape_const(lw.onnx, [lw.t(x2)], [rows, 1, j], lw._name("x2"))
    y = lw.onnx.reducesum([lw.onnx.mul([t, c], lw._name("mul"))], axes=[2], keepdims=0, debugContext=lw._name("sum"))
    if b is not None:
        y = lw.onnx.add([y, lw.t(b)], lw._name("bias"))
    return lw.b.reshape_const(lw.onnx, [y], s1[:-1] + [o], lw._name())


@aten("aten._trilinear.default")
def trilinear(lw, n):
    """``aten::_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim)``: each input
    gets size-1 axes at its ``expand`` positions (all three then have the same rank), the three
    are multiplied with broadcasting and summed over ``sumdim`` (those axes dropped); the
    ``unroll_dim`` hint of ATen's loop changes nothing in the result. Lowered as ONNX Unsqueeze,
    Mul, Mul, ReduceSum (differentiable through PopART's grads of those ops)."""
    i1, i2, i3, e1, e2, e3, sumdim = n.args[:7]
    xs = []
    for x, e, tag in ((i1, e1, "i1"), (i2, e2, "i2"), (i3, e3, "i3")):
        t = lw.t(x)
        if list(e):
            t = lw.onnx.unsqueeze([t], axes=sorted(int(d) for d in e), debugContext=lw._name(tag))
        xs.append(t)
    y = lw.onnx.mul([lw.onnx.mul([xs[0], xs[1]], lw._name("mul")), xs[2]], lw._name("mul"))
    if list(sumdim):
        y = lw.onnx.reducesum([y], axes=sorted(int(d) for d in sumdim), keepdims=0, debugContext=lw._name("sum"))
    return y
