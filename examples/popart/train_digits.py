"""Train a small convolutional classifier on scikit-learn's digits with PopART (the pattern of
Graphcore's ``popart_mnist.py`` tutorial: Builder, ``nllloss``, ``TrainingSession``,
``batchesPerStep`` batches per ``run``), then test it with an ``InferenceSession`` made from the
trained ONNX model (``modelToHost``).

    python examples/popart/train_digits.py [--optimizer constsgd|sgd|adam] [--epochs N] [--seed S]
                                           [--replicas R] [--accumulation A] [--pipeline]

Model: conv 3x3 (8 channels, pad 1) -> relu -> max pool 2x2 -> flatten -> matmul 128x10 + bias ->
softmax -> nllloss (Sum over the micro-batch, as the tutorial). 1,437 training and 360 test images
(8x8, scaled to [0, 1]; stratified split).

One recipe for every variant, as a user scaling the script out would keep it: a weight update
always takes the same ``BATCH`` = 32 images, in the same order (one permutation of the training set
per epoch, from the seed), with the same learning-rate schedule (:data:`SCHEDULE`: 30 epochs at the
optimizer's rate, then 10 at a tenth of it; 44 updates an epoch). With
``--replicas R`` (graph replication, gradients all-reduced) and ``--accumulation A`` (gradient
accumulation) the micro-batch is ``32 / (R A)``; PopART's default
``accumulationAndReplicationReductionType`` Sum adds the micro-batches' gradients, so an update is
the gradient of the Sum loss over the same 32 images as without scale-out and the optimizer's
hyper-parameters carry over unchanged. ``--pipeline`` puts the convolution on IPU 0 (pipeline stage
0) and the classifier on IPU 1 (stage 1) and pipelines the micro-batches of a ``run``: with
accumulation the pipeline flushes before each update (the same updates again); without it the
weights update every micro-batch of 32 while later micro-batches are in flight (PopART's
continuous pipelining, stale weights), the one variant whose trajectory differs by construction.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

import numpy as np
import popart

#: Images per weight update (the combined batch: micro-batch x replicas x accumulation factor).
BATCH = 32


def data():
    """Train and test splits of the digits (fixed: stratified, 20 % test, seed 0, as
    ``examples/poptorch/digits.py``):
    images ``[n, 1, 8, 8]`` float32 in [0, 1], labels int32."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    return train_test_split(x, d.target.astype(np.int32), test_size=0.2, random_state=0, stratify=d.target)


def model(seed: int = 0, pipeline: bool = False, batch: int | None = None):
    """The classifier: (builder, image id, label id, probabilities id, loss id). ``batch``: the
    micro-batch (default :data:`BATCH`); ``seed``: of the initial weights; ``pipeline``: the
    convolution on virtual graph / pipeline stage 0, the classifier on 1."""
    batch = batch or BATCH
    rng = np.random.default_rng(seed)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [batch, 1, 8, 8]), "image")
    y = b.addInputTensor(popart.TensorInfo("INT32", [batch]), "label")
    w1 = b.addInitializedInputTensor((rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32), "conv_w")
    b1 = b.addInitializedInputTensor(np.zeros(8, np.float32), "conv_b")
    w2 = b.addInitializedInputTensor((rng.standard_normal((128, 10)) * 0.1).astype(np.float32), "fc_w")
    b2 = b.addInitializedInputTensor(np.zeros(10, np.float32), "fc_b")
    with _stage(b, 0, pipeline):
        h = b.aiOnnx.relu([b.aiOnnx.conv([x, w1, b1], dilations=[1, 1], pads=[1, 1, 1, 1], strides=[1, 1])])
        h = b.aiOnnx.maxpool([h], num_outputs=1, kernel_shape=[2, 2], strides=[2, 2])[0]
    with _stage(b, 1, pipeline):
        h = b.aiOnnx.flatten([h], axis=1)
        probs = b.aiOnnx.softmax([b.aiOnnx.add([b.aiOnnx.matmul([h, w2]), b2])], axis=1)
        loss = b.aiGraphcore.nllloss([probs, y], popart.ReductionType.Sum)
    b.addOutputTensor(probs)
    return b, x, y, probs, loss


@contextlib.contextmanager
def _stage(b, i: int, on: bool):
    if not on:
        yield
        return
    with b.virtualGraph(i), b.pipelineStage(i):
        yield


#: The optimizers, by name: ``factor`` scales the learning rate (the schedule's). SGD's 0.001 with
#: momentum 0.9 steps like ConstSGD's 0.01 (lr / (1 - momentum)).
OPTIMIZERS = {
    "constsgd": lambda factor=1.0: popart.ConstSGD(0.01 * factor),
    "sgd": lambda factor=1.0: popart.SGD({"defaultLearningRate": (0.001 * factor, False),
                                          "defaultMomentum": (0.9, True)}),
    "adam": lambda factor=1.0: popart.Adam({"defaultLearningRate": (0.005 * factor, False)}),
}
#: The learning-rate schedule of every variant: (epochs, factor of the optimizer's learning rate).
SCHEDULE = ((30, 1.0), (10, 0.1))
WEIGHTS = ("conv_w", "conv_b", "fc_w", "fc_b")


def evaluate(path: str, probs: str, x: str, y: str, xte: np.ndarray, yte: np.ndarray, batch: int) -> float:
    """Top-1 accuracy of the ONNX model at ``path`` (input batch ``batch``) on the first
    ``len(xte) // BATCH * BATCH`` test images (352 of 360: the same images for every micro-batch
    dividing :data:`BATCH`), through an ``InferenceSession``."""
    n = len(xte) // BATCH * BATCH
    inf = popart.InferenceSession(path, popart.DataFlow(n // batch, {probs: popart.AnchorReturnType("All")}),
                                  popart.DeviceManager().createIpuModelDevice({}))
    inf.prepareDevice()
    out = inf.initAnchorArrays()
    inf.run(popart.PyStepIO({x: np.ascontiguousarray(xte[:n]), y: np.ascontiguousarray(yte[:n])}, out))
    return float((out[probs].reshape(n, 10).argmax(-1) == yte[:n]).mean())


def train(optimizer: str = "constsgd", epochs: int | None = None, seed: int = 0, replicas: int = 1, accumulation: int = 1,
          pipeline: bool = False, on_epoch=None) -> dict:
    """Train with :data:`SCHEDULE` (or ``epochs`` at the optimizer's learning rate), then test on
    352 of the 360 test images (:func:`evaluate`). ``seed``: of the initial weights and of the
    data order. ``on_epoch(epoch, session)``: called after each epoch's ``run``.

    The learning rate changes between phases as a PopART user changes it: a non-const one
    (SGD, Adam) with ``updateOptimizerFromHost``, keeping the optimizer state; ConstSGD's is
    compiled in, so the next phase is a new ``TrainingSession`` given the trained weights
    (``readWeights`` / ``writeWeights``; ConstSGD has no state to carry).

    Returns ``{"losses": mean loss per image per epoch, "test_accuracy": ..., "cycles": predicted
    IPU cycles of one run (an epoch)}``. Raises ``ValueError`` if ``BATCH`` is not a multiple
    of ``replicas * accumulation``."""
    if BATCH % (replicas * accumulation):
        raise ValueError(f"replicas x accumulation ({replicas * accumulation}) must divide the batch ({BATCH})")
    xtr, xte, ytr, yte = data()
    micro = BATCH // (replicas * accumulation)
    b, x, y, probs, loss = model(seed, pipeline, micro)
    schedule = ((epochs, 1.0),) if epochs else SCHEDULE
    steps = len(xtr) // BATCH
    df = popart.DataFlow(steps, {loss: popart.AnchorReturnType("All")})
    opts = popart.SessionOptions()
    if replicas > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = replicas
    if accumulation > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = accumulation
    if pipeline:
        opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        opts.enablePipelining = True

    def session(factor, weights=None):
        dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas * (2 if pipeline else 1)})
        s = popart.TrainingSession(b.getModelProto(), df, loss, OPTIMIZERS[optimizer](factor), dev, userOptions=opts)
        s.prepareDevice()
        if weights is not None:
            s.writeWeights(popart.PyWeightsIO(weights))
        s.weightsFromHost()
        return s

    s = session(schedule[0][1])
    anchors = s.initAnchorArrays()
    rng = np.random.default_rng(seed)
    losses = []
    epoch = 0
    for phase, (n, factor) in enumerate(schedule):
        if phase and optimizer == "constsgd":
            s.weightsToHost()
            w = {k: np.zeros(s.getInfo(k).shape(), np.float32) for k in WEIGHTS}
            s.readWeights(popart.PyWeightsIO(w))
            s = session(factor, w)
            anchors = s.initAnchorArrays()
        elif phase:
            s.updateOptimizerFromHost(OPTIMIZERS[optimizer](factor))
        for _ in range(n):
            order = rng.permutation(len(xtr))[:steps * BATCH]
            # [steps * BATCH] images in update order: run splits each update's 32 into [A, R, micro]
            s.run(popart.PyStepIO({x: np.ascontiguousarray(xtr[order]), y: np.ascontiguousarray(ytr[order])},
                                  anchors))
            losses.append(float(anchors[loss].sum()) / (steps * BATCH))
            if on_epoch is not None:
                on_epoch(epoch, s)
            epoch += 1
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "trained.onnx")
        s.modelToHost(path)
        accuracy = evaluate(path, probs, x, y, xte, yte, micro)
    return {"losses": losses, "test_accuracy": accuracy, "cycles": s.getCycleCount()}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="constsgd")
    p.add_argument("--epochs", type=int, default=None, help="this many at the optimizer's learning rate, in place of "
                   f"the schedule {SCHEDULE}")
    p.add_argument("--seed", type=int, default=0, help="of the initial weights and the data order")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--pipeline", action="store_true", help="pipeline over 2 IPUs")
    a = p.parse_args()
    r = train(a.optimizer, a.epochs, a.seed, replicas=a.replicas, accumulation=a.accumulation, pipeline=a.pipeline)
    print("loss per epoch:", " ".join(f"{v:.3f}" for v in r["losses"]))
    print(f"test accuracy: {r['test_accuracy']:.1%}; predicted IPU cycles of the last epoch's run: {r['cycles']:,}")
