"""Pipelining (PopART's ``InferPipelineStages`` and ``Pipeline`` transforms, ``research/popart.md``
3.6): give every op of the main program a pipeline stage, and check the settings as PopART does.

- Forward stages come from the ``pipelineStage`` annotations, or from the virtual graph ids when
  no op has one (PopART's InferPipelineStages). Every op of a stage must be on one virtual graph.
- After autodiff, a gradient op takes the stage mirroring its forward op's: with ``P`` forward
  stages, the gradient of an op in stage ``s`` runs in stage ``2(P-1) - s`` (forward ``A, B, C``
  on stages 0, 1, 2 give ``C'`` on 2, ``B'`` on 3, ``A'`` on 4), on the same IPU. Weight updates
  run in the stage of their gradient (without gradient accumulation: every micro-batch, the
  "stale weights" of PopART's pipelining) or after the pipeline's flush (with accumulation: the
  accumulate outer fragment, no stage). A recomputed forward op runs in the stage of its first
  consumer. Other ops made by transforms run in the latest stage of their inputs.
- No op may read a tensor made in a later stage; a variable (weight) may not be read on two
  IPUs. A streamed input read on several IPUs is streamed onto the IPU of its earliest reading
  stage and copied to the others (PopART's InterIpuCopy does that before its Pipeline transform
  checks the streams, so its "stream tensors can only be streamed directly onto a single IPU"
  does not arise from a model's graph).

The lowering (:mod:`openipu.popart.lowering.pipeline`) builds the fill / main / flush cycles,
the copies between IPUs and the stashes of activations from these stages.
"""

from __future__ import annotations

from openipu.popart.builder import PIPELINE_ATTR, RECOMPUTE_ATTR
from openipu.popart.errors import popart_exception
from openipu.popart.ir import OUTER_FRAGMENT
from openipu.popart.options import VirtualGraphMode


def _is_forward(op) -> bool:
    return op.grad_of is None and not op.modifies and op.execution_context != OUTER_FRAGMENT


def apply(ir) -> int:
    """Set ``op.pipeline_stage`` of every op; return the number of pipeline stages (0 when
    pipelining is off: every stage is then cleared, as PopART does).

    Raises ``popart_exception`` with PopART's messages: pipelining without virtual graphs or with
    one IPU; some ops with a stage and some without; ops of one stage on different virtual
    graphs; user recomputation annotations; too few micro-batches to fill the pipeline; a variable
    read on two IPUs; and (openipu's) an op reading from a later stage.
    """
    o = ir.options
    if not o.enablePipelining:
        for op in ir.ops:
            op.pipeline_stage = None
        return 0
    if o.virtualGraphMode == VirtualGraphMode.Off or ir.num_vgraphs < 2:
        raise popart_exception("Pipelining requires more than 1 IPU (currently {}) and the 'virtualGraphMode' session "
                               "option to not be VirtualGraphMode::Off (currently {}).".format(
                                   ir.num_vgraphs, str(o.virtualGraphMode).split(".")[-1]))
    fwd = [op for op in ir.ops if _is_forward(op)]
    staged = [op for op in fwd if op.pipeline_stage is not None]
    if staged and len(staged) != len(fwd):
        missing = "".join(f"\n  {op.op_type} ('{op.name}')" for op in fwd if op.pipeline_stage is None)
        raise popart_exception("Only some ops have had their pipeline stage set. Ops missing the pipeline stage:"
                               + missing)
    if not staged:          # InferPipelineStages: the stage is the virtual graph id
        for op in fwd:
            op.pipeline_stage = op.vgraph if op.vgraph is not None else 0
    for op in fwd:
        if op.pipeline_stage < 0:
            raise popart_exception(f"Op has bad pipeline stage {op.pipeline_stage}")
    stage_vg: dict[int, int] = {}
    for s in sorted({op.pipeline_stage for op in fwd}):
        ops = [op for op in fwd if op.pipeline_stage == s]
        vgs = sorted({op.vgraph if op.vgraph is not None else -1 for op in ops})
        if len(vgs) > 1:
            raise popart_exception(
                "Ops [{}] have the same pipeline stage {}, but different virtual graph ids [{}]. All ops with the same "
                "pipeline stage must also have the same virtual graph id".format(
                    ", ".join(op.name for op in ops), s, ", ".join(map(str, vgs))))
        stage_vg[s] = vgs[0]
    if any(op.annotations.get(RECOMPUTE_ATTR) is not None and _recompute_annotation(op) for op in ir.ops):
        raise popart_exception("When pipelining is enabled, user annotation for recomputation is not allowed")
    num_fwd = max(stage_vg) + 1
    training = ir.training is not None
    num = 2 * num_fwd - 1 if training else num_fwd
    if training:
        for s, vg in list(stage_vg.items()):
            stage_vg[2 * (num_fwd - 1) - s] = vg
    _check_depth(ir, num)
    _stage_the_rest(ir, stage_vg, num_fwd)
    _check_tensors(ir)
    return num


def _recompute_annotation(op) -> bool:
    v = op.annotations.get(RECOMPUTE_ATTR)
    if isinstance(v, bytes):
        v = v.decode()
    return str(v).split(".")[-1] == "Recompute"


def _check_depth(ir, num: int) -> None:
    o = ir.options
    if ir.training is not None and o.enableGradientAccumulation:
        if o.accumulationFactor < num:
            raise popart_exception("For pipelining, depth (gradient accumulation factor) must equal at least the number "
                                   f"of pipeline stages ({num})")
    elif ir.data_flow.batchesPerStep() < num:
        raise popart_exception(f"For pipelining, depth (batchesPerStep) must equal at least the number of pipeline "
                               f"stages ({num})")


def _stage_the_rest(ir, stage_vg: dict, num_fwd: int) -> None:
    """Stages of the gradient, update, recompute and other transform-made ops (module notes)."""
    def made(tid):
        p = ir.tensors[tid].producer
        return p.pipeline_stage if p is not None and p.execution_context != OUTER_FRAGMENT else None

    def on_vgraph(op, s: int) -> int:
        vg = op.vgraph if op.vgraph is not None else -1
        for t in range(s, 2 * num_fwd - 1 if ir.training is not None else num_fwd):
            if stage_vg.get(t, vg) == vg:
                return t
        # no stage from s on runs on the op's IPU (the sum of a skip connection's gradients, one
        # of them from the later stage of an earlier layer): the op moves to stage s's IPU, as
        # every op of a stage is on the stage's IPU
        if s in stage_vg and stage_vg[s] >= 0:
            op.vgraph = stage_vg[s]
        return s

    recomputed = [op for op in ir.ops if op.recomputes is not None]
    for op in ir.ops:
        if op.execution_context == OUTER_FRAGMENT:
            op.pipeline_stage = None
            continue
        if _is_forward(op):
            continue            # the user's stage (checked below)
        if op.recomputes is not None:
            base = 0        # set below, from its consumers
        elif op.grad_of is not None and op.grad_of.pipeline_stage is not None:
            base = 2 * (num_fwd - 1) - op.grad_of.pipeline_stage
        else:
            base = int(op.annotations.get(PIPELINE_ATTR, 0))
        ins = [s for s in (made(x) for x in op.inputs if x) if s is not None]
        op.pipeline_stage = on_vgraph(op, max([base, *ins]))
    # a recomputed op runs in the stage of its first consumer (its inputs are from earlier stages)
    for op in reversed(recomputed):
        users = [c.pipeline_stage for o in op.outputs if o for c in ir.tensors[o].consumers
                 if c.pipeline_stage is not None]
        if users:
            op.pipeline_stage = min(users)
    for op in ir.ops:
        if op.pipeline_stage is None:
            continue
        for x in op.inputs:
            s = made(x) if x else None
            if s is not None and s > op.pipeline_stage:
                raise popart_exception(
                    f"Op {op.op_type} ('{op.name}') in pipeline stage {op.pipeline_stage} reads '{x}', made in the later "
                    f"pipeline stage {s}. Pipeline stages must not decrease along the graph: put the op in stage {s} or "
                    "later, or its producer earlier")


def _check_tensors(ir) -> None:
    for t in ir.tensors.values():
        if t.producer is not None or t.kind == "Const" or t.id in ir.optimizer_tensors or t.id == ir.random_seed:
            continue
        vgs = {c.vgraph if c.vgraph is not None else 0 for c in t.consumers
               if c.execution_context != OUTER_FRAGMENT}
        if len(vgs) < 2:
            continue
        if t.kind == "Variable":
            raise popart_exception(f"Can not copy variable tensor {t.id} between virtual graphs when pipelining. All "
                                   "pipeline stages using this tensor should be on the same graph.")
        # a stream read on several IPUs: copied from its home (Ir.home_vgraph) by the lowering
