"""Programs of a pipelined session (PopART's implicit pipelining, ``research/popart.md`` 3.6).

Each pipeline stage (:mod:`openipu.popart.transforms.pipeline`) gets its own fragments: the
host -> device input copies, the ops (with their restores), a tail, the anchor copies to the host
and the copies to other IPUs. With ``S`` stages and ``G`` micro-batches (the accumulation factor,
else ``batchesPerStep``), the pipeline runs ``G + S - 1`` cycles:

- fill: cycles ``0 .. S-2``, cycle ``t`` runs stages ``0 .. t``;
- main: ``Repeat(G - S + 1)`` of a cycle running every stage;
- flush: cycles ``1 .. S-1`` run stages ``t .. S-1``;

each cycle runs its stages' input copies, then their ops, then their anchor copies, then the
copies between IPUs of every stage. Each stage's ops (its *main* fragment, with its stash
counters) are one Poplar function, called in every cycle that runs the stage, as PopART adds
each stage's main fragment with ``Graph::addFunction``: its code exists once, and what only it
touches lives within a call. Stage ``s`` works on micro-batch ``t - s`` in cycle ``t``.
Stages on different IPUs advance their IPUs' clocks independently and meet at the copies: the
predicted cycle lasts as long as its busiest IPU, which is the speed-up of pipelining over
sharding (where each micro-batch crosses the IPUs one after the other).

Between stages:

- a tensor read on another IPU is copied there at the end of its producer's cycle (available
  to the next stage; openipu copies it directly, where PopART chains the copy through the IPUs
  in between);
- a tensor read in a later stage than the one it is available in is *stashed*: written into a
  ring buffer of ``D = (last reading stage) - (available stage) + 1`` slots, mapped like the
  tensor (PopART's ``StashOp``: ``popops::dynamicUpdate`` at a per-stage counter), and restored
  in the reading stage (``RestoreOp``: ``popops::dynamicSlice``). Each stage counts its
  micro-batches modulo ``D``; the counters are zeroed when the pipeline starts.
"""

from __future__ import annotations

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplar.graph import memory_order
from openipu.poplibs import popops
from openipu.poplibs.popops import expr as pe
from openipu.popart.errors import popart_exception
from openipu.popart.ir import OUTER_FRAGMENT
from openipu.popart.lowering.context import variables_of


class Pipeline:
    """The stage fragments and stashes of a pipelined IR (``ir.num_stages > 0``), filled while the
    ops are lowered; :meth:`program` assembles the cycles."""

    def __init__(self, ctx):
        ir = ctx.ir
        self.ctx = ctx
        self.num = S = ir.num_stages
        self.to_device = [P.Sequence(name=f"pipelineStage{s}/toDevice") for s in range(S)]
        self.body = [P.Sequence(name=f"pipelineStage{s}") for s in range(S)]
        self.tail = [P.Sequence(name=f"pipelineStage{s}/counters") for s in range(S)]
        self.to_host = [P.Sequence(name=f"pipelineStage{s}/toHost") for s in range(S)]
        self.copies = [P.Sequence(name=f"pipelineStage{s}/ipuCopies") for s in range(S)]
        self.reset = P.Sequence(name="pipeline/resetCounters")
        self.pre = P.Sequence(name="pipeline/constantCopies")
        self._copied: dict = {}        # (tid, vg) -> (tensor on vg, stage it is available in)
        self._stash: dict = {}         # (tid, vg) -> (stash tensor, slots)
        self._restored: dict = {}      # (tid, vg, stage) -> restored tensor
        self._counter: dict = {}       # (stage, slots, vg) -> counter tensor
        self._main: list | None = None  # per stage: the function of its ops and counters
        self.last: dict = {}           # (tid, vg) -> the last stage reading it there
        self.first: dict = {}          # tid -> the first stage reading it
        for op in ir.ops:
            if op.pipeline_stage is None:
                continue
            vg = ctx.vgraph_of(op)
            for x in op.inputs:
                if x:
                    k = (x, vg)
                    self.last[k] = max(self.last.get(k, -1), op.pipeline_stage)
                    self.first[x] = min(self.first.get(x, S), op.pipeline_stage)

    # -- where tensors are -------------------------------------------------------------------
    def stage_of(self, tid: str):
        """The stage ``tid`` is made in (a streamed input: the first stage reading it); None for
        constants, variables and what the outer fragment makes (unchanged during the pipeline)."""
        t = self.ctx.ir.tensors[tid]
        if t.producer is not None:
            p = t.producer
            return p.pipeline_stage if p.execution_context != OUTER_FRAGMENT else None
        if t.kind == "Stream":
            return self.first.get(tid, 0)
        return None

    def get(self, tid: str, vg: int, stage: int) -> poplar.Tensor:
        """``tid`` on virtual graph ``vg`` for an op of ``stage``: the tensor itself, its copy from
        another IPU, or its restore from a stash."""
        ctx = self.ctx
        per = ctx.placed(tid)
        home = ctx.home_vgraph(tid)
        p = self.stage_of(tid)
        if p is None:
            if vg in per:
                return per[vg]
            return ctx.copy_to(tid, vg, self.pre)      # unchanged in the pipeline: copied once per step
        if vg == home:
            t, avail = per[home], p
        else:
            t, avail = self._copy(tid, vg, p)
        if stage <= avail:
            if stage < avail:
                raise popart_exception(f"Pipeline stage {stage} reads '{tid}' before stage {avail} makes it available "
                                       "(internal pipelining error)")
            return t
        key = (tid, vg, stage)
        if key not in self._restored:
            stash, slots, perm = self._stash_of(tid, vg, t, avail)
            g = ctx.graph_of(vg)
            # the restore is the stage's own step, not part of the fragment of the op being
            # lowered: a recomputation re-running that fragment in a later stage must not slice
            # the stash again at this stage's counter
            r = popops.dynamicSlice(g, stash, self._counter_of(stage, slots, vg), [0], [1], ctx.op_prog,
                                    f"{tid}/restore{stage}").squeeze([0])
            if perm is not None:
                r = r.dimShuffle([perm.index(d) for d in range(len(perm))])
            ctx._register(tid, r)
            self._restored[key] = r
        return self._restored[key]

    def _copy(self, tid: str, vg: int, p: int):
        """The copy of ``tid`` (made in stage ``p``) on ``vg``, made at the end of ``p``'s cycle."""
        if (tid, vg) not in self._copied:
            self._copied[(tid, vg)] = (self.ctx.copy_to(tid, vg, self.copies[p]), p + 1)
        return self._copied[(tid, vg)]

    def _stash_of(self, tid: str, vg: int, t: poplar.Tensor, avail: int):
        """``(stash, slots, perm)``: the ring buffer ``[slots, *t.dimShuffle(perm)]`` of ``tid`` on
        ``vg`` and the update writing it at the end of stage ``avail``.

        The stash holds ``t`` with its dims in memory order (``perm``: the dimShuffle of ``t``
        that is contiguous in memory, or None when ``t`` already is), as PopART's stash is made
        from the slice (``createSliceableTensorFromSlice``): each slot of a transposed view (a
        weight's ``Transpose`` read by the backward pass) is then a few runs per tile, and the
        stash's update and restores cost, on the IPU and on the host, what its tile map's
        structure costs, not one region per element."""
        if (tid, vg) not in self._stash:
            slots = self.last[(tid, vg)] - avail + 1
            g = self.ctx.graph_of(vg)
            perm = memory_order(t)
            src = t if perm is None else t.dimShuffle(perm)
            stash = g.cloneN(src, slots, f"{tid}/stash")
            popops.dynamicUpdate(g, stash, src.expand([0]), self._counter_of(avail, slots, vg), [0], [1],
                                 self.body[avail], f"{tid}/stash")
            self._stash[(tid, vg)] = (stash, slots, perm)
        return self._stash[(tid, vg)]

    def _counter_of(self, stage: int, slots: int, vg: int) -> poplar.Tensor:
        """Micro-batches stage ``stage`` has run, modulo ``slots`` (an UNSIGNED_INT[1] on ``vg``)."""
        key = (stage, slots, vg)
        if key not in self._counter:
            g = self.ctx.graph_of(vg)
            c = g.addVariable(poplar.UNSIGNED_INT, [1], f"pipelineStage{stage}/counter{slots}")
            g.setTileMapping(c, 0)
            popops.zero(g, c, self.reset, f"pipelineStage{stage}/counter{slots}/reset")
            popops.mapInPlace(g, pe.Rem(pe.Add(pe._1, pe.Const(1)), pe.Const(slots)), [c], self.tail[stage],
                              f"pipelineStage{stage}/counter{slots}/next")
            self._counter[key] = c
        return self._counter[key]

    def read_after_bodies(self, stage: int) -> set[int]:
        """Variables a pipeline cycle reads after the stage bodies, or in a stage after ``stage``:
        the sources of the copies to other IPUs, the anchors copied to the host, the stashes'
        sources written in a later stage (ids, as :func:`variables_of`)."""
        ctx = self.ctx
        tids = {tid for tid, _ in self._copied} | set(ctx.pinned)
        tids |= {tid for (tid, vg), _ in self._stash.items() if (self.stage_of(tid) or 0) > stage}
        out: set[int] = set()
        for tid in tids:
            t = ctx.home(tid)
            if t is not None:
                out |= variables_of(t)
        return out

    # -- the schedule ------------------------------------------------------------------------
    def cycle(self, stages, extra=None) -> P.Sequence:
        """One pipeline cycle of ``stages``; ``extra`` (per stage, or None): more device-to-host
        copies after each stage's own (an EVERYN anchor in the batches that return it)."""
        stages = list(stages)
        seq = P.Sequence(name=f"pipelineCycle{stages[0]}-{stages[-1]}")
        for s in stages:
            seq.add(self.to_device[s])
        if self._main is None:          # the fragments are complete once the cycles are assembled
            self._main = [self.ctx.graph.addFunction(P.Sequence([self.body[s], self.tail[s]], name=f"pipelineStage{s}/main"))
                          for s in range(self.num)]
        for s in stages:
            seq.add(P.Call(self._main[s], debugContext=f"pipelineStage{s}"))
        for s in stages:
            seq.add(self.to_host[s])
            if extra is not None:
                seq.add(extra[s])
        for s in range(self.num):       # every cycle copies for every stage, as PopART does
            seq.add(self.copies[s])
        return seq

    def program(self, micro_batches: int, extra=None) -> P.Sequence:
        """Fill, main and flush over ``micro_batches`` (>= the number of stages); ``extra`` as in
        :meth:`cycle`, in every cycle."""
        S = self.num
        prog = P.Sequence([self.reset], name="pipeline")
        for t in range(S - 1):
            prog.add(self.cycle(range(t + 1), extra))
        prog.add(P.Repeat(micro_batches - S + 1, self.cycle(range(S), extra), debugContext="pipelineMain"))
        for t in range(1, S):
            prog.add(self.cycle(range(t, S), extra))
        return prog
