"""State shared by the op lowerings of one session: the Poplar graph (one replica), one virtual
graph per IPU, the Poplar tensor of each IR tensor on each virtual graph, and the model program.

A tensor used on another IPU than its home gets a copy there (PopART's IpuCopy), mapped
linearly over the consuming IPU's tiles and made once per (tensor, IPU).
"""

from __future__ import annotations

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplibs import poputil
from openipu.popart.errors import popart_exception
from openipu.popart.tensorinfo import poplar_type


class LoweringContext:
    """Args: ``ir``, the replica ``graph``, ``vgraphs`` (list of per-IPU graphs), ``options``."""

    def __init__(self, ir, graph, vgraphs, options):
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

    def has(self, tid: str) -> bool:
        return tid in self._t

    def get(self, tid: str, vg: int) -> poplar.Tensor:
        """``tid`` on virtual graph ``vg``, copying it there (once) from its home if needed."""
        per = self._t.get(tid)
        if per is None:
            raise popart_exception(f"Tensor '{tid}' has no device tensor yet (internal lowering order error)")
        if vg in per:
            return per[vg]
        src = per[self._home[tid]]
        g = self.graph_of(vg)
        dst = g.addVariable(src.elementType(), src.shape(), f"{tid}/IpuCopy{vg}")
        poputil.mapTensorLinearly(g, dst)
        self.prog.add(P.Copy(src, dst, debugContext=f"IpuCopy({tid})->{vg}"))
        per[vg] = dst
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
