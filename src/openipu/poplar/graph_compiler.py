"""The graph compiler: programs to an executable tree of steps, each with its predicted cost.

``compile_programs`` checks the graph (every variable and vertex mapped, every field
connected, cycle estimates where the IPU Model needs them), compiles each program tree into
steps (:mod:`openipu.poplar.executable`), costs each step with :mod:`openipu.poplar.cost` and
:mod:`openipu.poplar.exchange` (compute sets, exchanges, syncs, host transfers), and plans tile
memory (:mod:`openipu.poplar.memory`). A graph that does not fit raises Poplar's out-of-memory
error unless ``debug.allowOutOfMemory`` is set. Costs are predictions for the IPU; the host
seconds the compile takes are measured apart (``compile_seconds``).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from openipu.poplar import calibration as cal
from openipu.poplar import cost as costmod
from openipu.poplar import errors
from openipu.poplar import exchange as X
from openipu.poplar import program as P
from openipu.poplar import pvti
from openipu.poplar import structure_cache as SC
from openipu.poplar.executable import (Executable, _AbortStep, _Branch, _Compiled, _CollectiveStep, _CopyStep,
                                       _CrossReplicaStep, _ExecuteStep, _GroupRunner, _HostCallStep, _IndexAcc,
                                       _If, _Leaf, _PrintStep, _RemoteStep, _Repeat, _Seq, _Step, _StreamToDevice,
                                       _StreamToHost, _Switch, _UserRunner, _While)
from openipu.poplar.copy_cost import _CopyCosts, _same_tiles
from openipu.poplar.graph import Access, DataStream, Graph, HostFunction, RemoteBuffer
from openipu.poplar.memory import plan_memory
from openipu.poplar.options import OptionFlags, get_logger
from openipu.poplar.storage import Accessor
from openipu.poplar.tensor import Tensor
from openipu.poplar.vertex import _Shape

_log = get_logger("engine")


class VertexIntrospector:
    """What a registered perf estimator sees of one vertex (``poplar::VertexIntrospector``)."""

    def __init__(self, fields: dict, values: dict, codelet):
        self._fields, self._values, self.codelet = fields, values, codelet

    def getFieldInfo(self, name: str) -> "FieldData":  # noqa: N802
        return FieldData(self._fields.get(name), self._values.get(name))


class FieldData:
    def __init__(self, connected, value):
        self._c, self._v = connected, value

    def size(self) -> int:
        if isinstance(self._c, list):
            return len(self._c)
        return self._c.numElements() if self._c is not None else 0

    def __getitem__(self, i):
        return FieldData(self._c[i], None)

    def getInitialValue(self, target=None):  # noqa: N802
        return self._v


class VertexPerfEstimate:
    def __init__(self, cycles: int, flops: int = 0):
        self.cycles, self.flops = int(cycles), int(flops)


class _Compiler(_CopyCosts):
    def __init__(self, graph: Graph, options: OptionFlags):
        self.graph = graph
        self.state = graph._state
        self.spec = graph._top._target.spec
        self.options = options
        self.steps: list[_Step] = []
        self.uses: list[list] = []        # per step: [(Tensor, is_write)]
        self.exchange_code = np.zeros(self.spec.num_tiles)
        # The memory plan's timeline: one *position* per step laid out, and one per occurrence of a
        # block (a Sequence met again, a function called again) whose steps were laid out before.
        self.positions: list[int] = []    # per position: its step (>= 0), or -1 - block for a re-occurrence
        self.step_pos: list[int] = []     # per step: its position
        self.loops: list[tuple[int, int]] = []          # (first position, last position) per loop body
        self.blocks: list[tuple[int, int]] = []         # (first position, end position) per block laid out
        self.block_refs: list[list[int]] = []           # per block: the positions of its re-occurrences
        self.block_is_function: list[bool] = []
        self._block_of: dict = {}        # (kind, id) -> (program, block, node, occurrences, exchange code)
        self.occurrences = 0             # leaf steps the program tree runs, counting every occurrence
        # leaf steps with control code: a Sequence met again is code again, a function's body is
        # code once (each call jumps to it), as on Poplar; per block being built, its own count
        self.code_steps = 0
        self._code_frames: list[int] = [0]
        self._coded_functions: set = set()
        # the exchange code added per occurrence of a step (host transfers: costed at each one, where
        # compute sets and copies are costed once per program), so a block met again adds it again
        self.occurrence_code = np.zeros(self.spec.num_tiles)
        self.copy_cache: dict[int, costmod.StepCost] = {}   # id(Copy) -> its cost, for a Copy met again
        self.layout_copy_cache: dict = {}    # (source layout, destination layout) -> (cost, exchange code)
        self._var_digests: dict[int, bytes] = {}
        self.vertex_state = np.zeros(self.spec.num_tiles)
        self.vertex_code_tiles: dict[str, np.ndarray] = {}     # vertex type -> bool [tiles] holding its code
        self.vertex_type_code: dict = {}
        self.vertex_state_by_type: dict = {}
        self.streams_used: set = set()
        self.cs_cache: dict[int, tuple] = {}
        self.recv_buffers: dict[int, np.ndarray] = {}   # step -> bytes per tile received into buffers

    # -- checks ---------------------------------------------------------------------------
    def check_mapping(self):
        for space in self.state.spaces.values():
            bad = [v for v in space.vars if v.numel and (v.tile_ids < 0).any()]
            if bad:
                vids = bad
                names = [v.name for v in bad[:5]]
                raise errors.invalid_tile_mapping(
                    f"{len(vids)} variable(s) not completely mapped to tiles: {', '.join(repr(n) for n in names)}"
                    f"{' ...' if len(vids) > 5 else ''}. Map every variable and constant with graph.setTileMapping "
                    "(or poputil.mapTensorLinearly) before creating the Engine")

    # -- steps ----------------------------------------------------------------------------
    def leaf(self, step: _Step, cost: costmod.StepCost, uses, name: str = ""):
        step.idx = len(self.steps)
        self.step_pos.append(len(self.positions))
        self.positions.append(step.idx)
        self.occurrences += 1
        self.code_steps += 1
        self._code_frames[-1] += 1
        step.cost = cost
        step.total = cost.total()
        step.name = name or step.kind
        involved = step.total > 0
        step.align = involved if involved.sum() > 1 else None
        self.steps.append(step)
        self.uses.append(uses)
        return _Leaf(step)

    def ipus_of(self, tiles: np.ndarray) -> np.ndarray:
        m = np.zeros(self.spec.num_tiles, bool)
        m[tiles[tiles >= 0]] = True
        return costmod.ipus_of_tiles(self.spec, m)

    def all_ipus(self):
        return np.ones(self.spec.num_ipus, bool)

    def compile_program(self, prog):
        """Compile one engine program (blocks are reused within a program, not across programs,
        so that each program's steps stay one range)."""
        self._block_of = {}
        return self.compile(prog)

    def block(self, key, prog, build, is_function: bool = False):
        """The node of a block of steps (a Sequence, a function's body): laid out the first time
        it is met; met again, the same node (and steps) with one more position for the memory
        plan, as Poplar's program is a tree whose repeated parts are the same code. Each
        occurrence still runs, and is counted, when the engine walks the tree."""
        hit = self._block_of.get(key)
        if hit is not None:
            _, b, node, occ, code, own_code = hit
            a, e = self.blocks[b]
            if e > a:
                self.block_refs[b].append(len(self.positions))
                self.positions.append(-1 - b)
            self.occurrences += occ
            if not is_function:         # a Sequence's code again (the functions it calls: once)
                self.code_steps += own_code
                self._code_frames[-1] += own_code
            if code is not None:       # its host transfers' exchange code, once per occurrence as before
                self.exchange_code[code[0]] += code[1]
                self.occurrence_code[code[0]] += code[1]
            return node
        a, occ0, code0 = len(self.positions), self.occurrences, self.occurrence_code.copy()
        self._code_frames.append(0)
        node = build()
        own_code = self._code_frames.pop()
        if is_function:                 # its body's code is its own, once for the whole graph
            if key in self._coded_functions:
                self.code_steps -= own_code
            self._coded_functions.add(key)
        else:
            self._code_frames[-1] += own_code
        b = len(self.blocks)
        self.blocks.append((a, len(self.positions)))
        self.block_refs.append([])
        self.block_is_function.append(is_function)
        d = self.occurrence_code - code0
        nz = np.flatnonzero(d)
        self._block_of[key] = (prog, b, node, self.occurrences - occ0, (nz, d[nz]) if nz.size else None, own_code)
        return node

    def compile(self, prog):
        """The executable node of ``prog``; a container (Sequence, Repeat, RepeatWhile*, If,
        Switch) keeps the program's debug name as ``name`` (the profile's program tree shows it)."""
        node = self._compile(prog)
        name = getattr(prog, "debug_name", "")
        if name and isinstance(name, str) and isinstance(node, (_Seq, _Repeat, _While, _If, _Switch)) \
                and not getattr(node, "name", ""):
            node.name = name
        return node

    def _compile(self, prog):
        if isinstance(prog, P.Sequence):
            return self.block(("seq", id(prog)), prog, lambda: _Seq([self.compile(p) for p in prog.programs]))
        if isinstance(prog, P.Execute):
            return self.execute(prog)
        if isinstance(prog, P.Copy):
            return self.copy(prog)
        if isinstance(prog, P.Repeat):
            a = len(self.positions)
            body = self.compile(prog.body)
            self.loops.append((a, len(self.positions) - 1))
            return _Repeat(prog.count, body)
        if isinstance(prog, P.RepeatWhileTrue):
            a = len(self.positions)
            cond = self.compile(prog.cond)
            br = self.branch(prog.predicate)
            body = self.compile(prog.body)
            self.loops.append((a, len(self.positions) - 1))
            return _While(cond, br, body, prog.until)
        if isinstance(prog, P.If):
            br = self.branch(prog.predicate)
            return _If(br, self.compile(prog.true_body), self.compile(prog.false_body))
        if isinstance(prog, P.Switch):
            br = self.branch(prog.control)
            return _Switch(br, {v: self.compile(p) for v, p in prog.cases}, self.compile(prog.default))
        if isinstance(prog, P.Call):
            return self.call(prog)
        if isinstance(prog, P.PrintTensor):
            step = _PrintStep(prog.title, Accessor(prog.tensor), prog.tensor.elementType())
            nbytes = self.bytes_per_ipu(prog.tensor)
            c = costmod.sync_cost(self.spec, nbytes > 0).add(costmod.host_cost(self.spec, nbytes))
            return self.leaf(step, c, [(prog.tensor, False)], "PrintTensor")
        if isinstance(prog, (P.Abort, P.AbortOnCondition, P.ErrorProgram)):
            pred = Accessor(prog.predicate) if isinstance(prog, P.AbortOnCondition) else None
            t = Accessor(prog.tensor) if isinstance(prog, P.ErrorProgram) else None
            uses = [(prog.predicate, False)] if pred else []
            return self.leaf(_AbortStep(prog.message, pred, t), costmod.sync_cost(self.spec, self.all_ipus()), uses)
        if isinstance(prog, P.Sync):
            c = costmod.sync_cost(self.spec, self.all_ipus())
            if prog.sync_type != P.SyncType.INTERNAL and self.spec.num_ipus > 1:
                c.duration["sync"] += self.spec.global_sync_cycles
            return self.leaf(_Step(), c, [], f"Sync({prog.sync_type})")
        if isinstance(prog, P.WriteUndef):
            return self.leaf(_Step(), costmod.StepCost(self.spec.num_ipus), [(prog.tensor, True)], "WriteUndef")
        if isinstance(prog, P.AssumeEqualAcrossReplicas):
            return _Seq([])
        if isinstance(prog, P.CrossReplicaCopy):
            nb = prog.src.numElements() * prog.src.elementType().size
            c = costmod.sync_cost(self.spec, self.all_ipus())
            c.duration["global_exchange"] += nb / (self.spec.ipu_link_bytes_per_s / self.spec.clock_hz)
            return self.leaf(_CrossReplicaStep(Accessor(prog.src), Accessor(prog.dst), prog.replica_map), c,
                             [(prog.src, False), (prog.dst, True)], "CrossReplicaCopy")
        if isinstance(prog, P.Collective):
            uses = [(t, False) for t in prog.reads] + [(t, True) for t in prog.writes]
            leaf = self.leaf(_CollectiveStep(prog.kernel, prog.reads, prog.writes, prog.debug_name), prog.cost, uses,
                             prog.debug_name or "Collective")
            if prog.recv_bytes_per_tile is not None and np.any(prog.recv_bytes_per_tile):
                self.recv_buffers[leaf.step.idx] = np.asarray(prog.recv_bytes_per_tile, np.float64)
            return leaf
        if isinstance(prog, P.Program) and type(prog) is P.Program:
            return _Seq([])
        raise errors.control_program_error(f"Cannot compile program of type {type(prog).__name__}")

    def branch(self, pred: Tensor) -> _Branch:
        """A predicate read by the control flow: a sync, then the value broadcast to every tile."""
        T = self.spec.num_tiles
        d = pred.rank()
        boxes = X.Boxes(np.zeros((T, d), np.int64), np.tile(np.array(pred.shape(), np.int64).reshape(1, d), (T, 1)),
                        np.arange(T, dtype=np.int64))
        vol = costmod.exchange_volume(self.spec, [X.RegionTransfer(pred, boxes)])
        c = costmod.sync_cost(self.spec, self.all_ipus()).add(costmod.exchange_cost(self.spec, vol))
        leaf = self.leaf(_Branch(Accessor(pred)), c, [(pred, False)], "Branch")
        return leaf.step

    def call(self, prog: P.Call):
        f = prog.function
        if isinstance(f, HostFunction):
            nb = sum(t.numElements() * t.elementType().size for t in prog.inputs + prog.outputs)
            c = costmod.sync_cost(self.spec, self.all_ipus()).add(costmod.host_cost(self.spec, np.full(self.spec.num_ipus, nb)))
            uses = [(t, False) for t in prog.inputs] + [(t, True) for t in prog.outputs]
            return self.leaf(_HostCallStep(f, [Accessor(t) for t in prog.inputs], [Accessor(t) for t in prog.outputs]),
                             c, uses, f"HostFunction({f.handle})")
        # a function's steps are laid out at its first call; later calls run the same steps (one
        # more position each for the memory plan, which frees the function's own variables
        # between calls)
        return self.block(("fn", f.id), f, lambda: self.compile(f.program), is_function=True)

    # -- copies ---------------------------------------------------------------------------
    def copy(self, prog: P.Copy):
        s, d = prog.src, prog.dst
        if isinstance(s, Tensor) and isinstance(d, Tensor):
            # costed (and its exchange code counted) once per Copy program, as compute sets are
            # once per compute set: a function's copies meet again at every call site
            c = self.copy_cache.get(id(prog))
            if c is None:
                c = self.copy_cache[id(prog)] = self.layout_copy_cost(s, d)
            return self.leaf(_CopyStep(Accessor(s), Accessor(d)), c, [(s, False), (d, True)], "Copy")
        if isinstance(s, DataStream) and isinstance(d, Tensor):
            if not s.to_device:
                raise errors.control_program_error(f"Copy: stream '{s.handle}' goes device to host; it cannot be a source")
            self.streams_used.add(s.handle)
            return self.leaf(_StreamToDevice(s, Accessor(d)), self.host_copy_cost(d), [(d, True)], f"StreamCopy({s.handle})")
        if isinstance(s, Tensor) and isinstance(d, DataStream):
            if d.to_device:
                raise errors.control_program_error(f"Copy: stream '{d.handle}' goes host to device; it cannot be a destination")
            self.streams_used.add(d.handle)
            return self.leaf(_StreamToHost(d, Accessor(s)), self.host_copy_cost(s), [(s, False)], f"StreamCopy({d.handle})")
        if isinstance(s, RemoteBuffer) and isinstance(d, Tensor):
            off = Accessor(prog.offset) if prog.offset is not None else None
            return self.leaf(_RemoteStep(s, Accessor(d), True, off), self.host_copy_cost(d), [(d, True)], f"RemoteBufferCopy({s.handle})")
        if isinstance(s, Tensor) and isinstance(d, RemoteBuffer):
            off = Accessor(prog.offset) if prog.offset is not None else None
            return self.leaf(_RemoteStep(d, Accessor(s), False, off), self.host_copy_cost(s), [(s, False)], f"RemoteBufferCopy({d.handle})")
        raise errors.control_program_error("Copy: unsupported source and destination")

    # -- compute sets ---------------------------------------------------------------------
    def execute(self, prog: P.Execute):
        cs = prog.cs
        if cs.id not in self.cs_cache:
            self.cs_cache[cs.id] = self.build_compute_set(cs)
        runners, c, uses, recv = self.cs_cache[cs.id]
        leaf = self.leaf(_ExecuteStep(runners), c, uses, cs.name)
        leaf.step.cs_id = cs.id
        if recv.any():
            self.recv_buffers[leaf.step.idx] = recv
        return leaf

    def code_on(self, type_name: str, tiles: np.ndarray) -> None:
        """Record that ``tiles`` hold the code of vertex type ``type_name`` (once per tile)."""
        mask = self.vertex_code_tiles.get(type_name)
        if mask is None:
            mask = self.vertex_code_tiles[type_name] = np.zeros(self.spec.num_tiles, bool)
        mask[np.asarray(tiles, np.int64)] = True

    def build_compute_set(self, cs):
        spec, st = self.spec, self.state
        tiles_l, cycles_l, multi_l, types_l, type_names = [], [], [], [], []
        reads, writes, runners, uses = [], [], [], []
        flops = 0.0
        memo: dict = {}

        def type_id(name):
            if name not in type_names:
                type_names.append(name)
            return type_names.index(name)

        # library vertex groups
        for g in cs.groups:
            n = g.tiles.size
            tiles_l.append(g.tiles.astype(np.int64))
            cycles_l.append(np.broadcast_to(np.asarray(g.cycles, np.float64), (n,)))
            multi_l.append(np.full(n, g.multi))
            types_l.append(np.full(n, type_id(g.type_name)))
            flops += g.flops
            for r in g.reads:
                if isinstance(r, Access):
                    # read where a tensor laid out alike lives (an elementwise operand): nothing moves
                    boxes = None if _on_own_tiles(r) else _boxes_of(r, memo)
                    if boxes is not None:
                        reads.append(X.RegionTransfer(r.tensor, boxes, count_send=r.count_send,
                                                       supertile_recv_scale=r.supertile_recv_scale))
                    uses.append((r.tensor, False))
                    continue
                t, ct = r[0], r[1]
                send = r[2] if len(r) > 2 else True
                reads.append(costmod.Transfer(st.space(t._type), t.flat_addresses(),
                                              np.broadcast_to(ct, (t.numElements(),)), count_send=send))
                uses.append((t, False))
            for w in g.writes:
                if isinstance(w, Access):
                    boxes = None if _on_own_tiles(w) else _boxes_of(w, memo)
                    if boxes is not None:
                        writes.append(X.RegionTransfer(w.tensor, boxes, to_owner=True))
                    uses.append((w.tensor, True))
                    continue
                t, pt = w
                writes.append(costmod.Transfer(st.space(t._type), t.flat_addresses(), None,
                                               src=np.broadcast_to(pt, (t.numElements(),))))
                uses.append((t, True))
            sb = np.broadcast_to(np.asarray(g.state_bytes, np.float64), (n,))
            self.vertex_state += np.bincount(g.tiles, weights=sb, minlength=spec.num_tiles)
            self.vertex_state_by_type[g.type_name] = self.vertex_state_by_type.get(g.type_name, 0) + float(sb.sum())
            self.code_on(g.type_name, g.tiles)
            self.vertex_type_code[g.type_name] = g.code_bytes
            runners.append(_GroupRunner(g))

        # user vertices, by codelet type
        by_type: dict[str, list[int]] = {}
        for vid in cs.user_vertices:
            by_type.setdefault(st.v_type[vid], []).append(vid)
        for tname, vids in by_type.items():
            codelet = st.codelets[tname]
            v_tiles, v_cycles, v_flops = self.user_vertex_costs(cs, codelet, vids)
            tiles_l.append(v_tiles)
            cycles_l.append(v_cycles)
            multi_l.append(np.full(len(vids), codelet.multi_vertex))
            types_l.append(np.full(len(vids), type_id(tname)))
            flops += float(v_flops.sum())
            buckets, state_bytes = self.user_buckets(codelet, vids, v_tiles, reads, writes, uses)
            self.vertex_state += np.bincount(v_tiles, weights=state_bytes, minlength=spec.num_tiles)
            self.vertex_state_by_type[tname] = self.vertex_state_by_type.get(tname, 0) + float(state_bytes.sum())
            self.code_on(tname, v_tiles)
            self.vertex_type_code[tname] = cal.USER_CODELET_CODE_BYTES
            runners.append(_UserRunner(codelet, buckets))

        tiles = np.concatenate(tiles_l) if tiles_l else np.zeros(0, np.int64)
        cyc = np.concatenate(cycles_l) if cycles_l else np.zeros(0)
        multi = np.concatenate(multi_l) if multi_l else np.zeros(0, bool)
        tids = np.concatenate(types_l) if types_l else np.zeros(0, np.int64)
        comp, active = costmod.compute_cost(spec, tiles, cyc, multi, tids, type_names)
        comp.flops = flops
        vin = costmod.exchange_volume(spec, reads)
        vout = costmod.exchange_volume(spec, writes)
        for v in (vin, vout):
            self.exchange_code += v.code_units() * cal.EXCHANGE_CODE_BYTES_PER_MESSAGE
        involved = costmod.ipus_of_tiles(spec, active)
        total = costmod.sync_cost(spec, involved)
        if vin.any():
            total.add(costmod.exchange_cost(spec, vin)).add(costmod.sync_cost(spec, involved))
        total.add(comp)
        if vout.any():
            total.add(costmod.sync_cost(spec, involved)).add(costmod.exchange_cost(spec, vout))
        total.tile_compute = comp.tile_compute
        return runners, total, uses, vin.recv_bytes

    def user_vertex_costs(self, cs, codelet, vids):
        st, spec = self.state, self.spec
        tiles = np.array([st.v_tile[v] for v in vids], np.int64)
        if (tiles < 0).any():
            bad = vids[int(np.flatnonzero(tiles < 0)[0])]
            raise errors.invalid_tile_mapping(
                f"Vertex {bad} of type '{codelet.vertex_name}' in compute set '{cs.name}' is not mapped to a tile; "
                "call graph.setTileMapping(vertex, tile)")
        for v in vids:
            fields = st.v_fields[v]
            for fname, spec_f in codelet._fields.items():
                if spec_f.direction == "value":
                    continue
                c = fields.get(fname)
                if c is None or (isinstance(c, list) and any(x is None for x in c)):
                    raise errors.graph_connection_error(
                        f"Field '{fname}' of vertex {v} (type '{codelet.vertex_name}') in compute set '{cs.name}' "
                        "is not connected; connect it with graph.connect(v['" + fname + "'], tensor)")
        cycles = np.zeros(len(vids))
        flops = np.zeros(len(vids))
        est = st.estimators.get(codelet.vertex_name)
        for i, v in enumerate(vids):
            p = st.v_perf[v]
            if p is not None:
                cycles[i], flops[i] = p
            elif est is not None:
                r = est(VertexIntrospector(st.v_fields[v], st.v_values[v], codelet), self.graph._target)
                if isinstance(r, VertexPerfEstimate):
                    cycles[i], flops[i] = r.cycles, r.flops
                elif isinstance(r, tuple):
                    cycles[i], flops[i] = r[0], (r[1] if len(r) > 1 else 0)
                else:
                    cycles[i] = int(r)
            elif spec.is_ipu_model:
                raise errors.missing_cycle_estimate(
                    f"Vertex {v} of type '{codelet.vertex_name}' in compute set '{cs.name}' has no cycle estimate, "
                    "which the IPU Model needs to profile it. Call graph.setPerfEstimate(vertex, cycles) or "
                    f"graph.registerPerfEstimator('{codelet.vertex_name}', estimator)")
            else:
                n = sum(x.numElements() for c in st.v_fields[v].values() for x in (c if isinstance(c, list) else [c]))
                cycles[i] = cal.DEFAULT_VERTEX_BASE_CYCLES + n
        return tiles, cycles, flops

    def user_buckets(self, codelet, vids, v_tiles, reads, writes, uses):
        st = self.state
        layout_of: dict = {}
        state_bytes = np.zeros(len(vids))
        for i, v in enumerate(vids):
            fields = st.v_fields[v]
            sig = []
            sb = 0
            for fname, spec_f in codelet._fields.items():
                if spec_f.direction == "value":
                    continue
                c = fields[fname]
                if spec_f.shape == _Shape.VECTOR_LIST:
                    sig.append((fname, tuple(x.numElements() for x in c)))
                    sb += cal.VERTEX_STATE_BYTES_PER_VECTOR * (1 + len(c))
                elif spec_f.shape == _Shape.VECTOR:
                    sig.append((fname, c.numElements()))
                    sb += cal.VERTEX_STATE_BYTES_PER_VECTOR
                else:
                    sig.append((fname, -1))
                    sb += cal.VERTEX_STATE_BYTES_PER_SCALAR
            vals = st.v_values[v]
            key = (tuple(sig), tuple(sorted((k, repr(x)) for k, x in vals.items())))
            layout_of.setdefault(key, []).append(i)
            state_bytes[i] = sb
        buckets = []
        for (sig, _), idxs in layout_of.items():
            accs = {}
            layout = []
            tiles = v_tiles[idxs]
            for fname, n in sig:
                spec_f = codelet._fields[fname]
                conns = [st.v_fields[vids[i]][fname] for i in idxs]
                if isinstance(n, tuple):
                    lst = []
                    for j in range(len(n)):
                        addr = _stack_addresses([c[j] for c in conns])
                        t0 = conns[0][j]
                        lst.append(_IndexAcc(t0._type, addr))
                        self.note_field(spec_f, t0, addr, tiles, reads, writes)
                    accs[fname] = lst
                    layout.append((fname, "list"))
                else:
                    addr = _stack_addresses(conns)
                    if n == -1:
                        addr = addr.reshape(len(idxs))
                    t0 = conns[0]
                    accs[fname] = _IndexAcc(t0._type, addr)
                    layout.append((fname, "tensor"))
                    self.note_field(spec_f, t0, addr, tiles, reads, writes)
                for c in conns:
                    for x in (c if isinstance(c, list) else [c]):
                        uses.append((x, spec_f.writes))
            vals = {k: v for k, v in st.v_values[vids[idxs[0]]].items()}
            buckets.append((layout, accs, vals))
        return buckets, state_bytes

    def note_field(self, spec_f, t0, addr, tiles, reads, writes):
        space = self.state.space(t0._type)
        consumer = np.broadcast_to(tiles.reshape((-1,) + (1,) * (addr.ndim - 1)), addr.shape).reshape(-1)
        flat = addr.reshape(-1)
        if spec_f.reads:
            reads.append(costmod.Transfer(space, flat, consumer))
        if spec_f.writes:
            writes.append(costmod.Transfer(space, flat, None, src=consumer))


def _stack_addresses(tensors) -> np.ndarray:
    """``[len(tensors), n]`` element addresses of equally sized views (one vectorised pass when
    every view is one contiguous-stride piece, as user vertex fields almost always are)."""
    rows = [t.pieces.row for t in tensors]
    if all(r is not None and len(r[3]) <= 1 for r in rows):
        base = np.array([r[1] for r in rows], np.int64)
        n = tensors[0].numElements()
        if all(len(r[3]) == 0 for r in rows):
            return base.reshape(-1, 1)
        st = np.array([r[4][0] for r in rows], np.int64)
        return base[:, None] + st[:, None] * np.arange(n, dtype=np.int64)[None, :]
    return np.stack([t.flat_addresses() for t in tensors])


def _on_own_tiles(acc: Access) -> bool:
    """Whether an Access whose ``on`` is a tensor uses each element on the tile that owns it (the
    tensor and ``on`` laid out alike, :func:`_same_tiles`): then its transfer moves nothing and
    adds nothing to the exchange figures."""
    on, t = acc.on, acc.tensor
    if not isinstance(on, Tensor) or on.numElements() != t.numElements():
        return False
    return _same_tiles(t, on if on.shape() == t.shape() else on.reshape(t.shape()), 0)[0]


def _boxes_of(acc: Access, memo: dict | None = None):
    """The boxes (global tiles) where an Access uses its view's elements; None: on their owners.
    ``memo`` (one compute set's) keeps the tile boxes of ``on`` tensors several accesses share."""
    on, t = acc.on, acc.tensor
    if on is None:
        return None
    if isinstance(on, X.Boxes):
        return on
    if isinstance(on, (int, np.integer)):
        return X.Boxes.whole(t.shape(), int(on))
    if isinstance(on, Tensor):
        key = (id(on), tuple(t.shape()))
        if memo is not None and key in memo:
            return memo[key][1]
        view = on if on.shape() == t.shape() else on.reshape(t.shape())
        boxes = X.tile_boxes(view)
        if memo is not None:
            memo[key] = (on, boxes)     # holds ``on``: its id stays its own while memo lives
        return boxes
    raise TypeError(f"Access.on must be None, a tile, a Tensor or Boxes, not {type(on).__name__}")


def compileGraph(graph: Graph, programs, options=None, progress: Callable | None = None) -> Executable:  # noqa: N802
    """``poplar::compileGraph``: compile without a device. Returns an :class:`Executable`."""
    return Executable(graph, programs if isinstance(programs, (list, tuple)) else [programs], options, progress)


def compile_programs(graph: Graph, programs: list, options: OptionFlags, progress=None) -> _Compiled:
    """Compile ``programs`` of ``graph`` into an executable step tree with costs and a memory plan.
    ``progress(done, total)`` is called as the compile advances. Raises Poplar's errors (see
    :class:`openipu.poplar.engine.Engine`)."""
    t0 = time.perf_counter()
    comp = _Compiler(graph, options)
    if progress:
        progress(0, 3)
    with pvti.span("compile: check tile mapping", "poplar"):
        comp.check_mapping()
    roots, prog_ranges, pos_ranges = [], [], []
    with pvti.span("compile: lower programs and cost steps", "poplar", programs=len(programs)):
        for p in programs:
            if not isinstance(p, P.Program):
                raise errors.control_program_error(f"Engine programs must be poplar programs, got {type(p).__name__}")
            a, pa = len(comp.steps), len(comp.positions)
            roots.append(comp.compile_program(p))
            prog_ranges.append((a, len(comp.steps)))
            pos_ranges.append((pa, len(comp.positions)))
    if progress:
        progress(1, 3)
    with pvti.span("compile: plan tile memory and liveness", "poplar", steps=len(comp.steps)):
        memory = plan_memory(comp, pos_ranges)
    SC.clear_pieces_keys()
    if progress:
        progress(2, 3)
    out = _Compiled()
    out.compiler = comp
    out.roots = roots
    out.prog_ranges = prog_ranges
    out.memory = memory
    out.compile_seconds = time.perf_counter() - t0
    if progress:
        progress(3, 3)
    _log.info("Compiled %d programs into %d steps in %.3f s (host)", len(programs), len(comp.steps), out.compile_seconds)
    if memory.out_of_memory_tiles.size and not options.get_bool("debug.allowOutOfMemory"):
        path = None
        if options.get_bool("autoReport.all") or options.get_bool("autoReport.outputGraphProfile"):
            from openipu.poplar.profile import write_profile
            path = write_profile(options.get("autoReport.directory", "./"), graph, out, None)
        msg = "Out of memory: Cannot fit all variable data onto one or more tiles."
        if path:
            msg += f" Profile saved to: {path}"
        worst = memory.worst_tiles(5)
        msg += (f" {memory.out_of_memory_tiles.size} tile(s) out of memory; worst: "
                + ", ".join(f"tile {t} needs {b} bytes" for t, b in worst)
                + f" (each tile has {graph._top._target.getBytesPerTile()} bytes)."
                  " Reduce the model or batch, use more IPUs or tiles, or set debug.allowOutOfMemory to compile anyway")
        raise errors.graph_memory_allocation_error(msg, path)
    return out


