"""Graphcore's Keras tutorial scripts (graphcore/examples ``tutorials/tutorials/tensorflow2/keras``)
run unmodified on generated MNIST-shaped data (``examples/tensorflow2/run_keras_tutorial.py``).

Needs a checkout of graphcore/examples named by ``OPENIPU_GRAPHCORE_EXAMPLES`` (not shipped here);
marked ``tutorial`` (minutes each on a 2-core host): ``make test-tutorials``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = os.environ.get("OPENIPU_GRAPHCORE_EXAMPLES")
KERAS = Path(EXAMPLES or ".") / "tutorials" / "tutorials" / "tensorflow2" / "keras"

pytestmark = [pytest.mark.tutorial,
              pytest.mark.skipif(not (EXAMPLES and KERAS.is_dir()),
                                 reason="set OPENIPU_GRAPHCORE_EXAMPLES to a graphcore/examples checkout")]


def _run(script, *args, sizes=("--train", "640", "--test", "128")):
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "tensorflow2" / "run_keras_tutorial.py"),
                        str(KERAS / script), *sizes, "--", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, cwd=str((KERAS / script).parent))
    assert p.returncode == 0, p.stdout[-4000:]
    assert "Program ran successfully" in p.stdout
    return p.stdout


@pytest.mark.parametrize("script", ["completed_demos/completed_demo_ipu.py", "completed_demos/completed_demo_faster.py",
                                    "completed_demos/completed_demo_replicated.py",
                                    "completed_demos/completed_demo_pipelining.py"])
def test_completed_demos(script):
    # the pipelined demo makes steps_per_execution a multiple of its GA (8) per replica (2): at
    # least 64 x 2 x 8 images in each set
    _run(script, sizes=("--train", "1024", "--test", "1024") if "pipelining" in script else ("--train", "640",
                                                                                               "--test", "128"))


@pytest.mark.parametrize("args", [[], ["--use-ipu"], ["--use-ipu", "--pipelining"]])
def test_completed_example(args):
    # batch size 80; 2 replicas (or 2 stages) each need whole batches of the test set
    out = _run("completed_example/main.py", *args, sizes=("--train", "1600", "--test", "800"))
    if args:
        assert "loss: " in out and "accuracy: " in out


POPDIST = Path(EXAMPLES or ".") / "tutorials" / "feature_examples" / "tensorflow2" / "popdist"


def test_popdist_training_and_inference_under_poprun(tmp_path):
    """``popdist_training.py`` under ``poprun --num-instances 2 --num-replicas 4`` (its README's
    command; 100 epochs of one step per replica on 128 generated CIFAR-10 images), then
    ``popdist_inference.py`` under 4 instances loads its ``saved_model.h5``."""
    def poprun(script, instances, replicas):
        cmd = [sys.executable, "-m", "openipu.popdist.poprun", "--num-instances", str(instances), "--num-replicas",
               str(replicas), sys.executable, str(ROOT / "examples" / "tensorflow2" / "run_keras_tutorial.py"),
               str(POPDIST / script), "--train", "128", "--test", "256"]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(tmp_path))
        assert p.returncode == 0, p.stdout[-4000:]
        return p.stdout
    out = poprun("popdist_training.py", 2, 4)
    assert "Steps per execution:\t1" in out and "Epoch 100/100" in out
    assert (tmp_path / "saved_model.h5").is_file()
    out = poprun("popdist_inference.py", 4, 4)
    assert "Steps per execution:\t2" in out and "accuracy: " in out
