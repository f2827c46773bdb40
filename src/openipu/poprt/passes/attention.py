"""Attention passes: ``pre_scale``, ``fused_attention``, ``insert_attention_mask``, ``attention_padding``.

``ai.graphcore::FusedAttention(q, k_t, v[, bias])`` (the fused op these passes produce, kernel in
:mod:`openipu.popart.onnx_ops.fused_attention`, lowering in :mod:`openipu.popart.lowering.fused`)
computes ``softmax(scale * q @ k_t + bias, axis=-1) @ v`` with shapes ``q[..., Sq, D]``,
``k_t[..., D, Skv]``, ``v[..., Skv, Dv]``, ``bias`` broadcastable to ``[..., Sq, Skv]``; attributes
``scale`` (float, default 1) and ``nan_to_zero`` (int, default 0: rows whose scores are all
``-inf`` give 0 instead of NaN, the guard PyTorch's exporter adds after the softmax).
"""

from __future__ import annotations

import numpy as np
import onnx

from openipu.poprt.passes.base import GraphView, Pass, attr, ensure_domain, opset_of, prune_unused, register, remove_nodes
from openipu.poprt.passes.patterns import GC, _other, _scaled


def _shapes(model) -> dict[str, list]:
    """Static shapes of the model's tensors by ONNX shape inference (unknown ones left out)."""
    try:
        inf = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - a model shape inference cannot follow: no shapes
        return {}
    out = {}
    for vi in list(inf.graph.value_info) + list(inf.graph.input) + list(inf.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = [d.dim_value for d in tt.shape.dim]
    for t in model.graph.initializer:
        out[t.name] = list(t.dims)
    return out


@register("pre_scale")
class PreScale(Pass):
    """Move scalar scales of a ``MatMul`` onto its smaller operand (the attention scale onto Q
    instead of the ``Sq x Skv`` scores): ``MatMul(a*s1, b*s2) -> MatMul(a*(s1*s2), b)`` and
    ``MatMul(a, b) * c -> MatMul(a*c, b)`` when ``a`` has fewer elements than the product."""

    def run(self, model):
        gv = GraphView(model.graph)
        shapes = _shapes(model)
        for name in [n.output[0] for n in model.graph.node if n.op_type == "MatMul" and n.domain in ("", "ai.onnx")]:
            mm = gv.producer.get(name)
            if mm is None or mm.op_type != "MatMul":
                continue
            sa, sb = _scaled(gv, mm.input[0]), _scaled(gv, mm.input[1])
            if sa is not None and sb is not None and gv.single_consumer(mm.input[1]) is mm:
                c = gv.add_init("pre_scale", np.array(sa[1] * sb[1], _dtype(gv, mm.input[0], shapes, model)))
                node = onnx.helper.make_node("Mul", [sa[0], c], [gv.fresh(mm.input[0] + "_prescaled")], name=gv.fresh("PreScale"))
                mm.input[0], mm.input[1] = node.output[0], sb[0]
                remove_nodes(model.graph, [], [(node, mm)])
                gv.refresh()
                self.applied.append(mm.output[0])
                continue
            out = gv.single_consumer(mm.output[0])
            if out is None or out.op_type not in ("Mul", "Div"):
                continue
            k = _other(out, mm.output[0])
            c = gv.scalar(k) if k else None
            if c is None or (out.op_type == "Div" and out.input[0] != mm.output[0]) or c == 0:
                continue
            a, y = shapes.get(mm.input[0]), shapes.get(out.output[0])
            if a is None or y is None or int(np.prod(a)) >= int(np.prod(y)):
                continue
            scale = c if out.op_type == "Mul" else 1.0 / c
            cn = gv.add_init("pre_scale", np.array(scale, _dtype(gv, mm.input[0], shapes, model)))
            node = onnx.helper.make_node("Mul", [mm.input[0], cn], [gv.fresh(mm.input[0] + "_prescaled")], name=gv.fresh("PreScale"))
            new_mm = onnx.helper.make_node("MatMul", [node.output[0], mm.input[1]], [out.output[0]], name=mm.name)
            remove_nodes(model.graph, [mm, out], [(node, out), (new_mm, out)])
            gv.refresh()
            self.applied.append(out.output[0])
        if self.applied:
            prune_unused(model.graph)
        return model


def _dtype(gv, name, shapes, model):
    for vi in list(model.graph.input) + list(model.graph.value_info):
        if vi.name == name:
            return onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    try:
        inf = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        for vi in inf.graph.value_info:
            if vi.name == name:
                return onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    except Exception:  # noqa: BLE001
        pass
    return np.float32


@register("fused_attention")
class FusedAttention(Pass):
    """Fuse ``MatMul(q, k_t) [* scale] [+ bias] -> Softmax(-1) [-> NaN guard] -> MatMul(., v)`` into one
    ``ai.graphcore::FusedAttention``; scalar scales on ``q`` / ``k_t`` are absorbed into ``scale``."""

    def run(self, model):
        gv = GraphView(model.graph)
        op13 = opset_of(model) >= 13
        for name in [n.output[0] for n in model.graph.node if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]:
            sm = gv.producer.get(name)
            if attr(sm, "axis", -1 if op13 else 1) != -1:
                continue
            m = self._match(gv, sm)
            if m is None:
                continue
            q, kt, v, bias, scale, guard, pv = m
            for which in ("q", "kt"):
                name = q if which == "q" else kt
                s = _scaled(gv, name)
                if s is not None and gv.single_consumer(name) is not None:
                    scale *= s[1]
                    if which == "q":
                        q = s[0]
                    else:
                        kt = s[0]
            ins = [q, kt, v] + ([bias] if bias else [])
            node = onnx.helper.make_node("FusedAttention", ins, [pv.output[0]], name=gv.fresh(f"FusedAttention_{pv.output[0]}"),
                                         domain=GC, scale=float(scale), nan_to_zero=int(guard))
            remove_nodes(model.graph, [pv], [(node, pv)])
            gv.refresh()
            self.applied.append(pv.output[0])
        if self.applied:
            ensure_domain(model, GC)
            prune_unused(model.graph)
        return model

    @staticmethod
    def _scores(gv, name):
        """``(q, k_t, scale)`` when ``name`` = ``MatMul(q, k_t)`` optionally times a scalar."""
        scale = 1.0
        s = _scaled(gv, name)
        if s is not None and gv.prod(s[0], "MatMul") is not None:
            name, scale = s
        mm = gv.prod(name, "MatMul")
        if mm is None or gv.single_consumer(name) is None:
            return None
        return mm.input[0], mm.input[1], scale

    def _match(self, gv, sm):
        x = sm.input[0]
        bias = None
        sc = self._scores(gv, x)
        if sc is None:
            add = gv.prod(x, "Add")
            if add is None or gv.single_consumer(x) is not sm:
                return None
            for i, j in ((0, 1), (1, 0)):
                sc = self._scores(gv, add.input[i])
                if sc is not None:
                    bias = add.input[j]
                    break
            if sc is None:
                return None
        p = sm.output[0]
        guard = False
        cs = gv.consumers.get(p, [])
        if len(cs) == 2 and p not in gv.outputs:
            isnan = next((c for c in cs if c.op_type == "IsNaN"), None)
            where = next((c for c in cs if c.op_type == "Where"), None)
            if isnan is None or where is None or where.input[0] != isnan.output[0] or where.input[2] != p or gv.scalar(where.input[1]) != 0.0:
                return None
            p, guard = where.output[0], True
        pv = gv.single_consumer(p)
        if pv is None or pv.op_type != "MatMul" or pv.input[0] != p:
            return None
        q, kt, scale = sc
        return q, kt, pv.input[1], bias, scale, guard, pv


@register("insert_attention_mask")
class InsertAttentionMask(Pass):
    """Give attention the mask of packed sequences (``FusedAttention`` nodes, and attention left
    as ops: a ``Softmax(Add(scores, bias))`` whose bias comes from the mask input alone), from a 2-D ``[B, S]`` integer
    graph input (``mask_input``, default the input whose name contains ``mask``) that holds, per
    row, a segment number for each token: ``1`` for the tokens of the first sequence packed into
    the row, ``2`` for the second, ..., ``0`` for padding (a plain 0/1 padding mask is the case of
    one sequence per row). PopRT's packed-BERT mode (``PackRunnerConfig.enable_input_single_row_mode``)
    fills the mask this way, so sequences packed into one row cannot attend to each other.

    The additive bias ``[B, 1, S, S]`` is ``0`` where key ``j`` is a token (``m[j] != 0``) of the
    query's sequence (``m[i] == m[j]``, or any token when query ``i`` is padding, as BERT's own
    padding mask does), else ``-10000``. It is appended to fused attention without a mask, and
    replaces the mask a model already has when that mask is computed from the mask input alone
    (e.g. the ``Where(mask, 0, -inf)`` of PyTorch's exporter); ``replace_existing=False`` keeps
    those. ``Pass.applied`` lists the outputs of the attention nodes given the mask.
    """

    def run(self, model):
        name = self.kwargs.get("mask_input")
        inputs = {i.name: i for i in model.graph.input}
        if name is None:
            name = next((n for n in inputs if "mask" in n.lower()), None)
        if name is None or name not in inputs:
            return model
        gv = GraphView(model.graph)
        fused = [n for n in model.graph.node if n.op_type == "FusedAttention" and n.domain == GC]
        replace = bool(self.kwargs.get("replace_existing", True))
        graph_inputs = set(inputs) - set(gv.inits)
        targets = [n for n in fused if len(n.input) == 3
                   or (replace and _input_ancestors(gv, n.input[3], graph_inputs) == {name})]
        # attention left as ops (PopRT's own pattern): Softmax(Add(scores, bias)) where the bias
        # is computed from the mask input alone (BERT's (1 - mask) * -10000)
        unfused = []
        if replace:
            for sm in (n for n in model.graph.node if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")):
                add = gv.prod(sm.input[0], "Add")
                if add is None:
                    continue
                for k in (0, 1):
                    if _input_ancestors(gv, add.input[k], graph_inputs) == {name} and \
                            _input_ancestors(gv, add.input[1 - k], graph_inputs) - {name}:
                        unfused.append((add, k))
                        break
        if not targets and not unfused:
            return model
        shapes = _shapes(model)
        dt = _dtype(gv, targets[0].input[0] if targets else unfused[0][0].input[1 - unfused[0][1]], shapes, model)
        m = gv.fresh(name + "_segments")
        zero_i = gv.add_init("mask_zero", np.array(0, np.int32))
        if opset_of(model) >= 13:           # Unsqueeze takes its axes as an input from opset 13
            ax_q, ax_k, ax_h = (gv.add_init("mask_axes", np.array(a, np.int64)) for a in ([2], [1], [1]))

            def unsqueeze(x, axes, y):
                return onnx.helper.make_node("Unsqueeze", [x, axes], [y])
        else:
            ax_q, ax_k, ax_h = [2], [1], [1]

            def unsqueeze(x, axes, y):
                return onnx.helper.make_node("Unsqueeze", [x], [y], axes=axes)
        zero_f = gv.add_init("mask_bias_zero", np.array(0.0, dt))
        neg = gv.add_init("mask_bias_neg", np.array(-10000.0, dt))
        mi, mk = gv.fresh(name + "_q"), gv.fresh(name + "_k")
        same, qpad, kpad, kval, qok, ok = (gv.fresh(name + s) for s in ("_same", "_qpad", "_kpad", "_kvalid", "_qok", "_ok"))
        b3, b4 = gv.fresh(name + "_bias3d"), gv.fresh(name + "_bias4d")
        mk_node = onnx.helper.make_node
        nodes = [mk_node("Cast", [name], [m], to=onnx.TensorProto.INT32),
                 unsqueeze(m, ax_q, mi),                                 # [B, S, 1]: the query's segment
                 unsqueeze(m, ax_k, mk),                                 # [B, 1, S]: the key's segment
                 mk_node("Equal", [mi, mk], [same]), mk_node("Equal", [mi, zero_i], [qpad]),
                 mk_node("Equal", [mk, zero_i], [kpad]), mk_node("Not", [kpad], [kval]),
                 mk_node("Or", [same, qpad], [qok]), mk_node("And", [qok, kval], [ok]),
                 mk_node("Where", [ok, zero_f, neg], [b3]), unsqueeze(b3, ax_h, b4)]
        for n in targets:
            if len(n.input) == 3:
                n.input.append(b4)
            else:
                n.input[3] = b4
            self.applied.append(n.output[0])
        for add, k in unfused:
            add.input[k] = b4
            self.applied.append(add.output[0])
        first = min((targets[0:1] + [a for a, _k in unfused]), key=lambda n: _index(model.graph, n))
        remove_nodes(model.graph, [], [(x, first) for x in nodes])
        prune_unused(model.graph)
        return model


def _index(graph, node) -> int:
    return next(i for i, n in enumerate(graph.node) if n is node)


def _input_ancestors(gv: GraphView, name: str, graph_inputs: set) -> set:
    """The graph inputs whose values ``name`` is computed from (initializers and constants are not
    inputs; a ``Shape`` / ``Size`` reads only its input's static shape, not its values)."""
    seen, todo, found = set(), [name], set()
    while todo:
        t = todo.pop()
        if t in seen or not t:
            continue
        seen.add(t)
        if t in graph_inputs:
            found.add(t)
            continue
        node = gv.producer.get(t)
        if node is not None and node.op_type not in ("Shape", "Size"):
            todo.extend(node.input)
    return found


@register("attention_padding")
class AttentionPadding(Pass):
    """Pad the key/value sequence of ``FusedAttention`` to a multiple of ``pad_to`` (default 16,
    the AMP's input-channel group in fp16) with zero keys that the bias masks out (``-10000``), so
    the fused kernel runs on aligned blocks; the result is unchanged."""

    def run(self, model):
        pad_to = int(self.kwargs.get("pad_to", 16))
        gv = GraphView(model.graph)
        shapes = _shapes(model)
        for name in [n.output[0] for n in model.graph.node if n.op_type == "FusedAttention" and n.domain == GC]:
            n = gv.producer[name]
            kt, v = shapes.get(n.input[1]), shapes.get(n.input[2])
            if kt is None or v is None:
                continue
            s = kt[-1]
            p = -s % pad_to
            if p == 0:
                continue
            dt = _dtype(gv, n.input[0], shapes, model)
            zero = gv.add_init("attn_pad_zero", np.array(0, dt))
            rk = len(kt)
            pk = gv.add_init("attn_pad_k", np.array([0] * rk + [0] * (rk - 1) + [p], np.int64))
            pv_ = gv.add_init("attn_pad_v", np.array([0] * len(v) + [0] * (len(v) - 2) + [p, 0], np.int64))
            bias = np.zeros([1] * (rk - 1) + [s + p], dt)
            bias[..., s:] = -10000
            nodes = []
            ktp, vp = gv.fresh(n.input[1] + "_padded"), gv.fresh(n.input[2] + "_padded")
            nodes.append(onnx.helper.make_node("Pad", [n.input[1], pk, zero], [ktp]))
            nodes.append(onnx.helper.make_node("Pad", [n.input[2], pv_, zero], [vp]))
            mb = gv.add_init("attn_pad_bias", bias)
            if len(n.input) > 3:
                ob = shapes.get(n.input[3])
                if ob is None:
                    continue
                pb = gv.add_init("attn_pad_b", np.array([0] * len(ob) + [0] * (len(ob) - 1) + [p if ob[-1] == s else 0], np.int64))
                bp, bsum = gv.fresh(n.input[3] + "_padded"), gv.fresh(n.input[3] + "_masked")
                nodes.append(onnx.helper.make_node("Pad", [n.input[3], pb, zero], [bp]))
                nodes.append(onnx.helper.make_node("Add", [bp, mb], [bsum]))
                n.input[3] = bsum
            else:
                n.input.append(mb)
            n.input[1], n.input[2] = ktp, vp
            remove_nodes(model.graph, [], [(x, n) for x in nodes])
            gv.refresh()
            self.applied.append(n.output[0])
        return model
