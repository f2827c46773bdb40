"""``openipu run MODEL.popef``: a PopRT executable run (its outputs against onnxruntime) or
predicted offline, with the prediction it was compiled with."""

import numpy as np
import pytest
from test_poprt_runtime import BATCH, D_IN, _mlp, _ref

from openipu import cli
from poprt.compiler import Compiler, CompilerOptions


@pytest.fixture(scope="module")
def popef(tmp_path_factory):
    m, w = _mlp()
    path = tmp_path_factory.mktemp("popef") / "mlp.popef"
    opts = CompilerOptions()
    opts.num_io_tiles = 32
    Compiler.compile_and_export(m.SerializeToString(), ["probs"], str(path), opts)
    return path, w


def test_run_popef_with_given_inputs(popef, tmp_path, capsys):
    path, w = popef
    x = np.random.default_rng(3).standard_normal((BATCH, D_IN)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    rc = cli.main(["run", str(path), "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz")])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "Executable" in text and "ipu21 x 1, batch 4" in text and "probs: float32 [4, 10]" in text
    assert "predicted IPU (ipu21, batch 4, batches_per_step 1, 32 I/O tiles, overlapped I/O): latency" in text
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["probs"], _ref(x, w), rtol=1e-5, atol=1e-6)


def test_popef_offline_and_refusals(popef, tmp_path, capsys):
    path, _w = popef
    assert cli.main(["run", str(path), "--offline"]) == 0
    text = capsys.readouterr().out
    assert "predicted IPU (ipu21" in text and "Outputs" not in text
    assert cli.main(["run", str(path), "--json"]) == 2
    assert "--json and --report take an ONNX model" in capsys.readouterr().err
    bad = tmp_path / "bad.popef"
    bad.write_bytes(b"not an executable")
    assert cli.main(["run", str(bad)]) == 1
    assert "Cannot load the executable" in capsys.readouterr().err
