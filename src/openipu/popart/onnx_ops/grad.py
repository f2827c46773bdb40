"""Host kernels of the ``ai.graphcore`` gradient ops that autodiff adds (:mod:`openipu.popart.grads`).

Element types follow the forward op's. The convolution and pooling gradients are the
vector-Jacobian products of the forward kernels (``torch.autograd`` through this package's Conv /
MaxPool / AveragePool kernels), so their padding, stride, dilation and ceil rules are exactly the
forward ones. So are the *generic* gradient ops (:data:`VJP_OPS`: ``ErfGrad``, ``PadGrad``,
``ResizeGrad`` ..., inputs ``forward inputs + [gy]``, attributes the forward op's plus ``wrt``,
``fwd_out``, ``fwd_opset``) and the normalisation gradients (:data:`NORM_GRADS`), which give the
forward kernel's exact gradient whatever its attributes; the PopLibs lowerings of the common
cases are in :mod:`openipu.popart.lowering.grad`. ``reduction`` attributes use PopART's C++
``ReductionType`` order (Sum 0, Mean 1, NoReduction 2).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from openipu.popart.onnx_ops import get_kernel, onnx_op
from openipu.popart.onnx_ops._common import nll_rows, numel

GC = "ai.graphcore"


def _per_output(k, i, o, a):
    return float(k * numel(o[0]))


def _elementwise_flops(k):
    """``k`` operations per output element (a picklable cost hint)."""
    return functools.partial(_per_output, k)


def _conv_data_flops(i, o, a):
    return 2.0 * numel(i[0]) * numel(i[1][1:])


def _conv_weights_flops(i, o, a):
    return 2.0 * numel(i[0]) * numel(o[0][1:])


def _first_input_flops(i, o, a):
    return 2.0 * numel(i[0])


def _gather_grad_flops(i, o, a):
    return float(numel(i[0]))


def _vjp(op_type: str, inputs: list, attrs: dict, opset: int, wrt: int, gy: torch.Tensor) -> torch.Tensor:
    """Gradient of forward ``op_type``'s first output w.r.t. its input ``wrt``."""
    a = {k: v for k, v in attrs.items() if k not in ("input_shape", "weights_shape")}
    a["__num_outputs__"] = 1
    return vjp_many(get_kernel("", op_type).fn, inputs, a, opset, [wrt], gy)[0].to(gy.dtype)


def vjp_many(fwd, inputs: list, attrs: dict, opset: int, wrt: list, gy: torch.Tensor, out: int = 0) -> list:
    """Vector-Jacobian product of a forward host kernel ``fwd(inputs, attrs, opset)``: the
    gradients (float32, zeros where the output does not depend on it) of its output ``out``
    w.r.t. the inputs ``wrt``, given that output's gradient ``gy``. Float inputs are run in
    float32; integer inputs (indices, shapes) are passed as they are."""
    with torch.enable_grad():
        ins = [None if t is None else (t.detach().float() if t.is_floating_point() else t) for t in inputs]
        for i in wrt:
            ins[i] = ins[i].clone().requires_grad_(True)
        y = fwd(ins, attrs, opset)[out]
        gs = torch.autograd.grad(y, [ins[i] for i in wrt], gy.float().reshape(y.shape), allow_unused=True)
    return [torch.zeros(ins[i].shape, device=gy.device) if g is None else g for i, g in zip(wrt, gs)]


# -- generic gradient ops: the vector-Jacobian product of the forward op's host kernel ----------
#: attributes of a generic gradient op that are not the forward op's
GRAD_ATTRS = ("wrt", "fwd_out", "fwd_opset", "fwd_outputs", "bias_shape", "input_shape", "weights_shape")
#: grad op type -> forward (domain, op type). The grad op's inputs are the forward op's inputs,
#: then the gradient of its output ``fwd_out``; its output is the gradient of input ``wrt``.
#: PopART's names where PopART has the grad op (ErfGrad, EluGrad, SeluGrad, HardSigmoidGrad,
#: SoftSignGrad, SoftPlusGrad, ThresholdedReluGrad, ShrinkGrad, AsinGrad, AtanGrad, SinhGrad,
#: ClipGrad, PadGrad, ResizeGrad, LRNGrad, ReduceProdGrad, TopKGrad, ScatterDataGrad,
#: ScatterUpdateGrad), ``<Op>Grad`` otherwise.
VJP_OPS = {
    **{f"{t}Grad": ("", t) for t in (
        "Erf", "Elu", "Selu", "HardSigmoid", "ThresholdedRelu", "Shrink", "Celu", "Mish", "HardSwish", "Swish",
        "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
        "Clip", "PRelu", "Mod", "Pad", "Tile", "Resize", "Upsample", "LRN", "RMSNormalization",
        "LpNormalization", "MeanVarianceNormalization", "ReduceProd", "ReduceSum", "ReduceMean", "ReduceMax",
        "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum", "TopK",
        "GatherElements", "GatherND", "ScatterND",
        "SpaceToDepth", "ConvTranspose", "LpPool", "GlobalLpPool", "Einsum", "CumProd",
        "ReverseSequence", "Compress", "Trilu", "RoiAlign", "MaxUnpool", "Det", "Col2Im",
        "CenterCropPad", "AffineGrid", "RNN", "GRU", "LSTM")},
    "SoftSignGrad": ("", "Softsign"), "SoftPlusGrad": ("", "Softplus"),
    # the ai.graphcore Slice / DepthToSpace have their own SliceGrad / DepthToSpaceGrad
    "SliceStepsGrad": ("", "Slice"), "DepthToSpaceCrdGrad": ("", "DepthToSpace"),
    "ScatterDataGrad": ("", "ScatterElements"), "ScatterUpdateGrad": ("", "ScatterElements"),
    "ScatterElementsGrad": ("", "ScatterElements"),
    "Atan2Grad": (GC, "Atan2"), "FmodGrad": (GC, "Fmod"), "SubsampleGrad": (GC, "Subsample"),
    "PopartLSTMGrad": (GC, "LSTM"),
}


def _fwd_kernel(fwd):
    from openipu.popart.graphcore_ops import find_kernel
    return find_kernel(*fwd)


def _vjp_kernel(fwd, inputs, attrs, opset):
    """A generic gradient op (:data:`VJP_OPS`): inputs ``forward inputs + [gy]``."""
    a = {k: v for k, v in attrs.items() if k not in GRAD_ATTRS}
    a["__num_outputs__"] = int(attrs.get("fwd_outputs", 1))
    wrt = int(attrs["wrt"])
    g = vjp_many(_fwd_kernel(fwd).fn, inputs[:-1], a, int(attrs.get("fwd_opset", opset)), [wrt], inputs[-1],
                 int(attrs.get("fwd_out", 0)))[0]
    return [g.to(inputs[wrt].dtype)]


def _vjp_flops(fwd, i, o, a):
    """Twice the forward op's flops (its cost hint, else one per output element)."""
    k = _fwd_kernel(fwd)
    f = k.flops(i[:-1], [i[-1]], a) if k is not None and k.flops else numel(i[-1])
    return 2.0 * float(f)


for _name, _fwd in VJP_OPS.items():
    onnx_op(_name, domain=GC, flops=functools.partial(_vjp_flops, _fwd))(functools.partial(_vjp_kernel, _fwd))


# -- normalisations: one grad op for the input, scale and bias gradients ----------------------
#: grad op type -> forward op type. Inputs ``(x, scale, mean, invStdDev | var, gy)`` (PopART's
#: ``GroupNormGradOp`` / ``BatchNormGradOp`` order; the statistics may be omitted, ""),
#: outputs ``(dx, dscale, dbias)``; attribute ``bias_shape`` (the forward bias' shape).
NORM_GRADS = {"LayerNormalizationGrad": "LayerNormalization", "BatchNormalizationGrad": "BatchNormalization",
              "InstanceNormalizationGrad": "InstanceNormalization",
              "GroupNormalizationGrad": "GroupNormalization"}


def _norm_grad_flops(i, o, a):
    return 12.0 * numel(i[0])


def _norm_grad(fwd_type, inputs, attrs, opset):
    """The gradients of a normalisation (statistics recomputed from ``x``: its own
    batch / group / layer statistics, as in training mode), as the forward kernel's vjp."""
    x, scale, gy = inputs[0], inputs[1], inputs[-1]
    a = {k: v for k, v in attrs.items() if k not in GRAD_ATTRS}
    fwd_opset = int(attrs.get("fwd_opset", opset))
    bias = torch.zeros(list(attrs.get("bias_shape") or scale.shape), device=x.device)
    ins = [x, scale, bias]
    if fwd_type == "BatchNormalization" and x.dim() >= 2:
        return _batch_norm_grad(x, scale, gy, float(a.get("epsilon", 1e-5)))
    if fwd_type == "BatchNormalization":        # batch statistics: the training-mode kernel
        c = x.shape[1]
        ins += [torch.zeros(c, device=x.device), torch.ones(c, device=x.device)]
        a.update(training_mode=1, __num_outputs__=3)
        fwd_opset = 15
    else:
        a["__num_outputs__"] = 1
    dx, ds, db = vjp_many(get_kernel("", fwd_type).fn, ins, a, fwd_opset, [0, 1, 2], gy)
    return [dx.to(x.dtype), ds.to(scale.dtype), db.to(scale.dtype)]      # bias: scale's type (ONNX)


def _batch_norm_grad(x, scale, gy, eps: float) -> list:
    """BatchNormalization's gradients with the batch statistics (biased variance, as the
    training-mode forward kernel): ``aten.native_batch_norm_backward`` in float32 on the
    recomputed mean and ``1 / sqrt(var + eps)`` (the forward kernel's vjp in closed form)."""
    xf = x.float()
    if x.numel() > x.shape[1]:      # the statistics in one pass (as the fused forward kernel's)
        mean, var = torch.batch_norm_update_stats(xf, None, None, 0.0)
    else:
        dims = [0] + list(range(2, x.dim()))
        mean, var = xf.mean(dims), xf.var(dims, unbiased=False)
    invstd = torch.rsqrt(var + eps)
    dx, ds, db = torch.ops.aten.native_batch_norm_backward(
        gy.float().reshape(x.shape), xf, scale.float(), None, None, mean, invstd, True, eps, [True, True, True])
    return [dx.to(x.dtype), ds.to(scale.dtype), db.to(scale.dtype)]


for _name, _fwd in NORM_GRADS.items():
    onnx_op(_name, domain=GC, flops=_norm_grad_flops)(functools.partial(_norm_grad, _fwd))


#: dtypes whose ``threshold_backward`` passes ``gy``'s bits through as ``where`` does (bfloat16's
#: changes NaN payloads: checked on NaN, infinities and signed zeros, tests/test_ir_executor_steps.py)
_THRESHOLD_SAME = (torch.float32, torch.float16, torch.float64)


@onnx_op("ReluGrad", domain=GC, flops=_elementwise_flops(2))
def relu_grad(inputs, attrs, opset):
    """``gy`` where the Relu's output ``y`` is above 0, else 0 (a NaN ``y`` gives 0, as popnn's
    select). ``aten.threshold_backward`` (PyTorch's own ReLU gradient, 10-18x faster than
    ``where`` on ResNet-18's activations, one thread) where ``y`` has no NaN (it passes ``gy``
    through for a NaN ``y``) and for float32 / float16 / float64; ``where`` else, and for
    different shapes or dtypes."""
    y, gy = inputs
    if y.shape == gy.shape and y.dtype == gy.dtype and gy.dtype in _THRESHOLD_SAME and y.numel() and \
            not bool(torch.isnan(y.max())):
        return [torch.ops.aten.threshold_backward(gy, y, 0)]
    return [torch.where(y > 0, gy, torch.zeros((), dtype=gy.dtype, device=gy.device))]


@onnx_op("SigmoidGrad", domain=GC, flops=_elementwise_flops(3))
def sigmoid_grad(inputs, attrs, opset):
    y, gy = inputs
    return [(gy * y * (1 - y)).to(gy.dtype)]


@onnx_op("TanhGrad", domain=GC, flops=_elementwise_flops(3))
def tanh_grad(inputs, attrs, opset):
    y, gy = inputs
    return [(gy * (1 - y * y)).to(gy.dtype)]


def _act_grad(fn, x, gy):
    with torch.enable_grad():
        xf = x.detach().float().requires_grad_(True)
        (gx,) = torch.autograd.grad(fn(xf), xf, gy.float())
    return gx.to(gy.dtype)


@onnx_op("GeluGrad", domain=GC, flops=_elementwise_flops(12))
def gelu_grad(inputs, attrs, opset):
    return [_act_grad(lambda t: torch.nn.functional.gelu(t, approximate="tanh"), *inputs)]


@onnx_op("GeluErfGrad", domain=GC, flops=_elementwise_flops(10))
def gelu_erf_grad(inputs, attrs, opset):
    return [_act_grad(torch.nn.functional.gelu, *inputs)]


@onnx_op("LeakyReluGrad", domain=GC, flops=_elementwise_flops(2))
def leaky_relu_grad(inputs, attrs, opset):
    x, gy = inputs
    return [torch.where(x > 0, gy, gy * float(attrs.get("alpha", 0.01))).to(gy.dtype)]


def _rows(t, attrs):
    """``t`` with the softmax axis last (and its inverse), or as a matrix (opset < 13)."""
    axis = int(attrs.get("axis", -1)) % t.dim()
    if attrs.get("flatten", 0):
        return t.reshape(math.prod(t.shape[:axis]), -1), lambda r: r.reshape(t.shape)
    return t.movedim(axis, -1), lambda r: r.movedim(-1, axis)


@onnx_op("SoftmaxGrad", domain=GC, flops=_elementwise_flops(4))
def softmax_grad(inputs, attrs, opset):
    y, gy = inputs
    y2, back = _rows(y.float(), attrs)
    g2, _ = _rows(gy.float(), attrs)
    return [back(y2 * (g2 - (g2 * y2).sum(-1, keepdim=True))).to(gy.dtype)]


@onnx_op("LogSoftmaxGrad", domain=GC, flops=_elementwise_flops(4))
def log_softmax_grad(inputs, attrs, opset):
    y, gy = inputs
    y2, back = _rows(y.float(), attrs)
    g2, _ = _rows(gy.float(), attrs)
    return [back(g2 - torch.exp(y2) * g2.sum(-1, keepdim=True)).to(gy.dtype)]


def _nll_scale(keep, attrs, gy):
    """Per-row gradient scale: the loss gradient, over the non-ignored rows for Mean."""
    red = int(attrs.get("reduction", 1))
    g = gy.float().reshape(-1) if red == 2 else gy.float().reshape(())
    if red == 1:
        g = g / max(int(keep.sum()), 1)
    return g


@onnx_op("NllGrad", domain=GC, flops=_elementwise_flops(2))
def nll_grad(inputs, attrs, opset):
    """d(loss)/d(probs): ``-scale / p`` at the label (``-scale`` for log-probabilities)."""
    p, label, gy = inputs
    p2, lab, keep = nll_rows(p, label, attrs.get("ignoreIndex"))
    g = _nll_scale(keep, attrs, gy)
    rows = torch.arange(p2.shape[0], device=p2.device)
    val = -g if attrs.get("inputIsLogProbability", 0) else -g / p2[rows, lab]
    out = torch.zeros_like(p2)
    out[rows, lab] = torch.where(keep, val, torch.zeros((), device=p2.device))
    return [out.reshape(p.shape).to(p.dtype)]


@onnx_op("NlllWithSoftmaxGradDirect", domain=GC, flops=_elementwise_flops(8))
def nll_softmax_grad(inputs, attrs, opset):
    """d(nll(softmax(x)))/dx = ``(softmax(x) - onehot(label)) * scale`` per row."""
    x, label, gy = inputs
    x2, lab, keep = nll_rows(x, label, attrs.get("ignoreIndex"))
    g = _nll_scale(keep, attrs, gy)
    sm = torch.softmax(x2, -1)
    sm[torch.arange(x2.shape[0], device=x2.device), lab] -= 1.0
    out = sm * (keep.float() * (g if g.dim() else g.expand(x2.shape[0]))).unsqueeze(-1)
    return [out.reshape(x.shape).to(x.dtype)]


@onnx_op("L1Grad", domain=GC, flops=_elementwise_flops(3))
def l1_grad(inputs, attrs, opset):
    x, gy = inputs
    red = int(attrs.get("reduction", 1))
    g = gy.float() if red == 2 else gy.float().reshape(())
    if red == 1:
        g = g / max(x.numel(), 1)
    return [(torch.sign(x.float()) * float(attrs.get("lambda", 1.0)) * g).to(x.dtype)]


@onnx_op("IdentityLossGrad", domain=GC, flops=_elementwise_flops(1))
def identity_loss_grad(inputs, attrs, opset):
    x, gy = inputs
    red = int(attrs.get("reduction", 1))
    if red == 2:
        return [gy.to(x.dtype).reshape(x.shape).clone()]
    g = gy.float().reshape(()) / (max(x.numel(), 1) if red == 1 else 1)
    return [g.expand(x.shape).to(x.dtype).clone()]


def _conv_backward(gy, x, w, x_shape, w_shape, attrs, wrt: int) -> torch.Tensor:
    """The gradient of ONNX Conv (no bias) w.r.t. its input (``wrt`` 0) or weights (1), float32
    (:func:`conv_grads`)."""
    return conv_grads(gy, x, w, x_shape, w_shape, attrs, (wrt == 0, wrt == 1))[wrt]


def conv_grads(gy, x, w, x_shape, w_shape, attrs, want=(True, True)) -> list:
    """``[dx, dw]``: the gradients of ONNX Conv (no bias, attributes ``attrs``) w.r.t. its input
    ``x`` (shape ``x_shape``) and weights ``w`` (shape ``w_shape``) given the output's gradient
    ``gy``, float32, contiguous, each computed when ``want`` says so (else ``None``), from one
    ``torch.ops.aten.convolution_backward`` call (no forward recomputation). An operand not needed
    (``x`` for ``dx`` alone, ``w`` for ``dw`` alone; may be ``None``) is an uninitialised tensor
    of its shape: the kernel reads only its shape (a broadcast placeholder cost more, as oneDNN
    made it contiguous). Asymmetric pads are applied to the input (and cut from its gradient), as
    the forward kernel pads. Both gradients from one call equal the two from separate calls."""
    from openipu.popart.onnx_ops.conv import conv_geometry, torch_pad
    k = list(w_shape[2:])
    n = len(k)
    strides, dilations, pads = conv_geometry(x_shape, k, attrs)
    gy = gy.float()
    symmetric = list(pads[:n]) == list(pads[n:])
    padded = list(x_shape) if symmetric else \
        list(x_shape[:2]) + [int(x_shape[2 + i]) + int(pads[i]) + int(pads[n + i]) for i in range(n)]
    if x is None or not want[1]:
        x = torch.empty(padded, dtype=torch.float32)
    else:
        x = x.float() if symmetric or not any(pads) else F.pad(x.float(), torch_pad(pads))
    w = torch.empty(list(w_shape), dtype=torch.float32) if w is None or not want[0] else w.float()
    dx, dw, _ = torch.ops.aten.convolution_backward(
        gy.reshape([int(x_shape[0]), int(w_shape[0])] + list(gy.shape[2:])), x, w, None, strides,
        list(pads[:n]) if symmetric else [0] * n, dilations, False, [0] * n, int(attrs.get("group", 1)),
        [bool(want[0]), bool(want[1]), False])
    if dx is not None and not symmetric:
        for i in range(n):
            dx = dx.narrow(2 + i, int(pads[i]), int(x_shape[2 + i]))
    return [None if g is None else g.contiguous() for g in (dx, dw)]


@onnx_op("ConvDataGrad", domain=GC, flops=_conv_data_flops)
def conv_data_grad(inputs, attrs, opset):
    gy, w = inputs
    return [_conv_backward(gy, None, w, list(attrs["input_shape"]), list(w.shape), attrs, 0).to(gy.dtype)]


@onnx_op("ConvWeightsGrad", domain=GC, flops=_conv_weights_flops)
def conv_weights_grad(inputs, attrs, opset):
    gy, x = inputs
    return [_conv_backward(gy, x, None, list(x.shape), list(attrs["weights_shape"]), attrs, 1).to(gy.dtype)]


@onnx_op("MaxPoolGrad", domain=GC, flops=_first_input_flops)
def max_pool_grad(inputs, attrs, opset):
    """Each output's gradient to the input that is its window's maximum (the vector-Jacobian
    product of MaxPool). A 2-D float32 pooling that torch pads itself (:func:`implicit_pads`) on an
    input without -inf: ``max_pool2d_with_indices`` and its backward, as autograd's; otherwise the
    vjp of the MaxPool kernel (over the input padded with -inf: where a window's inputs are all
    -inf, the padding would take the gradient, so that case keeps this path)."""
    x, _y, gy = inputs
    from openipu.popart.onnx_ops.pooling import _geometry, implicit_pads
    k, s, d, begins, ends, _, _ = _geometry(x, attrs)
    if len(k) == 2 and x.dtype == torch.float32 and gy.dtype == torch.float32 and \
            implicit_pads(k, begins, ends) and not bool(torch.isneginf(x).any()):
        aten = torch.ops.aten
        _, idx = aten.max_pool2d_with_indices(x, k, s, list(begins), d, False)
        return [aten.max_pool2d_with_indices_backward(gy.reshape(idx.shape), x, k, s, list(begins), d, False, idx)]
    return [_vjp("MaxPool", [x], attrs, opset, 0, gy)]


@onnx_op("AveragePoolGrad", domain=GC, flops=_elementwise_flops(2))
def average_pool_grad(inputs, attrs, opset):
    (gy,) = inputs
    x = torch.zeros(list(attrs["input_shape"]), dtype=torch.float32, device=gy.device)
    return [_vjp("AveragePool", [x], attrs, opset, 0, gy)]


@onnx_op("GatherGrad", domain=GC, flops=_gather_grad_flops)
def gather_grad(inputs, attrs, opset):
    """Each slice of ``gy`` added into its row of zeros shaped like the data (``data_shape``);
    negative indices count from the end, as Gather's; slices whose index is outside the data
    (Gather gave zeros for them) are dropped, as ``popops::multiUpdateAdd`` drops such offsets."""
    gy, idx = inputs
    axis = int(attrs.get("axis", 0))
    shape = [int(d) for d in attrs["data_shape"]]
    axis %= len(shape)
    n = shape[axis]
    i = idx.long().reshape(-1)
    i = torch.where(i < 0, i + n, i)
    # gy: data.shape[:axis] + idx.shape + data.shape[axis+1:]
    lead, trail = shape[:axis], shape[axis + 1:]
    g = gy.float().reshape(lead + [i.numel()] + trail)
    out = torch.zeros(shape, dtype=torch.float32, device=gy.device)
    valid = (i >= 0) & (i < n)
    if not bool(valid.all()):
        i, g = i[valid], g.index_select(axis, valid.nonzero().reshape(-1))
    out.index_add_(axis, i, g)
    return [out.to(gy.dtype)]
