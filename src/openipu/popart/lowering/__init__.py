"""Lowering of IR ops onto Poplar / PopLibs (PopART's ``popx`` "Opx" layer).

A *precise* lowering builds the op from PopLibs calls (``popops`` elementwise ops, ``poplin``
matMul) and is registered with :func:`lowering`; it may decline an op through its ``accepts``
predicate (e.g. integer division). Every other op with a host kernel goes through the one
*generic* costed vertex group (:mod:`.generic`). One op family per module:

- :mod:`.elementwise`: Add, Sub, Mul, Div, Pow, Max, Min -> ``popops`` binary ops;
- :mod:`.matmul`: MatMul, Gemm -> ``poplin.matMul`` (batched: ``poplin.matMulGrouped``);
- :mod:`.unary`: Relu, Sigmoid, Tanh, Gelu -> ``popnn.nonLinearity``; Abs, Exp, Erf, ..., LeakyRelu,
  Clip, Where -> ``popops.map``; Cast (float <-> half) -> ``popops.cast``;
- :mod:`.conv`: Conv -> ``poplin.convolution`` (+ ``poplin.addBias``);
- :mod:`.pooling`: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool -> ``popnn.pooling.pool``;
- :mod:`.norm`: BatchNormalization (inference), LayerNormalization, InstanceNormalization,
  GroupNormalization -> ``popnn.bn`` / ``ln`` / ``in`` / ``gn``;
- :mod:`.softmax`: Softmax, LogSoftmax -> ``popnn.nonLinearity(SOFTMAX_STABLE)`` / ``logSoftmax``;
- :mod:`.reduce`: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSumExp -> ``popops.reduce``;
- :mod:`.gather`: Gather -> ``popops.multiSlice`` (the embedding lookup);
- :mod:`.compare`: Equal, Less, Greater, ..., And, Or, Xor, Not, IsNaN -> ``popops.map`` (BOOL);
- :mod:`.variadic`: Sum, Mean -> one fused ``popops.map``;
- :mod:`.views`: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Identity, Dropout (inference),
  Concat -> Poplar tensor views (PopART's in-place variants);
- :mod:`.varupdate`: the weight update ops of training (SGD0VarUpdate, SGD1*, Accumulate,
  AdamUpdater, LambSquare, AdamVarUpdate, RMSPropUpdater, AdaDeltaUpdater, ScaledVarUpdate,
  AccumulatorUpdate) -> ``popops`` scaled adds / maps / reduces in place; ReplicatedAllReduceInplace
  -> ``gcl`` all-reduce;
- :mod:`.loss`: Nll -> ``popops`` one-hot, mul, reduce, map; L1 -> ``popops`` map, reduce (the loss spread over the batch's tiles);
- :mod:`.grad`: the ``ai.graphcore`` gradient ops with a PopLibs form (non-linearity gradients ->
  ``popnn.nonLinearityInputGradient``; ConvDataGrad / ConvWeightsGrad -> ``poplin``);
- :mod:`.graphcore`: ai.graphcore ops with a Poplar / PopLibs form (identity views, PrintTensor,
  Abort, dropout through ``poprand``, the random seed, group normalisation through ``popnn.gn``);
- :mod:`.generic`: everything else with an onnx_ops kernel;
- :mod:`.program`: the session programs (host streams, ``Repeat(batchesPerStep)`` around
  ``Repeat(accumulationFactor)`` and the accumulate outer fragment in training, anchor copies
  by return type, weight transfers, inter-IPU copies via :class:`.context.LoweringContext`).

A lowering function is ``fn(ctx, op) -> list of poplar Tensors`` (one per op output), appending
its programs to ``ctx.prog``; ``ctx.input(op, i)`` gives input ``i`` on the op's virtual graph.
"""

from __future__ import annotations

import importlib

_PRECISE: dict[tuple[str, str], list] = {}
_MODULES = ("elementwise", "matmul", "unary", "compare", "variadic", "views", "pooling", "norm", "softmax",
            "reduce", "argextrema", "gather", "scatter", "conv", "varupdate", "grad", "loss", "graphcore",
            "autolossscale", "fused")
_LOADED = False


def lowering(*op_types: str, domain: str = "", accepts=None):
    """Register ``fn(ctx, op)`` as the precise lowering of ``op_types``; ``accepts(op, ir)``
    (optional) says whether it handles a given op (else the generic lowering is used)."""
    def reg(fn):
        for t in op_types:
            _PRECISE.setdefault((domain, t), []).append((accepts, fn))
        return fn
    return reg


def _load():
    global _LOADED
    if not _LOADED:
        for m in _MODULES:
            importlib.import_module(f"{__name__}.{m}")
        _LOADED = True


def has_lowering(op) -> bool:
    """Whether a precise lowering is registered for the op's type (it may still decline)."""
    _load()
    return (op.domain, op.op_type) in _PRECISE


def precise_lowering(op, ir):
    """The precise lowering function that accepts ``op``, or ``None``."""
    _load()
    for accepts, fn in _PRECISE.get((op.domain, op.op_type), []):
        if accepts is None or accepts(op, ir):
            return fn
    return None
