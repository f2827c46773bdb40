"""Initializers as PopART writes them: ONNX ``TensorProto`` values in the typed fields.

PopART's ``Builder.addInitializedInputTensor`` and the optimizer state ``modelToHost`` adds
(``BuilderImpl::populateTensorProtoFromConstVoidData``) store values in the typed repeated fields,
not ``raw_data``: FLOAT in ``float_data``; INT8 / UINT8 / INT16 / UINT16 / INT32 / BOOL in
``int32_data``; INT64 in ``int64_data``; UINT32 / UINT64 in ``uint64_data``. ``modelToHost``
writes the current weights into each initializer where it already keeps its data
(``onnxutil::getMutableData``: ``raw_data`` if the model has it there, else the typed field), so
a model exported with ``raw_data`` stays that way. Code reading ``init.float_data`` directly and
code using ``onnx.numpy_helper.to_array`` both see the values.

Differences: a new FLOAT16 initializer goes to ``raw_data``, where PopART packs two halves per
element of ``int32_data`` (a layout ``numpy_helper`` misreads; an existing FLOAT16 initializer
with ``int32_data`` in the ONNX layout, one value per element, is written back that way); DOUBLE
(which PopART's Builder refuses) goes to ``double_data``; other types to ``raw_data``.

The fields are filled by parsing their packed wire encoding (``MergeFromString``), built with
numpy, so a weight of 10^8 elements takes a fraction of a second rather than the minutes a
Python-level ``extend`` would.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from openipu.popart.errors import popart_exception

TP = onnx.TensorProto
#: field of each ONNX element type: (field name, field number, wire kind)
_FIELDS = {TP.FLOAT: ("float_data", 4, "fixed32"), TP.DOUBLE: ("double_data", 10, "fixed64"),
           TP.INT64: ("int64_data", 7, "varint"), TP.UINT32: ("uint64_data", 11, "varint"),
           TP.UINT64: ("uint64_data", 11, "varint"),
           **{t: ("int32_data", 5, "varint") for t in (TP.INT8, TP.UINT8, TP.INT16, TP.UINT16, TP.INT32, TP.BOOL,
                                                       TP.FLOAT16)}}
_TYPED = ("float_data", "double_data", "int32_data", "int64_data", "uint64_data")
#: elements encoded per chunk (bounds the temporary memory of the varint encoding)
_CHUNK = 1 << 20


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _varints(values: np.ndarray) -> bytes:
    """Protobuf varints of ``values`` (uint64), vectorised in chunks."""
    parts = []
    width = max(1, -(-int(values.max(initial=0)).bit_length() // 7))      # 7-bit groups of the largest
    shifts = np.arange(0, 7 * width, 7, dtype=np.uint64)
    for i in range(0, values.size, _CHUNK):
        v = values[i:i + _CHUNK]
        groups = ((v[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)
        nonzero = groups != 0
        # bytes needed: one past the highest non-zero 7-bit group (at least one)
        n = np.where(nonzero.any(1), width - np.argmax(nonzero[:, ::-1], axis=1), 1)
        k = np.arange(width)[None, :]
        groups[k < (n[:, None] - 1)] |= 0x80
        parts.append(groups[k < n[:, None]].tobytes())
    return b"".join(parts)


def _payload(arr: np.ndarray, elem_type: int) -> bytes:
    kind = _FIELDS[elem_type][2]
    flat = arr.reshape(-1)
    if kind == "fixed32":
        return flat.astype("<f4").tobytes()
    if kind == "fixed64":
        return flat.astype("<f8").tobytes()
    if elem_type == TP.FLOAT16:
        u = flat.astype(np.float16).view(np.uint16).astype(np.uint64)
    elif elem_type == TP.BOOL:
        u = flat.astype(np.uint64)
    elif elem_type in (TP.UINT32, TP.UINT64, TP.UINT8, TP.UINT16):
        u = flat.astype(np.uint64)
    else:       # signed: two's complement on 64 bits, as protobuf encodes a negative int32 / int64
        u = flat.astype(np.int64).view(np.uint64)
    return _varints(u)


def _set_typed(tp: TP, arr: np.ndarray) -> None:
    """Put ``arr`` into ``tp``'s typed field (cleared first) by parsing its packed encoding."""
    field, number, _ = _FIELDS[tp.data_type]
    for f in _TYPED:
        tp.ClearField(f)
    if arr.size == 0:
        return
    payload = _payload(arr, tp.data_type)
    tp.MergeFromString(_varint((number << 3) | 2) + _varint(len(payload)) + payload)


def typed_tensor(arr, name: str) -> TP:
    """A ``TensorProto`` named ``name`` holding ``arr`` in PopART's typed field (``raw_data`` for
    element types without one). Mirrors ``Builder.addInitializedInputTensor``'s storage."""
    arr = np.asarray(arr)
    elem = numpy_helper.from_array(np.zeros((), arr.dtype)).data_type if arr.dtype != np.bool_ else TP.BOOL
    if elem not in _FIELDS or elem == TP.FLOAT16:
        return numpy_helper.from_array(np.ascontiguousarray(arr).reshape(arr.shape), name)
    tp = TP(name=name, data_type=elem, dims=list(arr.shape))
    _set_typed(tp, arr)
    return tp


def write_into(tp: TP, arr) -> None:
    """Write ``arr`` (the initializer's shape and type) into ``tp`` where ``tp`` keeps its data:
    ``raw_data`` if it has it, else its typed field (PopART's ``onnxutil::getMutableData``)."""
    arr = np.asarray(arr).astype(onnx.helper.tensor_dtype_to_np_dtype(tp.data_type), copy=False)
    if tp.HasField("raw_data") or tp.data_type not in _FIELDS:
        tp.raw_data = np.ascontiguousarray(arr).tobytes()
        return
    _set_typed(tp, arr)


def stored_bytes(tp: TP) -> int:
    """Bytes of ``tp``'s values as the model holds them (raw or typed)."""
    if tp.HasField("raw_data"):
        return len(tp.raw_data)
    field = _FIELDS.get(tp.data_type, (None,))[0]
    if field is None:
        return 0
    n = len(getattr(tp, field))
    return n * (8 if field in ("double_data", "int64_data", "uint64_data") else 4)


def clear_values(tp: TP) -> None:
    """Drop ``tp``'s values, keeping its name, type, dims and where it stores them (an empty
    ``raw_data`` stays set, so :func:`write_into` writes ``raw_data`` back)."""
    if tp.HasField("raw_data"):
        tp.raw_data = b""
    for f in _TYPED:
        tp.ClearField(f)


def read_external_data(m: onnx.ModelProto) -> None:
    """Initializers of a model given as bytes whose data is ``EXTERNAL`` (``saveInitializersExternally``):
    read from their ``location`` (as written: absolute, or relative to the working directory,
    as PopART reads it) at ``offset`` / ``length``, into ``raw_data``."""
    for t in m.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        try:
            with open(loc, "rb") as f:
                f.seek(int(info.get("offset", 0)))
                n = info.get("length")
                raw = f.read(int(n)) if n is not None else f.read()
        except (OSError, ValueError) as e:
            raise popart_exception(f"Could not read the external data of initializer '{t.name}' from '{loc}': "
                                   f"{e}") from None
        want = int(np.prod(list(t.dims))) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        if len(raw) != want:
            raise popart_exception(f"External data of initializer '{t.name}' in '{loc}' has {len(raw)} bytes, but "
                                   f"its type and dims need {want}")
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
        t.raw_data = raw
