"""Gradients through anchored input gradients (issue 35) for the ops with a gradient rule that
:mod:`test_popart_op_grads` has no case for: Reciprocal, Neg, Ceil (zero gradient), Squeeze,
Unsqueeze, GlobalMaxPool, GlobalAveragePool, MaxUnpool (after MaxPool's indices), Col2Im,
AffineGrid, CenterCropPad and ``ai.graphcore`` Remainder; each a graph of inputs only, the
``Gradient___<input>`` anchors compared with ``torch.autograd`` on the same values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import popart
from test_popart_input_grads import _train
from test_popart_op_grads import Case, _c, _i64, _rand

G = popart.reservedGradientPrefix()


def _centercroppad(t):
    """[5, 6] cropped / padded to [4, 8] about the centre (ONNX CenterCropPad)."""
    out = torch.zeros(4, 8)
    # rows: crop 5 -> 4 starts at (5 - 4) // 2 = 0; columns: pad 6 -> 8 at (8 - 6) // 2 = 1
    out = out.clone()
    out[:, 1:7] = t[0:4, :]
    return out


def _unpool_ref(x):
    y, idx = F.max_pool2d(x, 2, 2, return_indices=True)
    return F.max_unpool2d(y, idx, 2, 2, output_size=x.shape[-2:])


_DIVISOR = _rand(3, 4, lo=1.0, hi=2.0)

CASES = {
    "reciprocal": Case([_rand(3, 4, lo=0.5, hi=2.0)], lambda b, x: b.aiOnnx.reciprocal([x]),
                       lambda x: torch.reciprocal(x)),
    "neg": Case([_rand(3, 4)], lambda b, x: b.aiOnnx.neg([x]), lambda x: -x),
    "ceil_mul": Case([_rand(3, 4)], lambda b, x: b.aiOnnx.mul([b.aiOnnx.ceil([x]), x]),
                     lambda x: torch.ceil(x) * x),
    "squeeze": Case([_rand(3, 1, 4)], lambda b, x: b.aiOnnx.squeeze([x, _c(b, _i64([1]))]),
                    lambda x: x.squeeze(1)),
    "unsqueeze": Case([_rand(3, 4)], lambda b, x: b.aiOnnx.unsqueeze([x, _c(b, _i64([0, 3]))]),
                      lambda x: x[None, :, :, None]),
    "globalmaxpool": Case([_rand(2, 3, 4, 5)], lambda b, x: b.aiOnnx.globalmaxpool([x]),
                          lambda x: x.amax(dim=(2, 3), keepdim=True)),
    "globalaveragepool": Case([_rand(2, 3, 4, 5)], lambda b, x: b.aiOnnx.globalaveragepool([x]),
                              lambda x: x.mean(dim=(2, 3), keepdim=True)),
    "maxunpool": Case([_rand(1, 2, 4, 4)],
                      lambda b, x: b.aiOnnx.maxunpool(b.aiOnnx.maxpool([x], 2, [2, 2], strides=[2, 2]),
                                                      kernel_shape=[2, 2], strides=[2, 2]),
                      _unpool_ref),
    "col2im": Case([_rand(1, 2 * 2 * 2, 9)],
                   lambda b, x: b.aiOnnx.col2im([x, _c(b, _i64([4, 4])), _c(b, _i64([2, 2]))]),
                   lambda x: F.fold(x, (4, 4), (2, 2))),
    "affinegrid": Case([_rand(2, 2, 3)],
                       lambda b, t: b.aiOnnx.affinegrid([t, _c(b, _i64([2, 1, 3, 4]))], align_corners=0),
                       lambda t: F.affine_grid(t, [2, 1, 3, 4], align_corners=False), opset=20),
    "centercroppad": Case([_rand(5, 6)], lambda b, x: b.aiOnnx.centercroppad([x, _c(b, _i64([4, 8]))]),
                          _centercroppad),
    # PopART differentiates Fmod / Remainder in the dividend only (FmodArg0GradOp)
    "graphcore_remainder": Case([_rand(3, 4, lo=-5, hi=5)],
                                lambda b, x: b.aiGraphcore.remainder([x, _c(b, _DIVISOR)]),
                                lambda x: torch.remainder(x, torch.tensor(_DIVISOR))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_input_gradient_matches_torch(name):
    c = CASES[name]
    b = popart.Builder(opsets={"ai.onnx": c.opset, "ai.graphcore": 1})
    ids = [b.addInputTensor(popart.TensorInfo(w), f"x{i}") for i, w in enumerate(c.ws)]
    y = c.build(b, *ids)
    tws = [torch.tensor(w.astype(np.float32), requires_grad=True) for w in c.ws]
    ty = c.ref(*tws)
    r = np.random.default_rng(11).standard_normal(tuple(ty.shape)).astype(np.float32)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([y, _c(b, r)])], popart.ReductionType.Sum)
    a = _train(b, loss, [loss, y] + [G + i for i in ids], dict(zip(ids, c.ws)))
    (ty * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(a[y].reshape(ty.shape), ty.detach().numpy(), rtol=c.rtol, atol=c.atol)
    for i, t in zip(ids, tws):
        want = t.grad if t.grad is not None else torch.zeros_like(t)
        np.testing.assert_allclose(a[G + i], want.numpy(), rtol=c.rtol, atol=c.atol, err_msg=f"gradient of {i}")


def test_remainder_divisor_has_no_gradient():
    """As PopART (only ``FmodArg0GradOp``): the divisor's gradient is not made, and anchoring it
    is PopART's anchor error when the session is made."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    y = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "y")
    loss = b.aiGraphcore.identityloss([b.aiGraphcore.remainder([x, y])], popart.ReductionType.Sum)
    with pytest.raises(popart.popart_exception, match="Anchor tensor `Gradient___y' not in Ir Tensors"):
        _train(b, loss, [G + x, G + y], {x: np.ones(3, np.float32), y: np.ones(3, np.float32)})
