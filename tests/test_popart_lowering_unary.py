"""Precise lowerings of unary elementwise ops, activations, Clip/Where/Cast, variadic Sum/Mean
and view ops: same numbers as the onnx_ops kernels, fp32 and fp16; declined cases stay generic."""

import numpy as np
import pytest

import popart
from lowering_harness import check

RNG = np.random.default_rng(1)
SHAPES = [(7,), (2, 3, 5), (2, 4, 3, 3)]


def _x(shape, dt, lo=-3.0, hi=3.0):
    return RNG.uniform(lo, hi, shape).astype(dt)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Erf", "Floor", "Ceil", "Round",
                                "Sign", "Sin", "Cos", "Reciprocal"])
def test_unary_matches_kernel(op, dt):
    for shape in SHAPES[:2] if dt == np.float16 else SHAPES:
        x = _x(shape, dt)
        if op == "Reciprocal":
            x[np.abs(x) < 0.1] = 0.5
        check(op, {"x": x})


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_log_sqrt_on_positive_inputs(dt):
    x = _x((3, 17), dt, 0.1, 5.0)
    check("Log", {"x": x})
    check("Sqrt", {"x": x})


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu(dt, approx):
    x = _x((4, 33), dt)
    check("Gelu", {"x": x}, {"approximate": approx}, opset=20, rtol=1e-4 if dt == np.float32 else None,
          atol=1e-5 if dt == np.float32 else None)


def test_int32_abs_neg_precise_int64_generic():
    x = RNG.integers(-9, 9, (3, 4)).astype(np.int32)
    check("Abs", {"x": x})
    check("Neg", {"x": x})
    check("Abs", {"x": x.astype(np.int64)}, precise=False)


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_leaky_relu(dt):
    check("LeakyRelu", {"x": _x((5, 6), dt)}, {"alpha": 0.3})
    check("LeakyRelu", {"x": _x((5, 6), dt)})


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_clip_constant_bounds_and_nan(dt):
    x = _x((4, 9), dt)
    x[0, 0] = np.nan
    check("Clip", {"x": x}, consts={"lo": np.array(-0.5, dt), "hi": np.array(0.7, dt)}, opset=13)
    check("Clip", {"x": x}, consts={"lo": np.array(0.5, dt)}, opset=13)
    check("Clip", {"x": x}, {"min": -1.0, "max": 0.25}, opset=6)
    # lo > hi: ONNX gives hi everywhere (min(max(x, lo), hi))
    check("Clip", {"x": x[1:]}, consts={"lo": np.array(1.0, dt), "hi": np.array(0.0, dt)}, opset=13)


def test_clip_runtime_bounds_generic():
    x = _x((4, 9), np.float32)
    check("Clip", {"x": x, "lo": np.array(-0.5, np.float32)}, opset=13, precise=False)


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int32])
def test_where_broadcast(dt):
    a = (RNG.standard_normal((3, 1, 5)) * 5).astype(dt)
    b = (RNG.standard_normal((4, 5)) * 5).astype(dt)
    c = RNG.random((3, 4, 1)) > 0.5
    check("Where", {"c": c, "a": a, "b": b})


def test_cast_float_half_precise_to_int_generic():
    x = _x((6, 7), np.float32) * 1000
    check("Cast", {"x": x}, {"to": 10})
    check("Cast", {"x": x.astype(np.float16)}, {"to": 1})
    check("Cast", {"x": x}, {"to": 1})
    check("Cast", {"x": x}, {"to": 6}, precise=False)
    ints = RNG.integers(-3000, 3000, (4, 5))
    for src in (np.int64, np.int32):
        for to in (1, 10, 9, 6, 7):
            check("Cast", {"x": ints.astype(src)}, {"to": to})
    check("Cast", {"x": ints > 0}, {"to": 1})
    check("Cast", {"x": x}, {"to": 9})


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_variadic_sum_mean(dt):
    a, b, c = _x((2, 3, 4), dt), _x((3, 4), dt), _x((1, 4), dt)
    check("Sum", {"a": a, "b": b, "c": c})
    check("Mean", {"a": a, "b": b, "c": c})
    check("Sum", {"a": a})
    # mixed element types: PopART's VariadicOp refuses them (npOut's type check), at session creation
    with pytest.raises(popart.popart_exception, match="incompatible types FLOAT and FLOAT16"):
        check("Sum", {"a": a.astype(np.float32), "b": b.astype(np.float16)}, precise=False)


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int32])
def test_views(dt):
    x = (RNG.standard_normal((2, 3, 4, 5)) * 4).astype(dt)
    check("Reshape", {"x": x}, consts={"s": np.array([2, 0, -1], np.int64)}, opset=13)
    check("Flatten", {"x": x}, {"axis": 2})
    check("Squeeze", {"x": x[:, :1]}, consts={"a": np.array([1], np.int64)}, opset=13)
    check("Unsqueeze", {"x": x}, consts={"a": np.array([0, 5], np.int64)}, opset=13)
    check("Transpose", {"x": x}, {"perm": [2, 0, 3, 1]})
    check("Transpose", {"x": x})
    check("Identity", {"x": x})
    check("Concat", {"x": x, "y": x[:, :2]}, {"axis": 1}, consts={"c": np.ones((2, 1, 4, 5), dt)})


def test_dropout_inference_is_identity_training_generic():
    x = _x((3, 8), np.float32)
    check("Dropout", {"x": x}, opset=10)
    check("Dropout", {"x": x}, consts={"r": np.array(0.5, np.float32), "t": np.array(False)}, opset=13)
    s, op = check("Dropout", {"x": x}, {"is_test": 1}, opset=6)
    check("Dropout", {"x": x}, opset=13, n_out=2, precise=False)


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(op, dt):
    a = RNG.integers(-3, 3, (2, 3, 4)).astype(dt)
    b = RNG.integers(-3, 3, (3, 1)).astype(dt)
    check(op, {"a": a, "b": b}, opset=16)


def test_logical_and_isnan():
    a, b = RNG.random((3, 4)) > 0.5, RNG.random((4,)) > 0.5
    for op in ("And", "Or", "Xor"):
        check(op, {"a": a, "b": b})
    check("Not", {"a": a})
    x = _x((3, 5), np.float32)
    x[1, 2] = np.nan
    check("IsNaN", {"x": x})
    check("IsNaN", {"x": x.astype(np.float16)})
    check("Equal", {"a": a, "b": b}, opset=16, precise=False)       # bool compare: generic
