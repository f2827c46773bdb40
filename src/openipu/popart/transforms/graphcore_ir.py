"""ai.graphcore nodes the IR builds as other ops, while it reads the model (``Ir._node``):

- ``Call`` (``aiGraphcore.call``, PopART's ``CallOp``): the callee graph is inlined. Its inputs
  are the call's arguments; its nodes are built in order, under ``<call name>/``, their tensors
  keeping the callee's ids (the builder makes them unique in the model) unless an earlier call
  of the same callee took them, then ``<call name>/<id>``; its outputs get the call's output
  ids. Training therefore differentiates through a call like through any other op (PopART's
  ``CallGradOp`` computes the same gradients through a backward subgraph); the simulated cost
  is that of the inlined ops (PopART lowers one Poplar function called per call site, which
  openipu's outlining does for repeated op sequences). Annotations of the call (virtual graph,
  pipeline stage ...) apply to the callee's nodes that have none.
- ``MultiConv`` (``aiGraphcore.multiconv``): one ONNX ``Conv`` per convolution (PopART lowers
  them together with ``poplin::multiconv``; each is planned separately here), so the conv
  lowering, its cost and its gradients apply. Per-convolution ``availableMemoryProportions`` /
  ``partialsTypes`` become the Conv's annotations.

``CopyVarUpdate`` (``aiGraphcore.copyvarupdate``) writes its first input, a variable, in place
(PopART's ``CopyVarUpdateOp::modifies``): :func:`check_copy_var_update` marks it so.
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from openipu.popart.errors import popart_exception

GRAPHCORE = "ai.graphcore"
AMP_ATTR = "__available_memory_proportion"
PARTIALS_ATTR = "__partials_type"


def _annotations(node) -> list:
    return [a for a in node.attribute if a.name.startswith("__")]


def _inherit(inner: onnx.NodeProto, outer: onnx.NodeProto) -> None:
    have = {a.name for a in inner.attribute}
    for a in _annotations(outer):
        if a.name not in have:
            inner.attribute.append(a)


def expand(ir, idx, node, inferred) -> None:
    """Build ``node`` (an ai.graphcore Call or MultiConv) as the ops it stands for."""
    if node.op_type == "Call":
        return _inline_call(ir, idx, node, inferred)
    return _split_multiconv(ir, idx, node, inferred)


def _inline_call(ir, idx, node, inferred) -> None:
    callee = next((a.g for a in node.attribute if a.name == "callee" and a.type == onnx.AttributeProto.GRAPH), None)
    name = node.name or f"Call_{idx}"
    if callee is None:
        raise popart_exception(f"Call node '{name}' has no 'callee' graph attribute")
    if len(node.input) != len(callee.input) or len(node.output) != len(callee.output):
        raise popart_exception(f"Call node '{name}': {len(node.input)} inputs and {len(node.output)} outputs for a "
                               f"callee with {len(callee.input)} inputs and {len(callee.output)} outputs")
    rename = {vi.name: x for vi, x in zip(callee.input, node.input)}
    for init in callee.initializer:
        rename[init.name] = ir.add_const(f"{name}/{init.name}", numpy_helper.to_array(init))
    outs = {o.name: node.output[k] for k, o in enumerate(callee.output) if node.output[k]}
    for j, n in enumerate(callee.node):
        m = onnx.NodeProto()
        m.CopyFrom(n)
        del m.input[:]
        m.input.extend(rename.get(x, x) if x else "" for x in n.input)
        del m.output[:]
        for o in n.output:
            if not o:
                m.output.append("")
                continue
            if o in outs and outs[o] not in ir.tensors:
                new = outs[o]
            elif o not in ir.tensors and o not in ir.onnx_tensor_ids:
                new = o
            else:
                new = ir.unique_id(f"{name}/{o}")
            rename[o] = new
            m.output.append(new)
        m.name = f"{name}/{n.name or n.op_type}_{j}"
        _inherit(m, node)
        ir._node(f"{idx}.{j}", m, inferred)
    # a callee output that no callee node makes (an input or an outer tensor passed through)
    for k, o in enumerate(callee.output):
        out = node.output[k]
        if out and out not in ir.tensors:
            m = helper.make_node("Identity", [rename.get(o.name, o.name)], [out], name=f"{name}/output{k}")
            _inherit(m, node)
            ir._node(f"{idx}.out{k}", m, inferred)


def _split_multiconv(ir, idx, node, inferred) -> None:
    from openipu.popart.graphcore_ops import multiconv_attrs
    from openipu.popart.shapes import decode_attrs
    attrs = decode_attrs(node)
    n = int(attrs.get("num_convs", len(node.input) // 3))
    name = node.name or f"MultiConv_{idx}"
    if len(node.input) != 3 * n or len(node.output) != n:
        raise popart_exception(f"MultiConv node '{name}' needs 3 inputs (data, weights, bias or '') and one output "
                               f"per convolution ({n})")
    amps = list(attrs.get("availableMemoryProportions") or [])
    partials = list(attrs.get("partialsTypes") or [])
    for k in range(n):
        x, w, b = node.input[3 * k:3 * k + 3]
        if x not in ir.tensors or w not in ir.tensors:
            raise popart_exception(f"MultiConv node '{name}': unknown input tensor of convolution {k}")
        cin, wcin = ir.tensors[x].info.shape()[1], ir.tensors[w].info.shape()[1]
        if not wcin or cin % wcin:
            raise popart_exception(f"MultiConv node '{name}', convolution {k}: {cin} input channels do not match "
                                   f"weights of shape {ir.tensors[w].info.shape()}")
        a = multiconv_attrs(attrs, k)
        a["group"] = cin // wcin
        m = helper.make_node("Conv", [x, w] + ([b] if b else []), [node.output[k]], name=f"{name}/conv{k}", **a)
        _inherit(m, node)
        if k < len(amps):
            m.attribute.append(helper.make_attribute(AMP_ATTR, float(amps[k])))
        if k < len(partials):
            m.attribute.append(helper.make_attribute(PARTIALS_ATTR, str(partials[k]).upper()))
        ir._node(f"{idx}.{k}", m, inferred)


def check_copy_var_update(op, ins) -> None:
    """Mark a CopyVarUpdate op as writing its first input; that input must be a variable (an
    initializer of a training session, or of an inference session with ``constantWeights``
    off) of the updater's type and shape."""
    if len(ins) != 2 or ins[0] is None or ins[1] is None:
        raise popart_exception(f"CopyVarUpdate '{op.name}' takes [variable, updater]")
    var, upd = ins
    if var.kind != "Variable":
        raise popart_exception(f"CopyVarUpdate '{op.name}': '{var.id}' is not a variable (a {var.kind} tensor). "
                               "Update an initializer (addInitializedInputTensor); in an InferenceSession set "
                               "SessionOptions.constantWeights = False")
    if var.info.data_type() != upd.info.data_type() or var.info.shape() != upd.info.shape():
        raise popart_exception(f"CopyVarUpdate '{op.name}': the updater '{upd.id}' ({upd.info.data_type()} "
                               f"{upd.info.shape()}) must match the variable '{var.id}' ({var.info.data_type()} "
                               f"{var.info.shape()})")
    op.modifies = (0,)
