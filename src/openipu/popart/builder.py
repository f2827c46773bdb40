"""``popart.Builder``: build an ONNX model op by op, with PopART's tensor ids and annotations.

Tensor ids are PopART's (``builder_impl.cpp`` ``getNextId``): op outputs are
``<scope/>OpType:<outIndex>`` with ``/<n>`` appended on collision (``Add:0``, ``Add:0/1``);
inputs are ``input``, ``input/1`` ... or the debug prefix given; initialised inputs
``init_input``, ``init_input/1`` ... The ``debugContext`` of an op names the *node*, not its
output tensor.

``builder.aiOnnx`` is the ai.onnx opset (default 10, or ``opsets["ai.onnx"]``);
``builder.aiOnnxOpsetN`` (N = 6 .. the installed onnx's newest) selects a version, and the first
opset used fixes it (PopART's rule). Their op methods are generated from ``onnx.defs`` schemas:
``op(args, [num_outputs,] <attributes with ONNX defaults>, debugContext="")``, lower-case names,
``And/Or/Xor/Not/If`` as ``logical_and`` ... ``logical_if``. ``builder.aiGraphcore`` holds
PopART's ai.graphcore ops (:class:`AiGraphcoreOpset1`). ``createSubgraphBuilder()`` makes the
builder of a nested graph (a ``call`` callee, a ``loop`` body, an ``if`` branch), sharing this
builder's tensor ids.

Annotations are node attributes, as in PopART: ``__ipu_number`` (virtualGraph),
``__pipeline_stage``, ``__execution_phase``, ``__available_memory_proportion``,
``__partials_type``, ``__serialize_matmul_mode`` / ``_factor`` / ``_precision``.

The opset classes live in :mod:`openipu.popart.builder_aionnx` (generated ai.onnx methods) and
:mod:`openipu.popart.builder_aigraphcore` (``AiGraphcoreOpset1``).
"""

from __future__ import annotations

import collections
import itertools
import os

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

from openipu.popart.debug_prefix import accept_debug_prefix
from openipu.popart.errors import popart_exception
from openipu.popart.tensor_proto import read_external_data, typed_tensor
from openipu.popart.graphcore_ops import find_kernel
from openipu.popart.builder_aigraphcore import AiGraphcoreOpset1
from openipu.popart.builder_aionnx import DEFAULT_AI_ONNX_OPSET, _to_attr_value, method_name, opset_class  # noqa: F401 - method_name re-exported
from openipu.popart.log import log
from openipu.popart.shapes import decode_attrs, probe, subgraph_output_infos, to_torch, value_info_of
from openipu.popart.tensorinfo import NUMPY_OF, ONNX_OF, TensorInfo, dtype_name

DEFAULT_AI_GRAPHCORE_OPSET = 1
MIN_AI_ONNX_OPSET = 6
MAX_AI_ONNX_OPSET = defs.onnx_opset_version()

VGRAPH_ATTR = "__ipu_number"
PIPELINE_ATTR = "__pipeline_stage"
PHASE_ATTR = "__execution_phase"
AMP_ATTR = "__available_memory_proportion"
PARTIALS_ATTR = "__partials_type"
SERIALIZE_MODE_ATTR = "__serialize_matmul_mode"
SERIALIZE_FACTOR_ATTR = "__serialize_matmul_factor"
SERIALIZE_PRECISION_ATTR = "__serialize_matmul_precision"
RECOMPUTE_ATTR = "__recompute_output_in_backward_pass"
PRIORITY_ATTR = "__schedule_priority"


_SEP = "/"
_graph_uid = itertools.count()
_INF = 2147483647


class OwnedModelProto:
    """A ModelProto handed to a session together with its ownership (openipu-internal, not a
    PopART API): the IR takes the weights out of it and clears them in the proto, as it does with
    a model it parsed itself, so the caller neither serialises the model for the session (a second
    copy of the weights, and a parse) nor keeps the weights twice. The caller must not use
    ``proto`` afterwards. ``weights``: arrays of initializers the caller has already read out of
    the proto (:func:`openipu.popart.ir_weights.read_external_weights`; their values are cleared
    in it), which the IR takes as they are."""

    __slots__ = ("proto", "weights")

    def __init__(self, proto: onnx.ModelProto, weights: dict | None = None):
        self.proto = proto
        self.weights = weights or {}


def _load_model(model_or_path, taken: dict | None = None) -> onnx.ModelProto:
    """ModelProto from a path, serialized bytes, a ModelProto or an :class:`OwnedModelProto`;
    PopART's error texts. ``taken`` (a dict): filled with the arrays of the large initializers
    already read out of the proto (an :class:`OwnedModelProto`'s, or those a model file stores
    beside it, read straight into arrays); without it, a model file's external data is loaded
    into the proto."""
    if isinstance(model_or_path, OwnedModelProto):
        if taken is not None:
            taken.update(model_or_path.weights)
        elif model_or_path.weights:
            raise ValueError("an OwnedModelProto with weights read out of it needs a caller that takes them")
        return model_or_path.proto
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if isinstance(model_or_path, (str, os.PathLike)) and len(str(model_or_path)) < 10000 \
            and os.path.isfile(str(model_or_path)):
        path = str(model_or_path)
        with open(path, "rb") as f:
            data = f.read()
        m = onnx.ModelProto()
        try:
            m.ParseFromString(data)
        except Exception:
            raise popart_exception(f"Failed to parse ModelProto from file {path}") from None
        if not m.HasField("graph"):
            raise popart_exception(f"Failed to parse ModelProto from file {path}. The file holds no ONNX graph: "
                                   "is it an ONNX model, and was it written completely?")
        try:   # weights stored beside the model (torch.onnx.export writes MODEL.onnx.data)
            from onnx.external_data_helper import load_external_data_for_model, uses_external_data
            if any(uses_external_data(t) for t in m.graph.initializer):
                base = os.path.dirname(os.path.abspath(path))
                if taken is None:
                    load_external_data_for_model(m, base)
                else:
                    from openipu.popart.ir_weights import read_external_weights
                    taken.update(read_external_weights(m, base))
        except (OSError, ValueError) as e:
            raise popart_exception(f"Failed to load the external data of the model in {path}: {e}. Keep the weights "
                                   "file beside the model") from None
        return m
    data = model_or_path.encode() if isinstance(model_or_path, str) else bytes(model_or_path)
    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
        ok = m.HasField("graph")
    except Exception:
        ok = False
    if not ok:
        raise popart_exception(
            f"Failed to load a ModelProto from the string '{_format_proto_string(data, 100)}'.\nCheck that it is "
            "either a valid path to an existing onnx model file, or is a valid onnx ModelProto string.")
    read_external_data(m)
    return m


def _format_proto_string(data: bytes, max_len: int) -> str:
    out = []
    for i, c in enumerate(data):
        ch = chr(c)
        if " " <= ch <= "~":
            out.append("\\" + ch if ch in "\\'" else ch)
        else:
            out.append({10: "\\n", 9: "\\t", 13: "\\r"}.get(c, f"\\x{c:02x}"))
        if i >= max_len:
            out.append("...")
            break
    return "".join(out)


# ----------------------------------------------------------------------------------------------
# context managers
# ----------------------------------------------------------------------------------------------
#: PopART's ``sReplicationFactor``: the model metadata key ``embedReplicationFactor`` writes
REPLICATION_FACTOR_KEY = "__replicationFactor"


class _AttributeContext:
    """``with builder.virtualGraph(i):`` and friends: annotate every node created inside."""

    def __init__(self, builder, attr, value):
        self.builder, self.attr, self.value = builder, attr, value

    def __enter__(self):
        self.builder._attr_stack.setdefault(self.attr, []).append(self.value)
        return self

    def __exit__(self, *exc):
        self.builder._attr_stack[self.attr].pop()
        return False


class _NameContext:
    def __init__(self, builder, name):
        self.builder, self.name = builder, name

    def __enter__(self):
        self.builder._scopes.append(self.name)
        return self

    def __exit__(self, *exc):
        self.builder._scopes.pop()
        return False


# ----------------------------------------------------------------------------------------------
@accept_debug_prefix
class Builder:
    """``popart.Builder(modelProtoOrFilename=None, opsets=None)``.

    ``opsets``: ``{"ai.onnx": N, "ai.graphcore": 1}`` fixes the opset of ``aiOnnx``.
    Raises ``popart_exception`` (PopART's messages) for bad models, unknown input tensors, wrong
    input counts and mixed opsets; ``RuntimeError`` for selecting a second ai.onnx opset.
    """

    def __init__(self, modelProtoOrFilename=None, opsets=None, builderCore=None, _parent=None):  # noqa: N803
        self._parent = _parent
        self._scopes: list[str] = []
        self._attr_stack: dict[str, list] = {}
        if _parent is None:
            self._ids: set[str] = set()
            self._infos = {}            # id -> (dtype name, shape list)
            self._consts = {}           # constant / initializer values (for shape inference)
            self._opset_versions: dict[str, int] = {}
        else:
            # a subgraph: one id namespace with its parents (ONNX subgraphs may not redefine an
            # enclosing scope's names), its parents' tensors readable, its own ones written here
            self._ids = _parent._ids
            self._infos = collections.ChainMap({}, _parent._infos)
            self._consts = collections.ChainMap({}, _parent._consts)
            self._opset_versions = _parent._opset_versions
        self._default_onnx = DEFAULT_AI_ONNX_OPSET if _parent is None else _parent._default_onnx
        if opsets:
            if "ai.onnx" not in opsets or "ai.graphcore" not in opsets:
                raise popart_exception("Builder opsets must give versions for both 'ai.onnx' and 'ai.graphcore'")
            self._default_onnx = int(opsets["ai.onnx"])
        if modelProtoOrFilename is not None:
            self._model = _load_model(modelProtoOrFilename)
            self._adopt_model()
        else:
            self._model = onnx.ModelProto()
            self._model.ir_version = 4
            self._model.producer_name = "openipu.popart"
            self._model.graph.name = f"BuilderGraph_{next(_graph_uid)}"

    def _adopt_model(self):
        m = self._model
        for o in m.opset_import:
            self._opset_versions["ai.onnx" if o.domain in ("", "ai.onnx") else o.domain] = int(o.version)
        try:
            inferred = onnx.shape_inference.infer_shapes(m)
        except Exception:
            inferred = m
        g = inferred.graph
        for vi in itertools.chain(g.input, g.value_info, g.output):
            info = value_info_of(vi)
            self._ids.add(vi.name)
            if info is not None and info[1] is not None:
                self._infos[vi.name] = info
        for init in g.initializer:
            self._ids.add(init.name)
            arr = numpy_helper.to_array(init)
            self._consts[init.name] = arr
            self._infos[init.name] = (dtype_name(init.data_type), list(arr.shape))
        for n in g.node:
            self._ids.update(x for x in n.output if x)

    # -- opsets ---------------------------------------------------------------------------
    def _opset(self, version: int, prop: str):
        cur = self._opset_versions.get("ai.onnx")
        if cur is not None and cur != version:
            raise RuntimeError(f"Invalid opset '{prop}' selected. Opset for domain ai.onnx already defined as {cur}")
        if not MIN_AI_ONNX_OPSET <= version <= MAX_AI_ONNX_OPSET:
            raise popart_exception(f"Encountered ONNX opset version {version}, Maximimum supported opset is "
                                   f"{MAX_AI_ONNX_OPSET}, minimum {MIN_AI_ONNX_OPSET} and default "
                                   f"{DEFAULT_AI_ONNX_OPSET}.")
        return opset_class(version)(self)

    @property
    def aiOnnx(self):  # noqa: N802
        """The ai.onnx op table (opset 10 unless ``opsets`` or an earlier op chose another)."""
        v = self._opset_versions.get("ai.onnx", self._default_onnx)
        return self._opset(v, f"aiOnnxOpset{v}")

    def aiOnnxOpsetVersion(self, version: int) -> None:  # noqa: N802
        self._default_onnx = int(version)

    @property
    def aiGraphcore(self):  # noqa: N802
        return AiGraphcoreOpset1(self)

    aiGraphcoreOpset1 = aiGraphcore

    # -- ids ------------------------------------------------------------------------------
    def _next_id(self, name: str, n: int = -1) -> str:
        base = "".join(s + _SEP for s in self._scopes) + name + (f":{n}" if n >= 0 else "")
        proposed, counter = base, 0
        while proposed in self._ids:
            counter += 1
            proposed = f"{base}{_SEP}{counter}"
        self._ids.add(proposed)
        return proposed

    # -- inputs ---------------------------------------------------------------------------
    def addInputTensor(self, tensorInfo, shape_or_debug=None, debugContext="", settings=None):  # noqa: N802,N803
        """``addInputTensor(TensorInfo, debugContext="")`` or ``addInputTensor("FLOAT", shape,
        debugContext="")`` -> the new input's id (``input``, ``input/1`` ... or the prefix given)."""
        if isinstance(tensorInfo, TensorInfo):
            info = tensorInfo
            if isinstance(shape_or_debug, str):
                debugContext = shape_or_debug
        elif isinstance(tensorInfo, np.ndarray):
            info = TensorInfo(tensorInfo)
            if isinstance(shape_or_debug, str):
                debugContext = shape_or_debug
        else:
            if shape_or_debug is None:
                raise popart_exception("addInputTensor needs a TensorInfo, or a data type and a shape")
            info = TensorInfo(tensorInfo, shape_or_debug)
        tid = self._next_id(str(debugContext) or "input")
        vi = helper.make_tensor_value_info(tid, info.onnx_type(), info.shape())
        self._model.graph.input.append(vi)
        self._infos[tid] = (info.data_type(), info.shape())
        return tid

    def addUntypedInputTensor(self, debugContext=""):  # noqa: N802,N803
        """An input of no stated type or shape: subgraphs only (a ``Loop`` body's iteration count
        ...). Raises PopART's error on the top-level graph."""
        if self._parent is None:
            raise popart_exception("Can not add untyped tensors to the top-level graph. Use Builder::addInputTensor("
                                   "const TensorInfo &tensorInfo, const std::string &debugPrefix) instead.")
        tid = self._next_id(str(debugContext) or "input")
        self._model.graph.input.append(onnx.ValueInfoProto(name=tid))
        return tid

    def addInputTensorFromParentGraph(self, tensorId):  # noqa: N802,N803
        """Use tensor ``tensorId`` of an enclosing graph in this subgraph (ONNX lexical scope):
        returns ``tensorId``. Raises ``popart_exception`` on the top-level graph or for a tensor
        no enclosing graph has."""
        if self._parent is None:
            raise popart_exception("Can not add a tensor from a parent graph to the top-level graph: "
                                   "addInputTensorFromParentGraph is for subgraph builders (createSubgraphBuilder)")
        if tensorId not in self._parent._ids:
            raise popart_exception(f"Could not find tensor '{tensorId}' in the parent graph of this subgraph builder")
        return tensorId

    def createSubgraphBuilder(self) -> "Builder":  # noqa: N802
        """A builder for a graph nested in this one: the ``callee`` of ``aiGraphcore.call``, the
        body of ``aiOnnx.loop`` / ``scan``, a branch of ``aiOnnx.logical_if``. It shares this
        builder's tensor ids (names stay unique across the nesting) and reads its tensors
        (``addInputTensorFromParentGraph``); its inputs are ``addInputTensor`` /
        ``addUntypedInputTensor``, its outputs ``addOutputTensor``."""
        child = Builder(_parent=self)
        child._model.graph.name = f"{self._model.graph.name}_subgraph_{next(_graph_uid)}"
        return child

    def _root(self) -> "Builder":
        b = self
        while b._parent is not None:
            b = b._parent
        return b

    def addInitializedInputTensor(self, initVal, variableSettings=None, debugContext=""):  # noqa: N802,N803
        """A weight with value ``initVal`` (numpy array, made C-contiguous) -> its id
        (``init_input``, ``init_input/1`` ... or the prefix given).

        ``variableSettings`` (:class:`popart.VariableSettings`): a replica-grouped weight; its
        ``initVal`` holds one value per group, ``[groups, *shape]`` (no leading dimension with
        one group), and the model records the settings in its ``metadata_props`` as PopART does.
        The session checks the leading dimension against the groups of its replication factor
        (:mod:`openipu.popart.variable_settings`)."""
        if isinstance(variableSettings, str):
            variableSettings, debugContext = None, variableSettings
        from openipu.popart.variable_settings import VariableSettings, to_metadata
        if variableSettings is not None and not isinstance(variableSettings, VariableSettings):
            raise popart_exception(f"addInitializedInputTensor: variableSettings must be a popart.VariableSettings, "
                                   f"got {type(variableSettings).__name__}")
        arr = np.asarray(initVal)
        arr = np.ascontiguousarray(arr).reshape(arr.shape)      # (keeps 0-d scalars 0-d)
        name = dtype_name(arr.dtype)
        if name in ("DOUBLE", "UINT64", "STRING", "COMPLEX64", "COMPLEX128"):
            raise popart_exception(f"Unsupported data type for initialized data ({TensorInfo(arr)})")
        tid = self._next_id(str(debugContext) or "init_input")
        self._model.graph.input.append(helper.make_tensor_value_info(tid, ONNX_OF[name], list(arr.shape)))
        # PopART's storage: the typed field (float_data ...), see openipu.popart.tensor_proto
        self._model.graph.initializer.append(typed_tensor(arr, tid))
        self._infos[tid] = (name, list(arr.shape))
        self._consts[tid] = arr
        if variableSettings is not None:
            for key, value in to_metadata(variableSettings, tid):
                self._root()._model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
        return tid

    def addOutputTensor(self, outputName: str) -> None:  # noqa: N802,N803
        info = self._infos.get(outputName)
        if info is not None:
            vi = helper.make_tensor_value_info(outputName, ONNX_OF[info[0]], info[1])
        else:
            vi = onnx.ValueInfoProto(name=outputName)
        self._model.graph.output.append(vi)

    # -- ops ------------------------------------------------------------------------------
    def _op(self, op_type, domain, version, inputs, num_outputs, attrs, debugContext="", schema=None,  # noqa: N803
            out_infos=None):
        """Append a node; returns its output ids. ``out_infos``: the outputs' ``(dtype name,
        shape)`` when the caller knows them (no shape inference then)."""
        dkey = "ai.onnx" if domain in ("", "ai.onnx") else domain
        if schema is not None and schema.min_input > 0:
            mx = schema.max_input
            if len(inputs) < schema.min_input or (mx < _INF and len(inputs) > mx):
                raise popart_exception(f"{op_type} has invalid number of inputs {len(inputs)}. Must be between "
                                       f"{schema.min_input}..{mx if mx < _INF else 'inf'}")
        for i, x in enumerate(inputs):
            if x == "" and (schema is None or i >= schema.min_input):      # an omitted optional input
                continue
            if x not in self._ids:
                valid = sorted(self._ids)
                raise popart_exception(f"Unknown tensor '{x}' (" + (
                    "there are no valid tensors yet" if not valid else "valid tensors are " + ", ".join(valid)) + ").")
        cur = self._opset_versions.get(dkey)
        if cur is None:
            self._opset_versions[dkey] = version
            root = self._root()._model        # a subgraph's ops count in the model's opsets
            root.opset_import.append(helper.make_opsetid("" if dkey == "ai.onnx" else dkey, version))
            if dkey == "ai.onnx":
                root.ir_version = 3 if version <= 8 else 4 if version <= 11 else \
                    helper.find_min_ir_version_for([helper.make_opsetid("", version)])
        elif cur != version:
            raise popart_exception(f"Invalid opset {version} used to add an operation. Opset for domain {dkey} "
                                   f"already defined as {cur}")
        outputs = [self._next_id(op_type, i) for i in range(num_outputs)]
        node = onnx.NodeProto(op_type=op_type, input=list(inputs), output=outputs)
        if domain:
            node.domain = domain
        name = str(debugContext)
        if name or self._scopes:
            node.name = "".join(s + _SEP for s in self._scopes) + (name or op_type)
        for k, v in attrs.items():
            if isinstance(v, onnx.AttributeProto):
                node.attribute.append(v)
            elif v is not None:
                node.attribute.append(helper.make_attribute(k, v))
        for k, stack in self._attr_stack.items():
            if stack:
                node.attribute.append(helper.make_attribute(k, stack[-1]))
        self._model.graph.node.append(node)
        if out_infos is not None:
            self._set_infos(node, out_infos)
        else:
            self._infer(node, version)
        return outputs

    def _set_infos(self, node, outs) -> None:
        for o, info in zip(node.output, outs):
            if info is not None:
                self._infos[o] = (info[0], list(info[1]))
                self._model.graph.value_info.append(helper.make_tensor_value_info(o, ONNX_OF[info[0]], info[1]))

    def _infer(self, node: onnx.NodeProto, version: int) -> None:
        """Output types/shapes of ``node``: ONNX per-node inference, else the host kernel on zeros."""
        outs = None
        if node.domain in ("", "ai.onnx"):
            try:
                schema = defs.get_schema(node.op_type, version, "")
                types, data = {}, {}
                for x in node.input:
                    if x and x in self._infos:
                        dt, sh = self._infos[x]
                        types[x] = helper.make_tensor_type_proto(ONNX_OF[dt], sh)
                    if x in self._consts:
                        data[x] = numpy_helper.from_array(self._consts[x], x)
                res = onnx.shape_inference.infer_node_outputs(schema, node, types, data)
                outs = []
                for o in node.output:
                    info = value_info_of(onnx.ValueInfoProto(name=o, type=res[o])) if o in res else None
                    outs.append(info if info and info[1] is not None and all(isinstance(d, int) for d in info[1])
                                else None)
            except Exception as e:  # inference failure: fall back to the kernel
                log("builder").debug("ONNX shape inference failed for %s: %s", node.op_type, e)
                outs = None
        if (outs is None or any(o is None for o in outs)) and node.domain in ("", "ai.onnx") \
                and node.op_type in ("If", "Loop", "Scan"):
            sub = subgraph_output_infos(node, self._infos, self._consts)
            outs = [o if o is not None else p for o, p in zip(outs or [None] * len(sub), sub)]
        if outs is None or any(o is None for o in outs):
            kernel = find_kernel(node.domain, node.op_type)
            if kernel is not None and all(x == "" or x in self._infos for x in node.input):
                try:
                    ins = [None if x == "" else self._infos[x] for x in node.input]
                    cvs = [None if x not in self._consts else to_torch(self._consts[x]) for x in node.input]
                    attrs = decode_attrs(node)
                    attrs["__num_outputs__"] = len(node.output)     # the kernels' contract (as the IR's)
                    probed = probe(kernel, ins, attrs, version, cvs)
                    outs = [o if o is not None else p for o, p in zip(outs or [None] * len(probed), probed)]
                except Exception as e:
                    log("builder").warning("Shape inference failed for output '%s' of node '%s' (%s)",
                                           node.output[0], node.op_type, e)
        if outs is None:
            log("builder").warning("Shape inference failed for output '%s' of node '%s'", node.output[0], node.op_type)
            return
        self._set_infos(node, outs)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value":
                    self._consts[node.output[0]] = numpy_helper.to_array(a.t)

    def customOp(self, opName, opVersion, domain, inputs, attributes, numOutputs=1, name=""):  # noqa: N802,N803
        """A node of any op type (no schema checks): returns its output ids."""
        at = {k: _to_attr_value(k, v) for k, v in dict(attributes).items()}
        return self._op(opName, domain, int(opVersion), list(inputs), int(numOutputs), at, name)

    def reshape_const(self, aiOnnx, args, shape, debugContext=""):  # noqa: N802,N803
        """``reshape(args[0], constant(shape))`` (PopART's Python helper)."""
        c = aiOnnx.constant(np.asarray(shape, np.int64), debugContext + "_const")
        return aiOnnx.reshape([args[0], c], debugContext)

    # -- model ----------------------------------------------------------------------------
    def getModelProto(self, humanReadable: bool = False) -> bytes:  # noqa: N802,N803
        """The ONNX model as serialized bytes (text when ``humanReadable``)."""
        return str(self._model).encode() if humanReadable else self._model.SerializeToString()

    def saveModelProto(self, filename: str) -> None:  # noqa: N802
        onnx.save(self._model, filename)

    def setGraphName(self, name: str) -> None:  # noqa: N802
        self._model.graph.name = name or f"_{next(_graph_uid)}"

    def getInputTensorIds(self) -> list[str]:  # noqa: N802
        inits = {i.name for i in self._model.graph.initializer}
        return [i.name for i in self._model.graph.input if i.name not in inits]

    def getOutputTensorIds(self) -> list[str]:  # noqa: N802
        return [o.name for o in self._model.graph.output]

    def getValueTensorIds(self) -> list[str]:  # noqa: N802
        return [v.name for v in self._model.graph.value_info]

    def getTrainableTensorIds(self) -> list[str]:  # noqa: N802
        return [i.name for i in self._model.graph.initializer
                if dtype_name(i.data_type) in ("FLOAT", "FLOAT16")]

    def isInitializer(self, tid: str) -> bool:  # noqa: N802
        return any(i.name == tid for i in self._model.graph.initializer)

    def hasValueInfo(self, tid: str) -> bool:  # noqa: N802
        return tid in self._infos

    def _info(self, tid: str):
        if tid not in self._infos:
            if tid not in self._ids:
                raise popart_exception(f"{tid} is not an input, output or value tensor of the graph; no tensor "
                                       "of that id exists")
            raise popart_exception(f"No shape information for tensor {tid}: shape inference could not infer it")
        return self._infos[tid]

    def getTensorShape(self, tid: str) -> list[int]:  # noqa: N802
        return list(self._info(tid)[1])

    def getTensorDtypeString(self, tid: str) -> str:  # noqa: N802
        """The tensor's element type as a lower-case numpy-style name (``"float32"``, ``"float16"``)."""
        name = self._info(tid)[0]
        return np.dtype(NUMPY_OF[name]).name if name in NUMPY_OF else name.lower()

    def getTensorDataType(self, tid: str):  # noqa: N802
        return TensorInfo(self._info(tid)[0], []).dataType()

    def embedReplicationFactor(self, n: int) -> None:  # noqa: N802
        """Record the replication factor ``n`` in the model's ``metadata_props`` under PopART's
        key ``__replicationFactor``: ``resetHostWeights`` then reads a replica-grouped weight's
        initializer as ``[groups, *shape]`` (PopART's ``Builder::embedReplicationFactor``)."""
        self._model.metadata_props.append(onnx.StringStringEntryProto(key=REPLICATION_FACTOR_KEY, value=str(int(n))))

    # -- annotations ----------------------------------------------------------------------
    def _find_node(self, ids) -> onnx.NodeProto:
        want = {ids} if isinstance(ids, str) else set(ids)
        for n in self._model.graph.node:
            if set(n.output) >= want and want:
                return n
        raise popart_exception(f"Could not find a node with outputs {', '.join(sorted(want))}. "
                               "Must specify all outputs of a node")

    def _set_attr(self, ids, name, value):
        node = self._find_node(ids)
        for a in list(node.attribute):
            if a.name == name:
                node.attribute.remove(a)
        node.attribute.append(helper.make_attribute(name, value))

    def _get_attr(self, ids, name):
        node = self._find_node(ids)
        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        raise popart_exception(f"Node does not have an attribute {name}.")

    def _annotate(self, attr, first, value):
        """Setter (``f(ids, value)``) or context-manager (``with f(value):``) form."""
        if isinstance(first, (str, set, list, tuple)) and not isinstance(first, bool):
            ids = [first] if isinstance(first, str) else list(first)
            for tid in ids:
                self._set_attr(tid, attr, value)
            return None
        return _AttributeContext(self, attr, first)

    def virtualGraph(self, idOrValue, value: int = 0):  # noqa: N802,N803
        """``virtualGraph(tensorId(s), ipu)`` or ``with builder.virtualGraph(ipu):``."""
        return self._annotate(VGRAPH_ATTR, idOrValue, int(value))

    def pipelineStage(self, idOrValue, value: int = 0):  # noqa: N802,N803
        return self._annotate(PIPELINE_ATTR, idOrValue, int(value))

    def executionPhase(self, idOrValue, value: int = 0):  # noqa: N802,N803
        return self._annotate(PHASE_ATTR, idOrValue, int(value))

    def schedulePriority(self, value: float):  # noqa: N802
        return _AttributeContext(self, PRIORITY_ATTR, float(value))

    def recomputeOutput(self, idOrValue, value=None):  # noqa: N802,N803
        return self._annotate(RECOMPUTE_ATTR, idOrValue, str(value if value is not None else idOrValue))

    def recomputeOutputInBackwardPass(self, ids, value="Recompute"):  # noqa: N802
        self._annotate(RECOMPUTE_ATTR, ids, str(value))

    def checkpointOutput(self, nodeOutputNames) -> list[str]:  # noqa: N802,N803
        """PopART's ``Builder.checkpointOutput``: one identity per tensor, annotated
        ``RecomputeType.Checkpoint`` (its output is kept, never recomputed). Returns the new ids."""
        outs = []
        for tid in nodeOutputNames:
            y = self.aiOnnx.identity([tid], "Checkpoint")
            self._annotate(RECOMPUTE_ATTR, [y], "Checkpoint")
            outs.append(y)
        return outs

    def saveInitializersExternally(self, ids, filename: str) -> None:  # noqa: N802
        """Move the data of initializers ``ids`` into ``filename`` (``EXTERNAL`` data location,
        read back when a session loads the model): PopART's ``Builder.saveInitializersExternally``
        (:func:`openipu.popart.graph_transformer.save_initializers_externally`)."""
        from openipu.popart.graph_transformer import save_initializers_externally
        save_initializers_externally(self._root()._model, list(ids), str(filename))

    def getRecomputeOutputInBackwardPass(self, ids) -> bool:  # noqa: N802
        try:
            return self._get_attr(ids, RECOMPUTE_ATTR) not in (b"Undefined", "Undefined")
        except popart_exception:
            return False

    def outputTensorLocation(self, idOrValue, value=None):  # noqa: N802,N803
        return self._annotate("__output_tensor_location", idOrValue, str(value))

    def getVirtualGraph(self, ids=None) -> int:  # noqa: N802
        if ids is None:
            stack = self._attr_stack.get(VGRAPH_ATTR)
            if not stack:
                raise popart_exception("Virtual graph not set in current scope")
            return stack[-1]
        return int(self._get_attr(ids, VGRAPH_ATTR))

    def hasVirtualGraph(self, ids=None) -> bool:  # noqa: N802
        try:
            self.getVirtualGraph(ids)
            return True
        except popart_exception:
            return False

    def getPipelineStage(self, ids=None) -> int:  # noqa: N802
        if ids is None:
            stack = self._attr_stack.get(PIPELINE_ATTR)
            if not stack:
                raise popart_exception("Pipeline stage not set in current scope.")
            return stack[-1]
        return int(self._get_attr(ids, PIPELINE_ATTR))

    def hasPipelineStage(self, ids=None) -> bool:  # noqa: N802
        try:
            self.getPipelineStage(ids)
            return True
        except popart_exception:
            return False

    def getExecutionPhase(self, ids=None) -> int:  # noqa: N802
        if ids is None:
            stack = self._attr_stack.get(PHASE_ATTR)
            if not stack:
                raise popart_exception("Execution phase not set in current scope.")
            return stack[-1]
        return int(self._get_attr(ids, PHASE_ATTR))

    def hasExecutionPhase(self, ids=None) -> bool:  # noqa: N802
        try:
            self.getExecutionPhase(ids)
            return True
        except popart_exception:
            return False

    def nameScope(self, name: str):  # noqa: N802
        """``with builder.nameScope("layer1"):`` prefixes ids and node names with ``layer1/``."""
        return _NameContext(self, name)

    def getNameScope(self, name: str = "") -> str:  # noqa: N802
        return "".join(s + _SEP for s in self._scopes) + name

    def setAvailableMemoryProportion(self, ids, proportion: float) -> None:  # noqa: N802
        """Temporary-memory budget of a MatMul / Conv, in [0, 1) of tile memory (used by poplin)."""
        if not 0 <= float(proportion) <= 1:
            raise popart_exception(f"availableMemoryProportion must be in (0,1]. Got {proportion}")
        self._annotate(AMP_ATTR, ids, float(proportion))

    def setPartialsType(self, tid: str, partialsType: str) -> None:  # noqa: N802,N803
        """Accumulation type of a MatMul / Conv: ``"FLOAT"`` or ``"HALF"``."""
        p = str(partialsType).upper()
        if p not in ("FLOAT", "HALF"):
            raise popart_exception(f"Unsupported partials type '{partialsType}': use 'FLOAT' or 'HALF'")
        self._set_attr(tid, PARTIALS_ATTR, p)

    def getPartialsType(self, tid: str) -> str:  # noqa: N802
        try:
            v = self._get_attr(tid, PARTIALS_ATTR)
            return v.decode() if isinstance(v, bytes) else v
        except popart_exception:
            return "FLOAT"

    def setSerializeMatMul(self, ids, mode: str, factor: int = 0, keep_precision: bool = False) -> None:  # noqa: N802
        """Accepted and recorded (``input_channels``, ``output_channels``, ``reducing_dim``, ``none``)."""
        if mode not in ("input_channels", "output_channels", "reducing_dim", "none"):
            raise popart_exception(f"Unsupported mat mul serialization mode '{mode}'. Supported modes are "
                                   "'input_channels', 'reducing_dim', 'output_channels' or 'none'")
        for tid in ([ids] if isinstance(ids, str) else list(ids)):
            self._set_attr(tid, SERIALIZE_MODE_ATTR, mode)
            self._set_attr(tid, SERIALIZE_FACTOR_ATTR, int(factor))
            self._set_attr(tid, SERIALIZE_PRECISION_ATTR, int(bool(keep_precision)))

    def setEnableConvDithering(self, tid, value) -> None:  # noqa: N802
        self._set_attr(tid, "__enable_conv_dithering", int(value))

    def excludePatterns(self, tid, patterns) -> None:  # noqa: N802
        self._set_attr(tid, "__exclude_patterns", list(patterns))

    def setInplacePreferences(self, tid, prefs: dict) -> None:  # noqa: N802
        pass

    # generic node attributes
    def addNodeAttribute(self, name: str, value, nodeOutputNames) -> None:  # noqa: N802,N803
        node = self._find_node(nodeOutputNames)
        if any(a.name == name for a in node.attribute):
            raise popart_exception(f"Node already has attribute {name}.")
        node.attribute.append(helper.make_attribute(name, _to_attr_value(name, value)))

    def nodeHasAttribute(self, name: str, nodeOutputNames) -> bool:  # noqa: N802,N803
        return any(a.name == name for a in self._find_node(nodeOutputNames).attribute)

    def _typed_attr(self, name, ids, kind):
        v = self._get_attr(ids, name)
        return v.decode() if isinstance(v, bytes) else [x.decode() for x in v] if kind == "strs" else v

    def getInt64NodeAttribute(self, name, ids): return int(self._typed_attr(name, ids, "int"))  # noqa: E704,N802
    def getInt64VectorNodeAttribute(self, name, ids): return list(self._typed_attr(name, ids, "ints"))  # noqa: E704,N802
    def getFloatNodeAttribute(self, name, ids): return float(self._typed_attr(name, ids, "float"))  # noqa: E704,N802
    def getFloatVectorNodeAttribute(self, name, ids): return list(self._typed_attr(name, ids, "floats"))  # noqa: E704,N802
    def getStringNodeAttribute(self, name, ids): return self._typed_attr(name, ids, "str")  # noqa: E704,N802
    def getStringVectorNodeAttribute(self, name, ids): return self._typed_attr(name, ids, "strs")  # noqa: E704,N802

    def removeNodeAttribute(self, name: str, nodeOutputNames) -> None:  # noqa: N802,N803
        node = self._find_node(nodeOutputNames)
        for a in list(node.attribute):
            if a.name == name:
                node.attribute.remove(a)
                return
        raise popart_exception(f"Cannot remove attribute {name} as it does not exist.")

    def getAllNodeAttributeNames(self, nodeOutputNames) -> list[str]:  # noqa: N802,N803
        return [a.name for a in self._find_node(nodeOutputNames).attribute]


def _add_opset_properties():
    for v in range(MIN_AI_ONNX_OPSET, MAX_AI_ONNX_OPSET + 1):
        def prop(self, v=v):
            return self._opset(v, f"aiOnnxOpset{v}")
        setattr(Builder, f"aiOnnxOpset{v}", property(prop, doc=f"The ai.onnx opset {v} op table."))


_add_opset_properties()

