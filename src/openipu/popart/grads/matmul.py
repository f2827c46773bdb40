"""Gradients of MatMul and Gemm as MatMuls of transposed operands (PopART's
``MatMulLhsGradOp`` / ``MatMulRhsGradOp`` patterns): ``dA = dY @ B^T`` and ``dB = A^T @ dY``,
summed over broadcast batch dimensions; a 1-D operand is viewed as a matrix first. Einsum and Det
use the generic ``<Op>Grad`` ops (vjp of the forward kernel)."""

from __future__ import annotations

from openipu.popart.grads import grad_rule


def _swap_last(g, t):
    r = len(g.shape(t))
    return g.transpose(t, list(range(r - 2)) + [r - 1, r - 2])


def _mm(g, a, b):
    sa, sb = g.shape(a), g.shape(b)
    batch = _broadcast(sa[:-2], sb[:-2])
    return g.add("MatMul", [a, b], shape=batch + [sa[-2], sb[-1]])


def _broadcast(a, b):
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    return [max(x, y) for x, y in zip(a, b)]


@grad_rule("MatMul")
def matmul(g, op):
    a, b, gy = g.x(0), g.x(1), g.gy()
    sa, sb = g.shape(a), g.shape(b)
    a2 = g.reshape(a, [1, sa[0]]) if len(sa) == 1 else a
    b2 = g.reshape(b, [sb[0], 1]) if len(sb) == 1 else b
    batch = _broadcast(g.shape(a2)[:-2], g.shape(b2)[:-2])
    gy2 = g.reshape(gy, batch + [g.shape(a2)[-2], g.shape(b2)[-1]])
    ga = gb = None
    if g.needs(0):
        t = _mm(g, gy2, _swap_last(g, b2))
        ga = g.unbroadcast(t, g.shape(a2))
        ga = g.reshape(ga, sa)
    if g.needs(1):
        t = _mm(g, _swap_last(g, a2), gy2)
        gb = g.unbroadcast(t, g.shape(b2))
        gb = g.reshape(gb, sb)
    return [ga, gb]


@grad_rule("Gemm")
def gemm(g, op):
    a, b, gy = g.x(0), g.x(1), g.gy()
    ta, tb = int(op.attrs.get("transA", 0)), int(op.attrs.get("transB", 0))
    alpha, beta = float(op.attrs.get("alpha", 1.0)), float(op.attrs.get("beta", 1.0))
    grads = [None] * len(op.inputs)
    if g.needs(0):      # op(A)' = alpha * dY @ op(B)^T
        bt = b if tb else g.transpose(b, [1, 0])
        t = g.scale(_mm(g, gy, bt), alpha)
        grads[0] = g.transpose(t, [1, 0]) if ta else t
    if g.needs(1):      # op(B)' = alpha * op(A)^T @ dY
        at = a if ta else g.transpose(a, [1, 0])
        t = g.scale(_mm(g, at, gy), alpha)
        grads[1] = g.transpose(t, [1, 0]) if tb else t
    if len(op.inputs) > 2 and op.inputs[2] and g.needs(2):
        grads[2] = g.unbroadcast(g.scale(gy, beta), g.shape(g.x(2)))
    return grads


@grad_rule("Einsum", "Det")
def generic_linalg(g, op):
    return [g.vjp(i) if g.needs(i) else None for i in range(len(op.inputs))]
