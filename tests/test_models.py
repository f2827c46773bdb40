"""Real models through the main job: the nine light models shipped in ``onnx`` and all-MiniLM-L6-v2.

Light models: compared with their shipped expected outputs, and (with seeded random weights in
place of their ConstantOfShape weights) with onnxruntime on the same random input.
"""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from openipu import runner

#: Models whose full-size graphs take the most host time and memory (VGG-19: ~30 s, 11 GB): the slow set.
HEAVY = {"light_vgg19", "light_densenet121", "light_zfnet512", "light_bvlc_alexnet"}

MODELS = [pytest.param(m, marks=pytest.mark.slow) if m in HEAVY else m for m in runner.LIGHT_MODELS]


def _expected(name):
    t = onnx.TensorProto()
    t.ParseFromString((runner.light_model_dir() / f"{name}_output_0.pb").read_bytes())
    return numpy_helper.to_array(t)


def _openipu_run(model: str, tmp_path, inputs: dict | None = None) -> np.ndarray:
    """Run ``openipu run MODEL`` in a subprocess (as a user would; each model's memory is freed
    when it ends) and return its single output."""
    out = tmp_path / "out.npz"
    cmd = [sys.executable, "-m", "openipu.cli", "run", model, "--output", str(out)]
    if inputs:
        np.savez(tmp_path / "in.npz", **inputs)
        cmd += ["--input", str(tmp_path / "in.npz")]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0, p.stdout
    assert "Prediction for the IPU" in p.stdout and "fits: yes" in p.stdout, p.stdout
    with np.load(out) as f:
        (arr,) = [f[k] for k in f.files]
    return arr


@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_shipped_output(name, tmp_path):
    out = _openipu_run(name, tmp_path)
    np.testing.assert_allclose(out.reshape(_expected(name).shape), _expected(name), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_light_model_random_weights_matches_onnxruntime(name, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    model = runner.randomize_constant_weights(onnx.load(str(runner.resolve_model(name))), seed=0)
    feeds = runner.random_inputs(model, seed=0)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    path = tmp_path / f"{name}_random.onnx"
    onnx.save(model, str(path))
    del model
    out = _openipu_run(str(path), tmp_path, feeds)
    scale = float(np.abs(ref).max())
    err = float(np.abs(out.reshape(ref.shape) - ref).max())
    print(f"{name}: max |openipu - onnxruntime| = {err:.3g} (output scale {scale:.3g})")
    assert err <= 1e-4 * scale


@pytest.fixture(scope="module")
def minilm(minilm_export):
    return minilm_export


def test_minilm_last_hidden_state_matches_pytorch(minilm):
    import popart
    path, data = minilm
    session = popart.InferenceSession(
        fnModel=str(path), dataFlow=popart.DataFlow(1, {"last_hidden_state": popart.AnchorReturnType("ALL")}),
        deviceInfo=popart.DeviceManager().acquireAvailableDevice(numIpus=1))
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}, anchors))
    err = float(np.abs(anchors["last_hidden_state"] - data["last_hidden_state"]).max())
    print(f"all-MiniLM-L6-v2: max |openipu - PyTorch| = {err:.3g}; predicted IPU cycles {session.getCycleCount():,}")
    assert err <= 1e-4
    assert session.getCycleCount() > 0


def test_openipu_run_on_minilm_prints_a_prediction(minilm, tmp_path, capsys):
    from openipu import cli
    path, data = minilm
    np.savez(tmp_path / "in.npz", input_ids=data["input_ids"], attention_mask=data["attention_mask"])
    assert cli.main(["run", str(path), "--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz")]) == 0
    text = capsys.readouterr().out
    assert "Prediction for the IPU" in text and "samples/s" in text and "fits: yes" in text
    with np.load(tmp_path / "out.npz") as f:
        assert float(np.abs(f["last_hidden_state"] - data["last_hidden_state"]).max()) <= 1e-4


@pytest.mark.slow
def test_minilm_training_step_gradients_match_pytorch(minilm):
    """A TrainingSession on the exported all-MiniLM-L6-v2 (loss: mean of last_hidden_state^2,
    ConstSGD): the gradients of embeddings, LayerNorm, attention and MLP weights match
    torch.autograd on the same HF model, and the step applies them."""
    import popart
    import torch
    from export_minilm import load_minilm
    path, data = minilm
    G = popart.reservedGradientPrefix()
    _, model = load_minilm()
    params = dict(model.named_parameters())
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}
    # MatMul weights are exported transposed, under generated names: find them by value
    names = {}
    for hf in ("encoder.layer.0.attention.self.query.weight", "encoder.layer.5.output.dense.weight"):
        w = params[hf].detach().numpy().T
        (names[hf],) = [k for k, v in inits.items() if v.shape == w.shape and np.array_equal(v, w)]
    for hf in ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
               "embeddings.LayerNorm.weight", "encoder.layer.0.attention.output.LayerNorm.bias",
               "encoder.layer.3.intermediate.dense.bias", "encoder.layer.5.output.LayerNorm.weight"):
        names[hf] = hf
    b = popart.Builder(str(path))
    h = "last_hidden_state"
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([h, h])], popart.ReductionType.Mean)
    lr = 0.5
    session = popart.TrainingSession(
        b.getModelProto(), popart.DataFlow(1, {a: popart.AnchorReturnType("All") for a in
                                               [loss] + [G + n for n in names.values()]}),
        loss, popart.ConstSGD(lr), popart.DeviceManager().acquireAvailableDevice(numIpus=1))
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}, anchors))
    out = model(torch.tensor(data["input_ids"]), torch.tensor(data["attention_mask"])).last_hidden_state
    tl = (out * out).mean()
    tl.backward()
    assert float(anchors[loss]) == pytest.approx(tl.item(), rel=1e-5)
    worst = 0.0
    for hf, n in names.items():
        ref = params[hf].grad.numpy()
        ref = ref.T if n != hf else ref
        err = float(np.abs(anchors[G + n] - ref).max()) / float(np.abs(ref).max())
        worst = max(worst, err)
        assert err <= 1e-4, (hf, err)
    print(f"all-MiniLM-L6-v2 training step: max |openipu - PyTorch| / max |gradient| = {worst:.3g}; "
          f"predicted IPU cycles {session.getCycleCount():,}")
    session.weightsToHost()
    q = names["encoder.layer.0.attention.self.query.weight"]
    new = {q: np.zeros(inits[q].shape, np.float32)}
    session.readWeights(popart.PyWeightsIO(new))
    np.testing.assert_allclose(new[q], inits[q] - lr * anchors[G + q], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_minilm_fine_tunes_with_adam_and_model_to_host_loads_in_onnxruntime(minilm, tmp_path):
    """Three Adam steps on the real all-MiniLM-L6-v2 (loss: mean of last_hidden_state^2) lower
    the loss; ``modelToHost`` writes the trained weights (and the Adam state); loaded into the
    exported model, onnxruntime gives the trained model's outputs: their loss equals the one a
    session resumed from the file computes."""
    import onnxruntime as ort
    import popart
    path, data = minilm
    b = popart.Builder(str(path))
    h = "last_hidden_state"
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([h, h])], popart.ReductionType.Mean)
    feeds = {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}
    session = popart.TrainingSession(
        b.getModelProto(), popart.DataFlow(3, {loss: popart.AnchorReturnType("All")}), loss,
        popart.Adam({"defaultLearningRate": (1e-3, True)}, weight_decay_mode=popart.WeightDecayMode.L2Regularization),
        popart.DeviceManager().acquireAvailableDevice(numIpus=1))
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({k: np.ascontiguousarray(np.stack([v] * 3)) for k, v in feeds.items()}, anchors))
    losses = [float(x) for x in anchors[loss]]
    assert losses[2] < losses[1] < losses[0]
    trained = str(tmp_path / "trained.onnx")
    session.modelToHost(trained)
    names = {i.name for i in onnx.load(trained, load_external_data=False).graph.initializer}
    assert any(n.startswith("Accl1___") for n in names) and any(n.startswith("Step___") for n in names)
    # the trained weights, loaded by name into the exported model (whose loss-free graph
    # onnxruntime runs; the training graph has PopART's ai.graphcore loss op)
    new = {i.name: i for i in onnx.load(trained).graph.initializer}
    exported = onnx.load(str(path))
    for init in exported.graph.initializer:
        init.CopyFrom(new[init.name])
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    out = ort.InferenceSession(exported.SerializeToString(), opts,
                               providers=["CPUExecutionProvider"]).run([h], feeds)[0]
    ort_loss = float((out.astype(np.float64) ** 2).mean())
    # a session made from the file resumes there: its first forward pass sees the trained weights
    nxt = popart.TrainingSession(
        trained, popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}), loss,
        popart.Adam({"defaultLearningRate": (1e-3, True)}, weight_decay_mode=popart.WeightDecayMode.L2Regularization),
        popart.DeviceManager().acquireAvailableDevice(numIpus=1))
    nxt.prepareDevice()
    nxt.weightsFromHost()
    a4 = nxt.initAnchorArrays()
    nxt.run(popart.PyStepIO(feeds, a4))
    assert float(a4[loss]) == pytest.approx(ort_loss, rel=1e-4)
    print(f"all-MiniLM-L6-v2 + Adam: loss {losses[0]:.4f} -> {losses[1]:.4f} -> {losses[2]:.4f}; onnxruntime on "
          f"the modelToHost file: {ort_loss:.4f}, openipu resumed from it: {float(a4[loss]):.4f}")
