"""The PopART IR of an inference session: ONNX model -> checked, shape-inferred, constant-folded,
pruned list of ops over named tensors (PopART's ids, section 3 of ``research/popart.md``).

Steps, in the session constructor as in PopART:

1. load (bytes or path; PopART's "Failed to load a ModelProto ..." texts), ``onnx.checker``;
2. fix input shapes from ``InputShapeInfo``; inputs with unknown dims are an error;
3. strict ``onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)`` (an
   inference error is a PopART error naming the node), then the attribute and size checks of
   :mod:`openipu.popart.model_check`;
4. walk the nodes in order: a node whose inputs are all constants (``Constant``, initializers
   when ``constantWeights`` is true, earlier folded results) is run on the host with its
   onnx_ops kernel and becomes a constant (PopART's ConstExpr folding); so do ``Shape`` /
   ``Size`` of statically shaped tensors. Other nodes become ops; their output shapes come from
   ONNX inference or, where it has none, from running the kernel on zeros;
   ai.graphcore ``Call`` nodes are inlined and ``MultiConv`` nodes split into Conv ops
   (:mod:`openipu.popart.transforms.graphcore_ir`); then the random ops read the session's seed
   (:mod:`openipu.popart.transforms.random_seed`, PopART's RandomSetup);
5. check anchors ("Anchor tensor `x' not in Ir Tensors."), prune ops no anchor needs (ops with
   side effects, Abort and PrintTensor, and ops that write a variable stay);
6. virtual graphs (``VirtualGraphMode.Manual``: all ops or none annotated);
7. INT64 / UINT64 constants that ops read on the device are stored as 32-bit there
   (``enableSupportedDataTypeCasting``): values outside the 32-bit range (``Slice``'s "to the
   end" INT64_MAX, ...) are clamped to it, rather than wrapping to -1 as a plain cast would;
8. every op lowered by its host kernel (the generic lowering) is checked: the kernel, run on
   zeros (small inputs) or shape-only ``meta`` tensors with the constant inputs as the device
   holds them, must make outputs of the IR's shapes. A disagreement (a kernel or shape-inference bug) is a PopART error
   naming the op, raised at import instead of a failed write when the model runs.

An op no kernel and no lowering can run raises PopART's "No class for ai.onnx.X:0"; so do
NonZero / Unique when their output shape changes with their (non-constant) input values, and any
op whose output shape, found by running its kernel, does ("... depends on the values of its
inputs"). A node with subgraphs (If, Loop, Scan) gets the enclosing-scope tensors its subgraphs
use as extra trailing inputs (``attrs["__outer_names__"]``; ``shapes.call_kernel`` passes them to
the kernel as ``attrs["__outer__"]``), so it folds when they are constants and reads them on the
device otherwise.
Unlike PopART (ai.onnx opsets 6-11 only), models of newer opsets are accepted: the onnx_ops
kernels branch on the opset where semantics changed.
Tensor kinds: ``Stream`` (model inputs), ``Const``, ``Variable`` (initializers with
``constantWeights=False``), ``ActGrad`` (op outputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch

from openipu.popart import lowering, model_check, op_setup, tensor_proto
from openipu.popart.builder import _load_model
from openipu.popart.errors import popart_exception
from openipu.popart.graphcore_ops import GRAPHCORE, find_kernel
from openipu.popart.ir_probe import kernel_output_shapes, meta_probe
from openipu.popart.ir_weights import compacted, initializer_array, one_line, skeleton, take_weights
from openipu.popart.log import log
from openipu.popart.onnx_ops import reduce as reduce_ops
from openipu.popart.shapes import (NAME_OF_TORCH, annotations, call_kernel, decode_attrs, is_static,
                                  probe, subgraph_free_names, to_torch, value_info_of)
from openipu.popart.tensorinfo import NUMPY_OF, TensorInfo, dtype_name
from openipu.popart.transforms import graphcore_ir, random_seed, virtual_graphs
from openipu.popart.variable_settings import comm_size

#: ops whose output shapes depend on input values (PopART has no class for them): always probed
#: twice, even when the model states a static shape, and refused unless the shapes agree
VALUE_SHAPED = {"NonZero", "Unique"}
#: index outputs PopART makes INT32 (its ArgExtremaOp, TopKOp and SortOp setup), where ONNX says
#: INT64: op -> output indices
INDEX_OUTPUTS = {("", "ArgMax"): (0,), ("", "ArgMin"): (0,), ("", "TopK"): (1,), (GRAPHCORE, "Sort"): (1,)}
#: ops kept although no anchor needs their outputs (they act when they run)
SIDE_EFFECT_OPS = {(GRAPHCORE, "Abort"), (GRAPHCORE, "PrintTensor")}
#: ops never folded on the host (random results differ per run)
NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
           "Dropout", "PrintTensor", "ShapedDropout", "Abort", "Init",
           # collectives: their value depends on the other replicas (not const-expr ops in PopART)
           "ReplicatedAllReduce", "ReplicatedReduceScatter"}

#: ops whose INT64 constant inputs are indices, bounds or counts, for which clamping to the 32-bit
#: range of their device tensor keeps the meaning (Slice's INT64_MAX "to the end" ...)
INDEX_INPUT_OPS = {"Slice", "Range", "Clip", "Pad", "Trilu", "TopK", "OneHot", "CumSum", "Expand", "Reshape", "Tile",
                   "ConstantOfShape", "Resize", "Split", "Squeeze", "Unsqueeze", "ReduceSum", "ReduceMean",
                   "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
                   "ReduceLogSumExp", "ReduceSumSquare", "Gather", "GatherElements", "GatherND", "ScatterND",
                   "ScatterElements", "Scatter"}
@dataclass(eq=False)
class IrTensor:
    """One tensor of the IR: PopART id, :class:`TensorInfo`, kind, and value (Const/Variable)."""

    id: str
    info: TensorInfo
    kind: str                      # "Stream" | "Const" | "Variable" | "ActGrad"
    value: np.ndarray | None = None
    producer: "IrOp | None" = None
    consumers: list = field(default_factory=list)


#: PopART's ``ExecutionContext::AccumulateOuterFragment``: ops run once per batch, after the
#: gradient accumulation loop (the weight update)
OUTER_FRAGMENT = "AccumulateOuterFragment"


@dataclass(eq=False)
class IrOp:
    """One op: ONNX node plus its IR placement. ``lowering`` is ``"precise"`` (a PopLibs
    lowering) or ``"generic"`` (the costed generic vertex group), set when the IR is built."""

    id: int
    op_type: str
    domain: str
    opset: int
    name: str
    inputs: list
    outputs: list
    attrs: dict
    annotations: dict
    vgraph: int | None = None
    pipeline_stage: int | None = None
    lowering: str = ""
    #: inputs the op writes in place (PopART's ``Op::modifies``: the weight update ops)
    modifies: tuple = ()
    #: the forward op a gradient op differentiates (it takes that op's placement)
    grad_of: "IrOp | None" = None
    #: the forward op a recomputation clone recomputes (RecomputationType, pipelining)
    recomputes: "IrOp | None" = None
    #: PopART's ``ExecutionContext``: "Normal" (every micro-batch) or "AccumulateOuterFragment"
    #: (once per batch, after the gradient accumulation loop: the weight update)
    execution_context: str = "Normal"

    @property
    def opid(self) -> str:
        return f"{self.domain or 'ai.onnx'}.{self.op_type}:{self.opset}"

    def __repr__(self):
        return f"IrOp({self.id}, {self.op_type}, {self.inputs} -> {self.outputs}, {self.lowering})"


def shard_rows(value, replicas: int) -> np.ndarray:
    """A sharded tensor's host value as its replicas' pieces: ``[replicas, ceil(n / replicas)]``,
    the flattened value zero-padded (the layout of ``gcl.reduceScatterCrossReplica``)."""
    flat = np.asarray(value).reshape(-1)
    k = -(-flat.size // replicas)
    out = np.zeros(replicas * k, flat.dtype)
    out[:flat.size] = flat
    return out.reshape(replicas, k)


class Ir:
    """Build the IR of ``model`` (bytes, path or ModelProto) for inference.

    Args: ``data_flow`` (:class:`DataFlow`), ``input_shape_info`` (:class:`InputShapeInfo` or
    None), ``options`` (:class:`SessionOptions`), ``num_vgraphs`` (IPUs per replica).
    Raises ``popart_exception`` with PopART's messages (see module docstring).
    """

    def __init__(self, model, data_flow, input_shape_info, options, num_vgraphs: int = 1, training=None):
        taken = {}      # weights already read out of the proto (from the model file's external data)
        self.model = _load_model(model, taken)
        self.training = training        # {"loss", "optimizer", "patterns"} for a TrainingSession
        # the weights: read out of the proto once; a proto parsed here gives up its copy
        self.weights = take_weights(self.model, owned=self.model is not model, taken=taken)
        if self.model is not model and self.weights:
            self.model = compacted(self.model)
        self.data_flow = data_flow
        self.options = options
        self.num_vgraphs = num_vgraphs
        self.tensors: dict[str, IrTensor] = {}
        self.ops: list[IrOp] = []
        self.stream_inputs: list[str] = []      # ONNX model inputs (non-initializer), in order
        self.model_input_ids: set[str] = set()
        self.onnx_tensor_ids: set[str] = set()
        self.opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): int(o.version)
                       for o in self.model.opset_import}
        self.optimizer_tensors: set[str] = set()    # non-const optimizer scalars (optimizerFromHost)
        self.grad_alias: dict[str, str] = {}        # Gradient___x -> the tensor holding it
        self.random_seed: str | None = None         # the seed tensor of the random ops (RandomSetup)
        self.weight_grads: dict[str, str] = {}
        self.recomputed = 0                          # forward ops cloned into the backward pass
        self.num_stages = 0                          # pipeline stages (0: not pipelined)
        # replicated tensor sharding: the weights whose optimizer state is sharded, and each
        # sharded state tensor's (full shape, replicas); its IR shape is one replica's shard
        self.sharded_weights: set[str] = set()
        #: sharded weight -> the commGroup attribute of the replicas its state is sharded over
        self.shard_attrs: dict[str, dict] = {}
        self.sharded_state: dict[str, tuple] = {}
        self.running_mean_counters: dict = {}     # Counter___ id -> the forward op it is placed like
        self.auto_loss_scale: dict | None = None     # automatic loss scaling: factor, final scale, tracked
        # replica-grouped variables (popart.VariableSettings): id -> settings (weights and their
        # optimizer state), and each grouped weight's host value [groups, *shape]; the IR holds
        # one replica's shape
        self.variable_settings: dict = {}
        self.grouped_values: dict[str, np.ndarray] = {}
        self._group_variables(owned=self.model is not model)
        self._check_model()
        self._fix_inputs(input_shape_info)
        inferred = self._infer()
        self._build(inferred)
        self.random_seed = random_seed.apply(self)      # None, or the id of the seed tensor
        if training is not None:
            self._construct_backwards()
        self._validate_anchors()
        self._prune()
        virtual_graphs.apply(self)
        from openipu.popart.transforms import pipeline
        self.num_stages = pipeline.apply(self)      # 0: not pipelined
        self._narrow_int64_constants()
        for op in self.ops:
            op.lowering = "precise" if lowering.precise_lowering(op, self) is not None else "generic"
            if op.lowering == "generic" and find_kernel(op.domain, op.op_type) is None:
                types = ", ".join(self.tensors[x].info.data_type() for x in op.inputs if x)
                raise popart_exception(f"No class for {op.domain or 'ai.onnx'}.{op.op_type}:0. openipu lowers "
                                       f"{op.op_type} only for some element types (not {types}) and has no host "
                                       "kernel for it")
        self._check_kernel_shapes()

    def _group_variables(self, owned: bool) -> None:
        """Read the weights' :class:`VariableSettings` from the model's ``metadata_props``; a
        weight of several groups over the (global) replication factor keeps its ``[groups,
        *shape]`` value in :attr:`grouped_values` and enters the IR with one replica's shape
        (group 0's value). The builder's ``value_info`` (shapes with the group dimension) is
        dropped so that shape inference starts from the replica's shapes. Raises
        ``popart_exception`` for group sizes that do not divide the replication factor and for a
        leading dimension that is not the group count (PopART's "Incorrect size of tensor")."""
        from openipu.popart import variable_settings as vsm
        settings = vsm.from_metadata(self.model)
        if not settings:
            return
        if not owned:           # the caller's proto stays as it was
            m = onnx.ModelProto()
            m.CopyFrom(self.model)
            self.model = m
        reps = int(self.options.getGlobalReplicationFactor())
        inits = {i.name: i for i in self.model.graph.initializer}
        inputs = {vi.name: vi for vi in self.model.graph.input}
        regrouped = False
        for tid, vs in settings.items():
            init = inits.get(tid)
            if init is None:
                continue
            vsm.check_grouping(vs, reps, tid)
            self.variable_settings[tid] = vs
            if vs.getGroupCount(reps) == 1:
                continue
            full = self.weights[tid] if tid in self.weights else initializer_array(init)
            vs.shapeOnReplica(list(full.shape), reps, tid)       # raises on a wrong leading dimension
            self.grouped_values[tid] = np.ascontiguousarray(full)
            one = np.ascontiguousarray(full[0])
            if tid in self.weights:
                self.weights[tid] = one
                tensor_proto.clear_values(init)
                del init.dims[:]
                init.dims.extend(one.shape)
            else:
                init.CopyFrom(tensor_proto.typed_tensor(one, tid))
            vi = inputs.get(tid)
            if vi is not None:
                dims = vi.type.tensor_type.shape.dim
                del dims[:]
                for d in one.shape:
                    dims.add().dim_value = int(d)
            regrouped = True
        if regrouped:       # (an output's declared shape gives way to the inferred one: _strict_inference)
            del self.model.graph.value_info[:]

    # -- 1-3 ------------------------------------------------------------------------------
    def _check_model(self):
        if "" not in self.opsets:
            self.opsets[""] = 10
        try:
            onnx.checker.check_model(skeleton(self.model, self.weights))
        except UnicodeDecodeError as e:     # protobuf parses bad UTF-8 and fails when it is read
            raise popart_exception(f"The ONNX model is not valid: a name or string in it is not UTF-8 text ({e}). "
                                   "The file is corrupt; re-export it") from None
        except onnx.checker.ValidationError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid model"
            raise popart_exception(f"The ONNX model is not valid (onnx.checker): {first}. Check the exporter that "
                                   "wrote it, or re-export it") from None

    @staticmethod
    def _strict_inference(skel: onnx.ModelProto, retried: bool = False) -> onnx.ModelProto:
        """``infer_shapes(strict_mode=True, data_prop=True)`` of ``skel``, its first error a
        ``popart_exception``. Two exceptions, where the model is not at fault:

        - a declared shape (graph output or value_info) that differs from the inferred one is a
          hint an exporter got wrong, which onnxruntime also only warns about: the shapes
          declared for the outputs of ai.onnx nodes are dropped and inference runs again (with a
          warning); element types that differ stay an error;
        - an error inside the expansion of an ONNX function op (MeanVarianceNormalization's body
          fails onnx's own strict inference): non-strict inference, the op's kernel and lowering
          check it."""
        try:
            return onnx.shape_inference.infer_shapes(skel, check_type=False, strict_mode=True, data_prop=True)
        except onnx.shape_inference.InferenceError as e:
            first = str(e).replace("[ShapeInferenceError] Inference error(s): ", "").strip().splitlines()[0].strip()
            if "existing shape differ" in first and not retried:
                log("ir").warning("The model declares a tensor shape that ONNX shape inference does not give (%s): "
                                  "the inferred shapes are used", first)
                onnx_outputs = {o for n in skel.graph.node if n.domain in ("", "ai.onnx") for o in n.output}
                for vi in list(skel.graph.value_info) + list(skel.graph.output):
                    if vi.name in onnx_outputs and vi.type.HasField("tensor_type"):
                        vi.type.tensor_type.ClearField("shape")
                return Ir._strict_inference(skel, retried=True)
            if "): (op_type:" not in first and not retried:
                # data propagation evaluates shape-computing subgraphs and can fail where the
                # shapes are fine (a Slice's steps computed from shapes: "'step' cannot be 0" on a
                # PopTorch-captured BERT): strict inference without it still checks every shape
                try:
                    out = onnx.shape_inference.infer_shapes(skel, check_type=False, strict_mode=True, data_prop=False)
                    log("ir").debug("strict ONNX shape inference failed with data propagation (%s): without it", first)
                    return out
                except onnx.shape_inference.InferenceError:
                    pass
            if "'step' cannot be 0" in first:
                # onnx reads a Slice's steps wrongly on PopTorch's captured BERT (it ran before the
                # strict check); the Slice kernel and lowering check steps themselves
                log("ir").debug("strict ONNX shape inference: %s; not strict", first)
                return onnx.shape_inference.infer_shapes(skel, data_prop=True)
            if "): (op_type:" not in first:
                # the first error is the cause (later ones follow from it: "Input 0 expected to
                # have type but instead is null" ...); PopART's own setup error, where it has one
                # for the node, comes first (PopART's wording, op_setup)
                Ir._setup_checks_first(skel)
                raise popart_exception(f"ONNX shape inference refused the model: {first}") from None
            log("ir").debug("strict ONNX shape inference failed inside a function body (%s): not strict", e)
            return onnx.shape_inference.infer_shapes(skel, data_prop=True)
        except (RuntimeError, onnx.checker.ValidationError) as e:     # onnx's other C++ errors
            raise popart_exception(f"ONNX shape inference refused the model: {one_line(e)}") from None

    @staticmethod
    def _setup_checks_first(skel: onnx.ModelProto) -> None:
        """PopART's ``Op::setup`` checks (:func:`openipu.popart.op_setup.check_graph`) over the
        shapes of non-strict inference: raises their ``popart_exception`` if one fails."""
        try:
            m = onnx.shape_inference.infer_shapes(skel, data_prop=True)
        except Exception:  # noqa: BLE001 - then ONNX's own error stands
            return
        shapes = {i.name: (dtype_name(i.data_type), list(i.dims)) for i in skel.graph.initializer}
        for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
            info = value_info_of(vi)
            if info is not None and info[1] is not None:
                shapes[vi.name] = info
        op_setup.check_graph(skel, shapes)

    def _fix_inputs(self, input_shape_info):
        g = self.model.graph
        inits = {i.name for i in g.initializer}
        infos = input_shape_info.getInfos() if input_shape_info is not None else {}
        for vi in g.input:
            if vi.name in inits:
                continue
            if vi.name in infos:
                ti = infos[vi.name]
                vi.type.CopyFrom(onnx.helper.make_tensor_type_proto(ti.onnx_type(), ti.shape()))
                continue
            info = value_info_of(vi)
            if info is None or info[1] is None:
                raise popart_exception(f"Input tensor '{vi.name}' must be specified in InputShapeInfo, as it has no "
                                       "shape in the model")
            for d in info[1]:
                if not isinstance(d, int) or d < 0:
                    raise popart_exception(
                        f"Input tensor '{vi.name}' must be specified in InputShapeInfo, as it has shape "
                        f"[{' '.join(str(x) for x in info[1])}], which uses an unknown value '{d}'.")

    def _infer(self) -> dict:
        """Strict ONNX shape inference (with step 1's checker, what ``check_model(full_check=True)``
        runs, plus ``data_prop``, minus the type constraints: see :mod:`openipu.popart.model_check`);
        then the attribute and size checks of that module. Returns tensor name -> (dtype, shape)."""
        skel = skeleton(self.model, self.weights)
        for i, n in enumerate(skel.graph.node):    # onnx's errors name a node by its name
            if not n.name:
                n.name = n.output[0] if n.output and n.output[0] else f"{n.op_type}_{i}"
        m = self._strict_inference(skel)
        out = {}
        for vi in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input):
            info = value_info_of(vi)
            if info is not None:
                out[vi.name] = info
        shapes = dict(out)
        for init in self.model.graph.initializer:
            shapes.setdefault(init.name, (dtype_name(init.data_type), list(init.dims)))
        # PopART's Op::setup checks first, in PopART's words (a negative TopK k is PopART's
        # error before it is a negative dimension)
        op_setup.check_graph(skel, {k: v for k, v in shapes.items() if v[1] is not None})
        for name, (_, shape) in out.items():
            if shape is not None:
                model_check.check_shape(f"Tensor '{name}'", shape)
        for init in self.model.graph.initializer:
            model_check.check_shape(f"Initializer '{init.name}'", list(init.dims))
        model_check.check_attributes(self.model.graph, shapes)
        return out

    # -- 4 --------------------------------------------------------------------------------
    def _add_tensor(self, tid, dtype, shape, kind, value=None, producer=None):
        t = IrTensor(tid, TensorInfo(dtype, shape), kind, value, producer)
        self.tensors[tid] = t
        return t

    # -- growing the IR (autodiff, optimizer) ---------------------------------------------
    def unique_id(self, base: str) -> str:
        """``base``, or ``base`` with the first free ``__<n>`` suffix."""
        if base not in self.tensors:
            return base
        n = 1
        while f"{base}__{n}" in self.tensors:
            n += 1
        return f"{base}__{n}"

    def add_const(self, base: str, value: np.ndarray) -> str:
        """A new Const tensor holding ``value`` (numpy); returns its id."""
        value = np.asarray(value)
        tid = self.unique_id(base)
        self._add_tensor(tid, dtype_name(value.dtype), list(value.shape), "Const", value)
        return tid

    def add_op(self, op_type: str, inputs: list, outputs: list, attrs: dict | None = None, *, domain: str = "",
               opset: int | None = None, name: str = "", like: "IrOp | None" = None, modifies: tuple = ()) -> IrOp:
        """Append an op made by a transform. ``outputs``: ``(id, dtype name, shape)`` each (ids
        made unique); ``like``: the forward op whose placement annotations it takes. Returns the
        op (its ``outputs`` are the ids given)."""
        a = dict(attrs or {})
        a["__num_outputs__"] = len(outputs)
        a["__node__"] = name or f"{op_type}_{len(self.ops)}"
        if opset is None:
            opset = self.opsets.get(domain, 1) if domain else max(self.opsets.get("", 11), 11)
        op = IrOp(len(self.ops), op_type, domain, opset, a["__node__"], list(inputs), [], a,
                  dict(like.annotations) if like is not None else {}, modifies=tuple(modifies))
        for tid, dtype, shape in outputs:
            tid = self.unique_id(tid)
            self._add_tensor(tid, dtype, list(shape), "ActGrad", producer=op)
            op.outputs.append(tid)
        for x in inputs:
            if x:
                self.tensors[x].consumers.append(op)
        self.ops.append(op)
        return op

    def _build(self, inferred: dict):
        g = self.model.graph
        const_weights = bool(self.options.constantWeights) and self.training is None
        # initializers a CopyVarUpdate writes are variables whatever their type (PopART's)
        updated = {n.input[0] for n in g.node if n.op_type == "CopyVarUpdate" and n.input}
        for init in g.initializer:
            arr = self.weights[init.name] if init.name in self.weights else np.array(initializer_array(init))
            self.onnx_tensor_ids.add(init.name)
            dtype = dtype_name(init.data_type)
            # training: float initializers are the (trainable) weights; integer ones stay
            # constants so that shapes and indices still fold, unless a CopyVarUpdate writes them
            variable = not const_weights and (self.training is None or dtype in ("FLOAT", "FLOAT16") or
                                              init.name in updated)
            vs = self.variable_settings.get(init.name)
            if vs is not None and vs.numReplicasReturningVariable(self.options.getGlobalReplicationFactor()) > 1:
                # PopART declines constantWeights for a weight the replicas hold apart
                if const_weights:
                    log("ir").warning('Tensor %s was declined as a target of optimization "constantWeights" on the '
                                      "grounds that the tensor's %s do not allow for the TensorType::Variable to be "
                                      "initialized as a TensorType::Const", init.name, vs)
                variable = self.training is None or dtype in ("FLOAT", "FLOAT16") or variable
            self._add_tensor(init.name, dtype, arr.shape, "Variable" if variable else "Const", arr)
        for vi in g.input:
            self.onnx_tensor_ids.add(vi.name)
            if vi.name in self.tensors:
                continue
            dtype, shape = value_info_of(vi)
            self._add_tensor(vi.name, dtype, shape, "Stream")
            self.stream_inputs.append(vi.name)
            self.model_input_ids.add(vi.name)
        for idx, node in enumerate(g.node):
            self.onnx_tensor_ids.update(o for o in node.output if o)
            self._node(idx, node, inferred)

    def _node(self, idx, node, inferred):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if domain == GRAPHCORE and node.op_type in ("Call", "MultiConv"):
            return graphcore_ir.expand(self, idx, node, inferred)
        opset = self.opsets.get(domain, 1)
        attrs = decode_attrs(node)
        if (domain, node.op_type) == (GRAPHCORE, "GroupNormalization") and self.options.groupNormStridedChannelGrouping:
            attrs["stridedChannelGrouping"] = 1
        # ReplicatedReduceScatter's output, [ceil(n / p)], depends on the session's replication
        # (PopART's setup: p the comm group's size, all replicas by default): always inferred here
        per_replica = (domain, node.op_type) == (GRAPHCORE, "ReplicatedReduceScatter")
        if per_replica:
            attrs["__replicas__"] = comm_size(attrs.get("commGroup"), int(self.options.getGlobalReplicationFactor()))
        attrs["__num_outputs__"] = len(node.output)     # the onnx_ops kernel contract
        node_inputs = list(node.input)
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            # subgraphs: the enclosing-scope tensors they use become trailing inputs of the op
            # (shapes.call_kernel hands them to the kernel as attrs["__outer__"])
            attrs["__opsets__"] = dict(self.opsets)
            attrs["__outer__"] = {}
            outer = [x for x in subgraph_free_names(node) if x in self.tensors]
            if outer:
                attrs["__outer_names__"] = outer
                node_inputs += outer
        kernel = find_kernel(domain, node.op_type)
        for x in node_inputs:
            if x and x not in self.tensors:
                raise popart_exception(f"Node '{node.name or node.op_type}' ({node.op_type}) uses tensor '{x}', which "
                                       "no earlier node, input or initializer produces (the graph is not "
                                       "topologically sorted, or a tensor is missing)")
        ins = [self.tensors[x] if x else None for x in node_inputs]
        # PopART's Op::setup checks (attributes against input shapes and types)
        op_setup.check(domain, node.op_type, opset, attrs,
                       [None if t is None else (t.info.data_type(), t.info.shape()) for t in ins],
                       [None if t is None or t.kind != "Const" else t.value for t in ins],
                       f"{len(self.ops)} ({domain or 'ai.onnx'}.{node.op_type}:"
                       f"{op_setup.op_version(domain, node.op_type, opset)})")
        # constant folding
        if node.op_type == "Constant" and domain == "":
            if kernel is None:
                val = self._constant_value(attrs)
            else:
                val = kernel.fn([], attrs, opset)[0]
            return self._fold(node, [val], inferred)
        if domain == "" and node.op_type in ("Shape", "Size") and ins[0] is not None:
            shape = ins[0].info.shape()
            if node.op_type == "Shape":
                r = len(shape)
                start, end = int(attrs.get("start", 0)), int(attrs.get("end", r))
                start, end = (start + r if start < 0 else start), (end + r if end < 0 else end)
                val = torch.tensor(shape[max(0, start):min(r, end)], dtype=torch.int64)
            else:
                val = torch.tensor(math.prod(shape), dtype=torch.int64)
            return self._fold(node, [val], inferred)
        foldable = (kernel is not None and node.op_type not in NO_FOLD and node_inputs
                    and all(t is None or t.kind == "Const" for t in ins))
        if foldable:
            vals = [None if t is None else to_torch(t.value) for t in ins]
            try:
                with torch.no_grad():
                    outs = call_kernel(kernel, vals, attrs, opset)
            except Exception as e:
                raise popart_exception(f"Constant folding of {node.op_type} node '{node.name}' failed: {e}") from None
            return self._fold(node, outs, inferred)
        op = IrOp(len(self.ops), node.op_type, domain, opset, node.name, node_inputs, list(node.output), attrs,
                  annotations(node))
        if (domain, node.op_type) == (GRAPHCORE, "CopyVarUpdate"):
            graphcore_ir.check_copy_var_update(op, ins)
        if kernel is None and not lowering.has_lowering(op):
            raise popart_exception(f"No class for {domain or 'ai.onnx'}.{node.op_type}:0. openipu has no kernel or "
                                   "lowering for this operator; replace it in the model (see popart."
                                   "getSupportedOperations())")
        # (ONNX inference reduces over all axes for an empty axes attribute; PopART over none)
        reinfer = per_replica or (domain == "" and node.op_type.startswith("Reduce")
                                  and reduce_ops.attribute_axes_empty(node.op_type, attrs, opset))
        out_infos = [None if reinfer else inferred.get(o) for o in node.output]
        value_shaped = domain == "" and node.op_type in VALUE_SHAPED
        if value_shaped or any(o and (i is None or not is_static(i[1]) or i[0] == "UNDEFINED")
                               for o, i in zip(node.output, out_infos)):
            if kernel is None:
                raise popart_exception(f"Could not infer the output shapes of {node.op_type} node '{node.name}'")
            in_infos = [None if t is None else (t.info.data_type(), t.info.shape()) for t in ins]
            cvs = [None if t is None or t.kind != "Const" else to_torch(t.value) for t in ins]
            # large inputs (ops after a custom op ONNX inference cannot see through) are probed
            # shape-only first: a kernel that runs on meta tensors reads no values of them
            shape_only = None if value_shaped else meta_probe(kernel, ins, in_infos, attrs, opset, cvs)
            try:
                probed = shape_only or probe(kernel, in_infos, attrs, opset, cvs)
            except Exception as e:
                raise popart_exception(f"Could not infer the output shapes of {node.op_type} node '{node.name}': "
                                       f"{e}") from None
            # a second probe on other values: an output shape that changes with the values of
            # non-constant inputs cannot be compiled (the IPU runs static graphs). Values the op
            # rejects (e.g. as shapes) say nothing, so a failing second probe is ignored.
            again = probed
            if shape_only is None and any(t is not None and c is None for t, c in zip(ins, cvs)):
                try:
                    again = probe(kernel, in_infos, attrs, opset, cvs, fill="arange")
                except Exception:  # noqa: BLE001
                    pass
            if [p[1] for p in probed] != [p[1] for p in again]:
                no_class = f"No class for ai.onnx.{node.op_type}:0. " if value_shaped else ""
                raise popart_exception(
                    f"{no_class}The output shape of {node.op_type} node '{node.name}' depends on the values of its inputs "
                    f"({', '.join(x for x, t, c in zip(node_inputs, ins, cvs) if t is not None and c is None)}), "
                    "but PopART needs static shapes. Make those inputs constants (initializers)")
            out_infos = [i if (i is not None and is_static(i[1]) and i[0] != "UNDEFINED") else p
                         for i, p in zip(out_infos, probed)]
        attrs["__node__"] = node.name or f"{node.op_type}_{idx}"   # kernel failures name the op (shapes.call_kernel)
        mixed = op_setup.mixed_output_type(domain, node.op_type, [None if t is None else (t.info.data_type(),
                                                                                  t.info.shape()) for t in ins])
        if mixed is not None:       # PopART's MulOp: FLOAT16 x FLOAT scalar is FLOAT16
            out_infos[0] = (mixed, out_infos[0][1])
        for k in INDEX_OUTPUTS.get((domain, node.op_type), ()):
            if k < len(out_infos) and out_infos[k] is not None:
                out_infos[k] = ("INT32", out_infos[k][1])
        for o, info in zip(node.output, out_infos):
            if o:
                t = self._add_tensor(o, info[0], info[1], "ActGrad", producer=op)
                t.producer = op
        for t in ins:
            if t is not None:
                t.consumers.append(op)
        self.ops.append(op)

    # -- 7-8 ------------------------------------------------------------------------------
    def _device_value(self, t: IrTensor) -> torch.Tensor:
        """A Const tensor's value as an op reads it on the device (INT64 / UINT64 held as 32 bit
        when ``enableSupportedDataTypeCasting``), in the dtype kernels take."""
        v = to_torch(t.value)
        if t.info.data_type() in ("INT64", "UINT64") and self.options.enableSupportedDataTypeCasting:
            v = v.to(torch.int32).to(v.dtype)
        return v

    def _narrow_int64_constants(self):
        if not self.options.enableSupportedDataTypeCasting:
            return
        lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
        for t in self.tensors.values():
            if (t.kind != "Const" or t.value is None or t.info.data_type() not in ("INT64", "UINT64")
                    or not t.consumers or not t.value.size):
                continue
            if t.value.min() < lo or t.value.max() > hi:
                users = ", ".join(sorted({f"{c.op_type} '{c.name}'" for c in t.consumers}))
                # (a gradient op reads its forward op's index inputs alike)
                index_like = all((c.grad_of or c).op_type in INDEX_INPUT_OPS for c in t.consumers)
                (log("ir").debug if index_like else log("ir").warning)(
                    "INT64 constant '%s' (read by %s) has values outside the 32-bit range of its device tensor; "
                    "they are clamped to it (enableSupportedDataTypeCasting)", t.id, users)
                t.value = np.clip(t.value, lo, hi).astype(t.value.dtype)

    def _check_kernel_shapes(self):
        for op in self.ops:
            if op.lowering != "generic":
                continue
            kernel = find_kernel(op.domain, op.op_type)
            ins = [self.tensors[x] if x else None for x in op.inputs]
            want = [self.tensors[o].info.shape() for o in op.outputs if o]
            got = kernel_output_shapes(kernel, op, ins, self._device_value)
            if got is None:
                continue
            got = [g for g, o in zip(got, op.outputs) if o]
            if got != want:
                raise popart_exception(
                    f"Op {op.opid} '{op.name}' ({op.op_type}): its host kernel, given its inputs as the device holds "
                    f"them, makes outputs of shape(s) "
                    f"{', '.join(str(g) for g in got)} from inputs of shape(s) "
                    f"{', '.join(str(t.info.shape()) if t is not None else '-' for t in ins)}, but the IR (ONNX shape "
                    f"inference) gives {', '.join(str(w) for w in want)}. This is an openipu bug in the {op.op_type} "
                    "kernel, its shape inference or its lowering; please report it with the model")

    @staticmethod
    def _constant_value(attrs):
        if "value" in attrs:
            return attrs["value"]
        for k, dt in (("value_float", torch.float32), ("value_int", torch.int64)):
            if k in attrs:
                return torch.tensor(attrs[k], dtype=dt)
        for k, dt in (("value_floats", torch.float32), ("value_ints", torch.int64)):
            if k in attrs:
                return torch.tensor(attrs[k], dtype=dt)
        raise popart_exception("Constant node without a value attribute")

    def _fold(self, node, values, inferred):
        for o, v in zip(node.output, values):
            if not o:
                continue
            v = v.detach() if isinstance(v, torch.Tensor) else torch.as_tensor(v)
            dtype = NAME_OF_TORCH.get(v.dtype, "FLOAT")
            inf = inferred.get(o)
            if inf is not None and inf[0] in NUMPY_OF and inf[0] != dtype:
                dtype = inf[0]
            arr = v.cpu().numpy()
            if dtype in NUMPY_OF:
                arr = arr.astype(NUMPY_OF[dtype])
            # (np.ascontiguousarray would turn a 0-d scalar into shape [1])
            self._add_tensor(o, dtype, list(arr.shape), "Const", np.ascontiguousarray(arr).reshape(arr.shape))

    # -- training ---------------------------------------------------------------------------
    def _construct_backwards(self):
        """``setFinalLoss``, autodiff and the optimizer's update ops (PopART's order)."""
        from openipu.popart.transforms import autodiff, loss_scaling, optimizer, recompute
        loss, opt = self.training["loss"], self.training["optimizer"]
        if loss not in self.tensors:
            raise popart_exception(f"Could not find loss tensor '{loss}' in main graph tensors")
        if self.tensors[loss].info.nelms() > 1:
            raise popart_exception(f"Loss tensor, '{loss}', must be a scalar tensor")
        if self.tensors[loss].info.data_type() not in autodiff.FLOATS:
            raise popart_exception(f"Loss tensor, '{loss}', must be a float tensor, not "
                                   f"{self.tensors[loss].info.data_type()}")
        seed = optimizer.loss_scaling_seed(self, opt, loss)
        wanted = autodiff.anchored_gradients(self, self.data_flow.anchors())
        self.weight_grads = autodiff.grow(self, loss, seed, self.training.get("patterns"), wanted)
        self.recomputed = recompute.apply(self)
        optimizer.apply(self, opt, self.weight_grads)
        loss_scaling.apply(self, opt, seed)
        optimizer.copy_var_updates(self)

    # -- 5 --------------------------------------------------------------------------------
    def _validate_anchors(self):
        anchors = self.data_flow.anchors()
        if not anchors and self.training is None:
            raise popart_exception("User must specify an anchor tensor when doing inference.")
        self.anchor_alias: dict[str, str] = {}
        for a in anchors:
            if a not in self.tensors and a in self.grad_alias:
                self.anchor_alias[a] = self.grad_alias[a]
                self.tensors[a] = self.tensors[self.grad_alias[a]]
                continue
            named = [n for n in self.model.graph.node if n.name == a and n.output and n.output[0] in self.tensors]
            if a not in self.tensors and len(named) == 1:
                # openipu extension: an anchor naming a node (a Builder op's debugContext) stands for
                # that node's first output. PopART itself raises here; scripts written against
                # ids like "sum" then still run, with this warning.
                self.anchor_alias[a] = named[0].output[0]
                self.tensors[a] = self.tensors[named[0].output[0]]
                log("ir").warning("Anchor '%s' names a node, not a tensor; anchoring its output '%s' (PopART "
                                  "would raise 'Anchor tensor `%s' not in Ir Tensors.')", a, named[0].output[0], a)
                continue
            if a not in self.tensors:
                hint = ""
                outs = [o.name for o in self.model.graph.output]
                if outs:
                    hint = (f" The model's outputs are {', '.join(outs)}; note that a Builder op's debugContext names "
                            "the node, not its output tensor (use the id the op returns).")
                raise popart_exception(f"Anchor tensor `{a}' not in Ir Tensors. {hint}".rstrip())

    def _prune(self):
        needed = {self.anchor_alias.get(a, a) for a in self.data_flow.anchors()}
        if self.training is not None:
            needed.add(self.training["loss"])
        keep = []
        for op in reversed(self.ops):
            if op.modifies or (op.domain, op.op_type) in SIDE_EFFECT_OPS or any(o in needed for o in op.outputs):
                keep.append(op)
                needed.update(x for x in op.inputs if x)
        keep.reverse()
        if len(keep) != len(self.ops):
            log("ir").info("Pruned %d ops that no anchor needs", len(self.ops) - len(keep))
        self.ops = keep
        for i, op in enumerate(self.ops):
            op.id = i
        kept = set(id(o) for o in self.ops)
        for t in self.tensors.values():
            t.consumers = [c for c in t.consumers if id(c) in kept]
        self.used = needed

    # -- 6 --------------------------------------------------------------------------------
    # -- queries --------------------------------------------------------------------------
    def home_vgraph(self, tid: str) -> int:
        """The virtual graph a tensor lives on: its producer's, else its first consumer's; for a
        streamed input of a pipelined IR, the virtual graph of its earliest reading pipeline stage
        (PopART's InterIpuCopy streams it there and copies it to the other IPUs that read it)."""
        t = self.tensors[tid]
        if t.producer is not None and t.producer.vgraph is not None:
            return t.producer.vgraph
        if t.kind == "Stream":
            staged = [(c.pipeline_stage, c.vgraph) for c in t.consumers
                      if c.vgraph is not None and c.pipeline_stage is not None]
            if staged:
                return min(staged)[1]
        for c in t.consumers:
            if c.vgraph is not None:
                return c.vgraph
        return 0

    def info(self, tid: str) -> TensorInfo:
        if tid not in self.tensors:
            raise popart_exception(f"No tensor '{tid}' in the Ir (getInfo): it is neither a model input, an "
                                   "initializer nor an op output")
        return self.tensors[tid].info

    def variables(self) -> list[str]:
        """The device variables the host holds copies of (weights and optimizer state), not the
        optimizer scalars (those are ``optimizer_tensors``)."""
        return [t.id for t in self.tensors.values() if t.kind == "Variable" and t.id not in self.optimizer_tensors
                and t.id != self.random_seed]
