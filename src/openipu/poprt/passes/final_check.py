"""``final_check``: the converter's last pass, a check of the converted model's types and shapes.

It infers shapes (:func:`openipu.poprt.passes.onnx_helper.clean_info`) and logs a warning for
every tensor of every graph that has no known element type or shape, or a zero dimension. It
does not change or refuse the model (the compiler reports what it cannot handle).

The converter looks the pass up by name when it runs (``Pass.get_pass('final_check')``), so a
client that maps the name to its own class (Byte MLPerf's IPU backend replaces
``poprt.passes.base_pass.get_all_named_subclasses`` to do so) gets its class run instead.

Source: PopRT 1.4 user guide, "Python API", built-in passes (``final_check``); the shape of
Byte MLPerf's replacement (``CustomFinalCheck(ImmutablePass)``).
"""

from __future__ import annotations

import onnx

from openipu.poprt.passes.base import register
from openipu.poprt.passes.base_pass import ImmutablePass
from openipu.poprt.passes.onnx_helper import clean_info


@register("final_check")
class FinalCheck(ImmutablePass):
    """Warn about tensors without an inferred type or shape; ``applied`` lists them."""

    def check_graph(self, graph: onnx.GraphProto, is_main_graph: bool) -> onnx.GraphProto:
        produced = {o for n in graph.node for o in n.output if o}
        typed = set()
        for vi in list(graph.value_info) + list(graph.output):
            tt = vi.type.tensor_type
            shape = [d.dim_value for d in tt.shape.dim] if tt.HasField("shape") else None
            if not tt.elem_type or shape is None:
                continue
            typed.add(vi.name)
            if not onnx.TensorProto.FLOAT <= tt.elem_type <= onnx.TensorProto.BFLOAT16 or 0 in shape:
                self.logger.warning("%s has type %s and shape %s", vi.name, tt.elem_type, shape)
                self.applied.append(vi.name)
        for name in sorted(produced - typed):
            self.logger.warning("graph %s: tensor %s has no inferred type or shape", graph.name, name)
            self.applied.append(name)
        return graph

    def run(self, model: onnx.ModelProto) -> onnx.ModelProto:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        checked = clean_info(copy)
        self.traverse_graph(checked.graph, self.check_graph)
        return model


__all__ = ["FinalCheck"]
