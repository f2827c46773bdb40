"""Optimizers against references (issue 35): every Adam mode the torch optimizers define (Adam
with decoupled ``Decay`` = AdamW, ``L2Regularization`` = Adam's weight_decay, AdaMax), RMSProp
(plain, momentum, centered, and the TF variant: ``w -= lr * g / sqrt(v + eps)``), AdaGrad,
AdaDelta, SGD with Nesterov momentum, and SGD with dampening and weight decay by PopART's own
equation (velocity starts at 0: the first step is dampened, unlike torch's); per-weight values
(``insertSpecific``) and ``updateOptimizerFromHost``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popart

ALL = popart.AnchorReturnType("All")
W0 = np.array([0.5, -1.0, 2.0], np.float32)
XV = np.array([[1, 2, 3], [4, 5, 6]], np.float32) / 4
LR = 0.1


def _train(opt, steps=3, update=None):
    """``loss = sum(x * w * w)`` (and ``v`` untouched by the loss's gradient scale); returns w, v."""
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    w = b.addInitializedInputTensor(W0.copy(), "w")
    v = b.addInitializedInputTensor(W0.copy(), "v")
    y = b.aiOnnx.add([b.aiOnnx.mul([b.aiOnnx.mul([x, w]), w]), b.aiOnnx.mul([b.aiOnnx.mul([x, v]), v])])
    loss = b.aiGraphcore.identityloss([b.aiOnnx.reducesum([y], keepdims=0)])
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {loss: ALL}), loss, opt,
                               popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    for i in range(steps):
        if update is not None and i == 1:
            s.updateOptimizerFromHost(update)
        s.run(popart.PyStepIO({x: XV}, a))
    s.weightsToHost()
    out = {"w": np.zeros(3, np.float32), "v": np.zeros(3, np.float32)}
    s.readWeights(popart.PyWeightsIO(out))
    return out["w"], out["v"]


def _torch(make, steps=3):
    w = torch.tensor(W0, requires_grad=True)
    o = make([w])
    for _ in range(steps):
        o.zero_grad()
        (torch.tensor(XV) * w * w).sum().backward()
        o.step()
    return w.detach().numpy()


def _grad(w):
    return 2 * XV.sum(0) * w


def _rms_tf(steps=3, alpha=0.9, eps=1e-3):
    w, ms = W0.astype(np.float64), np.zeros(3)
    for _ in range(steps):
        g = _grad(w)
        ms = alpha * ms + (1 - alpha) * g * g
        w = w - LR * g / np.sqrt(ms + eps)
    return w


def _sgd_popart(steps=3, mm=0.9, dm=0.3, wd=0.05):
    w, v = W0.astype(np.float64), np.zeros(3)
    for _ in range(steps):
        v = v * mm + (1 - dm) * (_grad(w) + wd * w)
        w = w - LR * v
    return w


A = popart.AdamMode
R = popart.AdaptiveMode
CASES = {
    "adam_decay_is_adamw": (lambda: popart.Adam({"defaultLearningRate": (LR, False), "defaultWeightDecay": (0.1, True),
                                                 "defaultEps": (1e-8, True)}, A.Adam, popart.WeightDecayMode.Decay),
                            lambda: _torch(lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=0.1, eps=1e-8))),
    "adam_l2": (lambda: popart.Adam({"defaultLearningRate": (LR, False), "defaultWeightDecay": (0.1, True),
                                     "defaultEps": (1e-8, True)}, A.Adam, popart.WeightDecayMode.L2Regularization),
                lambda: _torch(lambda p: torch.optim.Adam(p, lr=LR, weight_decay=0.1, eps=1e-8))),
    "adamax": (lambda: popart.Adam({"defaultLearningRate": (LR, False), "defaultEps": (1e-8, True)}, A.AdaMax),
               lambda: _torch(lambda p: torch.optim.Adamax(p, lr=LR, eps=1e-8))),
    "rmsprop": (lambda: popart.Adaptive({"defaultLearningRate": (LR, False), "defaultAlpha": (0.9, True),
                                         "defaultEps": (1e-8, True)}, R.RMSProp),
                lambda: _torch(lambda p: torch.optim.RMSprop(p, lr=LR, alpha=0.9, eps=1e-8))),
    "rmsprop_momentum": (lambda: popart.Adaptive({"defaultLearningRate": (LR, False), "defaultAlpha": (0.9, True),
                                                  "defaultMomentum": (0.5, True), "defaultEps": (1e-8, True)},
                                                 R.RMSProp),
                         lambda: _torch(lambda p: torch.optim.RMSprop(p, lr=LR, alpha=0.9, eps=1e-8, momentum=0.5))),
    "rmsprop_centered": (lambda: popart.Adaptive({"defaultLearningRate": (LR, False), "defaultAlpha": (0.9, True),
                                                  "defaultEps": (1e-8, True)}, R.CenteredRMSProp),
                         lambda: _torch(lambda p: torch.optim.RMSprop(p, lr=LR, alpha=0.9, eps=1e-8, centered=True))),
    "rmsprop_tf_variant": (lambda: popart.Adaptive({"defaultLearningRate": (LR, False), "defaultAlpha": (0.9, True),
                                                    "defaultEps": (1e-3, True)}, R.RMSProp, rmsprop_tf_variant=True),
                           _rms_tf),
    "adagrad": (lambda: popart.Adaptive({"defaultLearningRate": (LR, False), "defaultEps": (1e-10, True)}, R.AdaGrad),
                lambda: _torch(lambda p: torch.optim.Adagrad(p, lr=LR, eps=1e-10))),
    "adadelta": (lambda: popart.Adaptive({"defaultLearningRate": (1.0, False), "defaultAlpha": (0.9, True),
                                          "defaultEps": (1e-6, True)}, R.AdaDelta),
                 lambda: _torch(lambda p: torch.optim.Adadelta(p, lr=1.0, rho=0.9, eps=1e-6))),
    "sgd_nesterov": (lambda: popart.SGD({"defaultLearningRate": (LR, False), "defaultMomentum": (0.9, True),
                                         "nesterov": (True, True)}),
                     lambda: _torch(lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9, nesterov=True))),
    "sgd_dampening_weight_decay": (lambda: popart.SGD({"defaultLearningRate": (LR, False),
                                                       "defaultMomentum": (0.9, True),
                                                       "defaultDampening": (0.3, True),
                                                       "defaultWeightDecay": (0.05, True)}), _sgd_popart),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_optimizer_matches_reference(name):
    make, ref = CASES[name]
    w, v = _train(make())
    np.testing.assert_allclose(w, ref(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(v, w, rtol=1e-6)      # same values, same update


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_per_weight_values(kind):
    if kind == "sgd":
        opt = popart.SGD({"defaultLearningRate": (LR, False)})
    else:
        opt = popart.Adam({"defaultLearningRate": (LR, False)})
    opt.insertSpecific("w", {"learningRate": (0.0, False)})
    w, v = _train(opt)
    np.testing.assert_array_equal(w, W0)
    assert not np.allclose(v, W0)


def test_update_optimizer_from_host():
    w, _ = _train(popart.SGD({"defaultLearningRate": (LR, False)}), steps=3,
                  update=popart.SGD({"defaultLearningRate": (0.0, False)}))
    once = W0 - LR * _grad(W0.astype(np.float64))       # one step at LR, then two at 0
    np.testing.assert_allclose(w, once, rtol=1e-5)
    with pytest.raises(popart.popart_exception, match="Values are constant but do not match"):
        _train(popart.SGD({"defaultLearningRate": (LR, True)}), steps=2,
               update=popart.SGD({"defaultLearningRate": (0.0, True)}))
