"""popops elementwise: the expression API, map / mapInPlace / mapWithOutput, the named wrappers,
their cycle estimates and their errors, against numpy references."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popops
from openipu.poplibs.popops import expr as pe

U, B, T = pe.UnaryOpType, pe.BinaryOpType, pe.TernaryOpType
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _round_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


# op -> (numpy reference in float64, input sampler(rng, n))
_u = lambda lo, hi: (lambda r, n: r.uniform(lo, hi, n))  # noqa: E731
FLOAT_UNARY = {
    U.ABSOLUTE: (np.abs, _u(-3, 3)), U.ASIN: (np.arcsin, _u(-0.95, 0.95)), U.CBRT: (np.cbrt, _u(-8, 8)),
    U.CEIL: (np.ceil, _u(-5, 5)), U.COS: (np.cos, _u(-3, 3)), U.ERF: (_erf, _u(-2, 2)),
    U.EXPONENT: (np.exp, _u(-3, 3)), U.EXPONENT_MINUS_ONE: (np.expm1, _u(-1, 1)),
    U.EXPONENT2: (np.exp2, _u(-3, 3)), U.FLOOR: (np.floor, _u(-5, 5)),
    U.GELU_ERF: (lambda x: x * 0.5 * (1 + _erf(x / np.sqrt(2))), _u(-3, 3)),
    U.INVERSE: (lambda x: 1 / x, lambda r, n: r.uniform(0.5, 4, n) * r.choice([-1, 1], n)),
    U.IS_FINITE: (np.isfinite, lambda r, n: r.choice([0.5, -1.0, np.inf, -np.inf, np.nan], n)),
    U.IS_INF: (np.isinf, lambda r, n: r.choice([0.5, -1.0, np.inf, -np.inf, np.nan], n)),
    U.IS_NAN: (np.isnan, lambda r, n: r.choice([0.5, -1.0, np.inf, -np.inf, np.nan], n)),
    U.LOGARITHM: (np.log, _u(0.1, 10)), U.LOGARITHM_ONE_PLUS: (np.log1p, _u(-0.5, 3)),
    U.NEARBY_INT: (np.rint, lambda r, n: r.choice([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -1.7], n)),
    U.NEGATE: (np.negative, _u(-3, 3)), U.RELU: (lambda x: np.maximum(x, 0), _u(-3, 3)),
    U.SIGNUM: (np.sign, lambda r, n: r.choice([-2.0, 0.0, 3.0], n)), U.SIN: (np.sin, _u(-3, 3)),
    U.TAN: (np.tan, _u(-1.2, 1.2)), U.TANH: (np.tanh, _u(-3, 3)),
    U.ROUND: (_round_away, lambda r, n: r.choice([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -1.7], n)),
    U.TRUNC: (np.trunc, _u(-5, 5)), U.SQRT: (np.sqrt, _u(0, 9)), U.SQUARE: (np.square, _u(-3, 3)),
    U.SIGMOID: (lambda x: 1 / (1 + np.exp(-x)), _u(-4, 4)), U.RSQRT: (lambda x: 1 / np.sqrt(x), _u(0.2, 9)),
}
FLOAT_BINARY = {
    B.ADD: (np.add, _u(-3, 3), _u(-3, 3)), B.SUBTRACT: (np.subtract, _u(-3, 3), _u(-3, 3)),
    B.MULTIPLY: (np.multiply, _u(-3, 3), _u(-3, 3)),
    B.DIVIDE: (np.divide, _u(-3, 3), lambda r, n: r.uniform(0.5, 3, n) * r.choice([-1, 1], n)),
    B.MAXIMUM: (np.fmax, _u(-3, 3), _u(-3, 3)), B.MINIMUM: (np.fmin, _u(-3, 3), _u(-3, 3)),
    B.POWER: (np.power, _u(0.1, 3), _u(-2, 2)), B.REMAINDER: (np.fmod, _u(-9, 9), _u(1, 3)),
    B.ATAN2: (np.arctan2, _u(-3, 3), _u(-3, 3)),
    B.INV_STD_DEV_TO_VARIANCE: (lambda a, b: 1 / (a * a) - b, _u(0.5, 3), _u(0, 0.1)),
    B.VARIANCE_TO_INV_STD_DEV: (lambda a, b: 1 / np.sqrt(a + b), _u(0.5, 3), _u(0, 0.1)),
    B.EQUAL: (np.equal, lambda r, n: r.integers(0, 3, n), lambda r, n: r.integers(0, 3, n)),
    B.NOT_EQUAL: (np.not_equal, lambda r, n: r.integers(0, 3, n), lambda r, n: r.integers(0, 3, n)),
    B.LESS_THAN: (np.less, lambda r, n: r.integers(0, 3, n), lambda r, n: r.integers(0, 3, n)),
    B.LESS_THAN_EQUAL: (np.less_equal, lambda r, n: r.integers(0, 3, n), lambda r, n: r.integers(0, 3, n)),
    B.GREATER_THAN: (np.greater, lambda r, n: r.integers(0, 3, n), lambda r, n: r.integers(0, 3, n)),
    B.GREATER_THAN_EQUAL: (np.greater_equal, lambda r, n: r.integers(0, 3, n), lambda r, n: r.integers(0, 3, n)),
}


def _ctrunc_div(a, b):
    return np.trunc(a / b).astype(np.int64)


def _to32(v):
    v = np.asarray(v, np.int64) & 0xFFFFFFFF
    return np.where(v >= 2 ** 31, v - 2 ** 32, v)


INT_BINARY = {   # on INT; references in int64 with C semantics, wrapped to 32 bits
    B.ADD: np.add, B.SUBTRACT: np.subtract, B.MULTIPLY: np.multiply, B.DIVIDE: _ctrunc_div,
    B.REMAINDER: np.fmod, B.MAXIMUM: np.maximum, B.MINIMUM: np.minimum, B.BITWISE_AND: np.bitwise_and,
    B.BITWISE_OR: np.bitwise_or, B.BITWISE_XOR: np.bitwise_xor, B.BITWISE_XNOR: lambda a, b: ~(a ^ b),
    B.SHIFT_LEFT: lambda a, b: a << b, B.SHIFT_RIGHT: lambda a, b: (a & 0xFFFFFFFF) >> b,
    B.SHIFT_RIGHT_SIGN_EXTEND: lambda a, b: a >> b, B.EQUAL: np.equal, B.NOT_EQUAL: np.not_equal,
    B.LESS_THAN: np.less, B.GREATER_THAN_EQUAL: np.greater_equal,
}
INT_UNARY = {
    U.ABSOLUTE: np.abs, U.NEGATE: np.negative, U.SIGNUM: np.sign, U.SQUARE: np.square, U.BITWISE_NOT: np.invert,
    U.POPCOUNT: np.vectorize(lambda x: bin(int(x) & 0xFFFFFFFF).count("1")),
    U.COUNT_LEADING_ZEROS: np.vectorize(lambda x: 32 - (int(x) & 0xFFFFFFFF).bit_length()),
}


def _tol(dtype):
    return dict(rtol=2e-3, atol=2e-3) if dtype == np.float16 else dict(rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_float_unary_op(dtype):
    h = OpHarness(tiles=8)
    rng = np.random.default_rng(1)
    outs, refs = {}, {}
    for i, (op, (ref, sample)) in enumerate(FLOAT_UNARY.items()):
        x = sample(rng, 30).astype(dtype)
        t = h.input(f"x{i}", x, mapping=["linear", "random", "blocks"][i % 3])
        outs[op.name] = popops.map(h.graph, op, t, h.prog)
        refs[op.name] = ref(x.astype(np.float64))
    res = h.run(**outs)
    for k, want in refs.items():
        got = res[k]
        if want.dtype == bool:
            assert got.dtype == np.bool_ and (got == want).all(), k
        else:
            assert got.dtype == dtype, k
            np.testing.assert_allclose(got.astype(np.float64), want, err_msg=k, **_tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_float_binary_op(dtype):
    h = OpHarness(tiles=8)
    rng = np.random.default_rng(2)
    outs, refs = {}, {}
    for i, (op, (ref, sa, sb)) in enumerate(FLOAT_BINARY.items()):
        a, b = sa(rng, 24).astype(dtype), sb(rng, 24).astype(dtype)
        ta = h.input(f"a{i}", a, mapping=["random", "linear", "blocks"][i % 3])
        tb = h.input(f"b{i}", b, mapping=["blocks", "tile0", "random"][i % 3])
        outs[op.name] = popops.map(h.graph, op, ta, tb, h.prog)
        refs[op.name] = ref(a.astype(np.float64), b.astype(np.float64))
    res = h.run(**outs)
    for k, want in refs.items():
        if want.dtype == bool:
            assert res[k].dtype == np.bool_ and (res[k] == want).all(), k
        else:
            assert res[k].dtype == dtype
            np.testing.assert_allclose(res[k].astype(np.float64), want, err_msg=k, **_tol(dtype))


def test_every_int_op():
    h = OpHarness(tiles=8)
    rng = np.random.default_rng(3)
    outs, refs = {}, {}
    for i, (op, ref) in enumerate(INT_BINARY.items()):
        a = rng.integers(-1000, 1000, 40).astype(np.int32)
        b = rng.integers(1, 9, 40).astype(np.int32) * rng.choice([-1, 1], 40).astype(np.int32)
        if op in (B.SHIFT_LEFT, B.SHIFT_RIGHT, B.SHIFT_RIGHT_SIGN_EXTEND):
            b = np.abs(b)
        ta, tb = h.input(f"a{i}", a, mapping="random"), h.input(f"b{i}", b, mapping="blocks")
        outs[op.name] = popops.map(h.graph, op, ta, tb, h.prog)
        refs[op.name] = ref(a.astype(np.int64), b.astype(np.int64))
    for i, (op, ref) in enumerate(INT_UNARY.items()):
        a = np.r_[rng.integers(-70000, 70000, 37), [0, -1, 2 ** 31 - 1]].astype(np.int32)
        outs["u" + op.name] = popops.map(h.graph, op, h.input(f"u{i}", a, mapping="random"), h.prog)
        refs["u" + op.name] = ref(a.astype(np.int64))
    res = h.run(**outs)
    for k, want in refs.items():
        if want.dtype == bool:
            assert (res[k] == want).all(), k
        else:
            assert res[k].dtype == np.int32, k
            np.testing.assert_array_equal(res[k], _to32(want), err_msg=k)


@pytest.mark.parametrize("np_t", [np.uint32, np.int16, np.uint16])
def test_bitwise_and_shift_on_other_int_types(np_t):
    h = OpHarness(tiles=4)
    rng = np.random.default_rng(4)
    info = np.iinfo(np_t)
    a = rng.integers(info.min, info.max, 50, endpoint=True).astype(np_t)
    b = rng.integers(info.min, info.max, 50, endpoint=True).astype(np_t)
    ta, tb = h.input("a", a, mapping="random"), h.input("b", b)
    outs = {"and": popops.bitwiseAnd(h.graph, ta, tb, h.prog), "or": popops.bitwiseOr(h.graph, ta, tb, h.prog),
            "xor": popops.bitwiseXor(h.graph, ta, tb, h.prog), "not": popops.bitwiseNot(h.graph, ta, h.prog),
            "shl": popops.map(h.graph, pe._1 << 3, [ta], h.prog), "add": popops.add(h.graph, ta, tb, h.prog)}
    res = h.run(**outs)
    with np.errstate(over="ignore"):
        want = {"and": a & b, "or": a | b, "xor": a ^ b, "not": ~a, "shl": (a.astype(np.int64) << 3).astype(np_t),
                "add": (a.astype(np.int64) + b).astype(np_t)}
    for k, w in want.items():
        assert res[k].dtype == np_t, k
        np.testing.assert_array_equal(res[k], w, err_msg=k)


def test_bool_ops_and_ternaries():
    h = OpHarness(tiles=4)
    rng = np.random.default_rng(5)
    p, q = rng.random(30) > 0.5, rng.random(30) > 0.5
    x = rng.uniform(-3, 3, 30).astype(np.float32)
    y = rng.uniform(-3, 3, 30).astype(np.float32)
    i = rng.integers(-20, 20, 30).astype(np.int32)
    tp, tq, tx, ty, ti = (h.input(n, v, mapping="random") for n, v in
                          (("p", p), ("q", q), ("x", x), ("y", y), ("i", i)))
    xh = h.input("xh", x.astype(np.float16), mapping="blocks")
    yh = h.input("yh", y.astype(np.float16), mapping="random")
    outs = {
        "and": popops.logicalAnd(h.graph, tp, tq, h.prog), "or": popops.logicalOr(h.graph, tp, tq, h.prog),
        "not": popops.logicalNot(h.graph, tp, h.prog), "eq": popops.eq(h.graph, tp, tq, h.prog),
        "sel": popops.select(h.graph, tx, ty, tp, h.prog), "selh": popops.select(h.graph, xh, yh, tq, h.prog),
        "clamp": popops.map(h.graph, pe.Clamp(pe._1, -1.0, 1.5), [tx], h.prog),
        "clamph": popops.map(h.graph, T.CLAMP, xh, yh, xh, h.prog),
        "clampi": popops.map(h.graph, pe.Clamp(pe._1, -5, 7), [ti], h.prog),
        "band": popops.map(h.graph, (pe._1 > 0.0) & (pe._2 < 1.0), [tx, ty], h.prog),
    }
    res = h.run(**outs)
    np.testing.assert_array_equal(res["and"], p & q)
    np.testing.assert_array_equal(res["or"], p | q)
    np.testing.assert_array_equal(res["not"], ~p)
    np.testing.assert_array_equal(res["eq"], p == q)
    np.testing.assert_array_equal(res["sel"], np.where(p, x, y))
    np.testing.assert_array_equal(res["selh"], np.where(q, x.astype(np.float16), y.astype(np.float16)))
    np.testing.assert_array_equal(res["clamp"], np.clip(x, -1.0, 1.5))
    xh_, yh_ = x.astype(np.float16), y.astype(np.float16)
    np.testing.assert_array_equal(res["clamph"], np.maximum(yh_, np.minimum(xh_, xh_)))
    np.testing.assert_array_equal(res["clampi"], np.clip(i, -5, 7))
    np.testing.assert_array_equal(res["band"], (x > 0) & (y < 1))


@pytest.mark.parametrize("sa,sb,ma,mb", [((3, 1, 4), (2, 4), "random", "linear"), ((5,), (2, 3, 5), "tile0", "blocks"),
                                         ((4, 6), (), "blocks", "tile0"), ((2, 1), (1, 7), "linear", "random")])
def test_broadcasting_and_mappings(sa, sb, ma, mb):
    h = OpHarness(tiles=16)
    rng = np.random.default_rng(6)
    a = rng.uniform(-2, 2, sa).astype(np.float32)
    b = rng.uniform(-2, 2, sb).astype(np.float32)
    ta, tb = h.input("a", a, mapping=ma), h.input("b", b, mapping=mb)
    o1 = popops.map(h.graph, pe.Tanh(pe._1) * pe._2 + 1.5, [ta, tb], h.prog)
    o2 = popops.sub(h.graph, ta, tb, h.prog)
    o3 = popops.map(h.graph, pe._2 - pe._1 * 2, [ta, tb], h.prog, options={"enableGenerateCodelet": False})
    res = h.run(o1=o1, o2=o2, o3=o3)
    np.testing.assert_allclose(res["o1"], np.tanh(a) * b + 1.5, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res["o2"], a - b, rtol=1e-6)
    np.testing.assert_allclose(res["o3"], b - a * 2, rtol=1e-6)
    assert res["o1"].shape == np.broadcast_shapes(sa, sb)


def test_in_place_with_output_and_scalar_operands():
    h = OpHarness(tiles=8)
    x = np.linspace(-2, 2, 24).astype(np.float32).reshape(4, 6)
    y = np.linspace(1, 3, 6).astype(np.float32)
    tx, ty = h.input("x", x, mapping="random"), h.input("y", y)
    t2 = h.input("x2", x, mapping="blocks")
    out = h.graph.addVariable(poplar.FLOAT, [4, 6], "out")
    h.map(out, "random")
    popops.addInPlace(h.graph, tx, ty, h.prog)                     # x += y (broadcast)
    popops.expWithOutput(h.graph, t2, out, h.prog)
    popops.mapInPlace(h.graph, pe.Sqrt(pe.Abs(pe._1)) * pe._2, [t2, ty], h.prog)
    s1 = popops.mul(h.graph, ty, 3.0, h.prog)                      # scalar operand -> BroadcastScalar
    s2 = popops.sub(h.graph, 10, h.input("i", np.arange(5, dtype=np.int32)), h.prog)
    w = h.graph.addVariable(poplar.BOOL, [4, 6], "w")
    h.map(w, "linear")
    popops.mapWithOutput(h.graph, pe._1 >= pe._2, [tx, ty], w, h.prog)
    res = h.run(x=tx, out=out, x2=t2, s1=s1, s2=s2, w=w)
    np.testing.assert_allclose(res["x"], x + y, rtol=1e-6)
    np.testing.assert_allclose(res["out"], np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(res["x2"], np.sqrt(np.abs(x)) * y, rtol=1e-6)
    np.testing.assert_allclose(res["s1"], y * 3, rtol=1e-6)
    np.testing.assert_array_equal(res["s2"], 10 - np.arange(5))
    np.testing.assert_array_equal(res["w"], (x + y) >= y)


def test_casts_and_half_stays_half():
    h = OpHarness(tiles=4)
    x = np.ones(8, np.float16)
    tx = h.input("x", x)
    ti = h.input("i", np.arange(8, dtype=np.int32) - 3)
    # fp16 intermediates overflow: 300*300 = inf in half (an fp32 evaluation would give 90)
    o = popops.map(h.graph, (pe._1 * 300.0) * 300.0 / 1000.0, [tx], h.prog)
    c = popops.map(h.graph, pe.Cast(pe._1, poplar.FLOAT) * 0.5, [ti], h.prog)
    c2 = popops.map(h.graph, pe.Cast(pe._1 > 0, poplar.INT) + pe._1, [ti], h.prog)
    ch = popops.map(h.graph, pe.Cast(pe._1, poplar.HALF) + pe.ConstHalf(0.25), [ti], h.prog)
    res = h.run(o=o, c=c, c2=c2, ch=ch)
    assert res["o"].dtype == np.float16 and np.isinf(res["o"]).all()
    assert res["c"].dtype == np.float32
    np.testing.assert_array_equal(res["c"], (np.arange(8) - 3) * 0.5)
    np.testing.assert_array_equal(res["c2"], (np.arange(8) - 3 > 0) + np.arange(8) - 3)
    assert res["ch"].dtype == np.float16
    np.testing.assert_array_equal(res["ch"], (np.arange(8) - 3 + 0.25).astype(np.float16))


def test_expression_nodes_and_operators():
    e = pe._1 + 2 * pe._2
    assert isinstance(e, pe.Add) and isinstance(e.getRHS(), pe.Mul)
    assert e.getRHS().getLHS().deepEquals(pe.Const(2))
    assert e.deepEquals(pe.Add(pe._1, pe.Mul(pe.Const(2), pe._2)))
    assert not e.deepEquals(pe.Add(pe._1, pe.Mul(pe.Const(3), pe._2)))
    for expr_, cls in ((pe._1 < 1, pe.Lt), (pe._1 <= 1, pe.Lte), (pe._1 > 1, pe.Gt), (pe._1 >= 1, pe.Gte),
                       (pe._1 == pe._2, pe.Equal), (pe._1 != 1, pe.NotEqual), (pe._1 & 1, pe.BitwiseAnd),
                       (pe._1 | 1, pe.BitwiseOr), (pe._1 ^ 1, pe.BitwiseXor), (~pe._1, pe.BitwiseNot),
                       (-pe._1, pe.Neg), (pe._1 % 3, pe.Rem), (pe._1 / 3, pe.Divide), (1 - pe._1, pe.Sub),
                       (pe._1 << 1, pe.Shl), (pe._1 >> 1, pe.Shr)):
        assert isinstance(expr_, cls), cls
    with pytest.raises(TypeError):
        bool(pe._1 == pe._2)
    assert (pe.Exp(pe._3) + pe._1).placeholders() == {1, 3}
    # every enum member has a node class, and the named classes use the right op
    assert {c.OP for c in (pe.Exp, pe.Select, pe.Clamp, pe.VarianceToInvStdDev)} == {
        U.EXPONENT, T.SELECT, T.CLAMP, B.VARIANCE_TO_INV_STD_DEV}
    for op in list(U) + list(B) + list(T):
        assert op in pe.NODE_OF_OP
    assert len(U) >= 32 and len(B) == 26 and len(T) == 2


def _np_eval(e, env, dtype):
    """Reference evaluation of a float expression tree, rounding every node to ``dtype``."""
    if isinstance(e, pe.PlaceHolder):
        return env[e.index - 1]
    if isinstance(e, pe.Const):
        return dtype(e.value)
    k = [_np_eval(c, env, dtype) for c in e.children()]
    f = {B.ADD: np.add, B.SUBTRACT: np.subtract, B.MULTIPLY: np.multiply, B.MAXIMUM: np.fmax, B.MINIMUM: np.fmin,
         U.NEGATE: np.negative, U.ABSOLUTE: np.abs, U.TANH: np.tanh, U.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
         U.SQUARE: np.square, T.CLAMP: lambda a, lo, hi: np.fmax(lo, np.fmin(a, hi)),
         T.SELECT: lambda a, b, c: np.where(c, a, b), B.GREATER_THAN: np.greater}[e.op]
    with np.errstate(all="ignore"):
        out = np.asarray(f(*k))
    return out if out.dtype == bool else out.astype(dtype)


def _trees(depth):
    leaf = st.sampled_from([pe._1, pe._2, pe._3]) | st.floats(-2, 2, width=16).map(pe.Const)
    if depth == 0:
        return leaf
    sub = _trees(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(st.sampled_from([pe.Add, pe.Sub, pe.Mul, pe.Max, pe.Min]), sub, sub).map(lambda t: t[0](t[1], t[2])),
        st.tuples(st.sampled_from([pe.Neg, pe.Abs, pe.Tanh, pe.Sigmoid]), sub).map(lambda t: t[0](t[1])),
        st.tuples(sub, sub, sub).map(lambda t: pe.Select(t[0], t[1], pe.Gt(t[2], pe.Const(0.0)))),
        st.tuples(sub, sub).map(lambda t: pe.Clamp(t[0], pe.Const(-1.0), t[1] * t[1] + 1.0)),
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_trees(3), half=st.booleans(), fuse=st.booleans(), mapping=st.sampled_from(["linear", "random", "blocks"]))
def test_random_expression_trees(tree, half, fuse, mapping):
    tree = pe.Add(tree, pe._1)      # gives constant-only subtrees a type from context, as PopLibs infers
    dtype = np.float16 if half else np.float32
    rng = np.random.default_rng(7)
    xs = [rng.uniform(-2, 2, (3, 10)).astype(dtype) for _ in range(3)]
    h = OpHarness(tiles=8)
    ts = [h.input(f"x{i}", x, mapping=mapping) for i, x in enumerate(xs)]
    out = popops.map(h.graph, tree, ts, h.prog, options={"enableGenerateCodelet": fuse})
    got = h.run(out=out)["out"]
    want = _np_eval(tree, xs, dtype)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(np.float64), np.broadcast_to(want, got.shape).astype(np.float64),
                               **(dict(rtol=1e-2, atol=1e-2) if half else dict(rtol=1e-5, atol=1e-5)))


# -------------------------------------------------------------------------------------------------
# cost model
# -------------------------------------------------------------------------------------------------
def _cycles(build, tiles=16):
    h = OpHarness(tiles=tiles)
    outs = build(h)
    h.run(**outs)
    return h.cycles(), h


def test_operands_mapped_away_cost_exchange():
    x = np.arange(4096, dtype=np.float32)

    def build(mb):
        def f(h):
            a = h.input("a", x, mapping="linear")
            b = h.input("b", x, mapping=mb)
            return {"o": popops.add(h.graph, a, b, h.prog)}
        return f
    local, _ = _cycles(build("linear"))
    remote, _ = _cycles(build("random"))
    one_tile, _ = _cycles(build("tile0"))
    assert remote > local + 100
    assert one_tile > local + 100
    # the output follows the first operand's mapping: a's elements never move
    h = OpHarness(tiles=16)
    a, b = h.input("a", x, mapping="linear"), h.input("b", x, mapping="random")
    o = popops.add(h.graph, a, b, h.prog)
    assert (h.graph.tile_of_elements(o) == h.graph.tile_of_elements(a)).all()


def test_fused_map_cheaper_than_separate_maps():
    x = np.linspace(-1, 1, 6000).astype(np.float32)

    def fused(h):
        a, b, c = (h.input(n, x) for n in "abc")
        return {"o": popops.map(h.graph, (pe._1 + pe._2) * pe._3 - pe._1, [a, b, c], h.prog)}

    def separate(h):
        a, b, c = (h.input(n, x) for n in "abc")
        t1 = popops.add(h.graph, a, b, h.prog)
        t2 = popops.mul(h.graph, t1, c, h.prog)
        return {"o": popops.sub(h.graph, t2, a, h.prog)}

    def unfused(h):
        a, b, c = (h.input(n, x) for n in "abc")
        return {"o": popops.map(h.graph, (pe._1 + pe._2) * pe._3 - pe._1, [a, b, c], h.prog,
                                options={"enableGenerateCodelet": "false"})}
    cf, hf = _cycles(fused)
    cs, hs = _cycles(separate)
    cu, hu = _cycles(unfused)
    assert cf < cs and cf < cu
    assert abs(cu - cs) <= 0.05 * cs
    # one generated vertex group (one compute set), vs three compute sets
    assert len(hf.graph.getComputeSets()) == 1 and len(hs.graph.getComputeSets()) == 3
    g = hf.graph.getComputeSets()[0].groups[0]
    assert g.type_name.startswith("popops::map::MapGenerated") and g.multi
    assert g.tiles.size == np.unique(g.tiles).size           # one MultiVertex per tile


def test_single_op_estimates_follow_poplibs_tables():
    target = OpHarness(tiles=4).graph.getTarget()
    n = np.array([600])
    # BinaryOp1D ADD float: 6 x (29 + ceil(100/2) x (1+2)) + 11
    assert popops.binary_op_cycles(n, poplar.FLOAT, target=target, op=B.ADD)[0] == 6 * (29 + 50 * 3) + 11
    # UnaryOp1D EXPONENT half {4, false, 4}: 6 x (33 + ceil(100/4) x 4) + 9 + 11
    assert popops.unary_op_cycles(n, U.EXPONENT, poplar.HALF, target)[0] == 6 * (33 + 25 * 4) + 20
    # slow ops cost more than fast ones, and DIVIDE more than MULTIPLY
    assert popops.unary_op_cycles(n, U.TAN, poplar.FLOAT, target)[0] > popops.unary_op_cycles(
        n, U.TANH, poplar.FLOAT, target)[0]
    assert popops.binary_op_cycles(n, poplar.FLOAT, target=target, op=B.DIVIDE)[0] > popops.binary_op_cycles(
        n, poplar.FLOAT, target=target, op=B.MULTIPLY)[0]
    # BroadcastScalar1D MULTIPLY float: (20 + ceil(100/2) x (1+1)) x 6 + 11
    assert popops.broadcast_scalar_cycles(n, B.MULTIPLY, poplar.FLOAT, target)[0] == (20 + 50 * 2) * 6 + 11


def test_flops_and_vertex_types_recorded():
    h = OpHarness(tiles=4)
    a = h.input("a", np.ones(100, np.float32))
    popops.map(h.graph, pe.Exp(pe._1) + pe._1, [a], h.prog)
    popops.bitwiseNot(h.graph, h.input("i", np.ones(100, np.int32)), h.prog)
    groups = [g for cs in h.graph.getComputeSets() for g in cs.groups]
    assert groups[0].flops == 200 and groups[1].flops == 0
    assert groups[1].type_name == "popops::UnaryOp1D<popops::expr::UnaryOpType::BITWISE_NOT,int>"


# -------------------------------------------------------------------------------------------------
# errors
# -------------------------------------------------------------------------------------------------
def test_bad_input_raises_and_graph_still_works():
    h = OpHarness(tiles=4)
    a = h.input("a", np.arange(6, dtype=np.float32).reshape(2, 3))
    hb = h.input("hb", np.ones((2, 3), np.float16))
    i = h.input("i", np.ones((2, 3), np.int32))
    bad = h.input("bad", np.ones((4,), np.float32))
    n_cs, n_vars = len(h.graph.getComputeSets()), len(h.graph._state.variables)
    cases = [
        (poplar.graph_connection_error, lambda: popops.add(h.graph, a, hb, h.prog)),              # type mismatch
        (poplar.index_error, lambda: popops.add(h.graph, a, bad, h.prog)),                       # bad broadcast
        (poplar.index_error, lambda: popops.map(h.graph, pe._1 + pe._3, [a, a], h.prog)),         # placeholder count
        (poplar.unknown_vertex_type, lambda: popops.bitwiseAnd(h.graph, a, a, h.prog)),          # op on wrong type
        (poplar.unknown_vertex_type, lambda: popops.exp(h.graph, i, h.prog)),
        (poplar.graph_connection_error, lambda: popops.mapInPlace(h.graph, pe._1 > 0.0, [a], h.prog)),
        (poplar.graph_connection_error, lambda: popops.map(h.graph, pe.Select(pe._1, pe._1, pe._1), [a], h.prog)),
        (poplar.index_error, lambda: popops.addInPlace(h.graph, a.slice(0, 1, 1), a, h.prog)),
        (poplar.invalid_option, lambda: popops.add(h.graph, a, a, h.prog, options={"noSuchOption": "true"})),
        (poplar.graph_connection_error, lambda: popops.addInPlace(h.graph, a.broadcast(2, 0), a.broadcast(2, 0),
                                                                  h.prog)),
    ]
    for exc, fn in cases:
        with pytest.raises(exc) as info:
            fn()
        assert str(info.value)
    assert len(h.graph.getComputeSets()) == n_cs and len(h.graph._state.variables) == n_vars
    o = popops.map(h.graph, pe._1 * 2 + pe.Cast(pe._2, poplar.FLOAT), [a, i], h.prog)
    res = h.run(o=o)
    np.testing.assert_array_equal(res["o"], np.arange(6).reshape(2, 3) * 2 + 1)


def test_legacy_binary_op_and_tut2_style_add():
    h = OpHarness(tiles=4)
    v1 = h.input("v1", np.arange(16, dtype=np.float32).reshape(4, 4))
    v2 = h.input("v2", np.ones((4, 4), np.float32))
    o = popops.binary_op(h.graph, "MAXIMUM", v1, v2, h.prog)
    o2 = popops.add(h.graph, v1, v2.transpose(), h.prog, "Add")
    res = h.run(o=o, o2=o2)
    np.testing.assert_array_equal(res["o"], np.maximum(np.arange(16).reshape(4, 4), 1))
    np.testing.assert_array_equal(res["o2"], np.arange(16).reshape(4, 4) + 1)


def test_kernels_pickle_and_expressions_print():
    import pickle
    h = OpHarness(tiles=4)
    a = h.input("a", np.arange(10, dtype=np.float32))
    e = pe.Select(pe.Exp(pe._1), pe.Const(1.0) * 0 + 2.0, pe._1 > 3)
    popops.map(h.graph, e, [a], h.prog)
    popops.map(h.graph, pe.UnaryOp(U.POPCOUNT, pe._1), [h.input("i", np.arange(10, dtype=np.int32))], h.prog)
    for cs in h.graph.getComputeSets():
        for g in cs.groups:
            pickle.loads(pickle.dumps(g.kernel))
    assert repr(e) == "Select(Exp(_1), Add(Mul(Const(1.0), Const(0)), Const(2.0)), Gt(_1, Const(3)))"
