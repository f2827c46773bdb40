"""Run one ONNX node through a PopART InferenceSession and compare it with its onnx_ops kernel
(shared by tests/test_popart_lowering_*.py). The session runs on the device-storage emulation
(``OPENIPU_EXECUTION=device``): these tests check the lowering, which the IR executor (the
default) would bypass by running the kernel itself."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

import popart
from openipu.popart.onnx_ops import get_kernel

_ONNX_OF = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.float16): onnx.TensorProto.FLOAT16,
            np.dtype(np.int64): onnx.TensorProto.INT64, np.dtype(np.int32): onnx.TensorProto.INT32,
            np.dtype(np.bool_): onnx.TensorProto.BOOL}


@contextlib.contextmanager
def device_emulation():
    """``OPENIPU_EXECUTION=device`` for the block (restored after it)."""
    old = os.environ.get("OPENIPU_EXECUTION")
    os.environ["OPENIPU_EXECUTION"] = "device"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("OPENIPU_EXECUTION", None)
        else:
            os.environ["OPENIPU_EXECUTION"] = old


def run_node(op_type, inputs, attrs=None, consts=None, opset=17, n_out=1, out_names=None, tiles=16, options=None,
             out_values=None):
    """Build a one-node model: ``inputs`` (name -> array) are streamed, ``consts`` (name ->
    array) are initializers; inputs are in the order ``list(inputs) + list(consts)`` unless the
    name list ``order`` is given in ``attrs['__order__']``; output types and shapes are those of
    ``out_values`` (default: the kernel's results). Returns (outputs list, session, op)."""
    if out_values is None:
        out_values = reference(op_type, inputs, attrs, consts, opset, n_out)
    attrs = dict(attrs or {})
    order = attrs.pop("__order__", None)
    consts = consts or {}
    names = order or (list(inputs) + list(consts))
    outs = out_names or [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    g_in = [helper.make_tensor_value_info(k, _ONNX_OF[np.asarray(v).dtype], list(np.shape(v))) for k, v in inputs.items()]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    g_out = [helper.make_tensor_value_info(o, _ONNX_OF[v.dtype], list(v.shape)) for o, v in zip(outs, out_values) if o]
    graph = helper.make_graph([node], "g", g_in, g_out, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    opts = popart.SessionOptions()
    for k, v in (options or {}).items():
        setattr(opts, k, v)
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": tiles})
    live = [o for o in outs if o]
    s = popart.InferenceSession(fnModel=model.SerializeToString(),
                                dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL") for o in live}),
                                deviceInfo=dev, userOptions=opts)
    with device_emulation():
        s.prepareDevice()
        anchors = s.initAnchorArrays()
        s.run(popart.PyStepIO({k: np.ascontiguousarray(v) for k, v in inputs.items()}, anchors))
    assert not getattr(s, "_fast", None)
    (op,) = [o for o in s.ops() if o.op_type == op_type]
    return [anchors[o] for o in live], s, op


def reference(op_type, inputs, attrs=None, consts=None, opset=17, n_out=1):
    """The onnx_ops kernel's outputs for the same node (numpy)."""
    attrs = dict(attrs or {})
    order = attrs.pop("__order__", None)
    vals = {**inputs, **(consts or {})}
    names = order or (list(inputs) + list(consts or {}))
    ins = [None if not n else torch.from_numpy(np.asarray(vals[n]).copy()) for n in names]
    attrs["__num_outputs__"] = n_out
    with torch.no_grad():
        res = get_kernel("", op_type).fn(ins, attrs, opset)
    return [r.numpy() for r in res]


def check(op_type, inputs, attrs=None, consts=None, opset=17, n_out=1, precise=True, rtol=None, atol=None,
          options=None, tiles=16):
    """Run the node and assert it matches the kernel and was lowered precisely (or generically)."""
    want = reference(op_type, inputs, attrs, consts, opset, n_out)
    got, s, op = run_node(op_type, inputs, attrs, consts, opset, n_out, options=options, tiles=tiles, out_values=want)
    assert op.lowering == ("precise" if precise else "generic"), (op_type, op.lowering)
    half = any(np.asarray(v).dtype == np.float16 for v in list(inputs.values()) + list((consts or {}).values()))
    rt = rtol if rtol is not None else (4e-3 if half else 1e-5)
    at = atol if atol is not None else (4e-3 if half else 1e-5)
    for g, w in zip(got, want):
        g = np.asarray(g).reshape(w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rt, atol=at)
    return s, op
