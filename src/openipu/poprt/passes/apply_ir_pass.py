"""``apply_ir_pass`` and ``unique_name_for_nodes``.

``ApplyIrPass(passes=[...])`` runs passes of PopRT's compiler IR by name on the model. On the
simulator the model's IR is PopART's, built when compiling, so the names are handled here:

- ``unique_name_for_nodes`` (also a pass of its own): every node gets a non-empty name unique in
  the model (unnamed nodes ``<OpType>_<k>``; a repeated name gets ``_<k>`` appended);
- any other registered pass name runs that pass;
- other names (IR-only passes) are accepted and do nothing; each logs so once.

Source: PopRT 1.4 user guide, "Python API", built-in passes (``apply_ir_pass``,
``unique_name_for_nodes``; ``ApplyIrPass(passes=[])``); Byte MLPerf's ``custom_final_check`` calls
``ApplyIrPass(["unique_name_for_nodes"])(model) -> model``.
"""

from __future__ import annotations

import logging

import onnx

from openipu.poprt.passes.base import Pass, register

_log = logging.getLogger("poprt.passes.apply_ir_pass")
_LOGGED: set = set()


def _graphs(g: onnx.GraphProto):
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for s in a.graphs:
                    yield from _graphs(s)


@register("unique_name_for_nodes")
class UniqueNameForNodes(Pass):
    """Give every node of the model (subgraphs too) a non-empty, unique name; ``applied`` lists
    the new names."""

    def run(self, model: onnx.ModelProto) -> onnx.ModelProto:
        nodes = [n for g in _graphs(model.graph) for n in g.node]
        taken = {n.name for n in nodes if n.name}
        seen: set = set()
        for n in nodes:
            if n.name and n.name not in seen:
                seen.add(n.name)
                continue
            stem = n.name or n.op_type
            k = 0
            name = f"{stem}_{k}"
            while name in taken:
                k += 1
                name = f"{stem}_{k}"
            n.name = name
            taken.add(name)
            seen.add(name)
            self.applied.append(name)
        return model


@register("apply_ir_pass")
class ApplyIrPass(Pass):
    """``ApplyIrPass(passes=[names])(model)``: run those passes in order (see the module docstring).

    Args:
        passes: list of pass names (or one comma-separated str).
    """

    def __init__(self, passes=(), *args, **kwargs):
        super().__init__(passes, *args, **kwargs)
        if isinstance(passes, str):
            passes = [p.strip() for p in passes.split(",") if p.strip()]
        self.passes = list(passes)

    def run(self, model: onnx.ModelProto) -> onnx.ModelProto:
        from openipu.poprt.passes.base import get_registered_passes
        known = get_registered_passes()
        for name in self.passes:
            if name in known and name != "apply_ir_pass":
                p = known[name]()
                model = p(model)
                self.applied.extend(f"{name}:{x}" for x in p.applied)
            elif name not in _LOGGED:
                _LOGGED.add(name)
                _log.info("apply_ir_pass: '%s' is a pass of PopRT's compiler IR; the simulator's compiler "
                          "(PopART's IR) has no such pass: accepted, no effect", name)
        return model


__all__ = ["ApplyIrPass", "UniqueNameForNodes"]
