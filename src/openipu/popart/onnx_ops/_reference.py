"""Host-side reference executor: runs an ONNX model node by node with the registered kernels.

This is not the IPU path (that is PopART's IR and lowering); it validates kernels on whole models,
serves constant folding, and runs subgraphs for the control-flow kernels (If, Loop, Scan).

Public helpers:

- :func:`to_torch` / :func:`to_numpy`: ndarray <-> torch.Tensor, including bfloat16 and float8
  (``ml_dtypes`` arrays) which ``torch.from_numpy`` does not take;
- :func:`decode_attributes`: a NodeProto's attributes in the kernel contract's form;
- :func:`run_node_on_host`: one node through its kernel;
- :func:`run_graph`: a GraphProto on torch tensors (used by If/Loop/Scan);
- :func:`run_model_on_host`: a ModelProto on numpy inputs -> list of numpy outputs;
- :func:`assert_outputs_close`: the ONNX backend test's comparison (shape, dtype, allclose, nan-aware).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from openipu.popart.onnx_ops import OnnxKernelError, get_kernel

_ML_VIEW = {  # ml_dtypes name -> (storage numpy dtype, torch dtype)
    "bfloat16": (np.uint16, torch.bfloat16),
    "float8_e4m3fn": (np.uint8, torch.float8_e4m3fn),
    "float8_e4m3fnuz": (np.uint8, torch.float8_e4m3fnuz),
    "float8_e5m2": (np.uint8, torch.float8_e5m2),
    "float8_e5m2fnuz": (np.uint8, torch.float8_e5m2fnuz),
    "float8_e8m0fnu": (np.uint8, torch.float8_e8m0fnu),
}
_TORCH_VIEW = {tdt: (name, st) for name, (st, tdt) in _ML_VIEW.items()}
_STORAGE_TORCH = {np.uint8: torch.uint8, np.uint16: torch.int16}


def to_torch(a: Any) -> torch.Tensor:
    """An ndarray (or scalar, or TensorProto) as a torch tensor of the same ONNX element type."""
    if isinstance(a, torch.Tensor):
        return a
    if a is None:
        return None
    if not isinstance(a, np.ndarray):
        from onnx import TensorProto, numpy_helper
        a = numpy_helper.to_array(a) if isinstance(a, TensorProto) else np.asarray(a)
    if a.dtype.name in _ML_VIEW:
        storage, tdt = _ML_VIEW[a.dtype.name]
        raw = np.array(a, copy=True, order="C").view(storage)
        if storage == np.uint16:
            raw = raw.view(np.int16)
        return torch.from_numpy(raw.copy()).view(tdt)
    if a.dtype == object or a.dtype.kind in "USV" or a.dtype.name in (
            "int4", "uint4", "float4_e2m1fn", "int2", "uint2"):
        raise OnnxKernelError(f"element type {a.dtype} has no torch dtype")
    return torch.from_numpy(np.array(a, copy=True, order="C"))


def to_numpy(t: Any) -> np.ndarray:
    """A torch tensor as an ndarray (bfloat16/float8 as ``ml_dtypes`` arrays)."""
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach().cpu().contiguous()
    if t.dtype in _TORCH_VIEW:
        import ml_dtypes
        name, storage = _TORCH_VIEW[t.dtype]
        raw = t.view(torch.int16 if storage == np.uint16 else torch.uint8).numpy()
        return raw.view(storage).view(getattr(ml_dtypes, name))
    return t.numpy()


def decode_attributes(node) -> dict[str, Any]:
    """``node``'s attributes: ints, floats, ``str``, lists, tensors as torch, graphs as GraphProto."""
    from onnx import AttributeProto, helper, numpy_helper
    out = {}
    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            out[a.name] = to_torch(numpy_helper.to_array(a.t))
        elif a.type == AttributeProto.TENSORS:
            out[a.name] = [to_torch(numpy_helper.to_array(t)) for t in a.tensors]
        elif a.type == AttributeProto.SPARSE_TENSOR:
            out[a.name] = _sparse_to_dense(a.sparse_tensor)
        elif a.type == AttributeProto.STRING:
            out[a.name] = a.s.decode("utf-8", errors="replace")
        elif a.type == AttributeProto.STRINGS:
            out[a.name] = [s.decode("utf-8", errors="replace") for s in a.strings]
        else:
            v = helper.get_attribute_value(a)
            out[a.name] = list(v) if isinstance(v, (list, tuple)) or a.type in (
                AttributeProto.INTS, AttributeProto.FLOATS) else v
    return out


def _sparse_to_dense(sp) -> torch.Tensor:
    from onnx import numpy_helper
    values = numpy_helper.to_array(sp.values)
    idx = numpy_helper.to_array(sp.indices).astype(np.int64)
    dims = tuple(sp.dims)
    dense = np.zeros(int(np.prod(dims)) if dims else 1, dtype=values.dtype)
    if idx.ndim == 2:
        idx = np.ravel_multi_index(tuple(idx.T), dims)
    dense[idx.reshape(-1)] = values.reshape(-1)
    return to_torch(dense.reshape(dims))


def _opset_map(opset_import) -> dict[str, int]:
    m = {}
    for o in opset_import:
        m["" if o.domain in ("", "ai.onnx") else o.domain] = int(o.version)
    return m


def run_node_on_host(node, inputs: Sequence[torch.Tensor | None],
                     opsets: Mapping[str, int] | int,
                     outer: Mapping[str, Any] | None = None) -> list[torch.Tensor | None]:
    """Run one NodeProto through its registered kernel; one result per node output.

    ``opsets`` maps domains to versions (an int: the node's own domain's version). Control-flow
    nodes (graph attributes) get ``__opsets__`` and ``__outer__`` (enclosing scope) in ``attrs``.
    """
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    k = get_kernel(domain, node.op_type)
    if k is None and domain == "ai.graphcore":     # PopART's own ops (in a subgraph body)
        from openipu.popart.graphcore_ops import find_kernel
        k = find_kernel(domain, node.op_type)
    if k is None:
        raise OnnxKernelError(f"no host kernel for {domain or 'ai.onnx'}.{node.op_type}")
    if isinstance(opsets, int):
        opsets = {domain: opsets}
    opset = opsets.get(domain, opsets.get("", 1))
    attrs = decode_attributes(node)
    attrs["__num_outputs__"] = len(node.output)
    if any(a.type in (5, 10) for a in node.attribute):  # GRAPH / GRAPHS
        attrs["__opsets__"] = dict(opsets)
        attrs["__outer__"] = dict(outer or {})
    outs = list(k.fn(list(inputs), attrs, opset))
    n = len(node.output)
    if len(outs) < n:
        outs += [None] * (n - len(outs))
    return outs[:n]


def run_graph(graph, env: dict[str, Any], opsets: Mapping[str, int],
              outer: Mapping[str, Any] | None = None, device=None) -> list[Any]:
    """Run ``graph`` with ``env`` (name -> torch tensor) holding its inputs; returns its outputs.

    ``outer`` names values of enclosing graphs visible to a subgraph. ``device`` (a non-CPU
    ``torch.device``, e.g. the IR executor's): the initializers and every node's tensor outputs
    are moved there (a node without inputs, such as Constant, makes CPU tensors).
    """
    from onnx import numpy_helper
    move = device is not None and torch.device(device).type != "cpu"

    def put(v):
        return v.to(device) if move and isinstance(v, torch.Tensor) else v
    scope: dict[str, Any] = dict(outer or {})
    for init in graph.initializer:
        scope[init.name] = put(to_torch(numpy_helper.to_array(init)))
    for sp in graph.sparse_initializer:
        scope[sp.values.name] = put(_sparse_to_dense(sp))
    scope.update(env)
    for node in graph.node:
        ins = [scope[n] if n else None for n in node.input]
        outs = run_node_on_host(node, ins, opsets, scope)
        for name, v in zip(node.output, outs):
            if name:
                scope[name] = put(v)
    return [scope[o.name] for o in graph.output]


def run_model_on_host(model, inputs: Mapping[str, Any] | Sequence[Any]) -> list[np.ndarray]:
    """Run ``model`` (ModelProto or bytes) on the host; ``inputs`` by name or in graph-input order
    (initializers excluded). Returns the graph outputs as numpy arrays, in order."""
    import onnx
    if isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    g = model.graph
    inits = {i.name for i in g.initializer}
    if not isinstance(inputs, Mapping):
        names = [i.name for i in g.input if i.name not in inits]
        if len(inputs) > len(names):  # inputs given for initializer-backed inputs too
            names = [i.name for i in g.input]
        inputs = dict(zip(names, inputs))
    env = {k: (to_torch(v) if not isinstance(v, list) else [to_torch(x) for x in v])
           for k, v in inputs.items()}
    outs = run_graph(g, env, _opset_map(model.opset_import))
    return [[to_numpy(x) for x in o] if isinstance(o, list) else to_numpy(o) for o in outs]


def assert_outputs_close(expected: Sequence[Any], got: Sequence[Any],
                         rtol: float = 1e-3, atol: float = 1e-5) -> None:
    """Raise AssertionError unless every output matches in shape, dtype and value (nan == nan)."""
    assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        if isinstance(e, list):
            assert isinstance(g, list) and len(g) == len(e), f"output {i}: sequence mismatch"
            assert_outputs_close(e, g, rtol, atol)
            continue
        e = np.asarray(e)
        if isinstance(g, torch.Tensor):
            g = to_numpy(g)
        assert g is not None, f"output {i} missing"
        g = np.asarray(g)
        assert g.shape == e.shape, f"output {i}: shape {g.shape}, expected {e.shape}"
        assert g.dtype == e.dtype, f"output {i}: dtype {g.dtype}, expected {e.dtype}"
        if e.dtype == object:
            np.testing.assert_array_equal(g, e)
            continue
        if e.dtype.name in _ML_VIEW:
            if e.dtype.name == "bfloat16":
                rtol = max(rtol, 2.0 ** -6)  # two bfloat16 ulps, as onnx's own runner allows
            e, g = e.astype(np.float32), g.astype(np.float32)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"output {i}")


def check_backend_case(case, rtol: float = 1e-3, atol: float = 1e-5) -> None:
    """Run one ``onnx.backend.test`` TestCase on the host and compare every data set.

    A single-node model goes straight through its kernel (:func:`run_node_on_host`); anything
    else through :func:`run_model_on_host`. Tolerances are the larger of the case's and
    ``rtol``/``atol``. Raises AssertionError on a mismatch, OnnxKernelError (or the kernel's own
    exception) when a kernel cannot run the node.
    """
    import glob
    import os

    import onnx
    from onnx import numpy_helper
    rtol = max(rtol, getattr(case, "rtol", 0.0) or 0.0)
    atol = max(atol, getattr(case, "atol", 0.0) or 0.0)
    model = case.model
    data_sets = case.data_sets
    if model is None:
        model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
        data_sets = []
        for d in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set*"))):
            def load(kind):
                files = sorted(glob.glob(os.path.join(d, f"{kind}_*.pb")),
                               key=lambda f: int(f.rsplit("_", 1)[1].split(".")[0]))
                out = []
                for f in files:
                    t = onnx.TensorProto()
                    with open(f, "rb") as fh:
                        t.ParseFromString(fh.read())
                    out.append(numpy_helper.to_array(t))
                return out
            data_sets.append((load("input"), load("output")))
    g = model.graph
    opsets = _opset_map(model.opset_import)
    for inputs, expected in data_sets:
        inputs = [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x
                  for x in inputs]
        expected = [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x
                    for x in expected]
        if len(g.node) == 1:
            node = g.node[0]
            scope = {}
            for init in g.initializer:
                scope[init.name] = to_torch(numpy_helper.to_array(init))
            for vi, x in zip(g.input, inputs):
                scope[vi.name] = [to_torch(v) for v in x] if isinstance(x, list) else to_torch(x)
            outs = run_node_on_host(node, [scope[n] if n else None for n in node.input], opsets)
            by_name = dict(zip(node.output, outs))
            got = [by_name[o.name] for o in g.output]
            got = [[to_numpy(v) for v in x] if isinstance(x, list) else to_numpy(x)
                   for x in got]
        else:
            got = run_model_on_host(model, inputs)
        assert_outputs_close(expected, got, rtol, atol)
