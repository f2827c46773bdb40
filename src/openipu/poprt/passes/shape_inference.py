"""``poprt.passes.shape_inference``: ONNX shape and type inference that tolerates the
``ai.graphcore`` ops PopRT's passes insert.

:func:`infer_shapes` runs ONNX's inference in non-strict mode (ops it has no schema for, such as
``ai.graphcore::AttentionMask`` or ``FusedAttention``, are skipped instead of failing); their
outputs then get the type and shape of a registered shape function (:func:`register_shape_func`),
or stay unannotated. The ``shape_inference`` pass does the same inside the converter.

Source: PopRT 1.4 user guide, "Python API" (``shape_inference`` pass; ``ShapeFunc``,
``register_shape_func``); Byte MLPerf's ``deberta_pack`` pass calls ``infer_shapes(model) ->
model`` on a model holding ``ai.graphcore`` nodes.
"""

from __future__ import annotations

import logging

import onnx

from openipu.poprt.passes.base import Pass, register

_log = logging.getLogger("poprt.passes.shape_inference")

#: ``(domain, op_type) -> fn(node, types: {name: (elem_type, shape)}) -> [(elem_type, shape)]``
_SHAPE_FUNCS: dict = {}


def register_shape_func(op_type: str, domain: str = "ai.graphcore"):
    """Decorator: ``fn(node, known) -> [(elem_type, shape or None), ...]`` gives the outputs of
    ``domain::op_type`` nodes, where ``known`` maps tensor names to ``(elem_type, shape)``."""
    def deco(fn):
        _SHAPE_FUNCS[(domain, op_type)] = fn
        return fn
    return deco


def _same_as_input(k: int):
    def fn(node, known):
        return [known.get(node.input[k], (0, None))] if len(node.input) > k else [(0, None)]
    return fn


# ops that keep the type and shape of an input (the scores for AttentionMask, q for FusedAttention)
for _op, _k in (("AttentionMask", 1), ("Gelu", 0), ("GeluErf", 0), ("FastNorm", 0), ("Remap", 0)):
    register_shape_func(_op)(_same_as_input(_k))


def _known(graph: onnx.GraphProto) -> dict:
    out = {}
    for t in graph.initializer:
        out[t.name] = (t.data_type, list(t.dims))
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim] if tt.HasField("shape") else None
        if tt.elem_type:
            out[vi.name] = (tt.elem_type, shape)
    return out


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with ``value_info`` filled by ONNX shape inference (non-strict, with
    shape data propagated through ``Shape`` / ``Gather`` / ``Concat`` ..., so computed ``Reshape``
    targets give static shapes), plus
    registered shape functions for ``ai.graphcore`` ops.

    Args:
        model: an ``onnx.ModelProto`` (not modified).
    Returns:
        The annotated model; when ONNX's inference fails outright, an unannotated copy (and a
        warning in the ``poprt.passes.shape_inference`` log).
    """
    try:
        out = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - ONNX raises several kinds; the model stays usable
        _log.warning("shape inference failed: %s", str(e).splitlines()[0] if str(e) else type(e).__name__)
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    g = out.graph
    for _ in range(4):                      # custom ops feeding custom ops: a few rounds
        known = _known(g)
        added = False
        for n in g.node:
            fn = _SHAPE_FUNCS.get((n.domain, n.op_type))
            if fn is None:
                continue
            for name, (et, shape) in zip(n.output, fn(n, known)):
                if name and name not in known and et:
                    g.value_info.append(onnx.helper.make_tensor_value_info(name, et, shape))
                    added = True
        if not added:
            break
        try:
            out = onnx.shape_inference.infer_shapes(out, check_type=False, strict_mode=False, data_prop=True)
            g = out.graph
        except Exception:  # noqa: BLE001
            break
    return out


@register("shape_inference")
class ShapeInference(Pass):
    """The ``shape_inference`` pass: :func:`infer_shapes` on the model."""

    def run(self, model):
        return infer_shapes(model)


__all__ = ["ShapeInference", "infer_shapes", "register_shape_func"]
