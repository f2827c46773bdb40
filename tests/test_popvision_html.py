"""The Graph Analyser HTML report in headless chromium (playwright): no console errors, every
view renders, the numbers match pva; screenshots saved under build/test-artifacts/popvision."""

import os

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


def test_report_errors(tmp_path, capsys):
    (tmp_path / "profile.pop").write_text("nope")
    assert cli.main(["report", str(tmp_path)]) == 1
    assert "NotAReport" in capsys.readouterr().err
