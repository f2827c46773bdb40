"""Port of Graphcore's simple PopTorch MNIST application
(``simple_applications/pytorch/mnist/mnist_poptorch.py``) to the simulated IPU, with
scikit-learn's digits (:mod:`digits`, MNIST's normalisation) in place of MNIST.

    python examples/poptorch/mnist_simple.py [--batch-size 8] [--device-iterations 50]
        [--test-batch-size 80] [--epochs 10] [--lr 0.05]

As the application: two conv blocks (conv -> max pool -> ReLU; 32 and 64 filters) and two linear
layers with dropout and a softmax; a wrapper module adds ``CrossEntropyLoss`` when labels are
given (applied to the softmax output, as the original does). Training runs ``deviceIterations``
batches per call with ``OutputMode.All`` (so every batch's loss and prediction comes back) and a
plain ``torch.optim.SGD``; progress shows the mean of the returned losses. The training model is
detached, ``inferenceModel(model)`` with default options evaluates the test set in batches of
``--test-batch-size`` and prints ``Accuracy on test set: X%`` (the mean of the per-batch
accuracies, as the original). The original overrides ``--device-iterations`` with 50 after
parsing; here the flag is honoured (default 50).

On digits one call takes 8 x 50 = 400 of the 1,437 training images: 3 calls (150 weight updates)
per epoch instead of MNIST's 150 calls. The test loader (batch 80, ``drop_last``) sees 320 of the
360 test images. Host times printed are the simulator's wall time, not IPU predictions.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.optim as optim
from tqdm import tqdm

import poptorch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits import MNIST_NORMALIZE, Digits, accuracy  # noqa: E402


class Block(nn.Module):
    """conv (no padding) -> max pool -> ReLU."""

    def __init__(self, in_channels, num_filters, kernel_size, pool_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, num_filters, kernel_size=kernel_size)
        self.pool = nn.MaxPool2d(kernel_size=pool_size)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.pool(self.conv(x)))


class Network(nn.Module):
    """1x28x28 -> 32x13x13 -> 64x5x5 -> 128 (dropout 0.5) -> softmax over 10 classes."""

    def __init__(self):
        super().__init__()
        self.layer1 = Block(1, 32, 3, 2)
        self.layer2 = Block(32, 64, 3, 2)
        self.layer3 = nn.Linear(64 * 5 * 5, 128)
        self.layer3_act = nn.ReLU()
        self.layer3_dropout = nn.Dropout(0.5)
        self.layer4 = nn.Linear(128, 10)
        self.softmax = nn.Softmax(1)

    def forward(self, x):
        x = self.layer2(self.layer1(x))
        x = x.view(-1, 64 * 5 * 5)
        x = self.layer3_act(self.layer3(x))
        x = self.layer4(self.layer3_dropout(x))
        return self.softmax(x)


class TrainingModelWithLoss(nn.Module):
    """``model(x)``, and ``(output, cross-entropy loss)`` when labels are given."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()

    def forward(self, args, labels=None):
        output = self.model(args)
        if labels is None:
            return output
        return output, self.loss(output, labels)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="MNIST (digits) training in PopTorch")
    p.add_argument("--batch-size", type=int, default=8, help="batch size for training (default: 8)")
    p.add_argument("--device-iterations", type=int, default=50, help="device iterations (default: 50)")
    p.add_argument("--test-batch-size", type=int, default=80, help="batch size for testing (default: 80)")
    p.add_argument("--epochs", type=int, default=10, help="number of epochs to train (default: 10)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (default: 0.05)")
    opts = p.parse_args(argv)
    torch.manual_seed(0)

    training_dataset = Digits(train=True, normalize=MNIST_NORMALIZE)
    test_dataset = Digits(train=False, normalize=MNIST_NORMALIZE)

    training_opts = poptorch.Options().deviceIterations(opts.device_iterations)
    training_data = poptorch.DataLoader(options=training_opts, dataset=training_dataset, batch_size=opts.batch_size,
                                        shuffle=True, drop_last=True)
    # the test loader keeps the default options (one batch per call)
    test_data = poptorch.DataLoader(options=poptorch.Options(), dataset=test_dataset, batch_size=opts.test_batch_size,
                                    shuffle=True, drop_last=True)

    model = Network()
    model_with_loss = TrainingModelWithLoss(model)
    training_opts = poptorch.Options().deviceIterations(opts.device_iterations)
    training_opts = training_opts.outputMode(poptorch.OutputMode.All)   # every batch's loss and output
    print(model_with_loss)
    training_model = poptorch.trainingModel(model_with_loss, training_opts,
                                            optimizer=optim.SGD(model.parameters(), lr=opts.lr))

    t0 = time.perf_counter()
    nr_steps = len(training_data)
    for epoch in tqdm(range(1, opts.epochs + 1), leave=True, desc="Epochs", total=opts.epochs):
        with tqdm(training_data, total=nr_steps, leave=False) as bar:
            for data, labels in bar:
                preds, losses = training_model(data, labels)
                mean_loss = torch.mean(losses).item()
                acc = accuracy(preds, labels)
                bar.set_description(f"Loss: {mean_loss:0.4f} | Accuracy: {acc:05.2f}% ")
        print(f"Epoch {epoch}: loss {mean_loss:0.4f}, training accuracy (last call) {acc:05.2f}%")
    print(f"Training host time: {time.perf_counter() - t0:.1f} s")
    training_model.detachFromDevice()

    # evaluation: the trained weights go to a new inference model
    inference_model = poptorch.inferenceModel(model)
    t0 = time.perf_counter()
    sum_acc = 0.0
    with tqdm(test_data, total=len(test_data), leave=False) as bar:
        for data, labels in bar:
            output = inference_model(data)
            sum_acc += accuracy(output, labels)
    print(f"Evaluation host time: {time.perf_counter() - t0:.1f} s")
    print(f"Accuracy on test set: {sum_acc / len(test_data):0.2f}%")


if __name__ == "__main__":
    main()
