"""Helpers shared by the ONNX host kernels: dtype tables, attribute access, axis handling."""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import OnnxKernelError

# ONNX TensorProto.DataType -> torch dtype (None: no torch dtype for it).
ONNX_TO_TORCH: dict[int, torch.dtype | None] = {
    1: torch.float32, 2: torch.uint8, 3: torch.int8, 4: torch.uint16, 5: torch.int16,
    6: torch.int32, 7: torch.int64, 8: None, 9: torch.bool, 10: torch.float16,
    11: torch.float64, 12: torch.uint32, 13: torch.uint64, 14: torch.complex64,
    15: torch.complex128, 16: torch.bfloat16, 17: torch.float8_e4m3fn,
    18: torch.float8_e4m3fnuz, 19: torch.float8_e5m2, 20: torch.float8_e5m2fnuz,
    21: None, 22: None, 23: None, 24: torch.float8_e8m0fnu,
}
TORCH_TO_ONNX = {v: k for k, v in ONNX_TO_TORCH.items() if v is not None}

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
          torch.float8_e5m2fnuz, torch.float8_e8m0fnu)
# Integer dtypes torch stores but has few arithmetic kernels for.
NARROW_UINT = (torch.uint16, torch.uint32, torch.uint64)


def torch_dtype(onnx_type: int) -> torch.dtype:
    """The torch dtype of ONNX element type ``onnx_type``; OnnxKernelError if torch has none."""
    dt = ONNX_TO_TORCH.get(int(onnx_type))
    if dt is None:
        raise OnnxKernelError(f"ONNX element type {onnx_type} has no torch dtype "
                              "(strings, int4/uint4 and float4 are not supported)")
    return dt


def compute_dtype(dt: torch.dtype) -> torch.dtype:
    """A dtype torch can do arithmetic in for values of ``dt`` (float8/bf16 -> float32, uints -> int64)."""
    if dt in FLOAT8:
        return torch.float32
    if dt in NARROW_UINT:
        return torch.int64
    return dt


def widen(t: torch.Tensor) -> torch.Tensor:
    """``t`` in its :func:`compute_dtype` (no copy when it already is)."""
    cd = compute_dtype(t.dtype)
    if cd == t.dtype:
        return t
    if t.dtype == torch.uint64:
        return t.view(torch.int64)
    return t.to(cd)


def narrow(t: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`widen`: back to ``dt``."""
    if t.dtype == dt:
        return t
    if dt == torch.uint64 and t.dtype == torch.int64:
        return t.view(torch.uint64)
    return t.to(dt)


def is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point


def norm_axis(axis: int, rank: int, op: str = "") -> int:
    """``axis`` in ``[0, rank)``; negative axes count from the end."""
    a = int(axis)
    if a < -rank or a >= max(rank, 1):
        raise OnnxKernelError(f"{op}: axis {axis} out of range for rank {rank}")
    return a + rank if a < 0 else a


def norm_axes(axes, rank: int, op: str = "") -> list[int]:
    return [norm_axis(a, rank, op) for a in axes]


def ints(t) -> list[int]:
    """A 0-D/1-D integer tensor or sequence as a list of Python ints."""
    if t is None:
        return []
    if isinstance(t, torch.Tensor):
        return [int(v) for v in t.reshape(-1).tolist()]
    return [int(v) for v in t]


def scalar(t, default=None):
    """A 0-D/1-element tensor (or ``None``) as a Python number."""
    if t is None:
        return default
    if isinstance(t, torch.Tensor):
        if t.numel() == 0:
            return default
        return t.reshape(-1)[0].item()
    return t


def opt(inputs, i):
    """Optional input ``i`` (``None`` if absent)."""
    return inputs[i] if len(inputs) > i else None


def prod(xs) -> int:
    return int(math.prod(xs))


def numel(shape) -> int:
    return int(math.prod(shape)) if len(shape) else 1


def nll_rows(p: torch.Tensor, label: torch.Tensor, ignore_index):
    """PopART's Nll inputs as rows: probabilities ``[rows, C]`` (float32), labels ``[rows]``
    clamped into ``[0, C)`` (int64), and which rows count (label != ``ignore_index``)."""
    c = p.shape[-1]
    lab = label.reshape(-1).long()
    keep = lab != int(ignore_index) if ignore_index is not None else torch.ones_like(lab, dtype=torch.bool)
    return p.float().reshape(-1, c), lab.clamp(0, c - 1), keep
