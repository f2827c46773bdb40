"""Sizing from the command line: ``openipu run --json`` against its schema, exit codes, the
inference options, the planner's least-memory fallback, and ``openipu sweep`` (table, CSV, JSON,
plot, ``--max-batch``) whose shared work does not change a point's prediction."""

import csv
import json
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from referencing import Registry, Resource

from openipu import __version__, cli, runner, sizing

DOCS = Path(__file__).resolve().parents[1] / "docs"
RUN_SCHEMA = json.loads((DOCS / "run.schema.json").read_text())
SWEEP_SCHEMA = json.loads((DOCS / "sweep.schema.json").read_text())


def _validate_run(doc):
    jsonschema.Draft202012Validator(RUN_SCHEMA).validate(doc)


def _validate_sweep(doc):
    reg = Registry().with_resource(RUN_SCHEMA["$id"], Resource.from_contents(RUN_SCHEMA))
    jsonschema.Draft202012Validator(SWEEP_SCHEMA, registry=reg).validate(doc)


def _mlp(path, batch=8, din=256, hidden=512, dout=10):
    """x [batch, din] -> MatMul -> Relu -> MatMul -> y [batch, dout], seeded weights."""
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "W2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, din])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, dout])],
        [numpy_helper.from_array((rng.standard_normal((din, hidden)) / 16).astype(np.float32), "W1"),
         numpy_helper.from_array((rng.standard_normal((hidden, dout)) / 16).astype(np.float32), "W2")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return str(path)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return _mlp(tmp_path_factory.mktemp("sizing") / "mlp.onnx")


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"openipu {__version__}"


def test_run_json_validates_and_keeps_prediction_and_host_apart(mlp, capsys):
    code = cli.main(["run", mlp, "--json", "--ipu", "ipu21", "--precision", "fp16"])
    doc = json.loads(capsys.readouterr().out)           # the whole of stdout is one document
    assert code == 0 and doc["exit_status"] == 0
    _validate_run(doc)
    p, t = doc["prediction"], doc["target"]
    assert p["fits"] and p["tile_memory"]["shortfall_bytes"] == 0
    assert p["latency_seconds"] == pytest.approx(p["latency_cycles"] / t["clock_hz"])
    assert p["throughput_samples_per_second"] == pytest.approx(8 * t["clock_hz"] / p["period_cycles"])
    assert sum(p["tile_memory"]["by_category_bytes"].values()) >= p["tile_memory"]["max_bytes"]
    assert doc["options"] == {"precision": "fp16", "partials_type": "half", "available_memory_proportion": 0.6,
                              "num_io_tiles": 0, "overlap_io": False, "batches_per_step": 1, "prefetch": True}
    assert "not host time" in p["label"] and "not an IPU figure" in doc["host"]["label"]
    assert doc["outputs"]["y"]["shape"] == [8, 10] and doc["outputs"]["y"]["dtype"] == "float16"
    with pytest.raises(jsonschema.ValidationError):             # the schema can fail
        _validate_run({**doc, "options": {**doc["options"], "partials_type": "double"}})


def test_does_not_fit_exit_3_prints_latency_and_shortfall(tmp_path, capsys):
    model = _mlp(tmp_path / "big.onnx", hidden=4096)
    code = cli.main(["run", model, "--tiles-per-ipu", "4", "--json"])
    doc = json.loads(capsys.readouterr().out)
    _validate_run(doc)
    p = doc["prediction"]
    assert code == 3 == doc["exit_status"] and not p["fits"]
    assert p["latency_seconds"] > 0 and p["throughput_samples_per_second"] > 0
    assert p["tile_memory"]["shortfall_bytes"] == p["tile_memory"]["max_bytes"] - doc["target"]["bytes_per_tile"] > 0
    code = cli.main(["run", model, "--tiles-per-ipu", "4"])
    text = capsys.readouterr().out
    assert code == 3 and "shortfall" in text and f"{p['tile_memory']['shortfall_bytes']:,} B over" in text
    assert "latency" in text and "Options   fp32, float partials" in text


def test_no_plan_within_budget_warns_and_reports_not_fitting(tmp_path, capsys, monkeypatch):
    """PopLibs' planner: no plan within the budget is a PO:POPLIN warning and the least-memory
    plan; `openipu run` then reports the graph as not fitting (exit 3), not a poplibs_error."""
    log = tmp_path / "poplar.log"
    monkeypatch.setenv("POPLAR_LOG_LEVEL", "WARN")
    monkeypatch.setenv("POPLAR_LOG_DEST", str(log))
    model = _mlp(tmp_path / "wide.onnx", batch=64, din=4096, hidden=4096)
    code = cli.main(["run", model, "--tiles-per-ipu", "2", "--offline", "--json"])
    doc = json.loads(capsys.readouterr().out)
    _validate_run(doc)
    over = doc["prediction"]["over_budget_plans"]
    assert code == 3 and over and all(o["temp_bytes"] > o["budget_bytes"] for o in over)
    assert "PO:POPLIN [W]" in log.read_text() and "unable to meet memory target" in log.read_text()


def test_inference_options_io_tiles_overlap_and_usage_errors(mlp, capsys):
    base = runner.run_model(mlp, ipu="ipu21", batch_size=64, precision="fp16", offline=True)
    io = runner.run_model(mlp, ipu="ipu21", batch_size=64, precision="fp16", offline=True, num_io_tiles=32)
    serial = runner.run_model(mlp, ipu="ipu21", batch_size=64, precision="fp16", offline=True, num_io_tiles=32,
                              overlap_io=False)
    assert io.compute_tiles_per_ipu == io.tiles_per_ipu - 32 == 1440 and io.options.overlapped
    assert io.io_tile_bytes_needed == 64 * (256 + 10) * 2 and io.io_to_compute_cycles > 0
    assert io.period_cycles == max(io.compute_cycles + io.io_to_compute_cycles, io.host_io_cycles)
    assert io.period_cycles < serial.period_cycles == serial.latency_cycles     # overlap only helps throughput
    assert base.options.num_io_tiles == 0 and not base.options.overlapped
    assert base.period_cycles == base.latency_cycles == pytest.approx(base.step_cycles)
    assert cli.main(["run", mlp, "--overlap-io"]) == 2
    assert "--overlap-io needs I/O tiles" in capsys.readouterr().err
    assert cli.main(["run", mlp, "--num-io-tiles", "736"]) == 2
    assert cli.main(["run", mlp, "--partials-type", "double"]) == 2


def test_sweep_points_match_single_runs(mlp):
    """Shared work (model, conversion, IR, plans) leaves every point's prediction as a single run's."""
    sw = sizing.Sweeper(mlp)
    specs = [sizing.PointSpec(b, "ipu21", 1, "fp16", part, amp) for b in (8, 32) for amp in (0.1, 0.6)
             for part in ("half", "float")] + [sizing.PointSpec(32, "ipu2", 1, "fp16", "half", 0.6, 16)]
    points = sw.sweep(specs)
    assert [p.spec for p in points] == specs
    for p in points[::3] + points[-1:]:
        s = p.spec
        one = runner.run_model(mlp, ipu=s.ipu, batch_size=s.batch, precision=s.precision, offline=True,
                               partials_type=s.partials_type, available_memory_proportion=s.available_memory_proportion,
                               num_io_tiles=s.num_io_tiles)
        assert p.run.step_cycles == one.step_cycles and p.run.tile_bytes_max == one.tile_bytes_max, s
        assert p.run.throughput == pytest.approx(one.throughput)
        assert p.run.options == one.options
        mine, alone = p.run.to_dict(), one.to_dict()          # every field of openipu run --json
        for k in ("prediction", "target", "options", "assumptions"):
            assert mine[k] == alone[k], (s, k)
    shared = [p for p in points if p.same_plans_as is not None]
    assert shared and all(p.spec.available_memory_proportion < p.same_plans_as.available_memory_proportion
                          for p in shared)
    low = next(p for p in shared)
    one = runner.run_model(mlp, ipu=low.spec.ipu, batch_size=low.spec.batch, precision=low.spec.precision,
                           offline=True, partials_type=low.spec.partials_type,
                           available_memory_proportion=low.spec.available_memory_proportion)
    assert low.run.step_cycles == one.step_cycles and low.run.tile_bytes_max == one.tile_bytes_max
    assert one.plan_temp_bytes_max <= low.spec.available_memory_proportion * one.bytes_per_tile


def test_sweep_releases_each_points_graph_before_the_next(mlp, monkeypatch):
    """A point's compiled graph (engine, lowered program, Poplar graph) is freed once the point is
    predicted, so the next compile does not run beside it; the IR stays for the next point."""
    import weakref

    graphs, real = [], runner.run_model

    def run_model(*a, _sessions=None, **k):
        r = real(*a, _sessions=_sessions, **k)
        for session in _sessions.values():
            graphs.append((weakref.ref(session._engine), weakref.ref(session._engine.graph)))
        return r
    monkeypatch.setattr(runner, "run_model", run_model)
    sw = sizing.Sweeper(mlp)
    for partials in ("float", "half"):             # the second compiles the first's IR again
        sw.predict(sizing.PointSpec(8, "ipu21", 1, "fp16", partials))
        assert sw._sessions and all(s._ir is not None for s in sw._sessions.values())
        assert all(e() is None and g() is None for e, g in graphs)
    assert len(graphs) == 2


def test_sweep_drops_the_float_model_once_converted_and_reads_it_again(mlp):
    """A model read from a file is not held beside its half conversion; a float point reads it
    again and predicts what a lone run does."""
    sw = sizing.Sweeper(mlp)
    half, full = sizing.PointSpec(8, "ipu21", 1, "fp16"), sizing.PointSpec(8, "ipu21", 1, "fp32")
    assert sw.predict(half).run is not None and sw._read is None
    p = sw.predict(full)
    one = runner.run_model(mlp, ipu="ipu21", batch_size=8, precision="fp32", offline=True)
    assert p.run.to_dict()["prediction"] == one.to_dict()["prediction"]


def test_max_batch_is_the_largest_that_fits(mlp):
    sw = sizing.Sweeper(mlp, tiles_per_ipu=4)
    template = sizing.PointSpec(1, "ipu2", 1, "fp32")
    best, tried = sw.max_batch(template, start=8, limit=100_000)
    assert best is not None and 8 < best < 100_000
    assert sw.predict(sizing.PointSpec(best, *template.others())).fits
    assert not sw.predict(sizing.PointSpec(best + 1, *template.others())).fits
    assert len(tried) < 2 * np.log2(best) + 4                      # doubling, then bisection


def test_max_batches_search_the_highest_proportion_first(mlp):
    """--max-batch over AMPs 0.3 and 0.6: 0.6 is searched first, and 0.3's points take its plans
    where they fit 0.3's budget; the batch found is the one a search of 0.3 alone finds."""
    sw = sizing.Sweeper(mlp, tiles_per_ipu=4)
    lo, hi = sizing.PointSpec(1, "ipu2", 1, "fp32", available_memory_proportion=0.3), \
        sizing.PointSpec(1, "ipu2", 1, "fp32", available_memory_proportion=0.6)
    found = sw.max_batches([lo, hi], start=8, limit=100_000)
    assert [t for t, _ in found] == [lo, hi]
    first = [p.spec.available_memory_proportion for p in sw.points]
    assert first[0] == 0.6 and any(p.same_plans_as is not None for p in sw.points)
    alone, _ = sizing.Sweeper(mlp, tiles_per_ipu=4).max_batch(lo, start=8, limit=100_000)
    assert found[0][1] == alone


def test_sweep_cli_table_csv_json_plot(mlp, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["sweep", mlp, "--batch-sizes", "8-32", "--amp", "0.3,0.6", "--tiles-per-ipu", "16",
                     "--max-batch", "--batch-limit", "64", "--csv", str(out / "s.csv"), "--json", str(out / "s.json"),
                     "--plot", str(out / "s.html")])
    captured = capsys.readouterr()
    text = captured.out
    assert code == 0
    assert "(predicted above)" in captured.err          # --max-batch revisiting a grid point says so
    for needle in ("not host time", "samples/s", "worst tile", "Largest batch that fits", "AMP 0.3", "Host (this "):
        assert needle in text, needle
    rows = list(csv.DictReader(open(out / "s.csv")))
    assert [int(r["batch"]) for r in rows] == [8, 16, 32, 8, 16, 32]
    assert {r["available_memory_proportion"] for r in rows} == {"0.3", "0.6"}
    doc = json.loads((out / "s.json").read_text())
    _validate_sweep(doc)
    assert len(doc["points"]) == 6 and len(doc["max_batch"]) == 2
    page = (out / "s.html").read_text()
    assert "Predicted throughput" in page and "tile memory" in page and "plotly" in page.lower()
    assert '"tickvals":[8,16,32,' in page.replace(" ", "")      # the batch axis labelled by the batches swept


def test_sweep_interrupted_writes_the_points_done(mlp, tmp_path, capsys, monkeypatch):
    """Ctrl-C during a long sweep: exit 130, and the table, CSV and JSON of the points predicted."""
    real = sizing.Sweeper.predict
    calls = []

    def predict(self, spec):
        calls.append(spec)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, spec)
    monkeypatch.setattr(sizing.Sweeper, "predict", predict)
    out = tmp_path / "out"
    code = cli.main(["sweep", mlp, "--batch-sizes", "8,16,32", "--tiles-per-ipu", "16", "--csv", str(out / "s.csv"),
                     "--json", str(out / "s.json"), "--jobs", "1"])      # --jobs 2: test_sizing_jobs.py
    captured = capsys.readouterr()
    assert code == sizing.EXIT_INTERRUPTED == 130
    assert "interrupted after 2 point(s)" in captured.err and "samples/s" in captured.out
    assert [int(r["batch"]) for r in csv.DictReader(open(out / "s.csv"))] == [8, 16]
    doc = json.loads((out / "s.json").read_text())
    _validate_sweep(doc)
    assert doc["interrupted"] is True and [p["spec"]["batch"] for p in doc["points"]] == [8, 16]


def test_sweep_exit_3_when_nothing_fits_and_usage(tmp_path, capsys):
    model = _mlp(tmp_path / "big.onnx", hidden=4096)
    assert cli.main(["sweep", model, "--batch-sizes", "8", "--tiles-per-ipu", "4", "--precision", "fp32"]) == 3
    assert "NO" in capsys.readouterr().out
    assert cli.main(["sweep", model, "--batch-sizes", "8,x"]) == 2
    assert cli.main(["sweep", model, "--precision", "fp64"]) == 2
    assert cli.main(["sweep", model, "--amp", "1.5"]) == 2


@pytest.mark.slow
def test_compile_bar_on_a_terminal_only(mlp):
    """`openipu run` shows Poplar's "Graph compilation" bar on stderr when it is a terminal, and
    ends it at 100%; with stderr a pipe there is no bar."""
    import os
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "openipu.cli", "run", mlp, "--offline"]
    env = {**os.environ, "COLUMNS": "120"}
    import fcntl
    import struct
    import termios
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))    # a 120 x 40 terminal
    try:
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=slave, env=env, timeout=600)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:             # EIO: the pty's other end is closed and drained
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    assert p.returncode == 0
    assert "Graph compilation" in err and "100%" in err, err
    piped = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert piped.returncode == 0 and "Graph compilation" not in piped.stderr


@pytest.mark.slow
def test_popart_session_over_budget_plan_is_an_out_of_memory_report(tmp_path):
    """A PopART session whose matmul has no plan within the budget compiles as Poplar would: the
    least-memory plan, then OutOfMemoryException (Poplar's graph_memory_allocation_error) with the
    memory report, as for any graph that does not fit; not a poplibs_error."""
    import popart
    model = _mlp(tmp_path / "wide.onnx", batch=64, din=4096, hidden=4096)
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "ipuVersion": "ipu2", "tilesPerIPU": 2})
    s = popart.InferenceSession(fnModel=Path(model).read_bytes(), deviceInfo=dev,
                                dataFlow=popart.DataFlow(1, {"y": popart.AnchorReturnType("ALL")}))
    from openipu.poplibs.poplin.plan import record_over_budget
    with pytest.raises(popart.OutOfMemoryException) as e, record_over_budget() as over:
        s.prepareDevice()
    assert over and "Out of memory" in str(e.value) and e.value.getSummaryReport()
