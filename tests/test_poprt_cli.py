"""The ``poprt`` command line on the bundled light models: conversion, pass listing, export, and
one-line errors with a non-zero exit for bad input."""

import subprocess
import sys

import numpy as np
import onnx
import pytest

from openipu import runner
from openipu.poprt import cli
from openipu.poprt.passes import get_registered_passes


def _poprt(*args):
    p = subprocess.run([sys.executable, "-m", "openipu.poprt.cli", *map(str, args)], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_fp16_conversion_of_a_bundled_model(tmp_path):
    src = runner.resolve_model("light_squeezenet")
    out = tmp_path / "sq_fp16.onnx"
    rc, text, err = _poprt("--input_model", src, "--output_model", out, "--precision", "fp16", "--batch_size", "2")
    assert rc == 0, err
    assert f"wrote {out}" in text
    m16 = onnx.load(str(out))
    m32 = onnx.load(str(src))
    (vi,) = [v for v in m16.graph.input if v.name == runner.model_inputs(m32)[0].name]
    assert vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert vi.type.tensor_type.shape.dim[0].dim_value == 2
    m32 = runner.set_batch_size(m32, 2)
    x = np.random.default_rng(0).standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
    ref = _ort(m32, {vi.name: x})[0]
    y = _ort(m16, {vi.name: x.astype(np.float16)})[0].astype(np.float32)
    assert np.abs(y - ref).max() <= 1e-2 * max(np.abs(ref).max(), 1e-6)


def test_default_output_name_and_passes(tmp_path, capsys):
    src = runner.resolve_model("light_squeezenet")
    assert cli.main(["-i", str(src), "--output_dir", str(tmp_path), "--passes", "remove_initializer_from_input"]) == 0
    out = tmp_path / "light_squeezenet.fp32.onnx"
    assert out.is_file()
    onnx.checker.check_model(onnx.load(str(out)))


def test_list_all_passes(capsys):
    assert cli.main(["--list_all_passes"]) == 0
    text = capsys.readouterr().out
    for name in get_registered_passes():
        assert name in text


@pytest.mark.parametrize("args,rc,msg", [
    (["--input_model", "{m}", "--no_such_flag"], 2, "unrecognized arguments: --no_such_flag"),
    (["--input_model", "{m}", "--precision", "fp7"], 2, "invalid choice: 'fp7'"),
    (["--input_model", "{m}", "--passes", "not_a_pass"], 1, "Pass 'not_a_pass' is not registered"),
    (["--input_model", "{m}", "--precision", "fp8", "--ipu_version", "ipu2"], 1, "precision fp8 needs an IPU with fp8"),
    (["--input_model", "{tmp}/missing.onnx"], 2, "no such file"),
    (["--input_model", "{m}", "--input_shape", "data_0"], 2, "expected NAME=D0,D1"),
    (["--input_model", "{tmp}/garbage.onnx"], 2, "cannot read"),
])
def test_bad_input_gives_one_line_and_a_nonzero_exit(tmp_path, args, rc, msg):
    (tmp_path / "garbage.onnx").write_bytes(b"\x00not an onnx model\xff" * 10)
    m = runner.resolve_model("light_squeezenet")
    args = [a.format(m=m, tmp=tmp_path) for a in args] + ["--output_dir", str(tmp_path)]
    code, out, err = _poprt(*args)
    assert code == rc, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poprt: error:") and msg in lines[0], err


def test_export_popef(tmp_path):
    compiler = pytest.importorskip("openipu.poprt.compiler")
    src = runner.resolve_model("light_squeezenet")
    out = tmp_path / "sq.onnx"
    rc, text, err = _poprt("-i", src, "--output_model", out, "--precision", "fp16", "--export_popef",
                           "--num_io_tiles", "32", "--available_memory_proportion", "0.4", "--compiler_options",
                           "batches_per_step=2")
    assert rc == 0, err
    popef = tmp_path / "sq.popef"
    assert popef.is_file() and f"wrote {popef}" in text
    # the prediction of the exported executable, with the configuration it assumes
    assert "poprt: predicted IPU (ipu21, batch 1, batches_per_step 2, 32 I/O tiles, overlapped I/O): latency" in text
    from openipu.poprt.runtime import Runner
    r = Runner(str(popef))
    assert [i.name for i in r.get_model_inputs()]
    assert r.predicted.summary("ipu21") in text
    del compiler
