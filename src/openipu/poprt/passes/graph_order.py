"""Passes on the graph's interface and order: ``sort_graph`` and ``remove_input_cast``.

- ``sort_graph``: the nodes of each graph in topological order
  (:func:`openipu.poprt.passes.onnx_helper.topological_sort`).
- ``remove_input_cast``: a graph input read only by ``Cast`` nodes to one type takes that type
  itself (the host sends the cast values); the Casts go and their readers read the input.

Source: PopRT 1.4 user guide, "Python API", built-in passes (``sort_graph``,
``remove_input_cast``); Byte MLPerf's roformer config lists ``remove_input_cast``.
"""

from __future__ import annotations

import onnx

from openipu.poprt.passes.base import GraphView, Pass, register, remove_nodes, replace_repeated
from openipu.poprt.passes.onnx_helper import topological_sort


@register("sort_graph")
class SortGraph(Pass):
    """Sort every graph's nodes topologically (subgraphs too)."""

    def run(self, model):
        def sort(g, _main):
            replace_repeated(g.node, topological_sort(g))
            return g
        self.traverse_graph(model.graph, sort)
        return model


@register("remove_input_cast")
class RemoveInputCast(Pass):
    """Fold the ``Cast`` of a graph input into the input's type; ``applied`` lists the inputs."""

    def run(self, model):
        g = model.graph
        gv = GraphView(g)
        outputs = {o.name for o in g.output}
        dead = []
        for vi in g.input:
            if vi.name in gv.inits or vi.name in outputs:
                continue
            users = gv.consumers.get(vi.name, [])
            if not users or any(n.op_type != "Cast" or n.domain not in ("", "ai.onnx") for n in users):
                continue
            tos = {onnx.helper.get_attribute_value(a) for n in users for a in n.attribute if a.name == "to"}
            if len(tos) != 1 or any(c in outputs for n in users for c in n.output):
                continue
            (to,) = tos
            vi.type.tensor_type.elem_type = int(to)
            for n in users:
                for r in gv.consumers.get(n.output[0], []):
                    for k, x in enumerate(r.input):
                        if x == n.output[0]:
                            r.input[k] = vi.name
                dead.append(n)
            self.applied.append(vi.name)
        if dead:
            remove_nodes(g, dead)
        return model


__all__ = ["RemoveInputCast", "SortGraph"]
