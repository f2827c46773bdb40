"""Elementwise ONNX operators (numpy-style broadcasting)."""

from __future__ import annotations

import torch

from openipu.popart.onnx_ops import onnx_op


@onnx_op("Add")
def add(inputs, attrs, opset):
    return [torch.add(inputs[0], inputs[1])]


@onnx_op("Relu")
def relu(inputs, attrs, opset):
    return [torch.relu(inputs[0])]
