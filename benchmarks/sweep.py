"""Host cost of ``openipu sweep`` against the same points run one by one.

    python benchmarks/sweep.py MODEL.onnx --batch-sizes 8,16,32,64 --amp 0.3,0.4,0.6 \
        [--ipu ipu21] [--precision fp16] [--single N] [--out DIR]

First ``openipu sweep`` predicts every point in one process (points share the model's import
and conversion, the IR of points that differ only in planner options, and the planner's plans);
then each point runs alone as ``openipu run --offline --json`` in its own process, as a shell
loop would. ``--single N`` runs only the first N points alone (on a loaded machine a full
one-by-one pass can take long) and extrapolates their mean to all points; the output says so.
Every figure printed here is host wall time of this machine, not an IPU figure; the sweep's
table (predicted IPU figures) is written to DIR/sweep.txt, with CSV, JSON and the plot beside it.
The predicted throughput of each point run alone is checked to equal the sweep's.

BERT-base SQuAD: export it first with ``examples/models/export_transformers.py bert-base-squad
OUT.onnx --batch 8 --seq 384`` (random weights, no download).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--batch-sizes", default="8,16,32,64")
    p.add_argument("--amp", default="0.3,0.4,0.6")
    p.add_argument("--ipu", default="ipu21")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--single", type=int, default=None, help="run only the first N points one by one")
    p.add_argument("--out", default="build/sweep-bench")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "openipu.cli", "sweep", a.model, "--batch-sizes", a.batch_sizes, "--amp", a.amp,
           "--ipu", a.ipu, "--precision", a.precision, "--csv", str(out / "sweep.csv"),
           "--json", str(out / "sweep.json"), "--plot", str(out / "sweep.html")]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    sweep_s = time.perf_counter() - t
    (out / "sweep.txt").write_text(r.stdout + r.stderr)
    if r.returncode not in (0, 3):
        sys.exit(f"sweep failed ({r.returncode}):\n{r.stderr}")
    doc = json.loads((out / "sweep.json").read_text())
    points = [pt for pt in doc["points"] if "run" in pt]
    print(r.stdout)
    todo = points if a.single is None else points[:a.single]
    single = []
    for pt in todo:
        s = pt["spec"]
        c = [sys.executable, "-m", "openipu.cli", "run", a.model, "--offline", "--json", "--batch-size", str(s["batch"]),
             "--ipu", s["ipu"], "--precision", s["precision"], "--partials-type", s["partials_type"],
             "--available-memory-proportion", str(s["available_memory_proportion"]), "--num-ipus",
             str(s["num_ipus"]), "--num-io-tiles", str(s["num_io_tiles"])]
        t = time.perf_counter()
        rr = subprocess.run(c, capture_output=True, text=True)
        dt = time.perf_counter() - t
        one = json.loads(rr.stdout)
        same = one["prediction"]["throughput_samples_per_second"] == pt["run"]["prediction"][
            "throughput_samples_per_second"]
        single.append(dt)
        print(f"  alone: batch {s['batch']} AMP {s['available_memory_proportion']:g}: {dt:,.1f} s host "
              f"(prediction {'equal to' if same else 'DIFFERENT from'} the sweep's)", flush=True)
    n = len(points)
    mean = sum(single) / max(len(single), 1)
    est = mean * n
    how = "measured" if len(single) == n else f"extrapolated from {len(single)} of them (mean {mean:,.1f} s)"
    print(f"\nHost wall time (this machine; not IPU figures), {os.path.basename(a.model)}, {n} points:")
    print(f"  openipu sweep, one process:      {sweep_s:,.1f} s ({sweep_s / max(n, 1):,.1f} s per point)")
    print(f"  the points one by one:           {est:,.1f} s ({how})")
    print(f"  ratio                            {est / sweep_s:,.2f}x")
    print(f"  load average at the end          {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
