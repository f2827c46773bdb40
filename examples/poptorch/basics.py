"""Port of Graphcore's PopTorch basics walkthrough (``tutorials/pytorch/basics``) to the simulated
IPU, with scikit-learn's digits (:mod:`digits`) in place of FashionMNIST.

    python examples/poptorch/basics.py [--epochs 5] [--num-workers 20]

What it does, as the tutorial: a small CNN (conv 3x3 -> max pool -> conv 5x5 -> GroupNorm ->
two linear layers -> log-softmax) returns ``(output, NLL loss)`` in training mode; it is trained
with ``poptorch.optim.SGD(lr=0.001, momentum=0.9)`` through ``poptorch.trainingModel`` on a
``poptorch.DataLoader`` of batch 16 for 5 epochs; the training model is detached, the state dict
saved to ``classifier.pth`` (in the working directory), and an ``inferenceModel`` of the same
module evaluates the test set in batches of 32 and prints ``Eval accuracy: X%`` and the
confusion matrix (as text: the tutorial plots it with matplotlib). Then a fresh model loads
``classifier.pth`` and classifies one test image on the IPU and on the CPU (the tutorial's
trouser photo, class 1, becomes the first test image of a digit 1). Last, the options of the
tutorial's closing example are built: ``Options().deviceIterations(20).replicationFactor(2)
.randomSeed(123).useIpuModel(True)``.

Host times printed are the simulator's wall time on this machine, not IPU predictions.
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


class ClassificationModel(nn.Module):
    """1x28x28 images -> log-probabilities of 10 classes; ``(log_probs, loss)`` when training."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 5, 3)          # 28 -> 26, pooled to 13
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(5, 12, 5)         # 13 -> 9
        self.norm = nn.GroupNorm(3, 12)
        self.fc1 = nn.Linear(12 * 9 * 9, 100)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(100, 10)
        self.log_softmax = nn.LogSoftmax(dim=1)
        self.loss = nn.NLLLoss()

    def forward(self, x, labels=None):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.norm(self.relu(self.conv2(x)))
        x = self.relu(self.fc1(torch.flatten(x, start_dim=1)))
        x = self.log_softmax(self.fc2(x))
        # on the IPU the model computes its own loss
        return (x, self.loss(x, labels)) if self.training else x


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5, help="training epochs (default: 5, as the tutorial)")
    p.add_argument("--num-workers", type=int, default=20, help="DataLoader worker processes (default: 20)")
    args = p.parse_args(argv)

    torch.manual_seed(42)
    train_dataset = Digits(train=True, normalize=FASHION_NORMALIZE)
    test_dataset = Digits(train=False, normalize=FASHION_NORMALIZE)
    classes = Digits.classes

    model = ClassificationModel()
    model.train()
    opts = poptorch.Options()
    train_dataloader = poptorch.DataLoader(opts, train_dataset, batch_size=16, shuffle=True,
                                           num_workers=args.num_workers)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
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
    torch.save(model.state_dict(), "classifier.pth")

    # evaluation: an inference model of the same (trained) module
    model = model.eval()
    poptorch_model_inf = poptorch.inferenceModel(model, options=opts)
    test_dataloader = poptorch.DataLoader(opts, test_dataset, batch_size=32, num_workers=min(10, args.num_workers))
    t0 = time.perf_counter()
    predictions, labels = [], []
    for data, label in test_dataloader:
        predictions += poptorch_model_inf(data).data.max(dim=1).indices
        labels += label
    poptorch_model_inf.detachFromDevice()
    print(f"Evaluation host time: {time.perf_counter() - t0:.1f} s")

    from sklearn.metrics import accuracy_score, confusion_matrix
    print(f"Eval accuracy: {100 * accuracy_score(labels, predictions):.2f}%")
    print("Confusion matrix (rows: true class, columns: predicted):")
    print(confusion_matrix(labels, predictions))

    # one image: class 1, as the tutorial's trouser photo (FashionMNIST class 1)
    model = ClassificationModel()
    model.load_state_dict(torch.load("classifier.pth"))
    model.eval()
    poptorch_model = poptorch.inferenceModel(model, options=poptorch.Options())
    img_tensor = next(x for x, y in test_dataset if y == 1).unsqueeze(0)
    output = poptorch_model(img_tensor)
    print(output)
    prediction_idx = int(output.argmax())
    poptorch_model.detachFromDevice()
    print("IPU predicted class:", classes[prediction_idx])

    model = ClassificationModel()
    model.load_state_dict(torch.load("classifier.pth"))
    model.eval()
    output = model(img_tensor)
    print("CPU predicted class:", classes[int(output.argmax())])

    # the tutorial's last example: options built by chained setters (not run)
    opts = poptorch.Options().deviceIterations(20).replicationFactor(2).randomSeed(123).useIpuModel(True)
    print("Options:", opts.device_iterations, opts.replication_factor, opts.random_seed, opts.use_ipu_model)


if __name__ == "__main__":
    main()
