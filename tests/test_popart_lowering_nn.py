"""Precise lowerings of pooling, normalisation and softmax ops (popnn): same numbers as the
onnx_ops kernels over shapes / attributes / fp32 and fp16; unsupported attributes stay generic."""

import numpy as np
import pytest

from lowering_harness import check

RNG = np.random.default_rng(2)
DTS = [np.float32, np.float16]


def _x(shape, dt):
    return RNG.standard_normal(shape).astype(dt)


POOL_ATTRS = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 0]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [2, 2], "auto_pad": "VALID"},
]


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs", POOL_ATTRS)
def test_pool_2d(op, attrs, dt):
    check(op, {"x": _x((2, 3, 9, 8), dt)}, attrs)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_1d_3d(op):
    check(op, {"x": _x((2, 3, 11), np.float32)}, {"kernel_shape": [3], "strides": [2], "pads": [1, 1]})
    check(op, {"x": _x((1, 2, 5, 6, 4), np.float32)}, {"kernel_shape": [2, 3, 2], "pads": [1, 0, 1, 0, 1, 1]})


def test_avgpool_count_include_pad():
    x = _x((2, 3, 8, 8), np.float32)
    check("AveragePool", {"x": x}, {"kernel_shape": [3, 3], "count_include_pad": 1})          # no pads: precise
    check("AveragePool", {"x": x}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
          precise=False)


def test_maxpool_indices_and_dilations_generic():
    x = _x((1, 2, 8, 8), np.float32)
    check("MaxPool", {"x": x}, {"kernel_shape": [2, 2]}, n_out=2, precise=False)
    check("MaxPool", {"x": x}, {"kernel_shape": [2, 2], "dilations": [2, 2]}, precise=False)


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(op, dt):
    check(op, {"x": _x((2, 5, 7, 6), dt)})
    check(op, {"x": _x((3, 4, 10), dt)})


def _bn_consts(c, dt):
    return {"s": _x((c,), dt), "b": _x((c,), dt), "m": _x((c,), dt), "v": RNG.uniform(0.5, 2, c).astype(dt)}


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("opset", [9, 15])
def test_batchnorm_inference(opset, dt):
    check("BatchNormalization", {"x": _x((2, 4, 5, 3), dt)}, {"epsilon": 1e-3}, consts=_bn_consts(4, dt),
          opset=opset)
    check("BatchNormalization", {"x": _x((3, 6), dt)}, consts=_bn_consts(6, dt), opset=opset)


@pytest.mark.parametrize("dt", DTS)
def test_batchnorm_runtime_stats_and_training(dt):
    c = _bn_consts(4, dt)
    x = _x((2, 4, 3, 3), dt)
    check("BatchNormalization", {"x": x, "s": c["s"], "b": c["b"], "m": c["m"], "v": c["v"]}, opset=15)
    check("BatchNormalization", {"x": x}, {"training_mode": 1, "momentum": 0.7}, consts=c, opset=15, n_out=3)
    # opsets 7-13: training mode is the 5-output form (Y, running mean / var, saved mean / var)
    check("BatchNormalization", {"x": x}, consts=c, opset=9, n_out=5)


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_layernorm(axis, dt):
    x = _x((3, 4, 6), dt)
    c = int(np.prod(x.shape[axis % 3:]))
    check("LayerNormalization", {"x": x}, {"axis": axis, "epsilon": 1e-5},
          consts={"s": _x(x.shape[axis % 3:], dt), "b": _x(x.shape[axis % 3:], dt)})
    if axis == -1:
        check("LayerNormalization", {"x": x}, {"axis": axis}, consts={"s": _x((c,), dt)}, opset=17)
    else:
        check("LayerNormalization", {"x": x}, {"axis": axis}, consts={"s": _x((1,) + x.shape[axis:], dt)})


def test_layernorm_mean_invstd_outputs():
    x = _x((3, 4, 6), np.float32) + 2.0
    check("LayerNormalization", {"x": x}, {"axis": 1},
          consts={"s": _x((4, 6), np.float32), "b": _x((4, 6), np.float32)}, n_out=3)
    # half: the statistics outputs are float (stash_type 1), the lowering's are half -> generic
    check("LayerNormalization", {"x": x.astype(np.float16)}, consts={"s": _x((6,), np.float16)}, n_out=3,
          precise=False)


def test_layernorm_stable_option_on_offset_data():
    x = (_x((4, 32), np.float32) + 300.0)
    s = _x((32,), np.float32)
    check("LayerNormalization", {"x": x}, consts={"s": s}, options={"enableStableNorm": True}, rtol=1e-3, atol=5e-4)
    # (float32 conditioning of a mean of ~300: about 300 x 2^-24 x sqrt(32) absolute in both the
    # kernel and the lowering)


@pytest.mark.parametrize("dt", DTS)
def test_instance_and_group_norm(dt):
    x = _x((2, 6, 5, 4), dt)
    check("InstanceNormalization", {"x": x}, {"epsilon": 1e-4}, consts={"s": _x((6,), dt), "b": _x((6,), dt)})
    for g in (1, 2, 3, 6):
        check("GroupNormalization", {"x": x}, {"num_groups": g}, consts={"s": _x((6,), dt), "b": _x((6,), dt)},
              opset=21)


@pytest.mark.parametrize("dt", DTS)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(op, dt):
    x = _x((3, 4, 7), dt) * 4
    for opset, axis in ((13, -1), (13, 1), (13, 0), (11, 1), (11, 2), (11, 0)):
        check(op, {"x": x}, {"axis": axis}, opset=opset)
    check(op, {"x": x[0, 0]}, opset=13)


def test_softmax_large_logits_stable():
    x = np.array([[1000.0, 1001.0, 999.0], [-5.0, 0.0, 5.0]], np.float32)
    check("Softmax", {"x": x}, opset=13)
