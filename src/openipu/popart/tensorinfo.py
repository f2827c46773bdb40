"""``popart.DataType`` and ``popart.TensorInfo``, and how each PopART type maps to ONNX,
numpy, torch and the Poplar type of its device tensor.

Device types (``poplar_type``): FLOAT, FLOAT16 -> HALF, INT32 -> INT, UINT32 -> UNSIGNED_INT,
INT16 -> SHORT, UINT16 -> UNSIGNED_SHORT, INT8 -> SIGNED_CHAR, UINT8 -> UNSIGNED_CHAR, BOOL.
INT64 / UINT64 are not IPU types: with ``SessionOptions.enableSupportedDataTypeCasting`` (the
default, as in PopART) their device tensors are INT / UNSIGNED_INT and host data is converted
when streamed (PopART's rule, ``sessionoptions.hpp``); with it off they are Poplar LONGLONG /
UNSIGNED_LONGLONG. DOUBLE has no Poplar type: lowering it raises PopART's
"Is there a poplar type for DOUBLE?".
"""

from __future__ import annotations

import numpy as np
import onnx
import torch

from openipu import poplar
from openipu.popart.errors import popart_exception


class DataType:
    """``popart.DataType`` values (compare with ``==``; ``str`` gives the name)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"DataType.{self.name}"

    def __str__(self):
        return self.name

    def __eq__(self, other):
        if isinstance(other, DataType):
            return self.name == other.name
        if isinstance(other, str):
            return self.name == other.upper()
        return NotImplemented

    def __hash__(self):
        return hash(self.name)


_NAMES = ["UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "UINT32", "UINT64", "BOOL", "FLOAT", "FLOAT16",
          "BFLOAT16", "DOUBLE", "COMPLEX64", "COMPLEX128", "STRING", "UNDEFINED", "FLOAT8_143", "FLOAT8_152"]
for _n in _NAMES:
    setattr(DataType, _n, DataType(_n))

_P = onnx.TensorProto
ONNX_OF = {"FLOAT": _P.FLOAT, "FLOAT16": _P.FLOAT16, "INT32": _P.INT32, "INT64": _P.INT64, "UINT8": _P.UINT8,
           "INT8": _P.INT8, "UINT16": _P.UINT16, "INT16": _P.INT16, "UINT32": _P.UINT32, "UINT64": _P.UINT64,
           "BOOL": _P.BOOL, "DOUBLE": _P.DOUBLE, "BFLOAT16": _P.BFLOAT16, "STRING": _P.STRING,
           "COMPLEX64": _P.COMPLEX64, "COMPLEX128": _P.COMPLEX128, "UNDEFINED": _P.UNDEFINED}
NAME_OF_ONNX = {v: k for k, v in ONNX_OF.items()}
NUMPY_OF = {"FLOAT": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8,
            "INT8": np.int8, "UINT16": np.uint16, "INT16": np.int16, "UINT32": np.uint32, "UINT64": np.uint64,
            "BOOL": np.bool_, "DOUBLE": np.float64, "COMPLEX64": np.complex64, "COMPLEX128": np.complex128}
NAME_OF_NUMPY = {np.dtype(v): k for k, v in NUMPY_OF.items()}
TORCH_OF = {"FLOAT": torch.float32, "FLOAT16": torch.float16, "INT32": torch.int32, "INT64": torch.int64,
            "UINT8": torch.uint8, "INT8": torch.int8, "UINT16": torch.int32, "INT16": torch.int16,
            "UINT32": torch.int64, "UINT64": torch.int64, "BOOL": torch.bool, "DOUBLE": torch.float64,
            "BFLOAT16": torch.bfloat16}
# the names PopART's Python tensorinfo.py accepts besides the DataType names
_ALIASES = {"FLOAT32": "FLOAT", "HALF": "FLOAT16", "INT": "INT32", "FLOAT64": "DOUBLE", "LONG": "INT64"}


def dtype_name(dtype) -> str:
    """Normalise a PopART dtype (DataType, string, numpy dtype/type, ONNX enum) to its name."""
    if isinstance(dtype, DataType):
        return dtype.name
    if isinstance(dtype, str):
        n = dtype.upper()
        n = _ALIASES.get(n, n)
        if n not in ONNX_OF:
            raise popart_exception(f"Unknown data type '{dtype}': use one of {', '.join(NUMPY_OF)}")
        return n
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return NAME_OF_ONNX[int(dtype)]
    try:
        return NAME_OF_NUMPY[np.dtype(dtype)]
    except (TypeError, KeyError):
        raise popart_exception(f"Unknown data type {dtype!r}") from None


def poplar_type(name: str, cast_unsupported: bool = True):
    """The Poplar type of the device tensor for PopART type ``name`` (see module docstring).

    Raises ``popart_exception("Is there a poplar type for DOUBLE?")`` for types with none.
    """
    table = {"FLOAT": poplar.FLOAT, "FLOAT16": poplar.HALF, "INT32": poplar.INT, "UINT32": poplar.UNSIGNED_INT,
             "INT16": poplar.SHORT, "UINT16": poplar.UNSIGNED_SHORT, "INT8": poplar.SIGNED_CHAR,
             "UINT8": poplar.UNSIGNED_CHAR, "BOOL": poplar.BOOL,
             "INT64": poplar.INT if cast_unsupported else poplar.LONGLONG,
             "UINT64": poplar.UNSIGNED_INT if cast_unsupported else poplar.UNSIGNED_LONGLONG}
    t = table.get(name)
    if t is None:
        hint = (" The IPU has no 64-bit floating-point type: convert the model to float32 or float16 "
                "(e.g. GraphTransformer.convertDoublesToFloats)." if name == "DOUBLE" else "")
        raise popart_exception(f"Is there a poplar type for {name}?{hint}")
    return t


class TensorInfo:
    """``popart.TensorInfo(dtype, shape)`` or ``TensorInfo(ndarray)``.

    ``dtype``: a :class:`DataType`, a name (``"FLOAT"``, ``"FLOAT16"``, ``"INT32"`` ...), a numpy
    dtype or an ONNX element-type number. ``shape``: a sequence of non-negative ints.
    """

    def __init__(self, dtype, shape=None):
        if isinstance(dtype, np.ndarray) and shape is None:
            dtype, shape = dtype.dtype, dtype.shape
        if shape is None:
            raise popart_exception("TensorInfo needs a data type and a shape")
        self._dtype = dtype_name(dtype)
        self._shape = [int(s) for s in shape]

    def shape(self) -> list[int]:
        return list(self._shape)

    def rank(self) -> int:
        return len(self._shape)

    def nelms(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    def nbytes(self) -> int:
        return self.nelms() * np.dtype(NUMPY_OF.get(self._dtype, np.uint8)).itemsize

    def dim(self, i: int) -> int:
        return self._shape[i]

    def dataType(self) -> DataType:  # noqa: N802
        return getattr(DataType, self._dtype)

    def data_type(self) -> str:
        return self._dtype

    def data_type_lcase(self) -> str:
        return self._dtype.lower()

    def numpy_dtype(self):
        """The numpy dtype of host buffers for this tensor (openipu helper)."""
        return np.dtype(NUMPY_OF[self._dtype])

    def onnx_type(self) -> int:
        return ONNX_OF[self._dtype]

    def __eq__(self, other):
        return isinstance(other, TensorInfo) and self._dtype == other._dtype and self._shape == other._shape

    def __repr__(self):
        return f"{{{self._dtype}, [{', '.join(map(str, self._shape))}]}}"

    __str__ = __repr__
