"""Gradient rules of the IR ops (PopART's ``Op::getGradOps`` and the ``*GradOp`` patterns that
rewrite grad ops into ordinary ones), one op family per module:

- :mod:`.elementwise`: Add, Sub, Mul, Div, Neg, Pow, Sqrt, Exp, Log, Abs, Reciprocal, Sum, Mean,
  Cast, Identity, Dropout (``Where`` of its mask in training mode), Where, Max, Min, Clip
  (``ClipGrad``), PRelu, Mod, ``ai.graphcore`` Scale / Fmod / Atan2; Sign, Floor, Ceil, Round:
  zero; RandomNormalLike, RandomUniformLike, EyeLike, Bernoulli: none;
- :mod:`.matmul`: MatMul, Gemm -> MatMul / Transpose (PopART's ``MatMulLhsGradOp`` /
  ``MatMulRhsGradOp`` patterns); Einsum, Det (generic);
- :mod:`.unary`: Relu, Sigmoid, Tanh, Gelu, GeluErf, LeakyRelu, Erf, Elu, Selu, Celu, HardSigmoid,
  Softsign, Softplus, ThresholdedRelu, Shrink, HardSwish, Mish, Swish, Tan, Asin, Acos, Atan,
  Sinh, Cosh, Asinh, Acosh, Atanh -> ``*Grad`` ops (``popnn::nonLinearityInputGradient`` or one
  ``popops.map``); Sin, Cos -> ONNX ops;
- :mod:`.softmax`: Softmax, LogSoftmax (any axis) -> ``SoftmaxGrad`` / ``LogSoftmaxGrad``;
- :mod:`.views`: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Slice, Expand, Tile,
  Split, Pad, DepthToSpace, SpaceToDepth, Trilu, ReverseSequence, Resize, Upsample,
  CenterCropPad, AffineGrid;
- :mod:`.reduce`: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceL1, ReduceL2,
  ReduceSumSquare, ReduceLogSumExp, ReduceLogSum, ReduceProd, CumSum, CumProd;
- :mod:`.conv`: Conv -> ``ConvDataGrad`` / ``ConvWeightsGrad`` (``poplin`` input-gradient and
  weight-delta convolutions) and a ReduceSum for the bias; ConvTranspose, Col2Im;
- :mod:`.pooling`: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, LpPool, GlobalLpPool,
  MaxUnpool, RoiAlign;
- :mod:`.gather`: Gather -> ``GatherGrad`` (a scatter-add into the table's shape);
  ScatterElements / Scatter -> ``ScatterDataGrad`` / ``ScatterUpdateGrad``; GatherElements,
  GatherND, ScatterND, TopK, Compress;
- :mod:`.norm`: LayerNormalization, BatchNormalization (training mode), InstanceNormalization,
  GroupNormalization -> ``<Norm>Grad`` (``popnn`` norm gradients); RMSNormalization,
  LpNormalization, MeanVarianceNormalization, LRN;
- :mod:`.loss`: Nll, L1, IdentityLoss (``ai.graphcore``).
- :mod:`.graphcore`: the other ``ai.graphcore`` ops (ScaledAdd, Reshape, Slice, Subsample, Reverse,
  Swish, Expm1, Log1p, Atan2, Fmod, Ctc,
  ReduceMedian, GroupNormalization, dropout, the dynamic slices, ScatterReduce ...).

Ops without a closed form as ONNX ops or PopLibs calls get a *generic* gradient op
(:meth:`GradContext.vjp`): ``ai.graphcore`` ``<Op>Grad`` (PopART's name where PopART has one),
whose host kernel is the vector-Jacobian product of the forward op's host kernel. Integer and
bool tensors (indices, shapes, masks: Equal, Not, IsNaN, ArgMax ...) carry no gradient, so those
ops are never differentiated.

A rule is ``fn(g: GradContext, op) -> list`` (one gradient tensor id, or None, per op input). It
reads the gradients of the op's outputs with ``g.gy(k)`` and adds ops with ``g.add`` (ordinary
ONNX ops wherever they express the gradient, so they are lowered and costed like forward ops;
``ai.graphcore`` ``*Grad`` ops, whose host kernels are in :mod:`openipu.popart.onnx_ops.grad`,
otherwise). Ops with no rule have no gradient: PopART's error names them when a weight's
gradient would have to pass through one.
"""

from __future__ import annotations

import importlib

import numpy as np

from openipu.popart.tensorinfo import NUMPY_OF, TensorInfo

GRAPHCORE = "ai.graphcore"
_RULES: dict[tuple[str, str], object] = {}
_MODULES = ("elementwise", "matmul", "unary", "softmax", "views", "reduce", "conv", "pooling", "gather", "loss",
            "norm", "graphcore", "recurrent")
_LOADED = False


def grad_rule(*op_types: str, domain: str = ""):
    """Register ``fn(g, op)`` as the gradient rule of ``op_types`` in ``domain``."""
    def reg(fn):
        for t in op_types:
            _RULES[(domain, t)] = fn
        return fn
    return reg


def find_rule(op):
    """The gradient rule of ``op``, or None."""
    global _LOADED
    if not _LOADED:
        for m in _MODULES:
            importlib.import_module(f"{__name__}.{m}")
        _LOADED = True
    return _RULES.get((op.domain, op.op_type))


class GradContext:
    """What a rule sees: the IR, the op being differentiated, its output gradients, and which of
    its inputs need a gradient. ``add`` appends ops placed like the forward op."""

    def __init__(self, ir, op, out_grads: list, needs: list):
        self.ir, self.op = ir, op
        self.tag = op.name or op.attrs.get("__node__") or f"{op.op_type}_{op.id}"
        self._gy = out_grads
        self._needs = needs

    # -- reading --------------------------------------------------------------------------
    def gy(self, k: int = 0) -> str | None:
        """Id of the gradient of output ``k`` (None when no gradient reaches it)."""
        return self._gy[k] if k < len(self._gy) else None

    def needs(self, i: int) -> bool:
        """Whether input ``i`` needs a gradient."""
        return i < len(self._needs) and self._needs[i]

    def x(self, i: int) -> str:
        return self.op.inputs[i] if i < len(self.op.inputs) else ""

    def y(self, k: int = 0) -> str:
        return self.op.outputs[k]

    def shape(self, tid: str) -> list[int]:
        return list(self.ir.tensors[tid].info.shape())

    def dtype(self, tid: str) -> str:
        return self.ir.tensors[tid].info.data_type()

    def fwd_attrs(self, **extra) -> dict:
        """The forward op's attributes (without openipu's ``__`` entries), plus ``extra``."""
        a = {k: v for k, v in self.op.attrs.items() if not k.startswith("__")}
        a.update(extra)
        return a

    def const_value(self, tid: str):
        """The value of a Const input (numpy), or None."""
        t = self.ir.tensors.get(tid) if tid else None
        return None if t is None or t.kind != "Const" else np.asarray(t.value)

    # -- adding ---------------------------------------------------------------------------
    def add(self, op_type: str, inputs: list, shape=None, dtype: str | None = None, attrs: dict | None = None,
            domain: str = "", opset: int | None = None):
        """Append an op; its output has ``shape`` and ``dtype`` (default: the first input's).
        Returns the output id."""
        first = inputs[0]
        shape = self.shape(first) if shape is None else list(shape)
        dtype = dtype or self.dtype(first)
        base = f"{op_type}Grad:{self.tag}" if domain != GRAPHCORE else f"{op_type}:{self.tag}"
        op = self.ir.add_op(op_type, inputs, [(base, dtype, shape)], attrs, domain=domain,
                            opset=opset, name=f"{op_type}/{self.tag}", like=self.op)
        op.grad_of = self.op
        return op.outputs[0]

    def add_n(self, op_type: str, inputs: list, outs: list, attrs: dict | None = None, domain: str = GRAPHCORE,
              opset: int | None = None) -> list[str]:
        """Append an op with several outputs, ``outs`` giving ``(shape, dtype)`` each (PopART's
        grad ops with one output per differentiated input, e.g. ``BatchNormalizationGrad``).
        Returns the output ids."""
        outputs = [(f"{op_type}:{self.tag}:{k}", dt, list(s)) for k, (s, dt) in enumerate(outs)]
        op = self.ir.add_op(op_type, inputs, outputs, attrs, domain=domain, opset=opset, name=f"{op_type}/{self.tag}",
                            like=self.op)
        op.grad_of = self.op
        return list(op.outputs)

    def vjp(self, wrt: int, out: int = 0, op_type: str | None = None, **extra) -> str:
        """The gradient of input ``wrt`` through output ``out`` by the generic ``ai.graphcore``
        ``<Op>Grad`` op (``op_type``; inputs: the forward inputs, then the output gradient), whose
        host kernel is the vector-Jacobian product of the forward op's host kernel
        (:func:`openipu.popart.onnx_ops.grad.vjp_many`). For ops without a closed form in ONNX
        ops or PopLibs: exact, and costed by the generic lowering. Returns the gradient's id."""
        x = self.x(wrt)
        attrs = self.fwd_attrs(wrt=wrt, fwd_out=out, fwd_opset=self.op.opset,
                               fwd_outputs=len(self.op.outputs), **extra)
        return self.add(op_type or f"{self.op.op_type}Grad", list(self.op.inputs) + [self.gy(out)], shape=self.shape(x),
                        dtype=self.dtype(x), attrs=attrs, domain=GRAPHCORE)

    def fwd_output(self, k: int, shape, dtype: str) -> str:
        """The forward op's output ``k`` (an optional output it saves for its gradient, e.g.
        LayerNormalization's ``Mean``), added to the op (``shape``, ``dtype``) when it has none."""
        op = self.op
        if k < len(op.outputs) and op.outputs[k]:
            return op.outputs[k]
        while len(op.outputs) <= k:
            op.outputs.append("")
        tid = self.ir.unique_id(f"{op.outputs[0]}:{k}")
        self.ir._add_tensor(tid, dtype, list(shape), "ActGrad", producer=op)
        op.outputs[k] = tid
        op.attrs["__num_outputs__"] = len(op.outputs)
        return tid

    def zeros(self, shape, like: str, name: str = "zeros") -> str:
        """A Const of zeros of ``shape`` and ``like``'s dtype."""
        return self.const(np.zeros(list(shape)), like, name)

    def const(self, value, like: str, name: str = "const") -> str:
        """A scalar (or array) Const of ``like``'s dtype."""
        arr = np.asarray(value, dtype=NUMPY_OF[self.dtype(like)])
        return self.ir.add_const(f"{name}:{self.tag}", arr)

    def int64s(self, values, name: str = "shape") -> str:
        return self.ir.add_const(f"{name}:{self.tag}", np.asarray(list(values), np.int64))

    def scale(self, t: str, factor: float) -> str:
        """``t * factor`` (``t`` itself when ``factor`` is 1)."""
        if factor == 1.0:
            return t
        return self.add("Mul", [t, self.const(factor, t, "scale")])

    def neg(self, t: str) -> str:
        return self.add("Neg", [t])

    def reshape(self, t: str, shape) -> str:
        if self.shape(t) == list(shape):
            return t
        return self.add("Reshape", [t, self.int64s(shape)], shape=shape, opset=5)

    def transpose(self, t: str, perm) -> str:
        s = self.shape(t)
        return self.add("Transpose", [t], shape=[s[p] for p in perm], attrs={"perm": list(perm)})

    def reduce_sum(self, t: str, axes, keepdims: bool) -> str:
        s = self.shape(t)
        axes = sorted(a % len(s) for a in axes)
        out = [1 if d in axes else n for d, n in enumerate(s)] if keepdims else [n for d, n in enumerate(s)
                                                                                  if d not in axes]
        return self.add("ReduceSum", [t], shape=out, attrs={"axes": axes, "keepdims": int(keepdims)}, opset=11)

    def expand(self, t: str, shape) -> str:
        if self.shape(t) == list(shape):
            return t
        return self.add("Expand", [t, self.int64s(shape)], shape=shape, opset=8)

    def unbroadcast(self, t: str, shape) -> str:
        """Sum ``t`` over the dimensions numpy broadcasting added or stretched to reach its shape
        from ``shape`` (PopART's ``ReduceSumToShape``); then reshape to ``shape``."""
        s, shape = self.shape(t), list(shape)
        if s == shape:
            return t
        lead = len(s) - len(shape)
        axes = list(range(lead)) + [lead + d for d, n in enumerate(shape) if n == 1 and s[lead + d] != 1]
        r = self.reduce_sum(t, axes, keepdims=True) if axes else t
        return self.reshape(r, shape)

    def cast(self, t: str, dtype: str) -> str:
        if self.dtype(t) == dtype:
            return t
        return self.add("Cast", [t], dtype=dtype, attrs={"to": TensorInfo(dtype, [1]).onnx_type()}, opset=13)
