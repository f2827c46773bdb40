"""Graphcore's PopTorch tutorials, ported to ``examples/poptorch`` with scikit-learn's digits in
place of MNIST / FashionMNIST (``examples/poptorch/digits.py``), run as the tutorials' own tests
run them: the script as a subprocess, its output searched for the figure the tutorial's test
checks (``research/poptorch.md`` 4). Pass criteria are the tutorials' except where the digits
differ from (Fashion)MNIST; each such change says why.

Quick runs (fewer epochs or images, flags the ports expose) check that each feature works (the
basics for one epoch and the anchored gradients are ``slow``, in CI); the full runs, with the
tutorials' settings, take hours at this simulator's host speed on a 2-core machine and are marked
``tutorial`` (``make test-tutorials``; not in CI). Their pass bars for the digits come from
PyTorch runs of the same models on the CPU, as each test says.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "poptorch")


def run(name, *args, cwd):
    """Run ``examples/poptorch/<name>`` in ``cwd``: merged stdout and stderr, exit code 0."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env=env, cwd=str(cwd))
    assert p.returncode == 0, p.stdout[-6000:]
    return p.stdout


def figure(out: str, label: str) -> float:
    m = re.findall(re.escape(label) + r"\s*([\d.]+)", out)
    assert m, f"'{label}' not in the output:\n{out[-3000:]}"
    return float(m[-1])


# -- the dataset ---------------------------------------------------------------------------------
def test_digits_dataset_is_mnist_like():
    sys.path.insert(0, EXAMPLES)
    try:
        from digits import MNIST_NORMALIZE, Digits
    finally:
        sys.path.remove(EXAMPLES)
    train, test = Digits(train=True), Digits(train=False)
    assert (len(train), len(test)) == (1437, 360)
    x, y = train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and isinstance(y, int)
    # MNIST's layout: a 20x20 digit in a 4-pixel zero border, normalised with MNIST's constants
    raw = train.data * MNIST_NORMALIZE[1] + MNIST_NORMALIZE[0]
    assert raw.min() >= -1e-6 and raw.max() <= 1 + 1e-6
    assert torch.all(raw[:, :, :4].abs() < 1e-6) and torch.all(raw[:, :, :, -4:].abs() < 1e-6)
    assert sorted(set(train.targets.tolist())) == list(range(10))
    # the split is fixed, and no image is in both
    assert torch.equal(Digits(train=True).data, train.data)
    assert not (train.data.flatten(1)[:, None] == test.data.flatten(1)[None]).all(-1).any()
    half = Digits(train=False, size=128, dtype=torch.half)
    assert half[0][0].shape == (1, 128, 128) and half[0][0].dtype == torch.half
    assert "torchvision" not in sys.modules


# -- basics ------------------------------------------------------------------------------------------
def _check_basics(out, min_accuracy):
    assert figure(out, "Eval accuracy:") >= min_accuracy
    # the tutorial's trouser photo (FashionMNIST class 1, "Trouser") is a digit 1 here
    assert "IPU predicted class: 1" in out and "CPU predicted class: 1" in out
    assert "Options: 20 2 123 True" in out


@pytest.mark.slow
def test_basics_one_epoch(tmp_path):
    out = run("basics.py", "--epochs", "1", "--num-workers", "0", cwd=tmp_path)
    # one epoch of digits: 89 weight updates (FashionMNIST's epoch: 3,750)
    _check_basics(out, 80)
    assert (tmp_path / "classifier.pth").exists()


@pytest.mark.tutorial
def test_basics(tmp_path):
    """The tutorial's test: ``Eval accuracy`` >= 89 % after 5 epochs (reached on FashionMNIST; the
    digits are an easier task with fewer images, and reach about 97 %)."""
    _check_basics(run("basics.py", cwd=tmp_path), 89)


# -- simple MNIST -----------------------------------------------------------------------------------
@pytest.mark.tutorial
def test_mnist_simple_one_epoch(tmp_path):
    out = run("mnist_simple.py", "--epochs", "1", cwd=tmp_path)
    # one epoch of digits is 3 calls of 50 updates (MNIST: 150 calls): 18 % measured, plain torch
    # reaches 32 % after its 179 updates; the softmax before CrossEntropyLoss (as in the
    # application) makes the first epochs slow. The check: it runs, and learns past chance.
    assert figure(out, "Accuracy on test set:") > 12


@pytest.mark.tutorial
def test_mnist_simple(tmp_path):
    """The application's test: 89 < accuracy < 99.9 after 10 epochs."""
    acc = figure(run("mnist_simple.py", cwd=tmp_path), "Accuracy on test set:")
    assert 89 < acc < 99.9


# -- pipelining -------------------------------------------------------------------------------------
@pytest.mark.tutorial
@pytest.mark.parametrize("strategy", ["sharded", "pipelined"])
def test_mnist_pipeline(tmp_path, strategy):
    """The tutorial's test runs 2 epochs and wants 97.5 < accuracy < 99.9 on MNIST (150 weight
    updates of 400 images per epoch). A digits epoch is 30 updates of 40 images (the batch size is
    lowered so that one call fits in the data, see the example), so the run here is 10 epochs (300
    updates). The same schedule in plain torch on the CPU reaches 83.7 % after 1 epoch, 87.0 %
    after 2 and 98.0 % after 10; the bar is lowered to 94 % for the run-to-run spread of a
    300-image test set (one image is 0.33 %)."""
    acc = figure(run("mnist_pipeline.py", "--strategy", strategy, "--epochs", "10", cwd=tmp_path),
                 "Accuracy on test set:")
    assert 94 < acc < 99.9


@pytest.mark.tutorial
def test_mnist_pipeline_one_epoch(tmp_path):
    """One epoch, 3 calls of 100 micro-batches through the 4-IPU pipeline (about 6 host minutes
    a call on a loaded 2-core machine): plain torch reaches 83.7 % after the same 30 updates."""
    out = run("mnist_pipeline.py", "--strategy", "pipelined", "--epochs", "1", cwd=tmp_path)
    assert figure(out, "Accuracy on test set:") > 60


@pytest.mark.tutorial
def test_mnist_pipeline_offload_optimiser(tmp_path):
    run("mnist_pipeline.py", "--strategy", "sharded", "--epochs", "1", "--offload-optimiser", cwd=tmp_path)


# -- mixed precision ----------------------------------------------------------------------------------
MIXED = {  # the tutorial's four tests; each checks that "Eval accuracy on IPU" is printed
    "fp16": ["--execution-half"],
    "fp16-accum": ["--execution-half", "--optimizer-half"],
    "stochastic-rounding": ["--execution-half", "--optimizer-half", "--stochastic-rounding"],
    "all-fp16": ["--execution-half", "--optimizer-half", "--stochastic-rounding", "--partials-half"],
}


@pytest.mark.tutorial
@pytest.mark.parametrize("name", list(MIXED))
def test_mixed_precision(tmp_path, name):
    """One epoch (119 calls of 12 fp16 images of 128x128; about 36 host seconds a call on a
    loaded 2-core machine: fp16 convolutions on the CPU are slow) instead of the tutorial's 10."""
    out = run("mixed_precision.py", *MIXED[name], "--epochs", "1", cwd=tmp_path)
    assert "Eval accuracy on IPU" in out
    # not a tutorial criterion: one fp16 epoch learns (10 classes: chance is 10 %)
    assert figure(out, "Eval accuracy on IPU:") > 30


# -- data loading ------------------------------------------------------------------------------------
@pytest.mark.tutorial
@pytest.mark.parametrize("args", [[], ["--synthetic-data"], ["--replicas", "2"], ["--replicas", "2", "--synthetic-data"]],
                         ids=["default", "synthetic", "replicas", "replicas-synthetic"])
def test_data_loading(tmp_path, args):
    """The tutorial's four tests: "IPU throughput" is printed. One call of 800 (x replicas) random
    images instead of the tutorial's 10,000 (12 calls): a call of 800 takes about 10 host minutes
    on a loaded 2-core machine (the cost model predicts 3,300 images/s on a Mk2 IPU)."""
    size = str(800 * (2 if "--replicas" in args else 1))
    out = run("data_loading.py", "--dataset-size", size, *args, cwd=tmp_path)
    assert figure(out, "IPU throughput:") > 0
    assert figure(out, "Predicted IPU throughput:") > 0


@pytest.mark.tutorial
def test_data_loading_full(tmp_path):
    assert figure(run("data_loading.py", cwd=tmp_path), "IPU throughput:") > 0


# -- observing tensors ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_observing_tensors(tmp_path):
    """The example's test: "Saved histogram" (a text histogram here when matplotlib is missing)."""
    out = run("observing_tensors.py", cwd=tmp_path)
    assert "Saved histogram" in out
    assert "'Gradient___fc1.weight'" in out and "'UpdatedVar___fc3.bias'" in out
    assert "Gradient___fc1.weight: shape [320, 784]" in out
    assert any(tmp_path.glob("GradientHistogram.*"))
