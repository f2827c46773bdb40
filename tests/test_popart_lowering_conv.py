"""Precise lowerings of Conv (poplin.convolution + addBias) and batched MatMul
(poplin.matMulGrouped): same numbers as the onnx_ops kernels over geometries, groups and types."""

import numpy as np
import pytest

from lowering_harness import check

RNG = np.random.default_rng(4)


def _x(shape, dt):
    return (RNG.standard_normal(shape) / 2).astype(dt)


CONV_CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 8, 8), (4, 3, 3, 3), {}),
    ((2, 4, 9, 7), (6, 4, 3, 2), {"strides": [2, 1], "pads": [1, 0, 1, 1]}),
    ((1, 4, 8, 8), (4, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"group": 6, "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 9), (3, 2, 3, 3), {"dilations": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((2, 3, 10), (4, 3, 3), {"strides": [2], "pads": [2, 1]}),
    ((1, 2, 4, 5, 4), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 0]}),
    ((1, 8, 5, 5), (16, 8, 1, 1), {}),
]


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
def test_conv(xs, ws, attrs, dt):
    x, w, b = _x(xs, dt), _x(ws, dt), _x((ws[0],), dt)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dt == np.float32 else {"rtol": 1e-2, "atol": 1e-2}
    check("Conv", {"x": x}, attrs, consts={"w": w, "b": b}, **tol)
    check("Conv", {"x": x, "w": w}, attrs, **tol)


def test_conv_declines():
    x, w = _x((1, 2, 6, 6), np.float32), _x((3, 2, 3, 3), np.float32)
    # negative pads (a crop) are not ONNX: strict shape inference refuses the model at session creation
    from openipu.popart.errors import popart_exception
    with pytest.raises(popart_exception, match="pads must not contain negative values"):
        check("Conv", {"x": x}, {"pads": [-1, 0, 0, 0]}, consts={"w": w}, precise=False)
    check("ConvTranspose", {"x": x}, consts={"w": _x((2, 3, 3, 3), np.float32)}, precise=False)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_batched_matmul_grouped(dt):
    tol = {"rtol": 1e-5, "atol": 1e-5} if dt == np.float32 else {"rtol": 1e-2, "atol": 1e-2}
    s, op = check("MatMul", {"a": _x((2, 12, 16, 8), dt), "b": _x((2, 12, 8, 16), dt)}, **tol)   # 24 groups
    check("MatMul", {"a": _x((3, 1, 4, 5), dt), "b": _x((6, 5, 2), dt)}, **tol)                  # broadcast batch
    check("MatMul", {"a": _x((5,), dt), "b": _x((3, 5, 4), dt)}, **tol)                          # 1-D left
    groups = [g for cs in s._lowered.graph._state.compute_sets for g in cs.groups]
    assert groups and not any("Generic" in g.type_name for g in groups)
