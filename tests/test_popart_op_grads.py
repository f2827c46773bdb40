"""Gradients of the ONNX operators, shaped like PopART's operator tests: for each op a small
Builder graph whose differentiated inputs are weights (``addInitializedInputTensor``), the loss
``identityloss(sum(y * r))`` (``r`` random, so every output element's gradient differs), and
anchors on the output and ``Gradient___<weight>``; compared with torch.autograd on the same
values (float32: rtol 1e-4; float16: looser)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import popart

G = popart.reservedGradientPrefix()
ALL = popart.AnchorReturnType("All")
T = torch.tensor


_SEEDS = iter(range(1000, 100000))


def _rand(*shape, lo=-2.0, hi=2.0, seed=None):
    """Uniform values; each call its own seed (no ties between weights)."""
    return np.random.default_rng(next(_SEEDS) if seed is None else seed).uniform(lo, hi, shape).astype(np.float32)


def _i64(v):
    return np.asarray(v, np.int64)


def _c(b, v):
    return b.aiOnnx.constant(np.asarray(v))


class Case:
    """``ws``: the weights (numpy); ``build(b, *ids) -> y``; ``ref(*tensors) -> y`` (torch);
    ``precise``: grad op types whose lowering must be a PopLibs one."""

    def __init__(self, ws, build, ref, opset=18, rtol=1e-4, atol=1e-5, precise=(), fp16=False):
        self.ws, self.build, self.ref, self.opset = ws, build, ref, opset
        self.rtol, self.atol, self.precise, self.fp16 = rtol, atol, precise, fp16


def _bn_train(b, x, s, bias):
    m, v = _c(b, np.zeros(3, np.float32)), _c(b, np.ones(3, np.float32))
    return b.aiOnnx.batchnormalization([x, s, bias, m, v], 3, epsilon=1e-5, momentum=0.9, training_mode=1)[0]


def _resize(b, x):
    return b.aiOnnx.resize([x, "", _c(b, np.array([1, 1, 2, 3], np.float32))], mode="nearest",
                           coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _convt(b, x, w, bias, **kw):
    return b.aiOnnx.convtranspose([x, w, bias], **kw)


def _topk(b, x):
    return b.aiOnnx.topk([x, _c(b, _i64([3]))], axis=1)[0]


IDX = _i64([[1, 0, 2, 2], [0, 2, 1, 0]])
SC_IDX = _i64([[1, 0, 2, 2], [0, 2, 1, 0]])
ND_IDX = _i64([[0, 1], [1, 2], [0, 0]])

CASES = {
    # -- the transformer (all-MiniLM-L6-v2) set -------------------------------------------------
    "layernorm": Case([_rand(2, 3, 8), _rand(8), _rand(8)],
                      lambda b, x, s, c: b.aiOnnx.layernormalization([x, s, c], 1, axis=-1, epsilon=1e-5)[0],
                      lambda x, s, c: F.layer_norm(x, (8,), s, c, 1e-5), precise=("LayerNormalizationGrad",)),
    "layernorm_axis1_no_bias": Case([_rand(2, 3, 4), _rand(3, 4)],
                                    lambda b, x, s: b.aiOnnx.layernormalization([x, s], 1, axis=1, epsilon=1e-3)[0],
                                    lambda x, s: F.layer_norm(x, (3, 4), s, None, 1e-3),
                                    precise=("LayerNormalizationGrad",)),
    "erf": Case([_rand(3, 5)], lambda b, x: b.aiOnnx.erf([x]), torch.erf, precise=("ErfGrad",)),
    "gelu_erf_decomposed": Case([_rand(4, 6)], lambda b, x: b.aiOnnx.mul([b.aiOnnx.mul(
        [x, _c(b, np.float32(0.5))]), b.aiOnnx.add([b.aiOnnx.erf([b.aiOnnx.div([x, _c(b, np.float32(math.sqrt(2)))])]),
                                                   _c(b, np.float32(1.0))])]), F.gelu),
    "gelu_onnx20": Case([_rand(4, 6)], lambda b, x: b.aiOnnx.gelu([x]), F.gelu, opset=20,
                        precise=("GeluErfGrad",)),
    "gelu_tanh_onnx20": Case([_rand(4, 6)], lambda b, x: b.aiOnnx.gelu([x], approximate="tanh"),
                             lambda x: F.gelu(x, approximate="tanh"), opset=20, precise=("GeluGrad",)),
    "sqrt_pow_div": Case([_rand(3, 4, lo=0.5), _rand(4, lo=0.5, hi=1.5)],
                         lambda b, x, w: b.aiOnnx.div([b.aiOnnx.sqrt([x]), b.aiOnnx.pow([x, w])]),
                         lambda x, w: torch.sqrt(x) / x ** w),
    "where_broadcast": Case([_rand(2, 3, 4), _rand(4)],
                            lambda b, x, w: b.aiOnnx.where([_c(b, np.array([True, False, True])[:, None]), x, w]),
                            lambda x, w: torch.where(T([True, False, True])[:, None], x, w)),
    "expand": Case([_rand(3, 1)], lambda b, x: b.aiOnnx.expand([x, _c(b, _i64([2, 3, 4]))]),
                   lambda x: x.expand(2, 3, 4)),
    "cast_roundtrip": Case([_rand(3, 4)], lambda b, x: b.aiOnnx.cast([b.aiOnnx.mul([b.aiOnnx.cast([x], "FLOAT16"),
                                                                                     _c(b, np.float16(2))])], "FLOAT"),
                           lambda x: (x.half() * 2).float(), rtol=1e-3),
    "tanh": Case([_rand(3, 4)], lambda b, x: b.aiOnnx.tanh([x]), torch.tanh),
    "reducemean_keepdims": Case([_rand(2, 3, 4)], lambda b, x: b.aiOnnx.reducemean([x, _c(b, _i64([-1]))], keepdims=1),
                                lambda x: x.mean(-1, keepdim=True)),
    "softmax_axis1": Case([_rand(2, 3, 4)], lambda b, x: b.aiOnnx.softmax([x], axis=1), lambda x: torch.softmax(x, 1),
                          precise=("SoftmaxGrad",)),
    "softmax_opset11_flatten": Case([_rand(2, 3, 4)], lambda b, x: b.aiOnnx.softmax([x], axis=1),
                                    lambda x: torch.softmax(x.reshape(2, 12), 1).reshape(2, 3, 4), opset=11,
                                    precise=("SoftmaxGrad",)),
    "gather_axis1": Case([_rand(3, 5)], lambda b, x: b.aiOnnx.gather([x, _c(b, IDX)], axis=1),
                         lambda x: x[:, T(IDX)]),
    "gather_scalar_index": Case([_rand(2, 4, 3)], lambda b, x: b.aiOnnx.gather([x, _c(b, np.int64(0))], axis=1),
                                lambda x: x[:, 0]),
    "slice_steps": Case([_rand(4, 6)], lambda b, x: b.aiOnnx.slice([x, _c(b, _i64([1, 5])), _c(b, _i64([4, 0])),
                                                                   _c(b, _i64([0, 1])), _c(b, _i64([2, -2]))]),
                        lambda x: x[1:4:2][:, [5, 3, 1]]),
    # -- elementwise ----------------------------------------------------------------------------
    "max_min": Case([_rand(3, 4), _rand(4)],
                    lambda b, x, w: b.aiOnnx.add([b.aiOnnx.max([x, w]), b.aiOnnx.min([x, w])]),
                    lambda x, w: torch.maximum(x, w) + torch.minimum(x, w)),
    "max_three": Case([_rand(3, 4), _rand(4), _rand(3, 1)],
                      lambda b, x, w, v: b.aiOnnx.max([x, w, v]),
                      lambda x, w, v: torch.maximum(torch.maximum(x, w), v)),
    "clip": Case([_rand(3, 5)], lambda b, x: b.aiOnnx.clip([x, _c(b, np.float32(-0.7)), _c(b, np.float32(1.1))]),
                 lambda x: torch.clamp(x, -0.7, 1.1), precise=("ClipGrad",)),
    "clip_tensor_bound": Case([_rand(3, 5), np.array(0.3, np.float32)], lambda b, x, hi: b.aiOnnx.clip([x, "", hi]),
                              lambda x, hi: torch.minimum(x, hi)),
    "prelu": Case([_rand(2, 3, 4), _rand(3, 1, lo=0.1, hi=0.5)], lambda b, x, s: b.aiOnnx.prelu([x, s]),
                  lambda x, s: torch.where(x < 0, x * s, x)),
    "fmod": Case([_rand(3, 4, lo=-5, hi=5), _rand(4, lo=0.7, hi=1.9)], lambda b, x, w: b.aiOnnx.mod([x, w], fmod=1),
                 torch.fmod),
    "sign_floor_zero": Case([_rand(3, 4), _rand(3, 4)],
                            lambda b, x, w: b.aiOnnx.add([b.aiOnnx.mul([b.aiOnnx.sign([x]), w]), b.aiOnnx.floor([x])]),
                            lambda x, w: torch.sign(x) * w + torch.floor(x)),
    "sin_cos": Case([_rand(3, 4)], lambda b, x: b.aiOnnx.mul([b.aiOnnx.sin([x]), b.aiOnnx.cos([x])]),
                    lambda x: torch.sin(x) * torch.cos(x)),
    # -- non-linearities and unary math: one fused popops.map each ---------------------------------
    **{f"unary_{n}": Case([_rand(3, 7, lo=lo, hi=hi)], (lambda n, a: lambda b, x: getattr(b.aiOnnx, n)([x], **a))(n, a),
                          fn, precise=(f"{g}Grad",))
       for n, g, fn, a, lo, hi in [
           ("leakyrelu", "LeakyRelu", lambda x: F.leaky_relu(x, 0.2), {"alpha": 0.2}, -2, 2),
           ("elu", "Elu", lambda x: F.elu(x, 0.7), {"alpha": 0.7}, -2, 2),
           ("selu", "Selu", F.selu, {}, -2, 2),
           ("celu", "Celu", lambda x: F.celu(x, 1.5), {"alpha": 1.5}, -2, 2),
           ("hardsigmoid", "HardSigmoid", lambda x: torch.clamp(0.3 * x + 0.4, 0, 1), {"alpha": 0.3, "beta": 0.4},
            -5, 5),
           ("softsign", "SoftSign", F.softsign, {}, -3, 3),
           ("softplus", "SoftPlus", F.softplus, {}, -3, 3),
           ("thresholdedrelu", "ThresholdedRelu", lambda x: torch.where(x > 0.5, x, 0 * x), {"alpha": 0.5}, -2, 2),
           ("shrink", "Shrink", lambda x: torch.where(x < -0.6, x + 0.2, torch.where(x > 0.6, x - 0.2, 0 * x)),
            {"lambd": 0.6, "bias": 0.2}, -2, 2),
           ("hardswish", "HardSwish", lambda x: x * torch.clamp(x / 6 + 0.5, 0, 1), {}, -5, 5),
           ("mish", "Mish", F.mish, {}, -3, 3),
           ("tan", "Tan", torch.tan, {}, -1.2, 1.2),
           ("asin", "Asin", torch.asin, {}, -0.9, 0.9),
           ("acos", "Acos", torch.acos, {}, -0.9, 0.9),
           ("atan", "Atan", torch.atan, {}, -3, 3),
           ("sinh", "Sinh", torch.sinh, {}, -2, 2),
           ("cosh", "Cosh", torch.cosh, {}, -2, 2),
           ("asinh", "Asinh", torch.asinh, {}, -3, 3),
           ("acosh", "Acosh", torch.acosh, {}, 1.2, 3),
           ("atanh", "Atanh", torch.atanh, {}, -0.9, 0.9)]},
    "swish_graphcore": Case([_rand(3, 5)], lambda b, x: b.aiGraphcore.swish([x]), F.silu, precise=("SwishGrad",)),
    "expm1_log1p_atan2": Case([_rand(3, 4, lo=0.1), _rand(4, lo=0.5)],
                              lambda b, x, w: b.aiGraphcore.atan2([b.aiGraphcore.log1p([b.aiGraphcore.expm1([x])]), w]),
                              lambda x, w: torch.atan2(torch.log1p(torch.expm1(x)), w)),
    # -- reductions and scans -------------------------------------------------------------------
    **{f"reduce_{n}": Case([_rand(3, 4, 5, lo=lo, hi=2)],
                           (lambda n: lambda b, x: getattr(b.aiOnnx, n)([x, _c(b, _i64([1, -1]))], keepdims=0))(n), fn)
       for n, fn, lo in [("reducemax", lambda x: x.amax((1, 2)), -2), ("reducemin", lambda x: x.amin((1, 2)), -2),
                         ("reducel1", lambda x: x.abs().sum((1, 2)), -2),
                         ("reducel2", lambda x: x.norm(dim=(1, 2)), -2),
                         ("reducesumsquare", lambda x: (x * x).sum((1, 2)), -2),
                         ("reducelogsumexp", lambda x: torch.logsumexp(x, (1, 2)), -2),
                         ("reducelogsum", lambda x: torch.log(x.sum((1, 2))), 0.1),
                         ("reduceprod", lambda x: x.prod(2).prod(1), 0.5)]},
    "reducesum_all_keepdims": Case([_rand(3, 4)], lambda b, x: b.aiOnnx.reducesum([x], keepdims=1),
                                   lambda x: x.sum().reshape(1, 1)),
    "cumsum_reverse_exclusive": Case([_rand(3, 5)],
                                     lambda b, x: b.aiOnnx.cumsum([x, _c(b, np.int64(1))], exclusive=1, reverse=1),
                                     lambda x: x.flip(1).cumsum(1).flip(1) - x),
    "cumsum": Case([_rand(3, 5)], lambda b, x: b.aiOnnx.cumsum([x, _c(b, np.int64(0))]), lambda x: x.cumsum(0)),
    # -- data movement --------------------------------------------------------------------------
    "pad_constant": Case([_rand(2, 3, 4)], lambda b, x: b.aiOnnx.pad([x, _c(b, _i64([0, 1, 2, 0, 2, 1]))]),
                         lambda x: F.pad(x, (2, 1, 1, 2))),
    "pad_reflect": Case([_rand(2, 3, 4)], lambda b, x: b.aiOnnx.pad([x, _c(b, _i64([0, 1, 2, 0, 1, 1]))],
                                                                    mode="reflect"),
                        lambda x: F.pad(x[None], (2, 1, 1, 1), mode="reflect")[0]),
    "pad_edge_axes": Case([_rand(2, 3, 4)], lambda b, x: b.aiOnnx.pad([x, _c(b, _i64([2, 1])), "", _c(b, _i64([2]))],
                                                                      mode="edge"),
                          lambda x: F.pad(x, (2, 1), mode="replicate")),
    "tile": Case([_rand(2, 3)], lambda b, x: b.aiOnnx.tile([x, _c(b, _i64([2, 3]))]), lambda x: x.repeat(2, 3)),
    "split_unused_output": Case([_rand(2, 7)], lambda b, x: b.aiOnnx.split([x, _c(b, _i64([2, 4, 1]))], 3, axis=1)[1],
                                lambda x: x[:, 2:6]),
    "split_concat": Case([_rand(6, 2)], lambda b, x: b.aiOnnx.concat(b.aiOnnx.split([x], 3, axis=0)[::-1], axis=0),
                         lambda x: torch.cat(torch.split(x, 2, 0)[::-1], 0)),
    "depth_to_space": Case([_rand(1, 8, 2, 3)], lambda b, x: b.aiOnnx.depthtospace([x], blocksize=2),
                           lambda x: x.reshape(1, 2, 2, 2, 2, 3).permute(0, 3, 4, 1, 5, 2).reshape(1, 2, 4, 6)),
    "depth_to_space_crd": Case([_rand(1, 8, 2, 3)], lambda b, x: b.aiOnnx.depthtospace([x], blocksize=2, mode="CRD"),
                               lambda x: F.pixel_shuffle(x, 2)),
    "space_to_depth": Case([_rand(1, 2, 4, 6)], lambda b, x: b.aiOnnx.spacetodepth([x], blocksize=2),
                           lambda x: x.reshape(1, 2, 2, 2, 3, 2).permute(0, 3, 5, 1, 2, 4).reshape(1, 8, 2, 3)),
    "trilu": Case([_rand(2, 4, 4)], lambda b, x: b.aiOnnx.trilu([x, _c(b, np.int64(1))], upper=0),
                  lambda x: torch.tril(x, 1)),
    "resize_nearest": Case([_rand(1, 2, 3, 4)], _resize,
                           lambda x: x.repeat_interleave(2, 2).repeat_interleave(3, 3)),
    "upsample_opset9": Case([_rand(1, 2, 3, 4)], lambda b, x: b.aiOnnx.upsample([x, _c(b, np.array([1, 1, 2, 2],
                                                                                                  np.float32))]),
                            lambda x: x.repeat_interleave(2, 2).repeat_interleave(2, 3), opset=9),
    # -- indexing -------------------------------------------------------------------------------
    "gather_elements": Case([_rand(3, 4)], lambda b, x: b.aiOnnx.gatherelements([x, _c(b, IDX[:, :3])], axis=0),
                            lambda x: torch.gather(x, 0, T(IDX[:, :3]))),
    "gather_nd": Case([_rand(2, 3, 4)], lambda b, x: b.aiOnnx.gathernd([x, _c(b, ND_IDX)]),
                      lambda x: x[T(ND_IDX[:, 0]), T(ND_IDX[:, 1])]),
    "scatter_elements": Case([_rand(3, 4), _rand(2, 4)],
                             lambda b, x, u: b.aiOnnx.scatterelements([x, _c(b, SC_IDX), u]),
                             lambda x, u: x.scatter(0, T(SC_IDX), u)),
    "scatter_nd": Case([_rand(3, 4), _rand(2, 4)],
                       lambda b, x, u: b.aiOnnx.scatternd([x, _c(b, _i64([[2], [0]])), u]),
                       lambda x, u: x.index_put((T(_i64([2, 0])),), u)),
    "topk": Case([_rand(2, 6)], _topk, lambda x: torch.topk(x, 3, 1).values),
    # -- normalisations -------------------------------------------------------------------------
    "batchnorm_training": Case([_rand(4, 3, 2, 2), _rand(3), _rand(3)], _bn_train,
                               lambda x, s, c: F.batch_norm(x, None, None, s, c, True, 0.1, 1e-5),
                               precise=("BatchNormalizationGrad",)),
    "batchnorm_training_opset9_saved_stats": Case(
        [_rand(4, 3, 2, 2), _rand(3), _rand(3)],
        lambda b, x, s, c: b.aiOnnx.batchnormalization([x, s, c, _c(b, np.zeros(3, np.float32)),
                                                        _c(b, np.ones(3, np.float32))], 5, epsilon=1e-5)[0],
        lambda x, s, c: F.batch_norm(x, None, None, s, c, True, 0.1, 1e-5), opset=9,
        precise=("BatchNormalizationGrad",)),
    "instancenorm": Case([_rand(2, 3, 5), _rand(3), _rand(3)],
                         lambda b, x, s, c: b.aiOnnx.instancenormalization([x, s, c]),
                         lambda x, s, c: F.instance_norm(x, weight=s, bias=c), precise=("InstanceNormalizationGrad",)),
    "groupnorm_opset21": Case([_rand(2, 4, 3), _rand(4), _rand(4)],
                              lambda b, x, s, c: b.aiOnnx.groupnormalization([x, s, c], num_groups=2),
                              lambda x, s, c: F.group_norm(x, 2, s, c), opset=21,
                              precise=("GroupNormalizationGrad",)),
    "lpnorm": Case([_rand(3, 4)], lambda b, x: b.aiOnnx.lpnormalization([x], axis=1, p=2),
                   lambda x: F.normalize(x, dim=1)),
    "lrn": Case([_rand(2, 5, 3)], lambda b, x: b.aiOnnx.lrn([x], size=3),
                lambda x: F.local_response_norm(x, 3, 1e-4, 0.75, 1.0)),
    # -- convolutions, pooling, linear algebra ----------------------------------------------------
    "conv_transpose": Case([_rand(1, 2, 3, 4), _rand(2, 3, 3, 2), _rand(3)],
                           lambda b, x, w, c: _convt(b, x, w, c, strides=[2, 1], pads=[1, 0, 0, 1]),
                           lambda x, w, c: F.conv_transpose2d(x, w, c, stride=(2, 1))[:, :, 1:, :-1]),
    "conv_transpose_output_padding": Case([_rand(1, 4, 3, 3), _rand(4, 1, 2, 2)],
                                          lambda b, x, w: b.aiOnnx.convtranspose([x, w], strides=[2, 2], group=2,
                                                                                 output_padding=[1, 1]),
                                          lambda x, w: F.conv_transpose2d(x, w, stride=2, groups=2, output_padding=1)),
    "lppool": Case([_rand(1, 2, 4, 4)], lambda b, x: b.aiOnnx.lppool([x], kernel_shape=[2, 2], strides=[2, 2]),
                   lambda x: F.lp_pool2d(x, 2, 2)),
    "einsum": Case([_rand(2, 3, 4), _rand(4, 5)], lambda b, x, w: b.aiOnnx.einsum([x, w], equation="bij,jk->bik"),
                   lambda x, w: torch.einsum("bij,jk->bik", x, w)),
    # -- the generic gradient ops (vjp of the forward kernel) -------------------------------------
    "rmsnorm_opset23": Case([_rand(2, 3, 6), _rand(6)], lambda b, x, s: b.aiOnnx.rmsnormalization([x, s]),
                            lambda x, s: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * s, opset=23),
    "mean_variance_norm": Case([_rand(2, 3, 2, 2)], lambda b, x: b.aiOnnx.meanvariancenormalization([x]),
                               lambda x: (x - x.mean((0, 2, 3), keepdim=True))
                               / (x.var((0, 2, 3), unbiased=False, keepdim=True).sqrt() + 1e-9), rtol=1e-3),
    "reverse_sequence": Case([_rand(4, 2, 3)], lambda b, x: b.aiOnnx.reversesequence([x, _c(b, _i64([3, 2]))]),
                             lambda x: torch.stack([torch.cat([x[:3, 0].flip(0), x[3:, 0]]),
                                                    torch.cat([x[:2, 1].flip(0), x[2:, 1]])], 1)),
    "compress": Case([_rand(4, 3)], lambda b, x: b.aiOnnx.compress([x, _c(b, np.array([1, 0, 1, 1], bool))], axis=0),
                     lambda x: x[[0, 2, 3]]),
    "global_lp_pool": Case([_rand(2, 3, 2, 3)], lambda b, x: b.aiOnnx.globallppool([x]),
                           lambda x: x.pow(2).sum((2, 3), keepdim=True).sqrt()),
    "det": Case([_rand(2, 3, 3)], lambda b, x: b.aiOnnx.det([x]), torch.linalg.det, rtol=1e-3),
    "graphcore_reverse_slice_subsample": Case(
        [_rand(4, 6)], lambda b, x: b.aiGraphcore.subsample([b.aiGraphcore.slice([b.aiGraphcore.reverse(
            [x], dimensions=[1])], starts=[1, 0], ends=[4, 5])], strides=[2, 2]),
        lambda x: x.flip(1)[1:4, 0:5][::2, ::2]),
    # -- float16 ------------------------------------------------------------------------------
    "fp16_layernorm": Case([_rand(2, 4, 16).astype(np.float16), _rand(16).astype(np.float16),
                            _rand(16).astype(np.float16)],
                           lambda b, x, s, c: b.aiOnnx.layernormalization([x, s, c], 1, epsilon=1e-5)[0],
                           lambda x, s, c: F.layer_norm(x, (16,), s, c, 1e-5), rtol=2e-2, atol=2e-2, fp16=True,
                           precise=("LayerNormalizationGrad",)),
    "fp16_gelu_matmul": Case([_rand(3, 8).astype(np.float16), (0.3 * _rand(8, 4)).astype(np.float16)],
                             lambda b, x, w: b.aiOnnx.gelu([b.aiOnnx.matmul([x, w])]),
                             lambda x, w: F.gelu(x @ w), opset=20, rtol=1e-2, atol=1e-2, fp16=True,
                             precise=("GeluErfGrad",)),
    "fp16_softmax_erf": Case([_rand(2, 3, 8).astype(np.float16)], lambda b, x: b.aiOnnx.softmax([b.aiOnnx.erf([x])]),
                             lambda x: torch.softmax(torch.erf(x), -1), rtol=1e-2, atol=1e-2, fp16=True),
    "fp16_batchnorm_training": Case([_rand(4, 3, 2, 2).astype(np.float16), _rand(3).astype(np.float16),
                                     _rand(3).astype(np.float16)],
                                    lambda b, x, s, c: b.aiOnnx.batchnormalization(
                                        [x, s, c, _c(b, np.zeros(3, np.float16)), _c(b, np.ones(3, np.float16))], 3,
                                        training_mode=1)[0],
                                    lambda x, s, c: F.batch_norm(x, None, None, s, c, True, 0.1, 1e-5),
                                    rtol=3e-2, atol=3e-2, fp16=True),
}


def _rnn_ref(kind, x, w, r, bias, h_out=False):
    """ONNX RNN / GRU / LSTM (forward, default activations, zero initial state) in torch:
    ``Y`` [seq, 1, batch, hidden] (plus ``Y_h`` broadcast onto it when ``h_out``)."""
    hid = r.shape[-1]
    wb, rb = bias[0].chunk(2)
    h = torch.zeros(x.shape[1], hid)
    c = torch.zeros_like(h)
    ys = []
    for xt in x:
        gx, gh = xt @ w[0].T + wb, h @ r[0].T + rb
        if kind == "RNN":
            h = torch.tanh(gx + gh)
        elif kind == "LSTM":
            i, o, f, cc = (gx + gh).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(cc)
            h = torch.sigmoid(o) * torch.tanh(c)
        else:
            (zx, rx, hx), (zh, rh, _) = gx.chunk(3, -1), gh.chunk(3, -1)
            z, rr = torch.sigmoid(zx + zh), torch.sigmoid(rx + rh)
            ht = torch.tanh(hx + (rr * h) @ r[0][2 * hid:].T + rb[2 * hid:])
            h = (1 - z) * ht + z * h
        ys.append(h)
    y = torch.stack(ys)[:, None]
    return y + h[None] if h_out else y


def _rnn(kind, gates, h_out=False):
    """A recurrent case: seq 3, batch 2, input 4, hidden 3."""
    def build(b, x, w, r, bias):
        fn = {"RNN": b.aiOnnx.rnn, "GRU": b.aiOnnx.gru, "LSTM": b.aiOnnx.lstm}[kind]
        outs = fn([x, w, r, bias], num_outputs=2, hidden_size=3)
        return b.aiOnnx.add([outs[0], outs[1]]) if h_out else outs[0]
    return Case([_rand(3, 2, 4), 0.5 * _rand(1, gates * 3, 4), 0.5 * _rand(1, gates * 3, 3), 0.5 * _rand(1, gates * 6)],
                build, lambda x, w, r, bias: _rnn_ref(kind, x, w, r, bias, h_out), opset=14)


CASES.update({"rnn": _rnn("RNN", 1), "gru": _rnn("GRU", 3), "lstm": _rnn("LSTM", 4),
              "lstm_y_and_y_h": _rnn("LSTM", 4, h_out=True)})


def _session(b, loss, anchors):
    df = popart.DataFlow(1, {a: ALL for a in anchors})
    s = popart.TrainingSession(b.getModelProto(), df, loss, popart.ConstSGD(0.0),
                               popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    s.weightsFromHost()
    return s


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_gradient_matches_torch(name):
    c = CASES[name]
    b = popart.Builder(opsets={"ai.onnx": c.opset, "ai.graphcore": 1})
    ids = [b.addInitializedInputTensor(w, f"w{i}") for i, w in enumerate(c.ws)]
    y = c.build(b, *ids)
    tws = [torch.tensor(w.astype(np.float32), requires_grad=True) for w in c.ws]
    ty = c.ref(*tws)
    r = np.random.default_rng(7).standard_normal(tuple(ty.shape)).astype(np.float16 if c.fp16 else np.float32)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([y, _c(b, r)])], popart.ReductionType.Sum)
    s = _session(b, loss, [loss, y] + [G + i for i in ids])
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({}, a))
    (ty * torch.tensor(r.astype(np.float32))).sum().backward()
    np.testing.assert_allclose(a[y].astype(np.float32).reshape(ty.shape), ty.detach().numpy(), rtol=c.rtol,
                               atol=c.atol)
    for i, t in zip(ids, tws):
        np.testing.assert_allclose(a[G + i].astype(np.float32), t.grad.numpy(), rtol=c.rtol, atol=c.atol,
                                   err_msg=f"gradient of {i}")
    low = {op.op_type: op.lowering for op in s.ops()}
    for p in c.precise:
        assert low.get(p) == "precise", (p, low.get(p))


def test_batchnorm_training_updates_running_statistics():
    """Training BatchNormalization (opset 15): the batch statistics normalise; the running mean
    and variance outputs are copied into the mean / var weights (PopART's ``CopyVarUpdate``)."""
    x, s, c = _rand(4, 3, 2, 2), _rand(3), _rand(3)
    m0, v0 = _rand(3, seed=5), _rand(3, lo=0.5, hi=1.5, seed=6)
    b = popart.Builder(opsets={"ai.onnx": 15, "ai.graphcore": 1})
    X, S, C, M, V = (b.addInitializedInputTensor(v, n) for v, n in ((x, "x"), (s, "s"), (c, "c"), (m0, "m"), (v0, "v")))
    y, rm, rv = b.aiOnnx.batchnormalization([X, S, C, M, V], 3, momentum=0.8, training_mode=1)
    loss = b.aiGraphcore.l1loss([y], 1.0, popart.ReductionType.Sum)
    sess = _session(b, loss, [loss, rm, G + S])
    a = sess.initAnchorArrays()
    sess.run(popart.PyStepIO({}, a))
    sess.weightsToHost()
    out = {k: np.zeros(3, np.float32) for k in ("m", "v")}
    sess.readWeights(popart.PyWeightsIO(out))
    tm, tv = torch.tensor(m0), torch.tensor(v0)
    ts = torch.tensor(s, requires_grad=True)
    F.batch_norm(torch.tensor(x), tm, tv, ts, torch.tensor(c), True, 0.2, 1e-5).abs().sum().backward()
    bv = torch.tensor(x).var((0, 2, 3), unbiased=False)
    np.testing.assert_allclose(a[rm], tm.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["m"], tm.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["v"], 0.8 * v0 + 0.2 * bv.numpy(), rtol=1e-5, atol=1e-6)   # ONNX: biased
    np.testing.assert_allclose(a[G + S], ts.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_batchnorm_inference_mode_gradient_is_popart_error():
    b = popart.Builder(opsets={"ai.onnx": 15, "ai.graphcore": 1})
    w = b.addInitializedInputTensor(_rand(2, 3, 4), "w")
    consts = [_c(b, v) for v in (np.ones(3, np.float32), np.zeros(3, np.float32), np.zeros(3, np.float32),
                                 np.ones(3, np.float32))]
    y = b.aiOnnx.batchnormalization([w] + consts, 1)[0]
    loss = b.aiGraphcore.identityloss([y])
    with pytest.raises(popart.popart_exception, match="inference mode, but its gradient Op is being created"):
        popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss, popart.ConstSGD(0.1),
                               popart.DeviceManager().createIpuModelDevice({}))


def test_dropout_training_gradient_uses_its_mask():
    b = popart.Builder(opsets={"ai.onnx": 18, "ai.graphcore": 1})
    xv = _rand(4, 6, lo=0.5, hi=2.0)
    x = b.addInitializedInputTensor(xv, "x")
    y = b.aiOnnx.dropout([x, _c(b, np.float32(0.25)), _c(b, np.bool_(True))], 1, seed=3)[0]
    r = _rand(4, 6)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([y, _c(b, r)])], popart.ReductionType.Sum)
    s = _session(b, loss, [y, G + x])
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({}, a))
    kept = a[y] != 0
    assert 0 < kept.sum() < kept.size
    np.testing.assert_allclose(a[y], np.where(kept, xv / 0.75, 0), rtol=1e-6)
    np.testing.assert_allclose(a[G + x], np.where(kept, r / 0.75, 0), rtol=1e-6)


def test_integer_paths_and_masks_need_no_gradient():
    """Equal / Not / Cast-to-bool / ArgMax paths from a weight are not differentiated: the
    weight's gradient comes through the float path only."""
    b = popart.Builder(opsets={"ai.onnx": 18, "ai.graphcore": 1})
    xv = _rand(3, 4)
    x = b.addInitializedInputTensor(xv, "x")
    mask = b.aiOnnx.logical_not([b.aiOnnx.equal([b.aiOnnx.argmax([x], axis=1, keepdims=1), _c(b, _i64([[0]]))])])
    y = b.aiOnnx.where([mask, b.aiOnnx.mul([x, x]), x])
    loss = b.aiGraphcore.identityloss([y], popart.ReductionType.Sum)
    s = _session(b, loss, [G + x])
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({}, a))
    tx = torch.tensor(xv, requires_grad=True)
    m = ~(tx.argmax(1, keepdim=True) == 0)
    torch.where(m, tx * tx, tx).sum().backward()
    np.testing.assert_allclose(a[G + x], tx.grad.numpy(), rtol=1e-5)


@pytest.mark.parametrize("name", ["ErfGrad", "EluGrad", "PadGrad", "ScatterDataGrad", "ReduceProdGrad"])
def test_generic_grad_kernels_pickle(name):
    import pickle

    from openipu.popart.onnx_ops import get_kernel
    k = get_kernel("ai.graphcore", name)
    assert pickle.loads(pickle.dumps(k)).op_type == name
