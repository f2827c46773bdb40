"""Every ``popart.AdamMode`` and the Adaptive modes RMSProp / AdaGrad with every
``WeightDecayMode``, against PopART's documented update equations (``adam.hpp`` /
``adaptive.hpp``) computed in float64 numpy, and ``updateOptimizerFromHost`` for each optimizer
type (issue 35, "Optimizers complete"). The model is :mod:`test_popart_optimizer_parity`'s
``loss = sum(x * w * w)``."""

from __future__ import annotations

import numpy as np
import pytest

import popart
from test_popart_optimizer_parity import LR, W0, _grad, _train

WD, B1, B2, EPS = 0.1, 0.9, 0.999, 1e-6
A = popart.AdamMode


def _adam_ref(mode: str, decay: bool, steps: int = 3) -> np.ndarray:
    """PopART's Adam family: ``g (+ wd w in L2)``; ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2)
    g^2`` (AdaMax ``max(b2 v, |g|)``); bias-corrected unless ``NoBias``; ``r = m / (sqrt(v) +
    eps)`` (AdaMax ``m / (v + eps)``) ``+ wd w`` in Decay mode; Lamb scales ``lr`` by
    ``||w|| / ||r||``."""
    w = W0.astype(np.float64)
    m, v = np.zeros(3), np.zeros(3)
    for t in range(1, steps + 1):
        g = _grad(w) + (0 if decay else WD * w)
        m = B1 * m + (1 - B1) * g
        v = np.maximum(B2 * v, np.abs(g)) if mode == "AdaMax" else B2 * v + (1 - B2) * g * g
        bias = "NoBias" not in mode
        mc = m / (1 - B1 ** t) if bias else m
        vc = v / (1 - B2 ** t) if bias and mode != "AdaMax" else v
        r = mc / (vc + EPS) if mode == "AdaMax" else mc / (np.sqrt(vc) + EPS)
        if decay:
            r = r + WD * w
        lr = LR
        if mode.startswith("Lamb"):
            r1, r2 = np.linalg.norm(w), np.linalg.norm(r)
            lr = LR * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0)
        w = w - lr * r
    return w


def _adaptive_ref(mode: str, decay: bool, steps: int = 3, alpha: float = 0.9) -> np.ndarray:
    """PopART's Adaptive: ``g (+ wd w in L2)``; RMSProp ``v = a v + (1 - a) g^2``, AdaGrad
    ``v += g^2``; ``w -= lr (g / (sqrt(v) + eps) + wd w in Decay)``."""
    w = W0.astype(np.float64)
    v = np.zeros(3)
    for _ in range(steps):
        g = _grad(w) + (0 if decay else WD * w)
        v = v + g * g if mode == "AdaGrad" else alpha * v + (1 - alpha) * g * g
        w = w - LR * (g / (np.sqrt(v) + EPS) + (WD * w if decay else 0))
    return w


MODES = ["Adam", "AdamNoBias", "AdaMax", "Lamb", "LambNoBias"]
DECAY = {"Decay": True, "L2Regularization": False}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("wd_mode", sorted(DECAY))
def test_adam_modes_with_weight_decay_modes(mode, wd_mode):
    opt = popart.Adam({"defaultLearningRate": (LR, False), "defaultWeightDecay": (WD, True),
                       "defaultBeta1": (B1, True), "defaultBeta2": (B2, True), "defaultEps": (EPS, True)},
                      getattr(A, mode), getattr(popart.WeightDecayMode, wd_mode))
    w, v = _train(opt)
    np.testing.assert_allclose(w, _adam_ref(mode, DECAY[wd_mode]), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(v, w, rtol=1e-6)


@pytest.mark.parametrize("mode", ["RMSProp", "AdaGrad"])
@pytest.mark.parametrize("wd_mode", sorted(DECAY))
def test_adaptive_modes_with_weight_decay_modes(mode, wd_mode):
    opt = popart.Adaptive({"defaultLearningRate": (LR, False), "defaultWeightDecay": (WD, True),
                           "defaultAlpha": (0.9, True), "defaultEps": (EPS, True)},
                          getattr(popart.AdaptiveMode, mode), getattr(popart.WeightDecayMode, wd_mode))
    w, _ = _train(opt)
    np.testing.assert_allclose(w, _adaptive_ref(mode, DECAY[wd_mode]), rtol=2e-5, atol=1e-6)


UPDATES = {
    "sgd_momentum": lambda lr: popart.SGD({"defaultLearningRate": (lr, False), "defaultMomentum": (0.9, True)}),
    "adam": lambda lr: popart.Adam({"defaultLearningRate": (lr, False)}),
    "lamb": lambda lr: popart.Adam({"defaultLearningRate": (lr, False)}, A.Lamb),
    "rmsprop": lambda lr: popart.Adaptive({"defaultLearningRate": (lr, False)}),
    "adagrad": lambda lr: popart.Adaptive({"defaultLearningRate": (lr, False)}, popart.AdaptiveMode.AdaGrad),
}


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_update_optimizer_from_host_each_optimizer(name):
    """A learning rate of 0 from the second step on (``updateOptimizerFromHost``): the weights
    stay where the first step put them; a learning rate kept gives the 3-step result instead."""
    make = UPDATES[name]
    once, _ = _train(make(LR), steps=1)
    frozen, _ = _train(make(LR), steps=3, update=make(0.0))
    np.testing.assert_allclose(frozen, once, rtol=1e-6)
    kept, _ = _train(make(LR), steps=3, update=make(LR))
    assert not np.allclose(kept, once)


def test_adam_moments_round_alike_on_both_execution_paths(monkeypatch):
    """AdamNoBias divides by ``sqrt((1 - beta2) g^2)``, so it shows how ``1 - beta2`` is taken:
    the IR executor and the device-storage emulation must take it alike (bit for bit)."""
    out = {}
    for mode in ("ir", "device"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        opt = popart.Adam({"defaultLearningRate": (LR, False), "defaultWeightDecay": (WD, True),
                           "defaultBeta1": (B1, True), "defaultBeta2": (B2, True), "defaultEps": (EPS, True)},
                          A.AdamNoBias, popart.WeightDecayMode.Decay)
        out[mode] = _train(opt)[0]
    np.testing.assert_array_equal(out["ir"], out["device"])
