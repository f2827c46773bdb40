"""The Graph Analyser HTML report in headless chromium (playwright): no console errors, every
view renders, the numbers match pva; screenshots saved under build/test-artifacts/popvision."""

import os
import re

import pytest

import pva
from conftest import ROOT
from openipu import cli, runner
from openipu.popvision.browser import VIEWS, check_page
from test_popvision import _mlp

ARTIFACTS = os.path.join(ROOT, "build", "test-artifacts", "popvision")


@pytest.fixture(scope="module")
def two_profiles(tmp_path_factory):
    d = tmp_path_factory.mktemp("pvhtml")
    _mlp(d / "mlp.onnx")
    runner.run_model(str(d / "mlp.onnx"), report_dir=str(d / "a"))
    runner.run_model(str(d / "mlp.onnx"), report_dir=str(d / "b"), available_memory_proportion=0.1)
    runner.run_model(str(d / "mlp.onnx"), report_dir=str(d / "off"), offline=True, batch_size=16, precision="fp16")
    return d


def test_report_html_in_chromium(two_profiles, capsys):
    d = two_profiles
    out = str(d / "report.html")
    assert cli.main(["report", str(d / "a"), "-o", out, "--compare", str(d / "b")]) == 0
    printed = capsys.readouterr().out
    r = pva.openReport(str(d / "a"))
    c = r.compilation
    t, b = c.worstTile()
    page = check_page(out, os.path.join(ARTIFACTS, "mlp"), compare=True)
    assert page["errors"] == []
    assert all(page["rendered"].values()), page["rendered"]
    assert set(VIEWS) <= set(page["rendered"])
    assert page["texts"]["total-memory"] == f"{c.totalMemory:,}"
    assert page["texts"]["worst-tile"].startswith(f"tile {t}: {b:,} B")
    assert page["texts"]["cycles-per-run"] == f"{r.execution.runs[0].cycles:,}"
    step, peak = c.livenessPeak()
    assert page["texts"]["liveness-peak"] == f"{peak:,} B at program step {step}"
    assert f"{c.totalMemory:,}" in printed
    assert all(os.path.getsize(p) > 1000 for p in page["screenshots"])
    assert any(p.endswith("execution-trace-hover.png") for p in page["screenshots"])
    # the run's options, and a run on the IPU Model has a host time
    assert page["texts"]["batch-size"] == "8" and page["texts"]["precision"] == "fp32"
    assert page["texts"]["throughput"].endswith("runs/s of 8 samples)")
    assert page["texts"]["host-seconds"].endswith(" s")
    # the trace's hover gives the bar's own duration (issue 42: it gave where the bar ends)
    cyc = c.stepCycles()["compute"]
    assert page["trace_hovers"] and all(page["trace_hovers"]), page["trace_hovers"]
    for text in page["trace_hovers"]:
        m = re.search(r"\(step (\d+)\)\s*compute ([\d,]+) cycles, from cycle ([\d,]+)", text)
        assert m, text
        assert int(m.group(2).replace(",", "")) == round(float(cyc[int(m.group(1)), 0]))
    starts = [int(re.search(r"from cycle ([\d,]+)", t).group(1).replace(",", "")) for t in page["trace_hovers"]]
    assert starts == sorted(starts) and starts[-1] > 0
    # named programs, the Operations view and the peak's live variables
    labels = page["tree_labels"]
    assert labels[0].startswith("program 0 (Sequence)") and any(x.startswith("batchesPerStep (Repeat x1)")
                                                                for x in labels), labels
    assert "program 1: weightsFromHost (Sequence): empty" in labels, labels
    assert any(x.startswith("MatMul/h/Conv (OnTileExecute)  [step 2, ") for x in labels), labels
    assert page["ops"][0][0] == "MatMul/h" and page["ops"][0][1] == "MatMul", page["ops"][:3]
    assert {"MatMul/h", "Relu/r", "MatMul/y"} <= {row[0] for row in page["ops"]}
    peak_names = {row[0] for row in page["peak_variables"]}
    assert {v.name for v in c.livenessPeakVariables()} == peak_names and "MatMul/h" in peak_names
    assert page["texts"]["peak-variables-summary"].startswith(f"At program step {step:,} (the peak, {peak:,} ")


def test_offline_report_has_no_host_time(two_profiles):
    d = two_profiles
    out = str(d / "off.html")
    assert cli.main(["report", str(d / "off"), "-o", out]) == 0
    page = check_page(out, os.path.join(ARTIFACTS, "mlp-offline"))
    assert page["errors"] == [] and all(page["rendered"].values()), page
    t = page["texts"]
    assert "host-seconds" not in t
    assert t["mode"].startswith("offline prediction")
    assert t["batch-size"] == "16" and t["precision"] == "fp16"
    cycles = int(t["cycles-per-run"].replace(",", ""))
    r = pva.openReport(str(d / "off"))
    assert t["throughput"].startswith(f"{r.compilation.target.clockFrequency / cycles * 16:,.1f} samples/s")


def test_report_errors(tmp_path, capsys):
    (tmp_path / "profile.pop").write_text("nope")
    assert cli.main(["report", str(tmp_path)]) == 1
    assert "NotAReport" in capsys.readouterr().err


def test_sweep_plot_in_chromium(two_profiles):
    """``openipu sweep --plot``'s page: no console errors, both panels drawn, the batch axis
    ticked at the batches swept, the fits line; screenshot in build/test-artifacts/sizing."""
    from playwright.sync_api import sync_playwright

    from openipu import sizing
    from openipu.popvision.browser import CHROMIUM
    d = two_profiles
    sw = sizing.Sweeper(str(d / "mlp.onnx"), tiles_per_ipu=16)
    sw.sweep([sizing.PointSpec(b) for b in (8, 16, 64)])
    (d / "sweep.html").write_text(sizing.plot_html(sw, sw.points))
    shot = os.path.join(ROOT, "build", "test-artifacts", "sizing", "sweep-plot.png")
    os.makedirs(os.path.dirname(shot), exist_ok=True)
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto("file://" + str(d / "sweep.html"), wait_until="load")
            page.wait_for_selector("#sweep .main-svg", timeout=30_000)
            ticks = page.locator("#sweep .xaxislayer-above text").all_text_contents()
            notes = page.locator("#sweep .annotation-text").all_text_contents()
            page.screenshot(path=shot, full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert ticks == ["8", "16", "64"] * 2 or ticks == ["8", "16", "64"], ticks     # one or both panels
    assert any(t.startswith("tile memory") for t in notes), notes
    assert os.path.getsize(shot) > 1000
