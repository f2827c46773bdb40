"""The gc-* tools on simulated IPUs."""

import json
import os
import subprocess
import sys
import time

import pytest

from openipu.tools import gc


def test_gc_flops_bow_fp32_matches_the_published_figure(capsys):
    assert gc.gc_flops(["--arch", "bow", "-p", "FP32"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("Flops per IPU (FP32):"))
    tflops = float(line.split(":")[1].split()[0])
    assert tflops == pytest.approx(87.1078, rel=1e-3)       # docs.graphcore.ai gc-flops page, Bow at 1850 MHz
    assert "IPU clock speed: 1850 MHz" in out
    assert gc.gc_flops(["--arch", "bow", "-j"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["precision"] == "FP16" and j["tera_flops_per_ipu"] == pytest.approx(348.6, rel=1e-3)
    assert gc.gc_flops(["--arch", "ipu2", "-p", "fp32", "-j"]) == 0
    assert json.loads(capsys.readouterr().out)["tera_flops_per_ipu"] == pytest.approx(62.4, rel=5e-3)   # Pod128 datasheet / 128 (derived)


def test_gc_info(capsys, monkeypatch):
    monkeypatch.setenv("OPENIPU_NUM_IPUS", "4")
    assert gc.gc_info(["--list-devices"]) == 0
    out = capsys.readouterr().out
    assert out.count("-+- Id:") == 7 and "Multi IPU" in out     # 4 single, 2 pairs, 1 quad
    assert gc.gc_info(["--device-info", "-d", "6", "-j"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["number of IPUs"] == "4" and info["tiles per IPU"] == "1472"
    with pytest.raises(SystemExit, match="device id 9"):
        gc.gc_info(["--device-info", "-d", "9"])


def test_exchange_and_link_bandwidth(capsys):
    assert gc.gc_exchangetest(["-j"]) == 0
    r = json.loads(capsys.readouterr().out)["ipus"][0]
    # 4 bytes per cycle per tile at 1.33 GHz, less the phase and message overheads
    assert 0.9 * 4 * 1.33e9 < r["bytes_per_s_per_tile"] <= 4 * 1.33e9
    assert gc.gc_iputraffictest(["--arch", "bow", "-j"]) == 0
    pairs = json.loads(capsys.readouterr().out)["pairs"]
    assert len(pairs) == 3 and 0.95 * 320e9 < pairs[0]["bytes_per_s"] <= 320e9


def test_gc_monitor_sees_another_process(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENIPU_STATE_DIR", str(tmp_path))
    assert gc.gc_monitor(["-j"]) == 0
    assert json.loads(capsys.readouterr().out)["attached"] == []
    code = ("import popart, sys, time\n"
            "d = popart.DeviceManager().acquireAvailableDevice(2)\n"
            "print('attached', flush=True)\n"
            "sys.stdin.readline()\n"
            "d.detach()\n")
    env = dict(os.environ, OPENIPU_STATE_DIR=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "attached"
        assert gc.gc_monitor(["-j"]) == 0
        recs = json.loads(capsys.readouterr().out)["attached"]
        assert [(r["pid"], r["num_ipus"]) for r in recs] == [(p.pid, 2)]
        assert gc.gc_monitor([]) == 0
        assert str(p.pid) in capsys.readouterr().out
    finally:
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait()
    assert gc.gc_monitor(["-j"]) == 0
    assert json.loads(capsys.readouterr().out)["attached"] == []


def test_console_scripts_resolve():
    """Every console script in pyproject.toml names a function that exists."""
    import importlib
    import tomllib

    from conftest import ROOT
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert {"gc-info", "gc-flops", "gc-exchangetest", "gc-iputraffictest", "gc-monitor"} <= set(scripts)
    for name, target in scripts.items():
        mod, fn = target.split(":")
        assert callable(getattr(importlib.import_module(mod), fn)), name
    # and one runs as a script would: a fresh interpreter, argv from the command line
    p = subprocess.run([sys.executable, "-c", "import sys; from openipu.tools.gc import gc_flops; "
                        "sys.exit(gc_flops())", "-p", "FP32", "--arch", "bow"], capture_output=True, text=True)
    assert p.returncode == 0 and "Flops per IPU (FP32): 87.1424 teraFLOPS" in p.stdout
