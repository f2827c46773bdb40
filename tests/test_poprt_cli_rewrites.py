"""The ``poprt`` command line's graph-rewrite flags on all-MiniLM-L6-v2 (real weights) and small
ONNX models: ``--merge_matmul(_add)``, ``--serialize_matmul(_add)``, ``--max_tensor_size``,
``--checkpoints``, ``--custom_pass_config``, and the one-line errors of the flags the simulator
cannot honour (``--custom_library_so_paths``, ``--custom_shape_inference``, ``--merge_moe``).

Each rewrite is checked against onnxruntime on the original model (the rewritten models are plain
ONNX), and the rewrites that change the compile are checked in the predicted IPU cycles.
"""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from openipu.poprt import cli
from openipu.poprt.compiler import Compiler, CompilerOptions


def _ort(model, feeds, outputs=None):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(outputs, feeds)


@pytest.fixture(scope="module")
def minilm(minilm_export):
    path, data = minilm_export
    model = onnx.load(str(path))
    by_src = {}
    for n in model.graph.node:
        if n.op_type == "MatMul":
            by_src.setdefault(n.input[0], []).append(n.name)
    qkv = [v for v in by_src.values() if len(v) == 3]           # Q, K, V of each of the 6 layers
    assert len(qkv) == 6
    feeds = {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}
    return path, model, qkv, feeds, _ort(model, feeds)[0]


def _convert(tmp_path, src, *flags):
    out = tmp_path / "out.onnx"
    rc = cli.main(["-i", str(src), "--output_model", str(out), *map(str, flags)])
    assert rc == 0
    return onnx.load(str(out))


def _cycles(model):
    return Compiler.compile(model, ["last_hidden_state"], CompilerOptions(ipu_version="ipu21")).prediction.compute_cycles


def _count(model, op):
    return sum(n.op_type == op for n in model.graph.node)


def test_merge_matmul_add_fuses_qkv_and_predicts_fewer_cycles(minilm, tmp_path, capsys):
    src, model, qkv, feeds, ref = minilm
    groups = ";".join(",".join(g) for g in qkv)
    merged = _convert(tmp_path, src, "--merge_matmul_add", groups)
    assert "merge_matmul_add 6" in capsys.readouterr().out
    assert _count(merged, "MatMul") == _count(model, "MatMul") - 12
    assert _count(merged, "Split") == _count(model, "Split") + 6
    y = _ort(merged, feeds)[0]
    assert float(np.abs(y - ref).max()) < 1e-4
    # one [384, 1152] matmul per layer instead of three [384, 384] ones: fewer predicted cycles
    base, fused = _cycles(model), _cycles(merged)
    assert fused < 0.95 * base, (base, fused)
    plain = _convert(tmp_path, src, "--merge_matmul", ",".join(qkv[0]))
    assert _count(plain, "MatMul") == _count(model, "MatMul") - 2
    assert float(np.abs(_ort(plain, feeds)[0] - ref).max()) < 1e-4


@pytest.mark.parametrize("mode", ["output_channels", "input_channels", "reducing_dim"])
def test_serialize_matmul_modes(minilm, tmp_path, mode):
    src, model, qkv, feeds, ref = minilm
    specs = [f"{g[0]}=4/{mode}" for g in qkv]
    out = _convert(tmp_path, src, "--serialize_matmul", *specs)
    assert _count(out, "MatMul") == _count(model, "MatMul") + 6 * 3
    combine = "Sum" if mode == "reducing_dim" else "Concat"
    assert _count(out, combine) >= _count(model, combine) + 6
    assert float(np.abs(_ort(out, feeds)[0] - ref).max()) < 1e-4
    if mode == "output_channels":        # four quarter-size matmuls one after another: more cycles
        assert _cycles(out) > _cycles(model)


def test_serialize_matmul_add_splits_the_bias(minilm, tmp_path):
    src, model, qkv, feeds, ref = minilm
    out = _convert(tmp_path, src, "--serialize_matmul_add", f"{qkv[0][0]}=3/output_channels",
                   f"{qkv[1][0]}=2/reducing_dim")
    assert _count(out, "MatMul") == _count(model, "MatMul") + 2 + 1
    assert float(np.abs(_ort(out, feeds)[0] - ref).max()) < 1e-4


def _expand_model():
    """y = x + Expand(c, [64, 64]): folding the Expand stores a 16 KiB constant."""
    c = numpy_helper.from_array(np.array([[0.5]], np.float32), "c")
    shape = numpy_helper.from_array(np.array([64, 64], np.int64), "shape")
    nodes = [helper.make_node("Expand", ["c", "shape"], ["big"]), helper.make_node("Add", ["x", "big"], ["y"])]
    g = helper.make_graph(nodes, "expand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [c, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("limit,folded", [(-1, True), (64 * 64 * 4, True), (1024, False)])
def test_max_tensor_size_limits_constant_folding(tmp_path, limit, folded):
    src = tmp_path / "expand.onnx"
    onnx.save(_expand_model(), str(src))
    out = _convert(tmp_path, src, "--max_tensor_size", limit)
    assert (_count(out, "Expand") == 0) == folded
    assert any(t.name == "big" for t in out.graph.initializer) == folded
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_allclose(_ort(out, {"x": x})[0], x + 0.5)


def test_checkpoints_become_outputs_of_the_executable(minilm, tmp_path):
    src, model, qkv, feeds, ref = minilm
    out = _convert(tmp_path, src, "--checkpoints", "layer_norm,layer_norm_1", "--export_popef")
    names = [o.name for o in out.graph.output]
    assert names[-2:] == ["layer_norm", "layer_norm_1"]
    assert [d.dim_value for d in out.graph.output[-1].type.tensor_type.shape.dim] == [2, 16, 384]
    from openipu.poprt.runtime import Runner
    r = Runner(str(tmp_path / "out.popef"))
    assert {"layer_norm", "layer_norm_1"} <= {d.name for d in r.get_model_outputs()}
    res = r.execute(feeds)
    want = _ort(out, feeds, ["layer_norm"])[0]        # onnxruntime on the model with the extra outputs
    assert float(np.abs(res["layer_norm"] - want).max()) < 1e-4
    assert float(np.abs(res["last_hidden_state"] - ref).max()) < 1e-3


def test_custom_pass_config_runs_passes_with_arguments(minilm, tmp_path, capsys):
    src, model, qkv, feeds, ref = minilm
    cfg = tmp_path / "passes.yaml"
    cfg.write_text("passes:\n  - name: fused_attention\n  - name: attention_padding\n    pad_to: 24\n")
    _convert(tmp_path, src, "--custom_pass_config", cfg)
    assert "fused_attention 6, attention_padding 6" in capsys.readouterr().out
    cfg_json = tmp_path / "passes.json"
    cfg_json.write_text(json.dumps({"fused_attention": {}}))
    out = _convert(tmp_path, src, "--custom_pass_config", cfg_json)
    assert _count(out, "FusedAttention") == 6


@pytest.mark.parametrize("flags,msg", [
    (["--custom_library_so_paths", "custom_ops.so"], "cannot be loaded into the simulator"),
    (["--custom_shape_inference", "shape.py"], "shape functions belong to C++ custom ops"),
    (["--merge_moe", "experts"], "grouped-MatMul MoE op"),
    (["--serialize_matmul", "node_MatMul_55=4/columns"], "unknown mode 'columns'"),
    (["--serialize_matmul", "node_MatMul_55"], "expected NAME=FACTOR"),
    (["--serialize_matmul", "Nope=2"], "no MatMul named 'Nope'"),
    (["--merge_matmul", "node_MatMul_55,node_MatMul_123"], "do not read the same input"),
    (["--checkpoints", "not_a_tensor"], "no tensor 'not_a_tensor'"),
    (["--pack_args", "max_valid_num=40", "head_pattern=x"], "pack / unpack / repack op mode is not implemented"),
    (["--custom_pass_config", "{tmp}/missing.yaml"], "no such file"),
])
def test_unsupported_and_bad_rewrite_flags_give_one_line(minilm, tmp_path, capfd, flags, msg):
    src = minilm[0]
    flags = [f.format(tmp=tmp_path) for f in flags]
    rc = cli.main(["-i", str(src), "--output_dir", str(tmp_path), *flags])
    assert rc != 0
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("poprt: error:") and msg in err[0], err
