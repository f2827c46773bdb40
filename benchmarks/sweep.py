"""Host cost of ``openipu sweep`` against the same points run one by one.

    python benchmarks/sweep.py MODEL.onnx --batch-sizes 8,16,32,64 --amp 0.3,0.4,0.6 \
        [--ipu ipu21] [--precision fp16] [--jobs 1,2] [--single N] [--out DIR]

First ``openipu sweep --jobs J`` predicts every point, for each J of ``--jobs`` (1: one process;
2: the first batch size in the sweep's process, the others in two forked workers at a time;
points share the model's import and conversion, the IR of points that differ only in planner
options, and the planner's plans); then each point runs alone as ``openipu run --offline --json``
in its own process, as a shell loop would. Parallel workers cut wall time, not CPU time: both are
printed, with the ratios of the points one by one to each sweep, and the peak resident set of
each (the sweep's process and, from its output, its largest worker). ``--single N`` runs only the first N points alone (on a loaded machine a full
one-by-one pass can take long) and extrapolates their mean to all points; the output says so.
Every figure printed here is host time of this machine, not an IPU figure: wall time and CPU
time (user + system of the child processes, which the other jobs of a loaded machine do not
inflate as they do wall time; the ratio of CPU times is the figure to read there). The sweep's
table (predicted IPU figures) is written to DIR/sweep.txt, with CSV, JSON and the plot beside it.
Each point run alone is checked to predict what the sweep did (every field of ``prediction``).

BERT-base SQuAD: export it first with ``examples/models/export_transformers.py bert-base-squad
OUT.onnx --batch 8 --seq 384`` (random weights, no download).
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


def _run(cmd):
    """Run ``cmd``; ``(returncode, stdout, stderr, wall s, CPU s, peak RSS GB)`` of that one child
    (user + system CPU and maximum resident set from ``wait4``; host figures of this machine)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read(), wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--batch-sizes", default="8,16,32,64")
    p.add_argument("--amp", default="0.3,0.4,0.6")
    p.add_argument("--ipu", default="ipu21")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--jobs", default="1,2", help="the sweeps' --jobs values, comma-separated (default 1,2)")
    p.add_argument("--single", type=int, default=None, help="run only the first N points one by one")
    p.add_argument("--out", default="build/sweep-bench")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    sweeps, points = {}, None
    for jobs in [int(j) for j in a.jobs.split(",")]:
        d = out / f"jobs{jobs}"
        cmd = [sys.executable, "-m", "openipu.cli", "sweep", a.model, "--batch-sizes", a.batch_sizes, "--amp", a.amp,
               "--ipu", a.ipu, "--precision", a.precision, "--jobs", str(jobs), "--csv", str(d / "sweep.csv"),
               "--json", str(d / "sweep.json"), "--plot", str(d / "sweep.html")]
        code, stdout, stderr, wall, cpu, rss = _run(cmd)
        d.mkdir(parents=True, exist_ok=True)
        (d / "sweep.txt").write_text(stdout + stderr)
        if code not in (0, 3):
            sys.exit(f"sweep --jobs {jobs} failed ({code}):\n{stderr}")
        doc = json.loads((d / "sweep.json").read_text())
        mine = [pt for pt in doc["points"] if "run" in pt]
        if points is None:
            points = mine
            print(stdout)
        else:       # every predicted field equal to the first sweep's
            same = [x["run"]["prediction"] == y["run"]["prediction"] for x, y in zip(points, mine)]
            print(f"  sweep --jobs {jobs}: predictions {'equal to' if all(same) and len(mine) == len(points) else 'DIFFERENT from'}"
                  " those of the first sweep", flush=True)
        sweeps[jobs] = (wall, cpu, doc["host"].get("parent_peak_rss_bytes"), doc["host"].get("worker_peak_rss_bytes"))
        print(f"  sweep --jobs {jobs}: {wall:,.1f} s host wall, {cpu:,.1f} s host CPU, peak RSS {rss:,.2f} GB (the "
              "largest of its processes) "
              f"(load average now {os.getloadavg()[0]:.2f})", flush=True)
    todo = points if a.single is None else points[:a.single]
    single, single_cpu, single_rss = [], [], []
    for pt in todo:
        s = pt["spec"]
        c = [sys.executable, "-m", "openipu.cli", "run", a.model, "--offline", "--json", "--batch-size", str(s["batch"]),
             "--ipu", s["ipu"], "--precision", s["precision"], "--partials-type", s["partials_type"],
             "--available-memory-proportion", str(s["available_memory_proportion"]), "--num-ipus",
             str(s["num_ipus"]), "--num-io-tiles", str(s["num_io_tiles"])]
        rc, rout, rerr, dt, dcpu, drss = _run(c)
        if rc not in (0, 3):
            sys.exit(f"openipu run failed ({rc}):\n{rerr}")
        one = json.loads(rout)
        same = one["prediction"] == pt["run"]["prediction"]        # every predicted field
        single.append(dt)
        single_cpu.append(dcpu)
        single_rss.append(drss)
        print(f"  alone: batch {s['batch']} AMP {s['available_memory_proportion']:g}: {dt:,.1f} s host wall, "
              f"{dcpu:,.1f} s host CPU, peak RSS {drss:,.2f} GB "
              f"(prediction {'equal to' if same else 'DIFFERENT from'} the sweep's)", flush=True)
    n = len(points)
    mean = sum(single) / max(len(single), 1)
    est = mean * n
    est_cpu = sum(single_cpu) / max(len(single_cpu), 1) * n
    how = "measured" if len(single) == n else f"extrapolated from {len(single)} of them (mean {mean:,.1f} s)"
    print(f"\nHost time (this machine; not IPU figures), {os.path.basename(a.model)}, {n} points:")
    for jobs, (wall, cpu, parent, worker) in sweeps.items():
        print(f"  openipu sweep --jobs {jobs}:  {wall:9,.1f} s wall ({wall / max(n, 1):,.1f} s per point), {cpu:9,.1f} s CPU; "
              f"ratio one by one / sweep {est / wall:,.2f}x wall, {est_cpu / max(cpu, 1e-9):,.2f}x CPU; peak RSS "
              f"{(parent or 0) / 2**30:,.2f} GB" + (f", its largest worker {worker / 2**30:,.2f} GB (counting pages "
                                                    "shared with the sweep's process)" if worker else ""))
    print(f"  the points one by one:    {est:9,.1f} s wall, {est_cpu:9,.1f} s CPU ({how}); the largest single run "
          f"{max(single_rss, default=0):,.2f} GB")
    print(f"  load average at the end          {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
