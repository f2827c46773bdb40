"""Gradients of the non-linearities: one ``ai.graphcore`` ``<Op>Grad`` op each, reading the
forward output (Relu, Sigmoid, Tanh) or input (Gelu, LeakyRelu), as ``popnn``'s
``nonLinearityInputGradient`` does."""

from __future__ import annotations

from openipu.popart.grads import GRAPHCORE, grad_rule


@grad_rule("Relu")
def relu(g, op):
    return [g.add("ReluGrad", [g.y(), g.gy()], domain=GRAPHCORE)]


@grad_rule("Sigmoid")
def sigmoid(g, op):
    return [g.add("SigmoidGrad", [g.y(), g.gy()], domain=GRAPHCORE)]


@grad_rule("Tanh")
def tanh(g, op):
    return [g.add("TanhGrad", [g.y(), g.gy()], domain=GRAPHCORE)]


@grad_rule("Gelu", domain=GRAPHCORE)
def gelu(g, op):
    return [g.add("GeluGrad", [g.x(0), g.gy()], domain=GRAPHCORE)]


@grad_rule("GeluErf", domain=GRAPHCORE)
def gelu_erf(g, op):
    return [g.add("GeluErfGrad", [g.x(0), g.gy()], domain=GRAPHCORE)]


@grad_rule("Gelu")
def gelu_onnx(g, op):
    kind = "GeluGrad" if op.attrs.get("approximate", "none") == "tanh" else "GeluErfGrad"
    return [g.add(kind, [g.x(0), g.gy()], domain=GRAPHCORE)]


@grad_rule("LeakyRelu")
def leaky_relu(g, op):
    return [g.add("LeakyReluGrad", [g.x(0), g.gy()], domain=GRAPHCORE,
                  attrs={"alpha": float(op.attrs.get("alpha", 0.01))})]
