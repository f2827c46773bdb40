"""Train a small convolutional classifier on scikit-learn's digits with PopART (the pattern of
Graphcore's ``popart_mnist.py`` tutorial: Builder, ``nllloss``, ``TrainingSession``,
``batchesPerStep`` batches per ``run``), then test it with an ``InferenceSession`` made from the
trained ONNX model (``modelToHost``).

    python examples/popart/train_digits.py [--optimizer constsgd|sgd|adam] [--epochs N]
                                           [--replicas R] [--accumulation A] [--pipeline]

Model: conv 3x3 (8 channels, pad 1) -> relu -> max pool 2x2 -> flatten -> matmul 128x10 + bias ->
softmax -> nllloss (Sum over the batch, as the tutorial). 1,437 training and 360 test images
(8x8, scaled to [0, 1]); micro-batch 32. With ``--replicas R`` (graph replication, gradients
all-reduced over the replicas) and ``--accumulation A`` (gradient accumulation) a weight update
takes ``32 R A`` images and ``run`` is fed ``[steps, A, R, 32, ...]`` arrays; the gradients are
meaned over replicas and micro-batches (``accumulationAndReplicationReductionType`` Mean), so the
hyper-parameters carry over, and the default number of epochs is ``8 R A``: the same number of
weight updates as the single-replica run. ``--pipeline`` puts the convolution on IPU 0 (pipeline
stage 0) and the classifier on IPU 1 (stage 1) and pipelines the batches of a step (without
accumulation the weights update every micro-batch, with PopART's stale weights).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

import numpy as np
import popart

BATCH = 32


def data(seed: int = 0):
    """Train and test splits of the digits: images ``[n, 1, 8, 8]`` float32 in [0, 1], labels int32."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    return train_test_split(x, d.target.astype(np.int32), test_size=0.2, random_state=seed, stratify=d.target)


def model(seed: int = 0, pipeline: bool = False):
    """The classifier: (builder, image id, label id, probabilities id, loss id). ``pipeline``: the
    convolution on virtual graph / pipeline stage 0, the classifier on 1."""
    rng = np.random.default_rng(seed)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [BATCH, 1, 8, 8]), "image")
    y = b.addInputTensor(popart.TensorInfo("INT32", [BATCH]), "label")
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


OPTIMIZERS = {
    "constsgd": lambda: popart.ConstSGD(0.01),
    "sgd": lambda: popart.SGD({"defaultLearningRate": (0.005, False), "defaultMomentum": (0.9, True)}),
    "adam": lambda: popart.Adam({"defaultLearningRate": (0.01, False)}),
}


def train(optimizer: str = "constsgd", epochs: int | None = None, seed: int = 0, replicas: int = 1, accumulation: int = 1,
          pipeline: bool = False) -> dict:
    """Train, then test. Returns ``{"losses": mean loss per image per epoch, "test_accuracy": ...,
    "cycles": predicted IPU cycles of one run (an epoch)}``."""
    xtr, xte, ytr, yte = data(seed)
    b, x, y, probs, loss = model(seed, pipeline)
    epochs = epochs or 8 * replicas * accumulation
    per_update = BATCH * replicas * accumulation
    steps = len(xtr) // per_update
    df = popart.DataFlow(steps, {loss: popart.AnchorReturnType("All")})
    opts = popart.SessionOptions()
    if replicas > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = replicas
    if accumulation > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = accumulation
    opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    if pipeline:
        opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        opts.enablePipelining = True
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas * (2 if pipeline else 1)})
    s = popart.TrainingSession(b.getModelProto(), df, loss, OPTIMIZERS[optimizer](), dev, userOptions=opts)
    s.prepareDevice()
    s.weightsFromHost()
    anchors = s.initAnchorArrays()
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(xtr))[:steps * per_update]
        s.run(popart.PyStepIO({x: np.ascontiguousarray(xtr[order]), y: np.ascontiguousarray(ytr[order])}, anchors))
        losses.append(float(anchors[loss].mean()) / BATCH)
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "trained.onnx")
        s.modelToHost(path)
        n = len(xte) // BATCH * BATCH
        inf = popart.InferenceSession(path, popart.DataFlow(n // BATCH, {probs: popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createIpuModelDevice({}))
        inf.prepareDevice()
        out = inf.initAnchorArrays()
        inf.run(popart.PyStepIO({x: np.ascontiguousarray(xte[:n]), y: np.ascontiguousarray(yte[:n])}, out))
        pred = out[probs].reshape(n, 10).argmax(-1)
    return {"losses": losses, "test_accuracy": float((pred == yte[:n]).mean()), "cycles": s.getCycleCount()}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="constsgd")
    p.add_argument("--epochs", type=int, default=None, help="default 8 x replicas x accumulation")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--pipeline", action="store_true", help="pipeline over 2 IPUs")
    a = p.parse_args()
    r = train(a.optimizer, a.epochs, replicas=a.replicas, accumulation=a.accumulation, pipeline=a.pipeline)
    print("loss per epoch:", " ".join(f"{v:.3f}" for v in r["losses"]))
    print(f"test accuracy: {r['test_accuracy']:.1%}; predicted IPU cycles of the last epoch's run: {r['cycles']:,}")
