"""Host kernels of the weight update ops of a training session (``ai.graphcore``), for the IR
executor (:mod:`openipu.popart.execute`).

The equations are those of :mod:`openipu.popart.transforms.optimizer` and their PopLibs lowering
(:mod:`openipu.popart.lowering.varupdate`): expressions compute in FLOAT and the result is cast to
the written tensor's type (fp16 weights with fp32 state). These ops write their first input in
place (``IrOp.modifies``; ``AdamUpdater`` its step counter, input 2): unlike the other kernels of
this package, their kernels update those input tensors in place and return them as the aliasing
outputs. They are never constant-folded (their inputs are variables) and have no generic
lowering, so only the IR executor runs them.

A compound scalar is the op's attribute (named by its role in ``scalar_names``) when const, else a
tensor input after the ``n_tensors`` tensor inputs.
"""

from __future__ import annotations

import torch

from openipu.popart.onnx_ops import onnx_op

GC = "ai.graphcore"


def _scalars(inputs, attrs) -> dict:
    """role -> float or 0-d float tensor."""
    out = {}
    n = int(attrs["n_tensors"])
    for k, s in enumerate(attrs.get("scalar_names", [])):
        i = n + k
        if i < len(inputs) and inputs[i] is not None:
            out[s] = inputs[i].reshape(()).float()
        else:
            out[s] = float(attrs[s])
    return out


def _f(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _is(v, value: float) -> bool:
    return isinstance(v, float) and v == value


def _one(v) -> bool:
    """``v`` (a const or a one-element tensor) is exactly 1.0: a product with it is its other
    factor, bit for bit (NaN and infinities included), so the kernel may skip it."""
    if isinstance(v, torch.Tensor):
        return v.numel() == 1 and bool(v.reshape(()) == 1.0)
    return isinstance(v, float) and v == 1.0


#: the second factor of :func:`add_product_`'s ``addcmul_``
_ONE = torch.ones(())


def add_product_(dst: torch.Tensor, x: torch.Tensor, scale, sign: float = 1.0) -> torch.Tensor:
    """``dst += sign * (scale * x)`` in place and in one pass, rounded as the two separate ops
    round (the product rounded to float32, then the sum): ``dst.addcmul_(x, 1, value=sign *
    scale)``, which computes ``dst + (value * x) * 1``; the product by 1 is exact, so whether or not
    the kernel fuses that multiply with the add, the result is the rounded product added to ``dst``
    (a fused ``dst.add_(x, alpha=scale)`` rounds once and differs in ~6 % of the elements).
    ``dst`` and ``x``: float32 tensors of one shape (``x`` may be strided); ``scale``: a float or
    a 0-d float32 tensor; ``sign``: 1.0 or -1.0 (exact). Returns ``dst``."""
    value = float(scale) if isinstance(scale, torch.Tensor) else scale
    one = _ONE if x.device.type == "cpu" else _ONE.to(x.device)     # the executor's torch device
    return dst.addcmul_(x, one, value=sign * value)


def _write(dst: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    dst.copy_(value.to(dst.dtype))
    return dst


def _grad_term(inputs, sc, g_index: int, w_index: int) -> torch.Tensor:
    s = _f(inputs[g_index])
    if "gradientScaling" in sc and not _is(sc["gradientScaling"], 1.0):
        s = s * sc["gradientScaling"]
    if "weightDecay" in sc:
        s = s + sc["weightDecay"] * _f(inputs[w_index])
    return s


@onnx_op("SGD0VarUpdate", domain=GC)
def sgd0(inputs, attrs, opset):
    """``w = w * wdsf0 - slr0 * g``."""
    w, g = inputs[0], inputs[1]
    s = _scalars(inputs, attrs)
    return [_write(w, _f(w) * s["weightDecayScaleFactor0"] - s["scaledLearningRate0"] * _f(g))]


@onnx_op("SGD1Accumulate", domain=GC)
def sgd1_accumulate(inputs, attrs, opset):
    """``v += dpsf1 * g``."""
    v, g = inputs[0], inputs[1]
    s = _scalars(inputs, attrs)
    return [_write(v, _f(v) + s["dampeningScaleFactor1"] * _f(g))]


@onnx_op("SGD1VarUpdate", "SGD2VarUpdate", domain=GC)
def sgd1_var_update(inputs, attrs, opset):
    """``w -= slr1 * v`` (nesterov: ``w -= slr1 * (mm v + ngsf1 a + nwd1 w)``)."""
    w, v = inputs[0], inputs[1]
    s = _scalars(inputs, attrs)
    step = _f(v)
    if "nesterovGradScaleFactor1" in attrs.get("scalar_names", []):
        x = s["momentum"] * _f(v) + s["nesterovGradScaleFactor1"] * _f(inputs[2])
        if not _is(s["nesterovWeightDecay1"], 0.0):
            x = x + s["nesterovWeightDecay1"] * _f(w)
        step = x.to(w.dtype).float()
    if w.dtype == torch.float32 and step.dtype == torch.float32:    # in place, the same roundings: w - (slr1 * v)
        return [add_product_(w, step, s["scaledLearningRate1"], -1.0)]
    return [_write(w, _f(w) - s["scaledLearningRate1"] * step)]


@onnx_op("SGD1AcclUpdate", "SGD2PartialAcclUpdate", domain=GC)
def sgd1_accl_update(inputs, attrs, opset):
    """``v = smm1 * v + swd1 * w``."""
    v = inputs[0]
    s = _scalars(inputs, attrs)
    smm, swd = s["scaledMomentum1"], s["scaledWeightDecay1"]
    if v.dtype == torch.float32:        # in place, the same roundings: (v smm) + (swd w)
        v.mul_(smm)
        return [v if _is(swd, 0.0) else add_product_(v, _f(inputs[1]), swd)]
    x = _f(v) * smm
    if not _is(swd, 0.0):
        x = x + swd * _f(inputs[1])
    return [_write(v, x)]


@onnx_op("Accumulate", domain=GC)
def accumulate(inputs, attrs, opset):
    """``accl = f(accl, s)`` by ``accumulationType``, ``s = gs g (+ wd w)``."""
    acc = inputs[0]
    sc = _scalars(inputs, attrs)
    kind = attrs["accumulationType"]
    if kind == "Mean":
        sc["factor"] = _f(inputs[2]).reshape(())
    if acc.dtype == torch.float32 and kind in ("Add", "DampenedAdd") and "rescaleRatio" not in sc:
        s = _grad_term(inputs, sc, 1, 2)        # in place, the same roundings: a + (f s)
        f = sc.get("factor", 1.0)
        if kind == "Add" or _one(f):
            return [acc.add_(s)]
        return [add_product_(acc, s, f) if s.dtype == torch.float32 else acc.add_(f * s)]
    a = _f(acc)
    if "rescaleRatio" in sc:
        r = sc["rescaleRatio"]
        a = a * (r * r if kind == "MovingAverageSquare" else r)
    s = _grad_term(inputs, sc, 1, 2)
    f = sc.get("factor", 1.0)
    x = {"Add": lambda: a + s, "DampenedAdd": lambda: a + f * s, "DampenedAddSquare": lambda: a + f * s * s,
         "DecayAdd": lambda: f * a + s, "DecayAddSquare": lambda: f * a + s * s,
         "Mean": lambda: (f * a + s) / (f + 1.0),
         "MovingAverage": lambda: f * a + (1.0 - f) * s,
         "MovingAverageSquare": lambda: f * a + (1.0 - f) * s * s,
         "Infinity": lambda: torch.maximum(f * a, s.abs())}[kind]()
    return [_write(acc, x)]


@onnx_op("AccumulatorUpdate", domain=GC)
def accumulator_update(inputs, attrs, opset):
    """Zero the accumulator."""
    return [inputs[0].zero_()]


@onnx_op("ReplicatedAllReduceInplace", "ReplicatedAllReduce", domain=GC)
def replicated_all_reduce(inputs, attrs, opset):
    """One replica: the sum (or mean) over replicas is the tensor itself."""
    return [inputs[0]]


@onnx_op("AdamUpdater", domain=GC)
def adam_updater(inputs, attrs, opset):
    """``t += 1``; ``x = mc / (sqrt(vc) + eps) [+ wd w]`` with the mode's bias corrections."""
    m, v, t = inputs[0], inputs[1], inputs[2]
    sc = _scalars(inputs, attrs)
    mode = attrs["mode"]
    t.add_(1)
    mh, vh, step = _f(m), _f(v), _f(t)
    if attrs.get("eps_before_correction") and mode == "Adam":    # Keras's Adam: eps added to sqrt(v)
        b1, b2 = (torch.as_tensor(sc[k], dtype=torch.float32, device=t.device) for k in ("beta1", "beta2"))
        x = mh / (torch.sqrt(vh) + sc["eps"]) * (torch.sqrt(1.0 - torch.pow(b2, step)) / (1.0 - torch.pow(b1, step)))
        if "weightDecay" in sc:
            x = x + sc["weightDecay"] * _f(inputs[3])
        return [x]
    if mode in ("Adam", "Lamb", "AdaMax"):
        mh = mh / (1.0 - torch.pow(torch.as_tensor(sc["beta1"], dtype=torch.float32, device=t.device), step))
    if mode in ("Adam", "Lamb"):
        vh = vh / (1.0 - torch.pow(torch.as_tensor(sc["beta2"], dtype=torch.float32, device=t.device), step))
    x = mh / ((vh if mode == "AdaMax" else torch.sqrt(vh)) + sc["eps"])
    if "weightDecay" in sc:
        x = x + sc["weightDecay"] * _f(inputs[3])
    return [x]          # FLOAT; the executor casts it to the output's (the weight's) type


@onnx_op("LambSquare", domain=GC)
def lamb_square(inputs, attrs, opset):
    """The sum of squares, in FLOAT."""
    x = _f(inputs[0])
    return [(x * x).sum()]


@onnx_op("AdamVarUpdate", domain=GC)
def adam_var_update(inputs, attrs, opset):
    """``w -= lr * x``; Lamb: ``* min(sqrt(r1sq), mwn) / sqrt(r2sq)`` (1 when either is 0)."""
    w, x = inputs[0], inputs[1]
    sc = _scalars(inputs, attrs)
    lr = sc["learningRate"]
    if int(attrs["n_tensors"]) == 4:
        r1, r2 = torch.sqrt(_f(inputs[2])), torch.sqrt(_f(inputs[3]))
        phi = torch.minimum(r1, torch.as_tensor(sc["maxWeightNorm"], dtype=torch.float32, device=r1.device))
        ratio = torch.where((phi > 0) & (r2 > 0), phi / r2, torch.ones_like(r2))
        lr = ratio * lr
    return [_write(w, _f(w) - lr * _f(x))]


@onnx_op("RMSPropUpdater", domain=GC)
def rmsprop_updater(inputs, attrs, opset):
    """``x = s / (sqrt(v1 [- v2^2]) + eps)`` (TF variant ``s / sqrt(v1 [- v2^2] + eps)``)."""
    sc = _scalars(inputs, attrs)
    centered = bool(attrs.get("centered", 0))
    s = _grad_term(inputs, sc, 0, 3 if centered else 2)
    d = _f(inputs[1])
    if centered:
        v2 = _f(inputs[2])
        d = d - v2 * v2
    x = s / (torch.sqrt(d + sc["eps"]) if attrs.get("tf_variant") else torch.sqrt(d) + sc["eps"])
    return [x]          # FLOAT; the executor casts it to the output's type


@onnx_op("AdaDeltaUpdater", domain=GC)
def adadelta_updater(inputs, attrs, opset):
    """``x = s * sqrt(v2 + eps) / sqrt(v1 + eps)``."""
    sc = _scalars(inputs, attrs)
    s = _grad_term(inputs, sc, 0, 3)
    x = s * torch.sqrt(_f(inputs[2]) + sc["eps"]) / torch.sqrt(_f(inputs[1]) + sc["eps"])
    return [x]          # FLOAT; the executor casts it to the output's type


@onnx_op("ScaledVarUpdate", domain=GC)
def scaled_var_update(inputs, attrs, opset):
    """``w -= lr * (x + wd * w)`` (no ``wd`` term in L2 mode; ``lr`` 1 when absent)."""
    w, x = inputs[0], inputs[1]
    sc = _scalars(inputs, attrs)
    lr = sc.get("learningRate", 1.0)
    upd = _f(x)
    if "weightDecay" in sc:
        upd = upd + sc["weightDecay"] * _f(w)
    return [_write(w, _f(w) - lr * upd)]


@onnx_op("CopyVarUpdate", domain=GC)
def copy_var_update(inputs, attrs, opset):
    """The variable takes the updater's value (a BatchNormalization's running statistics)."""
    return [_write(inputs[0], inputs[1])]
