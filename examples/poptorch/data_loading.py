"""Port of Graphcore's PopTorch efficient-data-loading tutorial (``tutorials/pytorch/
efficient_data_loading/tuto_data_loading.py``) to the simulated IPU. Its data is already
synthetic (random images), so only the dataset size is a flag here.

    python examples/poptorch/data_loading.py [--synthetic-data] [--replicas 2]
        [--dataset-size 10000]

As the tutorial: the mixed-precision tutorial's CNN on 1x128x128 images, trained with
``poptorch.optim.SGD(lr=0.001, momentum=0.9)``; ``deviceIterations(50)``, batch 16,
``replicationFactor(--replicas)``, ``enableSyntheticData`` with ``--synthetic-data``; a
``DataLoaderMode.Async`` loader (``async_options={"early_preload": True}``, 32 workers) over a
``TensorDataset`` of random images and labels. It times one pass of the loader alone
("DataLoader throughput"), compiles the model (``compile(data, labels)``), then times one pass of
training ("IPU throughput"; with synthetic data the same batch is run again and again, without
the loader).

The throughputs are the host's: the simulator's wall time on this machine, not an IPU's. The
cost model's prediction for the real IPU is printed beside them: "Predicted IPU throughput", from
``cycleCount()`` (``logCycleCount(True)``) of the last call at the IPU's clock (Mk2: 1.33 GHz).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn

import poptorch

device_iterations = 50
batch_size = 16
num_workers = 32


class ClassificationModel(nn.Module):
    """The mixed-precision tutorial's CNN (log-softmax over dim 0, as there)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 5, 3)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(5, 12, 5)
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


def print_parameters(args):
    if args.synthetic_data:
        print("SYNTHETIC DATA. The IPU Throughput will not include the cost of IO")
    print(f"mini-batch size: {batch_size}\n",
          f"replication factor: {args.replicas}\n",
          f"device-iterations: {device_iterations}\n",
          f"workers: {num_workers}\n",
          f"--> Global batch size: {args.replicas * batch_size}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--synthetic-data", dest="synthetic_data", action="store_true",
                   help="Use IPU-generated synthetic data")
    p.add_argument("--replicas", type=int, default=1, help="IPU replication factor")
    p.add_argument("--dataset-size", type=int, default=10000, help="random images in the dataset (default: 10000)")
    args = p.parse_args(argv)
    replicas = args.replicas

    opts = poptorch.Options()
    opts.deviceIterations(device_iterations)
    opts.replicationFactor(replicas)
    opts.logCycleCount(True)      # openipu: for the predicted throughput
    if args.synthetic_data:
        opts.enableSyntheticData(True)

    model = ClassificationModel()
    model.train()
    print_parameters(args)
    training_model = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9))

    features = torch.randn([args.dataset_size, 1, 128, 128])
    labels = torch.empty([args.dataset_size], dtype=torch.long).random_(10)
    dataset = torch.utils.data.TensorDataset(features, labels)
    print("Dataset size: ", len(dataset))
    training_data = poptorch.DataLoader(opts, dataset=dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                                        num_workers=num_workers, mode=poptorch.DataLoaderMode.Async,
                                        async_options={"early_preload": True})
    steps = len(training_data)
    items = steps * device_iterations * batch_size * replicas

    print("Evaluating Dataloader: ", steps, "steps")
    t0 = time.time()
    for data, labels in training_data:
        pass
    total_time = time.time() - t0
    print("Total execution Time:", total_time, "s")
    print("DataLoader throughput:", items / total_time, "items/s")

    print("Compiling + Warmup ...")
    training_model.compile(data, labels)
    print("Evaluating: ", steps, "steps of ", device_iterations * batch_size * replicas, " items")
    if args.synthetic_data:
        # no host data: the loader stays out of the timing
        t0 = time.time()
        for _ in range(steps):
            training_model(data, labels)
        t1 = time.time()
    else:
        t0 = time.time()
        for data, labels in training_data:
            training_model(data, labels)
        t1 = time.time()
    total_time = t1 - t0
    print("Total execution Time:", total_time, "s")
    print("IPU throughput:", items / total_time, "items/s (host time of the simulation)")

    from openipu.ipu.target import fact
    clock = fact(opts.ipu_version(), "clock_hz")
    cycles = training_model.cycleCount()
    print("Predicted IPU throughput:", device_iterations * batch_size * replicas / (cycles / clock),
          f"items/s ({cycles} cycles per call at {clock / 1e9:.2f} GHz, cost model)")


if __name__ == "__main__":
    main()
