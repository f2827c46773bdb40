"""The IR executor's prepared steps (``openipu.popart.execute``): the convolution gradients
computed in pairs, the per-op closures' errors, and which ops run on one host thread. Each
training test compares against the device-storage emulation (``OPENIPU_EXECUTION=device``)."""

import numpy as np
import pytest
import torch

import popart
from openipu.popart import execute_plan
from openipu.popart.onnx_ops import _REGISTRY, OpKernel
from openipu.popart.onnx_ops.grad import conv_grads

GEOMETRIES = [      # (x shape, w shape, attributes)
    ([2, 4, 9, 9], [6, 4, 3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ([2, 4, 9, 8], [6, 2, 3, 3], {"group": 2, "dilations": [2, 1], "pads": [0, 1, 2, 1]}),   # asymmetric
    ([2, 4, 7, 7], [4, 4, 2, 2], {"auto_pad": "SAME_UPPER"}),
    ([1, 3, 11], [5, 3, 4], {"strides": [3], "pads": [2, 1]}),
    ([1, 2, 5, 5, 5], [3, 2, 3, 3, 3], {"pads": [1, 1, 1, 1, 1, 1]}),
]


@pytest.mark.parametrize("geometry", range(len(GEOMETRIES)))
def test_both_convolution_gradients_from_one_call_equal_the_separate_ones(geometry):
    """conv_grads computing dx and dw together gives the bits of the two separate calls (those
    of ConvDataGrad and ConvWeightsGrad), and the gradients of torch autograd within float32."""
    xs, ws, attrs = GEOMETRIES[geometry]
    g = torch.Generator().manual_seed(geometry)
    x, w = torch.randn(xs, generator=g), torch.randn(ws, generator=g)
    from openipu.popart.onnx_ops.conv import conv_nd
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = conv_nd(xr, wr, None, attrs)
    gy = torch.randn(y.shape, generator=g)
    dx, dw = conv_grads(gy, x, w, xs, ws, attrs)
    alone_dx = conv_grads(gy, None, w, xs, ws, attrs, (True, False))
    alone_dw = conv_grads(gy, x, None, xs, ws, attrs, (False, True))
    assert alone_dx[1] is None and alone_dw[0] is None
    assert torch.equal(dx, alone_dx[0]) and torch.equal(dw, alone_dw[1])
    want_dx, want_dw = torch.autograd.grad(y, [xr, wr], gy)
    torch.testing.assert_close(dx, want_dx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw, want_dw, rtol=1e-5, atol=1e-5)


def _conv_training(monkeypatch, mode, steps=3):
    """A PopART training session of two convolutions (the second strided, asymmetrically padded,
    grouped), batch norm free, SGD with momentum: the losses and the trained weights."""
    monkeypatch.setenv("OPENIPU_EXECUTION", mode)
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, 8, 8]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [2]), "lab")
    k1 = b.addInitializedInputTensor((0.3 * rng.standard_normal((4, 3, 3, 3))).astype(np.float32), "k1")
    k2 = b.addInitializedInputTensor((0.3 * rng.standard_normal((6, 2, 3, 3))).astype(np.float32), "k2")
    h = b.aiOnnx.relu([b.aiOnnx.conv([x, k1], pads=[1, 1, 1, 1])])
    h = b.aiOnnx.conv([h, k2], strides=[2, 2], pads=[0, 1, 1, 0], group=2)
    y = b.aiOnnx.softmax([b.aiOnnx.reshape([h, b.aiOnnx.constant(np.array([2, -1], np.int64))])], axis=1)
    loss = b.aiGraphcore.nllloss([y, lab])
    s, losses, weights = sgd_training(
        b, loss, lambda data: {x: data.standard_normal((2, 3, 8, 8)).astype(np.float32),
                               lab: data.integers(0, 24, (2,)).astype(np.int32)},
        {"k1": (4, 3, 3, 3), "k2": (6, 2, 3, 3)}, steps)
    return s, [float(v) for v in losses], weights


def sgd_training(b, loss, feeds, weight_shapes: dict, steps: int):
    """Train the model of builder ``b`` (``loss``) with SGD (lr 0.1, momentum 0.9) on an 8-tile
    IPU model for ``steps`` steps, each fed ``feeds(rng)`` (a numpy generator seeded 1): the
    session, each step's loss (a copy of its anchor) and the trained weights named in
    ``weight_shapes`` (name -> shape, float32)."""
    s = popart.TrainingSession(
        fnModel=b.getModelProto(), loss=loss,
        optimizer=popart.SGD({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.9, False)}),
        dataFlow=popart.DataFlow(1, {loss: popart.AnchorReturnType("ALL")}),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8}))
    s.prepareDevice()
    s.weightsFromHost()
    data = np.random.default_rng(1)
    losses = []
    for _ in range(steps):
        a = s.initAnchorArrays()
        s.run(popart.PyStepIO(feeds(data), a))
        losses.append(a[loss].copy())
    s.weightsToHost()
    weights = {k: np.zeros(shape, np.float32) for k, shape in weight_shapes.items()}
    s.readWeights(popart.PyWeightsIO(weights))
    return s, losses, weights


def test_convolution_gradients_in_pairs_train_as_the_device_emulation(monkeypatch):
    """The second convolution's data and weights gradients run as one pair (the first's data
    gradient is not needed); the losses and trained weights agree with the emulation's."""
    _, l_dev, w_dev = _conv_training(monkeypatch, "device")
    s, l_ir, w_ir = _conv_training(monkeypatch, "ir")
    assert s._fast
    ir = s._ir
    pairs = execute_plan.conv_grad_pairs(ir)
    assert len(pairs) == 1
    (i, j), = pairs.items()
    assert {ir.ops[i].op_type, ir.ops[j].op_type} == {"ConvDataGrad", "ConvWeightsGrad"}
    assert ir.ops[i].inputs[0] == ir.ops[j].inputs[0]
    np.testing.assert_allclose(l_ir, l_dev, rtol=1e-5)
    for k in w_dev:
        np.testing.assert_allclose(w_ir[k], w_dev[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_kernel_failure_names_the_op(monkeypatch):
    """A host kernel failing inside a prepared step is PopART's error naming the op and its
    inputs' shapes, and the session stays as it was (the failure is raised, not swallowed)."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "ir")
    relu = _REGISTRY[("", "Relu")]
    failing = []

    def fn(inputs, attrs, opset):
        if failing:
            raise RuntimeError("the kernel broke")
        return relu.fn(inputs, attrs, opset)
    monkeypatch.setitem(_REGISTRY, ("", "Relu"), OpKernel("", "Relu", fn, relu.flops))
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3, 8]), "x")
    y = b.aiOnnx.relu([x], "my_relu")
    s = popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {y: popart.AnchorReturnType("ALL")}),
                                deviceInfo=popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 4}))
    s.prepareDevice()
    a = s.initAnchorArrays()
    xs = np.arange(24, dtype=np.float32).reshape(3, 8) - 12
    s.run(popart.PyStepIO({x: xs}, a))
    assert s._fast
    np.testing.assert_array_equal(a[y], np.maximum(xs, 0))
    failing.append(True)
    with pytest.raises(popart.popart_exception, match=r"Op ai.onnx.Relu 'my_relu.*' failed in its host kernel on "
                                                      r"inputs of shape\(s\) \[3, 8\]: the kernel broke"):
        s.run(popart.PyStepIO({x: xs}, a))


def test_host_threads_by_work(monkeypatch):
    """Convolutions and matmuls from HOST_PARALLEL_WORK multiply-accumulates use torch's threads,
    smaller ones and small elementwise ops one thread; the threshold moves the choice."""
    class T:
        def __init__(self, shape):
            self.info = type("I", (), {"shape": lambda _s, shape=shape: shape})()

    class Op:
        def __init__(self, domain, op_type, ins, outs, attrs=None):
            self.domain, self.op_type, self.inputs, self.outputs, self.attrs = domain, op_type, ins, outs, attrs or {}

    ir = type("Ir", (), {})()
    ir.tensors = {"x": T([4, 64, 16, 16]), "w": T([64, 64, 3, 3]), "y": T([4, 64, 16, 16]),
                  "a": T([512, 1024]), "b": T([1024, 1024]), "c": T([512, 1024]), "s": T([8, 64]), "t": T([64, 64])}
    conv = Op("", "Conv", ["x", "w"], ["y"])                                    # 37.7 M
    grad = Op("ai.graphcore", "ConvWeightsGrad", ["y", "x"], ["w"])
    assert not execute_plan.runs_serially(ir, Op("", "MatMul", ["a", "b"], ["c"]))        # 512 M
    assert execute_plan.runs_serially(ir, Op("", "MatMul", ["s", "t"], ["s"]))            # 32 K
    assert execute_plan.runs_serially(ir, Op("", "Relu", ["x"], ["y"]))                   # 131 K elements
    assert execute_plan.runs_serially(ir, conv) and execute_plan.runs_serially(ir, grad)           # below 2^26
    monkeypatch.setattr(execute_plan, "HOST_PARALLEL_WORK", 1 << 24)
    assert not execute_plan.runs_serially(ir, conv) and not execute_plan.runs_serially(ir, grad)


@pytest.mark.parametrize("threads", [1, 2])
def test_update_products_round_as_the_separate_ops(threads):
    """The SGD update kernels' in-place ``w - slr * v``, ``v + swd * w`` and dampened
    accumulation give the bits of the product rounded to float32 and then the sum (the two
    roundings of the device's ops; a fused multiply-add rounds once and differs): on values with
    infinities, NaNs, signed zeros and a strided operand, on one or two host threads."""
    from openipu.popart.onnx_ops.varupdate import add_product_
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(threads)
        for n in (5, 1_000_003):
            w, v = torch.randn(n, generator=g), torch.randn(n, generator=g) * 37.1
            v[::97], v[::101], w[::89], v[::83] = float("inf"), float("nan"), -0.0, -0.0
            for scale in (0.0013, -0.9, 0.0, 1e-30, torch.tensor(0.37)):
                for sign in (1.0, -1.0):
                    want = w + v * scale if sign > 0 else w - v * scale
                    got = add_product_(w.clone(), v, scale, sign)
                    assert torch.equal(torch.signbit(got), torch.signbit(want))
                    assert torch.equal(got.nan_to_num(), want.nan_to_num())
        w, v = torch.randn(300, 200, generator=g), torch.randn(200, 300, generator=g).t()
        assert torch.equal(add_product_(w.clone(), v, 0.3, -1.0), w - v * 0.3)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},          # ResNet's stem: torch pads
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 0], "dilations": [2, 1]},
    {"kernel_shape": [3, 3], "pads": [0, 1, 1, 0]},                              # asymmetric: padded copy
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
])
def test_max_pool_and_its_gradient_without_the_padded_copy_agree_bit_for_bit(attrs):
    """MaxPool's values and MaxPoolGrad's gradient where torch pads the windows itself equal the
    kernels over an input padded with -inf (its values; the vjp of the padded pooling), ties of
    equal values and a window of -inf included (that input takes the vjp path)."""
    from openipu.popart.onnx_ops import get_kernel
    from openipu.popart.onnx_ops.grad import _vjp
    from openipu.popart.shapes import call_kernel
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 8, generator=g)
    x[0, 0, :2, :2] = 1.5                      # ties
    pool, grad = get_kernel("", "MaxPool"), get_kernel("ai.graphcore", "MaxPoolGrad")
    a = {**attrs, "__num_outputs__": 1}
    y = call_kernel(pool, [x], a, 11)[0]
    y_idx = call_kernel(pool, [x], {**attrs, "__num_outputs__": 2}, 11)[0]      # the padded path
    assert torch.equal(y, y_idx)
    gy = torch.randn(y.shape, generator=g)
    for xin in (x, torch.where(torch.arange(8) < 3, torch.tensor(-float("inf")), x)):
        got = call_kernel(grad, [xin, call_kernel(pool, [xin], a, 11)[0], gy], a, 1)[0]
        assert torch.equal(got, _vjp("MaxPool", [xin], a, 11, 0, gy))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_relu_grad_gives_the_bits_of_the_select(dtype):
    """ReluGrad (``threshold_backward`` where it can) gives the bits of ``where(y > 0, gy, 0)``,
    popnn's select: with NaN, infinite and signed-zero gradients, signed-zero outputs, and a NaN
    output (0 there, where ``threshold_backward`` alone would pass the gradient)."""
    from openipu.popart.onnx_ops.grad import relu_grad
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[torch.empty((), dtype=dtype).element_size()]
    g = torch.Generator().manual_seed(3)
    for shape in ([4, 64, 8, 8], [7], [0, 3]):
        y = torch.relu(torch.randn(shape, generator=g)).to(dtype)
        gy = torch.randn(shape, generator=g).to(dtype)
        if y.numel():
            y.view(-1)[::7], gy.view(-1)[::5] = -0.0, -0.0
            gy.view(-1)[::11], gy.view(-1)[::13] = float("nan"), float("-inf")
        for nan_output in (False, True):
            if nan_output and y.numel():
                y.view(-1)[3] = float("nan")
            got = relu_grad([y, gy], {}, 1)[0]
            want = torch.where(y > 0, gy, torch.zeros((), dtype=dtype))
            assert got.dtype == dtype and torch.equal(got.view(bits), want.view(bits)), (shape, nan_output)
