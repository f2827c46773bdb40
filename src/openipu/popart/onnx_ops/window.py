"""Window functions (opset 17): HannWindow, HammingWindow, BlackmanWindow of length ``size``
(a scalar input); ``periodic`` (default 1) divides by ``size`` instead of ``size - 1``;
``output_datatype`` (default FLOAT) is the result's element type. Computed in float64."""

from __future__ import annotations

import math

import torch

from openipu.popart.onnx_ops import onnx_op
from openipu.popart.onnx_ops._common import torch_dtype


def _window(inputs, attrs, coeffs):
    n = int(inputs[0].reshape(()).item())
    denom = n if attrs.get("periodic", 1) else n - 1
    k = torch.arange(n, dtype=torch.float64, device=inputs[0].device)
    w = torch.zeros(n, dtype=torch.float64, device=inputs[0].device)
    for i, a in enumerate(coeffs):
        w = w + a * torch.cos(2 * math.pi * i * k / denom) if i else w + a
    return [w.to(torch_dtype(attrs.get("output_datatype", 1)))]


@onnx_op("HannWindow")
def hann_window(inputs, attrs, opset):
    return _window(inputs, attrs, (0.5, -0.5))


@onnx_op("HammingWindow")
def hamming_window(inputs, attrs, opset):
    return _window(inputs, attrs, (25.0 / 46.0, -(1.0 - 25.0 / 46.0)))


@onnx_op("BlackmanWindow")
def blackman_window(inputs, attrs, opset):
    return _window(inputs, attrs, (0.42, -0.5, 0.08))
