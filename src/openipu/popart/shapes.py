"""Node attributes and output shapes: decoding ONNX attributes for kernels, and the fallback
that runs an op's host kernel on zero tensors to learn output shapes and types when ONNX shape
inference cannot (ai.graphcore ops, data-dependent shapes with constant inputs).
"""

from __future__ import annotations

import numpy as np
import onnx
import torch

from openipu.popart.errors import popart_exception
from openipu.popart.model_check import check_kernel_allocation
from openipu.popart.onnx_ops._reference import decode_attributes, to_torch  # noqa: F401 - re-exported
from openipu.popart.tensorinfo import NAME_OF_ONNX, TORCH_OF

NAME_OF_TORCH = {torch.float32: "FLOAT", torch.float16: "FLOAT16", torch.int32: "INT32", torch.int64: "INT64",
                 torch.bool: "BOOL", torch.uint8: "UINT8", torch.int8: "INT8", torch.int16: "INT16",
                 torch.float64: "DOUBLE", torch.bfloat16: "BFLOAT16", torch.uint16: "UINT16",
                 torch.uint32: "UINT32", torch.uint64: "UINT64"}
#: the torch dtype host kernels take for each PopART type (unsigned types native, as the onnx_ops
#: kernels expect them; device storage may be wider, see ``tensorinfo.TORCH_OF``)
KERNEL_TORCH_OF = {**TORCH_OF, "UINT16": torch.uint16, "UINT32": torch.uint32, "UINT64": torch.uint64}


def decode_attrs(node: onnx.NodeProto) -> dict:
    """Attributes of ``node`` as the onnx_ops kernels take them (PopART's ``__*`` annotations
    such as ``__ipu_number`` are left out); the decoding is the kernels' own
    (:func:`openipu.popart.onnx_ops._reference.decode_attributes`)."""
    return {k: v for k, v in decode_attributes(node).items() if not k.startswith("__")}


def annotations(node: onnx.NodeProto) -> dict:
    """PopART's ``__*`` node annotations (``__ipu_number``, ``__pipeline_stage`` ...)."""
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name.startswith("__")}


def zeros(dtype: str, shape, fill: str = "zeros") -> torch.Tensor:
    """Zeros (``fill="zeros"``), the distinct values 1, 2, 3, ... (``"arange"``, wrapping in
    narrow types) or a shape-only tensor without values (``"meta"``, torch's meta device) of a
    PopART type and shape, for probing kernels."""
    dt = KERNEL_TORCH_OF.get(dtype, torch.float32)
    shape = [int(s) for s in shape]
    if fill == "meta":
        return torch.empty(shape, dtype=dt, device="meta")
    if fill == "arange":
        if dt == torch.bool:
            return torch.ones(shape, dtype=dt)
        n = max(1, int(np.prod(shape)))
        return (torch.arange(1, n + 1, dtype=torch.int64) % 100 + 1).to(dt).reshape(shape)
    return torch.zeros(shape, dtype=dt)


def subgraph_free_names(node: onnx.NodeProto) -> list[str]:
    """Names the subgraphs of ``node`` (graph attributes, nested too) use but do not define:
    tensors of the enclosing scopes, in first-use order."""
    out: list[str] = []

    def walk(g: onnx.GraphProto, bound: set):
        bound = bound | {i.name for i in g.input} | {i.name for i in g.initializer}
        for n in g.node:
            for x in n.input:
                if x and x not in bound and x not in out:
                    out.append(x)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g, bound)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sg in a.graphs:
                        walk(sg, bound)
            bound = bound | {o for o in n.output if o}
        for o in g.output:
            if o.name not in bound and o.name not in out:
                out.append(o.name)

    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            walk(a.g, set())
        elif a.type == onnx.AttributeProto.GRAPHS:
            for sg in a.graphs:
                walk(sg, set())
    return out


def call_kernel(kernel, inputs: list, attrs: dict, opset: int) -> list:
    """Run ``kernel``; for a node with subgraphs, the trailing ``attrs["__outer_names__"]``
    inputs are the enclosing-scope tensors the subgraphs use, passed as ``attrs["__outer__"]``.

    For an op of the IR (its attributes carry ``attrs["__node__"]``, the node's name), a kernel
    failure is a ``popart_exception`` naming the op, not a bare torch error."""
    names = attrs.get("__outer_names__")
    if names:
        n = len(inputs) - len(names)
        attrs = {**attrs, "__outer__": {**attrs.get("__outer__", {}), **dict(zip(names, inputs[n:]))}}
        inputs = inputs[:n]
    node = attrs.get("__node__")
    if node is None:
        check_kernel_allocation(kernel.op_type, inputs, attrs)
        return kernel.fn(inputs, attrs, opset)
    try:
        check_kernel_allocation(kernel.op_type, inputs, attrs)
        return kernel.fn(inputs, attrs, opset)
    except popart_exception:
        raise
    except Exception as e:
        raise kernel_failure(kernel, node, inputs, e) from e


def kernel_failure(kernel, node: str, inputs: list, e: Exception) -> popart_exception:
    """The ``popart_exception`` for the host kernel of the IR op ``node`` failing with ``e`` on
    ``inputs`` (torch tensors, ``None`` for absent ones): names the op, its inputs' shapes and the
    first line of ``e``."""
    shapes = ", ".join("-" if x is None else str(list(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__
                       for x in inputs)
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return popart_exception(f"Op {kernel.domain or 'ai.onnx'}.{kernel.op_type} '{node}' failed in its host kernel "
                            f"on inputs of shape(s) {shapes}: {msg}")


def probe(kernel, in_infos, attrs: dict, opset: int, const_values=None, fill: str = "zeros"):
    """Run ``kernel`` on zeros (``fill``, see :func:`zeros`; ``"meta"``: shape-only tensors, no
    host memory, raising where the kernel reads values) or the known constant values of
    ``in_infos`` (list of ``(dtype name, shape)`` or ``None``). Returns ``[(dtype name, shape)]``
    per output."""
    const_values = const_values or [None] * len(in_infos)
    from openipu.popart.model_check import check_host_bytes
    if fill != "meta":
        check_host_bytes(f"probing {kernel.op_type} for its output shapes",
                         sum(8 * int(np.prod(i[1], dtype=np.float64)) for i, cv in zip(in_infos, const_values)
                             if i is not None and cv is None and i[1] is not None))
    ins = []
    for info, cv in zip(in_infos, const_values):
        ins.append(cv if cv is not None else (None if info is None else zeros(info[0], info[1], fill)))
    with torch.no_grad():
        outs = call_kernel(kernel, ins, attrs, opset)
    # storage dtypes shared by several ONNX types (uint16 held in int32 ...): when all inputs have
    # one type, an output of its storage dtype has that type
    names = dict(NAME_OF_TORCH)
    in_types = {i[0] for i in in_infos if i is not None}
    if len(in_types) == 1:
        t = in_types.pop()
        names[KERNEL_TORCH_OF.get(t, torch.float32)] = t
    return [(names.get(o.dtype, "FLOAT"), list(o.shape)) for o in outs]


def value_info_of(vi: onnx.ValueInfoProto):
    """``(dtype name, shape)`` of a ValueInfoProto; shape ``None`` if unknown, and dims that are
    symbolic or unknown given as their ``dim_param`` string (or ``"?"``)."""
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    dtype = NAME_OF_ONNX.get(tt.elem_type, "UNDEFINED")
    if not tt.HasField("shape"):
        return (dtype, None)
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or "?")
    return (dtype, dims)


def is_static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def subgraph_output_infos(node: onnx.NodeProto, infos: dict, consts: dict) -> list:
    """Output ``(dtype, shape)`` (or None) of an If / Loop / Scan node from the types its
    subgraphs declare for their outputs, for when ONNX inference cannot see through them
    (``ai.graphcore`` ops inside): If's outputs are its then-branch's; Loop's are the body's
    loop-carried outputs, then its scan outputs with the trip count (a constant) in front;
    Scan's are the body's states, then its scan outputs with the sequence length inserted at
    ``scan_output_axes``. ``infos``: tensor id -> ``(dtype, shape)`` of the enclosing graph;
    ``consts``: tensor id -> numpy value of its constants (Loop's trip count)."""
    graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    ints_ = {a.name: list(a.ints) for a in node.attribute if a.type == onnx.AttributeProto.INTS}
    n_out = len(node.output)
    if node.op_type == "If":
        g = graphs.get("then_branch")
        return [value_info_of(vi) for vi in g.output][:n_out] if g is not None else [None] * n_out
    body = graphs.get("body")
    if body is None:
        return [None] * n_out
    outs = [value_info_of(vi) for vi in body.output]
    if node.op_type == "Loop":
        carried = len(node.input) - 2
        trip = consts.get(node.input[0]) if node.input and node.input[0] else None
        res = outs[1:1 + carried]
        for o in outs[1 + carried:]:
            res.append((o[0], [int(np.asarray(trip).reshape(-1)[0])] + list(o[1]))
                       if o is not None and o[1] is not None and trip is not None else None)
        return (res + [None] * n_out)[:n_out]
    n_scan = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
    states = len(node.input) - n_scan
    first = node.input[states] if n_scan and states < len(node.input) else None
    in_axes = ints_.get("scan_input_axes") or [0]
    seq = None
    if first in infos:
        shape = infos[first][1]
        seq = shape[in_axes[0] % len(shape)]
    res = outs[:states]
    out_axes = ints_.get("scan_output_axes") or []
    for k, o in enumerate(outs[states:]):
        if o is None or o[1] is None or seq is None:
            res.append(None)
            continue
        shape = list(o[1])
        ax = out_axes[k] if k < len(out_axes) else 0
        ax = ax % (len(shape) + 1)
        res.append((o[0], shape[:ax] + [seq] + shape[ax:]))
    return (res + [None] * n_out)[:n_out]
