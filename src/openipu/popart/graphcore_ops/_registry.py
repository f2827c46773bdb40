"""The registry of ``ai.graphcore`` host kernels and the helpers the op families share.

``_gc(*op_types, flops=...)`` registers a kernel ``fn(inputs, attrs, opset) -> outputs`` (torch
tensors in and out, attrs not defaulted) under PopART's op type names; ``find_kernel`` looks in
the :mod:`openipu.popart.onnx_ops` registry first, then here. ``DATA_TYPES`` is PopART's C++
``DataType`` enum order (the ``Init`` op's ``data_type`` attribute).
"""

from __future__ import annotations

from openipu.popart.onnx_ops import OpKernel, get_kernel


_GC: dict[str, OpKernel] = {}


GRAPHCORE = "ai.graphcore"


def _gc(*names, flops=None):
    def reg(fn):
        for n in names:
            _GC[n] = OpKernel(GRAPHCORE, n, fn, flops)
        return fn
    return reg


def find_kernel(domain: str, op_type: str) -> OpKernel | None:
    """The kernel for ``(domain, op_type)``: the onnx_ops registry first, then this module."""
    k = get_kernel(domain, op_type)
    if k is None and domain == GRAPHCORE:
        k = _GC.get(op_type)
    return k


def _float(x):
    return x if x.is_floating_point() else x.float()


#: PopART's C++ ``DataType`` enum order (the ``Init`` op's ``data_type`` attribute)
DATA_TYPES = ["UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "UINT32", "UINT64", "BOOL", "FLOAT", "FLOAT16",
              "BFLOAT16", "FLOAT8_143", "FLOAT8_152", "DOUBLE", "COMPLEX64", "COMPLEX128", "STRING", "UNDEFINED"]


def _ints(v) -> list[int]:
    return [int(x) for x in (v if v is not None else [])]


def _axis(a: int, rank: int, what: str) -> int:
    if not -rank <= a < max(rank, 1):
        raise ValueError(f"{what}: axis {a} is outside the acceptable range [{-rank}, {rank - 1}]")
    return a % max(rank, 1)


def pshape(shape) -> str:
    """A shape as PopART prints one (``[2 3 4]``)."""
    return "[" + " ".join(str(int(d)) for d in shape) + "]"
