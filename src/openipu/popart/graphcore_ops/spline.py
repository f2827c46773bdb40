"""SplineBasis and SplineWeighting (PyTorch Geometric's spline convolution ops, as PopART has
them); ``*_setup`` checks raise ``ValueError`` with PopART's message.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops._registry import _gc


def spline_basis_setup(pseudo_shape, ks_shape, open_shape) -> None:
    """PopART's ``SplineBasisOp::setup`` checks."""
    if len(pseudo_shape) != 2:
        raise ValueError(f"SplineBasisOp::setup: pseudo tensor is not a 2-D tensor. Pseudo tensor rank = "
                         f"{len(pseudo_shape)}.")
    if len(ks_shape) != 1:
        raise ValueError(f"SplineBasisOp::setup: kernelSize tensor is not a 1-D tensor. KernelSize tensor rank = "
                         f"{len(ks_shape)}.")
    if len(open_shape) != 1:
        raise ValueError(f"SplineBasisOp::setup: isOpenSpline tensor is not a 1-D tensor. isOpenSpline tensor rank "
                         f"= {len(open_shape)}.")


def _spline_basis_1d(v, degree: int):
    """The ``degree + 1`` B-spline basis values at fractional positions ``v`` (``[..., degree + 1]``,
    popops / torch_spline_conv's ``Basis::forward`` for ``kMod = 0 .. degree``)."""
    if degree == 1:
        parts = [1 - v, v]
    elif degree == 2:
        parts = [0.5 * v * v - v + 0.5, -v * v + v + 0.5, 0.5 * v * v]
    else:
        parts = [(1 - v) ** 3 / 6, (3 * v ** 3 - 6 * v * v + 4) / 6, (-3 * v ** 3 + 3 * v * v + 3 * v + 1) / 6,
                 v ** 3 / 6]
    return torch.stack(parts, -1)


def _spline_basis_flops(i, o, a):
    return 6.0 * math.prod(o[0]) * max(i[0][-1] if i[0] else 1, 1)


@_gc("SplineBasis", flops=_spline_basis_flops)
def spline_basis(inputs, attrs, opset):
    """PopART's ``SplineBasis`` (``popops::splineBasis``, PyTorch Geometric's ``spline_basis``):
    ``[pseudo [E, D] float, kernel_size [D] INT32, is_open_spline [D] UINT8] -> [basis [E, S],
    weight_index [E, S] INT32]``, ``S = (degree + 1)^D``. Spline ``s`` has digits ``k_d`` (base
    ``degree + 1``, dimension 0 least significant); with ``v = pseudo[e, d] * (kernel_size[d] -
    degree * is_open_spline[d])``, ``basis = prod_d B_{k_d}(v - floor(v))`` and ``weight_index =
    sum_d ((floor(v) + k_d) mod kernel_size[d]) * prod(kernel_size[:d])``. ``degree`` 1, 2 or 3
    (PopART accepts 0, which popops rejects)."""
    pseudo, ks, is_open = inputs
    spline_basis_setup(list(pseudo.shape), list(ks.shape), list(is_open.shape))
    degree = int(attrs.get("degree", 1))
    if degree not in (1, 2, 3):
        raise ValueError("Degree must be 1, 2 or 3")
    e, d = pseudo.shape
    ksl = ks.to(torch.int64)
    n_s = (degree + 1) ** d
    ar = {"device": pseudo.device}
    digits = (torch.arange(n_s, **ar).unsqueeze(-1) // (degree + 1) ** torch.arange(d, **ar)) % (degree + 1)   # [S, D]
    v = pseudo.float() * (ksl - degree * is_open.to(torch.int64)).float()                           # [E, D]
    fl = torch.floor(v)
    offsets = torch.cumprod(torch.cat([torch.ones(1, dtype=torch.int64, device=ksl.device), ksl[:-1]]), 0)   # [D]
    wi = (((fl.to(torch.int64).unsqueeze(1) + digits) % ksl.clamp(min=1)) * offsets).sum(-1)       # [E, S]
    per_dim = _spline_basis_1d(v - fl, degree)                                                       # [E, D, deg+1]
    picked = per_dim.unsqueeze(1).expand(e, n_s, d, degree + 1).gather(3, digits.expand(e, n_s, d).unsqueeze(-1))
    basis = picked.squeeze(-1).prod(-1)
    return [basis.to(pseudo.dtype), wi.to(torch.int32)]


def spline_weighting_setup(in_shape, w_shape, b_shape, wi_shape, in_type: str, w_type: str, b_type: str) -> None:
    """PopART's ``SplineWeightingOp::setup`` checks."""
    for what, s, r in (("input", in_shape, 2), ("weight", w_shape, 3), ("basis", b_shape, 2),
                       ("weightIndex", wi_shape, 2)):
        if len(s) != r:
            big = what[0].upper() + what[1:] if what != "weightIndex" else what
            raise ValueError(f"SplineWeightingOp::setup: {what} tensor is not a {r}-D tensor. {big} tensor rank = "
                             f"{len(s)}.")
    for what, t in (("weight", w_type), ("basis", b_type)):
        if t != in_type:
            raise ValueError(f"SplineWeightingOp::setup: The input and {what} tensors have different data types. "
                             f"The input tensor data type = {in_type.lower()}. The {what} tensor data type = "
                             f"{t.lower()}.")


def _spline_weighting_flops(i, o, a):
    return 2.0 * math.prod(i[2]) * i[1][1] * i[1][2] if len(i[1]) == 3 else 0.0


@_gc("SplineWeighting", flops=_spline_weighting_flops)
def spline_weighting(inputs, attrs, opset):
    """PopART's ``SplineWeighting`` (``popops::splineWeighting``, PyTorch Geometric's
    ``spline_weighting``): ``[input [E, Cin], weight [K, Cin, Cout], basis [E, S], weight_index
    [E, S] INT32] -> [E, Cout]``, ``out[e] = sum_s basis[e, s] * input[e] @ weight[weight_index[e,
    s]]``; one batched product per spline."""
    x, w, basis, wi = inputs
    from openipu.popart.shapes import NAME_OF_TORCH
    names = [NAME_OF_TORCH.get(t.dtype, str(t.dtype)) for t in (x, w, basis)]
    spline_weighting_setup(list(x.shape), list(w.shape), list(basis.shape), list(wi.shape), *names)
    xf, wf, bf = x.float(), w.float(), basis.float()
    idx = wi.to(torch.int64)
    out = torch.zeros(x.shape[0], w.shape[2], device=x.device)
    for s in range(basis.shape[1]):
        out = out + bf[:, s:s + 1] * torch.bmm(xf.unsqueeze(1), wf[idx[:, s]]).squeeze(1)
    return [out.to(x.dtype)]
