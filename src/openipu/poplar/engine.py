"""``poplar::Engine``: compile a graph and its programs, then run them on the simulated IPU.

Compilation checks the graph (mapping, connections, cycle estimates), turns each program tree
into a tree of executable steps, each with its predicted :class:`~openipu.poplar.cost.StepCost`,
and plans tile memory (:mod:`openipu.poplar.memory`). Running a program executes every step
functionally with torch and advances one predicted clock per IPU: a step on one IPU only moves
that IPU's clock; a step across IPUs first aligns them (an external sync).

Predicted cycles (IPU time) and host wall time are kept apart: the profile reports the former,
:attr:`Engine.host_seconds` the latter.
"""

from __future__ import annotations

import pickle
import sys
import time
from typing import Callable

import numpy as np
import torch

from openipu.poplar import calibration as cal
from openipu.poplar import cost as costmod
from openipu.poplar import errors
from openipu.poplar import program as P
from openipu.poplar import exchange as X
from openipu.poplar.graph import Access, DataStream, Graph, HostFunction, RemoteBuffer
from openipu.poplar.memory import plan_memory
from openipu.poplar.options import OptionFlags, engine_options, get_logger
from openipu.poplar.storage import Accessor, Storage
from openipu.poplar.tensor import Tensor
from openipu.poplar.vertex import _Shape

_log = get_logger("engine")


# ----------------------------------------------------------------------------------------------
# steps
# ----------------------------------------------------------------------------------------------
class _Step:
    """A leaf step: runs functionally and carries its predicted cost."""

    kind = "Step"
    idx = -1
    cost: costmod.StepCost | None = None
    total = None           # np.ndarray per IPU
    align = None           # bool mask of IPUs that must sync first (multi-IPU steps)
    name = ""

    def run(self, ctx):
        pass


def _advance(ctx, step: _Step):
    ctx.counts[step.idx] += 1
    if step.align is not None:
        m = step.align
        ctx.clock[m] = ctx.clock[m].max() + (ctx.global_sync if m.sum() > 1 else 0.0)
    ctx.clock += step.total
    if ctx.trace is not None and len(ctx.trace) < ctx.trace_limit:
        ctx.trace.append((step.idx, ctx.clock.max()))


class _Seq:
    def __init__(self, nodes):
        self.nodes = nodes

    def run(self, ctx):
        for n in self.nodes:
            n.run(ctx)


class _Leaf:
    """Wrap a step so that running it also advances the clocks."""

    __slots__ = ("step",)

    def __init__(self, step):
        self.step = step

    def run(self, ctx):
        self.step.run(ctx)
        _advance(ctx, self.step)


class _Repeat:
    def __init__(self, count, body):
        self.count, self.body = count, body

    def run(self, ctx):
        for _ in range(self.count):
            self.body.run(ctx)


class _Branch(_Step):
    """Reads a scalar predicate to the control flow (a sync and a broadcast)."""

    kind = "Branch"

    def __init__(self, acc: Accessor):
        self.acc = acc

    def value(self, ctx) -> int:
        return int(self.acc.read(ctx.storage)[0].reshape(-1)[0].item())


class _While:
    def __init__(self, cond, branch: _Branch, body, until: bool):
        self.cond, self.branch, self.body, self.until = cond, branch, body, until

    def run(self, ctx):
        while True:
            self.cond.run(ctx)
            v = bool(self.branch.value(ctx))
            _advance(ctx, self.branch)
            if v == self.until:
                return
            self.body.run(ctx)


class _If:
    def __init__(self, branch, then, other):
        self.branch, self.then, self.other = branch, then, other

    def run(self, ctx):
        v = self.branch.value(ctx)
        _advance(ctx, self.branch)
        (self.then if v else self.other).run(ctx)


class _Switch:
    def __init__(self, branch, cases: dict, default):
        self.branch, self.cases, self.default = branch, cases, default

    def run(self, ctx):
        v = self.branch.value(ctx)
        _advance(ctx, self.branch)
        self.cases.get(v, self.default).run(ctx)


class _CopyStep(_Step):
    kind = "OnTileExecute"

    def __init__(self, src: Accessor, dst: Accessor):
        self.src, self.dst = src, dst

    def run(self, ctx):
        self.dst.write(ctx.storage, self.src.read(ctx.storage))


class _StreamToDevice(_Step):
    kind = "StreamCopy"

    def __init__(self, stream: DataStream, dst: Accessor):
        self.stream, self.dst = stream, dst

    def run(self, ctx):
        data = ctx.engine._stream_pull(self.stream, ctx.storage.replicas)
        self.dst.write(ctx.storage, data)


class _StreamToHost(_Step):
    kind = "StreamCopy"

    def __init__(self, stream: DataStream, src: Accessor):
        self.stream, self.src = stream, src

    def run(self, ctx):
        ctx.engine._stream_push(self.stream, self.src.read(ctx.storage))


class _RemoteStep(_Step):
    kind = "StreamCopy"

    def __init__(self, buf: RemoteBuffer, acc: Accessor, to_device: bool, offset: Accessor | None):
        self.buf, self.acc, self.to_device, self.offset = buf, acc, to_device, offset

    def run(self, ctx):
        store = ctx.engine._remote(self.buf, ctx.storage.replicas)
        n = self.buf.numElements
        rows = self.offset.read(ctx.storage).reshape(ctx.storage.replicas, -1).long() if self.offset else None
        if self.to_device:
            if rows is None:
                val = store[:, 0]
            else:
                val = torch.stack([store[r, rows[r]].reshape(-1) for r in range(store.shape[0])])
            self.acc.write(ctx.storage, val)
        else:
            v = self.acc.read(ctx.storage).reshape(ctx.storage.replicas, -1, n)
            for r in range(store.shape[0]):
                store[r, (rows[r] if rows is not None else torch.tensor([0]))] = v[r].to(store.dtype)


class _PrintStep(_Step):
    kind = "PrintTensor"

    def __init__(self, title: str, acc: Accessor, type_):
        self.title, self.acc, self.type = title, acc, type_

    def run(self, ctx):
        value = self.acc.read(ctx.storage)[0]
        ctx.out.write(format_tensor(self.title, value, self.type) + "\n")
        ctx.out.flush()


class _AbortStep(_Step):
    kind = "Abort"

    def __init__(self, message, pred: Accessor | None = None, tensor: Accessor | None = None):
        self.message, self.pred, self.tensor = message, pred, tensor

    def run(self, ctx):
        if self.pred is not None and not bool(self.pred.read(ctx.storage).any()):
            return
        msg = self.message or "Abort program"
        if self.tensor is not None:
            msg += f": {self.tensor.read(ctx.storage)[0].tolist()}"
        raise errors.application_runtime_error(msg)


class _CrossReplicaStep(_Step):
    kind = "GlobalExchange"

    def __init__(self, src: Accessor, dst: Accessor, replica_map: dict):
        self.src, self.dst, self.map = src, dst, replica_map

    def run(self, ctx):
        v = self.src.read(ctx.storage)
        cur = self.dst.read(ctx.storage).clone()
        for s, d in self.map.items():
            cur[d] = v[s]
        self.dst.write(ctx.storage, cur)


class _CollectiveStep(_Step):
    """A library collective (``program.Collective``): one kernel over all replicas' storage."""

    kind = "GlobalExchange"

    def __init__(self, kernel):
        self.kernel = kernel
        self.accessors: dict[int, Accessor] = {}

    def run(self, ctx):
        pending = []
        self.kernel(_KernelCtx(ctx.storage, pending, self.accessors))
        for acc, val in pending:
            acc.write(ctx.storage, val)


class _HostCallStep(_Step):
    kind = "HostFunction"

    def __init__(self, hf: HostFunction, ins, outs):
        self.hf, self.ins, self.outs = hf, ins, outs

    def run(self, ctx):
        fn = ctx.engine._host_functions.get(self.hf.handle)
        if fn is None:
            raise errors.stream_connection_error(
                f"Host function '{self.hf.handle}' is not connected: call engine.connectHostFunction first")
        for r in range(ctx.storage.replicas):
            ins = [a.read(ctx.storage)[r].numpy().copy() for a in self.ins]
            outs = [np.zeros(a.shape, a.type.numpy_dtype) for a in self.outs]
            fn(ins, outs)
            for a, o in zip(self.outs, outs):
                cur = a.read(ctx.storage).clone()
                cur[r] = torch.as_tensor(o.astype(np.float64 if a.type.is_float else np.int64)).to(cur.dtype).reshape(cur[r].shape)
                a.write(ctx.storage, cur)


class _ExecuteStep(_Step):
    kind = "OnTileExecute"

    def __init__(self, runners):
        self.runners = runners

    def run(self, ctx):
        pending = []
        for r in self.runners:
            pending.extend(r.compute(ctx))       # every vertex reads the pre-compute-set state
        for acc, val in pending:
            acc.write(ctx.storage, val)


# ----------------------------------------------------------------------------------------------
# vertex groups
# ----------------------------------------------------------------------------------------------
class _GroupRunner:
    """Runs a library :class:`VertexGroup` through its kernel."""

    def __init__(self, group):
        self.group = group
        self.accessors: dict[int, Accessor] = {}   # the kernel's tensors live as long as the group

    def compute(self, ctx):
        out = []
        self.group.kernel(_KernelCtx(ctx.storage, out, self.accessors))
        return out


class _KernelCtx:
    """What a library kernel sees: ``read(t)`` -> torch [replicas, *shape]; ``write(t, v)``."""

    __slots__ = ("storage", "pending", "accessors")

    def __init__(self, storage, pending, accessors):
        self.storage, self.pending, self.accessors = storage, pending, accessors

    @property
    def replicas(self):
        return self.storage.replicas

    def _acc(self, t: Tensor) -> Accessor:
        acc = self.accessors.get(id(t))
        if acc is None:
            acc = self.accessors[id(t)] = Accessor(t)
        return acc

    def read(self, t: Tensor) -> torch.Tensor:
        return self._acc(t).read(self.storage)

    def write(self, t: Tensor, value) -> None:
        self.pending.append((self._acc(t), value))


class _IndexAcc:
    """Read / write a [vertices, n] matrix of addresses of one storage buffer."""

    __slots__ = ("key", "index", "shape", "type")

    def __init__(self, type_, addr: np.ndarray):
        self.key, self.type = type_.name, type_
        self.shape = addr.shape
        self.index = torch.from_numpy(np.ascontiguousarray(addr.reshape(-1)))

    def read(self, storage) -> torch.Tensor:
        return storage.bufs[self.key].index_select(1, self.index).reshape((storage.replicas,) + self.shape)

    def write(self, storage, value):
        buf = storage.bufs[self.key]
        value = value.reshape(storage.replicas, -1)
        buf[:, self.index] = self.type.wrap(value) if self.type.wrap_bits or value.dtype != buf.dtype else value


class _UserRunner:
    """Runs user codelets: vertices bucketed by field sizes; each bucket under ``torch.vmap``."""

    def __init__(self, codelet, buckets):
        self.codelet = codelet
        self.buckets = buckets   # list of (field layout, {field: _IndexAcc or [..]}, values)
        self.fns = [_make_vertex_fn(codelet, [f for f, _ in layout], values) for layout, _, values in buckets]

    def compute(self, ctx):
        pending = []
        R = ctx.storage.replicas
        for (layout, accs, values), fn in zip(self.buckets, self.fns):
            names = [f for f, _ in layout]
            flat_in = []
            for f, shape in layout:
                a = accs[f]
                if shape == "list":
                    flat_in.append([x.read(ctx.storage).flatten(0, 1) for x in a])
                else:
                    flat_in.append(a.read(ctx.storage).flatten(0, 1))
            outs = _run_codelet(self.codelet, fn, len(names), flat_in)
            for f, val in zip(names, outs):
                if not self.codelet._fields[f].writes:
                    continue
                a = accs[f]
                if isinstance(a, list):
                    for x, v in zip(a, val):
                        pending.append((_ReshapeWrite(x, R), v))
                else:
                    pending.append((_ReshapeWrite(a, R), val))
        return pending


class _ReshapeWrite:
    __slots__ = ("acc", "R")

    def __init__(self, acc, R):
        self.acc, self.R = acc, R

    def write(self, storage, value):
        self.acc.write(storage, value.reshape(self.R, -1))


def _make_vertex_fn(codelet, names, values):
    attrs = [codelet._fields[n].attr for n in names]
    multi = codelet.multi_vertex
    value_fields = [f for f in codelet._fields.values() if f.direction == "value"]

    def fn(*tensors):
        inst = object.__new__(codelet)
        d = inst.__dict__
        for a, t in zip(attrs, tensors):
            d[a] = [x.clone() for x in t] if isinstance(t, list) else t.clone()
        for f in value_fields:
            d[f.attr] = values.get(f.name, 0)
        if multi:
            for w in range(codelet.numWorkers()):
                inst.compute(w)
        else:
            inst.compute()
        return tuple(d[a] for a in attrs)
    return fn


def _run_codelet(codelet, fn, num_fields, flat_in):
    n = flat_in[0][0].shape[0] if isinstance(flat_in[0], list) else flat_in[0].shape[0]
    if codelet.vectorize and getattr(codelet, "_vmap_ok", True) and n > 1:
        try:
            return torch.vmap(fn)(*flat_in)
        except Exception as e:  # data-dependent control flow, .item(), ...: run vertex by vertex
            _log.debug("vmap of %s failed (%s); running vertices one by one", codelet.vertex_name, e)
            codelet._vmap_ok = False
    results = [fn(*[[x[i] for x in t] if isinstance(t, list) else t[i] for t in flat_in]) for i in range(n)]
    out = []
    for k in range(num_fields):
        col = [r[k] for r in results]
        out.append([torch.stack([c[j] for c in col]) for j in range(len(col[0]))] if isinstance(col[0], list)
                   else torch.stack(col))
    return out


# ----------------------------------------------------------------------------------------------
# compiler
# ----------------------------------------------------------------------------------------------
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


class _Compiler:
    def __init__(self, graph: Graph, options: OptionFlags):
        self.graph = graph
        self.state = graph._state
        self.spec = graph._top._target.spec
        self.options = options
        self.steps: list[_Step] = []
        self.uses: list[list] = []        # per step: [(Tensor, is_write)]
        self.exchange_code = np.zeros(self.spec.num_tiles)
        self.loops: list[tuple[int, int]] = []
        self.functions: dict[int, object] = {}
        self.vertex_state = np.zeros(self.spec.num_tiles)
        self.vertex_code_pairs: set = set()
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

    def compile(self, prog):
        if isinstance(prog, P.Sequence):
            return _Seq([self.compile(p) for p in prog.programs])
        if isinstance(prog, P.Execute):
            return self.execute(prog)
        if isinstance(prog, P.Copy):
            return self.copy(prog)
        if isinstance(prog, P.Repeat):
            a = len(self.steps)
            body = self.compile(prog.body)
            self.loops.append((a, len(self.steps) - 1))
            return _Repeat(prog.count, body)
        if isinstance(prog, P.RepeatWhileTrue):
            a = len(self.steps)
            cond = self.compile(prog.cond)
            br = self.branch(prog.predicate)
            body = self.compile(prog.body)
            self.loops.append((a, len(self.steps) - 1))
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
            leaf = self.leaf(_CollectiveStep(prog.kernel), prog.cost, uses, prog.debug_name or "Collective")
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
        # functions are compiled once per call site in the simulator (code shared on hardware)
        return self.compile(f.program)

    # -- copies ---------------------------------------------------------------------------
    def copy(self, prog: P.Copy):
        s, d = prog.src, prog.dst
        if isinstance(s, Tensor) and isinstance(d, Tensor):
            return self.tensor_copy(s, d)
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

    def bytes_per_ipu(self, t: Tensor) -> np.ndarray:
        """Bytes of ``t`` held on each IPU (float64 ``[num_ipus]``)."""
        spec = self.spec
        counts = X.tile_counts(t, spec.num_tiles)
        return counts.reshape(spec.num_ipus, spec.tiles_per_ipu).sum(axis=1) * float(t.elementType().size)

    def host_copy_cost(self, t: Tensor) -> costmod.StepCost:
        spec = self.spec
        per_ipu = self.bytes_per_ipu(t)
        involved = per_ipu > 0
        c = costmod.sync_cost(spec, involved)
        c.add(costmod.host_cost(spec, per_ipu))
        vol = costmod.exchange_volume(spec, [X.RegionTransfer(t, X.Boxes.whole(t.shape(), -2), to_owner=True)])
        self.exchange_code += (vol.recv_msgs + vol.send_msgs) * cal.EXCHANGE_CODE_BYTES_PER_MESSAGE
        c.add(costmod.exchange_cost(spec, vol))
        return c

    def tensor_copy(self, s: Tensor, d: Tensor):
        spec = self.spec
        T = spec.num_tiles
        d_boxes = X.tile_boxes(d)
        tr = X.RegionTransfer(s, d_boxes)
        moved = X.moved_elements(tr, T)
        if moved is None or (s._type == d._type and s._state is d._state and s.intersectsWith(d)):
            # a copy onto itself or an overlapping view: per element (small, rare)
            ss, ds = self.state.space(s._type), self.state.space(d._type)
            sa, da = s.flat_addresses(), d.flat_addresses()
            st_, dt_ = ss.tiles_of(sa).astype(np.int64), ds.tiles_of(da).astype(np.int64)
            local = (st_ == dt_) & (sa != da)
            on_tile = np.bincount(dt_[local], minlength=T) * float(s.elementType().size)
            vol = costmod.exchange_volume(spec, [costmod.Transfer(ss, sa, dt_)])
        else:
            vol = costmod.exchange_volume(spec, [tr])
            nel = np.prod(d_boxes.sz, axis=1) if d_boxes.sz.shape[1] else np.ones(len(d_boxes), np.int64)
            ok = d_boxes.tile >= 0
            held = np.bincount(d_boxes.tile[ok], weights=nel[ok], minlength=T)
            on_tile = np.maximum(held - moved, 0) * float(s.elementType().size)
        self.exchange_code += (vol.recv_msgs + vol.send_msgs) * cal.EXCHANGE_CODE_BYTES_PER_MESSAGE
        mask = (X.tile_counts(s, T) > 0) | (X.tile_counts(d, T) > 0)
        involved = costmod.ipus_of_tiles(spec, mask)
        c = costmod.sync_cost(spec, involved)
        c.add(costmod.exchange_cost(spec, vol))
        c.add(costmod.on_tile_copy_cost(spec, on_tile))
        return self.leaf(_CopyStep(Accessor(s), Accessor(d)), c, [(s, False), (d, True)], "Copy")

    # -- compute sets ---------------------------------------------------------------------
    def execute(self, prog: P.Execute):
        cs = prog.cs
        if cs.id not in self.cs_cache:
            self.cs_cache[cs.id] = self.build_compute_set(cs)
        runners, c, uses, recv = self.cs_cache[cs.id]
        leaf = self.leaf(_ExecuteStep(runners), c, uses, cs.name)
        if recv.any():
            self.recv_buffers[leaf.step.idx] = recv
        return leaf

    def build_compute_set(self, cs):
        spec, st = self.spec, self.state
        tiles_l, cycles_l, multi_l, types_l, type_names = [], [], [], [], []
        reads, writes, runners, uses = [], [], [], []
        flops = 0.0

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
                    boxes = _boxes_of(r)
                    if boxes is not None:
                        reads.append(X.RegionTransfer(r.tensor, boxes, count_send=r.count_send))
                    uses.append((r.tensor, False))
                    continue
                t, ct = r[0], r[1]
                send = r[2] if len(r) > 2 else True
                reads.append(costmod.Transfer(st.space(t._type), t.flat_addresses(),
                                              np.broadcast_to(ct, (t.numElements(),)), count_send=send))
                uses.append((t, False))
            for w in g.writes:
                if isinstance(w, Access):
                    boxes = _boxes_of(w)
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
            for tl in np.unique(g.tiles).tolist():
                self.vertex_code_pairs.add((tl, g.type_name))
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
            for tl in np.unique(v_tiles).tolist():
                self.vertex_code_pairs.add((tl, tname))
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
            self.exchange_code += (v.recv_msgs + v.send_msgs) * cal.EXCHANGE_CODE_BYTES_PER_MESSAGE
        involved = costmod.ipus_of_tiles(spec, active)
        total = costmod.sync_cost(spec, involved)
        if vin.any():
            total.add(costmod.exchange_cost(spec, vin)).add(costmod.sync_cost(spec, involved))
        total.add(comp)
        if vout.any():
            total.add(costmod.sync_cost(spec, involved)).add(costmod.exchange_cost(spec, vout))
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


def _boxes_of(acc: Access):
    """The boxes (global tiles) where an Access uses its view's elements; None: on their owners."""
    on, t = acc.on, acc.tensor
    if on is None:
        return None
    if isinstance(on, X.Boxes):
        return on
    if isinstance(on, (int, np.integer)):
        return X.Boxes.whole(t.shape(), int(on))
    if isinstance(on, Tensor):
        if on.shape() != t.shape():
            on = on.reshape(t.shape())
        return X.tile_boxes(on)
    raise TypeError(f"Access.on must be None, a tile, a Tensor or Boxes, not {type(on).__name__}")


# ----------------------------------------------------------------------------------------------
# executable and engine
# ----------------------------------------------------------------------------------------------
class Executable:
    """A compiled graph and programs (``poplar::Executable``); ``serialize`` / ``deserialize``.

    The simulator's executable holds the graph description and programs; loading it compiles
    the steps again (quick) so that the file does not depend on openipu's internal objects.
    """

    def __init__(self, graph: Graph, programs: list, options=None, progress=None):
        self.graph, self.programs, self.options = graph, programs, dict(options or {})
        self.compiled = _compile(graph, programs, engine_options(options), progress)

    def serialize(self, f) -> None:
        """Write to a binary file object or a path. Raises ``poplar_error`` if a codelet or kernel
        cannot be pickled (define codelets at module level)."""
        try:
            data = pickle.dumps((self.graph, self.programs, self.options))
        except Exception as e:
            raise errors.poplar_error(f"Cannot serialise the executable: {e}. Codelets and library kernels "
                                      "must be defined at module level") from None
        if hasattr(f, "write"):
            f.write(data)
        else:
            with open(f, "wb") as fh:
                fh.write(data)

    @staticmethod
    def deserialize(f) -> "Executable":
        data = f.read() if hasattr(f, "read") else open(f, "rb").read()
        graph, programs, options = pickle.loads(data)
        return Executable(graph, programs, options)


def compileGraph(graph: Graph, programs, options=None, progress: Callable | None = None) -> Executable:  # noqa: N802
    """``poplar::compileGraph``: compile without a device. Returns an :class:`Executable`."""
    return Executable(graph, programs if isinstance(programs, (list, tuple)) else [programs], options, progress)


class _Compiled:
    pass


def _compile(graph: Graph, programs: list, options: OptionFlags, progress=None) -> _Compiled:
    t0 = time.perf_counter()
    comp = _Compiler(graph, options)
    if progress:
        progress(0, 3)
    comp.check_mapping()
    roots, prog_ranges = [], []
    for p in programs:
        if not isinstance(p, P.Program):
            raise errors.control_program_error(f"Engine programs must be poplar programs, got {type(p).__name__}")
        a = len(comp.steps)
        roots.append(comp.compile(p))
        prog_ranges.append((a, len(comp.steps)))
    if progress:
        progress(1, 3)
    memory = plan_memory(comp, prog_ranges)
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


class _RunCtx:
    __slots__ = ("engine", "storage", "clock", "counts", "trace", "trace_limit", "global_sync", "out")


class Engine:
    """``poplar::Engine(graph, programs, options)``: compile, then ``load`` and ``run``.

    Raises at construction: ``invalid_tile_mapping`` (unmapped variable or vertex),
    ``graph_connection_error`` (unconnected field), ``missing_cycle_estimate`` (IPU Model vertex
    without estimate), ``graph_memory_allocation_error`` (does not fit, unless
    ``debug.allowOutOfMemory``), ``invalid_option``.
    """

    def __init__(self, graph_or_exe, programs=None, options=None, progress: Callable | None = None):
        if isinstance(graph_or_exe, Executable):
            exe = graph_or_exe
            if programs is not None and options is None and not isinstance(programs, (P.Program, list, tuple)):
                options = programs
        else:
            progs = programs if isinstance(programs, (list, tuple)) else [programs if programs is not None else P.Sequence()]
            exe = Executable(graph_or_exe, list(progs), options, progress)
        self._exe = exe
        self.options = engine_options(exe.options if options is None else options)
        self.graph = exe.graph
        self._compiled = exe.compiled
        self._device = None
        self._storage: Storage | None = None
        self._streams: dict[str, object] = {}
        self._stream_pos: dict[str, int] = {}
        self._callbacks: dict[str, object] = {}
        self._host_functions: dict[str, Callable] = {}
        self._remote: dict[str, torch.Tensor] = {}
        spec = self.graph._top._target.spec
        self._spec = spec
        self._counts = np.zeros(len(self._compiled.compiler.steps), np.int64)
        self._clock_total = 0.0
        self._runs: list[dict] = []
        self._profiling = True
        self.host_seconds = 0.0
        self._out = sys.stdout
        if self.options.get_bool("autoReport.all") or self.options.get_bool("autoReport.outputGraphProfile"):
            from openipu.poplar.profile import write_profile
            self.profile_path = write_profile(self.options.get("autoReport.directory", "./"), self.graph, self._compiled, None)

    # -- loading --------------------------------------------------------------------------
    def load(self, device) -> None:
        if device.getTarget().spec.num_tiles < self._spec.num_tiles:
            raise errors.poplar_error(
                f"Cannot load: the engine was compiled for {self._spec.num_tiles} tiles but the device has "
                f"{device.getTarget().spec.num_tiles}")
        self._device = device
        self._storage = Storage(self.graph._state, self.graph._state.replication_factor)

    def prepare(self, device) -> None:
        self.load(device)

    def deploy(self) -> None:
        pass

    def loadAndRun(self, device, index: int = 0) -> None:  # noqa: N802
        self.load(device)
        self.run(index)

    def _check_loaded(self):
        if self._storage is None:
            raise errors.runtime_error("The engine is not loaded: call engine.load(device) before running it")

    # -- running --------------------------------------------------------------------------
    def run(self, index: int = 0, name: str = "") -> None:
        """Run program ``index``. Raises ``stream_connection_error`` if a stream it uses is not
        connected (checked before anything runs), ``application_runtime_error`` on Abort."""
        self._check_loaded()
        roots = self._compiled.roots
        if not 0 <= index < len(roots):
            raise errors.index_error(f"Program index {index} out of range: the engine has {len(roots)} programs")
        a, b = self._compiled.prog_ranges[index]
        for st in self._compiled.compiler.steps[a:b]:
            h = getattr(getattr(st, "stream", None), "handle", None)
            if h is not None and h not in self._streams and h not in self._callbacks:
                raise errors.stream_connection_error(
                    f"Stream '{h}' is not connected to a host buffer: call engine.connectStream('{h}', buffer) "
                    "(or connectStreamToCallback) before engine.run")
        ctx = _RunCtx()
        ctx.engine = self
        ctx.storage = self._storage
        ctx.clock = np.zeros(self._spec.num_ipus)
        ctx.counts = np.zeros(len(self._compiled.compiler.steps), np.int64)
        ctx.trace = [] if self._profiling else None
        ctx.trace_limit = 100_000
        ctx.global_sync = float(self._spec.global_sync_cycles)
        ctx.out = self._out
        t0 = time.perf_counter()
        roots[index].run(ctx)
        dt = time.perf_counter() - t0
        self.host_seconds += dt
        if self._profiling:
            self._counts += ctx.counts
            self._runs.append({"program": index, "name": name, "cycles_per_ipu": ctx.clock.copy(),
                               "counts": ctx.counts, "trace": ctx.trace, "host_seconds": dt})
        if self.options.get_bool("autoReport.all") or self.options.get_bool("autoReport.outputExecutionProfile"):
            from openipu.poplar.profile import write_profile
            self.profile_path = write_profile(self.options.get("autoReport.directory", "./"), self.graph,
                                              self._compiled, self)

    @property
    def last_run_cycles(self) -> int:
        """Predicted IPU cycles of the last run (max over IPUs). openipu extension."""
        return int(round(self._runs[-1]["cycles_per_ipu"].max())) if self._runs else 0

    def enableExecutionProfiling(self):  # noqa: N802
        self._profiling = True

    def disableExecutionProfiling(self):  # noqa: N802
        self._profiling = False

    def resetExecutionProfiling(self):  # noqa: N802
        self._runs.clear()
        self._counts[:] = 0

    # -- host tensors ---------------------------------------------------------------------
    def _handle(self, table: dict, handle: str, what: str) -> Tensor:
        if handle not in table:
            known = ", ".join(sorted(table)) or "none"
            raise errors.poplar_error(f"Unrecognised {what} handle '{handle}'; this graph's {what} handles: {known}")
        return table[handle]

    def writeTensor(self, handle: str, buffer, end=None) -> None:  # noqa: N802
        """Copy host data (numpy array / sequence, ``numElements`` values) into the tensor of a
        ``createHostWrite`` handle, on every replica."""
        self._check_loaded()
        t = self._handle(self.graph._state.host_writes, handle, "host write")
        arr = np.asarray(buffer)
        if arr.size != t.numElements():
            raise errors.poplar_error(
                f"writeTensor('{handle}'): the tensor has {t.numElements()} elements but the buffer has {arr.size}")
        Accessor(t).write(self._storage, _to_torch(arr, t.elementType()))

    def readTensor(self, handle: str, buffer=None, end=None):  # noqa: N802
        """Read the tensor of a ``createHostRead`` handle (replica 0). Fills ``buffer`` (a numpy
        array with the right number of elements) in place if given, and returns the values."""
        self._check_loaded()
        t = self._handle(self.graph._state.host_reads, handle, "host read")
        v = Accessor(t).read(self._storage)[0]
        arr = _to_numpy(v, t.elementType())
        if buffer is not None:
            if np.asarray(buffer).size != arr.size:
                raise errors.poplar_error(
                    f"readTensor('{handle}'): the tensor has {arr.size} elements but the buffer has {np.asarray(buffer).size}")
            buffer.reshape(-1)[:] = arr.reshape(-1)
            return buffer
        return arr

    # -- streams --------------------------------------------------------------------------
    def listStreams(self) -> list[str]:  # noqa: N802
        return sorted(self.graph._state.streams)

    def _stream(self, handle: str) -> DataStream:
        s = self.graph._state.streams.get(handle)
        if s is None:
            known = ", ".join(sorted(self.graph._state.streams)) or "none"
            raise errors.stream_connection_error(f"Unknown stream handle '{handle}'; this graph's streams: {known}")
        return s

    def connectStream(self, handle: str, buffer, end=None) -> None:  # noqa: N802
        """Bind a numpy array to a stream. The array is a circular buffer: each copy moves the next
        ``numElements`` elements, wrapping at the end (Poplar's ``connectStream(h, begin, end)``)."""
        s = self._stream(handle)
        if not isinstance(buffer, np.ndarray):
            buffer = np.asarray(buffer, dtype=s.type.numpy_dtype)
        if buffer.size < s.numElements or buffer.size % max(s.numElements, 1):
            raise errors.stream_connection_error(
                f"Buffer for stream '{handle}' has {buffer.size} elements: it must hold a whole number of "
                f"{s.numElements}-element transfers")
        self._streams[handle] = buffer
        self._stream_pos[handle] = 0
        self._callbacks.pop(handle, None)

    def connectStreamToCallback(self, handle: str, callback, index: int = 0) -> None:  # noqa: N802
        """Call ``callback(array)`` for each transfer: fill it (host to device) or read it."""
        self._stream(handle)
        self._callbacks[handle] = callback
        self._streams.pop(handle, None)

    def connectHostFunction(self, handle: str, index_or_fn, fn=None) -> None:  # noqa: N802
        f = fn if fn is not None else index_or_fn
        if handle not in self.graph._state.host_functions:
            raise errors.stream_connection_error(f"Unknown host function handle '{handle}'")
        self._host_functions[handle] = f

    def _stream_pull(self, s: DataStream, replicas: int) -> torch.Tensor:
        n = s.numElements
        reps = 1 if s.replicatedMode == "BROADCAST" else replicas
        chunks = []
        for _ in range(reps):
            if s.handle in self._callbacks:
                arr = np.zeros(n, s.type.numpy_dtype)
                self._callbacks[s.handle](arr)
            else:
                buf = self._streams[s.handle].reshape(-1)
                p = self._stream_pos[s.handle]
                arr = buf[p:p + n]
                self._stream_pos[s.handle] = (p + n) % buf.size
            chunks.append(_to_torch(np.asarray(arr), s.type).reshape(-1))
        return torch.stack(chunks) if reps > 1 else chunks[0].reshape(1, -1).expand(replicas, -1)

    def _stream_push(self, s: DataStream, value: torch.Tensor) -> None:
        n = s.numElements
        for r in range(value.shape[0]):
            arr = _to_numpy(value[r].reshape(-1), s.type)
            if s.handle in self._callbacks:
                self._callbacks[s.handle](arr)
            else:
                buf = self._streams[s.handle].reshape(-1)
                p = self._stream_pos[s.handle]
                buf[p:p + n] = arr
                self._stream_pos[s.handle] = (p + n) % buf.size

    def _remote(self, rb: RemoteBuffer, replicas: int) -> torch.Tensor:
        if rb.handle not in self._remote:
            self._remote[rb.handle] = torch.zeros(replicas, rb.repeats, rb.numElements, dtype=rb.type.torch_dtype)
        return self._remote[rb.handle]

    def copyToRemoteBuffer(self, src, handle: str, repeat_index: int = 0, replication_index: int = 0):  # noqa: N802
        rb = self.graph._state.remote_buffers[handle]
        store = self._remote(rb, self.graph._state.replication_factor)
        store[replication_index, repeat_index] = _to_torch(np.asarray(src).reshape(-1), rb.type)

    def copyFromRemoteBuffer(self, handle: str, dst, repeat_index: int = 0, replication_index: int = 0):  # noqa: N802
        rb = self.graph._state.remote_buffers[handle]
        store = self._remote(rb, self.graph._state.replication_factor)
        dst.reshape(-1)[:] = _to_numpy(store[replication_index, repeat_index], rb.type)
        return dst

    # -- profiling ------------------------------------------------------------------------
    def getEngineOptions(self) -> OptionFlags:  # noqa: N802
        return OptionFlags(self.options)

    def printProfileSummary(self, out=None, options=None) -> None:  # noqa: N802
        """Print Poplar's profile summary (Target, Graph, Memory Usage, Execution) to ``out``."""
        from openipu.poplar.profile import profile_summary
        (out or sys.stdout).write(profile_summary(self.graph, self._compiled, self, dict(options or {})))

    def getProfile(self) -> dict:  # noqa: N802
        """The profile as a dict (what ``autoReport`` writes to ``profile.json``)."""
        from openipu.poplar.profile import profile_dict
        return profile_dict(self.graph, self._compiled, self)

    def reportTiming(self, out=None) -> None:  # noqa: N802
        (out or sys.stdout).write(f"Host wall time running programs: {self.host_seconds:.6f} s; "
                                  f"compile: {self._compiled.compile_seconds:.6f} s\n")

    @property
    def compile_seconds(self) -> float:
        """Host wall time the compilation took (seconds)."""
        return self._compiled.compile_seconds

    @property
    def memory(self):
        """The tile memory plan (:class:`openipu.poplar.memory.MemoryPlan`)."""
        return self._compiled.memory

    def serializeExecutable(self, f) -> None:  # noqa: N802
        self._exe.serialize(f)


def _to_torch(arr: np.ndarray, t) -> torch.Tensor:
    a = np.ascontiguousarray(arr)
    if t.is_float:
        return torch.from_numpy(a.astype(np.float32, copy=False)).to(t.torch_dtype)
    if a.dtype == np.bool_:
        return torch.from_numpy(a).to(t.torch_dtype)
    return t.wrap(torch.from_numpy(a.astype(np.int64)))


def _to_numpy(v: torch.Tensor, t) -> np.ndarray:
    if t.name == "quarter":
        return v.to(torch.float32).numpy()
    return v.detach().cpu().numpy().astype(t.numpy_dtype)  # a copy: later runs must not change what the host read


def format_tensor(title: str, value: torch.Tensor, type_) -> str:
    """Poplar's ``PrintTensor`` text: ``title: [1.0000000 1.5000000]``; rank >= 2 puts each row on
    its own line, indented two spaces per level. Floats get 8 significant digits."""
    arr = value.to(torch.float32).numpy() if type_.is_float else value.numpy()

    def fmt(x):
        if type_.is_float:
            return np.format_float_positional(x, precision=7, unique=False, trim="k") if abs(x) < 1e8 and (abs(x) >= 1e-4 or x == 0) else f"{x:.7e}"
        return str(int(x))

    def rec(a, indent):
        if a.ndim <= 1:
            return "[" + " ".join(fmt(x) for x in a.reshape(-1)) + "]"
        inner = "\n".join(" " * (indent + 2) + rec(x, indent + 2) for x in a)
        return "[\n" + inner + "\n" + " " * indent + "]"

    prefix = f"{title}: " if title else ""
    return prefix + rec(arr, 0)
