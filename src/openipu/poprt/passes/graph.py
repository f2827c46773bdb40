"""Graph-interface passes: ``int64_to_int32`` and ``remove_initializer_from_input``.

- ``int64_to_int32``: the IPU has no 64-bit integers. Graph inputs and outputs of type int64
  become int32. Inside, each former int64 input is cast back to int64 (``Cast``) for the ops that
  need int64 (shape arithmetic), except index operands (``Gather``, ``GatherElements``,
  ``ScatterElements`` and ``OneHot`` indices; ``GatherND`` / ``ScatterND`` need int64), which read the int32 input directly (ONNX accepts
  int32 indices). Int64 graph outputs get a final ``Cast`` to int32. Int64 initializers that only
  serve as such indices and whose values fit are stored as int32.
- ``remove_initializer_from_input``: old exporters list every weight as a graph input too (IR < 4
  style); such inputs are dropped so the weights are constants, not run-time inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from openipu.poprt.passes.base import GraphView, Pass, register, remove_nodes, replace_repeated

#: (op_type, input index) pairs that accept int32 as well as int64
_INDEX_INPUTS = {("Gather", 1), ("GatherElements", 1), ("OneHot", 0), ("ScatterElements", 1)}


@register("int64_to_int32")
class Int64ToInt32(Pass):
    """Make the model's int64 inputs and outputs int32 (indices read the int32 values directly)."""

    def run(self, model):
        g = model.graph
        gv = GraphView(g)
        new_nodes = []
        first = g.node[0] if len(g.node) else None
        inits = {t.name for t in g.initializer}
        for vi in g.input:
            tt = vi.type.tensor_type
            if tt.elem_type != TensorProto.INT64 or vi.name in inits:
                continue
            tt.elem_type = TensorProto.INT32
            wide = None
            for n in gv.consumers.get(vi.name, []):
                for k, x in enumerate(n.input):
                    if x != vi.name or (n.op_type, k) in _INDEX_INPUTS and n.domain in ("", "ai.onnx"):
                        continue
                    if wide is None:
                        wide = gv.fresh(vi.name + "_int64")
                        new_nodes.append(onnx.helper.make_node("Cast", [vi.name], [wide], name=gv.fresh("Cast_" + wide),
                                                               to=TensorProto.INT64))
                    n.input[k] = wide
            for o in g.output:
                if o.name == vi.name:
                    break
            self.applied.append(vi.name)
        for i, t in enumerate(g.initializer):
            if t.data_type != TensorProto.INT64:
                continue
            users = [(n, k) for n in gv.consumers.get(t.name, []) for k, x in enumerate(n.input) if x == t.name]
            if not users or any((n.op_type, k) not in _INDEX_INPUTS for n, k in users):
                continue
            v = numpy_helper.to_array(t)
            if v.size and (v.min() < np.iinfo(np.int32).min or v.max() > np.iinfo(np.int32).max):
                continue
            g.initializer[i].CopyFrom(numpy_helper.from_array(v.astype(np.int32), t.name))
            self.applied.append(t.name)
        tail = []
        for o in g.output:
            tt = o.type.tensor_type
            if tt.elem_type != TensorProto.INT64:
                continue
            src = gv.fresh(o.name + "_int64")
            p = gv.producer.get(o.name)
            if p is None:          # an input passed through: already int32
                tt.elem_type = TensorProto.INT32
                continue
            for k, x in enumerate(p.output):
                if x == o.name:
                    p.output[k] = src
            for n in gv.consumers.get(o.name, []):
                for k, x in enumerate(n.input):
                    if x == o.name:
                        n.input[k] = src
            tt.elem_type = TensorProto.INT32
            tail.append(onnx.helper.make_node("Cast", [src], [o.name], name=gv.fresh("Cast_" + o.name), to=TensorProto.INT32))
            self.applied.append(o.name)
        if first is not None and new_nodes:
            remove_nodes(g, [], [(n, first) for n in new_nodes])
        g.node.extend(tail)
        if self.applied:
            del g.value_info[:]         # stale int64 annotations
        return model


@register("remove_initializer_from_input")
class RemoveInitializerFromInput(Pass):
    """Drop graph inputs that are also initializers (weights listed as inputs)."""

    def run(self, model):
        g = model.graph
        inits = {t.name for t in g.initializer}
        keep = [vi for vi in g.input if vi.name not in inits]
        self.applied = [vi.name for vi in g.input if vi.name in inits]
        if self.applied:
            if model.ir_version < 4:     # IR 4 is the first where initializers need not be inputs
                model.ir_version = 4
            replace_repeated(g.input, keep)
        return model


#: ops never folded: random values, and ops whose result is not a function of their inputs alone
_NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
            "If", "Loop", "Scan", "SequenceConstruct"}


@register("constant_folding")
class ConstantFolding(Pass):
    """Evaluate ai.onnx nodes whose inputs are all constants (initializers, ``Constant`` nodes or
    folded results) with onnx's reference evaluator and store the results as initializers, as
    PopRT's converter folds constants. ``max_tensor_size`` (bytes; ``-1``, the default: no limit)
    keeps results larger than it as nodes (PopRT's ``--max_tensor_size``), so a small constant
    that expands into a large one is computed on the IPU instead of stored. ``Pass.applied``
    lists the folded outputs."""

    def run(self, model):
        from onnx.reference import ReferenceEvaluator
        limit = int(self.kwargs.get("max_tensor_size", -1))
        g = model.graph
        gv = GraphView(g)
        known = {name: numpy_helper.to_array(t) for name, t in gv.inits.items()}
        inputs = {vi.name for vi in g.input} - set(known)
        outputs = {o.name for o in g.output}
        opset = [o for o in model.opset_import]
        folded, kept = {}, []
        for n in g.node:
            ins = [i for i in n.input if i]
            foldable = (n.domain in ("", "ai.onnx") and n.op_type not in _NO_FOLD and ins
                        and all(i in known and i not in inputs for i in ins)
                        and not any(o in outputs for o in n.output)) or (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))
            if not foldable:
                kept.append(n)
                continue
            try:
                sub = onnx.helper.make_model(onnx.helper.make_graph(
                    [n], "fold", [], [onnx.helper.make_empty_tensor_value_info(o) for o in n.output if o],
                    [numpy_helper.from_array(np.asarray(known[i]), i) for i in dict.fromkeys(ins)]),
                    opset_imports=opset)
                vals = ReferenceEvaluator(sub).run(None, {})
            except Exception:  # noqa: BLE001 - an op the evaluator lacks: leave the node
                kept.append(n)
                continue
            vals = [np.asarray(v) for v in vals]
            if n.op_type != "Constant" and limit >= 0 and any(v.nbytes > limit for v in vals):
                kept.append(n)
                continue
            for o, v in zip([o for o in n.output if o], vals):
                known[o] = v
                folded[o] = v
                self.applied.append(o)
        if not folded:
            return model
        replace_repeated(g.node, kept)
        for name, v in folded.items():
            g.initializer.append(numpy_helper.from_array(v, name))
        from openipu.poprt.passes.base import prune_unused
        prune_unused(g)
        return model


@register("add_outputs")
class AddOutputs(Pass):
    """Make intermediate tensors (``names``, list or comma-separated) extra graph outputs, with the
    type and shape ONNX shape inference gives them (PopRT's ``--checkpoints``: the tensors are
    returned by every run, e.g. to compare a converted model with the original layer by layer).

    Raises:
        PassError: a name that is not a tensor of the graph.
    """

    def run(self, model):
        from openipu.poprt.passes.base import PassError
        names = self.kwargs.get("names", self.args[0] if self.args else [])
        if isinstance(names, str):
            names = [s.strip() for s in names.split(",") if s.strip()]
        g = model.graph
        have = {o.name for o in g.output}
        produced = {o for n in g.node for o in n.output} | {vi.name for vi in g.input} | {t.name for t in g.initializer}
        try:
            inf = onnx.shape_inference.infer_shapes(model, strict_mode=False)
            info = {vi.name: vi for vi in list(inf.graph.value_info) + list(inf.graph.input)}
        except Exception:  # noqa: BLE001
            info = {}
        for name in names:
            if name not in produced:
                raise PassError(f"checkpoints: the model has no tensor '{name}'")
            if name in have:
                continue
            vi = onnx.ValueInfoProto()
            if name in info:
                vi.CopyFrom(info[name])
            else:
                vi.name = name
            g.output.append(vi)
            self.applied.append(name)
        return model
