"""Random ops and the session's random seed (PopART's ``RandomSetup`` transform).

The random ops that draw on the device are made to read one seed:

- ONNX ``Dropout`` in training (a TrainingSession, opset < 12 unless ``is_test`` (opset 6) is
  set, or opset >= 12 unless a constant ``training_mode`` input says false; any session with a
  constant true ``training_mode``) becomes ``ai.graphcore`` ``Dropout`` ``[x, seed]`` with the
  ``ratio`` and a ``seedModifier`` attribute, keeping its outputs (``output``, ``mask``). A ratio
  of 0 leaves the op alone (the identity);
- ``ai.graphcore`` ``ShapedDropout`` in a TrainingSession gets the seed as a second input (at
  inference it stays the identity);
- ONNX ``RandomNormal``, ``RandomUniform``, ``RandomNormalLike``, ``RandomUniformLike`` and
  ``Bernoulli`` without a ``seed`` attribute (in any session: PopART seeds every random op from
  the session's seed) become the ``ai.graphcore`` op of the same name with the seed as their
  last input, drawn like poprand (:mod:`openipu.popart.graphcore_ops`). With a ``seed``
  attribute they keep ONNX's fixed stream.

The seed is ``randomSeed___fromHost``, a ``UINT32 [2]`` device variable that
``session.setRandomSeed(seed)`` writes (the 64-bit seed's low and high words), initialised to a
random seed when the session is built. ``GetRandomSeed`` (the first op of every step) writes
``randomSeed___updated``: the seed with its first word incremented, in place, so that every
batch draws new masks while a given ``setRandomSeed`` value always gives the same sequence. Each
random op draws from the updated seed and its own ``seedModifier`` (1, 2, ... in model order),
and its gradient (``DropoutGrad``, a ``ShapedDropout`` of the gradient) uses the same seed and
modifier, so regenerates the forward op's mask instead of storing it (as PopART does).
"""

from __future__ import annotations

import numpy as np

from openipu.popart.errors import popart_exception

GRAPHCORE = "ai.graphcore"
SEED_ID = "randomSeed___fromHost"
UPDATED_ID = "randomSeed___updated"


def seed_words(seed: int) -> np.ndarray:
    """A 64-bit seed as the ``UINT32 [2]`` seed tensor's value (low word, high word)."""
    s = int(seed) & ((1 << 64) - 1)
    return np.array([s & 0xFFFFFFFF, s >> 32], np.uint32)


#: ONNX random generators seeded from the session's seed when they have no ``seed`` attribute
RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli")

_RUNTIME = object()


def _const_scalar(ir, tid):
    """The value of an optional scalar input: None when omitted, ``_RUNTIME`` when computed."""
    t = ir.tensors.get(tid) if tid else None
    if t is None:
        return None
    if t.kind != "Const":
        return _RUNTIME
    return np.asarray(t.value).reshape(-1)[0]


def _dropout_training(ir, op) -> tuple[bool, float]:
    """``(trains, ratio)`` of an ONNX Dropout op. A ratio or ``training_mode`` computed at run
    time leaves the op to its host kernel (not seeded)."""
    training = ir.training is not None
    if op.opset < 12:
        ratio = float(op.attrs.get("ratio", 0.5))
        if op.opset < 7:
            return training and not op.attrs.get("is_test", 0), ratio
        return training, ratio
    r = _const_scalar(ir, op.inputs[1] if len(op.inputs) > 1 else "")
    mode = _const_scalar(ir, op.inputs[2] if len(op.inputs) > 2 else "")
    if r is _RUNTIME or mode is _RUNTIME:
        return False, 0.0
    return (training if mode is None else bool(mode)), (0.5 if r is None else float(r))


def _detach(ir, op, tid):
    t = ir.tensors.get(tid) if tid else None
    if t is not None:
        t.consumers = [c for c in t.consumers if c is not op]


def apply(ir) -> str | None:
    """Seed the random ops of ``ir`` (see the module docstring); returns the seed tensor's id,
    or None when the model has no random op that needs one."""
    seeded = []
    for op in ir.ops:
        if op.domain == "" and op.op_type == "Dropout":
            trains, ratio = _dropout_training(ir, op)
            if not trains or ratio == 0:
                continue
            if not 0 <= ratio < 1:
                raise popart_exception(f"{ratio} ratio value {ratio} is not valid. Please use a value in the interval "
                                       "[0,1)")
            for x in op.inputs[1:]:
                _detach(ir, op, x)
            op.domain, op.op_type, op.opset = GRAPHCORE, "Dropout", 1
            op.inputs = op.inputs[:1]
            op.attrs = {"ratio": ratio, "__num_outputs__": op.attrs.get("__num_outputs__", len(op.outputs)),
                        "__node__": op.attrs.get("__node__", op.name)}
            seeded.append(op)
        elif op.domain == "" and op.op_type in RANDOM_OPS and "seed" not in op.attrs:
            op.domain, op.opset = GRAPHCORE, 1
            seeded.append(op)
        elif (op.domain, op.op_type) == (GRAPHCORE, "ShapedDropout") and ir.training is not None \
                and float(op.attrs.get("ratio", 0.5)) > 0:
            seeded.append(op)
    if not seeded:
        return None
    ir._add_tensor(SEED_ID, "UINT32", [2], "Variable", seed_words(np.random.SeedSequence().entropy))
    get = ir.add_op("GetRandomSeed", [SEED_ID], [(UPDATED_ID, "UINT32", [2])], domain=GRAPHCORE, opset=1,
                    name="GetRandomSeed", like=seeded[0], modifies=(0,))
    ir.ops.remove(get)
    ir.ops.insert(0, get)
    updated = get.outputs[0]
    for k, op in enumerate(seeded):
        keep = len(op.inputs) if op.op_type in RANDOM_OPS else 1
        op.inputs = op.inputs[:keep] + [updated]
        op.attrs["seedModifier"] = k + 1
        ir.tensors[updated].consumers.append(op)
    return SEED_ID
