"""Fuzzing ``openipu run``: seeded byte- and structure-mutated ONNX models (``tests/fuzz_models.py``)
must each end in a run or a clean error, never an unexpected exception, a crash or a hang.

The in-process cases run in one worker subprocess at a time (restarted after a crash): a case
that kills the worker by a signal (SIGSEGV, SIGABRT ...) fails with the signal's name, one that
prints nothing for ``CASE_TIMEOUT`` seconds fails as a hang. A few cases also go through the
CLI (``python -m openipu.cli run``): exit status 0-3, no traceback, errors one line.

Counts: ``OPENIPU_FUZZ_CASES`` (default 40 in-process; ``make fuzz`` runs 500),
``OPENIPU_FUZZ_SEED`` (default 2026), ``OPENIPU_FUZZ_CLI_CASES`` (default 4),
``OPENIPU_FUZZ_LIGHT=1`` adds the onnx package's light SqueezeNet to the base models (``make
fuzz``), ``OPENIPU_FUZZ_TIMEOUT`` (seconds a case may take, default 120). The outcome counts
are printed at the end of the run (pytest ``-s`` not needed).
"""

from __future__ import annotations

import collections
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
CASES = int(os.environ.get("OPENIPU_FUZZ_CASES", "40"))
SEED = int(os.environ.get("OPENIPU_FUZZ_SEED", "2026"))
CLI_CASES = int(os.environ.get("OPENIPU_FUZZ_CLI_CASES", "4"))
CASE_TIMEOUT = float(os.environ.get("OPENIPU_FUZZ_TIMEOUT", "120"))
#: the worker's start-up (imports, base models) on a loaded 2-core host
START_TIMEOUT = 180.0

SUMMARY: dict = {}


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run_worker(first: int, last: int, results: dict) -> int:
    """Run cases [first, last) in one worker; record each; return the next case to run (after
    a crash or hang, the one after the culprit)."""
    p = subprocess.Popen([sys.executable, str(HERE / "fuzz_models.py"), str(SEED), str(first), str(last)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), text=True, bufsize=1)
    current, deadline = None, time.monotonic() + START_TIMEOUT
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([p.stdout], [], [], max(0.0, left))
            if not ready:
                p.kill()
                p.wait()
                if current is None:
                    pytest.fail(f"the fuzz worker did not start within {START_TIMEOUT:.0f} s")
                results[current] = {"case": current, "kind": "?", "outcome": "hang",
                                    "detail": f"no result within {CASE_TIMEOUT:.0f} s"}
                return current + 1
            line = p.stdout.readline()
            if not line:                    # the worker ended
                rc = p.wait()
                if current is not None and current not in results:
                    name = signal.Signals(-rc).name if rc < 0 else f"exit {rc}"
                    err = p.stderr.read()[-2000:]
                    results[current] = {"case": current, "kind": "?", "outcome": "crash",
                                        "detail": f"{name}: {err.strip().splitlines()[-1] if err.strip() else ''}"}
                    return current + 1
                if rc != 0:
                    pytest.fail(f"the fuzz worker failed (status {rc}): {p.stderr.read()[-3000:]}")
                return last
            if line.startswith("start "):
                current = int(line.split()[1])
                deadline = time.monotonic() + CASE_TIMEOUT
            elif line.startswith("{"):
                r = json.loads(line)
                results[r["case"]] = r
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


def test_fuzzed_models_run_or_are_refused_cleanly():
    results: dict = {}
    nxt = 0
    while nxt < CASES:
        nxt = _run_worker(nxt, CASES, results)
    counts = collections.Counter(r["outcome"] for r in results.values())
    SUMMARY["in-process"] = (counts, results)
    bad = [r for r in results.values() if r["outcome"] not in ("ok", "refused")]
    assert len(results) == CASES
    assert not bad, "\n".join(f"case {r['case']} {r['kind']}: {r['outcome']}: {r['detail']}" for r in bad[:20])


def test_fuzzed_models_through_the_cli(tmp_path):
    sys.path.insert(0, str(HERE))
    import fuzz_models
    bases = fuzz_models.base_models()
    counts: collections.Counter = collections.Counter()
    bad = []
    for i in range(CLI_CASES):
        index = 1_000_000 + i
        kind, data, inputs = fuzz_models.make_case(SEED, index, bases)
        path = tmp_path / f"cli{i}.onnx"
        path.write_bytes(data)
        cmd = [sys.executable, "-m", "openipu.cli", "run", str(path), "--tiles-per-ipu", "64", "--seed", str(i)]
        if inputs is not None:
            import numpy as np
            np.savez(tmp_path / f"cli{i}.npz", **inputs)
            cmd += ["--input", str(tmp_path / f"cli{i}.npz")]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=CASE_TIMEOUT)
        except subprocess.TimeoutExpired:
            counts["hang"] += 1
            bad.append(f"{kind}: hang")
            continue
        err = p.stderr.strip().splitlines()
        if p.returncode < 0:
            outcome = f"crash {signal.Signals(-p.returncode).name}"
        elif p.returncode not in (0, 1, 2, 3) or "Traceback" in p.stderr:
            outcome = "unclean"
        elif p.returncode in (1, 2) and (not err or not err[-1].startswith("openipu")
                                          or "unexpected error" in err[-1]):
            outcome = "unclean"
        else:
            outcome = {0: "ok", 1: "refused", 2: "usage", 3: "does not fit"}[p.returncode]
        counts[outcome] += 1
        if outcome.startswith(("crash", "unclean")):
            bad.append(f"{kind}: {outcome} (status {p.returncode}): {p.stderr[-800:]}")
    SUMMARY["cli"] = (counts, None)
    assert not bad, "\n".join(bad)


def summary_lines() -> list[str]:
    """The outcome counts of this run's fuzz tests (printed by ``conftest.pytest_terminal_summary``)."""
    if not SUMMARY:
        return []
    lines = [f"fuzz seed {SEED}"]
    for where, (counts, results) in SUMMARY.items():
        total = sum(counts.values())
        lines.append(f"{where}: {total} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        if results:
            kinds = collections.Counter(r["detail"].split(":")[0] for r in results.values()
                                        if r["outcome"] == "refused")
            lines.append("  refused by: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common()))
            by_kind = collections.Counter(r["kind"].split(":", 1)[-1].split("-")[0].split("+")[0]
                                          for r in results.values())
            lines.append("  mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    out = os.environ.get("OPENIPU_FUZZ_SUMMARY")
    if out:
        Path(out).write_text("\n".join(lines) + "\n")
    return lines
