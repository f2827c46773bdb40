"""An ONNX backend (``onnx.backend.base.Backend``) that runs models on the simulated IPU through
the public PopART API: ``InferenceSession`` on an IPU Model device, ``DataFlow`` anchoring every
graph output with ``AnchorReturnType("ALL")``, ``PyStepIO``.

    from openipu.onnx_backend import OpenIPUBackend
    rep = OpenIPUBackend.prepare(model)          # builds and compiles the session once
    outputs = rep.run([x, y])                     # or rep.run({"x": x, "y": y})

``popart`` is imported when a model is prepared (the top-level ``popart`` package if present,
else ``openipu.popart``), so importing this module never needs a working PopART.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

DEVICES = ("CPU", "IPU")


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


class OpenIPUBackendRep(BackendRep):
    """A model compiled into a PopART ``InferenceSession``; ``run`` streams one batch."""

    def __init__(self, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any):
        popart = _popart()
        self.model = model
        g = model.graph
        inits = {i.name for i in g.initializer}
        self.input_names = [i.name for i in g.input if i.name not in inits]
        self.all_input_names = [i.name for i in g.input]
        self.output_names = [o.name for o in g.output]
        data_flow = popart.DataFlow(
            1, {name: popart.AnchorReturnType("ALL") for name in self.output_names})
        device_info = popart.DeviceManager().createIpuModelDevice(kwargs.get("ipu_model", {}))
        session_kw = {}
        if "userOptions" in kwargs:
            session_kw["userOptions"] = kwargs["userOptions"]
        self.session = popart.InferenceSession(fnModel=model.SerializeToString(),
                                               dataFlow=data_flow, deviceInfo=device_info,
                                               **session_kw)
        self.session.prepareDevice()
        self._popart = popart

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run once. ``inputs``: a dict by name, or a list in graph-input order (initializer-backed
        inputs excluded, or all graph inputs). Returns a namedtuple of the graph outputs."""
        if isinstance(inputs, Mapping):
            feed = {k: _c_array(v) for k, v in inputs.items()}
        else:
            seq = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            names = self.input_names if len(seq) <= len(self.input_names) else \
                self.all_input_names
            feed = {n: _c_array(v) for n, v in zip(names, seq)}
        anchors = self.session.initAnchorArrays()
        self.session.run(self._popart.PyStepIO(feed, anchors))
        outs = []
        for o in self.model.graph.output:
            a = np.asarray(anchors[o.name])
            shape = [d.dim_value for d in o.type.tensor_type.shape.dim] \
                if o.type.tensor_type.HasField("shape") else None
            if shape is not None and all(d > 0 for d in shape) and a.size == int(np.prod(shape)):
                a = a.reshape(shape)
            outs.append(a)
        return namedtupledict("Outputs", self.output_names)(*outs)


class OpenIPUBackend(Backend):
    """ONNX backend over openipu's PopART on a simulated IPU (IPU Model device)."""

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
