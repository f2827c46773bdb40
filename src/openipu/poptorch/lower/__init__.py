"""ATen graph -> PopART: the captured ``torch.export`` graph (:mod:`openipu.poptorch.capture`)
rebuilt op by op with a ``popart.Builder`` (PopTorch's ``popart_canonicalization`` handlers and
``LowerToPopart``), one op family per module:

- :mod:`.elementwise`: arithmetic, activations, comparisons, casts, creation, dropout;
- :mod:`.linear`: linear / addmm / matmul / bmm, convolution, embedding;
- :mod:`.norm`: batch, layer and group normalisation;
- :mod:`.shape`: views, permutes, slices, concatenation, splits;
- :mod:`.reduce`: sums, means, max / min, softmax, log-softmax;
- :mod:`.pool`: max and average pooling;
- :mod:`.loss`: the ``torch.nn`` losses and ``poptorch.identity_loss``;
- :mod:`.index`: advanced indexing, ``index_put``, scatters, ``*_scatter``, masked ops;
- :mod:`.sort`: ``sort``, ``topk``, ``cumsum`` / ``cumprod``, ``flip``;
- :mod:`.resize`: ``upsample_*`` / ``interpolate`` and padding (constant, reflection, replication);
- :mod:`.random`: ``rand``, ``randn``, ``bernoulli``, ``normal``, ``uniform`` (seeded by
  ``Options.randomSeed``);
- :mod:`.activation`: the activations and element-wise maths :mod:`.elementwise` leaves out.

An op with no lowering of its own but a decomposition in torch's table is lowered through it
(:func:`lower_decomposed`: the decomposition traced on the node's example shapes, the resulting
ATen graph lowered in place).

A lowering is ``fn(lw, node) -> tensor id | list of ids | Python value`` registered with
:func:`aten` under the op's overload name (``"aten.addmm.default"``) or its packet
(``"aten.addmm"``). An op without one raises PopTorch's "Unsupported ops found in compiled
model" error naming every such op.
"""

from __future__ import annotations

import functools
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
#: op name -> the ONNX op type that combines the op's operands in its lowering (declared with
#: ``aten(..., onnx="Add")`` by lowerings that are that one op, possibly after casts of the
#: operands and followed by element-wise ops of its output)
ONNX_OP: dict[str, str] = {}
#: the ai.onnx opset the lowerings build with (:class:`Lowering`)
OPSET = 11

#: torch dtype -> PopART type (int64 and float64 become 32-bit, as PopTorch casts them)
POPART_TYPE = {torch.float32: "FLOAT", torch.float16: "FLOAT16", torch.int32: "INT32", torch.int64: "INT32",
               torch.bool: "BOOL", torch.float64: "FLOAT", torch.int8: "INT8", torch.uint8: "UINT8",
               torch.int16: "INT16", torch.bfloat16: "FLOAT16"}
NUMPY_TYPE = {"FLOAT": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "BOOL": np.bool_, "INT8": np.int8,
              "UINT8": np.uint8, "INT16": np.int16}


def aten(*names: str, loss: bool = False, onnx: str | None = None):
    """Register a lowering for the ops ``names``; ``loss``: their output is a loss; ``onnx``: the
    ONNX op type that combines their operands (:data:`ONNX_OP`)."""
    def deco(fn):
        for n in names:
            LOWERINGS[n] = fn
            if loss:
                LOSS_OPS.add(n)
            if onnx is not None:
                ONNX_OP[n] = onnx
        return fn
    return deco


@functools.cache
def _onnx_broadcasts(op_type: str) -> bool:
    """Whether ONNX op ``op_type`` (at :data:`OPSET`) has multidirectional (NumPy-style)
    broadcasting, as its ``onnx.defs`` schema states."""
    from onnx import defs
    return "multidirectional" in defs.get_schema(op_type, OPSET).doc


def broadcasts(target) -> bool:
    """Whether the lowering of op ``target`` combines its tensor operands with an ONNX op of
    multidirectional broadcasting (``aten.add.Tensor`` -> ``Add``, ``aten.where.self`` ->
    ``Where``, ``aten.lt.Tensor`` -> ``Less``): an operand may then be lowered with any shape
    that broadcasts to the output. Derived from :data:`ONNX_OP` and the ONNX schemas."""
    op = ONNX_OP.get(op_name(target))
    return op is not None and _onnx_broadcasts(op)


def op_name(target) -> str:
    """``aten.addmm.default`` for an OpOverload, ``getitem`` for ``operator.getitem``."""
    if target is operator.getitem:
        return "getitem"
    return str(target)


def lowering_of(target):
    """The lowering registered for ``target`` (overload name first, then its packet), or None."""
    name = op_name(target)
    fn = LOWERINGS.get(name)
    if fn is None and name.count(".") == 2:
        fn = LOWERINGS.get(name.rsplit(".", 1)[0])
    if fn is None and name.startswith("aten.") and "_copy." in name:      # view_copy ops: the view's lowering
        ns, packet, ov = name.split(".")
        if packet.endswith("_copy"):
            fn = LOWERINGS.get(f"{ns}.{packet[:-5]}.{ov}")
    if fn is None and name.startswith("aten.") and name.count(".") == 2:
        # in-place ops of a traced decomposition (fill_, sub_ ... on fresh tensors): make_fx
        # points later uses at the in-place op's output, so the functional op computes it
        ns, packet, ov = name.split(".")
        if packet.endswith("_") and not packet.endswith("__"):
            fn = LOWERINGS.get(f"{ns}.{packet[:-1]}.{ov}") or LOWERINGS.get(f"{ns}.{packet[:-1]}")
    return fn


class Lowering:
    """The state of one graph's lowering: the builder ``b``, its ``aiOnnx`` (opset 11) and
    ``aiGraphcore`` opsets, the tensor id of every lowered FX node (``ids``), the training flag
    and the block annotation (virtual graph, pipeline stage) of the node being lowered."""

    def __init__(self, builder: "popart.Builder", training: bool):
        self.b = builder
        self.onnx = getattr(builder, f"aiOnnxOpset{OPSET}")
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


def load_lowerings() -> None:
    """Import every lowering module (each registers its ops)."""
    from openipu.poptorch.lower import (activation, elementwise, index, linear, loss, norm, pool,  # noqa: F401
                                        poptorch_ops, random, reduce, resize, shape, sort)


def decomposition_of(target):
    """Torch's decomposition of the op ``target`` (an ``OpOverload``), or None."""
    from torch._decomp import core_aten_decompositions, decomposition_table
    if not isinstance(target, torch._ops.OpOverload):
        return None
    global _CORE
    if _CORE is None:
        _CORE = core_aten_decompositions()
    fn = _CORE.get(target)       # core ATen decompositions first (they avoid prims)
    if fn is None and target.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        fn = target        # a composite op: traced, it decomposes as the dispatcher runs it
    return fn if fn is not None else decomposition_table.get(target)


_CORE = None


def _is_tuple_ctor(target) -> bool:
    """A (named) tuple class called in a traced graph (a decomposition's ``return_types``)."""
    return isinstance(target, type) and issubclass(target, tuple)


def lowers(target) -> bool:
    """Whether the op ``target`` lowers: its own lowering, or a decomposition."""
    return target is operator.getitem or _is_tuple_ctor(target) or lowering_of(target) is not None or \
        decomposition_of(target) is not None


def _example(v):
    """A real tensor with ``v``'s shape and dtype to trace a decomposition on (``torch.empty``:
    no values are written, so host memory is not touched beyond the allocation)."""
    if isinstance(v, torch.Tensor):
        return torch.empty([int(d) for d in v.shape], dtype=v.dtype)
    return v


_DECOMP_DEPTH = 4


def lower_decomposed(lw: "Lowering", n: torch.fx.Node, depth: int = 0):
    """Lower ``n`` through torch's decomposition of its op: the decomposition is traced with
    ``make_fx`` (fake tensors of the node's input shapes) to an ATen graph whose ops are lowered
    in place (recursively, at most 4 levels). Returns the id(s) of the node's output(s). Raises
    :class:`Error` (PopTorch's unsupported-op wording) when an op of the decomposition has no
    lowering either."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree as pytree
    decomp = decomposition_of(n.target)
    if decomp is None or depth >= _DECOMP_DEPTH:
        _unsupported([op_name(n.target)])
    flat, spec = pytree.tree_flatten((n.args, n.kwargs))
    pos = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node)]

    def f(*ts):
        vals = list(flat)
        for i, t in zip(pos, ts):
            vals[i] = t
        args, kwargs = pytree.tree_unflatten(vals, spec)
        return decomp(*args, **kwargs)
    examples = [_example(flat[i].meta["val"]) for i in pos]
    try:
        sub = make_fx(f, tracing_mode="fake")(*examples)
    except Exception as e:
        raise Error(f"Could not lower aten::{op_name(n.target).split('.')[1]} through its decomposition: "
                    f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from e
    placeholders = [p for p in sub.graph.nodes if p.op == "placeholder"]
    for p, i in zip(placeholders, pos):
        lw.ids[p] = lw.ids[flat[i]]
    parent = lw.node
    try:
        _lower_nodes(lw, sub.graph.nodes, depth + 1, annotate=False)
    finally:
        lw.node = parent
    out = next(o for o in sub.graph.nodes if o.op == "output").args[0]
    res = pytree.tree_map(lambda x: lw.ids[x] if isinstance(x, torch.fx.Node) else x, out)
    if isinstance(res, (list, tuple)) and len(res) == 1 and not isinstance(lw.val(n), (list, tuple)):
        return res[0]
    return list(res) if isinstance(res, tuple) else res


def _unsupported(missing):
    ops = ", ".join("aten::" + m.split(".")[1] if m.startswith("aten.") else m for m in sorted(set(missing)))
    raise Error(f"Unsupported ops found in compiled model: [{ops}]. Not all operations are supported yet by "
                "Graphcore's PyTorch compiler. If you believe any of these should be, please report this "
                "message to support@graphcore.ai.")


def _lower_nodes(lw: "Lowering", nodes, depth: int = 0, annotate: bool = True) -> None:
    """Lower the ``call_function`` nodes of ``nodes`` in order into ``lw.ids``."""
    from openipu.poptorch.lower import poptorch_ops
    for n in nodes:
        if n.op != "call_function":
            continue
        lw.node = n
        if n.target is operator.getitem:
            src = lw.ids[n.args[0]]
            lw.ids[n] = src[n.args[1]] if isinstance(src, (list, tuple)) else src
            continue
        if _is_tuple_ctor(n.target):
            from torch.utils import _pytree as pytree
            lw.ids[n] = pytree.tree_map(lambda a: lw.ids[a] if isinstance(a, torch.fx.Node) else a,
                                        list(n.args[0] if len(n.args) == 1 else n.args))
            continue
        fn = lowering_of(n.target)
        if not annotate:
            lw.ids[n] = fn(lw, n) if fn is not None else lower_decomposed(lw, n, depth)
            continue
        ann = n.meta.get("custom") or {}
        ctx = lw.b.virtualGraph(int(ann["ipu"])) if "ipu" in ann else None
        stage = lw.b.pipelineStage(int(ann["stage"])) if "stage" in ann else None
        scopes = poptorch_ops.node_contexts(lw, n)      # NameScope, Attribute, MultiConv
        for c in (ctx, stage, *scopes):
            if c is not None:
                c.__enter__()
        try:
            lw.ids[n] = fn(lw, n) if fn is not None else lower_decomposed(lw, n, depth)
        finally:
            for c in (*reversed(scopes), stage, ctx):
                if c is not None:
                    c.__exit__(None, None, None)


def lower_graph(gm: torch.fx.GraphModule, lw: Lowering, inputs: dict) -> dict:
    """Lower every call of ``gm`` (placeholders already in ``lw.ids`` via ``inputs``: node ->
    id). Raises :class:`Error` naming every op with neither a lowering nor a decomposition
    before lowering any."""
    load_lowerings()
    missing = sorted({op_name(n.target) for n in gm.graph.nodes if n.op == "call_function"
                      and not lowers(n.target)})
    if any(m.startswith("<built-in function") or "sym_" in m for m in missing):
        raise Error("The model computes a shape from tensor values (e.g. boolean-mask indexing x[mask], nonzero, "
                    "unique): a data-dependent shape, which a static IPU graph cannot have. Use torch.where, "
                    f"masked_fill or a fixed-size result instead (ops on symbolic sizes: {', '.join(missing)})")
    if missing:
        _unsupported(missing)
    lw.ids.update(inputs)
    _lower_nodes(lw, gm.graph.nodes)
    return lw.ids
