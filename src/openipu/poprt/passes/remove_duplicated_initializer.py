"""``remove_duplicated_initializer``: initializers holding the same data become one.

Two initializers are duplicates when their element type, shape and bytes are equal. Every use of
a duplicate (node inputs of the graph and of its subgraphs, graph outputs) is renamed to the
first one, and the duplicate is dropped. Initializers that are also graph inputs (overridable
weights) are left alone.

Source: PopRT 1.4 user guide, "Python API", built-in passes (``remove_duplicated_initializer``);
Byte MLPerf's ``custom_final_check`` calls ``RemoveDuplicatedInitializer().run(model) -> model``.
"""

from __future__ import annotations

import hashlib

import onnx
from onnx import numpy_helper

from openipu.poprt.passes.base import Pass, register, replace_repeated


def _rename_uses(graph: onnx.GraphProto, rename: dict) -> None:
    for n in graph.node:
        for k, x in enumerate(n.input):
            if x in rename:
                n.input[k] = rename[x]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename_uses(a.g, rename)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _rename_uses(g, rename)


@register("remove_duplicated_initializer")
class RemoveDuplicatedInitializer(Pass):
    """Merge initializers with equal type, shape and data (``applied`` lists the removed names)."""

    def run(self, model: onnx.ModelProto) -> onnx.ModelProto:
        g = model.graph
        inputs = {vi.name for vi in g.input}
        first: dict[tuple, str] = {}
        rename: dict[str, str] = {}
        for t in g.initializer:
            if t.name in inputs:
                continue
            data = numpy_helper.to_array(t).tobytes()
            key = (t.data_type, tuple(t.dims), hashlib.sha256(data).hexdigest(), len(data))
            if key in first:
                rename[t.name] = first[key]
            else:
                first[key] = t.name
        if not rename:
            return model
        _rename_uses(g, rename)
        outs = [o for o in g.output if o.name in rename]
        for o in outs:                      # a graph output keeps its name: an Identity gives it
            g.node.append(onnx.helper.make_node("Identity", [rename[o.name]], [o.name],
                                                name=f"{o.name}_deduplicated"))
        replace_repeated(g.initializer, [t for t in g.initializer if t.name not in rename])
        self.applied.extend(sorted(rename))
        return model


__all__ = ["RemoveDuplicatedInitializer"]
