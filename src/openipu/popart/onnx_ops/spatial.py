"""Spatial index ops: AffineGrid (opset 20; ``torch.nn.functional.affine_grid`` semantics, which
ONNX follows) and Col2Im (opset 18; N-D, as the sum of each kernel offset's strided slice)."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op


def _affine_grid_flops(i, o, a):
    """6 flops per grid element [A]"""
    return 6.0 * math.prod(o[0])


def _col2im_flops(i, o, a):
    """one add per input element"""
    return float(math.prod(i[0]))


@onnx_op("AffineGrid", flops=_affine_grid_flops)
def affine_grid(inputs, attrs, opset):
    theta, size = inputs[0], [int(v) for v in inputs[1].tolist()]
    if len(size) not in (4, 5):
        raise OnnxKernelError(f"AffineGrid: size must have 4 or 5 elements, got {len(size)}")
    comp = theta if theta.dtype in (torch.float32, torch.float64) else theta.float()
    grid = F.affine_grid(comp, size, align_corners=bool(attrs.get("align_corners", 0)))
    return [grid.to(theta.dtype)]


@onnx_op("Col2Im", flops=_col2im_flops)
def col2im(inputs, attrs, opset):
    x = inputs[0]
    image = [int(v) for v in inputs[1].tolist()]
    block = [int(v) for v in inputs[2].tolist()]
    nd = len(image)
    dil = list(attrs.get("dilations", [1] * nd))
    strides = list(attrs.get("strides", [1] * nd))
    pads = list(attrs.get("pads", [0] * (2 * nd)))
    n, ck, _ = x.shape
    kprod = math.prod(block)
    if ck % kprod:
        raise OnnxKernelError(f"Col2Im: input dimension 1 ({ck}) is not a multiple of prod(block_shape) "
                              f"({kprod})")
    c = ck // kprod
    padded = [image[d] + pads[d] + pads[d + nd] for d in range(nd)]
    nblocks = [(padded[d] - dil[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(nd)]
    if math.prod(nblocks) != x.shape[2]:
        raise OnnxKernelError(f"Col2Im: input dimension 2 ({x.shape[2]}) does not match the "
                              f"{math.prod(nblocks)} blocks the shapes give")
    cols = x.reshape([n, c] + block + nblocks)
    out = torch.zeros([n, c] + padded, dtype=x.dtype, device=x.device)
    for k in itertools.product(*[range(b) for b in block]):
        idx = (slice(None), slice(None)) + tuple(
            slice(k[d] * dil[d], k[d] * dil[d] + (nblocks[d] - 1) * strides[d] + 1, strides[d])
            for d in range(nd))
        out[idx] += cols[(slice(None), slice(None)) + k]
    crop = (slice(None), slice(None)) + tuple(slice(pads[d], pads[d] + image[d]) for d in range(nd))
    return [out[crop].contiguous()]
