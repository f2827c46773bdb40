"""Capture a ``torch.nn.Module`` and build its PopART model: ``torch.export`` (non-strict) on
micro-batch inputs records the ATen graph with the blocks' annotations; the decompositions bring
it to core ATen but keep the ops PopART lowers as one (``linear``, ``layer_norm``, ``conv*``,
``dropout``, the losses ...); :func:`build` lowers it with a ``popart.Builder``
(:mod:`openipu.poptorch.lower`): parameters and buffers become initializers named by their
module path (``fc1.weight``: PopART then names the gradient ``Gradient___fc1.weight``), inputs
are named by ``forward``'s parameters.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from openipu import popart
from openipu.poptorch import blocks
from openipu.poptorch.errors import Error
from openipu.poptorch.lower import LOSS_OPS, NUMPY_TYPE, POPART_TYPE, Lowering, lower_graph, op_name

#: composite ops kept whole (PopART has one op, and one cost, for each)
KEEP = ("linear", "bilinear", "layer_norm", "group_norm", "conv1d", "conv2d", "conv3d", "dropout", "cross_entropy_loss",
        "nll_loss_nd", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
        "binary_cross_entropy_with_logits", "gelu", "silu", "hardswish", "hardsigmoid", "mish",
        "adaptive_avg_pool2d", "max_pool2d", "avg_pool2d", "_safe_softmax",
        # losses lowered through their decomposition but kept whole so they are found as the loss
        "kl_div", "soft_margin_loss", "margin_ranking_loss", "hinge_embedding_loss", "cosine_embedding_loss",
        "triplet_margin_loss", "poisson_nll_loss", "multilabel_margin_loss", "multi_margin_loss")


def _decompositions():
    table = torch.export.default_decompositions()
    for name in KEEP:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            table.pop(getattr(packet, overload), None)
    return table


def capture(model: torch.nn.Module, args: tuple, kwargs: dict) -> ExportedProgram:
    """The decomposed ATen graph of ``model(*args, **kwargs)`` with block annotations. Raises
    :class:`Error` (PopTorch's wording where it has one) when the model cannot be captured:
    data-dependent values (``.item()``) and control flow."""
    try:
        from openipu.poptorch._overrides import substitutions
        with blocks.capturing(), warnings.catch_warnings(), _ipu_functionals(), substitutions():
            warnings.simplefilter("ignore", FutureWarning)      # torch-internal pytree deprecations
            ep = torch.export.export(model, tuple(args), dict(kwargs), strict=False)
            _drop_dynamo_meta(ep)
            return ep.run_decompositions(_decompositions())
    except Error:
        raise
    except Exception as e:  # torch's capture errors, re-worded as PopTorch's Error
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "data-dependent" in str(e) or "GuardOnDataDependent" in type(e).__name__ or "item()" in str(e):
            raise Error("Could not capture the model: it reads a tensor's value on the host (e.g. .item(), int(t), "
                        "bool(t) or data-dependent control flow), which a static IPU graph cannot do. Use "
                        f"poptorch.dynamic_slice / torch.where instead. ({msg})") from e
        raise Error(f"Could not capture the model with torch.export: {msg}") from e


def _gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """``F.gaussian_nll_loss`` as captured for the IPU: the same loss (shape checks, the ``eps``
    clamp of ``var`` with a straight-through gradient, ``full``, the reductions) without
    torch's host-side check that no entry of ``var`` is negative, which reads the tensor's values
    and so cannot be captured (an IPU graph cannot raise on data)."""
    if isinstance(var, float):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        var = var * torch.ones_like(input)
    if var.size() != input.size():
        if input.size()[:-1] == var.size():
            var = torch.unsqueeze(var, -1)
        elif not (input.ndim == var.ndim and sum(y for x, y in zip(input.size(), var.size()) if x != y) == 1):
            raise ValueError("var is of incorrect size")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    var = var + (var.clamp(min=eps) - var).detach()
    loss = 0.5 * (torch.log(var) + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    from openipu.poptorch.ops import identity_loss
    return identity_loss(loss, reduction=reduction) if reduction != "none" else loss


torch.library.define("poptorch::ctc_loss", "(Tensor log_probs, Tensor targets, Tensor input_lengths, "
                     "Tensor target_lengths, int blank, int reduction, bool zero_infinity) -> Tensor")


@torch.library.impl("poptorch::ctc_loss", "CompositeExplicitAutograd")
def _ctc_loss_impl(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    return torch.nn.functional.ctc_loss(log_probs, targets, input_lengths, target_lengths, blank,
                                        ("none", "mean", "sum")[reduction], zero_infinity)


@torch.library.register_fake("poptorch::ctc_loss")
def _ctc_loss_fake(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    return log_probs.new_empty(() if reduction else (log_probs.shape[1],))


_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}

torch.library.define("poptorch::bincount", "(Tensor x, Tensor? weights, int minlength) -> Tensor")


@torch.library.impl("poptorch::bincount", "CompositeExplicitAutograd")
def _bincount_impl(x, weights, minlength):
    keep = (x >= 0) & (x < minlength)
    out = torch.zeros(minlength, dtype=weights.dtype if weights is not None else torch.long)
    w = weights[keep] if weights is not None else torch.ones(int(keep.sum()), dtype=torch.long)
    return out.index_add_(0, x[keep].long(), w)


@torch.library.register_fake("poptorch::bincount")
def _bincount_fake(x, weights, minlength):
    return x.new_empty((minlength,), dtype=weights.dtype if weights is not None else torch.long)


def _bincount(x, weights=None, minlength=0):
    """``torch.bincount`` as captured for the IPU (PopTorch's): ``minlength`` bins, a static
    size; values outside ``[0, minlength)`` are not counted. Raises :class:`Error` without
    ``minlength`` (the size would depend on the values)."""
    if not minlength:
        raise Error("torch.bincount on the IPU needs minlength: it is the number of bins (the output's size cannot "
                    "depend on the input's values)")
    return torch.ops.poptorch.bincount(x, weights, int(minlength))


def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
    """``F.ctc_loss`` as captured for the IPU: one ``poptorch::ctc_loss`` op (PopART's Ctc;
    torch's own has no kernel for fake tensors). Lengths given as lists become tensors."""
    if reduction not in _REDUCTIONS:
        raise ValueError(reduction + " is not a valid value for reduction")

    def as_tensor(v):
        return v if isinstance(v, torch.Tensor) else torch.tensor(list(v), dtype=torch.int32)
    return torch.ops.poptorch.ctc_loss(log_probs, targets, as_tensor(input_lengths), as_tensor(target_lengths),
                                       int(blank), _REDUCTIONS[reduction], bool(zero_infinity))


@contextlib.contextmanager
def _ipu_functionals():
    """``torch.nn.functional`` entries (the modules, e.g. ``nn.GaussianNLLLoss``, call them
    through ``F``) and ``torch.bincount`` replaced while capturing: those whose torch version
    reads tensor values on the host or has no kernel for fake tensors."""
    import torch.nn.functional as F
    saved = F.gaussian_nll_loss, F.ctc_loss, torch.bincount, torch.Tensor.bincount
    F.gaussian_nll_loss, F.ctc_loss = _gaussian_nll_loss, _ctc_loss
    torch.bincount = torch.Tensor.bincount = _bincount
    try:
        yield
    finally:
        F.gaussian_nll_loss, F.ctc_loss, torch.bincount, torch.Tensor.bincount = saved


def _drop_dynamo_meta(ep: ExportedProgram) -> None:
    """Drop the ``_torchdynamo_*`` keys torch's control-flow ops (``torch.cond``, ``while_loop``:
    ``poptorch.cond`` / ``for_loop``) leave in their subgraphs' ``custom`` node metadata: with
    preserved node metadata they make ``run_decompositions`` fail ("Mismatch in custom metadata
    for key _torchdynamo_disable_method")."""
    for m in ep.graph_module.modules():
        if isinstance(m, torch.fx.GraphModule):
            for n in m.graph.nodes:
                c = n.meta.get("custom")
                if c and any(k.startswith("_torchdynamo") for k in c):
                    n.meta["custom"] = {k: v for k, v in c.items() if not k.startswith("_torchdynamo")}


@dataclass
class Built:
    """A lowered model: the ONNX model, its input ids (in ``forward``'s flattened order), the
    user outputs' ids and pytree spec, the loss id (training), the weights (PopART id -> module
    attribute path), the IPUs and pipelining the blocks ask for."""

    model: bytes
    inputs: list
    input_info: list
    outputs: list
    out_spec: object
    loss: str | None
    weights: dict = field(default_factory=dict)
    num_ipus: int = 1
    pipelined: bool = False
    #: ``(k, id)``: the model changed user input ``k`` (index in ``inputs``) in place; ``id`` is
    #: the anchored output holding its new value, copied into the caller's tensor after a run
    input_mutations: list = field(default_factory=list)


BUFFER_BROADCAST_ERROR = ("PopTorch does not support broadcasting buffers. If your model is able to tolerate buffers "
                          "becoming out of sync between replicas, you can disable buffer broadcasting using "
                          "poptorch.Options.broadcastBuffers(False).")


def build(ep: ExportedProgram, input_names: list[str], training: bool, strategy=None,
          broadcast_buffers: bool = False, constants: dict | None = None, grouped: dict | None = None) -> Built:
    """Lower ``ep`` (``input_names``: one per user input, in order). With ``training`` the loss
    is the output of the one final loss op (PopTorch's ``RemoveSurplusIdentityLosses``).

    In-place changes, as PopTorch makes them (``InplaceInputsTracker``):

    - of a user input (``x += 1``, ``x[:, 0] = 5``): its new value is an extra output, copied
      into the caller's tensor after each run (:attr:`Built.input_mutations`);
    - of a buffer (``self.buf.add_(..)``, ``copy_``): the buffer is a device variable updated
      in place (PopART ``CopyVarUpdate``), so the value persists from run to run; the host's
      buffer gets it when weights are copied to the host (after each training run; explicitly,
      ``copyWeightsToHost``, for inference). BatchNorm's running statistics are updated by
      PopART's own training BatchNormalization. With ``broadcast_buffers`` (replicas and
      ``Options.broadcastBuffers(True)``) a changed buffer raises PopTorch's :class:`Error`;
    - parameters with ``requires_grad=False`` are detached: they get no gradient and the
      optimizer never updates them;
    - ``constants`` (module path -> value) are plain tensor attributes captured as buffers: they
      are constants of the graph with these values, and changes to them are dropped (PopTorch
      freezes such a tensor's value when it traces the model).

    ``grouped``: module path -> (``popart.VariableSettings``, host value ``[groups, *shape]``) of
    the replica-grouped parameters (``replicaGrouping``); the model was captured with one
    replica's value of each."""
    gm = ep.graph_module
    num_ipus, pipelined = blocks.resolve(gm, strategy)
    b = popart.Builder()
    lw = Lowering(b, training)
    state = ep.state_dict
    consts = getattr(ep, "constants", {})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants = constants or {}
    mutated = {spec.target for spec in ep.graph_signature.output_specs if spec.kind == OutputKind.BUFFER_MUTATION}
    input_pos: dict = {}
    ids, inputs, infos, weights = {}, [], [], {}
    user = iter(input_names)
    for n, spec in zip(placeholders, ep.graph_signature.input_specs):
        v = n.meta.get("val")
        if spec.kind == InputKind.USER_INPUT:
            if not isinstance(v, torch.Tensor):
                ids[n] = v
                continue
            name = next(user)
            info = popart.TensorInfo(POPART_TYPE[v.dtype], [int(d) for d in v.shape])
            ids[n] = b.addInputTensor(info, name)
            input_pos[spec.arg.name] = len(inputs)
            inputs.append(ids[n])
            infos.append(info)
        elif spec.kind == InputKind.BUFFER and spec.target in constants:
            value = constants[spec.target]
            ids[n] = b.aiOnnxOpset11.constant(value.detach().cpu().numpy().astype(
                NUMPY_TYPE[POPART_TYPE[value.dtype]]), spec.target)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            value = state[spec.target] if spec.target in state else consts[spec.target]
            changed = spec.target in mutated
            if not value.is_floating_point() and not changed and not any(u.op == "call_function" for u in n.users):
                continue        # e.g. num_batches_tracked, read by nothing
            arr = value.detach().cpu().numpy()
            arr = arr.astype(NUMPY_TYPE[POPART_TYPE[value.dtype]], copy=False)     # the builder only reads it
            if grouped and spec.target in grouped:
                vs, full = grouped[spec.target]
                ids[n] = b.addInitializedInputTensor(full.astype(arr.dtype, copy=False), vs, spec.target)
            else:
                ids[n] = b.addInitializedInputTensor(arr, spec.target)
            if value.is_floating_point() or changed:    # unchanged integer buffers stay constants
                weights[ids[n]] = spec.target
            if training and spec.kind == InputKind.PARAMETER and not value.requires_grad:
                var = ids[n]
                ids[n] = b.aiGraphcore.detach([var], f"{spec.target}/frozen")
        elif spec.kind in (InputKind.CONSTANT_TENSOR,):
            value = consts[spec.target]
            ids[n] = b.aiOnnxOpset11.constant(value.detach().cpu().numpy().astype(
                NUMPY_TYPE[POPART_TYPE[value.dtype]]), spec.target)
        else:
            raise Error(f"Unsupported model input kind {spec.kind} ({spec.target})")
    lower_graph(gm, lw, ids)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    results = out_node.args[0]
    outputs, input_mutations = [], []
    buffer_ids = {t: i for i, t in weights.items()}
    for r, spec in zip(results, ep.graph_signature.output_specs):
        if spec.kind == OutputKind.USER_OUTPUT:
            tid = lw.ids.get(r) if isinstance(r, torch.fx.Node) else None
            if tid is None:
                raise Error("Model outputs must be tensors computed by the model")
            b.addOutputTensor(tid)
            outputs.append(tid)
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            src = r.args[0] if isinstance(r, torch.fx.Node) and op_name(r.target) == "getitem" else r
            producer = src.target if isinstance(src, torch.fx.Node) else None
            if spec.target in constants or producer is not None and "batch_norm" in op_name(producer):
                continue    # a frozen constant; PopART updates a training BatchNorm's running statistics itself
            if broadcast_buffers and not spec.target.endswith("num_batches_tracked"):
                raise Error(BUFFER_BROADCAST_ERROR, type="poptorch_cpp_error")
            var = buffer_ids.get(spec.target)
            tid = lw.ids.get(r) if isinstance(r, torch.fx.Node) else None
            if var is None or not isinstance(tid, str):
                raise Error(f"The model updates buffer '{spec.target}' in place with a value that is not a tensor "
                            "computed by the model")
            want = POPART_TYPE[(state[spec.target] if spec.target in state else consts[spec.target]).dtype]
            if lw.dtype(r) != want:
                tid = lw.cast(tid, want)
            with _placement(b, r):
                b.aiGraphcore.copyvarupdate([var, tid], f"{spec.target}/inplace_update")
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            tid = lw.ids.get(r) if isinstance(r, torch.fx.Node) else None
            if not isinstance(tid, str) or spec.target not in input_pos:
                raise Error(f"The model changes its input '{spec.target}' in place with a value that is not a tensor "
                            "computed by the model")
            tid = b.aiOnnxOpset11.identity([tid], f"{spec.target}/inplace_output")
            b.addOutputTensor(tid)
            input_mutations.append((input_pos[spec.target], tid))
        elif spec.kind == OutputKind.LOSS_OUTPUT:
            raise Error(f"Unsupported model output kind {spec.kind}")
    loss = _find_loss(gm, lw) if training else None
    return Built(b.getModelProto(), inputs, infos, outputs, ep.call_spec.out_spec, loss, weights, num_ipus, pipelined,
                 input_mutations)


@contextlib.contextmanager
def _placement(b, node):
    """The virtual graph and pipeline stage of ``node`` (its block), for ops added after
    lowering on its behalf."""
    ann = node.meta.get("custom") or {} if isinstance(node, torch.fx.Node) else {}
    ctxs = [b.virtualGraph(int(ann["ipu"])) if "ipu" in ann else None,
            b.pipelineStage(int(ann["stage"])) if "stage" in ann else None]
    for c in ctxs:
        if c is not None:
            c.__enter__()
    try:
        yield
    finally:
        for c in reversed(ctxs):
            if c is not None:
                c.__exit__(None, None, None)


def _find_loss(gm, lw) -> str:
    """The final loss: the output of the one loss op whose result feeds no other loss op."""
    losses = [n for n in gm.graph.nodes if n.op == "call_function" and op_name(n.target) in LOSS_OPS]
    if not losses:
        raise Error("Couldn't find a loss in graph!")
    loss_set = set(losses)

    def feeds_a_loss(n):
        seen, todo = set(), list(n.users)
        while todo:
            u = todo.pop()
            if u in loss_set:
                return True
            if u not in seen:
                seen.add(u)
                todo.extend(u.users)
        return False
    final = [n for n in losses if not feeds_a_loss(n)]
    if len(final) > 1:
        raise Error("Multiple independent losses found in graph. Graph must have one final loss. Wrap final graph "
                    "loss in poptorch.identity_loss.")
    tid = lw.ids[final[0]]
    return tid[0] if isinstance(tid, (tuple, list)) else tid



