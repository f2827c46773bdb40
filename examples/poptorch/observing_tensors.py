"""Port of Graphcore's PopTorch observing-tensors example (``tutorials/pytorch/observing_tensors/
anchor_tensor_example.py``) to the simulated IPU, with scikit-learn's digits (:mod:`digits`) in
place of MNIST.

    python examples/poptorch/observing_tensors.py

As the example: a three-layer perceptron (784 -> 320 -> 100 -> 10, log-softmax over dim 0 as
there) trained with ``poptorch.optim.SGD(lr=0.01)`` in batches of 1000; the gradients of its six
parameters are anchored with ``Options.anchorTensor("Gradient___fc1.weight", ...)``, the model is
compiled on zeros so that ``getTensorNames()`` can list the PopART tensor names, one epoch is
trained, and ``getAnchoredTensor`` returns the last call's gradients, whose log2 magnitudes are
binned into a histogram. The example plots it with matplotlib into ``GradientHistogram.png``;
matplotlib is not a dependency here, so without it the 50-bin histogram is written as text to
``GradientHistogram.txt`` (and summarised on stdout).

Digits: 1,437 training images make one call of 1000 per epoch (MNIST: 60).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

import poptorch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits import FASHION_NORMALIZE, Digits  # noqa: E402


class BasicLinearModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 320)
        self.fc2 = nn.Linear(320, 100)
        self.fc3 = nn.Linear(100, 10)
        self.log_softmax = nn.LogSoftmax(dim=0)
        self.loss = nn.NLLLoss()
        self.relu = nn.ReLU()

    def forward(self, x, labels=None):
        x = torch.flatten(x, start_dim=1)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        x = self.log_softmax(self.fc3(x))
        return (x, self.loss(x, labels)) if self.training else x


batch_size_train = 1000
tensors = ["Gradient___fc1.weight", "Gradient___fc3.weight", "Gradient___fc2.bias",
           "Gradient___fc1.bias", "Gradient___fc3.bias", "Gradient___fc2.weight"]


def text_histogram(values: np.ndarray, bins: int = 50, width: int = 50) -> str:
    counts, edges = np.histogram(values, bins=bins)
    scale = width / max(1, counts.max())
    return "\n".join(f"[{lo:8.2f}, {hi:8.2f}) {c:8d} {'#' * int(round(c * scale))}"
                     for lo, hi, c in zip(edges[:-1], edges[1:], counts))


def main() -> None:
    torch.manual_seed(0)
    opts = poptorch.Options()
    for t in tensors:
        opts.anchorTensor(t, t)

    train_data = Digits(train=True, normalize=FASHION_NORMALIZE)
    train_loader = poptorch.DataLoader(opts, train_data, batch_size=batch_size_train, shuffle=True)

    model = BasicLinearModel()
    model.train()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.01)
    poptorch_model = poptorch.trainingModel(model, options=opts, optimizer=optimizer)

    # compile first, so that the tensor names can be listed
    poptorch_model.compile(torch.zeros(batch_size_train, 1, 28, 28), torch.zeros(batch_size_train).long())
    print("tensor names:", poptorch_model.getTensorNames())

    total_loss = 0.0
    predictions = []
    for data, labels in tqdm(train_loader, desc="batches", leave=False):
        output, loss = poptorch_model(data, labels)
        total_loss += loss
        predictions += output
    print(f"Loss: {total_loss.item():.4f}")

    gradient = []
    for t in tensors:
        g = poptorch_model.getAnchoredTensor(t)
        print(f"{t}: shape {list(g.shape)}, mean |g| {g.abs().mean().item():.3e}")
        gradient += g.flatten()
    gradient = torch.stack(gradient).abs()
    idx = gradient != 0
    gradient[idx] = torch.log2(gradient[idx])
    gradient[~idx] = torch.min(gradient) - 2
    gradient_data = gradient.numpy()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plt = None
    if plt is not None:
        picture_name = "GradientHistogram.png"
        fig, axs = plt.subplots(tight_layout=True)
        axs.hist(gradient_data, bins=50)
        axs.set(title="Gradient Histogram", ylabel="Frequency")
        plt.savefig(picture_name)
    else:
        picture_name = "GradientHistogram.txt"
        hist = text_histogram(gradient_data)
        Path(picture_name).write_text("Gradient histogram: log2 |gradient| (bin, frequency)\n" + hist + "\n")
        print("Gradient histogram (log2 |gradient|):")
        print(hist)
    print(f"Saved histogram to ./{picture_name}")


if __name__ == "__main__":
    main()
