"""The executable: a compiled graph as a tree of steps, and what runs them (``poplar::Executable``).

:mod:`openipu.poplar.graph_compiler` turns programs into this tree; every leaf step carries its
predicted :class:`~openipu.poplar.cost.StepCost`. Running a program walks the tree: each leaf
runs functionally (vertex groups through their torch kernels, user codelets under
``torch.vmap``) and advances one predicted clock per IPU (a step on several IPUs first aligns
their clocks: an external sync). An :class:`Executable` holds the tree with its graph and
programs, and serialises them.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from openipu.poplar import cost as costmod
from openipu.poplar import errors
from openipu.poplar.graph import DataStream, HostFunction, RemoteBuffer
from openipu.poplar.options import engine_options, get_logger
from openipu.poplar.storage import Accessor
from openipu.poplar.tensor import Tensor

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


def _costlier(ctx, branches) -> None:
    """Dry run (no data to choose with): take the branch that ends latest on the predicted clock."""
    best = None
    for b in branches:
        sub = _RunCtx()
        sub.engine, sub.storage, sub.dry, sub.out = ctx.engine, None, True, ctx.out
        sub.clock, sub.counts = ctx.clock.copy(), ctx.counts.copy()
        sub.trace, sub.trace_limit, sub.global_sync = ([] if ctx.trace is not None else None), ctx.trace_limit, ctx.global_sync
        b.run(sub)
        if best is None or sub.clock.max() > best.clock.max():
            best = sub
    ctx.clock[:], ctx.counts[:] = best.clock, best.counts
    if ctx.trace is not None:
        ctx.trace.extend(best.trace[:max(0, ctx.trace_limit - len(ctx.trace))])


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
        if not ctx.dry:
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
        if ctx.dry:              # no values to test: the condition, one pass of the body, the condition
            for node in (self.cond, self.branch, self.body, self.cond, self.branch):
                _advance(ctx, node) if node is self.branch else node.run(ctx)
            return
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
        if ctx.dry:
            _advance(ctx, self.branch)
            _costlier(ctx, [self.then, self.other])
            return
        v = self.branch.value(ctx)
        _advance(ctx, self.branch)
        (self.then if v else self.other).run(ctx)


class _Switch:
    def __init__(self, branch, cases: dict, default):
        self.branch, self.cases, self.default = branch, cases, default

    def run(self, ctx):
        if ctx.dry:
            _advance(ctx, self.branch)
            _costlier(ctx, list(self.cases.values()) + [self.default])
            return
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

    def __init__(self, kernel, reads=(), writes=(), name=""):
        self.kernel = kernel
        self.accessors: dict[int, Accessor] = {}
        self.allowed = None
        if CHECK_ACCESS:
            self.allowed = (_declared([(t,) for t in list(reads) + list(writes)]), _declared([(t,) for t in writes]),
                            name or "Collective")

    def run(self, ctx):
        pending = []
        self.kernel(_KernelCtx(ctx.storage, pending, self.accessors, self.allowed))
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
#: ``OPENIPU_CHECK_ACCESS=1``: every kernel may only read and write the variables its vertex
#: group declares (its reads and writes). The memory plan's liveness, and so the sharing of
#: storage between variables, rests on those declarations; the test suite turns this on.
CHECK_ACCESS = os.environ.get("OPENIPU_CHECK_ACCESS", "") not in ("", "0")


def _declared(items) -> frozenset:
    out = set()
    for r in items:
        t = r.tensor if hasattr(r, "tensor") else r[0]
        out.update(t.variable_ids().tolist())
    return frozenset(out)


class _GroupRunner:
    """Runs a library :class:`VertexGroup` through its kernel."""

    def __init__(self, group):
        self.group = group
        self.accessors: dict[int, Accessor] = {}   # the kernel's tensors live as long as the group
        self.allowed = None
        if CHECK_ACCESS:
            self.allowed = (_declared(group.reads) | _declared(group.writes), _declared(group.writes), group.type_name)

    def compute(self, ctx):
        out = []
        self.group.kernel(_KernelCtx(ctx.storage, out, self.accessors, self.allowed))
        return out


class _KernelCtx:
    """What a library kernel sees: ``read(t)`` -> torch [replicas, *shape]; ``write(t, v)``."""

    __slots__ = ("storage", "pending", "accessors", "allowed")

    def __init__(self, storage, pending, accessors, allowed=None):
        self.storage, self.pending, self.accessors, self.allowed = storage, pending, accessors, allowed

    def _check(self, t: Tensor, write: bool) -> None:
        ok = self.allowed[1] if write else self.allowed[0]
        extra = set(t.variable_ids().tolist()) - ok
        if extra:
            names = [t._state.variables[i].name for i in sorted(extra)]
            raise errors.poplar_error(
                f"Vertex group '{self.allowed[2]}' {'writes' if write else 'reads'} variable(s) {names} that it does "
                "not declare in its VertexGroup reads/writes (the memory plan would not keep them live)")

    @property
    def replicas(self):
        return self.storage.replicas

    def _acc(self, t: Tensor) -> Accessor:
        acc = self.accessors.get(id(t))
        if acc is None:
            acc = self.accessors[id(t)] = Accessor(t)
        return acc

    def read(self, t: Tensor) -> torch.Tensor:
        if self.allowed is not None:
            self._check(t, False)
        return self._acc(t).read(self.storage)

    def write(self, t: Tensor, value) -> None:
        if self.allowed is not None:
            self._check(t, True)
        self.pending.append((self._acc(t), value))


class _IndexAcc:
    """Read / write a [vertices, n] matrix of element addresses of one space (user vertex fields,
    small): the addresses become buffer positions when a storage is first used."""

    __slots__ = ("key", "addr", "shape", "type", "_bound", "_index")

    def __init__(self, type_, addr: np.ndarray):
        self.key, self.type = type_.space, type_
        self.shape = addr.shape
        self.addr = np.ascontiguousarray(addr.reshape(-1))
        self._bound = self._index = None

    def index(self, storage) -> torch.Tensor:
        if self._bound is not storage:
            self._index = torch.from_numpy(storage.host_positions(self.key, self.addr))
            self._bound = storage
        return self._index

    def read(self, storage) -> torch.Tensor:
        return storage.bufs[self.key].index_select(1, self.index(storage)).reshape((storage.replicas,) + self.shape)

    def write(self, storage, value):
        buf = storage.bufs[self.key]
        value = value.reshape(storage.replicas, -1)
        buf[:, self.index(storage)] = self.type.wrap(value) if self.type.wrap_bits or value.dtype != buf.dtype else value


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


class _RunCtx:
    """The state of one run: storage, one predicted clock per IPU, step counts and trace. ``dry``:
    an offline prediction (no storage, no kernels; data-dependent control flow resolved without
    data: ``If``/``Switch`` take their costliest branch, ``RepeatWhile*`` bodies run once)."""

    __slots__ = ("engine", "storage", "clock", "counts", "trace", "trace_limit", "global_sync", "out", "dry")



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


# ----------------------------------------------------------------------------------------------
# executable
# ----------------------------------------------------------------------------------------------
class _Compiled:
    pass


#: Modules whose vertex kernels a Poplar executable file may name (imported before reading one).
_KERNEL_MODULES = ("openipu.poplibs.popops", "openipu.poplibs.poplin", "openipu.poplibs.popnn",
                   "openipu.poplibs.poprand", "openipu.poplibs.poputil", "openipu.poplibs.gcl", "openipu.poplar.quarter")


class Executable:
    """A compiled graph and programs (``poplar::Executable``); ``serialize`` / ``deserialize``.

    The simulator's executable holds the graph description and programs; loading it compiles
    the steps again (quick) so that the file does not depend on openipu's internal objects.
    """

    def __init__(self, graph, programs: list, options=None, progress=None):
        # the graph compiler builds the step tree this module defines; imported on use so that
        # the module graph stays acyclic (graph_compiler -> executable)
        from openipu.poplar.graph_compiler import compile_programs
        self.graph, self.programs, self.options = graph, programs, dict(options or {})
        self.compiled = compile_programs(graph, programs, engine_options(options), progress)

    def serialize(self, f) -> None:
        """Write the graph and programs to a binary file object or a path in openipu's executable
        format (:mod:`openipu.poplar.exefile`, records of :mod:`openipu.poplar.graph_codec`; no
        pickle, nothing that names code). Raises ``poplar_error`` (``executable_file_error``) if a
        vertex kernel or one of its arguments has no record kind (a lambda or local function)."""
        from openipu.poplar import exefile, graph_codec
        try:
            members = graph_codec.to_members((self.graph, self.programs, dict(self.options)))
            exefile.write(f, "poplar.Executable", members, {"programs": len(self.programs)})
        except exefile.executable_file_error as e:
            raise exefile.executable_file_error(f"Cannot serialise the executable: {e}") from None

    @staticmethod
    def deserialize(f) -> "Executable":
        """Read an executable written by :meth:`serialize` (a path or a binary file object) and
        compile its programs again.

        User codelets are taken from those this process has loaded (``Graph.addCodelets``), as
        Poplar's executables need their codelets' library. Raises ``poplar_error``
        (``executable_file_error``) for a file that is missing, truncated, corrupt, modified (hash
        mismatch), over the size bounds, of another format version, or holding records this
        openipu does not know; nothing from the file is executed or imported."""
        import importlib

        from openipu.poplar import exefile, graph_codec
        for m in _KERNEL_MODULES:      # the registries of PopLibs' vertex kernels (fixed names)
            importlib.import_module(m)
        contents = exefile.read(f, "poplar.Executable")
        obj = graph_codec.from_contents(contents)
        if not (isinstance(obj, tuple) and len(obj) == 3 and isinstance(obj[1], list) and isinstance(obj[2], dict)):
            raise exefile.executable_file_error(f"'{contents.fname}' does not hold (graph, programs, options)")
        from openipu.poplar.graph import Graph
        if not isinstance(obj[0], Graph):
            raise exefile.executable_file_error(f"'{contents.fname}' does not hold a graph")
        return Executable(*obj)

    @staticmethod
    def from_compiled(graph, programs, options, compiled) -> "Executable":
        """An executable from its parts, with its step tree already compiled (as read from a file:
        loading skips compiling the programs again)."""
        if not isinstance(compiled, _Compiled):
            raise errors.poplar_error(f"Not a compiled step tree: {type(compiled).__name__}")
        exe = Executable.__new__(Executable)
        exe.graph, exe.programs, exe.options, exe.compiled = graph, programs, dict(options or {}), compiled
        return exe
