"""Scale-out (PopDist / ``poprun``): host time per training step with 1 and 2 instances, and the
predicted Pod16 training step of BERT-base beside the single-IPU prediction.

    python benchmarks/scaleout.py [--part host,pod16] [--steps 4] [--check-full] [--cache DIR]

``host``: the same PopTorch training program (a BERT from ``transformers``'s ``BertConfig``:
hidden 128, 2 layers, 2 heads, vocabulary 1000, sequence 32, random init; SGD lr 0.05; 4 global
replicas x micro-batch 2) run once as one process with ``replicationFactor(4)`` and once under
``poprun --num-instances 2 --num-replicas 4`` (2 replicas each, ``popdist.poptorch.Options``).
Each process reports, per step after the first (the first compiles), the **host** wall seconds
(``time.perf_counter``) and the **host** CPU seconds of the process (``time.process_time``), its
peak RSS, and the predicted IPU cycles of the step (``cycleCount()``, a prediction of the cost
model, the same in every run); the instances' final weights are checked against the one-process
run. The instances share this machine's cores, so two instances are not expected to be faster
here: what the figures show is the cost of the cross-instance collectives and that each instance
holds only its own replicas. ``uptime`` is printed beside them (host times are "loaded" when
other jobs run).

``pod16``: BERT-base SQuAD (``benchmarks/training.py``'s model: sequence 128, fp16, SGD momentum
0.9, micro-batch ``--batch``) compiled for an offline GC200 (``ipu2``, the IPU of an IPU-POD16)
as (a) one replica on one IPU and (b) one *instance* of a 16-replica data-parallel run
(``enableDistributedReplicatedGraphs``, ``globalReplicationFactor`` 16, one local replica on one
IPU: what each of 16 ``poprun`` instances compiles; the gradient all-reduce is costed over the
16-IPU ring of the IPU-POD16's IPU-Links). Printed: predicted cycles, ms and samples/s of one
step (one micro-batch per replica and one weight update), the predicted all-reduce share, whether
the replica fits one IPU's memory, and the host compile seconds. ``--check-full`` also compiles
all 16 replicas in one process (16 offline IPUs) and checks that it predicts the same step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPLICAS, MICRO, SEQ, VOCAB, LR = 4, 2, 32, 1000, 0.05


# ---------------------------------------------------------------------------------------------
# host: one process against two instances
# ---------------------------------------------------------------------------------------------
def _bert(seed: int):
    """The benchmark's BERT (``transformers``' ``BertConfig``: hidden 128, 2 layers, 2 heads,
    vocabulary ``VOCAB``, no dropout) with the initial weights of ``seed`` (each instance its own;
    instance 0's are broadcast at the compile); ``forward(x, y)`` returns the cross-entropy loss."""
    import torch
    import torch.nn.functional as F
    from transformers import BertConfig, BertForSequenceClassification

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=512, max_position_embeddings=64, num_labels=3,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
            self.m = BertForSequenceClassification(cfg)

        def forward(self, x, y):
            return F.cross_entropy(self.m(input_ids=x).logits, y)
    torch.manual_seed(seed)
    return Bert().train()


def worker(out: str, steps: int) -> None:
    """The training program (run by :func:`host_part`, alone or under ``poprun``): the training
    loop of ``tests/popdist_train.py`` (:func:`popdist_train.train_poptorch`) on the BERT above."""
    import torch
    sys.path.insert(0, str(ROOT / "tests"))
    from popdist_train import train_poptorch
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, VOCAB, (REPLICAS * MICRO, SEQ), generator=g),
                torch.randint(0, 3, (REPLICAS * MICRO,), generator=g)) for _ in range(steps)]
    train_poptorch(_bert, batches, out, REPLICAS, MICRO, LR)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "OMPI_"))}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def host_part(steps: int) -> dict:
    import torch
    res = {}
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, __file__, "--worker", str(Path(d) / "w.pt"), "--steps", str(steps)]
        for instances in (1, 2):
            pre = [] if instances == 1 else [sys.executable, "-m", "openipu.popdist.poprun", "--num-instances",
                                              str(instances), "--num-replicas", str(REPLICAS)]
            t0 = time.perf_counter()
            r = subprocess.run(pre + cmd, env=_env(), capture_output=True, text=True)
            total = time.perf_counter() - t0
            if r.returncode:
                raise SystemExit(f"{instances} instance(s) failed:\n{r.stderr[-3000:]}")
            files = [Path(d) / "w.pt"] if instances == 1 else [Path(d) / f"w.pt.{i}" for i in range(instances)]
            res[instances] = {"total_s": total, "procs": [torch.load(f) for f in files]}
    one = res[1]["procs"][0]["state"]
    res["equal"] = all(torch.equal(p["state"][k], v) for p in res[2]["procs"] for k, v in one.items())
    return res


def report_host(res: dict, steps: int) -> None:
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"\n## Host time per training step, 1 vs 2 instances (host figures; {os.uname().nodename}, "
          f"{os.cpu_count()} cores; uptime: {up})")
    print(f"BERT (hidden 128, 2 layers, seq {SEQ}), {REPLICAS} replicas x micro-batch {MICRO}, {steps} SGD steps; "
          "steps 2.. (step 1 compiles)\n")
    print("| run | process | replicas held | host wall s / step | host CPU s / step | step 1 wall s | peak RSS MB | "
          "predicted cycles / step | whole run wall s |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|")
    for n in (1, 2):
        for i, p in enumerate(res[n]["procs"]):
            label = "one process" if n == 1 else "poprun --num-instances 2"
            print(f"| {label} | {'-' if n == 1 else f'instance {i}'} | {REPLICAS // n} | "
                  f"{' / '.join(f'{w:.3f}' for w in p['host_s'][1:])} | "
                  f"{' / '.join(f'{c:.3f}' for c in p['cpu_s'][1:])} | "
                  f"{p['host_s'][0]:.1f} | {p['rss_mb']:.0f} | {p['cycles']:,} | {res[n]['total_s']:.1f} |")
    print(f"\nweights after {steps} steps bit-identical (instances vs one process): {res['equal']}")


# ---------------------------------------------------------------------------------------------
# pod16: predicted BERT-base step, one IPU against one instance of an IPU-POD16
# ---------------------------------------------------------------------------------------------
def pod16_part(cache: Path, batch: int, check_full: bool) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import training
    model = training.bert_model(cache, batch)
    label = model.label.replace("one C600 (ipu21)", "one GC200 (ipu2) per replica")
    model = training.TrainModel(model.name, label, model.proto, model.loss, batch, "ipu2")
    out = {"label": model.label, "one": training.predict(model, training._options())}
    _progress("one", out["one"])
    os.environ["POPDIST_NUM_INSTANCES"] = "16"        # what poprun sets in each instance (no rendezvous offline)
    try:
        out["pod16"] = training.predict(model, training._options(
            enableDistributedReplicatedGraphs=True, globalReplicationFactor=16, globalReplicaOffset=0))
    finally:
        del os.environ["POPDIST_NUM_INSTANCES"]
    out["pod16"]["samples"] *= 16
    out["pod16"]["samples_per_s"] *= 16
    _progress("pod16", out["pod16"])
    if check_full:
        out["full"] = training.predict(model, training._options(enableReplicatedGraphs=True, replicatedGraphCount=16),
                                       num_ipus=16)
        _progress("full", out["full"])
    return out


def _progress(what: str, p: dict) -> None:
    print(f"[{what}] predicted cycles {p['cycles']:,.0f}, all-reduce {p['all_reduce_cycles']:,.0f}, "
          f"fits {p['fits']}, host compile {p['host_compile_s']:.0f} s", file=sys.stderr, flush=True)


def report_pod16(r: dict) -> None:
    print(f"\n## Predicted BERT-base training step on an IPU-POD16 (predicted IPU figures; host compile seconds "
          f"are host figures)\n{r['label']}; one micro-batch per replica, then the weight update\n")
    print("| run | IPUs | samples / step | predicted cycles | predicted ms | predicted samples/s | all-reduce share | "
          "fits | host compile s |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    rows = [("one IPU, one replica", 1, r["one"]), ("IPU-POD16: one instance of 16 (1 local replica)", 16, r["pod16"])]
    if "full" in r:
        rows.append(("IPU-POD16: 16 replicas in one process", 16, r["full"]))
    for label, ipus, p in rows:
        print(f"| {label} | {ipus} | {p['samples']} | {p['cycles']:,.0f} | {p['seconds'] * 1e3:.2f} | "
              f"{p['samples_per_s']:,.0f} | {p['all_reduce_cycles'] / p['cycles']:.1%} | "
              f"{'yes' if p['fits'] else 'no'} | "
              f"{p['host_compile_s']:.0f} |")
    one, pod = r["one"], r["pod16"]
    print(f"\nscaling 1 -> 16 IPUs: x{pod['samples_per_s'] / one['samples_per_s']:.2f} samples/s (16 would be linear); "
          f"gradients {one['grad_bytes'] / 1e6:.1f} MB")
    if "full" in r:
        print(f"one instance's compile predicts the 16-replica process's step: "
              f"{abs(r['full']['cycles'] - pod['cycles']) < 1e-6 * pod['cycles']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", default="host,pod16")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=8, help="BERT-base micro-batch per replica (pod16)")
    p.add_argument("--check-full", action="store_true")
    p.add_argument("--cache", type=Path, default=ROOT / "build" / "scale-models")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.steps)
        return
    parts = a.part.split(",")
    out = {}
    if "host" in parts:
        out["host"] = host_part(a.steps)
        report_host(out["host"], a.steps)
    if "pod16" in parts:
        a.cache.mkdir(parents=True, exist_ok=True)
        out["pod16"] = pod16_part(a.cache, a.batch, a.check_full)
        report_pod16(out["pod16"])
    if a.json:
        slim = {"pod16": out.get("pod16")}
        if "host" in out:
            slim["host"] = {str(n): [{k: v for k, v in q.items() if k != "state"} for q in out["host"][n]["procs"]]
                            for n in (1, 2)}
        a.json.write_text(json.dumps(slim, indent=1, default=float))


if __name__ == "__main__":
    main()
