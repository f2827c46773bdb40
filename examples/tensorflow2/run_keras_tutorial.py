"""Run one of Graphcore's Keras tutorial scripts unmodified, with generated MNIST- or
CIFAR-10-shaped data in place of the download (no network here).

Usage: ``python examples/tensorflow2/run_keras_tutorial.py SCRIPT.py [--train N] [--test N]
[-- SCRIPT ARGS]``: ``keras.datasets.mnist.load_data`` returns ``N`` random 28x28 uint8 images
with labels 0-9 (numpy seed 0), ``keras.datasets.cifar10.load_data`` ``N`` random 32x32x3 uint8
images with labels ``[N, 1]`` (both also under ``tf.keras``), then ``SCRIPT.py`` runs as
``__main__`` with its own argv. Under ``poprun`` every instance generates the same data.
"""

import argparse
import runpy
import sys

import numpy as np


def fake_mnist(n_train: int, n_test: int):
    rng = np.random.default_rng(0)

    def part(n):
        return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, (n,), dtype=np.uint8)
    return lambda *a, **k: (part(n_train), part(n_test))


def fake_cifar10(n_train: int, n_test: int):
    rng = np.random.default_rng(0)

    def part(n):
        return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, (n, 1), dtype=np.uint8)
    return lambda *a, **k: (part(n_train), part(n_test))


def main():
    argv = sys.argv[1:]
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser()
    p.add_argument("script")
    p.add_argument("--train", type=int, default=640)
    p.add_argument("--test", type=int, default=128)
    args = p.parse_args(argv)
    import keras
    import tensorflow as tf
    for ds in (keras.datasets, tf.keras.datasets):
        ds.mnist.load_data = fake_mnist(args.train, args.test)
        ds.cifar10.load_data = fake_cifar10(args.train, args.test)
    sys.argv = [args.script] + rest
    sys.path.insert(0, str(__import__("pathlib").Path(args.script).resolve().parent))
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
