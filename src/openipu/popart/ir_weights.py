"""An ONNX model's weights as the IR holds them: the large initializers taken out of the proto as
numpy arrays (one host copy), the weightless proto compacted, and the skeleton model that
``onnx.checker`` and shape inference see (used by :class:`openipu.popart.ir.Ir`)."""

from __future__ import annotations

import math
import os
import sys

import google.protobuf.message
import numpy as np
import onnx
from onnx import numpy_helper

from openipu.popart import tensor_proto
from openipu.popart.errors import popart_exception


def one_line(e: Exception) -> str:
    """An onnx error as one line (its messages span several, with repeated prefixes)."""
    text = " ".join(str(e).split())
    return text.replace("[ShapeInferenceError] Inference error(s): ", "") or type(e).__name__


#: initializers of at least this many bytes are held as numpy arrays, outside the ModelProto
WEIGHT_BYTES = 1 << 16


#: ONNX element types whose ``raw_data`` is the numpy array's bytes (little-endian, one element
#: per item): read from bytes already taken out of the proto without a second copy
_PLAIN_RAW = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                        onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16,
                        onnx.TensorProto.UINT16, onnx.TensorProto.INT32, onnx.TensorProto.UINT32,
                        onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL})


def initializer_array(init: onnx.TensorProto, raw: bytes | None = None) -> np.ndarray:
    """``numpy_helper.to_array(init)``, with a data / dims mismatch (more values than the dims
    hold, a type without numpy equivalent ...) raised as a ``popart_exception`` naming it.
    ``raw``: ``init.raw_data`` when the caller has taken it already (protobuf copies the bytes at
    every read of the field), used as ``to_array`` uses it for the plain numeric types."""
    try:
        if (raw is not None and init.data_type in _PLAIN_RAW and sys.byteorder == "little"
                and not init.HasField("segment")):
            return np.frombuffer(raw, dtype=onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).reshape(init.dims)
        return numpy_helper.to_array(init)
    except Exception as e:  # noqa: BLE001 - numpy's reshape ValueError, onnx's TypeError ...
        raise popart_exception(f"Initializer '{init.name}' of dims {list(init.dims)} cannot be read: "
                               f"{one_line(e)}") from None


def read_external_weights(model: onnx.ModelProto, base_dir: str) -> dict:
    """Load the external data of ``model`` (weights stored beside the model file, in files under
    ``base_dir``), as ``onnx.load`` does, but read each large top-level initializer of a plain
    numeric type straight from its file into a numpy array (one host copy; ``onnx.load`` reads
    the bytes, copies them into the proto, and the IR copies them out again). Those initializers
    are left with their values cleared (an empty ``raw_data``: type and dims kept, as
    :func:`take_weights` leaves an owned proto's weights); every other external tensor is loaded
    into the proto by onnx. Returns ``{name: read-only array}`` in initializer order.

    The file is opened and bounded as onnx opens it (``external_data_helper``: the location must
    stay inside ``base_dir``; offset and length within the file's size); only bytes are read,
    never code. Raises onnx's ``ValueError`` / ``OSError`` (a missing or short file, a location
    outside the model's directory)."""
    from onnx import external_data_helper as edh
    out = {}
    for init in model.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL or init.data_type not in _PLAIN_RAW \
                or sys.byteorder != "little":
            continue
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
        want = math.prod(int(d) for d in init.dims) * dtype.itemsize     # (exact: no int64 wrap)
        if want < WEIGHT_BYTES or any(d < 0 for d in init.dims):     # (a bad shape: the IR's checks name it)
            continue
        info = edh.ExternalDataInfo(init)
        fd = edh._open_external_data_fd(base_dir, info.location, init.name, True)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            offset = info.offset or 0
            if offset > size:
                raise ValueError(f"External data offset ({offset}) exceeds file size ({size}) for tensor "
                                 f"{init.name!r}")
            length = size - offset if info.length is None else info.length
            if length > size - offset:
                raise ValueError(f"External data length ({length}) exceeds available data ({size - offset} bytes "
                                 f"from offset {offset}) for tensor {init.name!r}")
            if length != want:      # loaded as onnx loads it: the IR's reading names the mismatch
                continue
            arr = np.empty(list(init.dims), dtype)
            buf = memoryview(arr.reshape(-1).view(np.uint8))
            f.seek(offset)
            done = 0
            while done < want:
                got = f.readinto(buf[done:])
                if not got:
                    raise ValueError(f"External data of tensor {init.name!r} ends after {done} of {want} bytes")
                done += got
        arr.setflags(write=False)
        out[init.name] = arr
        del init.external_data[:]
        init.data_location = onnx.TensorProto.DEFAULT
        init.raw_data = b""
    edh.load_external_data_for_model(model, base_dir)      # the rest (small tensors, attributes)
    return out


def take_weights(model: onnx.ModelProto, owned: bool, taken: dict | None = None) -> dict:
    """The large top-level initializers of ``model`` as numpy arrays (one host copy of each
    weight). When the IR parsed the proto itself (``owned``), their ``raw_data`` is cleared so the
    weights are not held twice; a ModelProto the caller passed is left as it was. ``taken``: the
    arrays of initializers already read out of the proto (:func:`read_external_weights`), kept in
    the initializers' order."""
    out = {}
    for init in model.graph.initializer:
        if taken and init.name in taken:
            out[init.name] = taken[init.name]
            continue
        if init.data_location == onnx.TensorProto.EXTERNAL:
            continue
        if init.HasField("raw_data"):
            # the bytes are read out of the proto once (each read of the field is a copy); the
            # serialised size bounds them, so a small one is skipped without reading them
            raw = init.raw_data if init.ByteSize() >= WEIGHT_BYTES else b""
            if len(raw) < WEIGHT_BYTES:
                continue
            out[init.name] = initializer_array(init, raw)
        elif tensor_proto.stored_bytes(init) < WEIGHT_BYTES:
            continue
        else:
            out[init.name] = initializer_array(init)
        if owned:
            tensor_proto.clear_values(init)     # raw_data or the typed field (float_data ...)
    return out


def compacted(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` (whose large weights :func:`take_weights` has cleared) in memory of
    its own: protobuf keeps a parsed or converted message's field values in one arena until the
    whole message goes, so a cleared weight (and, in a model converted to fp16, the float32
    original) would otherwise stay in host memory beside the IR's arrays."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def skeleton(model: onnx.ModelProto, weights: dict) -> onnx.ModelProto:
    """A copy of ``model`` for ``onnx.checker`` and shape inference without the large weights:
    each becomes a graph input of its type and shape (the checker serialises the whole model, and
    refuses one over 2 GB; shape inference only needs their shapes)."""
    m, g = onnx.ModelProto(), model.graph
    _copy_fields(m, model, skip="graph")
    _copy_fields(m.graph, g, skip="initializer")
    m.graph.initializer.extend(i for i in g.initializer if i.name not in weights)
    # ONNX infers a Constant's shape from its one attribute: PopART's placement attributes
    # (``__ipu_number``, ``__pipeline_stage`` ...) on a Constant are not shown to it
    for n in m.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and \
                any(a.name.startswith("__") for a in n.attribute):
            keep = [a for a in n.attribute if not a.name.startswith("__")]
            del n.attribute[:]
            n.attribute.extend(keep)
    listed = {vi.name for vi in g.input}
    for init in g.initializer:
        if init.name in weights and init.name not in listed:
            m.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return m


def _copy_fields(dst, src, skip: str) -> None:
    """Copy every set field of protobuf message ``src`` into ``dst`` except ``skip``."""
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        if isinstance(value, google.protobuf.message.Message):
            getattr(dst, fd.name).CopyFrom(value)
        elif not isinstance(value, (str, bytes, int, float)):     # a repeated field
            getattr(dst, fd.name).extend(value)
        else:
            setattr(dst, fd.name, value)
