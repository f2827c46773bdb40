"""Recomputation (PopART's ``RecomputationType`` and ``builder.recomputeOutputInBackwardPass``,
``research/popart.md`` 3.4): forward ops marked *Recompute* get a recomputation op in the backward
pass (``IrOp.recomputes`` names the forward op), just before the first gradient op that reads
their outputs, and the gradient ops read its outputs (``<id>__re``).

Lowering (:mod:`openipu.popart.lowering.program`), as PopART's default implicit recomputation
does it: the forward op is lowered into a program fragment of its own, and the recomputation op
runs that same fragment again. Its compute sets and copies execute twice (the cycles count
twice) but exist once (no new vertex state, vertex code or exchange code); its output tensors are
rewritten, so the forward activations are dead from their last forward use to the recompute
point (the memory plan's def-use segments), and the outputs of an op whose inputs are
recomputed are not kept alive across that gap either (the in-place analysis treats ``<id>__re``
as ``<id>``). In an outlined subgraph the fragment lies in the body shared by every layer: the
layer's inputs are copied in and its results copied out, as a call does. With pipelining the
fragment re-runs in the backward stage: the stage's stashed inputs are restored into the forward
tensors (PopART's ``RestoreInplaceOp``) and the forward fragments run again, so only what crosses
between stages is stashed; where the re-run would overwrite a tensor the pipeline cycle still
copies to another IPU or to the host, the recomputation op is lowered on its own.

Which ops recompute:

- manual: ops annotated ``recomputeOutputInBackwardPass(..., RecomputeType.Recompute)``;
- ``RecomputeAll``: every forward op;
- ``NormOnly``: the normalisation ops;
- ``Standard``: every forward op except the checkpoints PopART's liveness heuristic picks
  (``annotateStandard``, :func:`standard_checkpoints`): the forward schedule of N ops is cut into
  intervals of decreasing length K, K-1, ..., 1 (K = floor(0.75 (floor(sqrt(2N)) - 1))), then
  single ops to the end; in each interval the position where the forward outputs still awaiting a
  forward consumer take the fewest bytes is chosen, and the ops of that live set are checkpoints.
  So the early part of the model (where CNNs hold most activation bytes) is recomputed from a few
  cheap cuts, and the ops near the loss are kept.

- ``Pipeline`` (with ``enablePipelining``): every forward op, within its pipeline stage.

An op annotated ``RecomputeType.Checkpoint`` is never recomputed (its output is kept).

With pipelining, an op whose output another pipeline stage reads is a checkpoint (PopART's rule:
what crosses to another IPU is stashed, not recomputed), so each stage recomputes from its own
inputs. Random ops (Dropout in training, Random*) and ops writing in place are never recomputed.
Mixing automatic and manual recomputation raises PopART's error.
"""

from __future__ import annotations

import math

import numpy as np

from openipu.popart.builder import PIPELINE_ATTR, RECOMPUTE_ATTR, VGRAPH_ATTR
from openipu.popart.errors import popart_exception
from openipu.popart.options import RecomputationType

#: PopART's ``getDecreasingIntervals`` shortens K by this factor (fewer, longer recomputations
#: cost about 1 % more memory for over 10 % fewer cycles on ResNet-50, by its note)
INTERVAL_SCALE = 0.75
NORMS = {"BatchNormalization", "LayerNormalization", "GroupNormalization", "InstanceNormalization", "LpNormalization"}
NEVER = {"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "ShapedDropout"}
RECOMPUTED_SUFFIX = "__re"


def _mode(options) -> str:
    return RecomputationType.member(options.autoRecomputation)


def _annotation(op) -> str | None:
    """The op's ``recomputeOutputInBackwardPass`` value: Recompute, Checkpoint, or None."""
    v = op.annotations.get(RECOMPUTE_ATTR)
    if isinstance(v, bytes):
        v = v.decode()
    return None if v is None else str(v).split(".")[-1]


def _manual(op) -> bool:
    return _annotation(op) == "Recompute"


def marked(ir) -> set:
    """Ids of the forward ops to recompute. Raises ``popart_exception`` for a mix of automatic
    and manual recomputation."""
    mode = _mode(ir.options)
    # an op annotated Checkpoint keeps its output under every mode (PopTorch's recomputationCheckpoint)
    fwd = [op for op in ir.ops if op.grad_of is None and not op.modifies and op.op_type not in NEVER
           and _annotation(op) != "Checkpoint"]
    if ir.options.enablePipelining:     # what another stage reads is a checkpoint
        fwd = [op for op in fwd if all(_stage_key(c) == _stage_key(op) for o in op.outputs if o
                                       for c in ir.tensors[o].consumers if c.grad_of is None)]
    manual = {op.id for op in fwd if _manual(op)}
    if mode == "NoRecompute":
        return manual
    if manual:
        raise popart_exception("A mixture of auto and manual recomputation is not supported")
    if mode == "RecomputeAll":
        return {op.id for op in fwd}
    if mode == "NormOnly":
        return {op.id for op in fwd if op.op_type in NORMS}
    if mode == "Standard":
        keep = standard_checkpoints(ir)
        return {op.id for op in fwd if op.id not in keep}
    if mode == "Pipeline":
        if not ir.options.enablePipelining:
            raise popart_exception("RecomputationType.Pipeline recomputes the forward pipeline stages: it needs "
                                   "enablePipelining (use RecomputeAll without pipelining)")
        return {op.id for op in fwd}
    raise popart_exception(f"Unknown RecomputationType {mode}")


def decreasing_intervals(n: int) -> list[tuple[int, int]]:
    """PopART's intervals for ``Standard`` recomputation over ``n`` forward ops: ``[start, end)``
    of lengths K, K-1, ..., 1 from the start (K = floor(0.75 (floor(sqrt(2n)) - 1))), then one op
    each to the end."""
    if n <= 1:
        return [(0, n)] if n else []
    k = int(INTERVAL_SCALE * (math.isqrt(2 * n) - 1))
    out, a = [], 0
    while k > 0 and a + k <= n:
        out.append((a, a + k))
        a, k = a + k, k - 1
    out.extend((i, i + 1) for i in range(a, n))
    return out


def standard_checkpoints(ir) -> set:
    """Ids of the forward ops ``RecomputationType.Standard`` keeps (PopART's ``annotateStandard``).

    The forward ops are the ops before the first gradient op, in schedule order. An op is *live*
    from its own position until just before its last forward consumer runs (its outputs wait
    for it); the live bytes at a position are the output bytes of the ops live there. In each
    interval of :func:`decreasing_intervals` the position with the fewest live bytes (the first
    of equals) is chosen, and every op live there is a checkpoint. Vectorised over ops (numpy)."""
    first_grad = next((i for i, op in enumerate(ir.ops) if op.grad_of is not None), len(ir.ops))
    ops = ir.ops[:first_grad]
    n = len(ops)
    if n == 0:
        return set()
    at = {id(op): i for i, op in enumerate(ops)}
    mem = np.zeros(n)
    last = np.arange(n)
    for i, op in enumerate(ops):
        for o in op.outputs:
            if not o:
                continue
            t = ir.tensors[o]
            mem[i] += t.info.nbytes()
            uses = [at[id(c)] for c in t.consumers if id(c) in at]
            if uses:
                last[i] = max(last[i], max(uses))
    start = np.arange(n)
    end = np.maximum(start, last - 1)              # live over [start, end]
    delta = np.zeros(n + 1)
    np.add.at(delta, start, mem)
    np.add.at(delta, end + 1, -mem)
    live = np.cumsum(delta)[:n]
    chosen = np.array([a + int(np.argmin(live[a:b])) for a, b in decreasing_intervals(n)], np.int64)
    k = np.searchsorted(chosen, start)              # the first chosen position at or after each op
    hit = (k < chosen.size) & (chosen[np.minimum(k, chosen.size - 1)] <= end)
    return {ops[j].id for j in np.flatnonzero(hit).tolist()}


def _stage_key(op):
    """The op's place as annotated (pipeline stage, virtual graph)."""
    return op.annotations.get(PIPELINE_ATTR), op.annotations.get(VGRAPH_ATTR)


def apply(ir) -> int:
    """Clone the marked forward ops before their first gradient consumer; returns the number of
    clones. Call after autodiff, before the weight updates."""
    ids = marked(ir)
    if not ids:
        return 0
    by_out = {o: op for op in ir.ops if op.id in ids for o in op.outputs if o}
    clones: dict[int, object] = {}       # forward op id -> clone
    before: dict[int, list] = {}         # gradient op id -> clones to insert before it
    n_before = len(ir.ops)

    def clone(op, at: int):
        if op.id in clones:
            return clones[op.id]
        ins = []
        for x in op.inputs:
            src = by_out.get(x)
            ins.append(clone(src, at).outputs[src.outputs.index(x)] if src is not None else x)
        attrs = {k: v for k, v in op.attrs.items() if not k.startswith("__")}
        outs = [(f"{o}{RECOMPUTED_SUFFIX}", ir.tensors[o].info.data_type(), ir.tensors[o].info.shape())
                for o in op.outputs if o]
        c = ir.add_op(op.op_type, ins, outs, attrs, domain=op.domain, opset=op.opset,
                      name=f"{op.name}/recompute", like=op)
        c.grad_of = op         # placed like the op it recomputes, in the backward pass
        c.recomputes = op
        c.annotations.pop(RECOMPUTE_ATTR, None)
        clones[op.id] = c
        before.setdefault(at, []).append(c)
        return c

    for op in list(ir.ops[:n_before]):
        if op.grad_of is None:
            continue
        for k, x in enumerate(op.inputs):
            src = by_out.get(x)
            if src is None:
                continue
            c = clone(src, op.id)
            new = c.outputs[[o for o in src.outputs if o].index(x)]
            ir.tensors[x].consumers.remove(op)
            ir.tensors[new].consumers.append(op)
            op.inputs[k] = new
    made = set(id(c) for c in clones.values())
    order = []
    for op in ir.ops[:n_before]:
        order.extend(before.get(op.id, []))
        order.append(op)
    order.extend(op for op in ir.ops[n_before:] if id(op) not in made)
    ir.ops = order
    for i, op in enumerate(ir.ops):
        op.id = i
    return len(clones)
