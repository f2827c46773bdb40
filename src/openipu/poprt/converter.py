"""ONNX model conversions applied before compiling, as PopRT's converter does.

``convert_float_to_half`` is PopRT's ``--precision fp16`` pass: every float32 tensor of the
model becomes float16 (initializers, Constant / ConstantOfShape values, graph inputs and outputs,
``Cast`` targets and ops' ``dtype`` attributes). Intermediate shapes are re-inferred by the
importer. Integer and boolean tensors are unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

_F32, _F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _half_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    if t.data_type != _F32:
        return t
    arr = numpy_helper.to_array(t).astype(np.float16)
    out = numpy_helper.from_array(arr, t.name)
    return out


def _convert_graph(g: onnx.GraphProto) -> None:
    for i, t in enumerate(g.initializer):
        if t.data_type == _F32:
            g.initializer[i].CopyFrom(_half_tensor(t))
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == _F32:
            vi.type.tensor_type.elem_type = _F16
    del g.value_info[:]
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == _F32:
                a.t.CopyFrom(_half_tensor(a.t))
            elif a.type == onnx.AttributeProto.GRAPH:
                _convert_graph(a.g)
            elif a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype") and a.i == _F32:
                a.i = _F16


def convert_float_to_half(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with float32 replaced by float16 throughout (PopRT's fp16 pass).

    Args:
        model: an ONNX ``ModelProto`` (any opset).
    Returns:
        A new ``ModelProto``; ``model`` is not modified. Graph inputs that were float32 become
        float16, so callers must feed float16 arrays.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _convert_graph(out.graph)
    return out
