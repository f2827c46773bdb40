"""``benchmarks/training.py``'s scenario functions on a small MLP (offline IPU): the predictions
move the way the chip does. Recomputation lowers the predicted peak tile memory and raises the
cycles; accumulation factor N cuts the weight-update share of a batch by about N; replication
adds an all-reduce; a 4-stage pipeline beats the same 4 IPUs sharded in the steady state; the
stage annotation cuts the nodes into contiguous chunks. The IPUs have 128 tiles, to keep it fast."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import popart

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import training  # noqa: E402


@pytest.fixture(scope="module")
def mlp():
    """3 layers of 256, batch 2048, fp32, on ipu2 with 128 tiles (the recomputation test's model)."""
    rng = np.random.default_rng(0)
    batch, width = 2048, 256
    b = popart.Builder()
    h = b.addInputTensor(popart.TensorInfo("FLOAT", [batch, width]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [batch]), "label")
    for i in range(3):
        w = b.addInitializedInputTensor((rng.standard_normal((width, width)) * 0.05).astype(np.float32), f"w{i}")
        h = b.aiOnnx.add([b.aiOnnx.tanh([b.aiOnnx.sigmoid([b.aiOnnx.matmul([h, w])])])] * 2)
    loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([h], axis=1), lab])
    return training.TrainModel("mlp", "MLP", b.getModelProto(), loss, batch, "ipu2", tiles_per_ipu=128)


@pytest.fixture(scope="module")
def base(mlp):
    return training.baseline(mlp)


def test_recomputation_lowers_peak_memory_and_raises_cycles(mlp, base):
    r = training.recompute(mlp, "Standard")
    assert r["peak_tile_bytes"] < 0.95 * base["peak_tile_bytes"]
    assert r["peak_live_bytes"] < base["peak_live_bytes"]
    assert r["cycles"] > base["cycles"]


def test_accumulation_cuts_the_update_share_by_about_n(mlp, base):
    n = 4
    acc = training.accumulation(mlp, n)
    assert base["update_cycles"] > 0 and acc["update_cycles"] > 0
    assert acc["samples"] == n * base["samples"]
    ratio = (base["update_cycles"] / base["cycles"]) / (acc["update_cycles"] / acc["cycles"])
    assert 0.7 * n < ratio <= 1.05 * n


def test_replication_adds_the_all_reduce(mlp, base):
    rep = training.replication(mlp, 2)
    assert base["all_reduce_cycles"] == 0 and rep["all_reduce_cycles"] > 0
    assert rep["cycles"] > base["cycles"]
    assert rep["grad_bytes"] == 3 * 256 * 256 * 4


def test_pipeline_beats_sharding_in_the_steady_state():
    """8 tanh layers of 128 over 4 IPUs of 64 tiles, 8 and 16 micro-batches of 64."""
    rng = np.random.default_rng(0)
    b = popart.Builder()
    h = b.addInputTensor(popart.TensorInfo("FLOAT", [64, 128]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [64]), "label")
    for i in range(8):
        w = b.addInitializedInputTensor((rng.standard_normal((128, 128)) * 0.05).astype(np.float32), f"w{i}")
        h = b.aiOnnx.tanh([b.aiOnnx.matmul([h, w])])
    loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([h], axis=1), lab])
    m = training.TrainModel("mlp8", "MLP", b.getModelProto(), loss, 64, "ipu2", tiles_per_ipu=64)
    p = training.steady_state(training.pipeline, m, 4, 8)
    s = training.steady_state(training.sharded, m, 4, 8)
    assert p["steady_samples_per_s"] > 1.5 * s["steady_samples_per_s"]
    assert p["samples"] == s["samples"] == 8 * 64


def test_annotate_stages_cuts_contiguous_chunks(mlp):
    m = onnx.ModelProto()
    m.ParseFromString(training.annotate_stages(mlp.proto, 4))
    stages = [next(a.i for a in n.attribute if a.name == "__pipeline_stage") for n in m.graph.node]
    ipus = [next(a.i for a in n.attribute if a.name == "__ipu_number") for n in m.graph.node]
    assert stages == ipus == sorted(stages) and set(stages) == {0, 1, 2, 3}
