"""``benchmarks/training.py``'s scenario functions on a small MLP (offline IPU): the predictions
move the way the chip does. Recomputation lowers the predicted peak tile memory and raises the
cycles; accumulation factor N cuts the weight-update share of a batch by about N; replication
adds an all-reduce; the stage annotation cuts the nodes into contiguous chunks."""

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
    """3 layers of 256, batch 2048, fp32, on ipu2 (the recomputation test's model)."""
    rng = np.random.default_rng(0)
    batch, width = 2048, 256
    b = popart.Builder()
    h = b.addInputTensor(popart.TensorInfo("FLOAT", [batch, width]), "x")
    lab = b.addInputTensor(popart.TensorInfo("INT32", [batch]), "label")
    for i in range(3):
        w = b.addInitializedInputTensor((rng.standard_normal((width, width)) * 0.05).astype(np.float32), f"w{i}")
        h = b.aiOnnx.add([b.aiOnnx.tanh([b.aiOnnx.sigmoid([b.aiOnnx.matmul([h, w])])])] * 2)
    loss = b.aiGraphcore.nllloss([b.aiOnnx.softmax([h], axis=1), lab])
    return training.TrainModel("mlp", "MLP", b.getModelProto(), loss, batch, "ipu2")


@pytest.fixture(scope="module")
def base(mlp):
    return training.baseline(mlp)


def test_recomputation_lowers_peak_memory_and_raises_cycles(mlp, base):
    r = training.recompute(mlp, "Standard")
    assert r["peak_tile_bytes"] < 0.95 * base["peak_tile_bytes"]
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


def test_annotate_stages_cuts_contiguous_chunks(mlp):
    m = onnx.ModelProto()
    m.ParseFromString(training.annotate_stages(mlp.proto, 4))
    stages = [next(a.i for a in n.attribute if a.name == "__pipeline_stage") for n in m.graph.node]
    ipus = [next(a.i for a in n.attribute if a.name == "__ipu_number") for n in m.graph.node]
    assert stages == ipus == sorted(stages) and set(stages) == {0, 1, 2, 3}
