"""Port of Graphcore's PopTorch pipelining tutorial (``tutorials/pytorch/pipelining/
mnist_pipeline.py``) to the simulated IPU, with scikit-learn's digits (:mod:`digits`, MNIST's
normalisation) in place of MNIST.

    python examples/poptorch/mnist_pipeline.py [--strategy pipelined|sharded] [--epochs 3]
        [--batch-size 4] [--device-iterations 10] [--gradient-accumulation 10]
        [--test-batch-size 3] [--learning-rate 0.001] [--offload-optimiser] [--debug]

As the tutorial: a CNN of two conv layers (10 and 20 filters, 5x5) and two linear layers, cut
into four ``poptorch.Block`` s ("B1" .. "B4", the loss in "B4") placed on IPUs 0 .. 3 by
``PipelinedExecution`` (with ``gradientAccumulation``: the micro-batches of one weight update flow
through the four stages) or ``ShardedExecution`` (one IPU at a time) of ``Stage`` s; training
with ``poptorch.optim.AdamW``, ``deviceIterations`` per call, ``_Popart.set
("defaultPrefetchBufferingDepth", 3)``; ``DataLoaderMode.Async`` loaders; optionally the
optimizer state off chip (``TensorLocations``). The inference model reuses the training
options through ``Options.clone()``, with gradient accumulation 1 and ``deviceIterations``
multiplied by the accumulation (the same micro-batches per call), and prints ``Accuracy on test
set: X%``. The training loaders are built with the accumulation even for the sharded strategy
(so a sharded call trains on micro-batches ``gradient-accumulation`` times larger), as the
tutorial does.

Digits: the defaults of ``--batch-size`` (40) and ``--test-batch-size`` (8) are lowered to 4 and 3
so that one call (``batch x deviceIterations x accumulation`` = 4,000 and 800 images in the
tutorial) fits in the 1,437 training and 360 test images: 3 training calls (30 weight updates)
per epoch and one test call of 300 images. Host times printed are the simulator's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from tqdm import tqdm

import poptorch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits import MNIST_NORMALIZE, Digits, accuracy  # noqa: E402

torch.manual_seed(0)   # deterministic results


def get_mnist_data(opts):
    """The training and test loaders (the digits in place of MNIST)."""
    options = poptorch.Options()
    options.Training.gradientAccumulation(opts.gradient_accumulation)
    options.deviceIterations(opts.device_iterations)
    training_data = poptorch.DataLoader(options, Digits(train=True, normalize=MNIST_NORMALIZE),
                                        batch_size=opts.batch_size, shuffle=True,
                                        mode=poptorch.DataLoaderMode.Async, num_workers=16)
    validation_data = poptorch.DataLoader(
        poptorch.Options().deviceIterations(opts.gradient_accumulation * opts.device_iterations),
        Digits(train=False, normalize=MNIST_NORMALIZE), batch_size=opts.test_batch_size, shuffle=True,
        drop_last=True, mode=poptorch.DataLoaderMode.Async, num_workers=16)
    return training_data, validation_data


class ConvLayer(nn.Module):
    def __init__(self, in_channels, num_filters, kernel_size, pool_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, num_filters, kernel_size=kernel_size)
        self.pool = nn.MaxPool2d(kernel_size=pool_size)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.pool(self.conv(x)))


class Network(nn.Module):
    """1x28x28 -> 10x12x12 -> 20x4x4 -> 256 -> 10 logits, one Block per layer."""

    def __init__(self):
        super().__init__()
        self.layer1 = ConvLayer(1, 10, 5, 2)
        self.layer2 = ConvLayer(10, 20, 5, 2)
        self.layer3 = nn.Linear(320, 256)
        self.layer3_act = nn.ReLU()
        self.layer4 = nn.Linear(256, 10)

    def forward(self, x):
        with poptorch.Block("B1"):
            x = self.layer1(x)
        with poptorch.Block("B2"):
            x = self.layer2(x)
        with poptorch.Block("B3"):
            x = self.layer3_act(self.layer3(x.view(-1, 320)))
        with poptorch.Block("B4"):
            x = self.layer4(x)
        return x


class TrainingModelWithLoss(nn.Module):
    """The network plus its cross-entropy loss, computed in the last block."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()

    def forward(self, args, labels=None):
        output = self.model(args)
        if labels is None:
            return output
        with poptorch.Block("B4"):
            loss = self.loss(output, labels)
        return output, loss


def train(training_model, training_data, opts):
    for epoch in range(1, opts.epochs + 1):
        print(f"Epoch {epoch}/{opts.epochs}")
        bar = tqdm(training_data, total=len(training_data))
        for data, labels in bar:
            preds, losses = training_model(data, labels)
            mean_loss = torch.mean(losses).item()
            acc = accuracy(preds, labels)
            bar.set_description(f"Loss:{mean_loss:0.4f} | Accuracy:{acc:0.2f}%")
        print(f"Loss:{mean_loss:0.4f} | Accuracy (last micro-batch):{acc:0.2f}%")


def test(inference_model, test_data):
    sum_acc = 0.0
    for data, labels in tqdm(test_data, total=len(test_data)):
        output = inference_model(data)
        sum_acc += accuracy(output, labels)
    print(f"Accuracy on test set: {sum_acc / len(test_data):0.2f}%")


def stages(strategy_class):
    return strategy_class(poptorch.Stage("B1").ipu(0), poptorch.Stage("B2").ipu(1),
                          poptorch.Stage("B3").ipu(2), poptorch.Stage("B4").ipu(3))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="MNIST (digits) training in PopTorch")
    p.add_argument("--batch-size", type=int, default=4, help="batch size for training (default: 4; tutorial: 40)")
    p.add_argument("--device-iterations", type=int, default=10, help="device iterations for training (default: 10)")
    p.add_argument("--gradient-accumulation", type=int, default=10, help="gradient accumulation count (default: 10)")
    p.add_argument("--test-batch-size", type=int, default=3, help="batch size for testing (default: 3; tutorial: 8)")
    p.add_argument("--epochs", type=int, default=3, help="number of epochs to train (default: 3)")
    p.add_argument("--learning-rate", type=float, default=0.001, help="learning rate (default: 0.001)")
    p.add_argument("--profile", action="store_true", help="write a profile (default: False)")
    p.add_argument("--profile-dir", type=str, default="./profile", help="where to save the profile")
    p.add_argument("--strategy", choices=["sharded", "pipelined"], default="pipelined", help="execution strategy")
    p.add_argument("--offload-optimiser", action="store_true", help="offload optimiser state")
    p.add_argument("--debug", action="store_true", help="print out the debug logging while running")
    opts = p.parse_args(argv)

    if opts.debug:
        poptorch.setLogLevel(1)   # DEBUG

    training_data, test_data = get_mnist_data(opts)
    model = Network()
    model_with_loss = TrainingModelWithLoss(model)
    options = poptorch.Options()
    options._Popart.set("defaultPrefetchBufferingDepth", 3)
    model_opts = options.deviceIterations(opts.device_iterations)
    if opts.strategy == "pipelined":
        model_opts.setExecutionStrategy(stages(poptorch.PipelinedExecution))
        model_opts.Training.gradientAccumulation(opts.gradient_accumulation)
    else:
        model_opts.setExecutionStrategy(stages(poptorch.ShardedExecution))

    if opts.offload_optimiser:
        # activations, weights and accumulators on chip; the optimizer state in remote buffers
        on_chip = poptorch.TensorLocationSettings().useOnChipStorage(True)
        model_opts.TensorLocations.setActivationLocation(on_chip)
        model_opts.TensorLocations.setWeightLocation(poptorch.TensorLocationSettings().useOnChipStorage(True))
        model_opts.TensorLocations.setAccumulatorLocation(poptorch.TensorLocationSettings().useOnChipStorage(True))
        model_opts.TensorLocations.setOptimizerLocation(poptorch.TensorLocationSettings().useOnChipStorage(False))

    if opts.profile:
        print("Profiling is enabled.")
        os.environ["POPLAR_ENGINE_OPTIONS"] = json.dumps({"autoReport.all": "true",
                                                          "autoReport.directory": opts.profile_dir})

    training_model = poptorch.trainingModel(model_with_loss, model_opts,
                                            optimizer=poptorch.optim.AdamW(model.parameters(), lr=opts.learning_rate))
    print("Training...")
    t0 = time.perf_counter()
    train(training_model, training_data, opts)
    print(f"Training host time: {time.perf_counter() - t0:.1f} s")

    # the same strategy and micro-batches per call for inference: accumulation 1, more iterations
    model_opts = model_opts.clone()
    model_opts.Training.gradientAccumulation(1)
    model_opts.deviceIterations(opts.device_iterations * opts.gradient_accumulation)
    inference_model = poptorch.inferenceModel(model, model_opts)
    training_model.detachFromDevice()
    print("Testing...")
    t0 = time.perf_counter()
    test(inference_model, test_data)
    print(f"Testing host time: {time.perf_counter() - t0:.1f} s")
    inference_model.detachFromDevice()


if __name__ == "__main__":
    main()
