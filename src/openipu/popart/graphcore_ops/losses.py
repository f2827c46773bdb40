"""PopART's loss ops: IdentityLoss, Nll and L1, with ``reduction`` in PopART's C++
``ReductionType`` order (Sum 0, Mean 1, NoReduction 2); ``reduce_loss`` is shared with Ctc.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops._common import nll_rows
from openipu.popart.graphcore_ops._registry import _gc


@_gc("IdentityLoss")
def identity_loss(inputs, attrs, opset):
    x = inputs[0]
    red = int(attrs.get("reduction", 1))
    return [x.sum() if red == 0 else x.mean() if red == 1 else x.clone()]


def _reduce(x, red: int):
    """PopART's ReductionType (C++ order): Sum 0, Mean 1, NoReduction 2."""
    return x.sum() if red == 0 else x.mean() if red == 1 else x


@_gc("Nll", flops=lambda i, o, a: 2.0 * math.prod(i[1]))
def nll(inputs, attrs, opset):
    """``-log(probs[label])`` per sample (``-probs[label]`` when ``inputIsLogProbability``),
    reduced; probs ``[..., C]``, label ``[...]`` (integers). Rows whose label is ``ignoreIndex``
    count 0 and, for Mean, are left out of the count (as PyTorch's NLLLoss)."""
    p, label = inputs
    p2, lab, keep = nll_rows(p, label, attrs.get("ignoreIndex"))
    picked = p2[torch.arange(p2.shape[0], device=p2.device), lab]
    per = -picked if attrs.get("inputIsLogProbability", 0) else -torch.log(picked)
    per = torch.where(keep, per, torch.zeros((), device=per.device))
    red = int(attrs.get("reduction", 1))
    if red == 1:
        out = per.sum() / max(int(keep.sum()), 1)
    else:
        out = per.reshape(label.shape) if red == 2 else per.sum()
    return [out.to(p.dtype)]


@_gc("L1", flops=lambda i, o, a: 2.0 * math.prod(i[0]))
def l1(inputs, attrs, opset):
    """``lambda * |x|``, reduced (PopART's ``l1loss``)."""
    x = inputs[0]
    return [(_reduce(torch.abs(x.float()), int(attrs.get("reduction", 1))) * float(attrs.get("lambda", 1.0)))
            .to(x.dtype)]


def reduce_loss(per: torch.Tensor, red: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """PopART's loss reduction of per-sample losses (Sum 0, Mean 1, NoReduction 2); Mean
    divides by ``lengths`` (clamped to >= 1) first when given (CTC)."""
    if red == 2:
        return per
    if red == 0:
        return per.sum()
    if lengths is not None:
        per = per / lengths.to(per.dtype).clamp(min=1)
    return per.mean()
