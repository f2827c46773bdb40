"""Session programs of an inference session (PopART's ``IrLowering`` for the implicit IR).

Engine programs:

0. the step: ``Repeat(batchesPerStep)`` around the host -> device input copies, the model and
   the per-batch anchor work; then the FINAL / SUM anchor copies. Anchors by return type:

   - ALL: copied to the host every batch (inside the repeated body);
   - EVERYN(N): copied after every N-th batch: the loop is cut into segments
     ``Repeat(gap, body)`` ending at each multiple of a return period (one segment of N batches
     repeated ``bps / N`` times when all EVERYN anchors share N); with gradient accumulation,
     every micro-batch of those batches (pipelined: in the stage that makes the anchor; a
     pipeline without accumulation does not support EVERYN yet);
   - FINAL: copied once after the loop (the device tensor then holds the last batch);
   - SUM: an accumulator zeroed before the loop, ``acc += t`` each batch (``popops.add``), copied
     after the loop.
1. weightsFromHost: host -> device copies of every variable (``constantWeights=False``, and the
   weights and optimizer state of a training session);
2. weightsToHost: device -> host copies of every variable;
3. optimizerFromHost: host -> device copies of the non-const optimizer scalars (training);
4. randomSeedFromHost: host -> device copy of the random seed (``setRandomSeed``).

``SessionOptions.syntheticDataMode`` other than Off: inputs get no host stream and are filled on
the device every batch (zeros or random numbers, :func:`_synthetic_fill`), and anchors are not
copied to the host (their arrays keep what they held), as in PopART: the prediction then has no
host I/O for them.

Stream handles: ``h2d:<id>`` inputs and weights in, ``d2h:<id>`` anchors, ``d2h:weight/<id>`` weights
out. Inputs and
anchors with no elements get no stream (their handle is ``None``): there is nothing to transfer.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplibs import popops, poprand, poputil
from openipu.poplibs.popops._common import tile_counts_of
from openipu.popart import outline
from openipu.popart.dataflow import AnchorReturnTypeId
from openipu.popart.errors import popart_exception
from openipu.popart.ir import OUTER_FRAGMENT, shard_rows
from openipu.popart.lowering import precise_lowering
from openipu.popart.lowering.context import LoweringContext, variables_of
from openipu.popart.lowering.creators import updater_clone, weight_creator
from openipu.popart.lowering.generic import lower_generic
from openipu.popart.lowering.pipeline import Pipeline

#: Tile cycles to zero a SUM accumulator's elements on one tile (popops::Fill-like). [A] 20 fixed
#: plus one 64-bit store per vector.
ZERO_VERTEX_OVERHEAD_CYCLES = 20


class Lowered:
    """The result of lowering: ``graph``, ``programs`` [step, weightsFromHost, weightsToHost],
    and the stream handles by IR tensor id."""

    def __init__(self):
        self.graph = None
        self.programs = []
        self.inputs: dict[str, str] = {}       # IR input id -> stream handle
        self.anchors: dict[str, str] = {}      # anchor id -> stream handle
        self.weights_in: dict[str, str] = {}
        self.weights_out: dict[str, str] = {}
        self.optimizer_in: dict[str, str] = {}   # non-const optimizer scalars (training)
        self.seed_in: dict[str, str] = {}        # the random seed (setRandomSeed)
        self.kinds: dict[int, str] = {}        # op id -> "precise" | "generic"
        self.in_place: dict[int, int] = {}     # op id -> the input its output overwrites (InPlace)


def _zero_kernel(t, ctx):
    ctx.write(t, torch.zeros((ctx.replicas,) + tuple(t.shape()), dtype=t.elementType().torch_dtype))


def _zero(graph, t, prog, name):
    used, counts = tile_counts_of(graph, t)
    vw = graph.getTarget().getVectorWidth(t.elementType())
    cycles = ZERO_VERTEX_OVERHEAD_CYCLES + np.ceil(counts / vw)
    cs = graph.addComputeSet(f"{name}/zero")
    graph.add_vertex_group(cs, VertexGroup(f"popops::Fill<{t.elementType()}>", used, cycles,
                                           functools.partial(_zero_kernel, t), writes=[Access(t)], multi=True))
    prog.add(P.Execute(cs))


def _make_later(g, ptype, make, value):
    """A deferred accumulator: made by ``make(g, ptype)``, with its initial value."""
    dev = make(g, ptype)
    g.setInitialValue(dev, value)
    return dev


def _lower_op(ctx, op, pos: int, out: Lowered) -> None:
    ctx.pos = pos           # the op's place in the schedule (in-place ops look at later uses)
    src = op.recomputes
    if src is not None and id(src) in ctx.fragments and _can_rerun(ctx, op, src):
        _rerun_fragment(ctx, op, src, out)
        return
    fn = precise_lowering(op, ctx.ir)
    kind = "precise" if fn is not None else "generic"
    keep = id(op) in ctx.recomputed
    if keep:                # grown in a fragment of its own, which the backward pass runs again
        prog, ctx.prog = ctx.prog, P.Sequence(name=f"{op.name}/fragment")
        ctx.fragment_parent = prog
    try:
        outs = fn(ctx, op) if fn is not None else lower_generic(ctx, op)
    finally:
        if keep:
            frag, ctx.prog, ctx.fragment_parent = ctx.prog, prog, None
            prog.add(frag)
    if keep:
        vg = ctx.vgraph_of(op)
        ctx.fragments[id(op)] = (frag, [ctx.get(x, vg) if x else None for x in op.inputs], list(outs),
                                 ctx.in_body)
    op.lowering = kind
    out.kinds[op.id] = kind
    for o, t in zip(op.outputs, outs):
        if o and t is not None:
            ctx.set(o, ctx.vgraph_of(op), t)


def _rerun_fragment(ctx, op, src, out: Lowered) -> None:
    """Recomputation op ``op`` (``src`` recomputed in the backward pass): the program fragment
    ``src`` was lowered into runs again, as PopART's implicit recomputation re-runs an Opx's
    fragment: the same compute sets and copies execute a second time (their cycles count again;
    their vertex state, vertex code and exchange code exist once) and rewrite ``src``'s output
    tensors, which ``op``'s outputs then are. An input held elsewhere than where the fragment
    reads it (the fragment lies in an outlined subgraph's body: this layer's tensors, not the
    body's) is copied there first, as a call copies its inputs in."""
    frag, ins, outs, in_body = ctx.fragments[id(src)]
    vg = ctx.vgraph_of(op)
    g = ctx.graph_of(vg)
    for x, t in zip(op.inputs, ins):
        if x and t is not None:
            now = ctx.get(x, vg)
            if now is not t and not now.same_view(t):
                ctx.prog.add(P.Copy(now, t, debugContext=f"{op.name}/in({x})"))
    ctx.prog.add(frag)
    for o, t in zip(op.outputs, outs):
        if o and t is not None:
            if in_body:
                # the body's tensors serve every layer: this layer's result is copied out, as a
                # call copies its outputs out
                dst = g.clone(t, o)
                ctx.prog.add(P.Copy(t, dst, debugContext=f"{op.name}/out({o})"))
                t = dst
            ctx.set(o, vg, t)
    op.lowering = src.lowering
    out.kinds[op.id] = src.lowering


def _can_rerun(ctx, op, src) -> bool:
    """Whether recomputation op ``op`` may re-run ``src``'s fragment. Always without pipelining.
    Pipelined, the fragment re-runs in the backward stage, on a later micro-batch than the forward
    stage that ran it earlier in the same pipeline cycle: the tensors it rewrites (its outputs,
    and its inputs, into which the stashed values are restored, as PopART's ``RestoreInplaceOp``
    does) must hold nothing that the cycle still reads after the stage bodies: no tensor copied to
    another IPU or to the host at the end of the cycle, no stash written in a later stage. Re-run
    in its own stage (the last forward stage), the fragment rewrites the same values. Otherwise
    ``op`` is lowered on its own (new compute sets)."""
    pipe = ctx.pipeline
    if pipe is None or src.pipeline_stage == op.pipeline_stage:
        return True
    frag, ins, outs, _ = ctx.fragments[id(src)]
    written = set().union(*(variables_of(t) for t in [*ins, *outs] if t is not None))
    return not (written & pipe.read_after_bodies(op.pipeline_stage))


def _call_subgraph(ctx, ops, sg, j: int, out: Lowered, progress) -> None:
    """Occurrence ``j`` of the outlined sequence ``sg``: copy its inputs into the subgraph's, call
    the subgraph's function, copy its outputs out (PopART's ``CallOp``, copies on enter and
    exit). The subgraph is lowered at its first call, from that occurrence's ops, with its inputs
    as clones (same tile mapping) of that call's tensors."""
    start = sg.starts[j]
    seq = ops[start:start + sg.length]
    vg = ctx.vgraph_of(seq[0])
    g = ctx.graph_of(vg)
    ext = sg.inputs[j]
    if sg.lowered is None:
        callers = [ctx.get(x, vg) for x in ext]
        ins = [g.clone(t, f"{sg.name}/input{k}") for k, t in enumerate(callers)]
        prog, ctx.prog = ctx.prog, P.Sequence(name=sg.name)
        try:
            with ctx.bound(ext, ins, vg):
                # what a call gives to the rest of the model (in any occurrence) keeps its value
                ctx.pinned |= {seq[r].outputs[m] for r, m in sg.outputs}
                ctx.in_body = True
                for r, op in enumerate(seq):
                    _lower_op(ctx, op, start + r, out)
                outs = [ctx.get(seq[r].outputs[m], vg) for r, m in sg.outputs]
            body = ctx.prog
        finally:
            ctx.prog, ctx.in_body = prog, False
        # an input that the next call takes from this call's output (a layer's output feeding the
        # next layer) is laid out like that output, so that copies between calls stay on-tile
        if len(sg.starts) > 1:
            made = {seq[r].outputs[m]: k for k, (r, m) in enumerate(sg.outputs)}
            for x, nxt, t in zip(ext, sg.inputs[1], ins):
                k = made.get(nxt)
                if k is not None and outs[k].shape() == t.shape() and not outs[k].containsAliases():
                    g.copy_tile_mapping(t, outs[k])
        # the outputs hold nothing from one call to the next: WriteUndef at the start of the body
        # lets the memory plan free them between calls (an output over an input is left alone)
        held = set().union(*(variables_of(t) for t in ins)) if ins else set()
        undef = [P.WriteUndef(t) for t in outs if not (variables_of(t) & held)]
        sg.lowered = (g.addFunction(P.Sequence([*undef, body], name=sg.name)), ins, outs)
    fn, ins, outs = sg.lowered
    name = f"{sg.name}/call{j}"
    for x, t in zip(ext, ins):
        ctx.prog.add(P.Copy(ctx.get(x, vg), t, debugContext=f"{name}/in({x})"))
    ctx.prog.add(P.Call(fn, debugContext=name))
    for (r, m), t in zip(sg.outputs, outs):
        tid = seq[r].outputs[m]
        dst = g.clone(t, tid)
        ctx.prog.add(P.Copy(t, dst, debugContext=f"{name}/out({tid})"))
        ctx.set(tid, vg, dst)
    first = ops[sg.starts[0]:sg.starts[0] + sg.length]
    for op, op0 in zip(seq, first):
        if id(op0) in ctx.fragments:    # every occurrence re-runs the body's fragment of its op
            ctx.fragments[id(op)] = ctx.fragments[id(op0)][:3] + (True,)
        op.lowering = op0.lowering
        out.kinds[op.id] = op0.lowering
        if progress:
            progress()


def _place(ctx, op, main, outer) -> None:
    """Point the context at the program ``op`` is lowered into: its pipeline stage's, the outer
    fragment's or the model's."""
    if op.execution_context == OUTER_FRAGMENT:
        ctx.prog, ctx.stage = outer, None
    elif ctx.pipeline is not None:
        ctx.stage = op.pipeline_stage if op.pipeline_stage is not None else 0
        ctx.prog = ctx.pipeline.body[ctx.stage]
    else:
        ctx.prog, ctx.stage = main, None


def _synthetic_fill(g, dev, mode: str, tid: str) -> P.Sequence:
    """The device program that fills input ``dev`` under ``SessionOptions.syntheticDataMode``
    (PopART's ``SyntheticDataMode``): Zeros: all zero; RandomNormal: ~N(0, 1); RandomUniform:
    uniform over [-1, 1) ([A]: PopART documents no range). Integer inputs take the float values
    cast to their type (as PopART's synthetic test casts normal data). Costs compute on the
    input's tiles, no host exchange. Raises ``popart_exception`` for an unknown mode."""
    prog = P.Sequence(name=f"synthetic({tid})")
    if mode == "Zeros":
        popops.zero(g, dev, prog, f"{tid}/synthetic")
        return prog
    if mode not in ("RandomNormal", "RandomUniform"):
        raise popart_exception(f"Unknown SyntheticDataMode '{mode}': use Off, Zeros, RandomNormal or RandomUniform")
    et = dev.elementType()
    gtype = et if et in (poplar.FLOAT, poplar.HALF) else poplar.FLOAT
    if mode == "RandomNormal":
        r = poprand.normal(g, None, 0, dev, gtype, 0.0, 1.0, prog, f"{tid}/synthetic")
    else:
        r = poprand.uniform(g, None, 0, dev, gtype, -1.0, 1.0, prog, f"{tid}/synthetic")
    if gtype != et:
        r = popops.cast(g, r, et, prog, f"{tid}/synthetic/cast")
    prog.add(P.Copy(r, dev))
    return prog


def _everyn_marks(everyn: dict) -> tuple[int, list]:
    """The batches of one return period that copy EVERYN anchors out: ``(period, [(gap, due)])``,
    where ``period`` is the lcm of the return periods N (in batches), ``gap`` the batches since the
    previous mark (this one included) and ``due`` the ``everyn`` values (anchor copies) whose N
    divides the mark, in ``everyn``'s order."""
    period = math.lcm(*everyn)
    marks, prev = [], 0
    for m in sorted({m for n in everyn for m in range(n, period + 1, n)}):
        marks.append((m - prev, [copies for n, copies in everyn.items() if m % n == 0]))
        prev = m
    return period, marks


def _anchor_stage(pipe, tid: str) -> int:
    """The stage whose cycle copies anchor ``tid``: the one making it, else the last."""
    s = pipe.stage_of(tid)
    return s if s is not None else pipe.num - 1


def _value_only(ir, tid: str) -> bool:
    """Whether every op reading constant ``tid`` builds its value into the program
    (:func:`outline.register_value_inputs`), so that no op reads it as a device tensor."""
    t = ir.tensors[tid]
    if not t.consumers or tid in {ir.anchor_alias.get(a, a) for a in ir.data_flow.anchors()}:
        return False
    for op in t.consumers:
        reader = outline.VALUE_INPUTS.get((op.domain, op.op_type))
        baked = reader(op, ir) if reader is not None else ()
        if any(x == tid and i not in baked for i, x in enumerate(op.inputs)):
            return False
    return True


def _linear_constant(g, ptype, shape, value, tid):
    dev = g.addConstant(ptype, shape, np.asarray(value), tid)
    poputil.mapTensorLinearly(g, dev)
    return dev


def build(ir, target, options, progress=None, patterns=None) -> Lowered:
    """Lower ``ir`` for ``target`` (a poplar Target). ``progress()`` is called once per op;
    ``patterns`` (``popart.Patterns``) turns in-place ops off when its ``InPlace`` is False.

    Raises ``popart_exception`` ("Is there a poplar type for DOUBLE?") for types the IPU lacks.
    """
    out = Lowered()
    repl = options.replication_factor()
    graph = poplar.Graph(target, replication_factor=repl) if repl > 1 else poplar.Graph(target)
    out.graph = graph
    nvg = ir.num_vgraphs
    if nvg > 1:
        tpi = graph.getTarget().getTilesPerIPU()
        vgraphs = [graph.createVirtualGraph(i * tpi, (i + 1) * tpi) for i in range(nvg)]
    else:
        vgraphs = [graph]
    ctx = LoweringContext(ir, graph, vgraphs, options, patterns)
    pipe = ctx.pipeline = Pipeline(ctx) if ir.num_stages else None
    used_ids = set(ir.used) | {x for op in ir.ops for x in op.inputs if x}
    input_copies = []
    synthetic = str(options.syntheticDataMode).split(".")[-1]

    # inputs, constants, variables
    for tid, t in ir.tensors.items():
        if tid not in used_ids or t.producer is not None:
            continue
        vg = ir.home_vgraph(tid)
        g = ctx.graph_of(vg)
        ptype = ctx.ptype(tid)
        shape = t.info.shape()
        if t.kind == "Stream":
            dev = g.addVariable(ptype, shape, tid)
            poputil.mapTensorLinearly(g, dev)
            if t.info.nelms() == 0:
                out.inputs[tid] = None      # an empty input: no stream, nothing to copy
                ctx.set(tid, vg, dev)
                continue
            if synthetic != "Off":
                # synthetic data: no stream; the input is filled on the device every batch
                copy = _synthetic_fill(g, dev, synthetic, tid)
                out.inputs[tid] = None
            else:
                h = f"h2d:{tid}"
                s = graph.addHostToDeviceFIFO(h, ptype, t.info.nelms())
                copy = P.Copy(s, dev, debugContext=f"fromHost({tid})")
                out.inputs[tid] = h
            pipe.to_device[pipe.stage_of(tid)].add(copy) if pipe else input_copies.append(copy)
        elif t.kind == "Const":
            create = weight_creator(ctx, tid, vg)
            if create is None and _value_only(ir, tid):
                # every consumer builds the value into its program (PopRT's fp8 weights): the
                # constant in its ONNX type is made only if something else reads it
                ctx.defer(tid, vg, functools.partial(_linear_constant, g, ptype, shape, t.value, tid), unread_ok=True)
                continue
            if create is not None:      # created in its consumer's layout
                dev = create(g, ptype, np.asarray(t.value))
                ctx.created.add(tid)
            else:
                dev = g.addConstant(ptype, shape, np.asarray(t.value), tid)
                poputil.mapTensorLinearly(g, dev)
        else:  # Variable
            sharded = tid in ir.sharded_state     # one piece per replica (replicated tensor sharding)
            value = shard_rows(t.value, ir.sharded_state[tid][1])[0] if sharded else np.asarray(t.value)
            later = None if sharded else updater_clone(ctx, tid, vg)
            if later is not None:                 # an accumulator: made from its gradient, when lowered
                ctx.defer(tid, vg, functools.partial(_make_later, g, ptype, later, value))
                dev = None
            else:
                create = weight_creator(ctx, tid, vg)
                if create is not None:
                    dev = create(g, ptype, None)
                    ctx.created.add(tid)
                else:
                    dev = g.addVariable(ptype, shape, tid)
                    poputil.mapTensorLinearly(g, dev)
                g.setInitialValue(dev, value)
            hi, ho = f"h2d:{tid}", f"d2h:weight/{tid}"     # an anchored weight keeps d2h:<id>
            # sharded, or replica-grouped (popart.VariableSettings): each replica its own value
            grouped = tid in ir.variable_settings and \
                ir.variable_settings[tid].getGroupCount(options.getGlobalReplicationFactor()) > 1
            graph.addHostToDeviceFIFO(hi, ptype, t.info.nelms(), "REPLICATE" if sharded or grouped else "BROADCAST")
            if tid in ir.optimizer_tensors:     # a non-const optimizer scalar: optimizerFromHost only
                out.optimizer_in[tid] = hi
            elif tid == ir.random_seed:         # the random seed: randomSeedFromHost only
                out.seed_in[tid] = hi
            else:
                out.weights_in[tid] = hi
                out.weights_out[tid] = ho
                graph.addDeviceToHostFIFO(ho, ptype, t.info.nelms())
        if dev is not None:
            ctx.set(tid, vg, dev)

    # the model; outlined op sequences (SubgraphOutline) are called
    plan = outline.plan(ir, options)
    ctx.fix_current()
    main, outer = ctx.prog, P.Sequence(name="accumulateOuterFragment")
    i = 0
    while i < len(ir.ops):
        _place(ctx, ir.ops[i], main, outer)
        if i in plan.at:
            sg, j = plan.at[i]
            _call_subgraph(ctx, ir.ops, sg, j, out, progress)
            i += sg.length
            continue
        _lower_op(ctx, ir.ops[i], i, out)
        if progress:
            progress()
        i += 1

    ctx.make_deferred()         # accumulators no op read (none in practice)

    # anchors
    df = ir.data_flow
    bps = df.batchesPerStep()
    ctx.prog, ctx.stage = main, None
    body = P.Sequence([*input_copies, main], name="step")
    pre, post = P.Sequence(), P.Sequence()
    everyn: dict[int, list] = {}
    for a in df.anchors():
        art = df.art(a)
        src = ir.anchor_alias.get(a, a)
        vg = ctx.home_vgraph(src, ir.home_vgraph(src))
        t = ctx.get(src, vg)
        if t.numElements() == 0 or synthetic != "Off":
            out.anchors[a] = None           # an empty anchor, or synthetic data: no stream, nothing to copy
            continue
        h = f"d2h:{a}"
        s = graph.addDeviceToHostFIFO(h, t.elementType(), t.numElements())
        out.anchors[a] = h
        kind = art.id()
        # pipelined: copied (or summed) in the stage that makes it
        every = pipe.to_host[_anchor_stage(pipe, src)] if pipe else body
        if kind == AnchorReturnTypeId.All:
            every.add(P.Copy(t, s, debugContext=f"anchor({a})"))
        elif kind == AnchorReturnTypeId.Final:
            post.add(P.Copy(t, s, debugContext=f"anchor({a})"))
        elif kind == AnchorReturnTypeId.Sum:
            g = ctx.graph_of(vg)
            acc = g.addVariable(t.elementType(), t.shape(), f"{a}/sum")
            g.copy_tile_mapping(acc, t) if g.is_mapped(t) else poputil.mapTensorLinearly(g, acc)
            _zero(g, acc, pre, f"{a}/sum")
            acc_prog = P.Sequence()
            tot = popops.add(g, acc, t, acc_prog, f"{a}/sum/add")
            acc_prog.add(P.Copy(tot, acc))
            every.add(acc_prog)
            post.add(P.Copy(acc, s, debugContext=f"anchor({a})"))
        elif pipe:
            if not (ir.training is not None and options.accumulation_factor() > 1):
                raise popart_exception(f"openipu does not support AnchorReturnType EveryN with pipelining without "
                                       f"gradient accumulation yet (anchor '{a}'): use All, Sum or Final, or "
                                       "enableGradientAccumulation")
            # copied in the stage that makes it, in every micro-batch of every N-th batch
            everyn.setdefault(art.rp(), []).append((_anchor_stage(pipe, src), P.Copy(t, s, debugContext=f"anchor({a})")))
        else:
            everyn.setdefault(art.rp(), []).append(P.Copy(t, s, debugContext=f"anchor({a})"))
    step = P.Sequence([pre])
    af = options.accumulation_factor() if ir.training is not None else 1
    if pipe:
        # the pipeline runs the micro-batches of a batch (with gradient accumulation) or of the
        # step, then the outer fragment
        step.add(pipe.pre)
        run = P.Sequence([pipe.program(af if af > 1 else bps), outer])
        if not everyn:
            step.add(P.Repeat(bps, run, debugContext="batchesPerStep") if af > 1 else run)
        else:
            # EVERYN (with accumulation): the batches ending at each multiple of a return period
            # run a pipeline whose stages also copy those anchors out
            period, marks = _everyn_marks(everyn)
            seg = P.Sequence()
            for gap, due in marks:
                if gap > 1:
                    seg.add(P.Repeat(gap - 1, run))
                extra = [P.Sequence(name=f"pipelineStage{st}/toHostEveryN") for st in range(pipe.num)]
                for copies in due:
                    for st, c in copies:
                        extra[st].add(c)
                seg.add(P.Sequence([pipe.program(af, extra), outer]))
            step.add(P.Repeat(bps // period, seg, debugContext="batchesPerStep"))
    elif af == 1 and not everyn:
        step.add(P.Repeat(bps, body, debugContext="batchesPerStep"))
    elif af == 1:
        period, marks = _everyn_marks(everyn)
        seg = P.Sequence()
        for gap, due in marks:
            seg.add(P.Repeat(gap, body))
            for copies in due:
                seg.add(P.Sequence(copies))
        step.add(P.Repeat(bps // period, seg, debugContext="batchesPerStep"))
    else:
        # gradient accumulation: each batch runs af micro-batches, then the outer fragment (the
        # weight update); an EVERYN anchor is copied every micro-batch of every N-th batch
        def batch(copies=()):
            inner = P.Sequence([body, *copies]) if copies else body
            return P.Sequence([P.Repeat(af, inner, debugContext="accumulationFactor"), outer])
        if not everyn:
            step.add(P.Repeat(bps, batch(), debugContext="batchesPerStep"))
        else:
            period, marks = _everyn_marks(everyn)
            seg = P.Sequence()
            for gap, due in marks:
                if gap > 1:
                    seg.add(P.Repeat(gap - 1, batch()))
                seg.add(batch([c for copies in due for c in copies]))
            step.add(P.Repeat(bps // period, seg, debugContext="batchesPerStep"))
    step.add(post)
    wfh = P.Sequence([P.Copy(graph._state.streams[h], ctx.get(tid, ctx.home_vgraph(tid)))
                      for tid, h in out.weights_in.items()], name="weightsFromHost")
    wth = P.Sequence([P.Copy(ctx.get(tid, ctx.home_vgraph(tid)), graph._state.streams[h])
                      for tid, h in out.weights_out.items()], name="weightsToHost")
    ofh = P.Sequence([P.Copy(graph._state.streams[h], ctx.get(tid, ctx.home_vgraph(tid)))
                      for tid, h in out.optimizer_in.items()], name="optimizerFromHost")
    sfh = P.Sequence([P.Copy(graph._state.streams[h], ctx.get(tid, ctx.home_vgraph(tid)))
                      for tid, h in out.seed_in.items()], name="randomSeedFromHost")
    out.programs = [step, wfh, wth, ofh, sfh]
    out.in_place = ctx.in_place
    return out
