"""The workshop's Keras CIFAR-10 script, ported to the IPU the Graphcore way: import ``ipu``, configure
one IPU, build and train the model inside an ``IPUStrategy`` scope. ``--cpu`` runs the same
script on stock Keras (CPU) for comparison.

Run: ``python examples/tensorflow2/cifar10_keras.py [--cpu] [--epochs N] [--samples N]``.
``keras.datasets.cifar10.load_data()`` needs the data set in ``~/.keras/datasets``; tests patch it
with generated CIFAR-shaped data.
"""

import argparse
import contextlib

import numpy as np
from tensorflow import keras


def model_fn(dropout=0.5):
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(dropout),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true", help="stock Keras on the CPU")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps-per-execution", type=int, default=25)
    p.add_argument("--samples", type=int, default=50000, help="training images used (a multiple of the batch size)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.5, help="0 for runs that compare with the CPU loss for loss")
    args = p.parse_args(argv)

    (x_train, y_train), _ = keras.datasets.cifar10.load_data()
    x_train = (x_train[:args.samples] / 255.0).astype(np.float32)
    y_train = y_train[:args.samples]

    scope = contextlib.nullcontext()
    if not args.cpu:
        from tensorflow.python import ipu
        config = ipu.config.IPUConfig()
        config.auto_select_ipus = 1
        config.configure_ipu_system()
        scope = ipu.ipu_strategy.IPUStrategy().scope()

    keras.utils.set_random_seed(args.seed)
    with scope:
        model = model_fn(args.dropout)
        model.summary()
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], steps_per_execution=args.steps_per_execution)
        history = model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, shuffle=False)
    if not args.cpu:
        t = model.ipu_predicted_seconds
        print(f"Predicted IPU time per training step: {t['step'] * 1e3:.3f} ms "
              f"({t['cycles']} cycles per execution of {args.steps_per_execution} steps)")
    print("losses per epoch:", [round(v, 6) for v in history.history["loss"]])
    return history


if __name__ == "__main__":
    main()
