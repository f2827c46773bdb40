"""``poplar::Engine``: load a compiled graph onto a device, run its programs, move data.

Constructing an Engine compiles the graph and programs (:mod:`openipu.poplar.graph_compiler`
builds an :class:`~openipu.poplar.executable.Executable`); ``load`` allocates the device memory
(:class:`~openipu.poplar.storage.Storage`); ``run`` walks a program's step tree. Streams, host
reads and writes, remote buffers and host functions connect the host to it, and the profile
methods report what the cost model predicted.

Predicted cycles (IPU time) and host wall time are kept apart: the profile reports the former,
:attr:`Engine.host_seconds` the latter.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import numpy as np
import torch

from openipu.poplar import errors
from openipu.poplar.executable import Executable, _RunCtx, _to_numpy, _to_torch, format_tensor  # noqa: F401
from openipu.poplar.graph import DataStream, RemoteBuffer
from openipu.poplar.graph_compiler import FieldData, VertexIntrospector, VertexPerfEstimate, compileGraph  # noqa: F401
from openipu.poplar import program as P
from openipu.poplar import hostmem, pvti
from openipu.poplar.options import OptionFlags, engine_options
from openipu.poplar.storage import Accessor, Storage
from openipu.poplar.tensor import Tensor


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
            with pvti.span("Engine: compile graph and programs", "poplar"):
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
        self._dry_runs: dict = {}          # (program, traced) -> a dry run's clocks, counts, trace
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
        hostmem.bound_heap_retention()      # the runs' freed temporaries go back to the OS
        with pvti.span("Engine: load (allocate device memory)", "poplar"):
            self._storage = Storage(self.graph._state, self.graph._state.replication_factor,
                                    self._compiled.memory.host_layout)

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
        a, b = self._program_range(index)
        for st in self._compiled.compiler.steps[a:b]:
            h = getattr(getattr(st, "stream", None), "handle", None)
            if h is not None and h not in self._streams and h not in self._callbacks:
                raise errors.stream_connection_error(
                    f"Stream '{h}' is not connected to a host buffer: call engine.connectStream('{h}', buffer) "
                    "(or connectStreamToCallback) before engine.run")
        self._walk(index, name, dry=False)

    def predict_run(self, index: int = 0, name: str = "") -> int:
        """Predict a run of program ``index`` without running it: no device memory, no kernels,
        no streams (an offline compile's prediction). Data-dependent control flow is resolved
        without data: ``If`` and ``Switch`` take their costliest branch and ``RepeatWhileTrue`` /
        ``RepeatWhileFalse`` run their body once. The run is recorded in the profile like a real
        one. Returns the predicted IPU cycles (max over IPUs). openipu extension."""
        self._program_range(index)
        self._walk(index, name, dry=True)
        return self.last_run_cycles

    def _program_range(self, index: int):
        roots = self._compiled.roots
        if not 0 <= index < len(roots):
            raise errors.index_error(f"Program index {index} out of range: the engine has {len(roots)} programs")
        return self._compiled.prog_ranges[index]

    def _walk(self, index: int, name: str, dry: bool) -> None:
        ctx = _RunCtx()
        ctx.engine = self
        ctx.storage = None if dry else self._storage
        ctx.dry = dry
        ctx.clock = np.zeros(self._spec.num_ipus)
        ctx.counts = np.zeros(len(self._compiled.compiler.steps), np.int64)
        ctx.trace = [] if self._profiling else None
        ctx.trace_limit = 100_000
        ctx.global_sync = float(self._spec.global_sync_cycles)
        ctx.out = self._out
        traced = pvti.enabled()
        if traced and ctx.trace is None:
            ctx.trace = []
        start_us = pvti.now_us() if traced else 0.0
        t0 = time.perf_counter()
        with pvti.span(f"Engine: run program {index}{' ' + name if name else ''}", "poplar", dry=dry):
            # a dry run has no data to depend on: its clocks, counts and trace are those of the
            # previous dry run of the program (recorded once, then reused)
            key = (index, ctx.trace is not None)
            dry_runs = self.__dict__.setdefault("_dry_runs", {})
            cached = dry_runs.get(key) if dry else None
            if cached is not None:
                ctx.clock[:], ctx.counts[:] = cached[0], cached[1]
                if ctx.trace is not None:
                    ctx.trace.extend(cached[2])
            else:
                self._compiled.roots[index].run(ctx)
                if dry:
                    dry_runs[key] = (ctx.clock.copy(), ctx.counts.copy(),
                                           list(ctx.trace) if ctx.trace is not None else None)
        dt = time.perf_counter() - t0
        if traced:
            self._trace_ipu_timeline(start_us, ctx.trace, name or f"program {index}")
        self.host_seconds += dt
        if self._profiling:
            self._counts += ctx.counts
            self._runs.append({"program": index, "name": name, "cycles_per_ipu": ctx.clock.copy(),
                               "counts": ctx.counts, "trace": ctx.trace, "host_seconds": dt, "dry": dry})
        if self.options.get_bool("autoReport.all") or self.options.get_bool("autoReport.outputExecutionProfile"):
            from openipu.poplar.profile import write_profile
            self.profile_path = write_profile(self.options.get("autoReport.directory", "./"), self.graph,
                                              self._compiled, self)

    def _trace_ipu_timeline(self, start_us: float, trace, run_name: str) -> None:
        """Hand a run's predicted steps to the System Analyser trace: one event per step and IPU
        that the step occupies, from the previous step's end (predicted cycles)."""
        steps = self._compiled.compiler.steps
        out, prev = [], 0.0
        for idx, end in trace[:pvti.MAX_IPU_STEPS_PER_RUN]:
            st = steps[idx]
            for ipu in np.flatnonzero(st.total > 0).tolist():
                out.append((st.name, st.kind, ipu, prev, float(st.total[ipu])))
            prev = end
        pvti.ipu_timeline(start_us, self._spec.clock_hz, out, run_name)

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
        if pvti.enabled():
            with pvti.span(f"StreamCopy host->IPU {s.handle}", "stream", bytes=s.numElements * s.type.size):
                return self._stream_pull_(s, replicas)
        return self._stream_pull_(s, replicas)

    def _stream_pull_(self, s: DataStream, replicas: int) -> torch.Tensor:
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
        if pvti.enabled():
            with pvti.span(f"StreamCopy IPU->host {s.handle}", "stream", bytes=s.numElements * s.type.size):
                return self._stream_push_(s, value)
        return self._stream_push_(s, value)

    def _stream_push_(self, s: DataStream, value: torch.Tensor) -> None:
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
        """The profile as a plain dict (target, memory per tile, liveness, steps, execution);
        ``autoReport`` writes the same facts to ``profile.pop`` (read it with ``pva.openReport``)."""
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


