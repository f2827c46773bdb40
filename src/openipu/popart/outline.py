"""Outlining (PopART's ``SubgraphOutline`` transform): repeated op sequences become one subgraph.

A model whose layers repeat (the encoder layers of BERT, the blocks of GPT-2) schedules the same
sequence of ops once per layer. PopART lowers such a sequence once, as a Poplar function, and
replaces each occurrence with a ``CallOp``: the caller's tensors are copied into the subgraph's
inputs, the function is called, and its outputs are copied back (``subgraphCopyingStrategy``
``OnEnterAndExit``). The code (vertex state, exchange code) then exists once on the tiles instead
of once per layer, and the compiler sees each distinct op once.

Two occurrences are the same subgraph when their ops agree position by position in type,
attributes, input and output types and shapes, virtual graph and pipeline stage, and the values
of constant inputs the lowerings read (integer constants and scalars), and when their ops are
wired the same way: each input is the same output of the same earlier op of the sequence, or the
same input from outside. Weights are inputs from outside, so layers with different weights share
one subgraph; except inputs whose values a lowering builds into the program (inference fp8
weights stored as QUARTER constants, :data:`VALUE_INPUTS`), which must be the same tensor.

The search is greedy, as PopART's outliner is: among the op sequences that repeat without
overlap, it takes the one that saves the most subgraph value (``(occurrences - 1) x value``),
marks its ops, and looks again among the rest. An op's value is PopART's: 1000 for matmuls and
convolutions (``getHighSubgraphValue``), 0.1 for the others (``getLowSubgraphValue``); a sequence
is outlined only if its value reaches ``outlineThreshold`` (default 1.0). [A]: PopART's outliner
also outlines nested and partly overlapping sequences and weighs copy costs
(``enableOutliningCopyCostPruning``); openipu outlines one level.

``enableOutlining`` False turns the transform off.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

#: PopART ``Op::getHighSubgraphValue`` / ``getLowSubgraphValue``.
HIGH_VALUE, LOW_VALUE = 1000.0, 0.1
_HIGH_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "ConvInteger", "MatMulInteger", "QLinearMatMul",
             "QLinearConv"}
#: ``(domain, op type) -> reader(op, ir)``: the inputs (indices) whose whole value the op's
#: lowering builds into the program (e.g. inference fp8 weights stored as constants,
#: :mod:`openipu.popart.lowering.fused`). Such an input is part of the op's identity (by tensor),
#: so occurrences with different values are not one subgraph. Filled by
#: :func:`register_value_inputs`.
VALUE_INPUTS: dict = {}


def register_value_inputs(domain: str, op_type: str, reader) -> None:
    """Declare that the lowering of ``domain::op_type`` builds the values of the inputs
    ``reader(op, ir)`` (a tuple of input indices, possibly empty) into the program: outlining
    then only groups occurrences that read the same tensors there."""
    VALUE_INPUTS[(domain, op_type)] = reader


#: constants whose values a lowering may read are part of an op's identity: integer or bool
#: constants (indices, axes, shapes), and float constants of at most this many elements
_SCALAR_ELEMS = 16


@dataclass
class Subgraph:
    """One outlined op sequence: its ``length`` (ops), the start of each occurrence in the op
    list, and, per occurrence, the ids of its inputs from outside (in order of first use) and of
    the tensors it gives to the rest of the model (``outputs``, relative op position and output
    index, the same for every occurrence)."""

    index: int
    length: int
    starts: list[int]
    inputs: list[list[str]]
    outputs: list[tuple[int, int]]
    value: float
    lowered: object = None               # set by the lowering: (function, input tensors, output tensors)

    @property
    def name(self) -> str:
        return f"subgraph_{self.index}"


@dataclass
class OutlinePlan:
    """The subgraphs of a model, and the subgraph starting at each op position it outlines."""

    subgraphs: list[Subgraph]
    at: dict[int, tuple[Subgraph, int]]     # op position -> (subgraph, occurrence)

    def __bool__(self):
        return bool(self.subgraphs)


def _op_value(op) -> float:
    return HIGH_VALUE if op.op_type in _HIGH_OPS else LOW_VALUE


def _tensor_key(ir, tid: str):
    if not tid:
        return None
    t = ir.tensors[tid]
    info = t.info
    key = (info.data_type(), tuple(info.shape()), t.kind == "Const")    # lowerings may read constants
    if t.kind == "Const" and t.value is not None:
        v = np.asarray(t.value)
        if v.dtype.kind in "biu" or v.size <= _SCALAR_ELEMS:
            key += (hashlib.blake2b(np.ascontiguousarray(v).tobytes(), digest_size=12).hexdigest(),)
    return key


def _op_keys(ir) -> np.ndarray:
    """One integer per op: equal for ops that may stand in for each other (without wiring)."""
    ids: dict = {}
    out = np.empty(len(ir.ops), np.int64)
    for i, op in enumerate(ir.ops):
        attrs = sorted((a, v) for a, v in op.attrs.items() if a != "__node__")    # the node's name
        reader = VALUE_INPUTS.get((op.domain, op.op_type))
        baked = tuple(op.inputs[j] for j in reader(op, ir)) if reader is not None else ()
        # a recomputation op re-runs its forward op's fragment (PopART's implicit recomputation
        # has no op for it): it may stand in for another recomputation op, never for a forward op
        k = (op.domain, op.op_type, op.opset, repr(attrs), baked,
             tuple(_tensor_key(ir, x) for x in op.inputs), tuple(_tensor_key(ir, x) for x in op.outputs),
             op.vgraph, op.pipeline_stage, op.recomputes is not None)
        out[i] = ids.setdefault(k, len(ids))
    return out


def _signature(ir, ops, start: int, length: int, anchored: set):
    """The wiring of ``ops[start:start+length]``: per op, where each input comes from (an output
    of an op of the sequence, or the n-th input from outside); the outside inputs' ids; and the
    (position, output) pairs used after the sequence. ``None`` if the sequence spans virtual
    graphs or pipeline stages."""
    seq = ops[start:start + length]
    if len({(op.vgraph, op.pipeline_stage) for op in seq}) > 1:
        return None
    made: dict[str, tuple[int, int]] = {}
    ext: dict[str, int] = {}
    wiring = []
    for r, op in enumerate(seq):
        refs = []
        for x in op.inputs:
            if not x:
                refs.append(None)
            elif x in made:
                refs.append(("op",) + made[x])
            else:
                refs.append(("in", ext.setdefault(x, len(ext))))
        wiring.append(tuple(refs))
        for m, o in enumerate(op.outputs):
            if o:
                made[o] = (r, m)
    inside = set(id(op) for op in seq)
    used_after = set()
    for o, (r, m) in made.items():
        t = ir.tensors.get(o)
        if o in anchored or (t is not None and any(id(c) not in inside for c in t.consumers)):
            used_after.add((r, m))
    return tuple(wiring), list(ext), used_after


def _candidates(keys: np.ndarray, values: np.ndarray, free: np.ndarray, threshold: float):
    """Repeated sequences of equal op keys among the free ops, best saving first:
    ``(saving, start, length, distance, count)``, occurrences at ``start + j * distance``. A run
    of equal keys at distance ``d`` that is at least ``d`` long repeats with period ``d``; a
    shorter one gives two occurrences."""
    n = keys.size
    csum = np.r_[0.0, np.cumsum(values)]
    out = []
    for d in range(1, n // 2 + 1):
        eq = (keys[:-d] == keys[d:]) & free[:-d] & free[d:]
        if not eq.any():
            continue
        e = np.diff(np.r_[0, eq.astype(np.int8), 0])
        for s, t in zip(np.flatnonzero(e == 1).tolist(), np.flatnonzero(e == -1).tolist()):
            r = t - s
            length, count = min(r, d), (r // d + 1 if r >= d else 2)
            v = csum[s + length] - csum[s]
            if v >= threshold:
                out.append(((count - 1) * v, s, length, d, count))
    out.sort(key=lambda c: (-c[0], -c[2], c[1]))
    return out


def plan(ir, options) -> OutlinePlan:
    """The outline plan of ``ir``'s op list (empty when ``enableOutlining`` is off)."""
    ops = ir.ops
    if not options.enableOutlining or len(ops) < 2:
        return OutlinePlan([], {})
    threshold = float(options.outlineThreshold)
    keys = _op_keys(ir)
    values = np.array([_op_value(op) for op in ops])
    # ops that write a variable in place (weight updates) and the once-per-batch ops after the
    # gradient accumulation loop stay out of subgraphs
    free = np.array([not op.modifies and op.execution_context == "Normal" for op in ops], bool)
    anchored = {ir.anchor_alias.get(a, a) for a in ir.data_flow.anchors()}
    subgraphs: list[Subgraph] = []
    at: dict = {}
    while True:
        found = None
        for _, s, length, d, count in _candidates(keys, values, free, threshold):
            groups: dict = {}
            for p in range(s, s + count * d, d):
                if p + length <= len(ops) and free[p:p + length].all():
                    sig = _signature(ir, ops, p, length, anchored)
                    if sig is not None:
                        groups.setdefault(sig[0], []).append((p, sig))
            best = max(groups.values(), key=len, default=[])
            if len(best) >= 2:
                found = (length, best)
                break
        if found is None:
            return OutlinePlan(subgraphs, at)
        length, occs = found
        used = set().union(*(sig[2] for _, sig in occs))
        p0 = occs[0][0]
        sg = Subgraph(len(subgraphs), length, [p for p, _ in occs], [sig[1] for _, sig in occs],
                      sorted(used), float(values[p0:p0 + length].sum()))
        for j, (p, _) in enumerate(occs):
            free[p:p + length] = False
            at[p] = (sg, j)
        subgraphs.append(sg)
