"""``Session._serializeIr(IrSerializationFormat.JSON)``: the prepared IR as PopART's JSON.

The layout of PopART's ``Ir::serialise`` / ``OpJsonSerialiser``: one object mapping each graph's
name (``"maingraph"``, or the name ``Builder.setGraphName`` gave) to the list of its ops in
schedule order, each ``{"type", "name", "inputs": [{"name", "shape", "type", "index"}],
"outputs": [{"name", "index"}], "attributes": {...}}`` with every value a string (shapes as
PopART prints them, ``[2 3]``). openipu's IR has one graph (subgraphs are inlined or held by
their op), and its attributes are the op's ONNX attributes plus its placement
(``__ipu_number``, ``__pipeline_stage``, ``__execution_context``).
"""

from __future__ import annotations

import json


def _shape(shape) -> str:
    return "[" + " ".join(str(int(d)) for d in shape) + "]"


def _value(v) -> str:
    if isinstance(v, (list, tuple)):
        return _shape(v) if all(isinstance(x, int) for x in v) else "[" + " ".join(str(x) for x in v) + "]"
    return str(v)


def serialize(ir) -> str:
    """The JSON text of ``ir`` (:class:`openipu.popart.ir.Ir`)."""
    name = ir.model.graph.name
    graph = name if name and not name.startswith("BuilderGraph_") and name != "openipu.popart" else "maingraph"
    ops = []
    for op in ir.ops:
        ins = [{"name": x, "shape": _shape(ir.tensors[x].info.shape()), "type": ir.tensors[x].info.data_type(),
                "index": str(i)} for i, x in enumerate(op.inputs) if x]
        outs = [{"name": o, "index": str(i)} for i, o in enumerate(op.outputs) if o]
        attrs = {k: _value(v) for k, v in op.attrs.items()
                 if not k.startswith("__") and not hasattr(v, "SerializeToString")}
        if op.vgraph is not None:
            attrs["__ipu_number"] = str(op.vgraph)
        if op.pipeline_stage is not None:
            attrs["__pipeline_stage"] = str(op.pipeline_stage)
        attrs["__execution_context"] = op.execution_context
        ops.append({"type": op.op_type, "name": op.name, "inputs": ins, "outputs": outs, "attributes": attrs})
    return json.dumps({graph: ops})
