"""Checks of an ONNX model before PopART builds its IR (session creation), and size bounds of
the host kernels.

``InferenceSession`` / ``TrainingSession`` (so ``openipu run``, PopRT and PopTorch, which build
on them) check a model in three steps, each raising ``popart_exception`` with one line that
names the node, the attribute and what is wrong:

1. ``onnx.checker.check_model`` (:meth:`openipu.popart.ir.Ir._check_model`);
2. strict ONNX shape and type inference, ``onnx.shape_inference.infer_shapes(check_type=True,
   strict_mode=True, data_prop=True)`` (:meth:`openipu.popart.ir.Ir._infer`): together with
   step 1 this is ``check_model(full_check=True)`` (which runs the same strict inference,
   without ``data_prop``). Ops of domains onnx does not register (``ai.graphcore``, the ops the
   Builder's ``aiGraphcore`` emits) are skipped by both: onnx checks a node only against the
   schemas of registered domains, so valid PopART models are not refused;
3. :func:`check_attributes`: what onnx leaves to the backend and PopART refuses in its op
   ``setup()``: ``group`` of Conv / ConvTranspose (>= 1, dividing the channels), LRN ``size``
   (>= 1), window attributes (``kernel_shape``, ``strides``, ``pads``, ``dilations``,
   ``output_padding``, ``output_shape``) beyond a 32-bit size, zero-sized channel or window
   dimensions of convolutions and pools, and (:func:`check_shape`) negative or oversized
   dimensions of any tensor shape inference gives (a pool window larger than its input ...).

:func:`check_kernel_allocation` bounds, before a host kernel runs, the outputs whose size comes
from input values or attributes (``ConstantOfShape``, ``Expand``, ``Tile``, ``Range``, ...): a
model must not make the host allocate gigabytes (or the process be killed for memory) because of
one constant.
"""

from __future__ import annotations

import math
import os

import numpy as np
import onnx

from openipu.popart.errors import popart_exception

#: most elements openipu accepts in one tensor (2**31 - 1: Poplar's element counts and
#: intervals are 32-bit per tile, and a larger tensor is 8 GiB of FLOAT, far beyond the ~0.9 GB
#: of an IPU); shapes from attributes or constant values beyond it are refused
MAX_TENSOR_ELEMENTS = (1 << 31) - 1
#: attribute values taken as sizes (window sizes, strides, pads ...) must fit a signed 32-bit int
MAX_ATTRIBUTE = (1 << 31) - 1

_WINDOW_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool",
               "MaxUnpool", "MaxRoiPool", "DeformConv"}
_WINDOW_ATTRS = ("kernel_shape", "strides", "pads", "dilations", "output_padding", "output_shape")
_POSITIVE = {"kernel_shape", "strides", "dilations"}
_CONV_GROUP_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv"}


def _name(node) -> str:
    return f"{node.op_type} node '{node.name or (node.output[0] if node.output else '?')}'"


def _ints(attr) -> list[int]:
    if attr.type == onnx.AttributeProto.INTS:
        return list(attr.ints)
    if attr.type == onnx.AttributeProto.INT:
        return [attr.i]
    return []


def check_shape(what: str, shape) -> None:
    """Refuse a static ``shape`` (list of ints) with a negative dimension or more than
    :data:`MAX_TENSOR_ELEMENTS` elements. ``what`` names the tensor in the message.
    Raises ``popart_exception``."""
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise popart_exception(f"{what} has shape {list(shape)}, with a negative dimension (an attribute or "
                               "input makes a window larger than its input, or a size negative)")
    if all(isinstance(d, int) for d in shape):
        n = math.prod(shape)
        if n > MAX_TENSOR_ELEMENTS:
            raise popart_exception(f"{what} has shape {list(shape)}: {n:,} elements, more than the "
                                   f"{MAX_TENSOR_ELEMENTS:,} openipu accepts in one tensor")


def check_attributes(graph: onnx.GraphProto, shapes: dict) -> None:
    """Check the attributes of ``graph``'s ai.onnx nodes that onnx's checker and shape inference
    accept but PopART (or any IPU lowering) cannot: see the module docstring, step 3.

    ``shapes``: tensor name -> ``(dtype name, shape)`` as shape inference gave them (shape
    ``None`` or with strings when unknown). Raises ``popart_exception`` naming the node."""
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: a for a in node.attribute}
        op = node.op_type
        if op in _WINDOW_OPS:
            for key in _WINDOW_ATTRS:
                if key not in attrs:
                    continue
                vals = _ints(attrs[key])
                if any(abs(v) > MAX_ATTRIBUTE for v in vals):
                    raise popart_exception(f"{_name(node)}: attribute {key} = {vals} has a value beyond the 32-bit "
                                           f"range (at most {MAX_ATTRIBUTE:,})")
                if key in _POSITIVE and any(v < 1 for v in vals):
                    raise popart_exception(f"{_name(node)}: attribute {key} = {vals} must only contain positive "
                                           "values")
                if key in ("pads", "output_padding") and any(v < 0 for v in vals):
                    raise popart_exception(f"{_name(node)}: attribute {key} = {vals} must not contain negative "
                                           "values")
            x = shapes.get(node.input[0]) if node.input else None
            xs = x[1] if x is not None else None
            if xs is not None and len(xs) >= 2 and any(isinstance(d, int) and d == 0 for d in xs[1:]):
                raise popart_exception(f"{_name(node)}: input '{node.input[0]}' has shape {list(xs)}, with a "
                                       "zero-sized channel or spatial dimension; a convolution or pool needs at "
                                       "least one element in each")
            if op in _CONV_GROUP_OPS:
                group = attrs["group"].i if "group" in attrs else 1
                if not 1 <= group <= MAX_ATTRIBUTE:
                    raise popart_exception(f"{_name(node)}: attribute group = {group} must be at least 1")
                w = shapes.get(node.input[1]) if len(node.input) > 1 and op != "QLinearConv" else None
                if op == "QLinearConv" and len(node.input) > 3:
                    w = shapes.get(node.input[3])
                ws = w[1] if w is not None else None
                if ws is not None and any(isinstance(d, int) and d == 0 for d in ws):
                    raise popart_exception(f"{_name(node)}: weights '{node.input[1]}' have shape {list(ws)}, with a "
                                           "zero-sized dimension")
                ks = _ints(attrs["kernel_shape"]) if "kernel_shape" in attrs else None
                if ks is not None and ws is not None and len(ws) >= 2 and all(isinstance(d, int) for d in ws) \
                        and op != "QLinearConv" and list(ws[2:]) != ks:
                    raise popart_exception(f"{_name(node)}: attribute kernel_shape = {ks} differs from the spatial "
                                           f"dimensions {list(ws[2:])} of its weights '{node.input[1]}'")
                if xs is not None and len(xs) >= 2 and isinstance(xs[1], int) and xs[1] % group:
                    raise popart_exception(f"{_name(node)}: attribute group = {group} does not divide the "
                                           f"{xs[1]} input channels")
            if op not in ("MaxUnpool", "ConvTranspose"):
                y = shapes.get(node.output[0]) if node.output else None
                ys = y[1] if y is not None else None
                if ys is not None and len(ys) > 2 and any(isinstance(d, int) and d == 0 for d in ys[2:]):
                    raise popart_exception(f"{_name(node)}: output '{node.output[0]}' would have shape {list(ys)}: "
                                           "the window (kernel_shape, dilations) is larger than the padded input")
        elif op == "LRN" and "size" in attrs and not 1 <= attrs["size"].i <= MAX_ATTRIBUTE:
            raise popart_exception(f"{_name(node)}: attribute size = {attrs['size'].i} must be at least 1")
        elif op in ("DepthToSpace", "SpaceToDepth") and "blocksize" in attrs \
                and not 1 <= attrs["blocksize"].i <= MAX_ATTRIBUTE:
            raise popart_exception(f"{_name(node)}: attribute blocksize = {attrs['blocksize'].i} must be positive")


def host_bytes_available() -> int:
    """Bytes of host memory available now: ``MemAvailable`` of ``/proc/meminfo``, else the free
    physical pages (``os.sysconf``), else a very large number."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_host_bytes(what: str, nbytes: int) -> None:
    """Refuse a host allocation of ``nbytes`` for ``what`` that would take more than half the
    host memory available now (the process would swap or be killed for memory instead of
    failing cleanly). Raises ``ValueError``."""
    if nbytes > (1 << 28):          # below 256 MiB: not worth reading /proc
        have = host_bytes_available()
        if nbytes > have // 2:
            raise ValueError(f"{what} would allocate {nbytes / (1 << 30):,.1f} GiB on the host, more than half of "
                             f"the {have / (1 << 30):,.1f} GiB available")


def _prod_checked(what: str, dims) -> None:
    dims = [int(d) for d in dims]
    if any(d < 0 for d in dims):
        return      # the kernel refuses negative sizes itself (a RuntimeError, no allocation)
    n = 1
    for d in dims:
        n *= d
        if n > MAX_TENSOR_ELEMENTS:
            raise ValueError(f"{what} would make a tensor of shape {dims} ({math.prod(dims):,} elements), more "
                             f"than the {MAX_TENSOR_ELEMENTS:,} openipu accepts in one tensor")
    check_host_bytes(f"{what} (output shape {dims})", 8 * n)    # 8: the widest element type


def _values(t) -> list:
    try:
        return np.asarray(t.detach().cpu() if hasattr(t, "detach") else t).reshape(-1).tolist()
    except Exception:  # noqa: BLE001 - meta tensors have no values
        return []


#: The op types whose output sizes :func:`check_kernel_allocation` checks (the others' sizes follow
#: from their inputs' shapes): callers that run many kernels may skip the call for other types.
ALLOCATION_CHECKED = frozenset({
    "ConstantOfShape", "Expand", "Tile", "Range", "OneHot", "Resize", "Upsample", "Pad", "RandomNormal",
    "RandomUniform", "Init", "EyeLike", "HannWindow", "HammingWindow", "BlackmanWindow", "Multinomial",
    "AffineGrid", "Col2Im", "CenterCropPad"})


def check_kernel_allocation(op_type: str, inputs: list, attrs: dict) -> None:
    """Refuse, before a host kernel runs, an output whose size comes from values or attributes
    and exceeds :data:`MAX_TENSOR_ELEMENTS` (``ConstantOfShape``, ``Expand``, ``Tile``,
    ``Range``, ``OneHot``, ``Resize`` / ``Upsample`` sizes or scales, ``Pad``, the random
    generators' and ``Init``'s ``shape``, ``EyeLike``'s input, the window ops' size,
    ``Multinomial``'s samples, ``AffineGrid`` / ``Col2Im`` / ``CenterCropPad``'s shape inputs).
    ``inputs``: the kernel's torch
    inputs (``None`` for absent ones). Raises ``ValueError`` (a ``popart_exception`` naming the
    op, through :func:`openipu.popart.shapes.call_kernel`)."""
    if op_type not in ALLOCATION_CHECKED:
        return

    def shape_of(i):
        x = inputs[i] if len(inputs) > i else None
        return list(x.shape) if x is not None and hasattr(x, "shape") else None

    if op_type == "ConstantOfShape" and inputs and inputs[0] is not None:
        _prod_checked(op_type, _values(inputs[0]))
    elif op_type == "Expand" and len(inputs) > 1 and inputs[1] is not None:
        want, have = _values(inputs[1]), shape_of(0) or []
        r = max(len(want), len(have))
        want, have = [1] * (r - len(want)) + want, [1] * (r - len(have)) + have
        _prod_checked(op_type, [max(int(a), int(b)) for a, b in zip(want, have)])
    elif op_type == "Tile" and len(inputs) > 1 and inputs[1] is not None:
        rep, have = _values(inputs[1]), shape_of(0) or []
        if len(rep) == len(have):
            _prod_checked(op_type, [int(a) * int(b) for a, b in zip(rep, have)])
    elif op_type == "Range" and len(inputs) >= 3 and all(x is not None for x in inputs[:3]):
        vals = [_values(x) for x in inputs[:3]]
        if all(len(v) == 1 for v in vals):
            start, limit, delta = (float(v[0]) for v in vals)
            if delta != 0 and all(math.isfinite(v) for v in (start, limit, delta)):
                _prod_checked(op_type, [max(0, math.ceil((limit - start) / delta))])
            elif delta == 0 or not all(math.isfinite(v) for v in (start, limit, delta)):
                raise ValueError(f"Range: start {start}, limit {limit} and delta {delta} give no finite number of "
                                 "elements")
    elif op_type == "OneHot" and len(inputs) > 1 and inputs[1] is not None:
        depth = _values(inputs[1])
        idx = shape_of(0) or []
        if depth:
            _prod_checked(op_type, idx + [int(depth[0])])
    elif op_type in ("Resize", "Upsample"):
        have = shape_of(0) or []
        sizes = _values(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else []
        scales_in = 2 if op_type == "Resize" else 1
        scales = (_values(inputs[scales_in]) if len(inputs) > scales_in and inputs[scales_in] is not None
                  else list(attrs.get("scales") or []))
        if sizes:
            _prod_checked(op_type, sizes)
        elif scales and len(scales) == len(have):
            if not all(math.isfinite(float(s)) for s in scales):
                raise ValueError(f"{op_type}: scales {scales} must be finite")
            _prod_checked(op_type, [math.floor(int(d) * float(s)) for d, s in zip(have, scales)])
    elif op_type == "Pad":
        have = shape_of(0) or []
        pads = _values(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else list(attrs.get("pads") or [])
        if have and len(pads) == 2 * len(have):
            _prod_checked(op_type, [int(d) + max(0, int(a)) + max(0, int(b))
                                    for d, a, b in zip(have, pads[:len(have)], pads[len(have):])])
    elif op_type in ("RandomNormal", "RandomUniform", "Init") and attrs.get("shape") is not None:
        _prod_checked(op_type, list(attrs["shape"]))
    elif op_type == "EyeLike":
        s = shape_of(0)
        if s:
            _prod_checked(op_type, s)
    elif op_type in ("HannWindow", "HammingWindow", "BlackmanWindow") and inputs and inputs[0] is not None:
        size = _values(inputs[0])
        if size:
            _prod_checked(op_type, [int(size[0])])
    elif op_type == "Multinomial":
        s = shape_of(0)
        if s:
            _prod_checked(op_type, s[:1] + [int(attrs.get("sample_size", 1))])
    elif op_type == "AffineGrid" and len(inputs) > 1 and inputs[1] is not None:
        size = _values(inputs[1])
        if size:
            _prod_checked(op_type, [int(v) for v in size] + [len(size) - 2])
    elif op_type == "Col2Im" and len(inputs) > 1 and inputs[1] is not None:
        s, image = shape_of(0) or [], _values(inputs[1])
        if s and image:
            _prod_checked(op_type, s[:1] + [int(v) for v in image])
    elif op_type == "CenterCropPad" and len(inputs) > 1 and inputs[1] is not None:
        _prod_checked(op_type, _values(inputs[1]))
