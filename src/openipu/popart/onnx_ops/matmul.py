"""Matrix-product ONNX operators."""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import onnx_op


def _matmul_flops(in_shapes, out_shapes, attrs):
    k = in_shapes[0][-1] if len(in_shapes[0]) else 1
    return 2.0 * math.prod(out_shapes[0]) * k


@onnx_op("MatMul", flops=_matmul_flops)
def matmul(inputs, attrs, opset):
    return [torch.matmul(inputs[0], inputs[1])]
