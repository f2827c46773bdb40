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
"""

from __future__ import annotations

import collections
import inspect
import itertools
import os

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

from openipu.popart.errors import popart_exception
from openipu.popart.tensor_proto import read_external_data, typed_tensor
from openipu.popart import graphcore_ops as gco
from openipu.popart.graphcore_ops import GRAPHCORE, find_kernel
from openipu.popart.log import log
from openipu.popart.shapes import decode_attrs, probe, subgraph_output_infos, to_torch, value_info_of
from openipu.popart.tensorinfo import NUMPY_OF, ONNX_OF, TensorInfo, dtype_name

DEFAULT_AI_ONNX_OPSET = 10
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

_RENAMED = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor", "Not": "logical_not", "If": "logical_if"}


def method_name(op_type: str) -> str:
    """The ``aiOnnx`` method that adds ONNX op ``op_type``: ``"Add"`` -> ``add``, ``"And"`` ->
    ``logical_and`` (PopART's spelling)."""
    return _RENAMED.get(op_type, op_type.lower())


_SEP = "/"
_graph_uid = itertools.count()
_INF = 2147483647


def _load_model(model_or_path) -> onnx.ModelProto:
    """ModelProto from a path, serialized bytes or a ModelProto; PopART's error texts."""
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
                load_external_data_for_model(m, os.path.dirname(os.path.abspath(path)))
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


def _to_attr_value(name, value, attr_type=None):
    """A Python / numpy value as something ``helper.make_attribute`` takes; ``None`` = omit."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and len(value) == 0:
        return None
    if isinstance(value, np.ndarray):
        return numpy_helper.from_array(np.ascontiguousarray(value).reshape(value.shape), name)
    if isinstance(value, (np.integer, bool)):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, Builder):
        return value._model.graph
    if attr_type == onnx.AttributeProto.FLOAT and isinstance(value, int):
        return float(value)
    if attr_type == onnx.AttributeProto.FLOATS and isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    if attr_type == onnx.AttributeProto.TENSOR and not isinstance(value, onnx.TensorProto):
        return numpy_helper.from_array(np.asarray(value), name)
    return value


# ----------------------------------------------------------------------------------------------
# opset classes generated from onnx.defs
# ----------------------------------------------------------------------------------------------
def _schemas_for(version: int) -> dict[str, defs.OpSchema]:
    """Latest ai.onnx schema of each op with since_version <= version (deprecated ones left out)."""
    best: dict[str, defs.OpSchema] = {}
    for s in defs.get_all_schemas_with_history():
        if s.domain not in ("", "ai.onnx") or s.since_version > version:
            continue
        cur = best.get(s.name)
        if cur is None or s.since_version > cur.since_version:
            best[s.name] = s
    return {k: s for k, s in best.items() if not s.deprecated}


def _output_arity(schema) -> tuple[bool, int]:
    """``(takes_num_outputs, fixed_count)``."""
    outs = schema.outputs
    if schema.max_output == 1:
        return False, 1
    fixed = all(o.option == defs.OpSchema.FormalParameterOption.Single for o in outs)
    return (not fixed), len(outs)


def _make_onnx_method(schema):
    op = schema.name
    takes_args = schema.max_input > 0
    takes_n, n_fixed = _output_arity(schema)
    attrs = schema.attributes
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD)]
    if op == "Constant":
        params += [P("value", P.POSITIONAL_OR_KEYWORD), P("is_value_sparse", P.POSITIONAL_OR_KEYWORD, default=False)]
        attr_names = []
    else:
        if takes_args:
            params.append(P("args", P.POSITIONAL_OR_KEYWORD))
        if takes_n:
            params.append(P("num_outputs", P.POSITIONAL_OR_KEYWORD))
        # Split-18's ``num_outputs`` attribute is the ``num_outputs`` argument
        own = {n: a for n, a in attrs.items() if not (takes_n and n == "num_outputs")}
        required = sorted(n for n, a in own.items() if a.required and a.type != onnx.AttributeProto.GRAPH)
        optional = sorted(n for n, a in own.items() if not a.required)
        graphs = sorted(n for n, a in attrs.items() if a.required and a.type == onnx.AttributeProto.GRAPH)
        # PopART's order: the subgraphs first (``scan(args, num_outputs, body, num_scan_inputs, ...)``)
        attr_names = graphs + required + optional
        for n in graphs + required:
            params.append(P(n, P.POSITIONAL_OR_KEYWORD))
        for n in optional:
            a = attrs[n]
            dv = helper.get_attribute_value(a.default_value) if a.default_value.name else None
            if isinstance(dv, bytes):
                dv = dv.decode()
            if isinstance(dv, onnx.TensorProto):
                dv = None
            params.append(P(n, P.POSITIONAL_OR_KEYWORD, default=dv))
    params.append(P("debugContext", P.POSITIONAL_OR_KEYWORD, default=""))
    sig = inspect.Signature(params)

    def method(self, *a, **kw):
        b = sig.bind(self, *a, **kw)
        b.apply_defaults()
        v = b.arguments
        if op == "Constant":
            value = v["value"]
            if not isinstance(value, np.ndarray):
                value = np.asarray(value)
            at = {"value": numpy_helper.from_array(np.ascontiguousarray(value).reshape(value.shape), "value")}
            return self._builder._op(op, "", self._version, [], 1, at, v["debugContext"])[0]
        at = {}
        for n in attr_names:
            val = v[n]
            if op == "Cast" and n == "to" and not isinstance(val, (int, np.integer)):
                val = ONNX_OF[dtype_name(val)]
            at[n] = _to_attr_value(n, val, attrs[n].type)
            if n == "axes" and op.startswith("Reduce") and isinstance(val, (list, tuple)) and not val:
                # PopART keeps an empty ``axes`` list (its ReduceOp then reduces over no axis)
                at[n] = helper.make_attribute("axes", [], attr_type=onnx.AttributeProto.INTS)
        inputs = list(v["args"]) if takes_args else []
        n_out = int(v["num_outputs"]) if takes_n else n_fixed
        if takes_n and "num_outputs" in attrs and len(inputs) < 2:      # Split-18 without a split input
            at["num_outputs"] = _to_attr_value("num_outputs", n_out, attrs["num_outputs"].type)
        outs = self._builder._op(op, "", self._version, inputs, n_out, at, v["debugContext"], schema=schema)
        return outs if (takes_n or n_fixed > 1) else outs[0]

    name = method_name(op)
    method.__name__ = name
    method.__qualname__ = name
    method.__signature__ = sig
    method.__doc__ = f"ONNX ``{op}`` (opset {schema.since_version} definition) added to the graph."
    return name, method


class _Opset:
    """Base of the ``aiOnnxOpsetN`` op tables."""

    domain = ""
    _version = DEFAULT_AI_ONNX_OPSET

    def __init__(self, builder: "Builder"):
        self._builder = builder

    def getOpsetVersion(self) -> int:  # noqa: N802
        return self._version


_OPSET_CLASSES: dict[int, type] = {}


def opset_class(version: int) -> type:
    """The generated op-table class for ai.onnx opset ``version`` (cached)."""
    cls = _OPSET_CLASSES.get(version)
    if cls is None:
        methods = {"_version": version}
        for schema in _schemas_for(version).values():
            name, fn = _make_onnx_method(schema)
            methods[name] = fn
        cls = type(f"AiOnnxOpset{version}", (_Opset,), methods)
        _OPSET_CLASSES[version] = cls
    return cls


# ----------------------------------------------------------------------------------------------
# ai.graphcore
# ----------------------------------------------------------------------------------------------
_REDUCTION = {"Sum": 0, "Mean": 1, "NoReduction": 2}


class AiGraphcoreOpset1:
    """``builder.aiGraphcore``: PopART's ``ai.graphcore`` ops (``AiGraphcoreOpset1``).

    Each method adds one node and returns its output id (a list for ops with several outputs),
    as PopART's builder does. ``args`` is a list of tensor ids; a wrong count raises PopART's
    ``"<Op> has invalid number of inputs <n>. Must be between <lo>..<hi>"`` (``popart_exception``).
    Reduction enums (``popart.ReductionType``, ``popart.ScatterReduction``, ``popart.InitType``)
    may be given as the enum member or its name.
    """

    _version = 1

    def __init__(self, builder: "Builder"):
        self._builder = builder

    def _op(self, op, args, attrs, debugContext="", n=1, out_infos=None):  # noqa: N803
        args = _tensor_ids(op, args)
        lo, hi = _GC_ARITY.get(op, (None, None))
        if lo is not None and not lo <= len(args) <= hi:
            raise popart_exception(f"{op} has invalid number of inputs {len(args)}. Must be between {lo}..{hi}")
        at = {k: _to_attr_value(k, v) for k, v in attrs.items()}
        return self._builder._op(op, GRAPHCORE, 1, args, n, at, debugContext, out_infos=out_infos)

    def getOpsetVersion(self) -> int:  # noqa: N802
        return 1

    # -- element-wise and identity-like ---------------------------------------------------------
    def gelu(self, args, debugContext=""):  # noqa: N803
        """GELU, tanh approximation (``popnn`` GELU); float, shape kept."""
        return self._op("Gelu", args, {}, debugContext)[0]

    def geluerf(self, args, debugContext=""):  # noqa: N803
        """GELU with the exact erf; float, shape kept."""
        return self._op("GeluErf", args, {}, debugContext)[0]

    def swish(self, args, debugContext=""):  # noqa: N803
        """``x * sigmoid(x)`` (SiLU); float, shape kept."""
        return self._op("Swish", args, {}, debugContext)[0]

    def scale(self, args, scale, debugContext=""):  # noqa: N803
        """``x * scale`` (scale a float)."""
        return self._op("Scale", args, {"scale": float(scale)}, debugContext)[0]

    def scaledadd(self, args, scale0=1.0, scale1=1.0, debugContext=""):  # noqa: N803
        """``scale0 * a + scale1 * b``; ``args = [a, b]`` or ``[a, b, scale0, scale1]`` (scalar
        tensors that replace the attributes)."""
        return self._op("ScaledAdd", args, {"scale0": float(scale0), "scale1": float(scale1)}, debugContext)[0]

    def detach(self, args, debugContext=""):  # noqa: N803
        """The input unchanged; no gradient flows back through it in training."""
        return self._op("Detach", args, {}, debugContext)[0]

    def nop(self, args, debugContext=""):  # noqa: N803
        """The input unchanged (an identity the optimisations keep)."""
        return self._op("Nop", args, {}, debugContext)[0]

    def printtensor(self, args, print_gradient=1, debugContext="", title="", summariseThreshold=1000,  # noqa: N803
                    edgeItems=3, maxLineWidth=75, digits=8, floatFormat=0, separator=" ", openBracket="[",
                    closeBracket="]"):
        """The input unchanged; each run prints it to stdout as ``title: [values]`` (``title``
        defaults to the input id), and in training its gradient too (as ``<title>_gradient``, or
        the gradient's id) unless ``print_gradient`` is 0. The formatting arguments are
        accepted; the text is Poplar's ``PrintTensor`` format."""
        return self._op("PrintTensor", args, {"print_gradient": int(print_gradient), "title": title or None},
                        debugContext)[0]

    def tensorremap(self, args, remap_type=0, debugContext=""):  # noqa: N803
        """The input unchanged, with a layout chosen for its consumers (``popart.TensorRemapType``
        FwdBwdReverse 0, FwdBwd 1, Fwd 2, or the number): functionally an identity."""
        kinds = ("FwdBwdReverse", "FwdBwd", "Fwd")
        if not isinstance(remap_type, (int, np.integer)):
            name = str(remap_type).split(".")[-1]
            if name not in kinds:
                raise popart_exception(f"Unknown TensorRemapType '{remap_type}': use one of {', '.join(kinds)}")
            remap_type = kinds.index(name)
        return self._op("TensorRemap", args, {"remap_type": int(remap_type)}, debugContext)[0]

    def replicatedallreduce(self, args, collectiveOperator=None, commGroup=None, debugContext=""):  # noqa: N803
        """Sum (``collectiveOperator``, default Add) of the input over the replicas; with one
        replica the input itself."""
        op, debugContext = _collective(collectiveOperator, debugContext, "replicatedallreduce")
        return self._op("ReplicatedAllReduce", args, {"op": op}, debugContext)[0]

    def incrementmod(self, args, increment, modulus, debugContext=""):  # noqa: N803
        """``(x + increment) % modulus`` (a float ``increment`` and ``modulus``; the type is x's)."""
        if float(modulus) == 0:
            raise popart_exception("IncrementModOp: modulus must not be 0")
        return self._op("IncrementMod", args, {"increment": float(increment), "modulus": float(modulus)},
                        debugContext)[0]

    def copyvarupdate(self, args, debugContext=""):  # noqa: N803
        """``args = [variable, updater]``: each run, the variable (an initializer) takes the
        updater's value; returns the updated variable (use it to order later reads)."""
        return self._op("CopyVarUpdate", args, {}, debugContext)[0]

    def abort(self, args=(), debugContext=""):  # noqa: N803
        """Stop the program (``poplar_application_runtime_error`` from ``run``): always with no
        input, else when the scalar input is non-zero. Returns None."""
        self._op("Abort", list(args), {}, debugContext, n=0, out_infos=[])
        return None

    # -- losses --------------------------------------------------------------------------------
    def identityloss(self, args, reduction="Mean", debugContext=""):  # noqa: N803
        """The input as a loss: summed (Sum), averaged (Mean), or as it is (NoReduction)."""
        return self._op("IdentityLoss", args, {"reduction": _reduction(reduction)}, debugContext)[0]

    def nllloss(self, args, reduction="Mean", ignoreIndex=None, inputIsLogProbability=False,  # noqa: N803
                debugContext=""):  # noqa: N803
        """Negative log-likelihood of ``args = [probs, label]`` (probs ``[..., C]`` float, label
        ``[...]`` int); a scalar unless ``reduction`` is ``NoReduction``."""
        attrs = {"reduction": _reduction(reduction), "inputIsLogProbability": int(bool(inputIsLogProbability))}
        if ignoreIndex is not None:
            attrs["ignoreIndex"] = int(ignoreIndex)
        return self._op("Nll", args, attrs, debugContext)[0]

    def l1loss(self, args, lambda_, reduction="Mean", debugContext=""):  # noqa: N803
        """``lambda_ * |x|`` reduced (``args = [x]``)."""
        return self._op("L1", args, {"lambda": float(lambda_), "reduction": _reduction(reduction)}, debugContext)[0]

    def ctcloss(self, args, reduction="Mean", blank=0, outDataType="UNDEFINED", zeroInfinity=False,  # noqa: N803
                debugContext=""):
        """Connectionist temporal classification loss (``torch.nn.functional.ctc_loss``) of
        ``args = [log_probs [T, N, C] float, targets [N, S] int, input_lengths [N] int,
        target_lengths [N] int]``; Mean divides each sample's loss by its target length, then
        averages over the batch. ``outDataType`` ("UNDEFINED": the log_probs' type) is the
        loss's type; ``zeroInfinity`` zeroes infinite losses and their gradients. Returns the
        loss id (PopART's Ctc op has a second output, the gradient of the losses w.r.t. the
        log-probabilities, which ``_ctcloss`` also returns)."""
        return self._ctcloss(args, reduction, blank, outDataType, zeroInfinity, debugContext)[0]

    def _ctcloss(self, args, reduction="Mean", blank=0, outDataType="UNDEFINED", zeroInfinity=False,  # noqa: N803
                 debugContext=""):
        out = str(outDataType).split(".")[-1].upper()
        if out not in ("UNDEFINED", "FLOAT", "FLOAT16"):
            raise popart_exception(f"CtcOp: outDataType must be UNDEFINED, FLOAT or FLOAT16, not {outDataType}")
        attrs = {"reduction": _reduction(reduction), "blank": int(blank), "outDataType": out,
                 "zeroInfinity": int(bool(zeroInfinity))}
        return self._op("Ctc", args, attrs, debugContext, n=2)

    # -- shapes, slices and views --------------------------------------------------------------
    def reshape(self, args, shape, debugContext=""):  # noqa: N803
        """Reshape to ``shape`` (an attribute, not a tensor input)."""
        if isinstance(args, str):
            args = [args]
        return self._op("Reshape", args, {"shape": [int(s) for s in shape]}, debugContext)[0]

    def subsample(self, args, strides, debugContext=""):  # noqa: N803
        """Every ``strides[d]``-th element along each dimension ``d``."""
        if any(int(s) < 1 for s in strides):
            raise popart_exception(f"Strides invalid. Must be greater than 0, got {list(strides)}")
        return self._op("Subsample", args, {"strides": [int(s) for s in strides]}, debugContext)[0]

    def reverse(self, args, dimensions, debugContext=""):  # noqa: N803
        """The input flipped along ``dimensions``."""
        return self._op("Reverse", args, {"dimensions": [int(d) for d in dimensions]}, debugContext)[0]

    def slice(self, args, ends, starts, axes=(), debugContext=""):  # noqa: N803
        """ONNX Slice with ``starts`` / ``ends`` / ``axes`` as attributes."""
        return self._op("Slice", args, {"ends": list(ends), "starts": list(starts), "axes": list(axes)},
                        debugContext)[0]

    def depthtospace(self, args, blocksize, mode="DCR", debugContext=""):  # noqa: N803
        """``[N, C, H, W] -> [N, C / B^2, H B, W B]`` (ONNX DepthToSpace-11, ``mode`` DCR or CRD)."""
        if str(mode) not in ("DCR", "CRD"):
            raise popart_exception(f"DepthToSpace: mode must be 'DCR' or 'CRD', not '{mode}'")
        if int(blocksize) < 1:
            raise popart_exception(f"DepthToSpace: blocksize must be positive, got {blocksize}")
        return self._op("DepthToSpace", args, {"blocksize": int(blocksize), "mode": str(mode)}, debugContext)[0]

    def dynamicslice(self, args, axes, sizes, noOverlap=0, debugContext=""):  # noqa: N803
        """``tensor[offset]``: ``args = [tensor, offset]``, ``offset`` ``[len(axes)]`` (integers,
        element offsets along ``axes``); the output has ``sizes[i]`` elements along ``axes[i]``."""
        return self._op("DynamicSlice", args, _dyn_attrs(axes, sizes, noOverlap), debugContext)[0]

    def dynamicupdate(self, args, axes, sizes, noOverlap=0, debugContext=""):  # noqa: N803
        """A copy of ``tensor`` with ``slice`` written at ``offset``: ``args = [tensor, offset, slice]``."""
        return self._op("DynamicUpdate", args, _dyn_attrs(axes, sizes, noOverlap), debugContext)[0]

    def dynamiczero(self, args, axes, sizes, debugContext=""):  # noqa: N803
        """A copy of ``tensor`` with the slice at ``offset`` zeroed: ``args = [tensor, offset]``."""
        return self._op("DynamicZero", args, _dyn_attrs(axes, sizes), debugContext)[0]

    def dynamicadd(self, args, axes, sizes, debugContext=""):  # noqa: N803
        """A copy of ``tensor`` with ``slice`` added at ``offset``: ``args = [tensor, offset, slice]``."""
        return self._op("DynamicAdd", args, _dyn_attrs(axes, sizes), debugContext)[0]

    def sequenceslice(self, args, zeroUnused=0, debugContext=""):  # noqa: N803
        """``args = [source, destination, N, sourceOffset, destinationOffset]``: a copy of
        ``destination`` with rows ``destinationOffset[i] : +N[i]`` taken from rows
        ``sourceOffset[i] : +N[i]`` of ``source`` (outer dimension; rank >= 2); unreferenced
        rows zeroed when ``zeroUnused``."""
        return self._op("SequenceSlice", args, {"zeroUnused": int(zeroUnused)}, debugContext)[0]

    def init(self, shape, data_type, init_type, batch_axis=-1, debugContext=""):  # noqa: N803
        """A new tensor of ``shape`` and ``data_type`` (``popart.DataType`` / name / PopART's enum
        value), zeroed (``InitType.Zero``) or left as it is (``NoInit``; zeros in openipu's
        fresh memory). ``batch_axis`` is recorded."""
        if isinstance(batch_axis, str) and not debugContext:
            batch_axis, debugContext = -1, batch_axis
        attrs = {"shape": [int(s) for s in shape], "data_type": _data_type_code(data_type),
                 "init_type": _init_type(init_type), "batch_axis": int(batch_axis)}
        name = _DATA_TYPES[attrs["data_type"]]
        return self._op("Init", [], attrs, debugContext, out_infos=[(name, attrs["shape"])])[0]

    # -- normalisation, reductions, sorting, indexing --------------------------------------------
    def groupnormalization(self, args, num_groups, epsilon=1e-5, debugContext=""):  # noqa: N803
        """Group normalisation of ``args = [x [N, C, ...], scale [C], bias [C]]`` over
        ``num_groups`` groups of channels (contiguous; strided with the session option
        ``groupNormStridedChannelGrouping``). Returns ``[y, mean, invStdDev]``, the statistics
        ``[N * num_groups]``."""
        if int(num_groups) < 1:
            raise popart_exception(f"GroupNormOp: num_groups must be positive, got {num_groups}")
        return self._op("GroupNormalization", args, {"num_groups": int(num_groups), "epsilon": float(epsilon)},
                        debugContext, n=3)

    def reducemedian(self, args, axes=None, keepdims=1, debugContext=""):  # noqa: N803
        """Median over ``axes`` (all by default; the lower median of an even count) and its index
        (flattened over the reduced axes, INT32). Returns ``[values, indices]``."""
        attrs = {"keepdims": int(keepdims)}
        if axes is not None:
            attrs["axes"] = [int(a) for a in axes]
        return self._op("ReduceMedian", args, attrs, debugContext, n=2)

    def scatterreduce(self, args, axis_size, axis=-1, reduction="Sum", enable_index_broadcast=1,  # noqa: N803
                      debugContext=""):
        """``out[i] = reduce(src[index == i])`` along ``axis`` (``axis_size`` rows out):
        ``args = [src, index]`` or ``[src, index, initial]``; ``reduction`` Sum, Max, Min, Mul
        or NoReduction (a plain scatter); rows no index selects are 0 (or ``initial``). A 1-D
        ``index`` broadcasts along ``axis`` when ``enable_index_broadcast``."""
        if isinstance(enable_index_broadcast, str) and not debugContext:
            enable_index_broadcast, debugContext = 1, enable_index_broadcast
        red = str(reduction).split(".")[-1]
        if red.lower() not in _SCATTER_REDUCTIONS:
            raise popart_exception(f"Unknown ScatterReduction '{reduction}'. Use one of Sum, Max, Min, Mul, "
                                   "NoReduction")
        return self._op("ScatterReduce", args, {"axis_size": int(axis_size), "axis": int(axis),
                                                "reduction": _SCATTER_REDUCTIONS[red.lower()],
                                                "enable_index_broadcast": int(enable_index_broadcast)},
                        debugContext)[0]

    def groupedgather(self, args, axis=0, group_size=1, debugContext=""):  # noqa: N803
        """Gather per group: ``args = [data [G, ...], indices [G, ...]]``, group ``g``'s
        indices index group ``g``'s data along ``axis`` (of the data, >= 1)."""
        return self._op("GroupedGather", args, {"axis": int(axis), "group_size": int(group_size)}, debugContext)[0]

    def sort(self, args, axis=-1, descending=False, stable=False, debugContext=""):  # noqa: N803
        """Sort along ``axis``: returns ``[values, indices]`` (indices INT64, as PopART's Sort)."""
        return self._op("Sort", args, {"axis": int(axis), "descending": int(bool(descending)),
                                       "stable": int(bool(stable))}, debugContext, n=2)

    def bucketize(self, args, right=False, debugContext=""):  # noqa: N803
        """``torch.bucketize``: for ``args = [x, boundaries]`` (boundaries 1-D, sorted), the
        index of each element's bucket (INT32)."""
        return self._op("Bucketize", args, {"right": int(bool(right))}, debugContext)[0]

    def normalize_image(self, args, scale=1.0, debugContext=""):  # noqa: N803
        """``args = [image [..., 3], offsets [3], scales [3]]``: ``(image * scale - offsets[c]) *
        scales[c]`` per channel, padded to 4 channels with zeros (``popops::normaliseImage``);
        UINT8 images give FLOAT16."""
        return self._op("NormalizeImage", args, {"scale": float(scale)}, debugContext)[0]

    # -- dropout -------------------------------------------------------------------------------
    def shapeddropout(self, args, shape, ratio=0.5, debugContext=""):  # noqa: N803
        """Dropout whose mask has ``shape`` (broadcast over the input) in training: zero with
        probability ``ratio``, else scale by ``1 / (1 - ratio)``; the identity at inference."""
        if not 0 <= float(ratio) < 1:
            raise popart_exception(f"{ratio} ratio value {ratio} is not valid. Please use a value in the interval "
                                   "[0,1)")
        return self._op("ShapedDropout", args, {"shape": [int(s) for s in shape], "ratio": float(ratio)},
                        debugContext)[0]

    # -- subgraphs, convolutions ---------------------------------------------------------------
    def call(self, args, num_outputs, callee, debugContext=""):  # noqa: N803
        """Call subgraph ``callee`` (a builder from ``createSubgraphBuilder``) on ``args`` (its
        inputs, in order); returns its ``num_outputs`` outputs (a list). The session inlines the
        call, so training differentiates through it."""
        if not isinstance(callee, Builder) or callee._parent is None:
            raise popart_exception("call: callee must be a subgraph builder (builder.createSubgraphBuilder())")
        g = callee._model.graph
        args = _tensor_ids("Call", args)
        if len(args) != len(g.input):
            raise popart_exception(f"call: the callee has {len(g.input)} inputs but {len(args)} arguments were given")
        if int(num_outputs) != len(g.output):
            raise popart_exception(f"call: the callee has {len(g.output)} outputs but num_outputs is {num_outputs}")
        outs = [callee._infos.get(o.name) for o in g.output]
        return self._op("Call", args, {"callee": callee}, debugContext, n=int(num_outputs),
                        out_infos=outs if all(o is not None for o in outs) else None)

    def multiconv(self, args, dilations=(), inDilations=(), pads=(), outPads=(), strides=(),  # noqa: N803
                  availableMemoryProportions=(), partialsTypes=(), planType=None, perConvReservedTiles=None,
                  cycleBackOff=None, enableConvDithering=(), debugContext=""):
        """Several convolutions as one op: ``args = [[X0, W0(, B0)], [X1, W1(, B1)], ...]``,
        each as ``aiOnnx.conv`` (groups from the shapes). The per-convolution lists (dilations,
        pads, strides, availableMemoryProportions, partialsTypes) are empty or one entry per
        convolution. Returns one output id per convolution."""
        convs = [list(c) for c in args]
        n = len(convs)
        if n == 0:
            raise popart_exception("MultiConvOp: at least one convolution is needed")
        for name, v in (("dilations", dilations), ("inDilations", inDilations), ("pads", pads), ("outPads", outPads),
                        ("strides", strides), ("availableMemoryProportions", availableMemoryProportions),
                        ("partialsTypes", partialsTypes), ("enableConvDithering", enableConvDithering)):
            if len(v) not in (0, n):
                raise popart_exception(f"MultiConvOp: {name} must be empty or have one entry per convolution ({n}), "
                                       f"got {len(v)}")
        if any(any(int(d) != 1 for d in v) for v in inDilations) or any(any(int(p) for p in v) for v in outPads):
            raise popart_exception("openipu's multiconv supports no inDilations / outPads (ONNX Conv has none)")
        flat = []
        for c in convs:
            if len(c) not in (2, 3):
                raise popart_exception(f"MultiConvOp: each convolution takes [data, weights] or [data, weights, bias], "
                                       f"got {len(c)} tensors")
            flat += c + [""] * (3 - len(c))
        attrs = {"num_convs": n}
        for name, v in (("strides", strides), ("pads", pads), ("dilations", dilations)):
            if len(v):
                attrs[name] = [int(x) for e in v for x in e]
                attrs[f"{name}_lens"] = [len(e) for e in v]
        if len(availableMemoryProportions):
            attrs["availableMemoryProportions"] = [float(x) for x in availableMemoryProportions]
        if len(partialsTypes):
            attrs["partialsTypes"] = [str(x) for x in partialsTypes]
        return self._op("MultiConv", flat, attrs, debugContext, n=n)

    # -- other element-wise ops ----------------------------------------------------------------
    def round(self, args, debugContext=""):  # noqa: N803
        """Round half to even (ONNX Round-11), shape and type kept."""
        return self._op("Round", args, {}, debugContext)[0]

    def nearbyint(self, args, debugContext=""):  # noqa: N803
        """Round to the nearest integer, ties to even (as ``round``)."""
        return self._op("Nearbyint", args, {}, debugContext)[0]

    def fmod(self, args, debugContext=""):  # noqa: N803
        """``fmod(a, b)``: remainder with the dividend's sign (C ``fmod``), broadcasting."""
        return self._op("Fmod", args, {}, debugContext)[0]

    def remainder(self, args, debugContext=""):  # noqa: N803
        """``a % b`` with the divisor's sign (Python's ``%``), broadcasting."""
        return self._op("Remainder", args, {}, debugContext)[0]

    def atan2(self, args, debugContext=""):  # noqa: N803
        """``atan2(y, x)`` of ``args = [y, x]`` (radians in (-pi, pi]), broadcasting."""
        return self._op("Atan2", args, {}, debugContext)[0]

    def expm1(self, args, debugContext=""):  # noqa: N803
        """``exp(x) - 1``, shape kept."""
        return self._op("Expm1", args, {}, debugContext)[0]

    def log1p(self, args, debugContext=""):  # noqa: N803
        """``log(x + 1)``, shape kept."""
        return self._op("Log1p", args, {}, debugContext)[0]

    def bitwisenot(self, args, debugContext=""):  # noqa: N803
        """``~x`` of an integer tensor."""
        return self._op("BitwiseNot", args, {}, debugContext)[0]

    def bitwiseand(self, args, debugContext=""):  # noqa: N803
        """``a & b`` of integer tensors, broadcasting."""
        return self._op("BitwiseAnd", args, {}, debugContext)[0]

    def bitwiseor(self, args, debugContext=""):  # noqa: N803
        """``a | b`` of integer tensors, broadcasting."""
        return self._op("BitwiseOr", args, {}, debugContext)[0]

    def bitwisexor(self, args, debugContext=""):  # noqa: N803
        """``a ^ b`` of integer tensors, broadcasting."""
        return self._op("BitwiseXor", args, {}, debugContext)[0]

    def bitwisexnor(self, args, debugContext=""):  # noqa: N803
        """``~(a ^ b)`` of integer tensors, broadcasting."""
        return self._op("BitwiseXnor", args, {}, debugContext)[0]

    # -- normalisation, recurrent, decoding, graph-network and packed-sequence ops --------------
    def _known(self, args) -> list:
        """``(dtype name, shape)`` of each id in ``args`` ("" or unknown: None)."""
        return [self._builder._infos.get(a) if a else None for a in args]

    @staticmethod
    def _setup(fn, *a):
        """Run an op's setup check (``graphcore_ops.*_setup``): its ``ValueError`` becomes
        PopART's ``popart_exception``."""
        try:
            return fn(*a)
        except ValueError as e:
            raise popart_exception(str(e)) from None

    def batchnormalization(self, args, num_outputs, epsilon=1e-5, momentum=0.9, debugContext=""):  # noqa: N803
        """PopART's batch normalisation (``ai.graphcore`` BatchNormalization): ONNX
        BatchNormalization-9 whose batch variance is the unbiased one (``N - 1``, PyTorch's running
        variance). ``args = [x [N, C, ...], scale [C], B [C], mean [C], var [C]]``. One output
        (inference: ``y`` from ``mean`` / ``var``) or five (training: ``[y, running mean, running
        var, saved mean, saved var]``, ``running = (1 - momentum) * batch + momentum * input``);
        a training session copies the running statistics into ``mean`` / ``var`` when they are
        weights. Returns the list of output ids."""
        args = _tensor_ids("BatchNormalization", args)
        n = int(num_outputs)
        if not 1 <= n <= 5:
            raise popart_exception(f"BatchNormalization: num_outputs must be between 1 and 5, got {num_outputs}")
        known = self._known(args)
        out_infos = None
        if len(args) == 5 and all(k is not None and k[1] is not None for k in known):
            names = ("X", "scale", "B", "mean", "var")
            self._setup(gco.batch_norm_setup, known[0][1], {nm: k[1] for nm, k in zip(names[1:], known[1:])}, True)
            out_infos = [known[0], known[3], known[4], known[3], known[4]][:n]
        return self._op("BatchNormalization", args, {"epsilon": float(epsilon), "momentum": float(momentum)},
                        debugContext, n=n, out_infos=out_infos)

    def lstm(self, args, outputFullSequence=1, debugContext=""):  # noqa: N803
        """PopART's LSTM (``PopartLSTMOp``, the layout of popnn's LSTM): ``args = [X [seq,
        batch, input], weights [4, input + hidden, hidden](, biases [4, hidden](, initialState [2,
        batch, hidden](, seq_lens [batch] INT32)))]``, gates in the order forget, input, candidate,
        output; ``initialState`` holds the output ``h`` then the cell state ``c`` (zeros when
        omitted). Returns ``[output, cell_state]``: the output ``[seq, batch, hidden]`` when
        ``outputFullSequence`` (default) else the last one ``[batch, hidden]``, the last cell state
        ``[batch, hidden]``."""
        args = _tensor_ids("LSTM", args)
        known = self._known(args)
        out_infos = None
        if len(args) >= 2 and all(k is not None and k[1] is not None for k in known[:4]):
            shapes = [k[1] for k in known] + [None] * (4 - len(known))
            self._setup(gco.lstm_setup, shapes[0], shapes[1], shapes[2], shapes[3])
            (dt, xs), h = known[0], shapes[1][2]
            out_infos = [(dt, [xs[0], xs[1], h] if int(outputFullSequence) else [xs[1], h]), (dt, [xs[1], h])]
        return self._op("LSTM", args, {"output_full_sequence": int(outputFullSequence)}, debugContext, n=2,
                        out_infos=out_infos)

    def ctcbeamsearchdecoder(self, args, blank=0, beam_width=100, top_paths=1, debug_context=""):
        """Connectionist temporal classification beam search decoder (popnn's
        ``beamSearchDecoderLogProbabilities``): ``args = [logProbs [maxTime, batch, classes] float,
        dataLengths [batch] UINT32]``. Returns ``[labelProbs [batch, top_paths] (log
        probabilities, logProbs' type), labelLengths [batch, top_paths] UINT32, decodedLabels
        [batch, top_paths, maxTime] UINT32]``, most probable path first; ``top_paths`` must not
        exceed ``beam_width``."""
        args = _tensor_ids("CtcBeamSearchDecoder", args)
        if int(beam_width) < 1 or not 1 <= int(top_paths) <= int(beam_width):
            raise popart_exception(f"CtcBeamSearchDecoder: top_paths ({top_paths}) must be between 1 and beam_width "
                                   f"({beam_width})")
        known = self._known(args)
        out_infos = None
        if len(args) == 2 and all(k is not None and k[1] is not None for k in known):
            name = f"{debug_context or 'CtcBeamSearchDecoder'} (ai.graphcore.CtcBeamSearchDecoder:1)"
            self._setup(gco.ctc_beam_search_setup, known[0][1], known[0][0], known[1][1], known[1][0], name)
            t, n, _ = known[0][1]
            p = int(top_paths)
            out_infos = [(known[0][0], [n, p]), ("UINT32", [n, p]), ("UINT32", [n, p, t])]
        attrs = {"blank": int(blank), "beam_width": int(beam_width), "top_paths": int(top_paths)}
        return self._op("CtcBeamSearchDecoder", args, attrs, debug_context, n=3, out_infos=out_infos)

    def groupedscatterreduce(self, args, axis_size, axis=-1, reduction="Sum", group_size=1,  # noqa: N803
                             enable_index_broadcast=1, debugContext=""):
        """``scatterreduce`` per group: ``args = [src [group_size, ...], index [group_size, ...](,
        initial)]``, group ``g`` reducing ``src[g]`` into ``out[g]`` along ``axis`` (an axis of
        ``src``, not the group axis 0); ``out[g][.., i, ..] = reduce(src[g][index[g] == i])``. A
        ``[group_size, n]`` index broadcasts along ``axis`` when ``enable_index_broadcast``."""
        red = str(reduction).split(".")[-1]
        if red.lower() not in _SCATTER_REDUCTIONS:
            raise popart_exception(f"Unknown ScatterReduction '{reduction}'. Use one of Sum, Max, Min, Mul, "
                                   "NoReduction")
        attrs = {"axis_size": int(axis_size), "axis": int(axis), "reduction": _SCATTER_REDUCTIONS[red.lower()],
                 "group_size": int(group_size), "enable_index_broadcast": int(enable_index_broadcast)}
        for name in ("axis_size", "group_size"):
            if attrs[name] < 1:
                raise popart_exception(f"ScatterReduceOp {name} = {attrs[name]} is not valid: must be > 0.")
        if attrs["enable_index_broadcast"] not in (0, 1):
            raise popart_exception(f"ScatterReduceOp enable_index_broadcast = {enable_index_broadcast} is not valid: "
                                   "must be either 0 or 1.")
        known = self._known(_tensor_ids("ScatterReduce", args))
        if known and known[0] is not None and known[0][1] is not None:
            self._setup(gco.scatter_reduce_setup, known[0][1], attrs)
        return self._op("ScatterReduce", args, attrs, debugContext)[0]

    def replicatedreducescatter(self, args, collectiveOperator=None, commGroup=None, debugContext=""):  # noqa: N803
        """The input flattened, reduced over the replicas (``collectiveOperator``, default Add) and
        scattered: replica ``r`` gets elements ``[r k, (r + 1) k)`` of the result, ``k =
        ceil(n / replicas)`` (zero-padded), as a ``[k]`` tensor. Its shape depends on the
        session's replication factor, so the builder records none (the session infers it);
        with one replica it is the flattened input. ``commGroup`` is accepted and ignored (all
        replicas form the group)."""
        op, debugContext = _collective(collectiveOperator, debugContext, "replicatedreducescatter")
        return self._op("ReplicatedReduceScatter", args, {"op": op}, debugContext, out_infos=[None])[0]

    def splinebasis(self, args, degree=1, debugContext=""):  # noqa: N803
        """B-spline basis of PyTorch Geometric's SplineConv (``popops::splineBasis``): ``args =
        [pseudo [E, D] float, kernel_size [D] INT32, is_open_spline [D] UINT8]``. Returns ``[basis
        [E, S], weight_index [E, S] INT32]``, ``S = (degree + 1)^D``: the basis coefficients and
        the weight index of each spline. ``degree`` 0 .. 3 (popops computes 1, 2 and 3)."""
        if not 0 <= int(degree) <= 3:
            raise popart_exception(f"SplineBasisOp degree = {degree} is not valid: must be between 0 and 3.")
        args = _tensor_ids("SplineBasis", args)
        known = self._known(args)
        out_infos = None
        if len(args) == 3 and all(k is not None and k[1] is not None for k in known):
            self._setup(gco.spline_basis_setup, known[0][1], known[1][1], known[2][1])
            e, d = known[0][1]
            s = (int(degree) + 1) ** d
            out_infos = [(known[0][0], [e, s]), (known[1][0], [e, s])]
        return self._op("SplineBasis", args, {"degree": int(degree)}, debugContext, n=2, out_infos=out_infos)

    def splineweighting(self, args, debugContext=""):  # noqa: N803
        """Features weighted by the B-spline kernel (``popops::splineWeighting``): ``args = [input
        [E, Cin], weight [K, Cin, Cout], basis [E, S], weightIndex [E, S] INT32]`` (basis and
        weightIndex from ``splinebasis``); ``out[e] = sum_s basis[e, s] input[e] @
        weight[weightIndex[e, s]]``, ``[E, Cout]``."""
        args = _tensor_ids("SplineWeighting", args)
        known = self._known(args)
        out_infos = None
        if len(args) == 4 and all(k is not None and k[1] is not None for k in known):
            self._setup(gco.spline_weighting_setup, *[k[1] for k in known], known[0][0], known[1][0], known[2][0])
            out_infos = [(known[0][0], [known[0][1][0], known[1][1][2]])]
        return self._op("SplineWeighting", args, {}, debugContext, out_infos=out_infos)[0]

    def packedDataBlock(self, args, maxSequenceLengths, resultSize, callbackBatchSize, callback,  # noqa: N802,N803
                        debugName=""):
        """Run ``callback`` (a subgraph builder) on unpacked sequences (PopART's
        ``PackedDataBlockOp``). ``args = [data_0, offsets_0, lengths_0, ..., resultOffsets,
        resultLengths]``: sequence ``j`` of input ``i`` is ``data_i[offsets_i[j] : +
        lengths_i[j]]``, zero-padded to ``maxSequenceLengths[i]``; the callback takes
        ``callbackBatchSize`` such sequences of each input (``[callbackBatchSize,
        maxSequenceLengths[i], ...]``) and returns ``[callbackBatchSize, L, ...]``, whose first
        ``resultLengths[j]`` rows for sequence ``j`` are written at row ``resultOffsets[j]`` of the
        result ``[resultSize, ...]`` (zeros elsewhere). Returns the result id."""
        if not isinstance(callback, Builder) or callback._parent is None:
            raise popart_exception("packedDataBlock: callback must be a subgraph builder "
                                   "(builder.createSubgraphBuilder())")
        args = _tensor_ids("PackedDataBlock", args)
        lens = [int(m) for m in maxSequenceLengths]
        if len(args) < 5 or (len(args) - 2) % 3 or len(lens) != (len(args) - 2) // 3:
            raise popart_exception(f"packedDataBlock: {len(args)} inputs for {len(lens)} maxSequenceLengths: give "
                                   "[data, offsets, lengths] per data input, then [resultOffsets, resultLengths], "
                                   "and one maxSequenceLength per data input")
        if int(callbackBatchSize) < 1:
            raise popart_exception(f"packedDataBlock: callbackBatchSize must be positive, got {callbackBatchSize}")
        g = callback._model.graph
        if len(g.input) != len(lens) or len(g.output) != 1:
            raise popart_exception(f"packedDataBlock: the callback has {len(g.input)} inputs and {len(g.output)} "
                                   f"outputs; it needs one input per data input ({len(lens)}) and one output")
        attrs = {"maxSequenceLengths": lens, "resultSize": int(resultSize),
                 "callbackBatchSize": int(callbackBatchSize), "callback": callback}
        return self._op("PackedDataBlock", args, attrs, debugName,
                        out_infos=[self._packed_info(args, attrs, callback)])[0]

    def _packed_info(self, args, attrs, callback):
        """The result's ``(dtype, shape)``: the callback run on zeros of its input shapes, or None."""
        known = self._known(args)
        if any(k is None or k[1] is None for k in known):
            return None
        from openipu.popart.shapes import probe
        b = self._builder._root()
        opsets = {"": b._opset_versions.get("ai.onnx", b._default_onnx), **{
            k: v for k, v in b._opset_versions.items() if k != "ai.onnx"}}
        a = {k: v for k, v in attrs.items() if k != "callback"}
        a.update(callback=callback._model.graph, __opsets__=opsets, __outer__={})
        try:
            return probe(find_kernel(GRAPHCORE, "PackedDataBlock"), known, a, 1)[0]
        except Exception as e:  # noqa: BLE001 - left to the session's inference
            log("builder").warning("Shape inference failed for the packedDataBlock result (%s)", e)
            return None


#: input counts of the ai.graphcore ops (PopART's ``OperatorIdentifier`` NumInputs)
_GC_ARITY = {
    "Gelu": (1, 1), "GeluErf": (1, 1), "Swish": (1, 1), "Scale": (1, 1), "ScaledAdd": (2, 4), "Detach": (1, 1),
    "Nop": (1, 1), "PrintTensor": (1, 1), "TensorRemap": (1, 2), "ReplicatedAllReduce": (1, 1),
    "IncrementMod": (1, 1), "CopyVarUpdate": (2, 2), "Abort": (0, 1), "IdentityLoss": (1, 1),
    "Nll": (2, 2), "L1": (1, 1), "Ctc": (4, 4), "Reshape": (1, 1), "Subsample": (1, 1), "Reverse": (1, 1),
    "Slice": (1, 1), "DepthToSpace": (1, 1), "DynamicSlice": (2, 2), "DynamicUpdate": (3, 3),
    "DynamicZero": (2, 2), "DynamicAdd": (3, 3), "SequenceSlice": (5, 5), "Init": (0, 0),
    "GroupNormalization": (3, 3), "ReduceMedian": (1, 1), "ScatterReduce": (2, 3), "GroupedGather": (2, 2),
    "Sort": (1, 1), "Bucketize": (2, 2), "NormalizeImage": (3, 3), "ShapedDropout": (1, 1),
    "Round": (1, 1), "Nearbyint": (1, 1), "Fmod": (2, 2), "Remainder": (2, 2), "Atan2": (2, 2), "Expm1": (1, 1),
    "Log1p": (1, 1), "BitwiseNot": (1, 1), "BitwiseAnd": (2, 2), "BitwiseOr": (2, 2), "BitwiseXor": (2, 2),
    "BitwiseXnor": (2, 2), "BatchNormalization": (5, 5), "LSTM": (2, 5), "CtcBeamSearchDecoder": (2, 2),
    "ReplicatedReduceScatter": (1, 1), "SplineBasis": (3, 3), "SplineWeighting": (4, 4),
}
#: PopART's C++ ``DataType`` enum order (the ``data_type`` attribute of Init)
_DATA_TYPES = ["UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "UINT32", "UINT64", "BOOL", "FLOAT", "FLOAT16",
               "BFLOAT16", "FLOAT8_143", "FLOAT8_152", "DOUBLE", "COMPLEX64", "COMPLEX128", "STRING", "UNDEFINED"]
_SCATTER_REDUCTIONS = {"sum": "sum", "max": "max", "min": "min", "mul": "mul", "noreduction": "none", "none": "none"}
_COLLECTIVE_OPS = ("Add", "Mean", "Mul", "Min", "Max", "LogicalAnd", "LogicalOr", "SquareAdd", "Local")


def _collective(operator, debug_context, what: str):
    """``(operator name, debugContext)`` of a collective builder op: the operator (default Add;
    a lone string that is no operator is the debugContext, PopART's positional form). Raises
    ``popart_exception`` for an unknown operator."""
    if isinstance(operator, str) and not debug_context and operator not in _COLLECTIVE_OPS:
        operator, debug_context = None, operator
    op = str(operator or "Add").split(".")[-1]
    if op not in _COLLECTIVE_OPS:
        raise popart_exception(f"Unsupported collective operator '{operator}' for {what}. Use one of "
                               f"{', '.join(_COLLECTIVE_OPS)}")
    return op, debug_context


def _tensor_ids(op: str, args) -> list:
    if isinstance(args, str) or not isinstance(args, (list, tuple)):
        raise popart_exception(f"{op}: args must be a list of tensor ids, got {type(args).__name__} {args!r}")
    bad = [a for a in args if not isinstance(a, str)]
    if bad:
        raise popart_exception(f"{op}: args must be tensor ids (str), got {bad[0]!r}")
    return list(args)


def _reduction(reduction) -> int:
    name = str(reduction).split(".")[-1]
    if name not in _REDUCTION:
        raise popart_exception(f"Unknown ReductionType '{reduction}': use popart.ReductionType.Sum, Mean or "
                               "NoReduction")
    return _REDUCTION[name]


def _dyn_attrs(axes, sizes, no_overlap=None) -> dict:
    axes, sizes = [int(a) for a in axes], [int(s) for s in sizes]
    if len(axes) != len(sizes):
        raise popart_exception(f"DynamicBaseOp: axes {axes} and sizes {sizes} must have the same length")
    a = {"axes": axes, "sizes": sizes}
    if no_overlap is not None:
        a["noOverlap"] = int(no_overlap)
    return a


def _data_type_code(dt) -> int:
    if isinstance(dt, (int, np.integer)) and not isinstance(dt, bool):
        if not 0 <= int(dt) < len(_DATA_TYPES):
            raise popart_exception(f"Init: unknown data_type {dt}")
        return int(dt)
    name = dtype_name(dt) if not isinstance(dt, str) else dt.upper()
    name = {"FLOAT32": "FLOAT", "HALF": "FLOAT16", "INT": "INT32"}.get(name, name)
    if name not in _DATA_TYPES:
        raise popart_exception(f"Init: unknown data_type {dt}")
    return _DATA_TYPES.index(name)


def _init_type(it) -> int:
    if isinstance(it, (int, np.integer)) and not isinstance(it, bool):
        return int(it)
    name = str(it).split(".")[-1]
    if name not in ("NoInit", "Zero"):
        raise popart_exception(f"Init: unknown init_type {it} (InitType.NoInit or InitType.Zero)")
    return 0 if name == "NoInit" else 1


# ----------------------------------------------------------------------------------------------
# context managers
# ----------------------------------------------------------------------------------------------
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
        (``init_input``, ``init_input/1`` ... or the prefix given)."""
        if isinstance(variableSettings, str):
            variableSettings, debugContext = None, variableSettings
        if variableSettings is not None and hasattr(variableSettings, "check_supported"):
            variableSettings.check_supported(str(debugContext) or "init_input")
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
                    probed = probe(kernel, ins, decode_attrs(node), version, cvs)
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
        self._model.metadata_props.append(onnx.StringStringEntryProto(key="replicationFactor", value=str(n)))

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
