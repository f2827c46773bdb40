"""``openipu sweep --jobs N``: batch sizes predicted in forked worker processes give the output of
``--jobs 1``; ``--max-batch`` rounds of several batches find the bisection's answer; a worker
that dies is its points' error; Ctrl-C exits 130 and leaves no worker behind."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openipu import cli, forked_jobs, sizing
from test_sizing import _mlp, _validate_sweep

pytestmark = pytest.mark.skipif(not forked_jobs.fork_available(), reason="needs the fork start method")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return _mlp(tmp_path_factory.mktemp("jobs") / "mlp.onnx")


def _without_host(doc):
    doc = json.loads(json.dumps(doc))
    doc.pop("host")
    for p in doc["points"]:
        p.pop("host_seconds")
        p.get("run", {}).pop("host", None)
    return doc


def _table(text):
    """The table's rows without the host-seconds column."""
    lines = text.split("Prediction for the IPU")[1].split("Host (this machine")[0].splitlines()
    return [line.rsplit(None, 1)[0] for line in lines[1:] if line.strip()]


def test_jobs_2_writes_what_jobs_1_does(mlp, tmp_path, capsys):
    outs = {}
    for jobs in ("1", "2"):
        out = tmp_path / jobs
        code = cli.main(["sweep", mlp, "--batch-sizes", "8-32", "--amp", "0.3,0.6", "--tiles-per-ipu", "16",
                         "--jobs", jobs, "--csv", str(out / "s.csv"), "--json", str(out / "s.json"),
                         "--plot", str(out / "s.html")])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        outs[jobs] = captured
    assert "2 worker process(es) for 2 batch size(s) (--jobs 2;" in outs["2"].err
    assert "2 worker processes at once" in outs["2"].out and "every point in this process" in outs["1"].out
    assert _table(outs["1"].out) == _table(outs["2"].out) and len(_table(outs["1"].out)) == 8
    rows = {j: [{k: v for k, v in r.items() if k != "host_seconds"} for r in csv.DictReader(open(tmp_path / j / "s.csv"))]
            for j in outs}
    assert rows["1"] == rows["2"] and [int(r["batch"]) for r in rows["1"]] == [8, 16, 32, 8, 16, 32]
    docs = {j: json.loads((tmp_path / j / "s.json").read_text()) for j in outs}
    for d in docs.values():
        _validate_sweep(d)
    assert _without_host(docs["1"]) == _without_host(docs["2"])
    assert docs["2"]["host"]["jobs"] == 2 and docs["2"]["host"]["worker_peak_rss_bytes"] > 0
    assert docs["1"]["host"]["jobs"] == 1 and docs["1"]["host"]["worker_peak_rss_bytes"] is None
    plot = {j: (tmp_path / j / "s.html").read_text() for j in outs}
    assert plot["1"] == plot["2"]


@pytest.mark.parametrize("largest", [None, 1, 5, 374, 4096])
def test_max_batch_rounds_find_the_bisections_answer_when_memory_grows(largest, monkeypatch):
    """Against a stand-in model that fits up to ``largest`` (None: not even batch 1): the k-ary
    rounds answer what the serial search does, from starts below and above it (the rounds' tasks
    run in this process here; the real model's test below forks)."""
    from types import SimpleNamespace

    rounds = []

    def run_tasks(tasks, work, jobs, on_result, on_lost):
        rounds.append([t[0].batch for t in tasks])
        assert len(tasks) <= jobs
        for t in tasks:
            work(t, on_result)
        return [None]
    monkeypatch.setattr(sizing.forked_jobs, "run_tasks", run_tasks)

    def predict(self, spec):
        p = sizing.Point(spec, SimpleNamespace(fits=largest is not None and spec.batch <= largest), 0.0)
        self._done[spec] = p
        self.points.append(p)
        return p
    monkeypatch.setattr(sizing.Sweeper, "predict", predict)
    model = onnx_stub()
    template = sizing.PointSpec(1)
    for start, limit in ((8, 4096), (600, 1000)):
        serial, tried = sizing.Sweeper(model).max_batch(template, start=start, limit=limit)
        for jobs in (2, 3):
            sw = sizing.Sweeper(model)
            rounds.clear()
            assert sw.max_batch(template, start=start, limit=limit, jobs=jobs)[0] == serial, (start, limit, jobs)
            assert len(rounds) <= len(tried)              # never more rounds than the bisection's points


def onnx_stub():
    from onnx import helper
    return helper.make_model(helper.make_graph([], "stub", [], []))


@pytest.mark.slow
def test_max_batch_rounds_find_the_bisections_answer(mlp):
    template = sizing.PointSpec(1, "ipu2", 1, "fp32")
    serial, tried_serial = sizing.Sweeper(mlp, tiles_per_ipu=4).max_batch(template, start=8, limit=100_000)
    for jobs in (2, 3):
        sw = sizing.Sweeper(mlp, tiles_per_ipu=4)
        best, tried = sw.max_batch(template, start=8, limit=100_000, jobs=jobs)
        assert best == serial, jobs
        assert sw.jobs == jobs                              # the rounds ran in workers
        assert any(p.spec.batch == best and p.fits for p in tried)
        assert any(p.spec.batch == best + 1 and not p.fits for p in tried)
    # a start that does not fit: the search goes below it, as the bisection does
    low, _ = sizing.Sweeper(mlp, tiles_per_ipu=4).max_batch(template, start=serial + 5, limit=100_000, jobs=3)
    assert low == serial
    # the limit fits: it is the answer
    assert sizing.Sweeper(mlp, tiles_per_ipu=4).max_batch(template, start=8, limit=20, jobs=2)[0] == 20


def test_a_killed_worker_is_its_points_error(mlp, monkeypatch):
    parent, real = os.getpid(), sizing.Sweeper.predict

    def predict(self, spec):
        if os.getpid() != parent and spec.batch == 16:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, spec)
    monkeypatch.setattr(sizing.Sweeper, "predict", predict)
    sw = sizing.Sweeper(mlp, tiles_per_ipu=16)
    specs = [sizing.PointSpec(b, available_memory_proportion=a) for b in (8, 16, 32) for a in (0.3, 0.6)]
    points = sw.sweep(specs, jobs=2)
    assert [p.spec for p in points] == specs
    for p in points:
        if p.spec.batch == 16:
            assert p.run is None and "killed by SIGKILL (signal 9)" in p.error and "batch 16" in p.error
        else:
            assert p.run is not None and p.fits
    assert not forked_jobs.multiprocessing.active_children()


def test_a_failing_task_and_the_results_order():
    got, lost = [], []

    def work(task, send):
        for x in task:
            if x < 0:
                raise ValueError(f"negative {x}")
            send(x * 10)
    forked_jobs.run_tasks([[1, 2], [3, -1, 4], [5]], work, 2, got.append,
                          lambda task, n, why: lost.append((task, n, why)))
    assert sorted(got) == [10, 20, 30, 50]
    assert lost == [([3, -1, 4], 1, "ValueError: negative -1")]
    assert forked_jobs.died_because(-9).startswith("killed by SIGKILL") and forked_jobs.died_because(1) == \
        "exited with status 1"


def _children(pid):
    try:
        return [int(c) for t in os.listdir(f"/proc/{pid}/task")
                for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_ctrl_c_exits_130_and_leaves_no_worker(mlp, tmp_path):
    """Also while a worker is being forked: a KeyboardInterrupt raised in os.fork's hooks would
    be printed and dropped (seen: the sweep went on), so the parent holds it until the fork is
    done (sent at a random moment, this caught that in 2 of 5 runs before the fix)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-m", "openipu.cli", "sweep", mlp, "--batch-sizes", "8-4096:8",
                          "--tiles-per-ipu", "16", "--jobs", "2", "--csv", str(tmp_path / "s.csv")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    seen = set()
    for _ in range(1200):               # until workers run (a guard against a hang, not a timing)
        seen.update(_children(p.pid))
        if seen or p.poll() is not None:
            break
        time.sleep(0.1)
    assert seen, "no worker process started"
    time.sleep(0.5)
    seen.update(_children(p.pid))
    os.killpg(p.pid, signal.SIGINT)     # Ctrl-C: the whole foreground process group
    out, err = p.communicate(timeout=600)
    assert p.returncode == 130, err
    assert "interrupted after" in err and "samples/s" in out
    assert (tmp_path / "s.csv").exists()
    for _ in range(100):
        if not any(_alive(c) for c in seen):
            break
        time.sleep(0.1)
    assert not any(_alive(c) for c in seen), "a worker outlived the sweep"


_TORCH_AFTER_FORK = """
import torch
from openipu import forked_jobs
torch.set_num_threads(2)
x, i = torch.randn(100_000, 16), torch.randint(0, 100_000, (100_000,))
x.index_select(0, i)                          # the parent's OpenMP team now exists

def work(task, send):
    send(float(x.index_select(0, i).sum()))   # a parallel region in the child, had it two threads
got = []
forked_jobs.run_tasks([1, 2], work, 2, got.append, lambda *a: got.append(a))
print(len(got), all(isinstance(g, float) for g in got))
"""


def test_torch_in_a_worker_after_the_parent_used_its_threads():
    """libgomp's thread team does not survive fork: a worker using torch's parallel kernels would
    wait forever unless it runs torch single-threaded."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", _TORCH_AFTER_FORK], capture_output=True, text=True, env=env,
                         timeout=600)      # a guard against the hang, not a timing
    assert out.returncode == 0 and out.stdout.split() == ["2", "True"], out.stderr
