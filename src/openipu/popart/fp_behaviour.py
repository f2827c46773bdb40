"""The IPU's floating-point behaviour that only hardware honours, on the IR executor: stochastic
rounding to float16 (``SessionOptions.enableStochasticRounding``; PopTorch's
``Options.Precision.enableStochasticRounding``) and floating-point exceptions
(``SessionOptions.enableFloatingPointChecks``; PopTorch's
``Options.Precision.enableFloatingPointExceptions``).

Stochastic rounding: a float32 value ``x`` between the two neighbouring float16 values
``lo <= x <= hi`` becomes ``hi`` with probability ``(x - lo) / (hi - lo)`` and ``lo`` otherwise, so
the rounding is unbiased (E[round(x)] = x); values float16 holds exactly stay; beyond float16's
range the result is round-to-nearest (inf past 65520). The draws come from a ``torch.Generator``
seeded by the session's seed (``setRandomSeed``; PopTorch's ``Options.randomSeed``): the same
seed gives the same roundings. [A] the IPU's hardware PRNG stream is not reproduced bit for bit.

Floating-point exceptions: an op that produces inf or NaN from finite inputs (IEEE overflow,
invalid operation, division by zero) stops the run with ``poplar.application_runtime_error``, as
an IPU with ``debug.floatPointOpException`` traps; inf / NaN already in an op's inputs propagate
quietly (they raise at the op that made them).
"""

from __future__ import annotations

import numpy as np
import torch

from openipu import poplar

_FLOATS = (torch.float16, torch.float32, torch.float64, torch.bfloat16)


def stochastic_round_half(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``x`` (float32, any shape) rounded stochastically to float16 with draws from ``gen``;
    returns float16 of ``x``'s shape.

    On the float32 bit patterns: a uniform integer below one float16 step (``2**t`` of the
    ``t`` mantissa bits float16 drops: 13 for float16's normal range, more for its subnormals)
    is added to the magnitude and the dropped bits are cleared, so ``x`` moves up to the next
    float16 value with probability ``(x - lo) / (hi - lo)`` (the carry runs into the exponent as
    the next value's does). Magnitudes below float16's smallest subnormal (2**-24) become 0 or
    2**-24 with that probability; non-finite values, and values whose rounding would leave
    float16's range, are rounded to nearest. numpy's integer ops (a tenth of torch's CPU cost at
    a million elements); the draws come from a numpy generator seeded from ``gen``. A numpy
    path: ``x`` on another device (the IR executor's ``OPENIPU_TORCH_DEVICE``) is copied to the
    host and the result back to ``x``'s device, so every device rounds alike."""
    a = np.ascontiguousarray(x.detach().float().cpu().numpy())
    rng = np.random.default_rng(int(torch.randint(0, 2 ** 62, (1,), generator=gen, device="cpu")))
    bits = a.view(np.int32)
    mag = bits & 0x7FFFFFFF
    exp = mag >> 23
    # float16's normal values start at float32 exponent 113 (2**-14); each exponent below drops one bit more
    mask = (np.int32(1) << np.minimum(13 + np.maximum(113 - exp, 0), 23)) - 1
    noise = rng.integers(0, 1 << 23, size=a.shape, dtype=np.int32) & mask
    r = (((mag + noise) & ~mask) | (bits & np.int32(-0x80000000))).view(np.float32)
    tiny = exp < 103            # |x| < 2**-24, float16's smallest subnormal
    if tiny.any():
        up = rng.random(size=int(tiny.sum()), dtype=np.float32) * np.float32(2.0 ** -24) < np.abs(a[tiny])
        r[tiny] = np.copysign(np.where(up, np.float32(2.0 ** -24), np.float32(0)), a[tiny])
    # past float16's range, inf and NaN: x itself, which the conversion rounds to nearest
    bad = ~(np.abs(r) <= 65504) | ~(np.abs(a) < 65520)
    if bad.any():
        r[bad] = a[bad]
    # exact but where ``bad``: r holds float16 values; back to x's device (the numpy path's move)
    return torch.from_numpy(r).half().to(x.device)


def check_finite(op_type: str, name: str, ins: list, outs: list) -> None:
    """Raise ``poplar.application_runtime_error`` when a floating-point output of op ``name``
    (type ``op_type``) holds inf or NaN while every floating-point input was finite."""
    for v in ins:
        if isinstance(v, torch.Tensor) and v.dtype in _FLOATS and v.numel() and not bool(torch.isfinite(v).all()):
            return
    for i, v in enumerate(outs):
        if isinstance(v, torch.Tensor) and v.dtype in _FLOATS and v.numel() and not bool(torch.isfinite(v).all()):
            kind = "invalid operation (NaN)" if bool(torch.isnan(v).any()) else "overflow or division by zero (inf)"
            raise poplar.application_runtime_error(
                f"Floating point exception: {kind} in {op_type} '{name}' (output {i}) with "
                "enableFloatingPointChecks / Precision.enableFloatingPointExceptions set")
