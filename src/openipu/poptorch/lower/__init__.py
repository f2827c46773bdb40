"""ATen graph -> PopART: the captured ``torch.export`` graph (:mod:`openipu.poptorch.capture`)
rebuilt op by op with a ``popart.Builder`` (PopTorch's ``popart_canonicalization`` handlers and
``LowerToPopart``), one op family per module:

- :mod:`.elementwise`: arithmetic, activations, comparisons, casts, creation, dropout;
- :mod:`.linear`: linear / addmm / matmul / bmm, convolution, embedding;
- :mod:`.norm`: batch, layer and group normalisation;
- :mod:`.shape`: views, permutes, slices, concatenation, splits;
- :mod:`.reduce`: sums, means, max / min, softmax, log-softmax;
- :mod:`.pool`: max and average pooling;
- :mod:`.loss`: the ``torch.nn`` losses and ``poptorch.identity_loss``.

A lowering is ``fn(lw, node) -> tensor id | list of ids | Python value`` registered with
:func:`aten` under the op's overload name (``"aten.addmm.default"``) or its packet
(``"aten.addmm"``). An op without one raises PopTorch's "Unsupported ops found in compiled
model" error naming every such op.
"""

from __future__ import annotations

import operator
from typing import Callable

import numpy as np
import torch

from openipu import popart
from openipu.poptorch.errors import Error

#: op name -> lowering
LOWERINGS: dict[str, Callable] = {}
#: ops whose outputs are losses (PopTorch: every ``torch.nn`` loss ends in ``identityloss``)
LOSS_OPS: set[str] = set()

#: torch dtype -> PopART type (int64 and float64 become 32-bit, as PopTorch casts them)
POPART_TYPE = {torch.float32: "FLOAT", torch.float16: "FLOAT16", torch.int32: "INT32", torch.int64: "INT32",
               torch.bool: "BOOL", torch.float64: "FLOAT", torch.int8: "INT8", torch.uint8: "UINT8",
               torch.int16: "INT16", torch.bfloat16: "FLOAT16"}
NUMPY_TYPE = {"FLOAT": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "BOOL": np.bool_, "INT8": np.int8,
              "UINT8": np.uint8, "INT16": np.int16}


def aten(*names: str, loss: bool = False):
    """Register a lowering for the ops ``names``; ``loss``: their output is a loss."""
    def deco(fn):
        for n in names:
            LOWERINGS[n] = fn
            if loss:
                LOSS_OPS.add(n)
        return fn
    return deco


def op_name(target) -> str:
    """``aten.addmm.default`` for an OpOverload, ``getitem`` for ``operator.getitem``."""
    if target is operator.getitem:
        return "getitem"
    return str(target)


def lowering_of(target):
    name = op_name(target)
    fn = LOWERINGS.get(name)
    if fn is None and name.count(".") == 2:
        fn = LOWERINGS.get(name.rsplit(".", 1)[0])
    return fn


class Lowering:
    """The state of one graph's lowering: the builder ``b``, its ``aiOnnx`` (opset 11) and
    ``aiGraphcore`` opsets, the tensor id of every lowered FX node (``ids``), the training flag
    and the block annotation (virtual graph, pipeline stage) of the node being lowered."""

    def __init__(self, builder: "popart.Builder", training: bool):
        self.b = builder
        self.onnx = builder.aiOnnxOpset11
        self.gc = builder.aiGraphcore
        self.training = training
        self.ids: dict = {}
        self.node = None

    # -- operands ----------------------------------------------------------------------------
    def t(self, arg) -> str:
        """The tensor id of FX argument ``arg`` (a node, or a Python number made a constant)."""
        if isinstance(arg, torch.fx.Node):
            v = self.ids[arg]
            if not isinstance(v, str):
                raise Error(f"'{arg.name}' is not a tensor in the captured graph")
            return v
        return self.const(arg)

    def const(self, value, dtype: str | None = None) -> str:
        """An ONNX Constant of ``value`` (type ``dtype``, default: float for floats, int32 for
        ints, bool for bools)."""
        arr = np.asarray(value)
        if dtype is None:
            dtype = "BOOL" if arr.dtype == np.bool_ else "FLOAT" if arr.dtype.kind == "f" else "INT32"
        return self.onnx.constant(arr.astype(NUMPY_TYPE[dtype]), self._name("const"))

    def shape_const(self, shape) -> str:
        """An INT64 constant (ONNX shapes, axes)."""
        return self.onnx.constant(np.asarray(list(shape), np.int64), self._name("shape"))

    def val(self, node=None):
        """The fake tensor FX recorded for ``node``'s output (default: the node being lowered)."""
        return (node or self.node).meta["val"]

    def dtype(self, arg) -> str:
        """The PopART type of FX argument ``arg``."""
        if isinstance(arg, torch.fx.Node):
            v = arg.meta["val"]
            return POPART_TYPE[v.dtype]
        return "FLOAT" if isinstance(arg, float) else "BOOL" if isinstance(arg, bool) else "INT32"

    def shape(self, arg) -> list[int]:
        return [int(d) for d in arg.meta["val"].shape]

    def out_dtype(self) -> str:
        v = self.val()
        return POPART_TYPE[(v[0] if isinstance(v, (tuple, list)) else v).dtype]

    def cast(self, tid: str, dtype: str) -> str:
        return self.onnx.cast([tid], dtype, self._name("cast"))

    def like(self, arg, other) -> str:
        """``arg`` (a node or a number) as a tensor of ``other``'s PopART type."""
        dt = self.dtype(other)
        if not isinstance(arg, torch.fx.Node):
            return self.const(arg, dt)
        tid = self.t(arg)
        return tid if self.dtype(arg) == dt else self.cast(tid, dt)

    def _name(self, what: str = "") -> str:
        n = self.node.name if self.node is not None else ""
        return f"{n}/{what}" if what else n


def lower_graph(gm: torch.fx.GraphModule, lw: Lowering, inputs: dict) -> dict:
    """Lower every call of ``gm`` (placeholders already in ``lw.ids`` via ``inputs``: node ->
    id). Raises :class:`Error` naming every op without a lowering before lowering any."""
    from openipu.poptorch.lower import elementwise, linear, loss, norm, pool, poptorch_ops, reduce, shape  # noqa: F401
    missing = sorted({op_name(n.target) for n in gm.graph.nodes if n.op == "call_function"
                      and lowering_of(n.target) is None and n.target is not operator.getitem})
    if missing:
        ops = ", ".join("aten::" + m.split(".")[1] if m.startswith("aten.") else m for m in missing)
        raise Error(f"Unsupported ops found in compiled model: [{ops}]. Not all operations are supported yet by "
                    "Graphcore's PyTorch compiler. If you believe any of these should be, please report this "
                    "message to support@graphcore.ai.")
    lw.ids.update(inputs)
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        lw.node = n
        if n.target is operator.getitem:
            src = lw.ids[n.args[0]]
            lw.ids[n] = src[n.args[1]] if isinstance(src, (list, tuple)) else src
            continue
        ann = n.meta.get("custom") or {}
        ctx = lw.b.virtualGraph(int(ann["ipu"])) if "ipu" in ann else None
        stage = lw.b.pipelineStage(int(ann["stage"])) if "stage" in ann else None
        scopes = poptorch_ops.node_contexts(lw, n)      # NameScope, Attribute, MultiConv
        for c in (ctx, stage, *scopes):
            if c is not None:
                c.__enter__()
        try:
            lw.ids[n] = lowering_of(n.target)(lw, n)
        finally:
            for c in (*reversed(scopes), stage, ctx):
                if c is not None:
                    c.__exit__(None, None, None)
    return lw.ids
