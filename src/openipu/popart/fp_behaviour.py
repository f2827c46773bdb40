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

import torch

from openipu import poplar

_FLOATS = (torch.float16, torch.float32, torch.float64, torch.bfloat16)


def stochastic_round_half(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``x`` (float32, any shape) rounded stochastically to float16 with draws from ``gen``."""
    x = x.float()
    near = x.to(torch.float16)
    nf = near.float()
    up = torch.nextafter(near, torch.full_like(near, float("inf")))
    down = torch.nextafter(near, torch.full_like(near, float("-inf")))
    lo = torch.where(nf > x, down, near)
    hi = torch.where(nf > x, near, torch.where(nf < x, up, near))
    span = hi.float() - lo.float()
    frac = torch.where(span > 0, (x - lo.float()) / torch.where(span > 0, span, torch.ones_like(span)),
                       torch.zeros_like(x))
    u = torch.rand(x.shape, generator=gen)
    out = torch.where(u < frac, hi, lo)
    return torch.where(torch.isfinite(nf) & torch.isfinite(span), out, near)


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
