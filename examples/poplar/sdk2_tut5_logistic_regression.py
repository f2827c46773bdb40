"""Poplar SDK 2.x tutorial 5 ("a basic machine learning example"), ported to openipu.

Logistic regression ``y = softmax(W x + b)`` trained by gradient descent with PopLibs ops only:
``poplin.matMul`` (forward and weight gradient), ``popops.add`` (bias), ``popnn.nonLinearity``
(SOFTMAX), ``popnn.calcLoss`` (CROSS_ENTROPY_LOSS, with the number of correct predictions) and
``popops.scaledAddTo`` (weight and bias updates). Samples and labels stream from the host through
FIFOs; one engine run trains on ``steps`` batches inside a ``Repeat``, then the count of correct
predictions streams back. The original trained on MNIST (784 pixels, one image per step, 4 tiles);
this port trains on scikit-learn's 8x8 digits (64 pixels; no download), with an optional batch.

Usage: ``python sdk2_tut5_logistic_regression.py [epochs] [batchSize] [learningRate]``
(defaults 4, 8, 0.02). Prints per-epoch training accuracy, the test accuracy, and the simulated
IPU's predicted cycles per training step.
"""

from __future__ import annotations

import sys

import numpy as np

from openipu import poplar
from openipu.poplar import program
from openipu.poplibs import poplin, popnn, popops, poputil


def load_data(seed: int = 0):
    """scikit-learn's digits scaled to [0, 1], split 80/20 (train, test) with a fixed shuffle."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.uint32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_train = int(0.8 * len(x))
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def build(graph, image_size: int, num_classes: int, batch: int, eta: float):
    """Tensors, the training step program and the evaluation step program."""
    x = graph.addVariable(poplar.FLOAT, [image_size, batch], "x")
    poputil.mapTensorLinearly(graph, x)
    W = graph.addVariable(poplar.FLOAT, [num_classes, image_size], "W")
    poputil.mapTensorLinearly(graph, W)
    b = graph.addVariable(poplar.FLOAT, [num_classes, 1], "b")
    poputil.mapTensorLinearly(graph, b)
    graph.createHostWrite("weights", W)
    graph.createHostWrite("biases", b)
    ones = graph.addConstant(poplar.FLOAT, [batch, 1], 1.0)
    poputil.mapTensorLinearly(graph, ones)

    num_correct = graph.addVariable(poplar.UNSIGNED_INT, [1], "numCorrect")
    poputil.mapTensorLinearly(graph, num_correct)
    expected = graph.addVariable(poplar.UNSIGNED_INT, [batch], "expected")
    poputil.mapTensorLinearly(graph, expected)

    def forward(prog):
        t = poplin.matMul(graph, W, x, prog, "Wx")
        y = popops.add(graph, t, b, prog, "Wx+b")                      # b broadcast over the batch
        return popnn.nonLinearity(graph, popnn.NonLinearityType.SOFTMAX, y.transpose(), prog, "softmax(Wx+b)")

    # training step: forward, loss and its gradient, then SGD updates
    train_step = program.Sequence()
    probs = forward(train_step)
    loss = graph.addVariable(poplar.FLOAT, [batch], "loss")
    poputil.mapTensorLinearly(graph, loss)
    delta = graph.addVariable(poplar.FLOAT, [batch, num_classes], "delta")   # dE/d(Wx+b)
    poputil.mapTensorLinearly(graph, delta)
    train_step.add(popnn.calcLoss(graph, probs, expected, loss, delta, num_correct, popnn.CROSS_ENTROPY_LOSS,
                                  "dE/d(Wx+b)"))
    b_grad = poplin.matMul(graph, delta.transpose(), ones, train_step, "dE/db")          # sum over the batch
    popops.scaledAddTo(graph, b, b_grad, -eta, train_step, "b += -eta * dE/db")
    w_grad = poplin.matMul(graph, delta.transpose(), x.transpose(), train_step, "dE/dW")
    popops.scaledAddTo(graph, W, w_grad, -eta, train_step, "W += -eta * dE/dW")

    # evaluation step: forward and accuracy only
    eval_step = program.Sequence()
    eval_step.add(popnn.calcAccuracy(graph, forward(eval_step), expected, num_correct, "accuracy"))
    return x, expected, num_correct, train_step, eval_step


def main(argv) -> int:
    epochs = int(argv[1]) if len(argv) > 1 else 4
    batch = int(argv[2]) if len(argv) > 2 else 8
    eta = float(argv[3]) if len(argv) > 3 else 0.02
    (x_train, y_train), (x_test, y_test) = load_data()
    image_size, num_classes = x_train.shape[1], 10
    print("Using the IPU Model")
    model = poplar.IPUModel()
    model.numIPUs = 1
    model.tilesPerIPU = 4
    device = model.createDevice()
    graph = poplar.Graph(device.getTarget())
    popops.addCodelets(graph)
    poplin.addCodelets(graph)
    popnn.addCodelets(graph)

    x, expected, num_correct, train_step, eval_step = build(graph, image_size, num_classes, batch, eta)
    data_in = graph.addHostToDeviceFIFO("data", poplar.FLOAT, image_size * batch)
    label_in = graph.addHostToDeviceFIFO("labels", poplar.UNSIGNED_INT, batch)
    num_correct_out = graph.addDeviceToHostFIFO("hostNumCorrect", poplar.UNSIGNED_INT, 1)
    zero = graph.addConstant(poplar.UNSIGNED_INT, [1], 0)
    graph.setTileMapping(zero, 0)

    train_steps = len(x_train) // batch
    test_steps = len(x_test) // batch

    def loop(step, count):
        # the host streams samples as rows; x holds them as columns
        return program.Sequence(
            program.Copy(zero, num_correct),
            program.Repeat(count, program.Sequence(program.Copy(data_in, x.transpose().flatten()),
                                                   program.Copy(label_in, expected), step)),
            program.Copy(num_correct, num_correct_out))

    engine = poplar.Engine(graph, [loop(train_step, train_steps), loop(eval_step, test_steps)])
    engine.load(device)
    rng = np.random.default_rng(1)
    engine.writeTensor("weights", (0.01 * rng.standard_normal((num_classes, image_size))).astype(np.float32))
    engine.writeTensor("biases", np.zeros((num_classes, 1), np.float32))
    host_num_correct = np.zeros(1, np.uint32)
    engine.connectStream("hostNumCorrect", host_num_correct)

    n_train, n_test = train_steps * batch, test_steps * batch
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(x_train))[:n_train]
        engine.connectStream("data", np.ascontiguousarray(x_train[order]).reshape(-1))
        engine.connectStream("labels", np.ascontiguousarray(y_train[order]))
        engine.run(0)
        if epoch == 1:
            step_cycles = engine.last_run_cycles / train_steps
        print(f"Epoch {epoch} (100%), accuracy {100 * int(host_num_correct[0]) // n_train}%")
    engine.connectStream("data", np.ascontiguousarray(x_test[:n_test]).reshape(-1))
    engine.connectStream("labels", np.ascontiguousarray(y_test[:n_test]))
    engine.run(1)
    test_acc = int(host_num_correct[0]) / n_test
    print(f"Test accuracy {100 * test_acc:.1f}% ({int(host_num_correct[0])}/{n_test})")
    print(f"Predicted IPU cycles per training step (batch {batch}): {step_cycles:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
