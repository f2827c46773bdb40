"""An ONNX backend (``onnx.backend.base.Backend``) that runs models on the simulated IPU through
the public PopART API: ``InferenceSession`` on an IPU Model device, ``DataFlow`` anchoring every
graph output with ``AnchorReturnType("ALL")``, ``PyStepIO``.

    from openipu.onnx_backend import OpenIPUBackend
    rep = OpenIPUBackend.prepare(model)          # parses and legalises the model
    outputs = rep.run([x, y])                     # or rep.run({"x": x, "y": y})

``popart`` is imported when a model is prepared (the top-level ``popart`` package if present,
else ``openipu.popart``), so importing this module never needs a working PopART.

What the backend does before PopART sees a model, as a Graphcore user would for a model written
for a CPU (PopART itself does none of it, and keeps raising its errors for such models):

- **Types the IPU lacks.** The IPU has no 64-bit float and no bfloat16: DOUBLE and BFLOAT16
  tensors (inputs, outputs, initializers, ``Constant`` / ``ConstantOfShape`` values, ``Cast.to``
  and other ``dtype`` attributes, value infos, subgraphs) become FLOAT, the way PopART's
  ``GraphTransformer.convertDoublesToFloats`` does for doubles. Inputs are converted to float32
  when streamed and outputs are converted back to the declared type (float64 / bfloat16), so the
  results carry float32 rounding, not the declared type's. The narrow types (float8 E4M3FN /
  E4M3FNUZ / E5M2 / E5M2FNUZ / E8M0, FLOAT4E2M1, INT4 / UINT4 / INT2 / UINT2) are held in float32,
  int8 or uint8, which hold their values exactly; conversions *to* them (``Cast``, ``CastLike``,
  ``QuantizeLinear``) become ``ai.openipu.NarrowCast`` / ``NarrowQuantizeLinear``
  (:mod:`openipu.popart.onnx_ops.openipu_ext`), which keep ONNX's rounding and saturation.
  ``BitCast`` of doubles cannot survive this (their bits are not kept).
- **Input shapes.** Inputs whose shapes the model leaves symbolic or unknown get a
  ``popart.InputShapeInfo`` entry from the arrays given to ``run``.
- **Shape-determining inputs.** The IPU runs static graphs, and PopART needs the inputs that set
  output shapes (``Reshape`` shape, ``Slice`` starts/ends, reduce ``axes``, ``Range`` bounds,
  ``TopK`` k, ``Pad`` pads, window sizes, ...) to be constants. Graph inputs that reach such an
  operand (through any ops except ``Shape`` / ``Size``) are frozen into initializers with the
  values given to ``run``.

So the session is compiled at the first ``run`` when the model needs either of the last two
(eagerly in ``prepare`` otherwise), and compiled again when input shapes or frozen values change
(sessions are cached per shapes and values).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

DEVICES = ("CPU", "IPU")
#: the device models run on unless ``prepare(..., ipu_model={...})`` says otherwise: one whole
#: Mk2 IPU (PopART's own IPU Model default of 4 tiles cannot hold the larger test models)
IPU_MODEL_OPTIONS = {"numIPUs": 1, "tilesPerIPU": 1216}

_P = onnx.TensorProto
#: ONNX float8 element types (held as float32 holding float8 values, see the module docstring)
FLOAT8_TYPES = (_P.FLOAT8E4M3FN, _P.FLOAT8E4M3FNUZ, _P.FLOAT8E5M2, _P.FLOAT8E5M2FNUZ, _P.FLOAT8E8M0)
#: sub-byte ONNX element types and the byte type that holds them
SUBBYTE_TYPES = {_P.INT4: _P.INT8, _P.INT2: _P.INT8, _P.UINT4: _P.UINT8, _P.UINT2: _P.UINT8,
                 _P.FLOAT4E2M1: _P.FLOAT}
#: element types the IPU has no arithmetic for, and the type the backend computes them in
LEGALISED_TYPES = {_P.DOUBLE: _P.FLOAT, _P.BFLOAT16: _P.FLOAT, **{t: _P.FLOAT for t in FLOAT8_TYPES},
                   **SUBBYTE_TYPES}
#: the narrow types among them: conversions to them keep their rounding (``ai.openipu`` ops)
NARROW_TYPES = set(FLOAT8_TYPES) | set(SUBBYTE_TYPES)
#: the domain of openipu's own ops (:mod:`openipu.popart.onnx_ops.openipu_ext`)
OPENIPU_DOMAIN = "ai.openipu"

_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
#: (op type -> input indices) of operands that determine an output shape (must be constants)
SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Tile": (1,), "Slice": (1, 2, 3, 4),
    "Pad": (1, 3), "Split": (1,), "SplitToSequence": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
    "Resize": (1, 2, 3), "Upsample": (1,), "Range": (0, 1, 2), "TopK": (1,), "OneHot": (1,),
    "CenterCropPad": (1,), "MaxUnpool": (2,), "Col2Im": (1, 2), "DFT": (1, 2), "STFT": (1, 3),
    "MelWeightMatrix": (0, 1, 2, 3, 4), "HannWindow": (0,), "HammingWindow": (0,),
    "BlackmanWindow": (0,), "AffineGrid": (1,), "Loop": (0,), "RandomNormalLike": (), "Trilu": (),
    **{r: (1,) for r in _REDUCE},
}
#: ops whose outputs do not depend on their inputs' values
_VALUE_FREE = ("Shape", "Size")


def _popart():
    try:
        import popart  # the public package name
    except Exception as e:  # noqa: BLE001 - a half-built popart raises more than ImportError
        try:
            from openipu import popart
        except Exception:  # noqa: BLE001
            raise ImportError(f"popart is not importable: {e}") from e
    if not hasattr(popart, "InferenceSession"):
        raise ImportError("popart has no InferenceSession (PopART sessions are not available)")
    return popart


def _c_array(a: Any) -> np.ndarray:
    """A C-contiguous ndarray (PyStepIO refuses others); keeps 0-d arrays 0-d."""
    return np.require(np.asarray(a), requirements="C")


# -- model legalisation --------------------------------------------------------------------
def _legal_type(t: int) -> int:
    return LEGALISED_TYPES.get(t, t)


def _fix_type_proto(tp: onnx.TypeProto) -> None:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tp.tensor_type.elem_type = _legal_type(tp.tensor_type.elem_type)
    elif which == "sparse_tensor_type":
        tp.sparse_tensor_type.elem_type = _legal_type(tp.sparse_tensor_type.elem_type)
    elif which == "sequence_type":
        _fix_type_proto(tp.sequence_type.elem_type)
    elif which == "optional_type":
        _fix_type_proto(tp.optional_type.elem_type)
    elif which == "map_type":
        _fix_type_proto(tp.map_type.value_type)


def _fix_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    if t.data_type not in LEGALISED_TYPES:
        return t
    arr = numpy_helper.to_array(t).astype(helper.tensor_dtype_to_np_dtype(_legal_type(t.data_type)))
    new = numpy_helper.from_array(arr, t.name)
    return new


def _elem_types(g: onnx.GraphProto) -> dict[str, int]:
    """Element type of every tensor of ``g`` that has one (after ONNX type inference)."""
    out = {i.name: i.data_type for i in g.initializer}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type"):
            out.setdefault(vi.name, vi.type.tensor_type.elem_type)
    return out


def _fix_graph(g: onnx.GraphProto, types: dict[str, int] | None = None) -> None:
    types = dict(types or {})
    types.update(_elem_types(g))
    for i, init in enumerate(g.initializer):
        if init.data_type in LEGALISED_TYPES:
            g.initializer[i].CopyFrom(_fix_tensor(init))
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        _fix_type_proto(vi.type)
    for n in g.node:
        _fix_narrow_cast(n, types)
        _fix_node(n, types)


def _fix_narrow_cast(n: onnx.NodeProto, types: dict[str, int]) -> None:
    """Conversions to a narrow type (float8, 4/2-bit) -> ``ai.openipu.NarrowCast`` /
    ``NarrowQuantizeLinear`` (their result held in the legal wide type)."""
    if n.domain not in ("", "ai.onnx") or n.op_type not in ("Cast", "CastLike", "QuantizeLinear"):
        return
    attrs = {a.name: a for a in n.attribute}
    if n.op_type == "Cast":
        to = attrs["to"].i if "to" in attrs else 0
    elif n.op_type == "CastLike":
        to = types.get(n.input[1], 0) if len(n.input) > 1 else 0
    else:
        to = types.get(n.input[2], 0) if len(n.input) > 2 and n.input[2] else \
            attrs["output_dtype"].i if "output_dtype" in attrs else 0
    if to not in NARROW_TYPES:
        return
    if n.op_type == "QuantizeLinear":
        keep = [a for a in n.attribute if a.name != "output_dtype"]
        n.op_type = "NarrowQuantizeLinear"
    else:
        keep = [a for a in n.attribute if a.name in ("saturate", "round_mode")]
        del n.input[1:]
        n.op_type = "NarrowCast"
    del n.attribute[:]
    n.attribute.extend(keep)
    n.attribute.append(helper.make_attribute("to", to))
    n.domain = OPENIPU_DOMAIN


def _fix_node(n: onnx.NodeProto, types: dict[str, int] | None = None) -> None:
    for a in n.attribute:
        if a.type == onnx.AttributeProto.TENSOR:
            a.t.CopyFrom(_fix_tensor(a.t))
        elif a.type == onnx.AttributeProto.TENSORS:
            for j, t in enumerate(a.tensors):
                a.tensors[j].CopyFrom(_fix_tensor(t))
        elif a.type == onnx.AttributeProto.GRAPH:
            _fix_graph(a.g, types)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for sg in a.graphs:
                _fix_graph(sg, types)
        elif a.type == onnx.AttributeProto.INT and (
                (n.op_type == "Cast" and a.name == "to") or a.name == "dtype"):
            a.i = _legal_type(a.i)
        elif a.type == onnx.AttributeProto.TYPE_PROTO:
            _fix_type_proto(a.tp)


def _uses_type(tp: onnx.TypeProto, types) -> bool:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return tp.tensor_type.elem_type in types
    if which in ("sequence_type", "optional_type"):
        inner = tp.sequence_type.elem_type if which == "sequence_type" else tp.optional_type.elem_type
        return _uses_type(inner, types)
    return False


def legalise_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with the element types of :data:`LEGALISED_TYPES` replaced in tensors,
    attributes and types (PopART's ``GraphTransformer.convertDoublesToFloats``, extended), and
    conversions to narrow types made ``ai.openipu`` ops that keep their rounding."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    try:
        types = _elem_types(onnx.shape_inference.infer_shapes(model).graph)
    except Exception:  # noqa: BLE001 - types of CastLike targets are best effort
        types = {}
    _fix_graph(m.graph, types)
    for f in m.functions:
        for n in f.node:
            _fix_narrow_cast(n, {})
            _fix_node(n)
    used = {n.domain for n in m.graph.node}
    if OPENIPU_DOMAIN in used and all(o.domain != OPENIPU_DOMAIN for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid(OPENIPU_DOMAIN, 1))
    return m


def shape_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs whose values reach a shape-determining operand (:data:`SHAPE_OPERANDS`)
    through any ops except ``Shape`` / ``Size``, in graph-input order."""
    from openipu.popart.shapes import subgraph_free_names
    g = model.graph
    nodes: list[tuple[onnx.NodeProto, list[str]]] = []   # (node, inputs incl. outer-scope uses)

    def collect(graph):
        for n in graph.node:
            nodes.append((n, list(n.input) + subgraph_free_names(n)))
            for a in n.attribute:
                for sg in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                           a.graphs if a.type == onnx.AttributeProto.GRAPHS else []):
                    collect(sg)
    collect(g)
    producer = {o: (n, ins) for n, ins in nodes for o in n.output if o}
    todo = [n.input[i] for n, _ in nodes for i in SHAPE_OPERANDS.get(n.op_type, ())
            if i < len(n.input) and n.input[i]]
    seen: set[str] = set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        p = producer.get(t)
        if p is not None and p[0].op_type not in _VALUE_FREE:
            todo.extend(x for x in p[1] if x)
    inits = {i.name for i in g.initializer}
    return [vi.name for vi in g.input if vi.name in seen and vi.name not in inits]


def _static_shape(vi: onnx.ValueInfoProto) -> bool:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return False
    return all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)


class OpenIPUBackendRep(BackendRep):
    """A model legalised for the IPU; ``run`` streams one batch through a PopART
    ``InferenceSession`` (compiled once per input shapes and frozen values; see the module
    docstring)."""

    def __init__(self, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any):
        self._popart = _popart()
        self.model = model
        self.kwargs = kwargs
        g = model.graph
        inits = {i.name for i in g.initializer}
        self.input_names = [i.name for i in g.input if i.name not in inits]
        self.all_input_names = [i.name for i in g.input]
        self.output_names = [o.name for o in g.output]
        self.output_types = [o.type.tensor_type.elem_type if o.type.HasField("tensor_type") else 0
                             for o in g.output]
        self.legal = legalise_types(model)
        self.frozen = shape_inputs(self.legal)
        self._sessions: dict = {}
        by_name = {vi.name: vi for vi in g.input}
        self.session = None
        if not self.frozen and all(_static_shape(by_name[n]) for n in self.input_names):
            self.session = self._session(self.legal, None)   # compile now: errors show at prepare
            self._sessions[()] = self.session

    def _session(self, model: onnx.ModelProto, shape_info):
        popart = self._popart
        data_flow = popart.DataFlow(
            1, {name: popart.AnchorReturnType("ALL") for name in self.output_names})
        device_info = popart.DeviceManager().createIpuModelDevice(
            self.kwargs.get("ipu_model", IPU_MODEL_OPTIONS))
        session_kw = {}
        if "userOptions" in self.kwargs:
            session_kw["userOptions"] = self.kwargs["userOptions"]
        if shape_info is not None:
            session_kw["inputShapeInfo"] = shape_info
        session = popart.InferenceSession(fnModel=model.SerializeToString(), dataFlow=data_flow,
                                          deviceInfo=device_info, **session_kw)
        session.prepareDevice()
        return session

    def _session_for(self, feed: dict[str, np.ndarray]):
        """The session for these inputs: frozen inputs become initializers, the others get their
        shapes from the arrays."""
        key = tuple((n, a.dtype.str, a.shape, a.tobytes() if n in self.frozen else b"")
                    for n, a in sorted(feed.items()))
        if self.session is not None and not self.frozen:
            return self.session
        if key in self._sessions:
            return self._sessions[key]
        popart = self._popart
        m = onnx.ModelProto()
        m.CopyFrom(self.legal)
        for n in self.frozen:
            if n in feed:
                m.graph.initializer.append(numpy_helper.from_array(feed[n], n))
        info = popart.InputShapeInfo()
        for n, a in feed.items():
            if n not in self.frozen:
                info.add(n, popart.TensorInfo(a.dtype, list(a.shape)))
        self._sessions[key] = s = self._session(m, info)
        return s

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run once. ``inputs``: a dict by name, or a list in graph-input order (initializer-backed
        inputs excluded, or all graph inputs). Returns a namedtuple of the graph outputs, in their
        declared element types."""
        if isinstance(inputs, Mapping):
            items = list(inputs.items())
        else:
            seq = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            names = self.input_names if len(seq) <= len(self.input_names) else \
                self.all_input_names
            items = list(zip(names, seq))
        feed = {}
        for k, v in items:
            if isinstance(v, (list, tuple)) or v is None:
                raise NotImplementedError(
                    f"input '{k}' is a sequence or optional value: PopART has only tensor inputs")
            a = np.asarray(v)
            et = helper.np_dtype_to_tensor_dtype(a.dtype)
            if et in LEGALISED_TYPES:
                a = a.astype(helper.tensor_dtype_to_np_dtype(_legal_type(et)))
            feed[k] = _c_array(a)
        session = self._session_for(feed)
        anchors = session.initAnchorArrays()
        session.run(self._popart.PyStepIO(
            {k: v for k, v in feed.items() if k not in self.frozen}, anchors))
        outs = []
        for o, et in zip(self.model.graph.output, self.output_types):
            a = np.asarray(anchors[o.name])
            shape = [d.dim_value for d in o.type.tensor_type.shape.dim] \
                if o.type.tensor_type.HasField("shape") else None
            if shape is not None and all(d > 0 for d in shape) and a.size == int(np.prod(shape)):
                a = a.reshape(shape)
            if et in LEGALISED_TYPES:
                a = a.astype(helper.tensor_dtype_to_np_dtype(et))
            elif et and a.dtype.kind in "iu" and a.dtype != helper.tensor_dtype_to_np_dtype(et):
                # PopART's index outputs are INT32 where ONNX says INT64 (ArgMax, TopK): the
                # declared type, as a PopART user converts them
                a = a.astype(helper.tensor_dtype_to_np_dtype(et))
            outs.append(a)
        return namedtupledict("Outputs", self.output_names)(*outs)


class OpenIPUBackend(Backend):
    """ONNX backend over openipu's PopART on a simulated IPU (IPU Model device); see the module
    docstring for what it changes in a model before PopART compiles it."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().split(":")[0] in DEVICES

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> OpenIPUBackendRep:
        if isinstance(model, (bytes, bytearray)):
            model = onnx.load_from_string(bytes(model))
        if not cls.supports_device(device):
            raise ValueError(f"device {device!r} is not supported; use one of {DEVICES}")
        return OpenIPUBackendRep(model, device, **kwargs)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: wraps it in a one-node model (inputs typed from the given arrays; outputs
        from ``outputs_info`` or left to shape inference) and runs that."""
        model = cls.node_model(node, inputs, outputs_info,
                               kwargs.pop("opset_version", None))
        return cls.run_model(model, list(inputs), device, **kwargs)

    @staticmethod
    def node_model(node: onnx.NodeProto, inputs: Sequence[Any],
                   outputs_info=None, opset_version: int | None = None) -> onnx.ModelProto:
        """A one-node ModelProto around ``node`` with graph inputs typed from ``inputs``."""
        in_names = [n for n in node.input if n]
        ins = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), list(np.shape(a)))
            for n, a in zip(in_names, inputs)]
        if outputs_info:
            outs = [helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape))
                for n, (dt, shape) in zip(node.output, outputs_info)]
        else:
            outs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        graph = helper.make_graph([node], f"{node.op_type}_node", ins, outs)
        opsets = [helper.make_opsetid(node.domain or "",
                                      opset_version or onnx.defs.onnx_opset_version())]
        model = helper.make_model(graph, opset_imports=opsets)
        if not outputs_info:
            try:
                model = onnx.shape_inference.infer_shapes(model)
                inferred = {v.name: v for v in model.graph.value_info}
                for o in model.graph.output:
                    if o.name in inferred:
                        o.CopyFrom(inferred[o.name])
            except Exception:  # noqa: BLE001 - shape inference is best effort here
                pass
        return model


def initializer_arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The model's initializers as numpy arrays (helper for callers that feed weights)."""
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


prepare = OpenIPUBackend.prepare
run_model = OpenIPUBackend.run_model
run_node = OpenIPUBackend.run_node
supports_device = OpenIPUBackend.supports_device
