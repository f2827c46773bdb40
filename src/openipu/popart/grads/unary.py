"""Gradients of the non-linearities and unary math ops: one ``ai.graphcore`` ``<Op>Grad`` op
each (PopART's ``ElementWiseNonLinearUnaryGradOp`` family), reading the forward output or input
and the output gradient:

- Relu, Sigmoid, Tanh (output), Gelu, GeluErf (input): ``popnn``'s ``nonLinearityInputGradient``;
- LeakyRelu, Erf, Elu, Selu, Celu, HardSigmoid, Softsign, Softplus, ThresholdedRelu, Shrink,
  HardSwish, Mish, Swish (ONNX; the ``ai.graphcore`` one is in :mod:`.graphcore`), Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh,
  Acosh, Atanh (input): one fused ``popops.map`` of the derivative (PopART's ``ErfGrad``,
  ``EluGrad``, ``SoftPlusGrad``, ``AtanGrad`` ...; :mod:`openipu.popart.lowering.grad`), whose
  host kernel is the vjp of the forward kernel;
- Sin, Cos: ``gy * Cos(x)``, ``-gy * Sin(x)`` as ONNX ops (PopART's ``SinGradOp`` /
  ``CosGradOp`` patterns).
"""

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


#: forward op -> its gradient op (input, output gradient) -> input gradient
_FUSED = {"Erf": "ErfGrad", "Elu": "EluGrad", "Selu": "SeluGrad", "Celu": "CeluGrad", "HardSigmoid": "HardSigmoidGrad",
          "Softsign": "SoftSignGrad", "Softplus": "SoftPlusGrad", "ThresholdedRelu": "ThresholdedReluGrad",
          "Shrink": "ShrinkGrad", "HardSwish": "HardSwishGrad", "Mish": "MishGrad", "Swish": "SwishGrad",
          "Tan": "TanGrad", "Asin": "AsinGrad", "Acos": "AcosGrad", "Atan": "AtanGrad", "Sinh": "SinhGrad",
          "Cosh": "CoshGrad", "Asinh": "AsinhGrad", "Acosh": "AcoshGrad", "Atanh": "AtanhGrad"}


@grad_rule(*_FUSED)
def fused(g, op):
    return [g.vjp(0, op_type=_FUSED[op.op_type])]


@grad_rule("Sin")
def sin(g, op):
    return [g.add("Mul", [g.gy(), g.add("Cos", [g.x(0)])])]


@grad_rule("Cos")
def cos(g, op):
    return [g.neg(g.add("Mul", [g.gy(), g.add("Sin", [g.x(0)])]))]
