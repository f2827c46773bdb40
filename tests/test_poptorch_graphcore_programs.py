"""Graphcore's own PopTorch programs, unmodified, through ``examples/poptorch/run_graphcore_program.py``
(the torchvision stand-in, hubs offline): PopTorch's user-guide examples (``docs/user_guide``, read
from ``$POPTORCH_SRC`` or this host's mirror of graphcore/poptorch, never its tests) and
graphcore/examples' octave-convolution feature example. Each must exit 0; the user-guide examples
check their own results with asserts (``buffers.py`` its counters, ``error_handling.py`` the
exception's fields, ``phased_execution.py`` runs the three strategies). Slow: each compiles a few
models (~6-15 s CPU); the full list and its results are in ``docs/poptorch-wild.md``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "examples" / "poptorch" / "run_graphcore_program.py"


def _from_mirror(env: str, mirror: str, path: str) -> str | None:
    root = os.environ.get(env)
    if root and (Path(root) / path).exists():
        return (Path(root) / path).read_text()
    repo = Path("/work/.mirror") / mirror / "repo"
    if repo.exists():
        r = subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{path}"], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout
    return None


def _run(tmp_path, name, src, *args):
    (tmp_path / name).write_text(src)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HOME=str(tmp_path))
    p = subprocess.run([sys.executable, str(RUNNER), str(tmp_path / name), *args], cwd=tmp_path, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0, p.stdout[-4000:]
    return p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", ["buffers.py", "error_handling.py", "phased_execution.py", "api.py"])
def test_poptorch_user_guide_example(tmp_path, name):
    src = _from_mirror("POPTORCH_SRC", "graphcore+poptorch", f"docs/user_guide/{name}")
    if src is None:
        pytest.skip("graphcore/poptorch is not available (set POPTORCH_SRC to a checkout)")
    conf = _from_mirror("POPTORCH_SRC", "graphcore+poptorch", "docs/user_guide/poptorch.conf")
    if conf is not None:
        (tmp_path / "poptorch.conf").write_text(conf)
    _run(tmp_path, name, src)


@pytest.mark.slow
def test_octconv_feature_example(tmp_path):
    pytest.importorskip("octconv")
    src = _from_mirror("GRAPHCORE_EXAMPLES", "graphcore+examples",
                       "tutorials/feature_examples/pytorch/octconv/octconv_example.py")
    if src is None:
        pytest.skip("graphcore/examples is not available (set GRAPHCORE_EXAMPLES to a checkout)")
    out = _run(tmp_path, "octconv_example.py", src, "--conv-mode", "octave", "--epochs", "1",
               "--batches-per-step", "2", "--test-batch-size", "8")
    assert "Accuracy on test set" in out
