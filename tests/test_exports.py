"""Real exported models: ``transformers`` models exported with ``torch.onnx`` run through
``openipu run`` and match onnxruntime on the same inputs (max |difference| within 1e-4 of the
output's scale, fp32).

- BERT for SQuAD exported three ways (dynamo at batch 1, the legacy exporter at a fixed batch 40,
  the legacy exporter with a dynamic batch), each run with ``--batch-size 4``;
- a symbolic batch without ``--batch-size`` is an error naming the option;
- PopRT's batch-size pass on small hand-built graphs (checked with onnxruntime);
- import-time fixes found on real exports (0-d folded constants, INT64_MAX slice ends, kernel
  output shapes, kernel failures as PopART errors naming the op);
- ten common architectures at tiny configs (slow: each needs a dynamo export).
"""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from openipu import cli, runner
from openipu.poprt import set_batch_size

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TOL = 1e-4


def _check_close(got, ref, what=""):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    scale = max(float(np.abs(ref).max()), 1e-6)
    diff = float(np.abs(got - ref).max())
    assert diff <= TOL * scale, f"{what}: max |diff| {diff:.3g} > {TOL} x scale {scale:.3g}"


def _ort(model, feeds):
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


# ---------------------------------------------------------------------------------------------
# BERT for SQuAD, exported three ways
# ---------------------------------------------------------------------------------------------
SEQ, BATCH = 16, 4
BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
BERT_OUTPUTS = ["start_logits", "end_logits"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """Tiny BertForQuestionAnswering (2 layers, hidden 64, 2 heads) exported three ways, batch-4
    inputs with padding masks that differ per sample, and onnxruntime's outputs on them."""
    d = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                                  vocab_size=1000)
    model = transformers.BertForQuestionAnswering(cfg).eval()

    class QA(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return o.start_logits, o.end_logits

    qa = QA(model).eval()

    def example(b):
        return (torch.randint(0, 1000, (b, SEQ)), torch.ones(b, SEQ, dtype=torch.int64),
                torch.zeros(b, SEQ, dtype=torch.int64))

    names = dict(input_names=BERT_INPUTS, output_names=BERT_OUTPUTS)
    paths = {"dynamo_batch1": d / "bert_dynamo.onnx", "legacy_batch40": d / "bert_legacy40.onnx",
             "legacy_dynamic": d / "bert_legacy_dynamic.onnx"}
    torch.onnx.export(qa, example(1), str(paths["dynamo_batch1"]), dynamo=True, **names)
    torch.onnx.export(qa, example(40), str(paths["legacy_batch40"]), dynamo=False, opset_version=17, **names)
    torch.onnx.export(qa, example(2), str(paths["legacy_dynamic"]), dynamo=False, opset_version=17,
                      dynamic_axes={n: {0: "batch"} for n in BERT_INPUTS + BERT_OUTPUTS}, **names)
    rng = np.random.default_rng(1)
    mask = np.ones((BATCH, SEQ), np.int64)
    for b in range(BATCH):
        mask[b, SEQ - 1 - 3 * b:] = 0                      # a different padding per sample
    feeds = {"input_ids": rng.integers(0, 1000, (BATCH, SEQ)).astype(np.int64), "attention_mask": mask,
             "token_type_ids": (rng.random((BATCH, SEQ)) < 0.5).astype(np.int64)}
    np.savez(d / "in.npz", **feeds)
    ref = _ort(paths["legacy_dynamic"], feeds)
    qa.eval()                     # the legacy exporter restores the wrapper's mode recursively
    with torch.no_grad():
        want = qa(*(torch.from_numpy(feeds[n]) for n in BERT_INPUTS))
    for name, t in zip(BERT_OUTPUTS, want):          # the reference itself is right
        _check_close(ref[name], t.numpy(), f"onnxruntime {name}")
    return d, paths, ref


@pytest.mark.parametrize("variant", ["dynamo_batch1", "legacy_batch40", "legacy_dynamic"])
def test_bert_export_runs_with_batch_size(bert, variant, capsys):
    d, paths, ref = bert
    out = d / f"out_{variant}.npz"
    code = cli.main(["run", str(paths[variant]), "--batch-size", str(BATCH), "--input", str(d / "in.npz"),
                     "--output", str(out)])
    text = capsys.readouterr()
    assert code == 0, text.err
    assert re.search(rf"; batch {BATCH}$", text.out, re.M)
    with np.load(out) as f:
        for name in BERT_OUTPUTS:
            _check_close(f[name], ref[name], f"{variant} {name}")


def test_bert_fixed_batch_export_offline_prediction(bert, capsys):
    _, paths, _ = bert
    assert cli.main(["run", str(paths["legacy_batch40"]), "--batch-size", "4", "--offline"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"; batch 4$", text, re.M) and "latency" in text and "offline: nothing run" in text


def test_symbolic_batch_without_batch_size_names_the_option(bert, capsys):
    _, paths, _ = bert
    assert cli.main(["run", str(paths["legacy_dynamic"])]) == 1
    err = capsys.readouterr().err
    assert "--batch-size" in err and "input_ids" in err and "Traceback" not in err
    # arrays given for the inputs fix their shapes instead
    proto = onnx.load(str(paths["legacy_dynamic"]), load_external_data=False)
    fixed = runner.fix_input_shapes(proto, {n: np.zeros((3, SEQ), np.int64) for n in BERT_INPUTS})
    assert [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim] == [3, SEQ]


# ---------------------------------------------------------------------------------------------
# PopRT's batch-size pass on small graphs (the rewritten model is run by onnxruntime)
# ---------------------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)   # onnxruntime reads <= 13
    onnx.checker.check_model(m)
    return m


def _per_sample(model, feeds, b0):
    """The outputs of ``model`` (fixed batch ``b0``) on ``feeds`` of any batch: by chunks of b0."""
    n = next(iter(feeds.values())).shape[0]
    outs = [_ort(model, {k: v[i:i + b0] for k, v in feeds.items()}) for i in range(0, n, b0)]
    return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def test_batch_pass_realigns_reshapes_of_a_batch_1_export():
    """Reshape targets from a Constant node and initializers, one merging batch and heads."""
    f = TensorProto.FLOAT
    nodes = [_const("s1", np.array([1, 6, -1, 4], np.int64)),
             helper.make_node("Reshape", ["x", "s1"], ["a"]),                        # [1, 6, 2, 4]
             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3]),          # [1, 2, 6, 4]
             helper.make_node("Reshape", ["b", "s2"], ["c"]),                         # [2, 6, 4]: batch x heads
             helper.make_node("Mul", ["c", "c"], ["c2"]),
             helper.make_node("Reshape", ["c2", "s3"], ["d"]),                        # [1, 2, 6, 4]
             helper.make_node("Transpose", ["d"], ["e"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["e", "s4"], ["y"])]                         # [1, 6, 8]
    m = _model(nodes, [helper.make_tensor_value_info("x", f, [1, 6, 8])], [helper.make_tensor_value_info("y", f, [1, 6, 8])],
               [("s2", np.array([2, 6, 4], np.int64)), ("s3", np.array([1, 2, 6, 4], np.int64)),
                ("s4", np.array([1, 6, 8], np.int64))])
    x = np.random.default_rng(0).standard_normal((3, 6, 8)).astype(np.float32)
    got = _ort(set_batch_size(m, 3), {"x": x})["y"]
    np.testing.assert_allclose(got, _per_sample(m, {"x": x}, 1)["y"], rtol=1e-6)


def test_batch_pass_follows_mask_batch_indices_and_expands():
    """A vmap-style attention mask: GatherND with the batch index in its constant indices (the
    dynamo export at batch 1), Gather by arange-built batch indices into a flattened mask (the
    legacy export at batch B0), an Expand to [B0, ...] and a broadcast constant of B0 rows."""
    i64, f = TensorProto.INT64, TensorProto.FLOAT
    b0, s = 2, 5
    nd_idx = np.stack(np.broadcast_arrays(np.arange(b0)[:, None], np.arange(s)[None, :]), -1)   # [b0, s, 2]
    flat_idx = (np.arange(b0)[:, None] * s + np.arange(s)[None, :]).astype(np.int64)            # [b0, s]
    rows = np.tile(np.arange(s, dtype=np.float32), (b0, 1))                                       # equal rows
    nodes = [helper.make_node("GatherND", ["mask", "nd_idx"], ["m1"]),                         # [b0, s]
             helper.make_node("Flatten", ["mask"], ["flat"], axis=2),                           # [b0*s, 1]
             helper.make_node("Gather", ["flat", "flat_idx"], ["m2"]),                          # [b0, s, 1]
             helper.make_node("Squeeze", ["m2", "ax2"], ["m3"]),
             helper.make_node("Add", ["m1", "m3"], ["m4"]),
             helper.make_node("Cast", ["m4"], ["m5"], to=f),
             helper.make_node("Unsqueeze", ["m5", "ax1"], ["m6"]),                              # [b0, 1, s]
             helper.make_node("Expand", ["m6", "shape"], ["m7"]),                               # [b0, 3, s]
             helper.make_node("Add", ["m7", "rows3"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("mask", i64, [b0, s])],
               [helper.make_tensor_value_info("y", f, [b0, 3, s])],
               [("nd_idx", nd_idx.astype(np.int64)), ("flat_idx", flat_idx), ("ax1", np.array([1], np.int64)),
                ("ax2", np.array([2], np.int64)), ("shape", np.array([b0, 3, s], np.int64)),
                ("rows3", rows[:, None, :].repeat(3, 1))])
    mask = np.random.default_rng(1).integers(0, 2, (6, s)).astype(np.int64)
    for batch in (6, 1):
        got = _ort(set_batch_size(m, batch), {"mask": mask[:batch]})["y"]
        np.testing.assert_array_equal(got, _per_sample(m, {"mask": mask[:max(batch, b0)]}, b0)["y"][:batch])


def test_batch_pass_resizes_a_large_folded_constant():
    """The token-type embeddings of a fixed-batch transformers export: a Gather of a [2, E] table
    by constant zeros [B0, S] folds to a [B0, S, E] constant above the walk's value limit, added
    to the batch-carrying word embeddings (all-MiniLM-L6-v2 exported at batch 8 x 128)."""
    from openipu.poprt import batch as batch_pass
    f = TensorProto.FLOAT
    b0, s, e = 2, 64, 1024
    assert b0 * s * e > batch_pass.VALUE_LIMIT
    table = np.random.default_rng(2).standard_normal((2, e)).astype(np.float32)
    m = _model([helper.make_node("Gather", ["table", "tt"], ["emb"]),
                helper.make_node("Add", ["x", "emb"], ["y"])],
               [helper.make_tensor_value_info("x", f, [b0, s, e])], [helper.make_tensor_value_info("y", f, [b0, s, e])],
               [("table", table), ("tt", np.zeros((b0, s), np.int64))])
    x = np.random.default_rng(3).standard_normal((5, s, e)).astype(np.float32)
    got = _ort(set_batch_size(m, 5), {"x": x})["y"]
    np.testing.assert_array_equal(got, x + table[0])


def test_batch_pass_refuses_per_sample_constants():
    f = TensorProto.FLOAT
    m = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add_bias")],
               [helper.make_tensor_value_info("x", f, [2, 4])], [helper.make_tensor_value_info("y", f, [2, 4])],
               [("w", np.array([[1, 5, 2, 0], [3, 3, 9, 1]], np.float32))])
    with pytest.raises(ValueError, match="add_bias.*dynamic batch"):
        set_batch_size(m, 4)
    assert set_batch_size(m, 2).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2


# ---------------------------------------------------------------------------------------------
# import-time fixes found on real exports
# ---------------------------------------------------------------------------------------------
def test_folded_scalar_stays_scalar_through_shape_arithmetic():
    """Shape -> Gather(scalar index) -> Unsqueeze -> Concat -> Reshape, as the legacy exporter
    writes a dynamic-batch view (a folded 0-d constant used to become [1])."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), _const("zero", np.array(0, np.int64)),
             helper.make_node("Gather", ["sh", "zero"], ["b"]), _const("ax", np.array([0], np.int64)),
             helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]), _const("rest", np.array([-1], np.int64)),
             helper.make_node("Concat", ["b1", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [3, 2, 4])],
                          [helper.make_tensor_value_info("y", f, [3, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(2).standard_normal((3, 2, 4)).astype(np.float32)
    res = runner.run_model(m, inputs={"x": x})
    np.testing.assert_array_equal(res.outputs["y"], x.reshape(3, 8))
    assert i64  # (types used above)


def test_slice_to_int64_max_keeps_every_element():
    """``x[..., 4:]`` as exporters write it (ends = INT64_MAX): the end used to wrap to -1 in the
    32-bit device constant and drop the last element (LLaMA's rotary embedding)."""
    f = TensorProto.FLOAT
    m = _model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])],
               [helper.make_tensor_value_info("x", f, [2, 8])], [helper.make_tensor_value_info("y", f, [2, 4])],
               [("st", np.array([4], np.int64)), ("en", np.array([np.iinfo(np.int64).max], np.int64)),
                ("ax", np.array([-1], np.int64))])
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_array_equal(runner.run_model(m, inputs={"x": x}).outputs["y"], x[:, 4:])


def test_kernel_output_shape_is_checked_at_import(monkeypatch):
    import popart

    from openipu.popart import onnx_ops
    from openipu.popart.onnx_ops import OpKernel, get_kernel

    real = get_kernel("", "Slice")
    monkeypatch.setitem(onnx_ops._REGISTRY, ("", "Slice"),
                        OpKernel("", "Slice", lambda i, a, o: [x[..., :-1] for x in real.fn(i, a, o)]))
    f = TensorProto.FLOAT
    m = _model([helper.make_node("Slice", ["x", "st", "en"], ["y"], name="cut")],
               [helper.make_tensor_value_info("x", f, [2, 8])], [helper.make_tensor_value_info("y", f, [2, 8])],
               [("st", np.array([0], np.int64)), ("en", np.array([2], np.int64))])
    with pytest.raises(popart.popart_exception, match=r"Slice:17 'cut'.*\[2, 7\].*\[2, 8\]"):
        runner.run_model(m, offline=True)


def test_kernel_failure_when_running_names_the_op(tmp_path, capsys):
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    m = _model([helper.make_node("GatherElements", ["D", "i"], ["y"], axis=1, name="pick")],
               [helper.make_tensor_value_info("i", i64, [4, 8])], [helper.make_tensor_value_info("y", f, [4, 8])],
               [("D", np.arange(16, dtype=np.float32).reshape(2, 8))], opset=13)
    onnx.save(m, str(tmp_path / "ge.onnx"))
    assert cli.main(["run", str(tmp_path / "ge.onnx")]) == 1
    err = capsys.readouterr().err
    assert "GatherElements 'pick'" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# ten common architectures (tiny configs, random weights), dynamo export at opset 20
# ---------------------------------------------------------------------------------------------
def _tiny(name):
    T = transformers
    torch.manual_seed(0)
    b, s = 2, 16

    def ids(v=1000, n=s):
        return torch.randint(0, v, (b, n))

    mask = torch.ones(b, s, dtype=torch.int64)
    if name == "bert":
        c = T.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, vocab_size=1000)
        return T.BertModel(c), {"input_ids": ids(), "attention_mask": mask}
    if name == "roberta":
        c = T.RobertaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                            vocab_size=1000)
        return T.RobertaModel(c), {"input_ids": ids(), "attention_mask": mask}
    if name == "distilbert":
        c = T.DistilBertConfig(n_layers=2, dim=64, n_heads=2, hidden_dim=128, vocab_size=1000)
        return T.DistilBertModel(c), {"input_ids": ids(), "attention_mask": mask}
    if name == "gpt2":
        c = T.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64, use_cache=False,
                         bos_token_id=0, eos_token_id=0)
        return T.GPT2LMHeadModel(c), {"input_ids": ids()}
    if name == "llama":
        c = T.LlamaConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=256, vocab_size=1000, use_cache=False, max_position_embeddings=128)
        return T.LlamaForCausalLM(c), {"input_ids": ids(n=64)}
    if name == "t5":
        c = T.T5Config(num_layers=2, d_model=64, num_heads=2, d_kv=32, d_ff=128, vocab_size=1000)
        c._attn_implementation = "eager"       # torch.export's decomposition of the sdpa path fails
        return T.T5EncoderModel(c), {"input_ids": ids()}
    if name == "vit":
        c = T.ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                        image_size=32, patch_size=8)
        return T.ViTModel(c), {"pixel_values": torch.randn(b, 3, 32, 32)}
    if name == "resnet":
        c = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
        return T.ResNetModel(c), {"pixel_values": torch.randn(b, 3, 32, 32)}
    if name == "convnext":
        c = T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)
        return T.ConvNextModel(c), {"pixel_values": torch.randn(b, 3, 32, 32)}
    if name == "whisper":
        c = T.WhisperConfig(encoder_layers=2, d_model=64, encoder_attention_heads=2, encoder_ffn_dim=128,
                            num_mel_bins=16, max_source_positions=16, decoder_layers=1, decoder_attention_heads=2,
                            decoder_ffn_dim=128, vocab_size=1000, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                            decoder_start_token_id=1)
        return T.WhisperForConditionalGeneration(c).get_encoder(), {"input_features": torch.randn(b, 16, 32)}
    raise KeyError(name)


ARCHITECTURES = ["bert", "roberta", "distilbert", "gpt2", "llama", "t5", "vit", "resnet", "convnext", "whisper"]


def _export_tiny(name, path):
    model, args = _tiny(name)
    names = list(args)

    class First(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *xs):
            return self.m(**dict(zip(names, xs)))[0]

    torch.onnx.export(First(model.eval()), tuple(args.values()), str(path), dynamo=True, opset_version=20,
                      input_names=names, output_names=["out"], external_data=False)
    return {k: v.numpy() for k, v in args.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_architecture_matches_onnxruntime(name, tmp_path):
    feeds = _export_tiny(name, tmp_path / f"{name}.onnx")
    ref = _ort(tmp_path / f"{name}.onnx", feeds)
    res = runner.run_model(str(tmp_path / f"{name}.onnx"), inputs=feeds)
    _check_close(res.outputs["out"], ref["out"], name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "roberta", "vit"])
def test_architecture_runs_at_another_batch(name, tmp_path):
    """Exported at batch 2 (dynamo specializes it), run at batch 3: compared with onnxruntime on
    the exported model by chunks of 2."""
    path = tmp_path / f"{name}.onnx"
    base = _export_tiny(name, path)
    rng = np.random.default_rng(5)
    other = {k: (rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f"
                 else rng.integers(0, int(v.max()) + 1, v.shape).astype(v.dtype)) for k, v in base.items()}
    feeds = {k: np.concatenate([base[k], other[k]])[:3] for k in base}
    ref = np.concatenate([_ort(path, base)["out"], _ort(path, other)["out"]])[:3]
    res = runner.run_model(str(path), inputs=feeds, batch_size=3)
    _check_close(res.outputs["out"], ref, name)
