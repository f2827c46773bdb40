"""Poplar element types (``poplar::Type``) and how the simulator stores them.

Each type has Poplar's size in bytes (used by the memory and exchange cost model) and a torch
storage dtype (used by functional execution). Unsigned types without full torch kernels are
stored in a wider signed dtype and wrapped to their range on every write.
"""

from __future__ import annotations

import numpy as np
import torch


class Type:
    """A Poplar element type, e.g. ``poplar.FLOAT``. Compare with ``==``; print with ``str``."""

    __slots__ = ("name", "size", "torch_dtype", "numpy_dtype", "is_float", "is_integral", "wrap_bits", "signed",
                 "space")

    def __init__(self, name, size, torch_dtype, numpy_dtype, is_float, wrap_bits=0, signed=True, space=None):
        self.name = name
        # the simulator's address space holding the type's elements (its storage dtype); QUARTER
        # has one per fp8 format (:data:`QUARTER_F152`), all of them Poplar's one QUARTER type
        self.space = space or name
        self.size = size
        self.torch_dtype = torch_dtype
        self.numpy_dtype = np.dtype(numpy_dtype)
        self.is_float = is_float
        self.is_integral = not is_float
        self.wrap_bits = wrap_bits     # >0: stored wider, wrap to this many bits on write
        self.signed = signed

    def __repr__(self):
        return self.name

    __str__ = __repr__

    def __eq__(self, other):
        return self is other or (isinstance(other, Type) and self.name == other.name)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(self.name)

    def __reduce__(self):
        return (type_from_name, (self.space,))

    def requiresMetadata(self) -> bool:  # noqa: N802 - Poplar spelling
        """True for QUARTER: its values are read through a ``QuarterMetadata`` (format, scale)."""
        return self.name == "quarter"

    def toString(self) -> str:  # noqa: N802 - Poplar spelling
        return self.name

    def wrap(self, values: torch.Tensor) -> torch.Tensor:
        """Cast ``values`` to the storage dtype, wrapping integers to this type's range."""
        if self.is_float:
            return values.to(self.torch_dtype)
        if values.is_floating_point():
            values = torch.trunc(values)
        v = values.to(torch.int64)
        if self.wrap_bits:
            v = v & ((1 << self.wrap_bits) - 1)
        return v.to(self.torch_dtype)


FLOAT = Type("float", 4, torch.float32, np.float32, True)
HALF = Type("half", 2, torch.float16, np.float16, True)
#: fp8 (``poplar::QUARTER``). Its elements are stored in the format of the tensor's
#: ``QuarterMetadata``: this instance stores F143 (E4M3, ``torch.float8_e4m3fn``), the default of a
#: QUARTER tensor without metadata; :data:`QUARTER_F152` (equal to it: the same Poplar type)
#: stores F152 (E5M2, ``torch.float8_e5m2``). See :mod:`openipu.poplar.quarter`.
QUARTER = Type("quarter", 1, torch.float8_e4m3fn, np.uint8, True)
QUARTER_F152 = Type("quarter", 1, torch.float8_e5m2, np.uint8, True, space="quarter_f152")
#: ``poplar::QUARTER_METADATA``: one byte holding a QUARTER tensor's format and scale bias
#: (:mod:`openipu.poplar.quarter` documents the encoding).
QUARTER_METADATA = Type("quarter_metadata", 1, torch.uint8, np.uint8, False, wrap_bits=8, signed=False)
INT = Type("int", 4, torch.int32, np.int32, False)
UNSIGNED_INT = Type("unsigned int", 4, torch.int64, np.uint32, False, wrap_bits=32, signed=False)
SHORT = Type("short", 2, torch.int16, np.int16, False)
UNSIGNED_SHORT = Type("unsigned short", 2, torch.int32, np.uint16, False, wrap_bits=16, signed=False)
CHAR = Type("char", 1, torch.int8, np.int8, False)
SIGNED_CHAR = Type("signed char", 1, torch.int8, np.int8, False)
UNSIGNED_CHAR = Type("unsigned char", 1, torch.uint8, np.uint8, False, signed=False)
BOOL = Type("bool", 1, torch.bool, np.bool_, False)
LONGLONG = Type("long long", 8, torch.int64, np.int64, False)
UNSIGNED_LONGLONG = Type("unsigned long long", 8, torch.int64, np.uint64, False, signed=False)

ALL_TYPES = [FLOAT, HALF, QUARTER, INT, UNSIGNED_INT, SHORT, UNSIGNED_SHORT, CHAR, SIGNED_CHAR,
             UNSIGNED_CHAR, BOOL, LONGLONG, UNSIGNED_LONGLONG]
_BY_NAME = {t.name: t for t in ALL_TYPES}
_BY_NAME.update({QUARTER_F152.space: QUARTER_F152, QUARTER_METADATA.name: QUARTER_METADATA})
_BY_NAME.update({"signed int": INT, "unsigned": UNSIGNED_INT, "uint": UNSIGNED_INT, "float16": HALF,
                 "float32": FLOAT, "int32": INT, "uint32": UNSIGNED_INT, "int16": SHORT, "uint16": UNSIGNED_SHORT,
                 "int8": CHAR, "uint8": UNSIGNED_CHAR, "int64": LONGLONG, "uint64": UNSIGNED_LONGLONG})
_BY_NUMPY = {np.dtype(np.float32): FLOAT, np.dtype(np.float16): HALF, np.dtype(np.int32): INT,
             np.dtype(np.uint32): UNSIGNED_INT, np.dtype(np.int16): SHORT, np.dtype(np.uint16): UNSIGNED_SHORT,
             np.dtype(np.int8): CHAR, np.dtype(np.uint8): UNSIGNED_CHAR, np.dtype(np.bool_): BOOL,
             np.dtype(np.int64): LONGLONG, np.dtype(np.uint64): UNSIGNED_LONGLONG, np.dtype(np.float64): FLOAT}


def type_from_name(name: str) -> Type:
    """The :class:`Type` called ``name`` (Poplar's spelling, e.g. ``"unsigned int"``).

    Raises:
        KeyError: no such type.
    """
    return _BY_NAME[name]


def as_type(t) -> Type:
    """Accept a :class:`Type`, a Poplar type name, a numpy dtype or a Python scalar type."""
    if isinstance(t, Type):
        return t
    if isinstance(t, str):
        return _BY_NAME[t]
    if t is float:
        return FLOAT
    if t is int:
        return INT
    if t is bool:
        return BOOL
    return _BY_NUMPY[np.dtype(t)]
