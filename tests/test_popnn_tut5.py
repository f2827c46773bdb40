"""SDK 2.x Poplar tutorial 5 (logistic regression) on scikit-learn's digits reaches > 90% test accuracy."""

import re

import pytest

pytest.importorskip("sklearn")


def test_tut5_logistic_regression_trains(run_example):
    out = run_example("sdk2_tut5_logistic_regression.py")
    assert "Using the IPU Model" in out
    epochs = [int(a) for a in re.findall(r"Epoch \d+ \(100%\), accuracy (\d+)%", out)]
    assert len(epochs) == 4 and epochs[-1] > epochs[0]
    acc = float(re.search(r"Test accuracy ([\d.]+)%", out).group(1))
    assert acc > 90.0, out
    cycles = int(re.search(r"Predicted IPU cycles per training step \(batch 8\): ([\d,]+)", out).group(1).replace(",", ""))
    assert 1_000 < cycles < 1_000_000
