"""How the IR executor (:mod:`openipu.popart.execute`) plans a session's steps once per executable:
which ops run on one host thread (:func:`runs_serially`, :func:`load_adaptive`, :func:`host_busy`),
which Transposes stay views
(:func:`transpose_views`), which convolution gradients pair into one call
(:func:`conv_grad_pairs`), and when each intermediate tensor is dropped (:func:`with_releases`).
Host planning only: none of it changes an output or a prediction."""

from __future__ import annotations

import os

from openipu.poplibs.poplin.kernels import HOST_SERIAL_WORK

#: Ops whose IPU lowering accumulates half inputs in partial sums (poplin matMul / convolution):
#: the executor computes them in float32 and rounds the result to the output's type once, instead
#: of torch's slow CPU float16 kernels (two orders of magnitude slower at BERT-base sizes). With
#: float partials (PopLibs' default) that is what the IPU computes, up to fp32 rounding. With half
#: partials (``partialsType`` half, PopRT's default) the IPU rounds each partial sum to half:
#: MatMul / Gemm then take :mod:`openipu.popart.half_partials`; the convolutions still round once
#: (the more precise result, within the half plan's precision of the verifying mode's).
FLOAT_PARTIALS = {("", "MatMul"), ("", "Gemm"), ("", "Conv"), ("", "ConvTranspose"),
                   ("ai.graphcore", "ConvDataGrad"), ("ai.graphcore", "ConvWeightsGrad")}

#: Ops whose kernels return new tensors (never a view of an input): the roots of the aliasing
#: chains (see :func:`transpose_views`). Every other op's output may be a view of its inputs.
FRESH = {("", t) for t in ("MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Softmax", "Gelu", "Tanh", "Erf")} | \
    {("ai.graphcore", t) for t in ("GroupNormalization", "Gelu", "GeluErf")}
#: Ops that read an input without aliasing it in their outputs (a matmul; an update op reads the
#: gradient it is given and writes only its ``modifies`` inputs)
PLAIN_READERS = {("", "MatMul"), ("", "Gemm")}

#: Ops other than matmuls and convolutions with fewer elements than this (inputs and outputs
#: together) run on one host thread: torch opens an OpenMP region for some small kernels (a 2 x 2
#: ``softmax``: 1.2 us on one thread, 0.3-3 ms on two threads of a loaded 2-core host, measured
#: 2026-11-29), and elementwise work of this size gains little from a second thread. Host
#: threading only: the kernels and their results are the same.
HOST_SERIAL_ELEMENTS = 1 << 18

#: Matmuls and convolutions with fewer multiply-accumulates than this run on one host thread; the
#: larger ones on torch's threads. The same as poplin's :data:`HOST_SERIAL_WORK` (2^26). PyTorch
#: eager runs every convolution on both threads of this 2-core host (its ResNet-18 b4 step, idle:
#: 0.059 s wall for 0.119 s CPU), but on a host whose cores are busy each parallel region waits for
#: its second thread: with 2^24 (ResNet-18's 3 x 3 convolutions, 38 M, on two threads) the
#: benchmark's ResNet-18 step took 2.1-2.9 s against 0.39-0.91 s with 2^26 at load 3-6
#: (2026-11-29, docs/host-speed.md); at load 1 it took 0.075-0.079 s with 2^24, 0.115-0.117 s
#: with 2^26. Lower it on an idle host. Depends on the shapes only, so results do not depend on
#: the load.
HOST_PARALLEL_WORK = HOST_SERIAL_WORK

#: Convolutions (forward and gradients) from this many multiply-accumulates up to
#: :data:`HOST_PARALLEL_WORK` follow the host's load (:func:`load_adaptive`): on torch's threads
#: while the host has a core to spare (:func:`host_busy`), on one thread when it has not. Only
#: those whose results are bitwise the same on one thread and on torch's threads (the executor
#: checks each geometry once, :meth:`openipu.popart.execute.IrExecutor._probe_threads`), so the
#: outputs never depend on the load. ResNet-18 b4 3 x 64 x 64 (its 3 x 3 and 7 x 7 convolutions,
#: 19-38 M each) on this 2-core host: 2026-11-30, docs/host-speed.md.
HOST_ADAPTIVE_WORK = 1 << 24

#: The host counts as busy when its 1-minute load average reaches its logical CPUs plus this:
#: this process's own threads (one running, one in an OpenMP region) keep the load near 2 on an
#: otherwise idle 2-core host; another runnable process lifts it past the margin.
HOST_BUSY_MARGIN = 0.5

#: The convolutions whose host threading may follow the load (:func:`load_adaptive`)
CONVOLUTIONS = {("", "Conv"), ("ai.graphcore", "ConvDataGrad"), ("ai.graphcore", "ConvWeightsGrad")}


def numel(ir, tid) -> int:
    t = ir.tensors.get(tid) if tid else None
    if t is None:
        return 0
    n = 1
    for d in t.info.shape():
        n *= int(d)
    return n


def host_work(ir, op) -> tuple[int, bool]:
    """(work, is_contraction) of one IR op from its static shapes: multiply-accumulates for a
    matmul or convolution (an estimate within a small factor for the convolution gradients),
    else the elements it reads and writes."""
    key = (op.domain, op.op_type)
    shape = {x: list(ir.tensors[x].info.shape()) for x in [*op.inputs, *op.outputs] if x and x in ir.tensors}
    if key not in FLOAT_PARTIALS:
        return sum(numel(ir, x) for x in [*op.inputs, *op.outputs]), False
    out = op.outputs[0] if op.outputs else None
    if key in (("", "MatMul"), ("", "Gemm")):
        a = shape.get(op.inputs[0], [1])
        trans = key == ("", "Gemm") and int(op.attrs.get("transA", 0))
        k = (a[0] if trans else a[-1]) if a else 1
        return numel(ir, out) * max(1, int(k)), True
    # convolutions: the largest activation times the weight's elements per output channel
    w = op.outputs[0] if key == ("ai.graphcore", "ConvWeightsGrad") else (op.inputs[1] if len(op.inputs) > 1 else None)
    ws = shape.get(w, [1, 1])
    per = numel(ir, w) // max(1, max(ws[:2]) if len(ws) >= 2 else 1)
    act = max([numel(ir, x) for x in [*op.inputs, *op.outputs] if x != w] or [1])
    return act * max(1, per), True


def runs_serially(ir, op) -> bool:
    """Whether the executor runs ``op`` on one host thread (:data:`HOST_SERIAL_ELEMENTS`,
    :data:`HOST_PARALLEL_WORK` for matmuls and convolutions)."""
    try:
        work, contraction = host_work(ir, op)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError):
        return False
    return work < (HOST_PARALLEL_WORK if contraction else HOST_SERIAL_ELEMENTS)


def load_adaptive(ir, op) -> bool:
    """Whether ``op`` is a float32 convolution (Conv, ConvDataGrad, ConvWeightsGrad) of
    :data:`HOST_ADAPTIVE_WORK` to :data:`HOST_PARALLEL_WORK` multiply-accumulates: one whose host
    threads may follow the load, if its results do not depend on them (the executor's check)."""
    if (op.domain, op.op_type) not in CONVOLUTIONS:
        return False
    try:
        if not all(ir.tensors[x].info.data_type() == "FLOAT" for x in [*op.inputs, *op.outputs] if x):
            return False
        work, _ = host_work(ir, op)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError):
        return False
    return HOST_ADAPTIVE_WORK <= work < HOST_PARALLEL_WORK


def host_busy() -> bool:
    """Whether the host has no core to spare for a second torch thread: its 1-minute load average
    (``os.getloadavg``) is at least its logical CPUs (``os.cpu_count``) plus
    :data:`HOST_BUSY_MARGIN`. True where the load average is not available (one thread, as for
    any op under the thresholds). Read once per step: a host threading choice only."""
    try:
        return os.getloadavg()[0] >= (os.cpu_count() or 1) + HOST_BUSY_MARGIN
    except (OSError, AttributeError):
        return True


def transpose_views(ir, keep: set) -> set:
    """The indices (in ``ir.ops``) of the Transpose ops whose output the executor may leave as a
    view of the input (``permute`` without the copy, as PyTorch eager's transposes feeding
    matmuls are). A view reads the same values as the copy as long as nothing writes its data
    between the transpose and the view's last reader:

    - the output is not anchored (``keep``), no op writes it in place, and its readers are
      MatMul / Gemm, update ops that do not write it, or Transposes (the readers of a Transpose
      left as a view count as the first one's readers);
    - no op writes a root of the input (the tensors it may alias: through every op not known to
      return new tensors, :data:`FRESH`, back to variables, constants, stream inputs or fresh
      outputs) after the transpose and up to its last reader, in the same fragment (the weight
      update ops follow the backward pass, so a weight's transposes read before its update)."""
    from openipu.popart.ir import OUTER_FRAGMENT
    index = {id(op): i for i, op in enumerate(ir.ops)}
    outer = [op.execution_context == OUTER_FRAGMENT for op in ir.ops]
    roots: dict[str, frozenset] = {}

    def root_of(t: str) -> frozenset:
        if t not in roots:
            roots[t] = frozenset([t])           # (a cycle cannot happen; a guard all the same)
            prod = ir.tensors[t].producer if t in ir.tensors else None
            if prod is not None and (prod.domain, prod.op_type) not in FRESH:
                roots[t] = frozenset().union(*[root_of(x) for x in prod.inputs if x]) or frozenset([t])
        return roots[t]

    written: dict[str, list[int]] = {}
    for i, op in enumerate(ir.ops):
        targets = list(op.modifies)
        if op.op_type in ("ReplicatedAllReduceInplace", "GetRandomSeed") and op.inputs:
            targets.append(op.inputs[0])
        for t in targets:
            if t:
                written.setdefault(t, []).append(i)
    writers: dict[str, list[int]] = {}
    for t, idx in written.items():
        for r in root_of(t):
            writers.setdefault(r, []).extend(idx)
    views: set = set()
    last_read: dict[int, int] = {}
    for i in reversed(range(len(ir.ops))):
        op = ir.ops[i]
        if (op.domain, op.op_type) != ("", "Transpose") or len(op.inputs) != 1 or len(op.outputs) != 1:
            continue
        x, y = op.inputs[0], op.outputs[0]
        ty = ir.tensors.get(y)
        if ty is None or x not in ir.tensors or y in keep or y in written or not ty.consumers:
            continue
        last, ok = i, True
        for c in ty.consumers:
            j = index.get(id(c))
            if j is None or outer[j] != outer[i]:
                ok = False
            elif (c.domain, c.op_type) == ("", "Transpose"):
                last = max(last, last_read[j] if j in views else j)
            elif (c.domain, c.op_type) in PLAIN_READERS or (c.modifies and y not in c.modifies):
                last = max(last, j)
            else:
                ok = False
        if ok and not any(i < w <= last and outer[w] == outer[i] for r in root_of(x) for w in writers.get(r, [])):
            views.add(i)
            last_read[i] = last
    return views


def conv_grad_pairs(ir) -> dict:
    """Index in ``ir.ops`` of a ConvDataGrad / ConvWeightsGrad -> index of the other gradient of
    the same float32 convolution (same output gradient and attributes), when the executor may
    compute both in one ``convolution_backward`` call at the first of the two (as autograd's
    convolution backward does; the results equal the separate calls'): the second's inputs are
    produced before the first, both run in the same fragment and no op from the first to the
    second writes a tensor in place."""
    index = {id(op): i for i, op in enumerate(ir.ops)}
    kinds = {"ConvDataGrad": 0, "ConvWeightsGrad": 1}
    skip = ("__node__", "input_shape", "weights_shape")

    def float32(t):
        return bool(t) and t in ir.tensors and ir.tensors[t].info.data_type() == "FLOAT"

    def shape(t):
        return [int(d) for d in ir.tensors[t].info.shape()]

    pairs: dict = {}
    for i, op in enumerate(ir.ops):
        if op.domain != "ai.graphcore" or op.op_type not in kinds or i in pairs or len(op.inputs) != 2 or \
                len(op.outputs) != 1 or not all(float32(t) for t in [*op.inputs, *op.outputs]):
            continue
        for c in ir.tensors[op.inputs[0]].consumers:
            j = index.get(id(c))
            if j is None or j <= i or j in pairs or c.domain != "ai.graphcore" or \
                    kinds.get(c.op_type, kinds[op.op_type]) == kinds[op.op_type] or len(c.inputs) != 2 or \
                    len(c.outputs) != 1 or c.inputs[0] != op.inputs[0] or \
                    not all(float32(t) for t in [*c.inputs, *c.outputs]):
                continue
            data, weights = (op, c) if op.op_type == "ConvDataGrad" else (c, op)
            if {k: v for k, v in data.attrs.items() if k not in skip} != \
                    {k: v for k, v in weights.attrs.items() if k not in skip} or \
                    list(data.attrs.get("input_shape", [])) != shape(weights.inputs[1]) or \
                    list(weights.attrs.get("weights_shape", [])) != shape(data.inputs[1]):
                continue
            producer = ir.tensors[c.inputs[1]].producer
            if (producer is not None and index.get(id(producer), i) >= i) or \
                    c.execution_context != op.execution_context or \
                    any(ir.ops[k].modifies or ir.ops[k].op_type in ("ReplicatedAllReduceInplace", "GetRandomSeed")
                        for k in range(i, j + 1)):
                continue
            pairs[i], pairs[j] = j, i
            break
    return {i: j for i, j in pairs.items() if i < j}


def last_uses(io: list, keep: set) -> dict:
    """Tensor id -> index of the last of ``io`` (``(inputs, outputs)`` per op, in order) that reads
    or writes it, for the ids outside ``keep``."""
    last: dict = {}
    for i, (ins, outs) in enumerate(io):
        for x in list(ins) + list(outs):
            if x and x not in keep:
                last[x] = i
    return last


def with_releases(steps: list, keep: set) -> list:
    """``steps`` with an 8th field each: the ids of the tensors whose last reader (or, unread, whose
    producer) is that step, outside ``keep``. The executor drops them from the replica's
    environment after the step, so a step holds its live tensors only (the IR's liveness), not
    every activation of the batch."""
    dead: list = [[] for _ in steps]
    for x, i in last_uses([(st[4], st[5]) for st in steps], keep).items():
        dead[i].append(x)
    return [(*st, tuple(d)) for st, d in zip(steps, dead)]
