"""Port of Graphcore's PopTorch mixed-precision walkthrough (``tutorials/pytorch/
mixed_precision``) to the simulated IPU, with scikit-learn's digits (:mod:`digits`) in place of
FashionMNIST.

    python examples/poptorch/mixed_precision.py [--execution-half] [--optimizer-half]
        [--stochastic-rounding] [--partials-half] [--epochs 10]

As the walkthrough: the basics tutorial's CNN on 128x128 images (the dataset is resized to 128;
the first linear layer has 12 x 59 x 59 = 41,772 inputs; its log-softmax is over dim 0, as in the
walkthrough). ``--execution-half`` casts the model (``model.half()``) and the images to fp16;
``--optimizer-half`` gives ``poptorch.optim.AdamW(lr=0.001)`` fp16 accumulators
(``accum_type=torch.float16``) with a loss scaling of 1024; ``--stochastic-rounding`` sets
``Precision.enableStochasticRounding(True)``; ``--partials-half`` sets
``Precision.setPartialsType(torch.half)`` (else ``torch.float``). Training: batch 12 for
``--epochs`` (10, the walkthrough's fixed count); evaluation of the test set in batches of 32
prints ``Eval accuracy on IPU: X%``.

Digits: 1,437 training images (119 calls per epoch; FashionMNIST: 5,000), 360 test images (11
calls of 32, ``drop_last``). Host times printed are the simulator's wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
from tqdm import tqdm

import poptorch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from digits import FASHION_NORMALIZE, Digits  # noqa: E402


class CustomModel(nn.Module):
    """1x128x128 images -> 10 log-probabilities (normalised over the batch dimension, dim 0, as
    the walkthrough's model); ``(output, NLL loss)`` when training."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 5, 3)          # 128 -> 126, pooled to 63
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(5, 12, 5)         # 63 -> 59
        self.norm = nn.GroupNorm(3, 12)
        self.fc1 = nn.Linear(12 * 59 * 59, 100)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(100, 10)
        self.log_softmax = nn.LogSoftmax(dim=0)
        self.loss = nn.NLLLoss()

    def forward(self, x, labels=None):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.norm(self.relu(self.conv2(x)))
        x = self.relu(self.fc1(torch.flatten(x, start_dim=1)))
        x = self.log_softmax(self.fc2(x))
        return (x, self.loss(x, labels)) if self.training else x


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--execution-half", action="store_true", help="Cast the model parameters and data to FP16")
    p.add_argument("--optimizer-half", action="store_true", help="Cast the accumulation type of the optimiser to FP16")
    p.add_argument("--stochastic-rounding", action="store_true", help="Use stochastic rounding")
    p.add_argument("--partials-half", action="store_true", help="Set partials data type to FP16")
    p.add_argument("--epochs", type=int, default=10, help="training epochs (default: 10, as the walkthrough)")
    args = p.parse_args(argv)
    torch.manual_seed(0)

    model = CustomModel()
    if args.execution_half:
        model = model.half()
    dtype = torch.half if args.execution_half else torch.float32
    train_dataset = Digits(train=True, normalize=FASHION_NORMALIZE, size=128, dtype=dtype)
    test_dataset = Digits(train=False, normalize=FASHION_NORMALIZE, size=128, dtype=dtype)

    accum, loss_scaling = (torch.float16, 1024) if args.optimizer_half else (torch.float32, None)
    optimizer = poptorch.optim.AdamW(params=model.parameters(), lr=0.001, accum_type=accum, loss_scaling=loss_scaling)

    opts = poptorch.Options()
    if args.stochastic_rounding:
        opts.Precision.enableStochasticRounding(True)
    opts.Precision.setPartialsType(torch.half if args.partials_half else torch.float)

    train_dataloader = poptorch.DataLoader(opts, train_dataset, batch_size=12, shuffle=True, num_workers=40)
    model.train()
    poptorch_model = poptorch.trainingModel(model, options=opts, optimizer=optimizer)

    t0 = time.perf_counter()
    for epoch in tqdm(range(args.epochs), desc="epochs"):
        total_loss = 0.0
        for data, labels in tqdm(train_dataloader, desc="batches", leave=False):
            output, loss = poptorch_model(data, labels)
            total_loss += float(loss)
        print(f"Epoch {epoch + 1}: mean loss {total_loss / len(train_dataloader):.4f}")
    print(f"Training host time: {time.perf_counter() - t0:.1f} s")
    poptorch_model.detachFromDevice()

    model.eval()
    poptorch_model_inf = poptorch.inferenceModel(model, options=opts)
    test_dataloader = poptorch.DataLoader(opts, test_dataset, batch_size=32, num_workers=40)
    t0 = time.perf_counter()
    predictions, labels = [], []
    for data, label in test_dataloader:
        predictions += poptorch_model_inf(data).data.float().max(dim=1).indices
        labels += label
    poptorch_model_inf.detachFromDevice()
    print(f"Evaluation host time: {time.perf_counter() - t0:.1f} s")
    wrong = torch.count_nonzero(torch.tensor(labels) - torch.tensor(predictions))
    print(f"Eval accuracy on IPU: {100 * (1 - wrong / len(labels)):.2f}%")


if __name__ == "__main__":
    main()
