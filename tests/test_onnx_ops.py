"""ONNX backend test cases run on the host kernels of ``openipu.popart.onnx_ops``.

Every single-node test of ``onnx.backend.test`` (generated in-process from the cases ``onnx``
ships) runs straight through its kernel; multi-node node tests (mostly function expansions) and
the ``simple`` / ``pytorch-converted`` / ``pytorch-operator`` model tests run on the host
executor ``run_model_on_host``. A test listed in ``tests/onnx_backend_expected_failures.txt``
must fail (xfail); a listed test that passes fails with "unexpectedly passed". Pass counts:
``python scripts/onnx_node_tests.py``.
"""

from __future__ import annotations

import os
import warnings

import pytest

onnx = pytest.importorskip("onnx")

from onnx.backend.test.loader import load_model_tests  # noqa: E402

from openipu.popart.onnx_ops import OnnxKernelError, get_kernel, supported_ops  # noqa: E402
from openipu.popart.onnx_ops._reference import (  # noqa: E402
    assert_outputs_close, check_backend_case, run_model_on_host, to_numpy, to_torch)

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED_FILE = os.path.join(HERE, "onnx_backend_expected_failures.txt")


#: Reasons starting with these mark tests that fail or pass by chance: expected values from another
#: random generator, or fp16 results 1 ulp either side of the tolerance. A pass is not an error.
RANDOM = ("random values", "fp16 rounding")

def _expected_failures() -> dict[str, str]:
    out = {}
    with open(EXPECTED_FILE) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition("#")
            out[name.strip()] = reason.strip()
    return out


def _cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [(c, "node" if len(c.model.graph.node) == 1 else "node-multi")
                 for c in load_model_tests(kind="node")]
        for kind in ("simple", "pytorch-converted", "pytorch-operator"):
            cases += [(c, kind) for c in load_model_tests(kind=kind) if c.model_dir]
    return cases


CASES = _cases()
EXPECTED = _expected_failures()
# The bulk of the multi-node and model tests is marked slow; single-node tests are the fast set.
PARAMS = [pytest.param(c, id=c.name,
                       marks=[pytest.mark.slow] if kind in ("node-multi", "pytorch-converted") else [])
          for c, kind in CASES]


@pytest.mark.parametrize("case", PARAMS)
def test_backend_case(case):
    reason = EXPECTED.get(case.name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check_backend_case(case)
    except Exception as e:  # noqa: BLE001 - any failure of a listed test is the expected one
        if reason is not None:
            pytest.xfail(reason)
        raise
    if reason is not None and not reason.startswith(RANDOM):
        pytest.fail(f"{case.name} unexpectedly passed, remove it from "
                    f"onnx_backend_expected_failures.txt (listed: {reason})")


def test_expected_failures_are_known_tests():
    names = {c.name for c, _ in CASES}
    stale = sorted(set(EXPECTED) - names)
    assert not stale, f"listed tests that do not exist: {stale}"
    assert all(EXPECTED.values()), "every expected failure needs a reason"


def test_registry_covers_popart_opset_11_ops():
    # The ai.onnx ops PopART's importer registered (research notes, popart.md §3.2).
    popart_ops = """Abs Add And ArgMax ArgMin Asin Atan AveragePool BatchNormalization Cast Ceil
    Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum Div Dropout Elu Equal
    Erf Exp Expand Flatten Floor GRU Gather GlobalAveragePool GlobalMaxPool Greater HardSigmoid
    Identity If InstanceNormalization IsInf IsNaN LRN LSTM LeakyRelu Less Log LogSoftmax Loop
    MatMul MaxPool Max Mean Min Mul Neg Not OneHot Or PRelu Pad Pow RNN RandomNormal
    RandomNormalLike RandomUniform RandomUniformLike Reciprocal ReduceL1 ReduceL2 ReduceLogSum
    ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu
    Reshape Resize RoiAlign Round Scan Scatter ScatterElements Selu Shape Shrink Sigmoid Sign Sin
    Sinh Slice Softmax Softplus Softsign Split Sqrt Squeeze Sub Sum Tanh ThresholdedRelu Tile
    TopK Transpose Unsqueeze Upsample Where Gemm Tan Asinh Acosh Atanh Acos Mod DepthToSpace
    SpaceToDepth""".split()
    missing = [op for op in popart_ops if get_kernel("", op) is None]
    assert not missing, f"no kernel for {missing}"
    assert ("", "MatMul") in supported_ops()


def test_kernel_contract_errors_and_flops():
    import torch
    k = get_kernel("", "Cast")
    with pytest.raises(OnnxKernelError):
        k.fn([torch.zeros(2)], {"to": 8}, 21)  # strings have no torch dtype
    with pytest.raises(OnnxKernelError):
        get_kernel("", "Pad").fn([torch.zeros(2, 2), torch.tensor([1, 1])], {}, 18)
    conv = get_kernel("", "Conv")
    assert conv.flops([[1, 3, 8, 8], [4, 3, 3, 3]], [[1, 4, 6, 6]], {}) == 2 * 144 * 27
    gemm = get_kernel("", "Gemm")
    assert gemm.flops([[4, 5], [5, 6]], [[4, 6]], {}) == 2 * 24 * 5 + 2 * 24
    assert get_kernel("", "LSTM").flops([[7, 2, 3], [1, 16, 3], [1, 16, 4]], [[7, 1, 2, 4]], {}) \
        == 2 * 14 * 16 * 7


def test_fp16_and_bf16_roundtrip_and_compute():
    import numpy as np
    import ml_dtypes
    import torch
    a = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    t = to_torch(a)
    assert t.dtype == torch.bfloat16 and to_numpy(t).dtype == a.dtype
    x = np.linspace(-3, 3, 12, dtype=np.float16).reshape(3, 4)
    out = get_kernel("", "Softmax").fn([to_torch(x)], {"axis": 1}, 13)[0]
    assert out.dtype == torch.float16
    ref = np.exp(x.astype(np.float64)) / np.exp(x.astype(np.float64)).sum(1, keepdims=True)
    np.testing.assert_allclose(out.float().numpy(), ref, rtol=2e-3, atol=1e-3)


def test_run_model_on_host_small_graph():
    import numpy as np
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 3], np.eye(3).reshape(-1).tolist())
    g = helper.make_graph([
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["r"]),
        helper.make_node("ReduceSum", ["r"], ["y"], keepdims=0, axes=[0]),
    ], "g", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    xv = np.array([[1, -2, 3], [-4, 5, 6]], np.float32)
    (out,) = run_model_on_host(m, {"x": xv})
    assert_outputs_close([np.maximum(xv, 0).sum(0)], [out])
    with pytest.raises(AssertionError):
        assert_outputs_close([np.maximum(xv, 0).sum(0) + 1], [out])
