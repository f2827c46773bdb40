"""``popart.GraphTransformer``: ONNX-to-ONNX rewrites of a model before a session is made, and
the external saving of initializers it shares with ``Builder.saveInitializersExternally``.

``GraphTransformer(modelProtoOrFilename)``; ``getModelProto() -> bytes``. The type conversions
(``convertFloatsToHalfs``, ``convertDoublesToFloats``, ``convertDoublesToHalfs``,
``convertBFloats16ToFloat32``, ``convertUINT8ToINT32``, ``convertUINT16ToINT32``,
``convertINT8ToINT32``, ``convertINT16ToINT32``, ``convertINT64ToINT32(clip=False)``) change,
as PopART's do, the tensor attributes of nodes (``Constant`` values ...), the initializers and
the element type of every value info (graph inputs, outputs, ``value_info``) of the source type;
a node with a subgraph attribute raises PopART's "Attributes of type GRAPH and GRAPHS : need impl
in convert..."; an INT64 value outside the 32-bit range raises PopART's error unless ``clip``.
``convertInitializersToConstants(ids)`` turns initializers into ``Constant`` nodes (PopART's
error "TensorId X not in the model initalizers" [sic]), ``convertAllFixedPointInitializersToConstants``
those of integer / bool type; ``removeUnusedInputs`` drops graph inputs no node reads;
``prepareNodesForTraining`` gives ``BatchNormalization`` nodes their 5 training outputs;
``saveInitializersExternally(ids, filename)`` (:func:`save_initializers_externally`).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from openipu.popart.builder import _load_model
from openipu.popart.errors import popart_exception
from openipu.popart.tensor_proto import typed_tensor

TP = onnx.TensorProto
_FIXED = {TP.INT8, TP.UINT8, TP.INT16, TP.UINT16, TP.INT32, TP.UINT32, TP.INT64, TP.UINT64, TP.BOOL}


def save_initializers_externally(model: onnx.ModelProto, ids, fn: str) -> None:
    """Move the data of initializers ``ids`` of ``model`` into file ``fn`` (their bytes one after
    the other; ``fn`` is overwritten) and mark them ``EXTERNAL`` with ``location`` ``fn``,
    ``offset`` and ``length`` (PopART's ``onnxutil::saveInitializersExternally``). Raises
    ``popart_exception`` (PopART's texts) for a missing parent directory, a tensor that is not an
    initializer, already external, or empty."""
    parent = os.path.dirname(fn)
    if parent and not os.path.isdir(parent):
        raise popart_exception(f"Saving tensor data to file {fn}, but its parent directory does not exist")
    inits = {i.name: i for i in model.graph.initializer}
    chunks, offset = [], 0
    for tid in ids:
        if tid not in inits:
            raise popart_exception(f"Tensor '{tid}' is not an initializer")
        tp = inits[tid]
        if tp.data_location == TP.EXTERNAL:
            raise popart_exception(f"Tensor '{tid}' already has an external data_location")
        data = np.ascontiguousarray(numpy_helper.to_array(tp)).tobytes()
        if not data:
            raise popart_exception(f"Tensor '{tid}' has no data to save externally")
        chunks.append((tp, offset, data))
        offset += len(data)
    with open(fn, "wb") as f:
        for _, _, data in chunks:
            f.write(data)
    for tp, off, data in chunks:
        keep = (tp.name, tp.data_type, list(tp.dims))
        tp.Clear()
        tp.name, tp.data_type = keep[0], keep[1]
        tp.dims.extend(keep[2])
        tp.data_location = TP.EXTERNAL
        for k, v in (("location", fn), ("offset", str(off)), ("length", str(len(data)))):
            e = tp.external_data.add()
            e.key, e.value = k, v


class GraphTransformer:
    """``popart.GraphTransformer(modelProtoOrFilename)`` (module docstring). Mirrors PopART's
    ``GraphTransformer``; raises ``popart_exception``."""

    def __init__(self, modelProtoOrFilename):  # noqa: N803
        self._model = onnx.ModelProto()
        self._model.CopyFrom(_load_model(modelProtoOrFilename))

    def getModelProto(self) -> bytes:  # noqa: N802
        return self._model.SerializeToString()

    # -- type conversions -----------------------------------------------------------------------
    def _convert(self, src: int, dst: int, name: str, clip: bool = False) -> None:
        def value(tp: TP) -> TP:
            a = numpy_helper.to_array(tp)
            if src == TP.INT64 and dst == TP.INT32:
                lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
                if clip:
                    a = np.clip(a, lo, hi)
                elif a.size and (a.min() < lo or a.max() > hi):
                    raise popart_exception("In convertINT64TensorToINT32, cannot cast int64 to int32: number is too "
                                           "large. If you are sure you want still want to convert your tensor data, "
                                           "you can set 'clip' to 'true'.")
            out = typed_tensor(a.astype(helper.tensor_dtype_to_np_dtype(dst)), tp.name)
            return out

        for g in [self._model.graph]:
            for node in g.node:
                for att in node.attribute:
                    if att.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                        raise popart_exception(f"Attributes of type GRAPH and GRAPHS : need impl in {name}")
                    if att.type == onnx.AttributeProto.TENSOR and att.t.data_type == src:
                        att.t.CopyFrom(value(att.t))
            for i, init in enumerate(g.initializer):
                if init.data_type == src:
                    g.initializer[i].CopyFrom(value(init))
            for vi in list(g.input) + list(g.output) + list(g.value_info):
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == src:
                    vi.type.tensor_type.elem_type = dst

    def convertFloatsToHalfs(self) -> None:  # noqa: N802
        self._convert(TP.FLOAT, TP.FLOAT16, "convertFloatToHalf")

    def convertDoublesToFloats(self) -> None:  # noqa: N802
        self._convert(TP.DOUBLE, TP.FLOAT, "convertDoublesToFloats")

    def convertDoublesToHalfs(self) -> None:  # noqa: N802
        self._convert(TP.DOUBLE, TP.FLOAT16, "convertDoublesToHalfs")

    def convertBFloats16ToFloat32(self) -> None:  # noqa: N802
        self._convert(TP.BFLOAT16, TP.FLOAT, "convertBFloats16ToFloat32")

    def convertUINT8ToINT32(self) -> None:  # noqa: N802
        self._convert(TP.UINT8, TP.INT32, "convertUINT8ToINT32")

    def convertUINT16ToINT32(self) -> None:  # noqa: N802
        self._convert(TP.UINT16, TP.INT32, "convertUINT16ToINT32")

    def convertINT8ToINT32(self) -> None:  # noqa: N802
        self._convert(TP.INT8, TP.INT32, "convertINT8ToINT32")

    def convertINT16ToINT32(self) -> None:  # noqa: N802
        self._convert(TP.INT16, TP.INT32, "convertINT16ToINT32")

    def convertINT64ToINT32(self, clip: bool = False) -> None:  # noqa: N802
        self._convert(TP.INT64, TP.INT32, "convertINT64ToINT32", clip=clip)

    # -- initializers ---------------------------------------------------------------------------
    def convertInitializersToConstants(self, ids) -> None:  # noqa: N802
        """Initializers ``ids`` become ``Constant`` nodes (at the front of the graph) and leave
        the graph inputs."""
        g = self._model.graph
        inits = {i.name: i for i in g.initializer}
        for tid in ids:
            if tid not in inits:
                raise popart_exception(f"TensorId {tid} not in the model initalizers")
        ids = list(dict.fromkeys(ids))
        nodes = [helper.make_node("Constant", [], [tid], name=f"{tid}_const", value=inits[tid]) for tid in ids]
        keep = [i for i in g.initializer if i.name not in ids]
        del g.initializer[:]
        g.initializer.extend(keep)
        inputs = [vi for vi in g.input if vi.name not in ids]
        del g.input[:]
        g.input.extend(inputs)
        rest = list(g.node)
        del g.node[:]
        g.node.extend(nodes + rest)

    def convertAllFixedPointInitializersToConstants(self) -> None:  # noqa: N802
        self.convertInitializersToConstants([i.name for i in self._model.graph.initializer
                                             if i.data_type in _FIXED])

    def removeUnusedInputs(self) -> None:  # noqa: N802
        """Drop graph inputs (and their initializers) that no node reads and no output is."""
        g = self._model.graph
        used = {x for n in g.node for x in n.input} | {o.name for o in g.output}
        inputs = [vi for vi in g.input if vi.name in used]
        del g.input[:]
        g.input.extend(inputs)
        inits = [i for i in g.initializer if i.name in used]
        del g.initializer[:]
        g.initializer.extend(inits)

    def prepareNodesForTraining(self) -> None:  # noqa: N802
        """``BatchNormalization`` nodes get the 5 outputs of the training form (the missing ones
        named ``<type>_<name>_oi<k>_<n>``, as PopART names them)."""
        counter = 0
        for node in self._model.graph.node:
            if node.op_type != "BatchNormalization":
                continue
            while len(node.output) < 5:
                k = len(node.output)
                node.output.append(f"{node.op_type}_{node.name}_oi{k}_{counter}")
                counter += 1

    def saveInitializersExternally(self, ids, filename: str) -> None:  # noqa: N802
        save_initializers_externally(self._model, ids, filename)
