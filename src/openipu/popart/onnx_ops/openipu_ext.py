"""openipu's own ``ai.openipu`` operators, which :mod:`openipu.onnx_backend` puts into models it
legalises for the IPU (no ONNX model uses them otherwise).

The backend holds tensors of the narrow ONNX types the IPU has no arithmetic for in a wider type
that holds every value exactly: float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, E8M0) and FLOAT4E2M1 in
float32, INT4 / INT2 in int8, UINT4 / UINT2 in uint8. Conversions *to* a narrow type then
become:

- ``NarrowCast(x) -> y`` (attributes ``to``: the narrow ONNX type, ``saturate``, ``round_mode`` as
  ``Cast``): ``x`` converted to ``to`` with ONNX's rounding, saturation (float8) and wrapping
  (int4/int2: as ``numpy.astype`` to the ``ml_dtypes`` type, which the ONNX test data use), held
  in the wide type;
- ``NarrowQuantizeLinear(x, y_scale[, y_zero_point]) -> y`` (attributes of ``QuantizeLinear``
  plus ``to``): ``QuantizeLinear`` to the narrow type ``to``, held in the wide type (the zero
  point arrives in the wide type too).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import FLOAT8, opt, torch_dtype
from openipu.popart.onnx_ops.elementwise import cast_to
from openipu.popart.onnx_ops.quantize import _expand_param

DOMAIN = "ai.openipu"
_T = __import__("onnx").TensorProto
#: narrow ONNX type -> (ml_dtypes name, wide torch dtype, integer range or None)
SUBBYTE = {_T.INT4: ("int4", torch.int8, (-8, 7)), _T.UINT4: ("uint4", torch.uint8, (0, 15)),
           _T.INT2: ("int2", torch.int8, (-2, 1)), _T.UINT2: ("uint2", torch.uint8, (0, 3)),
           _T.FLOAT4E2M1: ("float4_e2m1fn", torch.float32, None)}


def _ml(name):
    import ml_dtypes
    return np.dtype(getattr(ml_dtypes, name))


def _subbyte_cast(x: torch.Tensor, to: int) -> torch.Tensor:
    name, wide, _ = SUBBYTE[to]
    # a numpy path (ml_dtypes' rounding to the sub-byte type): through the host, back to x's device
    a = x.detach().cpu()
    a = (a.float() if a.dtype in (torch.bfloat16,) + FLOAT8 else a).numpy()
    return torch.from_numpy(np.ascontiguousarray(a.astype(_ml(name)).astype(
        {torch.int8: np.int8, torch.uint8: np.uint8, torch.float32: np.float32}[wide]))).to(x.device)


def _narrow(to: int) -> tuple:
    if to in SUBBYTE:
        return "subbyte", None
    dt = torch_dtype(to)
    if dt not in FLOAT8:
        raise OnnxKernelError(f"openipu narrow ops: ONNX type {to} is not a float8 or sub-byte type")
    return "float8", dt


def _narrow_flops(i, o, a):
    """4 flops per element (scale, round, clamp) [A]"""
    return 4.0 * math.prod(o[0])


@onnx_op("NarrowCast", domain=DOMAIN, flops=_narrow_flops)
def narrow_cast(inputs, attrs, opset):
    to = int(attrs.get("to", 0))
    kind, dt = _narrow(to)
    if kind == "subbyte":
        return [_subbyte_cast(inputs[0], to)]
    y = cast_to(inputs[0], dt, attrs.get("saturate", 1), attrs.get("round_mode", "up"))
    return [y.to(torch.float32)]


@onnx_op("NarrowQuantizeLinear", domain=DOMAIN, flops=_narrow_flops)
def narrow_quantize_linear(inputs, attrs, opset):
    to = int(attrs.get("to", 0))
    kind, dt = _narrow(to)
    x, scale, zp = inputs[0], inputs[1], opt(inputs, 2)
    v = x.to(torch.float32) / _expand_param(scale, x, attrs).to(torch.float32)
    if kind == "float8":
        if zp is not None:
            v = v + _expand_param(zp, x, attrs).to(torch.float32)
        return [cast_to(v, dt, attrs.get("saturate", 1)).to(torch.float32)]
    name, wide, rng = SUBBYTE[to]
    if rng is None:  # float4: the zero point is a float4 value held in float32
        if zp is not None:
            v = v + _expand_param(zp, x, attrs).to(torch.float32)
        return [_subbyte_cast(v, to)]
    v = torch.round(v)
    if zp is not None:
        v = v + _expand_param(zp, x, attrs).to(torch.float32)
    return [v.clamp(*rng).to(wide)]
