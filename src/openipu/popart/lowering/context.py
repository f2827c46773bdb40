"""State shared by the op lowerings of one session: the Poplar graph (one replica), one virtual
graph per IPU, the Poplar tensor of each IR tensor on each virtual graph, and the model program.

A tensor used on another IPU than its home gets a copy there (PopART's IpuCopy), mapped
linearly over the consuming IPU's tiles and made once per (tensor, IPU).

In-place ops (PopART's ``InPlace`` pattern, on unless ``Patterns.InPlace`` is False): a lowering
that can write its result over an input asks :meth:`LoweringContext.in_place_input` which input,
if any, it may overwrite. PopART's rule, on the Poplar tensors: the input has the output's type
and shape and no element twice, is not a weight, constant or streamed input, is not anchored,
and nothing read after this op (no later consumer, and no other input of this op) shares a
variable with it, through a view or otherwise. The overwritten input then is the output: the
activation occupies one buffer where the op would need two, as on the IPU.
"""

from __future__ import annotations

import contextlib

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplibs import poputil
from openipu.popart.errors import popart_exception
from openipu.popart.tensorinfo import poplar_type
from openipu.popart.transforms.recompute import RECOMPUTED_SUFFIX


class LoweringContext:
    """Args: ``ir``, the replica ``graph``, ``vgraphs`` (list of per-IPU graphs), ``options``,
    ``patterns`` (``popart.Patterns`` or None: the defaults)."""

    def __init__(self, ir, graph, vgraphs, options, patterns=None):
        self.ir = ir
        self.graph = graph
        self.vgraphs = vgraphs
        self.options = options
        self.prog = P.Sequence(name="model")
        self._t: dict[str, dict[int, poplar.Tensor]] = {}
        self._home: dict[str, int] = {}
        self.kinds: dict[int, str] = {}
        self.cast = bool(options.enableSupportedDataTypeCasting)
        self.created: set[str] = set()      # weights created by their consumer's creator
        self._deferred: dict[str, tuple] = {}   # tid -> (vg, make()): variables made when first read
        self._unread_ok: set[str] = set()         # deferred tensors not made if no op reads them
        # in-place analysis: the op being lowered (its position in the schedule), the last
        # position reading each tensor, the tensors that must keep their value to the end, the IR
        # tensors using each variable, and the variables no op may overwrite
        self.pos = -1
        self.last_use: dict[str, int] = {}
        self._var_tids: dict[int, set[str]] = {}
        self._fixed: set[int] = set()
        self.in_place: dict[int, int] = {}      # op id -> the input it overwrites
        self.in_place_enabled = bool(getattr(patterns, "InPlace", True))
        for pos, op in enumerate(ir.ops):
            for x in op.inputs:
                if x:
                    self.last_use[x] = pos
                    if x.endswith(RECOMPUTED_SUFFIX):
                        # a recomputed tensor is its forward tensor again (the forward op's
                        # fragment re-run): the forward tensor is read until then
                        self.last_use[x[:-len(RECOMPUTED_SUFFIX)]] = pos
        self.pinned = {ir.anchor_alias.get(a, a) for a in ir.data_flow.anchors()}
        # pipelining: the stage programs (lowering.pipeline.Pipeline) and the stage of the op
        # being lowered (None outside the pipeline: the outer fragment, a subgraph's body)
        self.pipeline = None
        self.stage: int | None = None
        # recomputation: the forward ops a recomputation op re-runs (by identity), and for each,
        # once lowered, its fragment: (program, input tensors, output tensors)
        self.recomputed = {id(op.recomputes) for op in ir.ops if op.recomputes is not None}
        self.fragments: dict[int, tuple] = {}
        # while a recomputed op's fragment is grown: the program the fragment goes into (op_prog)
        self.fragment_parent = None
        self.in_body = False        # lowering an outlined subgraph's body

    def ptype(self, tid: str):
        """Poplar type of an IR tensor's device tensor (PopART's casting rule)."""
        return poplar_type(self.ir.tensors[tid].info.data_type(), self.cast)

    def graph_of(self, vg: int):
        return self.vgraphs[vg if vg is not None and vg < len(self.vgraphs) else 0]

    def vgraph_of(self, op) -> int:
        return op.vgraph if op.vgraph is not None else 0

    def set(self, tid: str, vg: int, t: poplar.Tensor) -> None:
        self._t.setdefault(tid, {})[vg] = t
        self._home.setdefault(tid, vg)
        self._register(tid, t)

    def _register(self, tid: str, t: poplar.Tensor) -> None:
        for v in variables_of(t):
            self._var_tids.setdefault(v, set()).add(tid)

    @contextlib.contextmanager
    def bound(self, tids, tensors, vg: int):
        """Within the block, IR tensors ``tids`` are ``tensors`` on virtual graph ``vg`` (a
        subgraph's inputs while its body is lowered); their own tensors come back afterwards."""
        saved = {x: (self._t.get(x), self._home.get(x)) for x in tids}
        stage, self.stage = self.stage, None    # the body reads its inputs as bound, unstaged
        try:
            for x, t in zip(tids, tensors):
                self._t[x], self._home[x] = {vg: t}, vg
                self._register(x, t)
            yield
        finally:
            self.stage = stage
            for x, (per, home) in saved.items():
                self._t[x], self._home[x] = per, home

    def fix_current(self) -> None:
        """No op may overwrite the tensors set so far (the weights, constants and inputs)."""
        self._fixed = set(self._var_tids)

    def in_place_input(self, op, candidates=(0,)):
        """The first input index of ``candidates`` (PopART's inplace priority order) whose tensor
        ``op`` may overwrite with its output ``0``, else None. See the module notes for the rule."""
        if not self.in_place_enabled or not op.outputs or not op.outputs[0]:
            return None
        out = self.ir.tensors[op.outputs[0]].info
        state = self.graph._state
        for i in candidates:
            tid = op.inputs[i] if i < len(op.inputs) else ""
            if not tid:
                continue
            t = self.input(op, i)
            if (list(t.shape()) != list(out.shape()) or t.elementType() != self.ptype(op.outputs[0])
                    or t.numElements() == 0 or t.containsAliases()):
                continue
            vs = variables_of(t)
            if vs & self._fixed or any(state.variables[v].constant for v in vs):
                continue
            others = [self.input(op, j) for j, x in enumerate(op.inputs) if x and j != i]
            if any(vs & variables_of(o) for o in others):
                continue
            users = set().union(*(self._var_tids.get(v, ()) for v in vs))
            if any(u in self.pinned or self.last_use.get(u, -1) > self.pos for u in users):
                continue
            self.in_place[op.id] = i
            return i
        return None

    def has(self, tid: str) -> bool:
        return tid in self._t or tid in self._deferred

    def home_vgraph(self, tid: str, default=None):
        """The virtual graph where ``tid``'s device tensor was made (others hold copies), or
        ``default`` when it has none yet."""
        return self._home.get(tid, default)

    def placed(self, tid: str) -> dict:
        """``tid``'s device tensors by virtual graph (its home and its copies; do not modify)."""
        return self._t[tid]

    def home(self, tid: str) -> poplar.Tensor | None:
        """``tid``'s device tensor on its home virtual graph, or None when it has none yet.
        Never makes a deferred variable."""
        per, vg = self._t.get(tid), self._home.get(tid)
        return per.get(vg) if per is not None else None

    def defer(self, tid: str, vg: int, make, unread_ok: bool = False) -> None:
        """Make variable ``tid`` on virtual graph ``vg`` with ``make()`` when it is first read (an
        accumulator cloned from its gradient: PopART's ``mustExistBeforeCreate``). Like the
        variables made before the ops, no op may overwrite it in place. ``unread_ok``: if no op
        reads it, it is never made (a constant whose consumers build its value into the program)."""
        self._deferred[tid] = (vg, make)
        if unread_ok:
            self._unread_ok.add(tid)

    def _make(self, tid: str) -> None:
        vg, make = self._deferred.pop(tid)
        t = make()
        self.set(tid, vg, t)
        self._fixed |= variables_of(t)

    def make_deferred(self) -> None:
        """Make the deferred variables that no op has read."""
        for tid in list(self._deferred):
            if tid not in self._unread_ok:
                self._make(tid)

    def get(self, tid: str, vg: int) -> poplar.Tensor:
        """``tid`` on virtual graph ``vg``, copying it there (once) from its home if needed; for an
        op of a pipeline stage, see :meth:`openipu.popart.lowering.pipeline.Pipeline.get`."""
        if tid in self._deferred:
            self._make(tid)
        per = self._t.get(tid)
        if per is None:
            raise popart_exception(f"Tensor '{tid}' has no device tensor yet (internal lowering order error)")
        if self.pipeline is not None and self.stage is not None:
            return self.pipeline.get(tid, vg, self.stage)
        if vg in per:
            return per[vg]
        return self.copy_to(tid, vg)

    @property
    def op_prog(self):
        """The program the op being lowered is added to, outside any recomputation fragment: where
        the steps go that a recomputation re-running the fragment must not repeat (a copy to
        another IPU made on the op's first read, PopART's ``IpuCopyOp``; a stash's restore,
        ``RestoreOp``)."""
        return self.prog if self.fragment_parent is None else self.fragment_parent

    def copy_to(self, tid: str, vg: int, prog=None) -> poplar.Tensor:
        """A copy of ``tid`` on virtual graph ``vg`` (PopART's IpuCopy), mapped linearly there, made
        by a copy appended to ``prog`` (default: :attr:`op_prog`)."""
        per = self._t[tid]
        src = per[self._home[tid]]
        g = self.graph_of(vg)
        dst = g.addVariable(src.elementType(), src.shape(), f"{tid}/IpuCopy{vg}")
        poputil.mapTensorLinearly(g, dst)
        (self.op_prog if prog is None else prog).add(P.Copy(src, dst, debugContext=f"IpuCopy({tid})->{vg}"))
        per[vg] = dst
        self._register(tid, dst)
        return dst

    def input(self, op, i: int):
        """Op input ``i`` on the op's virtual graph (``None`` for an omitted optional input)."""
        x = op.inputs[i] if i < len(op.inputs) else ""
        return self.get(x, self.vgraph_of(op)) if x else None

    def owns_layout(self, op, i: int) -> bool:
        """Whether ``op`` chooses the tile layout of its input ``i``: the input is a weight
        (initializer, Const or Variable) that ``op`` consumes first and that lives on ``op``'s
        virtual graph. PopART creates such tensors from their consumer ("unwinding"), e.g. with
        ``createMatMulInputRHS`` / ``createWeights`` / ``createSliceableTensor``."""
        tid = op.inputs[i] if i < len(op.inputs) else ""
        it = self.ir.tensors.get(tid) if tid else None
        return (it is not None and tid not in self.created and it.producer is None and it.kind in ("Const", "Variable")
                and bool(it.consumers) and it.consumers[0] is op
                and self._home.get(tid, self.vgraph_of(op)) == self.vgraph_of(op))

    def new_output(self, op, k: int, mapping=None):
        """A fresh variable for output ``k``, mapped linearly over the op's virtual graph."""
        tid = op.outputs[k]
        info = self.ir.tensors[tid].info
        g = self.graph_of(self.vgraph_of(op))
        t = g.addVariable(self.ptype(tid), info.shape(), tid)
        poputil.mapTensorLinearly(g, t)
        return t


def variables_of(t: poplar.Tensor) -> set[int]:
    """Ids of the variables ``t`` views."""
    p = t.pieces
    return {p.row[0]} if p.row is not None else set(p.var.tolist())
