"""Pattern passes that fuse decomposed activations and normalisations into single ops.

- ``gelu_pattern``: ``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` (tanh GELU, as
  exporters decompose it) -> ``ai.graphcore::Gelu`` (PopART's op, tanh approximation; lowered to
  ``popnn.nonLinearity(GELU)``);
- ``erf_gelu_pattern``: ``0.5 * x * (1 + Erf(x / sqrt(2)))`` -> ``ai.graphcore::GeluErf`` (the exact
  form; ``popnn.nonLinearity(GELU_ERF)``);
- ``layer_norm_pattern``: ``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta`` over
  the last axis -> ``LayerNormalization`` (ai.onnx opset >= 17) or ``ai.graphcore::LayerNorm``
  (older opsets), lowered to ``popnn.ln``.

The product orders and constant forms that exporters produce are accepted (``Mul``/``Div`` by a
constant, ``Pow(x, 3)`` or ``x * x * x``, ``Pow(d, 2)`` or ``d * d``). Constants must match to 1e-3
relative. The fused node takes the name of the pattern's output; the orphaned nodes are pruned.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from openipu.poprt.passes.base import GraphView, Pass, attr, ensure_domain, opset_of, prune_unused, register, remove_nodes

GC = "ai.graphcore"


def _close(v, want, rel=1e-3) -> bool:
    return v is not None and abs(v - want) <= rel * abs(want)


def _other(node, name):
    """The input of binary ``node`` that is not ``name`` (None if both or neither are)."""
    a, b = node.input[0], node.input[1]
    if a == name and b != name:
        return b
    if b == name and a != name:
        return a
    return None


def _scaled(gv: GraphView, name: str):
    """``(x, c)`` when ``name`` = ``x * c`` or ``x / (1/c)`` with ``c`` a scalar constant, else None."""
    n = gv.prod(name, ("Mul", "Div"))
    if n is None:
        return None
    for i, j in ((0, 1), (1, 0)):
        if n.op_type == "Div" and i == 1:
            break
        c = gv.scalar(n.input[j])
        if c is not None:
            return n.input[i], (c if n.op_type == "Mul" else 1.0 / c if c else None)
    return None


def _half_x_tail(gv: GraphView, a: str):
    """Match ``0.5 * x * a`` downstream of ``a`` (``a`` = ``1 + f(x)``). Returns ``(x, out_node)``
    with ``x`` unknown yet (the caller checks it), trying the orders exporters produce."""
    m1 = gv.single_consumer(a)
    if m1 is None or m1.op_type != "Mul":
        return None
    o = _other(m1, a)
    if o is None:
        return None
    c = gv.scalar(o)
    if c is not None:                          # (a * 0.5) * x
        if not _close(c, 0.5):
            return None
        m2 = gv.single_consumer(m1.output[0])
        if m2 is None or m2.op_type != "Mul":
            return None
        return [(_other(m2, m1.output[0]), m2)]
    cands = []
    s = _scaled(gv, o)                         # (x * 0.5) * a
    if s is not None and _close(s[1], 0.5):
        cands.append((s[0], m1))
    m2 = gv.single_consumer(m1.output[0])      # (x * a) * 0.5
    if m2 is not None and m2.op_type in ("Mul", "Div"):
        k = _other(m2, m1.output[0])
        c2 = gv.scalar(k) if k else None
        if c2 is not None and _close(c2 if m2.op_type == "Mul" else 1.0 / c2, 0.5):
            cands.append((o, m2))
    return cands


def _one_plus(gv: GraphView, t: str):
    """The ``Add(t, 1)`` consumer of ``t`` (its output name), else None."""
    a = gv.single_consumer(t)
    if a is None or a.op_type != "Add" or a.domain not in ("", "ai.onnx"):
        return None
    o = _other(a, t)
    if o is None or not _close(gv.scalar(o), 1.0):
        return None
    return a.output[0]


def _fuse(model, gv, out_node, new_node, done):
    remove_nodes(model.graph, [out_node], [(new_node, out_node)])
    gv.refresh()
    done.append(new_node.output[0])


class _GeluPattern(Pass):
    """Fuse ``0.5 * x * (1 + f(x))`` into ``ai.graphcore::<fused>(x)``, anchored at each node of
    type ``anchor`` (the ``Tanh`` / ``Erf`` of ``f``): :meth:`x_of` matches the anchor's input
    (``f``'s argument as a function of ``x``), the shared tail matches ``1 + f`` and the
    ``0.5 * x`` product in the orders exporters produce (:func:`_half_x_tail`)."""

    anchor = ""
    fused = ""

    def x_of(self, gv: GraphView, node) -> str | None:
        """The ``x`` whose GELU the anchor ``node`` computes, or None when its input does not match."""
        raise NotImplementedError

    def run(self, model):
        gv = GraphView(model.graph)
        for name in [n.output[0] for n in model.graph.node if n.op_type == self.anchor]:
            node = gv.producer.get(name)
            x = self.x_of(gv, node)
            a = _one_plus(gv, node.output[0]) if x else None
            for xx, out in (_half_x_tail(gv, a) or []) if a else []:
                if xx == x:
                    fused = onnx.helper.make_node(self.fused, [x], [out.output[0]],
                                                  name=gv.fresh(f"{self.fused}_{out.output[0]}"), domain=GC)
                    _fuse(model, gv, out, fused, self.applied)
                    break
        if self.applied:
            ensure_domain(model, GC)
            prune_unused(model.graph)
        return model


@register("gelu_pattern")
class GeluPattern(_GeluPattern):
    """Fuse the tanh-approximation GELU subgraph into ``ai.graphcore::Gelu``."""

    anchor, fused = "Tanh", "Gelu"

    def x_of(self, gv, tanh):
        """``x`` of ``Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))``."""
        s = _scaled(gv, tanh.input[0])
        if s is None or not _close(s[1], math.sqrt(2 / math.pi)):
            return None
        inner = gv.prod(s[0], "Add")
        if inner is None:
            return None
        x = None
        for i, j in ((0, 1), (1, 0)):
            cube = _scaled(gv, inner.input[j])
            if cube is not None and _close(cube[1], 0.044715) and _is_cube(gv, cube[0], inner.input[i]):
                x = inner.input[i]
        return x


def _is_cube(gv, c, x) -> bool:
    p = gv.prod(c, "Pow")
    if p is not None:
        return p.input[0] == x and _close(gv.scalar(p.input[1]), 3.0)
    m = gv.prod(c, "Mul")
    if m is None:
        return False
    for i, j in ((0, 1), (1, 0)):
        if m.input[i] == x:
            sq = gv.prod(m.input[j], ("Mul", "Pow"))
            if sq is not None and ((sq.op_type == "Mul" and list(sq.input) == [x, x]) or
                                   (sq.op_type == "Pow" and sq.input[0] == x and _close(gv.scalar(sq.input[1]), 2.0))):
                return True
    return False


@register("erf_gelu_pattern")
class ErfGeluPattern(_GeluPattern):
    """Fuse the erf GELU subgraph (``0.5 x (1 + erf(x / sqrt 2))``) into ``ai.graphcore::GeluErf``."""

    anchor, fused = "Erf", "GeluErf"

    def x_of(self, gv, erf):
        """``x`` of ``Erf(x / sqrt(2))``."""
        s = _scaled(gv, erf.input[0])
        return s[0] if s is not None and _close(s[1], 1 / math.sqrt(2)) else None


def _reduce_axes(gv, node):
    axes = attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        v = gv.const(node.input[1])
        axes = None if v is None else [int(a) for a in np.asarray(v).reshape(-1)]
    return axes


@register("layer_norm_pattern")
class LayerNormPattern(Pass):
    """Fuse a decomposed layer normalisation over the last axis into one ``LayerNormalization``."""

    def run(self, model):
        gv = GraphView(model.graph)
        new_op = opset_of(model) >= 17
        for name in [n.output[0] for n in model.graph.node if n.op_type == "Sqrt"]:
            sqrt = gv.producer.get(name)
            add = gv.prod(sqrt.input[0], "Add")
            if add is None:
                continue
            var, eps = None, None
            for i, j in ((0, 1), (1, 0)):
                e = gv.scalar(add.input[j])
                if e is not None and gv.prod(add.input[i], "ReduceMean") is not None:
                    var, eps = gv.prod(add.input[i], "ReduceMean"), e
            if var is None or _reduce_axes(gv, var) != [-1] or attr(var, "keepdims", 1) != 1:
                continue
            sq = gv.prod(var.input[0], ("Pow", "Mul"))
            if sq is None:
                continue
            if sq.op_type == "Pow" and not _close(gv.scalar(sq.input[1]), 2.0):
                continue
            if sq.op_type == "Mul" and sq.input[0] != sq.input[1]:
                continue
            d = sq.input[0]
            sub = gv.prod(d, "Sub")
            if sub is None:
                continue
            mean = gv.prod(sub.input[1], "ReduceMean")
            x = sub.input[0]
            if mean is None or mean.input[0] != x or _reduce_axes(gv, mean) != [-1] or attr(mean, "keepdims", 1) != 1:
                continue
            div = gv.single_consumer(sqrt.output[0])
            if div is None or div.op_type != "Div" or list(div.input) != [d, sqrt.output[0]]:
                continue
            out, gamma, beta = div, None, None
            m = gv.single_consumer(div.output[0])
            if m is not None and m.op_type == "Mul":
                g = _other(m, div.output[0])
                if g is not None and gv.const(g) is not None:
                    out, gamma = m, g
            b = gv.single_consumer(out.output[0])
            if b is not None and b.op_type == "Add":
                bb = _other(b, out.output[0])
                if bb is not None and gv.const(bb) is not None:
                    out, beta = b, bb
            gval = gv.const(gamma) if gamma else None
            width = None
            for v in (gval, gv.const(beta) if beta else None):
                if v is not None and v.size > 1:
                    width = v.size
            if width is None:
                continue       # the channel count is needed for gamma/beta of ones/zeros
            dt = (gval if gval is not None else gv.const(beta)).dtype
            gamma = gamma if gamma and gval.size == width else gv.add_init("ln_gamma", np.full(width, 1 if gval is None else float(gval.reshape(-1)[0]), dt))
            beta = beta if beta and gv.const(beta).size == width else gv.add_init(
                "ln_beta", np.full(width, 0 if not beta else float(gv.const(beta).reshape(-1)[0]), dt))
            ins = [x, gamma, beta]
            if new_op:
                node = onnx.helper.make_node("LayerNormalization", ins, [out.output[0]], name=gv.fresh(f"LayerNorm_{out.output[0]}"),
                                             axis=-1, epsilon=float(eps))
            else:
                node = onnx.helper.make_node("LayerNorm", ins, [out.output[0]], name=gv.fresh(f"LayerNorm_{out.output[0]}"),
                                             domain=GC, axis=-1, epsilon=float(eps))
            _fuse(model, gv, out, node, self.applied)
        if self.applied:
            if not new_op:
                ensure_domain(model, GC)
            prune_unused(model.graph)
        return model
