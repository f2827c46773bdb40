"""PopTorch training: host time per training step of real models through ``poptorch`` against
PyTorch eager in the same run, and the predicted IPU time of the step.

    python benchmarks/poptorch_training.py [--quick] [--steps N] [--models resnet18,bert] [--modes ir,device]
        [--sequential]

Models (random weights, fp32, SGD lr 0.001 momentum 0.9):

- ``resnet18``: ``transformers`` ``ResNetForImageClassification`` (``ResNetConfig(depths=[2,2,2,2],
  hidden_sizes=[64,128,256,512], layer_type="basic")``, 11.7 M parameters) with a cross-entropy
  loss, batch 4 of 3 x 64 x 64 images (``--quick``: batch 2 of 32 x 32);
- ``bert``: ``BertForQuestionAnswering`` (``BertConfig()``: BERT-base, 12 layers; ``--quick``: 2
  layers) with the SQuAD loss, batch 2 x 128 tokens (``--quick``: 2 x 32), no dropout.

Figures for each model (printed as a table and one JSON line):

- ``fits``: whether the model fits one IPU's tile memory (every model is compiled with Poplar's
  ``debug.allowOutOfMemory``, so one that does not fit is predicted anyway and flagged; fp32
  BERT-base training does not fit); ``max_tile_bytes`` / ``tiles_out_of_memory``: the most used
  tile's bytes and how many tiles are over their memory, from the compile's tile-memory plan;
- ``compile_s``: host seconds of ``compile()`` (capture, lowering, PopART and Poplar compile);
- ``poptorch_step_s``: host seconds per ``trainingModel`` call after the first (median of
  ``--steps``): the simulator's functional run and the cost model on this machine's CPU;
- ``eager_step_s``: host seconds per PyTorch eager step (forward, backward, ``SGD.step``; median
  after one warm-up) on the same CPU, in the same process; ``ratio`` = poptorch / eager. By
  default (``order`` "interleaved") the eager step and the poptorch step alternate after the
  compile, so both run in the same process state and the same seconds of this shared machine
  (on 2026-11-30, idle, the ResNet-18 b4 eager step alone took 0.057-0.090 s from one minute or
  process to the next);
  ``--sequential`` runs all eager steps first, in the fresh process, before the compile (the
  order before 2026-11-30; it keeps one model copy less alive at poptorch's peak);
- ``poptorch_step_cpu_s`` / ``eager_step_cpu_s`` / ``cpu_ratio``: the same steps in CPU seconds of
  the process (``time.process_time``, all its threads), less sensitive to a loaded machine;
- ``ipu_step_cycles`` / ``ipu_step_s``: the cost model's PREDICTION of one step on the simulated
  IPU (``cycleCount()`` cycles / the target's tile clock) - a predicted device time, not a host
  time; ``ipu_samples_per_s`` = batch / ``ipu_step_s``.

``--modes``: the ``OPENIPU_EXECUTION`` modes measured one after the other (``ir``: the IR executor,
the default; ``device``: the device-storage emulation); each row names its mode.

Host times depend on the machine and its load (the row's ``load`` is ``os.getloadavg()`` before
the model); the predictions do not.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import poptorch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))
from torch_models import ResNet18WithLoss  # noqa: E402


class BertSquadLoss(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        from transformers import BertConfig, BertForQuestionAnswering
        self.m = BertForQuestionAnswering(BertConfig(num_hidden_layers=layers, hidden_dropout_prob=0.0,
                                                     attention_probs_dropout_prob=0.0))

    def forward(self, input_ids, start, end):
        out = self.m(input_ids=input_ids)
        loss = (F.cross_entropy(out.start_logits, start) + F.cross_entropy(out.end_logits, end)) / 2
        return out.start_logits, poptorch.identity_loss(loss, reduction="none")


def _inputs(name, quick, g):
    if name == "resnet18":
        b, hw = (2, 32) if quick else (4, 64)
        return b, (torch.randn(b, 3, hw, hw, generator=g), torch.randint(0, 10, (b,), generator=g))
    b, s = (2, 32) if quick else (2, 128)
    return b, (torch.randint(0, 30522, (b, s), generator=g), torch.randint(0, s, (b,), generator=g),
               torch.randint(0, s, (b,), generator=g))


def measure(name: str, quick: bool = False, steps: int = 3, mode: str | None = None, interleaved: bool = True) -> dict:
    """The figures of one model (see the module docstring); ``mode``: ``OPENIPU_EXECUTION`` for
    the poptorch model (None: the environment's); ``interleaved``: the eager and poptorch steps
    alternate after the compile (else all eager steps first, in the fresh process)."""
    if mode is not None:
        os.environ["OPENIPU_EXECUTION"] = mode
    load = os.getloadavg()[0]
    torch.manual_seed(0)
    model = ResNet18WithLoss() if name == "resnet18" else BertSquadLoss(2 if quick else 12)
    model.train()
    g = torch.Generator().manual_seed(1)
    batch, args = _inputs(name, quick, g)
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(eager.parameters(), lr=0.001, momentum=0.9)
    etimes, ecpu = [], []

    def eager_step(keep: bool) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        eager(*args)[1].backward()
        opt.step()
        if keep:
            etimes.append(time.perf_counter() - t0)
            ecpu.append(time.process_time() - c0)

    eager_step(False)           # warm-up
    if not interleaved:
        # PyTorch eager first, on a copy that is freed before poptorch compiles (one host copy of
        # the model, its gradients and momentum less at poptorch's peak)
        for _ in range(steps):
            eager_step(True)
        del eager, opt
    opts = poptorch.Options().logCycleCount(True)
    # compiled once with Poplar's debug.allowOutOfMemory, so a model that does not fit one IPU
    # (fp32 BERT-base with its 30522 x 768 embedding and SGD momentum) is predicted anyway; whether
    # it fits is read from the tile-memory plan of that compile (no second compile to find out)
    opts._Popart.setEngineOptions({"debug.allowOutOfMemory": "true"})
    tm = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9))
    t0 = time.perf_counter()
    tm.compile(*args)
    compile_s = time.perf_counter() - t0
    tm(*args)       # the first step (weights uploaded)
    times, cpu = [], []
    for _ in range(steps):
        if interleaved:         # the peer's step right before each of ours: same process, same minute
            eager_step(True)
        t0, c0 = time.perf_counter(), time.process_time()
        tm(*args)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    cycles = tm.cycleCount()
    clock = tm._session.deviceInfo.getTarget().getTileClockFrequency()
    pt, et = statistics.median(times), statistics.median(etimes)
    plan = tm._session._engine.memory
    fits = plan.fits()
    return {"model": name, "mode": os.environ.get("OPENIPU_EXECUTION", "ir"), "load": round(load, 1), "batch": batch,
            "params": sum(p.numel() for p in model.parameters()), "fits": fits,
            "compile_s": round(compile_s, 2), "poptorch_step_s": round(pt, 4), "eager_step_s": round(et, 4),
            "ratio": round(pt / et, 1),
            "poptorch_step_cpu_s": round(statistics.median(cpu), 4),
            "eager_step_cpu_s": round(statistics.median(ecpu), 4),
            "cpu_ratio": round(statistics.median(cpu) / statistics.median(ecpu), 2), "ipu_step_cycles": int(cycles), "ipu_step_s": cycles / clock,
            "ipu_samples_per_s": round(batch * clock / cycles, 1), "order": "interleaved" if interleaved else "sequential",
            "max_tile_bytes": int(plan.total.max()), "tiles_out_of_memory": int(plan.out_of_memory_tiles.size)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--models", default="resnet18,bert")
    p.add_argument("--modes", default=os.environ.get("OPENIPU_EXECUTION", "ir"),
                   help="comma-separated OPENIPU_EXECUTION modes (ir, device)")
    p.add_argument("--sequential", action="store_true",
                   help="all eager steps first, in the fresh process, then poptorch's (before 2026-11-30 the "
                        "only order); default: the steps alternate after the compile")
    a = p.parse_args()
    print(f"{'model':<10} {'mode':>6} {'load':>5} {'batch':>5} {'compile s':>10} {'poptorch s/step':>16} "
          f"{'eager s/step':>13} {'ratio':>6} {'IPU cycles (pred)':>18} {'IPU s/step (pred)':>18}")
    for name in a.models.split(","):
        for mode in a.modes.split(","):
            r = measure(name, a.quick, a.steps, mode.strip(), interleaved=not a.sequential)
            print(f"{r['model'] + ('' if r['fits'] else '*'):<10} {r['mode']:>6} {r['load']:>5.1f} {r['batch']:>5} "
                  f"{r['compile_s']:>10.1f} {r['poptorch_step_s']:>16.3f} {r['eager_step_s']:>13.4f} "
                  f"{r['ratio']:>6.1f} "
                  f"{r['ipu_step_cycles']:>18,} {r['ipu_step_s']:>18.6f}")
            print(json.dumps(r))
            if not r["fits"]:
                print("* does not fit one IPU's tile memory: compiled with debug.allowOutOfMemory")


if __name__ == "__main__":
    main()
