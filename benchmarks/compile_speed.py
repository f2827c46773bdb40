"""Host speed of the compile path (host wall time of this machine, not predicted IPU time).

For each model: the host seconds ``openipu run`` spends compiling it (``InferenceSession`` +
``prepareDevice``: PopART lowering, PopLibs planning, Poplar engine compile and memory plan), and
the predicted figures next to it, so a speed change that moves a prediction shows up here too.
Also the host seconds of ``examples/poplar/tut4.py --oom`` (a 9000x7500 matmul: graph build,
compile and memory plan until the out-of-memory error), run as a subprocess.

Each figure comes from its own process (cold caches, imports excluded from the model figures).
Usage: ``python benchmarks/compile_speed.py [--models m1,m2] [--no-tut4]``.
"""

import argparse
import os
import subprocess
import sys
import time

MODELS = ("light_resnet50", "light_bvlc_alexnet", "light_squeezenet")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_ONE = """
import sys
from openipu import runner
r = runner.run_model(sys.argv[1])
print(f"{r.host_compile_seconds:.3f} {r.step_cycles!r} {r.tile_bytes_max} {r.tile_bytes_mean!r}")
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--no-tut4", action="store_true")
    a = ap.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    print(f"{'model':<22} {'host compile s':>14}  {'pred. step cycles':>17} {'pred. max B/tile':>16} {'pred. mean B/tile':>18}")
    for m in a.models.split(","):
        p = subprocess.run([sys.executable, "-c", _ONE, m], capture_output=True, text=True, env=env, cwd=ROOT)
        if p.returncode:
            print(f"{m:<22} failed: {p.stderr.strip().splitlines()[-1]}")
            continue
        secs, cyc, mx, mean = p.stdout.split()[-4:]
        print(f"{m:<22} {float(secs):>14.2f}  {float(cyc):>17,.0f} {int(mx):>16,} {float(mean):>18,.2f}")
    if not a.no_tut4:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "poplar", "tut4.py"), "--oom"],
                           capture_output=True, text=True, env=env, cwd=ROOT)
        ok = "out of memory" in (p.stdout + p.stderr).lower()
        print(f"{'tut4.py --oom':<22} {time.perf_counter() - t0:>14.2f}  (host wall seconds of the whole script, "
              f"imports included; {'out-of-memory error as expected' if ok else 'UNEXPECTED OUTPUT'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
