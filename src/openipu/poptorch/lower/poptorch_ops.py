"""PopTorch's own ops (:mod:`openipu.poptorch.ops`) and the scopes they record, lowered to PopART:

- ``nop`` -> ``aiGraphcore.nop``; ``ipu_print_tensor`` -> ``aiGraphcore.printtensor`` (prints each
  run, and the gradient in training unless ``print_gradient=False``);
- ``set_available_memory`` -> ``builder.setAvailableMemoryProportion`` on the MatMul / Conv /
  Gather producing the tensor (looking back through a bias Add, reshapes, transposes and casts);
  nothing for any other producer (PopTorch: only those ops take it);
- ``recomputation_checkpoint`` -> a Nop annotated ``recomputeOutputInBackwardPass(...,
  RecomputeType.Checkpoint)`` (PopART's ``builder.checkpointOutput``);
- ``dynamic_slice`` / ``dynamic_update`` -> ``aiGraphcore.dynamicslice`` / ``dynamicupdate``;
- ``serialized_matmul`` -> MatMul + ``builder.setSerializeMatMul``;
- ``ctc_beam_search_decoder`` -> ``aiGraphcore.ctcbeamsearchdecoder`` (UINT32 results as INT32);
- ``custom_operation`` -> ``builder.customOp`` (its Python kernel from
  :func:`openipu.poptorch.ops.register_custom_op`); ``poptorch.CPU`` callbacks are such ops;
- ``torch.cond`` (``poptorch.cond``) -> ONNX ``If`` and ``while_loop`` (``poptorch.for_loop``) ->
  ONNX ``Loop``, their branches / body lowered into subgraph builders (inference only);
- :func:`node_contexts`: the ``NameScope`` / ``Attribute`` / ``MultiConv`` annotations of a node as
  builder contexts (name scope, node attributes, per-convolution memory proportion and partials).
"""

from __future__ import annotations

import json

import numpy as np

from openipu.popart.builder import AMP_ATTR, PARTIALS_ATTR, _AttributeContext
from openipu.poptorch import ops as pops
from openipu.poptorch.errors import Error
from openipu.poptorch.lower import Lowering, aten, lower_graph, op_name


def _producer(lw, tid):
    for node in reversed(lw.b._model.graph.node):
        if tid in node.output:
            return node
    return None


@aten("poptorch.nop.default")
def nop(lw, n):
    return lw.gc.nop([lw.t(n.args[0])], lw._name())


@aten("poptorch.ipu_print_tensor.default")
def print_tensor(lw, n):
    title = n.args[1] if len(n.args) > 1 else ""
    print_gradient = n.args[2] if len(n.args) > 2 else 1
    return lw.gc.printtensor([lw.t(n.args[0])], print_gradient=int(print_gradient), debugContext=lw._name(),
                             title=title or n.args[0].name)


_AMP_OPS = {"MatMul", "Conv", "ConvTranspose", "Gather", "Gemm", "MultiConv"}
_LOOK_THROUGH = {"Add", "Reshape", "Transpose", "Cast", "Identity", "Squeeze", "Unsqueeze"}


@aten("poptorch.set_available_memory.default")
def set_available_memory(lw, n):
    tid = lw.t(n.args[0])
    node, cur = _producer(lw, tid), tid
    for _ in range(4):
        if node is None or node.op_type in _AMP_OPS:
            break
        if node.op_type not in _LOOK_THROUGH:
            node = None
            break
        cur = node.input[0]
        node = _producer(lw, cur)
    if node is not None and node.op_type in _AMP_OPS:
        lw.b.setAvailableMemoryProportion(set(node.output), float(n.args[1]))
    return tid


@aten("poptorch.recomputation_checkpoint.default")
def recomputation_checkpoint(lw, n):
    out = lw.gc.nop([lw.t(n.args[0])], lw._name("checkpoint"))
    lw.b.recomputeOutputInBackwardPass(out, "Checkpoint")
    return out


def _offset(lw, start):
    tid = lw.t(start)
    if lw.dtype(start) != "INT32":
        tid = lw.cast(tid, "INT32")
    return lw.onnx.reshape([tid, lw.shape_const([1])], lw._name("offset"))


@aten("poptorch.dynamic_slice.default")
def dynamic_slice(lw, n):
    x, dim, start, size = n.args[:4]
    return lw.gc.dynamicslice([lw.t(x), _offset(lw, start)], axes=[int(dim)], sizes=[int(size)], noOverlap=1,
                              debugContext=lw._name())


@aten("poptorch.dynamic_update.default")
def dynamic_update(lw, n):
    x, src, dim, start, size = n.args[:5]
    s = lw.like(src, x)
    if lw.shape(src)[int(dim)] != int(size):
        s = lw.onnx.slice([s, lw.shape_const([0]), lw.shape_const([int(size)]), lw.shape_const([int(dim)])],
                          lw._name("src"))
    return lw.gc.dynamicupdate([lw.t(x), _offset(lw, start), s], axes=[int(dim)], sizes=[int(size)], noOverlap=1,
                               debugContext=lw._name())


@aten("poptorch.serialized_matmul.default")
def serialized_matmul(lw, n):
    a, b, mode, factor, keep = n.args[:5]
    out = lw.onnx.matmul([lw.t(a), lw.like(b, a)], lw._name())
    if mode != "none":
        lw.b.setSerializeMatMul({out}, mode, int(factor), bool(keep))
    return out


@aten("poptorch.ctc_beam_search_decoder.default")
def ctc_beam_search_decoder(lw, n):
    probs, lengths, blank, width, paths = n.args[:5]
    outs = lw.gc.ctcbeamsearchdecoder([lw.t(probs), lw.cast(lw.t(lengths), "UINT32")], blank=int(blank),
                                      beam_width=int(width), top_paths=int(paths), debug_context=lw._name())
    return [outs[0], lw.cast(outs[1], "INT32"), lw.cast(outs[2], "INT32")]


@aten("poptorch.custom_operation.default")
def custom_operation(lw, n):
    inputs, name, domain, version, spec = n.args[:5]
    if (domain, name) not in pops._CUSTOM_KERNELS:
        raise Error(f"Custom op '{domain}::{name}' has no kernel: openipu runs custom ops from Python kernels "
                    "registered with poptorch.register_custom_op(name, domain, kernel) (a C++ library loaded with "
                    "torch.ops.load_library cannot run on the simulated IPU)")
    spec = json.loads(spec)
    attrs = {k: v for k, v in spec["attributes"].items()}
    return lw.b.customOp(name, int(version), domain, [lw.t(x) for x in inputs], attrs,
                         numOutputs=len(spec["outputs"]), name=lw._name())


# -- control flow ------------------------------------------------------------------------------
def _subgraph_module(n, arg):
    return getattr(n.graph.owning_module, arg.target)


def _outputs(gm):
    out = next(x for x in gm.graph.nodes if x.op == "output").args[0]
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _lower_into(builder, lw, gm, inputs: list, fresh=()) -> list:
    """Lower ``gm`` with ``builder`` (placeholders = ``inputs``, ids); returns its output ids,
    copied (Identity) where an output would be an input or an id in ``fresh``'s complement (ONNX
    subgraph outputs must be produced inside the subgraph)."""
    sub = Lowering(builder, lw.training)
    placeholders = [p for p in gm.graph.nodes if p.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise Error(f"Internal error: a captured subgraph takes {len(placeholders)} inputs, {len(inputs)} given")
    lower_graph(gm, sub, dict(zip(placeholders, inputs)))
    outs = []
    for o in _outputs(gm):
        tid = sub.ids[o] if o in sub.ids else None
        if not isinstance(tid, str):
            raise Error("poptorch.cond / for_loop: the body must return tensors computed from its inputs")
        outs.append(tid)
    return outs


def _own(builder, ids, inputs):
    """Outputs of a subgraph: an id that is one of its inputs (or an outer tensor) goes through an
    Identity, as ONNX subgraph outputs must be produced inside."""
    made = {o for node in builder._model.graph.node for o in node.output}
    return [t if t in made and t not in inputs else builder.aiOnnxOpset11.identity([t]) for t in ids]


def _inference_only(lw, what):
    if lw.training:
        raise Error(f"{what} is supported in inference models only: the simulated PopART has no gradient for "
                    "its subgraph op (poptorch.cond is inference-only in PopTorch too)")


@aten("cond")
def cond(lw, n):
    _inference_only(lw, "poptorch.cond")
    pred, true_gm, false_gm, operands = n.args[:4]
    outer = [lw.t(o) for o in operands]
    branches = []
    for arg in (true_gm, false_gm):
        gm = _subgraph_module(n, arg)
        sb = lw.b.createSubgraphBuilder()
        ins = [sb.addInputTensorFromParentGraph(t) for t in outer]
        outs = _own(sb, _lower_into(sb, lw, gm, ins), set(ins))
        for o in outs:
            sb.addOutputTensor(o)
        branches.append((sb, len(outs)))
    p = lw.t(pred)
    if lw.dtype(pred) != "BOOL":
        p = lw.cast(p, "BOOL")
    outs = lw.onnx.logical_if([p], branches[0][1], else_branch=branches[1][0], then_branch=branches[0][0],
                              debugContext=lw._name())
    return list(outs)


@aten("while_loop")
def while_loop(lw, n):
    _inference_only(lw, "poptorch.for_loop")
    cond_arg, body_arg, carried, additional = n.args[:4]
    cond_gm, body_gm = _subgraph_module(n, cond_arg), _subgraph_module(n, body_arg)
    carried_ids = [lw.t(c) for c in carried]
    extra = [lw.t(a) for a in additional]
    keep_going = _lower_into(lw.b, lw, cond_gm, carried_ids + extra)[0]
    if lw.dtype(_outputs(cond_gm)[0]) != "BOOL":
        keep_going = lw.cast(keep_going, "BOOL")
    from openipu import popart
    sb = lw.b.createSubgraphBuilder()
    sb.addInputTensor(popart.TensorInfo("INT64", []), lw._name("iteration"))
    sb.addInputTensor(popart.TensorInfo("BOOL", []), lw._name("keep_going"))
    body_in = [sb.addInputTensor(popart.TensorInfo(lw.dtype(c), lw.shape(c)), lw._name(f"carried{i}"))
               for i, c in enumerate(carried)]
    extra_in = [sb.addInputTensorFromParentGraph(t) for t in extra]
    new = _lower_into(sb, lw, body_gm, body_in + extra_in)
    again = _lower_into(sb, lw, cond_gm, new + extra_in)[0]
    if lw.dtype(_outputs(cond_gm)[0]) != "BOOL":
        again = sb.aiOnnxOpset11.cast([again], "BOOL")
    outs = _own(sb, [again] + new, set(body_in) | set(extra_in))
    for o in outs:
        sb.addOutputTensor(o)
    trips = lw.onnx.constant(np.asarray(np.iinfo(np.int32).max, np.int64), lw._name("trips"))
    res = lw.onnx.loop([trips, keep_going] + carried_ids, len(carried_ids), sb, debugContext=lw._name())
    return list(res)


# -- scopes ------------------------------------------------------------------------------------
def _is_conv(n) -> bool:
    parts = op_name(n.target).split(".")
    return len(parts) > 1 and parts[0] == "aten" and parts[1].startswith("conv")


def node_contexts(lw, n) -> list:
    """The builder contexts for FX node ``n``'s ``NameScope`` / ``Attribute`` / ``MultiConv``
    annotations (entered around its lowering)."""
    ann = n.meta.get("custom") or {}
    out = []
    if ann.get(pops.SCOPE_KEY):
        out.append(lw.b.nameScope(ann[pops.SCOPE_KEY]))
    for k, v in json.loads(ann.get(pops.ATTRS_KEY) or "{}").items():
        out.append(_AttributeContext(lw.b, k, v))
    if ann.get(pops.MULTICONV_KEY) and _is_conv(n):
        mc = json.loads(ann[pops.MULTICONV_KEY])
        counts = lw.__dict__.setdefault("_multiconv_counts", {})
        k = counts.get(mc["id"], 0)
        counts[mc["id"]] = k + 1

        def pick(vals):
            return None if not vals else vals[k] if k < len(vals) else vals[0] if len(vals) == 1 else None
        if pick(mc["amp"]) is not None:
            out.append(_AttributeContext(lw.b, AMP_ATTR, float(pick(mc["amp"]))))
        if pick(mc["partials"]) is not None:
            out.append(_AttributeContext(lw.b, PARTIALS_ATTR, pick(mc["partials"])))
        if pick(mc["dithering"]) is not None:
            out.append(_AttributeContext(lw.b, "__enable_conv_dithering", int(pick(mc["dithering"]))))
        for key, attr in (("plan", "__multiconv_plan_type"), ("reserved", "__multiconv_per_conv_reserved_tiles"),
                          ("backoff", "__multiconv_cycle_back_off")):
            if mc[key] is not None:
                out.append(_AttributeContext(lw.b, attr, mc[key]))
        out.append(_AttributeContext(lw.b, "__multiconv_id", int(mc["id"])))
    return out
