"""``poprt.runtime``: load a compiled executable and run it (PopRT's ``Runner``, Model Runtime's
``ModelRunner``), on the simulated IPU.

``Runner(path_or_executable, RuntimeConfig())`` loads an executable written by
``Compiler.compile_and_export`` or takes one from ``Compiler.compile``. ``execute`` fills the
caller's output arrays; ``execute_async`` / ``executeAsync`` return a future (``wait()``).
``RuntimeConfig.batching_dim`` turns on dynamic batch: inputs of any batch are split into
compiled batches (the last one padded) and the outputs joined. :class:`PackRunner` collects
single-sample requests from many threads into compiled batches; in packed mode several
variable-length sequences share one row (packed BERT; see its docstring).

``batches_per_step`` (PopRT's call contract, user guide "Overlap I/O" and "Quick start"): one
``execute`` takes ONE compiled batch, with the descriptor shapes (never ``batches_per_step`` times
larger); throughput comes from concurrent callers. The compiled program still loops over
``batches_per_step`` batches per step on the device. The runner maps calls onto steps as PopRT's
runtime does: a device thread starts a step when a request is queued; each iteration of the
step's loop takes the next queued request when it reads its inputs (host-to-device stream
callbacks) and completes that request when it writes its outputs, so a caller returns as soon as
its own batch is done, not at the end of the step. When no request arrives for ``timeout_ns``
(the flush), the step ends there (on the simulator the rest of the loop is not run); an
iteration that must run while earlier batches are still in flight (a pipelined program reads
ahead) gets a batch of zeros. With ``batches_per_step = 1`` each call is one step.

Inputs whose size is ``k`` times the descriptor's (``[k, *shape]``, or ``k * batch`` rows) are ``k``
batches, run in turn, the outputs joined (Model Runtime's rule when dynamic batch is off).

Two kinds of figures, kept apart: ``runner.predicted`` holds predicted IPU figures (cycles,
latency in IPU seconds, QPS) from the cost model; ``runner.host_stats()`` measures this machine
running the simulation (host seconds).
"""

from __future__ import annotations

import copy
import datetime
import enum
import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future as _CFuture
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from openipu.poplar import exefile
from openipu.poprt.compiler import Executable, TensorDesc


class PopRTRuntimeError(RuntimeError):
    """PopRT runtime errors (a ``RuntimeError``, as PopRT's binding raises): bad inputs or outputs,
    a bad executable file, a closed runner."""


_log = logging.getLogger("poprt.runtime")


class DataDesc:
    """A model input or output as PopRT's runtime describes it (``InputDesc`` / ``OutputDesc``).

    Attributes:
        name: the tensor name.
        shape: list of ints, one compiled batch (never times ``batches_per_step``); a fresh list at
            each read, so callers may change it (Byte MLPerf sets ``shape[0] = 1``).
        size_in_bytes: bytes of one batch.
        popef_contains_tensor_data: False (weights are not inputs here).
    Methods: ``numpy_data_type()`` (the numpy scalar type, e.g. ``numpy.float16``).
    Source: PopRT 1.4 user guide, "C++ API" (``DataDesc``) and "Python API" (``Runner``).
    """

    __slots__ = ("name", "_shape", "_dtype", "size_in_bytes", "popef_contains_tensor_data")

    def __init__(self, name: str, shape, dtype):
        self.name = name
        self._shape = tuple(int(d) for d in shape)
        self._dtype = np.dtype(dtype)
        self.size_in_bytes = int(np.prod(self._shape, dtype=np.int64)) * self._dtype.itemsize
        self.popef_contains_tensor_data = False

    @property
    def shape(self) -> list:
        return list(self._shape)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def data_type(self) -> str:
        return self._dtype.name

    @property
    def size(self) -> int:
        return self.size_in_bytes

    def numpy_data_type(self):
        return self._dtype.type

    def __repr__(self):
        return f"DataDesc(name={self.name!r}, shape={list(self._shape)}, dtype={self._dtype.name})"


class InputMemoryView(dict):
    """PopRT's ``InputMemoryView``: input arrays by name (a ``dict``), accepted by ``execute``
    wherever a dict is. The arrays are read, not kept, and must hold one batch each (or ``k``
    batches). Source: PopRT 1.1/1.2 user guide, "Python API" (``runner.execute(InputMemoryView,
    OutputMemoryView)``)."""


class OutputMemoryView(dict):
    """PopRT's ``OutputMemoryView``: writable output arrays by name (a ``dict``); ``execute``
    writes the results into them."""


def _case_hint(path) -> str:
    """For a missing file, a note naming a file of the same name in another letter case (Byte
    MLPerf's IPU backend writes ``executable_fp16.popef`` and loads ``executable_FP16.popef`` when
    the precision comes from its compile step rather than from the user)."""
    p = os.fspath(path)
    d, name = os.path.split(p)
    if os.path.exists(p) or not os.path.isdir(d or "."):
        return ""
    alike = [f for f in os.listdir(d or ".") if f.lower() == name.lower()]
    return f" ('{alike[0]}' is there: file names are case-sensitive)" if alike else ""


def _timeout_seconds(v) -> float:
    """``RuntimeConfig.timeout_ns`` in seconds (an int of nanoseconds or a ``datetime.timedelta``)."""
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    return float(v) / 1e9


class DeviceManager:
    """``poprt.runtime.DeviceManager()``: the (simulated) IPUs this host has.

    ``ipu_hardware_version()`` is ``"ipu21"`` (a C600 card) unless ``target=`` says otherwise;
    ``get_num_devices()`` is the number of IPUs of the card (1).
    """

    def __init__(self, target: str = "ipu21", num_devices: int = 1):
        self.target, self._n = target, int(num_devices)

    def ipu_hardware_version(self) -> str:
        return self.target

    def get_num_devices(self) -> int:
        return self._n

    def get_device(self, device_id: int = 0, num_ipus: int = 1):
        """A simulated device of ``num_ipus`` IPUs of this target (an openipu Poplar device)."""
        from openipu.ipu import target as ipu_target
        from openipu.poplar.device import IPUModel
        if not 0 <= device_id < self._n:
            raise PopRTRuntimeError(f"No device with id {device_id}: this host has {self._n}")
        m = IPUModel(self.target)
        m.numIPUs = num_ipus
        m.tilesPerIPU = ipu_target(self.target).tiles_per_ipu
        return m.createDevice()


class RuntimeConfig:
    """``poprt.runtime.RuntimeConfig()``.

    Fields: ``batching_dim`` (-1: off; else the dimension of every input and output along which
    batches of any size are split into compiled batches, the last one padded with zeros),
    ``timeout_ns`` (10 ms, PopRT's default; an int of nanoseconds or a ``datetime.timedelta``):
    with ``batches_per_step > 1``, how long a step waits for the next request before it ends
    (the flush; see the module docstring); 0 waits without a limit,
    ``validate_io_params`` (True: check names, shapes and dtypes of ``execute``'s arrays),
    ``check_package_hash`` (True: the executable file's SHA-256 check; it is always done),
    ``replica_to_device``, ``ring_buffer_size_multiplier`` (accepted and stored).
    """

    def __init__(self, **kw):
        self.batching_dim = -1
        self.timeout_ns = 10_000_000
        self.validate_io_params = True
        self.check_package_hash = True
        self.replica_to_device = {}
        self.ring_buffer_size_multiplier = 2
        self.device_wait_config = None
        for k, v in kw.items():
            if not hasattr(self, k):
                raise AttributeError(f"'poprt.runtime.RuntimeConfig' object has no attribute '{k}'")
            setattr(self, k, v)


class Future:
    """The result of ``execute_async``: ``wait()`` blocks until done (raising the call's error),
    ``get()`` returns the outputs dict, ``done()`` polls."""

    def __init__(self, fut: _CFuture):
        self._f = fut

    def wait(self, timeout: float | None = None) -> None:
        self._f.result(timeout)

    def get(self, timeout: float | None = None) -> dict:
        return self._f.result(timeout)

    def done(self) -> bool:
        return self._f.done()


class Runner:
    """``poprt.runtime.Runner(executable_or_path, config=RuntimeConfig())``.

    Args:
        executable_or_path: a :class:`openipu.poprt.compiler.Executable` or the path of a file from
            ``Compiler.compile_and_export``.
        config: :class:`RuntimeConfig`.
    Raises:
        PopRTRuntimeError (a ``RuntimeError``): the file is missing, not an executable, truncated,
            modified (hash check) or of another format version.

    Attributes: ``predicted`` (predicted IPU figures, :class:`openipu.poprt.compiler.Prediction`),
    ``load_seconds`` (host seconds to load).
    """

    def __new__(cls, executable_or_path=None, config=None, *args, **kwargs):
        # Runner(path, PackRunnerConfig(...)) gives a PackRunner, as PopRT's pack mode is set up
        if cls is Runner and isinstance(config, PackRunnerConfig):
            return PackRunner(executable_or_path, config)
        return super().__new__(cls)

    def __init__(self, executable_or_path, config: RuntimeConfig | None = None, device_manager=None):
        t0 = time.perf_counter()
        if isinstance(executable_or_path, Executable):
            exe = executable_or_path
        elif isinstance(executable_or_path, (str, os.PathLike)):
            try:
                exe = Executable.load(executable_or_path)
            except exefile.executable_file_error as e:
                raise PopRTRuntimeError(f"Cannot load the executable: {e}{_case_hint(executable_or_path)}") from None
        else:
            raise TypeError(f"Runner takes an Executable or a path, not {type(executable_or_path).__name__}")
        self.config = config if config is not None else RuntimeConfig()
        self.executable = exe
        self.predicted = exe.prediction
        from openipu import poplar
        from openipu.ipu import target as ipu_target
        from openipu.poplar.device import IPUModel
        low = exe.lowered
        try:
            if exe.compiled is not None:
                pexe = poplar.Executable.from_compiled(low.graph, low.programs, {}, exe.compiled)
            else:
                pexe = poplar.Executable(low.graph, low.programs, {})
            self._engine = poplar.Engine(pexe)
        except poplar.poplar_error as e:
            raise PopRTRuntimeError(f"Cannot load the executable's program: {e}") from None
        m = IPUModel(exe.target["ipu_version"])
        m.numIPUs = int(exe.target["num_ipus"])
        m.tilesPerIPU = int(exe.target.get("compute_tiles_per_ipu", ipu_target(exe.target["ipu_version"]).tiles_per_ipu))
        self._engine.load(m.createDevice())
        self._engine.disableExecutionProfiling()    # a server runs forever: keep no per-run records
        self.batches_per_step = bps = max(1, int(exe.options.get("batches_per_step", 1) or 1))
        lead = 1 if bps > 1 else 0          # the compiled step's leading batches_per_step dimension
        self._inputs = {d.name: DataDesc(d.name, list(d.shape)[lead:], d.dtype) for d in exe.inputs}
        self._outputs = {d.name: DataDesc(d.name, list(d.shape)[lead:], d.dtype) for d in exe.outputs}
        self._lock = threading.Lock()
        self._closed = False
        self._n_exec, self._host_exec_s = 0, 0.0
        if bps == 1:
            self._in_bufs = {n: np.zeros(d.shape, d.dtype) for n, d in self._inputs.items()}
            self._out_bufs = {n: np.zeros(d.shape, d.dtype) for n, d in self._outputs.items()}
            self._connect_buffers()
            self._stepper = None
        else:
            self._stepper = _Stepper(self, _timeout_seconds(self.config.timeout_ns))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="poprt-device")
        self.load_seconds = time.perf_counter() - t0

    def _connect_buffers(self) -> None:
        """Upload the weights (when they are device variables), then bind the input and output
        buffers of one batch to the streams."""
        low = self.executable.lowered
        self._upload_weights()
        for tid, h in low.inputs.items():
            if h is not None and tid in self._in_bufs:
                self._engine.connectStream(h, self._in_bufs[tid].reshape(-1))
        for tid, h in low.anchors.items():
            if h is not None and tid in self._out_bufs:
                self._engine.connectStream(h, self._out_bufs[tid].reshape(-1))

    def _upload_weights(self) -> None:
        low, exe = self.executable.lowered, self.executable
        if low.weights_in:
            for tid, h in low.weights_in.items():
                self._engine.connectStream(h, np.ascontiguousarray(exe.host_weights[tid]).reshape(-1))
            self._engine.run(1, "weightsFromHost")

    # -- descriptors ----------------------------------------------------------------------
    def get_model_inputs(self) -> list[DataDesc]:
        """Input descriptors (``name``, ``shape``: one compiled batch, ``numpy_data_type()``).
        PopRT's ``get_model_inputs``; ``get_execute_inputs`` is the same list here (no weights are
        inputs)."""
        return list(self._inputs.values())

    def get_model_outputs(self) -> list[DataDesc]:
        """Output descriptors, as :meth:`get_model_inputs`."""
        return list(self._outputs.values())

    get_execute_inputs = get_model_inputs
    get_execute_outputs = get_model_outputs
    getExecuteInputs = get_model_inputs    # noqa: N815 - the C++ API's spelling
    getExecuteOutputs = get_model_outputs  # noqa: N815

    @property
    def batch_size(self) -> int:
        return self.predicted.batch_size

    # -- running --------------------------------------------------------------------------
    def _check(self, inputs: dict, outputs: dict | None, dynamic: bool) -> int:
        """Validate the call; returns ``k``, the number of compiled batches the inputs hold
        (1 with dynamic batch, which splits them itself)."""
        if self._closed:
            raise PopRTRuntimeError("The runner is closed")
        if not isinstance(inputs, dict):
            raise PopRTRuntimeError(f"inputs must be a dict of numpy arrays by input name, not {type(inputs).__name__}")
        missing = [n for n in self._inputs if n not in inputs]
        unknown = [n for n in inputs if n not in self._inputs]
        if missing or unknown:
            raise PopRTRuntimeError(f"Inputs {missing} are missing and {unknown} are not inputs of the model; its inputs "
                                    f"are {list(self._inputs)}")
        if outputs is not None:
            bad = [n for n in outputs if n not in self._outputs]
            if bad:
                raise PopRTRuntimeError(f"Outputs {bad} are not outputs of the model; its outputs are {list(self._outputs)}")
        if dynamic:
            if self.config.validate_io_params:
                dim = self.config.batching_dim
                for n, d in self._inputs.items():
                    a, want = np.asarray(inputs[n]), d.shape
                    if a.ndim != len(want) or [s for i, s in enumerate(a.shape) if i != dim] != \
                            [s for i, s in enumerate(want) if i != dim]:
                        raise PopRTRuntimeError(f"Input '{n}' has shape {list(a.shape)}; the model wants {want} with "
                                                f"any size in dimension {dim} (batching_dim)")
            return 1
        ks = set()
        for n, d in self._inputs.items():
            a = np.asarray(inputs[n])
            one = max(int(np.prod(d.shape)), 1)
            if a.size == 0 or a.size % one:
                raise PopRTRuntimeError(f"Input '{n}' has shape {list(a.shape)}; the model wants {d.shape} (or a "
                                        f"whole number of such batches)")
            ks.add(a.size // one)
        if len(ks) > 1:
            raise PopRTRuntimeError(f"The inputs hold different numbers of compiled batches ({sorted(ks)})")
        return ks.pop() if ks else 1

    def _run_step(self, feeds: dict) -> dict:
        """One compiled batch, ``batches_per_step == 1``: copy in, run, copy out (the device lock held)."""
        with self._lock:
            t0 = time.perf_counter()
            for n, a in feeds.items():
                buf = self._in_bufs[n]
                np.copyto(buf, np.asarray(a).reshape(buf.shape), casting="unsafe")
            self._engine.run(0, "step")
            out = {n: b.copy() for n, b in self._out_bufs.items()}
            self._host_exec_s += time.perf_counter() - t0
            self._n_exec += 1
        return out

    def _submit(self, feeds: dict) -> _CFuture:
        """Queue one compiled batch; the future's result is ``{output name: array}``."""
        if self._stepper is not None:
            return self._stepper.submit(feeds)
        return self._pool.submit(self._run_step, feeds)

    def _run_one(self, feeds: dict) -> dict:
        """Run one compiled batch (``feeds`` by input name, descriptor-sized arrays) and return its
        outputs (new arrays of the descriptor shapes). Blocks; thread-safe."""
        if self._stepper is None:
            return self._run_step(feeds)
        return self._stepper.submit(feeds).result()

    def _chunks(self, inputs: dict, k: int, dynamic: bool):
        """The compiled batches of a call: ``[(feeds, rows)]`` (rows: valid rows of a padded
        dynamic batch, else None)."""
        if dynamic:
            return list(self._dynamic_chunks(inputs, self.config.batching_dim))
        if k == 1:
            return [(inputs, None)]
        flat = {n: np.asarray(a).reshape(k, -1) for n, a in inputs.items()}
        return [({n: f[i] for n, f in flat.items()}, None) for i in range(k)]

    def _dynamic_chunks(self, inputs: dict, dim: int):
        sizes = {np.asarray(a).shape[dim] for a in inputs.values()}
        if len(sizes) != 1:
            raise PopRTRuntimeError(f"With batching_dim={dim} every input needs the same size in that dimension; got "
                                    f"{sorted(sizes)}")
        (n_total,) = sizes
        cb = next(iter(self._inputs.values())).shape[dim]
        for start in range(0, n_total, cb):
            stop = min(start + cb, n_total)
            feeds = {}
            for n, a in inputs.items():
                part = np.take(np.asarray(a), np.arange(start, stop), axis=dim)
                if stop - start < cb:
                    pad = [(0, 0)] * part.ndim
                    pad[dim] = (0, cb - (stop - start))
                    part = np.pad(part, pad)
                feeds[n] = part
            yield feeds, stop - start

    def _join(self, inputs: dict, chunks, results: list, k: int, dynamic: bool) -> dict:
        if dynamic:
            dim = self.config.batching_dim
            return {n: np.concatenate([np.take(r[n], np.arange(rows), axis=dim) for r, (_f, rows)
                                       in zip(results, chunks)], axis=dim) for n in self._outputs}
        if k == 1:
            return results[0]
        first = np.asarray(next(iter(inputs.values())))
        d0 = next(iter(self._inputs.values())).shape
        stacked = list(first.shape) == [k] + list(d0)    # [k, *shape]: outputs [k, *shape] too
        return {n: np.stack([r[n] for r in results]) if stacked else np.concatenate([r[n] for r in results])
                for n in self._outputs}

    def _write(self, res: dict, outputs: dict | None) -> dict:
        if outputs is None:
            return res
        for n, dst in outputs.items():
            src = res[n]
            if not isinstance(dst, np.ndarray) or not dst.flags.writeable:
                raise PopRTRuntimeError(f"Output '{n}' must be a writeable numpy array")
            if dst.size != src.size:
                raise PopRTRuntimeError(f"Output '{n}' has shape {list(dst.shape)}; the result has {list(src.shape)}")
            np.copyto(dst, src.reshape(dst.shape), casting="unsafe")
        return outputs

    def _start(self, inputs: dict, outputs: dict | None):
        dim = self.config.batching_dim
        dynamic = dim is not None and dim >= 0
        k = self._check(inputs, outputs, dynamic)
        chunks = self._chunks(inputs, k, dynamic)
        futs = [self._submit(f) for f, _rows in chunks]
        return futs, (inputs, chunks, k, dynamic, outputs)

    def _finish(self, futs, ctx) -> dict:
        inputs, chunks, k, dynamic, outputs = ctx
        results = [f.result() for f in futs]
        return self._write(self._join(inputs, chunks, results, k, dynamic), outputs)

    def execute(self, inputs: dict, outputs: dict | None = None) -> dict:
        """Run one compiled batch (or ``k`` of them, see the module docstring) and wait for it.

        Args:
            inputs: ``{name: array}`` (a dict or :class:`InputMemoryView`); each array holds one
                batch of the descriptor's shape (any layout of that size; cast to the descriptor
                dtype).
            outputs: ``{name: writable array}`` (a dict or :class:`OutputMemoryView`) the results
                are copied into (any layout of the right size); None: new arrays are returned.
        Returns:
            ``outputs`` (or a new dict of arrays).
        Raises:
            PopRTRuntimeError: missing, unknown or misshaped arrays, a closed runner.
        Thread-safe: concurrent callers share the device (with ``batches_per_step > 1`` their
        batches share steps). Source: PopRT 1.4 user guide, "Python API" (``Runner.execute``).
        """
        futs, ctx = self._start(inputs, outputs)
        return self._finish(futs, ctx)

    def execute_async(self, inputs: dict, outputs: dict | None = None) -> Future:
        """Queue :meth:`execute` and return at once; the :class:`Future`'s ``wait()`` blocks until
        ``outputs`` are written (raising the call's error), ``get()`` returns them. Checks the
        arguments before returning (raises as :meth:`execute`)."""
        futs, ctx = self._start(inputs, outputs)
        done = _CFuture()
        left = [len(futs)]
        lock = threading.Lock()

        def one_done(_f):
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                done.set_result(self._finish(futs, ctx))
            except Exception as e:  # noqa: BLE001 - handed to the waiter
                done.set_exception(e)
        for f in futs:
            f.add_done_callback(one_done)
        return Future(done)

    executeAsync = execute_async  # noqa: N815 - Model Runtime's spelling

    # -- figures --------------------------------------------------------------------------
    def host_stats(self) -> dict:
        """Host figures (this machine simulating the IPU): executes so far (compiled batches), host
        seconds of execution, mean host seconds per execute, and load seconds; with
        ``batches_per_step > 1`` also ``steps`` run and ``flushed_steps`` (ended by the timeout)."""
        n = self._n_exec
        out = {"executes": n, "host_seconds": self._host_exec_s, "host_seconds_per_execute": self._host_exec_s / n
               if n else 0.0, "load_seconds": self.load_seconds}
        if self._stepper is not None:       # batches_per_step > 1: steps run, and steps ended by the flush
            out.update(steps=self._stepper.steps_run, flushed_steps=self._stepper.flushes)
        return out

    def report(self) -> str:
        """Predicted IPU figures beside host figures, labelled."""
        p, h = self.predicted, self.host_stats()
        return (f"predicted IPU ({self.executable.target['ipu_version']}, batch {p.batch_size}): latency "
                f"{p.latency_seconds * 1e3:.3f} ms, {p.qps:,.0f} samples/s"
                f"{f' (overlapped I/O, {p.num_io_tiles} I/O tiles)' if p.num_io_tiles else ''}; "
                f"host simulation: {h['host_seconds_per_execute'] * 1e3:.1f} ms per execute, "
                f"load {h['load_seconds']:.2f} s")

    def close(self) -> None:
        """Stop the runner: queued requests of a step fail, the device threads end."""
        if self._closed:
            return
        self._closed = True
        if self._stepper is not None:
            self._stepper.close()
        self._pool.shutdown(wait=True)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _EndStep(Exception):
    """Raised from an input stream callback to end a step early (no request came: the flush)."""


class _Request:
    __slots__ = ("feeds", "out", "future", "t0")

    def __init__(self, feeds):
        self.feeds, self.out, self.future, self.t0 = feeds, {}, _CFuture(), time.perf_counter()


class _Stepper:
    """The device side of a Runner whose program runs ``batches_per_step`` batches a step (see the
    module docstring): a thread runs steps while requests are queued; each loop iteration of a
    step takes the next request through the input stream callbacks and completes it through the
    output stream callbacks."""

    _PAD = object()

    def __init__(self, runner: "Runner", timeout_s: float):
        self.runner, self.timeout = runner, float(timeout_s)
        eng, low = runner._engine, runner.executable.lowered
        runner._upload_weights()
        self._queue: list[_Request] = []
        self._cv = threading.Condition()
        self._stop = False
        self.steps_run = 0
        self.flushes = 0
        self._slots: dict[int, object] = {}
        self._pulls: dict[str, int] = {}
        self._pushes: dict[str, int] = {}
        for tid, h in low.inputs.items():
            if h is not None and tid in runner._inputs:
                eng.connectStreamToCallback(h, self._puller(tid))
        for tid, h in low.anchors.items():
            if h is not None and tid in runner._outputs:
                eng.connectStreamToCallback(h, self._pusher(tid))
        # the thread holds the stepper only while it runs a step, so that a runner nobody holds
        # (Byte MLPerf's ``del self.engine`` before loading the next batch size) is freed
        self._thread = threading.Thread(target=_step_loop, args=(weakref.ref(self), self._cv), name="poprt-step",
                                        daemon=True)
        self._thread.start()

    def submit(self, feeds: dict) -> _CFuture:
        req = _Request(feeds)
        with self._cv:
            if self._stop:
                raise PopRTRuntimeError("The runner is closed")
            self._queue.append(req)
            self._cv.notify_all()
        return req.future

    # -- stream callbacks (on the step thread) ----------------------------------------------
    def _slot(self, k: int):
        if k in self._slots:
            return self._slots[k]
        with self._cv:
            deadline = None if self.timeout <= 0 else time.perf_counter() + self.timeout
            while not self._queue and not self._stop:
                if self._in_flight() and self.timeout <= 0:
                    break
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    break
                self._cv.wait(left)
            if self._queue:
                self._slots[k] = self._queue.pop(0)
            elif self._in_flight():
                self._slots[k] = self._PAD       # earlier batches still running: a batch of zeros
            else:
                self.flushes += 1
                raise _EndStep()
        return self._slots[k]

    def _in_flight(self) -> bool:
        return any(r is not self._PAD and not r.future.done() for r in self._slots.values())

    def _puller(self, name: str):
        desc = self.runner._inputs[name]

        def pull(arr):
            k = self._pulls.get(name, 0)
            self._pulls[name] = k + 1
            req = self._slot(k)
            if req is self._PAD:
                arr[:] = 0
            else:
                np.copyto(arr, np.asarray(req.feeds[name]).reshape(-1), casting="unsafe")
        pull.desc = desc
        return pull

    def _pusher(self, name: str):
        shape = self.runner._outputs[name].shape

        def push(arr):
            k = self._pushes.get(name, 0)
            self._pushes[name] = k + 1
            req = self._slots.get(k)
            if req is None or req is self._PAD:
                return
            req.out[name] = np.array(arr).reshape(shape)
            if len(req.out) == len(self.runner._outputs):
                r = self.runner
                r._n_exec += 1
                r._host_exec_s += time.perf_counter() - req.t0
                req.future.set_result(req.out)
        return push

    # -- the step loop (see _step_loop) ---------------------------------------------------
    def _run_step(self):
        """Run one step of the program; requests it could not finish fail."""
        self._slots, self._pulls, self._pushes = {}, {}, {}
        err = None
        try:
            with self.runner._lock:
                self.runner._engine.run(0, "step")
        except _EndStep:
            pass
        except Exception as e:  # noqa: BLE001 - handed to the requests of this step
            err = e
        self.steps_run += 1
        left = [r for r in self._slots.values() if r is not self._PAD and not r.future.done()]
        for r in left:
            r.future.set_exception(err if err is not None else PopRTRuntimeError(
                "The step ended before this batch's outputs were written"))

    def close(self):
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with self._cv:
            for r in self._queue:
                r.future.set_exception(PopRTRuntimeError("The runner is closed"))
            self._queue = []


def _step_loop(ref, cv: threading.Condition) -> None:
    """The step thread of a :class:`_Stepper` (held by weak reference between steps)."""
    while True:
        st = ref()
        if st is None:
            return
        with cv:
            if st._stop and not st._queue:
                return
            if not st._queue:
                del st
                cv.wait(0.5)
                continue
        st._run_step()
        del st


# ----------------------------------------------------------------------------------------------
# PackRunner
# ----------------------------------------------------------------------------------------------
class PackAlgorithm(enum.Enum):
    """How :class:`PackRunner` places queued sequences into the rows of a batch: ``first_fit``
    puts each one (in arrival order) into the first row with room; ``next_fit`` only into the row
    being filled, opening the next row when it does not fit."""
    first_fit = 0
    next_fit = 1


class PackRunnerConfig:
    """``poprt.runtime.PackRunnerConfig(timeout_microseconds=..., max_valid_num=..., dynamic_input_name=...)``.

    Fields:
        timeout_microseconds: how long the oldest queued sample waits for a fuller batch (µs, host time).
        max_valid_num: most samples (sequences) in one batch, over all rows (0: no limit but the rows).
        dynamic_input_name: the input whose length is a sample's sequence length (e.g. ``input_ids``).
        algorithm: :class:`PackAlgorithm` (``first_fit`` by default).
    Methods:
        ``enable_input_single_row_mode(mask_name)``: packed mode. Several sequences share a row of
        the compiled sequence length; the ``mask_name`` input of the row holds each token's
        sequence number (1, 2, ... ; 0 for padding), which a model converted with the
        ``insert_attention_mask`` pass turns into a block-diagonal attention mask. Without it each
        sample takes a row of its own.
        ``enable_padding_remove_mode(mask_name, input_names)``: samples may come padded; a sample's
        length is the count of non-zero ``mask_name`` entries and ``input_names`` are cut to it.
    """

    def __init__(self, timeout_microseconds: int = 1000, max_valid_num: int = 0, dynamic_input_name: str = "",
                 algorithm: PackAlgorithm = PackAlgorithm.first_fit):
        self.timeout_microseconds = int(timeout_microseconds)
        self.max_valid_num = int(max_valid_num)
        self.dynamic_input_name = dynamic_input_name
        self.algorithm = algorithm
        self.single_row_input = ""
        self.unpack_info_name = ""
        self.delimiter_num = 0
        self.padding_remove_mask = ""
        self.padding_remove_inputs: list[str] = []

    def enable_input_single_row_mode(self, name: str, unpack_info_name: str = "", delimiter_num: int = 0) -> None:
        """Packed mode with ``name`` as the mask input (see the class docstring).
        ``unpack_info_name`` / ``delimiter_num`` (PopRT 1.4, the deberta model's ``Unpack`` op and
        zero delimiters between sequences) are stored; :class:`PackRunner` refuses a non-zero
        ``delimiter_num`` (not implemented)."""
        self.single_row_input = name
        self.unpack_info_name = unpack_info_name
        self.delimiter_num = int(delimiter_num)

    @property
    def algorithom(self) -> PackAlgorithm:
        """PopRT 1.1/1.2's spelling of :attr:`algorithm`."""
        return self.algorithm

    @algorithom.setter
    def algorithom(self, v: PackAlgorithm) -> None:
        self.algorithm = v

    def enable_padding_remove_mode(self, mask_name: str, input_names=()) -> None:
        self.padding_remove_mask = mask_name
        self.padding_remove_inputs = list(input_names)


class PackRunner:
    """``poprt.runtime.PackRunner(executable_or_path, PackRunnerConfig())``: a server-side batcher
    for BERT-like models fed one sample at a time (PopRT's pack runner; Byte MLPerf's pack mode).

    ``executeAsync(inputs, outputs)`` takes ONE sample and returns a :class:`Future`. The model's
    inputs are ``[B, S]`` (B rows of the compiled sequence length S); a sample gives each input as
    ``[L]`` or ``[1, L]`` with ``L <= S`` (or padded to S, with ``enable_padding_remove_mode``).
    A worker thread takes queued samples into a batch and runs it when ``max_valid_num`` samples
    are queued, when the queued tokens fill the batch, or ``timeout_microseconds`` after the
    oldest one arrived.

    Packed mode (``enable_input_single_row_mode(mask)``): samples are packed into rows by
    ``config.algorithm``, several short sequences in one row, each row padded with zeros; the mask
    input of a row holds 1 for the first sequence's tokens, 2 for the second's, ... A request
    needs the dynamic input; inputs it leaves out are filled as PopRT's pack runner does
    (``position_ids``: 0..L-1; others zeros; see :meth:`_fill_missing`; Byte MLPerf's benchmark
    sends only ``input_ids``, ``attention_mask`` and ``token_type_ids``). Outputs ``[B, S, ...]`` are cut back per
    sample (``[L, ...]`` of the row, written into the caller's ``[S, ...]``, ``[1, S, ...]`` or
    ``[L, ...]`` array, the rest zeroed); outputs without a sequence dimension (a pooled output
    ``[B, H]``) mix the sequences of a row and are not returned in this mode. Otherwise each
    sample fills one row (``[B, ...]`` inputs of any shape).

    A model converted with ``pack_args`` (``Converter(pack_args=...)``, ``poprt --pack_args``)
    brings its mask, dynamic input and ``max_valid_num``; a config that sets the single-row mask
    overrides them.

    Figures: :meth:`pack_stats` (samples, batches and rows run, token efficiency) and
    :meth:`report`: predicted IPU samples/s at the packing achieved, beside host samples/s.
    Raises :class:`PopRTRuntimeError` for a model or sample that cannot be packed.
    """

    def __init__(self, executable_or_path, config: PackRunnerConfig | None = None,
                 runtime_config: RuntimeConfig | None = None):
        self.config = cfg = config if config is not None else PackRunnerConfig()
        if int(getattr(cfg, "delimiter_num", 0) or 0):
            raise PopRTRuntimeError("enable_input_single_row_mode with delimiter_num > 0 (zero delimiters between "
                                    "packed sequences, PopRT's deberta mode) is not implemented")
        self.runner = Runner(executable_or_path, runtime_config)
        pack = self.runner.executable.options.get("pack_args")
        if pack and not cfg.single_row_input:      # a model converted with pack_args: its settings
            self.config = cfg = copy.copy(cfg)
            cfg.enable_input_single_row_mode(pack["mask_name"])
            cfg.dynamic_input_name = cfg.dynamic_input_name or pack.get("dynamic_input_name", "")
            cfg.max_valid_num = cfg.max_valid_num or int(pack.get("max_valid_num", 0))
        ins = self.runner._inputs
        self.rows = self.runner.batch_size
        for nm, what in ((cfg.dynamic_input_name, "dynamic_input_name"), (cfg.single_row_input, "the single-row mask"),
                         (cfg.padding_remove_mask, "the padding-remove mask"), *[(n, "a padding-remove input")
                                                                                  for n in cfg.padding_remove_inputs]):
            if nm and nm not in ins:
                raise PopRTRuntimeError(f"{what} '{nm}' is not an input of the model; its inputs are {list(ins)}")
        self.packed = bool(cfg.single_row_input)
        if self.packed:
            dyn = cfg.dynamic_input_name or cfg.single_row_input
            shape = ins[dyn].shape
            if len(shape) != 2:
                raise PopRTRuntimeError(f"Packed mode needs [batch, seq] inputs; '{dyn}' has shape {list(shape)}")
            self.seq = int(shape[1])
            bad = [n for n, d in ins.items() if list(d.shape) != list(shape)]
            if bad:
                raise PopRTRuntimeError(f"Packed mode packs [batch, seq] = {list(shape)} inputs; inputs {bad} have "
                                    f"other shapes")
            self._seq_outputs = [n for n, d in self.runner._outputs.items()
                                 if len(d.shape) >= 2 and list(d.shape[:2]) == list(shape)]
        else:
            self.seq = 0
            self._seq_outputs = list(self.runner._outputs)
        self.max_samples = cfg.max_valid_num or (self.rows * max(self.seq, 1) if self.packed else self.rows)
        if not self.packed and self.max_samples > self.rows:
            raise PopRTRuntimeError(f"max_valid_num {self.max_samples} is larger than the compiled batch {self.rows} "
                                f"(one sample a row without enable_input_single_row_mode)")
        self._queue: list = []
        self._cv = threading.Condition()
        self._stop = False
        self.batches_run = 0
        self._stats = {"samples": 0, "rows": 0, "tokens": 0}
        self._t_first = self._t_last = None
        self._worker = threading.Thread(target=self._loop, name="poprt-pack", daemon=True)
        self._worker.start()

    def get_model_inputs(self):
        return self.runner.get_model_inputs()

    def get_model_outputs(self):
        return self.runner.get_model_outputs()

    get_execute_inputs = get_model_inputs
    get_execute_outputs = get_model_outputs

    # -- one sample in --------------------------------------------------------------------
    def _sample(self, inputs: dict) -> tuple[dict, int]:
        """The sample's arrays (1-D for packed inputs) and its length (tokens; 0 unpacked)."""
        cfg = self.config
        arrs = {}
        for n, d in self.runner._inputs.items():
            if n in inputs and n != cfg.unpack_info_name:
                arrs[n] = np.asarray(inputs[n])
        unknown = [n for n in inputs if n not in self.runner._inputs]
        if unknown:
            raise PopRTRuntimeError(f"Inputs {unknown} are not inputs of the model")
        dyn_name = cfg.dynamic_input_name or cfg.single_row_input
        if len(arrs) < len(self.runner._inputs) and dyn_name not in arrs:
            raise PopRTRuntimeError(f"Input '{dyn_name}' (the dynamic input) is missing; inputs other than it may be "
                                    f"left out; the model's inputs are {list(self.runner._inputs)}")
        if cfg.padding_remove_mask and self.packed and cfg.padding_remove_mask in arrs:
            # unpacked, a padded sample fills its row as it is
            keep = int(np.count_nonzero(arrs[cfg.padding_remove_mask]))
            for n in [cfg.padding_remove_mask, *cfg.padding_remove_inputs]:
                if n in arrs:
                    arrs[n] = arrs[n].reshape(-1)[:keep]
        self._fill_missing(arrs)
        if not self.packed:
            for n, d in self.runner._inputs.items():
                if arrs[n].size != int(np.prod(d.shape[1:])):
                    raise PopRTRuntimeError(f"PackRunner takes one sample: input '{n}' has shape {list(arrs[n].shape)}, "
                                        f"a sample is {list(d.shape[1:])}")
                arrs[n] = arrs[n].reshape(d.shape[1:])
            length = int(np.count_nonzero(arrs[cfg.dynamic_input_name])) if cfg.dynamic_input_name else 0
            return arrs, length
        for n, a in arrs.items():
            if a.ndim == 2 and a.shape[0] == 1:
                a = a[0]
            if a.ndim != 1:
                raise PopRTRuntimeError(f"PackRunner takes one sequence: input '{n}' has shape {list(arrs[n].shape)}; "
                                    f"give [L] or [1, L]")
            arrs[n] = a
        dyn = cfg.dynamic_input_name or cfg.single_row_input
        length = arrs[dyn].shape[0]
        if not 1 <= length <= self.seq:
            raise PopRTRuntimeError(f"A sequence of {length} tokens does not fit the compiled sequence length {self.seq}")
        bad = {n: a.shape[0] for n, a in arrs.items() if a.shape[0] != length}
        if bad:
            raise PopRTRuntimeError(f"Inputs of one sequence must have its length {length} (from '{dyn}'); got {bad}")
        return arrs, length

    def _fill_missing(self, arrs: dict) -> None:
        """Give the inputs a request left out their values, as PopRT's pack runner does: an input
        named like ``position_ids`` (``*position*``) counts 0, 1, ... along the sample's tokens;
        the single-row mode's ``unpack_info`` input and any other input are zeros. The sample's
        length comes from the dynamic input (packed) or the descriptor (unpacked)."""
        ins = self.runner._inputs
        missing = [n for n in ins if n not in arrs]
        if not missing:
            return
        if self.packed:
            dyn = arrs[self.config.dynamic_input_name or self.config.single_row_input]
            length = int(dyn.shape[-1]) if dyn.ndim else 1
            for n in missing:
                dt = ins[n].dtype
                arrs[n] = np.arange(length, dtype=dt) if "position" in n.lower() else np.zeros(length, dt)
            return
        for n in missing:
            shape = ins[n].shape[1:]
            if "position" in n.lower() and shape:
                arrs[n] = np.broadcast_to(np.arange(shape[-1], dtype=ins[n].dtype), shape).copy()
            else:
                arrs[n] = np.zeros(shape, ins[n].dtype)

    def executeAsync(self, inputs: dict, outputs: dict | None = None) -> Future:  # noqa: N802
        """Queue one sample; the :class:`Future`'s ``get()`` gives its outputs (``outputs`` filled)."""
        arrs, length = self._sample(inputs)
        if outputs is not None:
            bad = [n for n in outputs if n not in self._seq_outputs]
            if bad:
                raise PopRTRuntimeError(f"Outputs {bad} cannot be returned per sample: in packed mode only outputs "
                                    f"[batch, seq, ...] are unpacked ({self._seq_outputs})")
        fut = _CFuture()
        with self._cv:
            if self._stop:
                raise PopRTRuntimeError("The pack runner is closed")
            self._queue.append((arrs, length, outputs, fut, time.perf_counter()))
            self._cv.notify()
        return Future(fut)

    execute_async = executeAsync

    def execute(self, inputs: dict, outputs: dict | None = None) -> dict:
        return self.executeAsync(inputs, outputs).get()

    # -- packing --------------------------------------------------------------------------
    def _plan(self, queue: list) -> tuple[list, list]:
        """Place queued samples into rows: ``(taken [(queue index, row, offset)], row fill)``.
        Unpacked: one sample per row, in arrival order (``next_fit``: longest first)."""
        if not self.packed:
            idx = list(range(min(len(queue), self.max_samples)))
            if self.config.algorithm == PackAlgorithm.next_fit:
                idx.sort(key=lambda i: -queue[i][1])
            return [(i, r, 0) for r, i in enumerate(idx)], [1] * len(idx)
        fill = [0] * self.rows
        taken = []
        cur = 0
        for i, (_a, length, *_r) in enumerate(queue):
            if len(taken) >= self.max_samples:
                break
            if self.config.algorithm == PackAlgorithm.first_fit:
                row = next((r for r in range(self.rows) if fill[r] + length <= self.seq), None)
            else:
                if fill[cur] + length > self.seq and cur + 1 < self.rows:
                    cur += 1
                row = cur if fill[cur] + length <= self.seq else None
            if row is None:
                if self.config.algorithm == PackAlgorithm.next_fit:
                    break
                continue
            taken.append((i, row, fill[row]))
            fill[row] += length
        return taken, [f for f in fill if f]

    def _ready(self) -> bool:
        q = self._queue
        if len(q) >= self.max_samples:
            return True
        if self.packed:
            return sum(x[1] for x in q) >= self.rows * self.seq
        return len(q) >= self.rows

    def _loop(self):
        timeout = self.config.timeout_microseconds / 1e6
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop and not self._queue:
                    return
                deadline = self._queue[0][4] + timeout
                while not self._ready() and not self._stop:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                taken, fill = self._plan(self._queue)
                reqs = [(self._queue[i], row, off) for i, row, off in taken]
                gone = {i for i, _r, _o in taken}
                self._queue = [x for i, x in enumerate(self._queue) if i not in gone]
            self._run_batch(reqs, fill)

    def _run_batch(self, reqs, fill):
        ins = self.runner._inputs
        try:
            feeds = {n: np.zeros(d.shape, d.dtype) for n, d in ins.items()}
            seg = np.zeros(self.rows, np.int64)
            for (arrs, length, *_x), row, off in reqs:
                if self.packed:
                    seg[row] += 1
                    for n, a in arrs.items():
                        feeds[n][row, off:off + length] = seg[row] if n == self.config.single_row_input else a
                else:
                    for n, a in arrs.items():
                        feeds[n][row] = a
            res = self.runner._run_one(feeds)
        except Exception as e:  # noqa: BLE001 - handed to every waiting future
            for (_a, _l, _o, fut, _t), _r, _f in reqs:
                fut.set_exception(e)
            return
        now = time.perf_counter()
        with self._cv:
            self.batches_run += 1
            self._stats["samples"] += len(reqs)
            self._stats["rows"] += len(fill)
            self._stats["tokens"] += sum(x[0][1] for x in reqs)
            self._t_first = min(self._t_first or reqs[0][0][4], min(x[0][4] for x in reqs))
            self._t_last = now
        for (arrs, length, outs, fut, _t), row, off in reqs:
            try:
                sample = {}
                for n in self._seq_outputs:
                    v = res[n]
                    if self.packed:
                        sample[n] = v[row, off:off + length].copy()
                    else:
                        sample[n] = v[row:row + 1].copy()
                if outs is None:
                    fut.set_result(sample)
                    continue
                for n, dst in outs.items():
                    src = sample[n]
                    if not isinstance(dst, np.ndarray) or not dst.flags.writeable:
                        raise PopRTRuntimeError(f"Output '{n}' must be a writeable numpy array")
                    if self.packed:
                        flat = dst.reshape(-1, *src.shape[1:]) if dst.size % max(int(np.prod(src.shape[1:])), 1) == 0 \
                            else None
                        if flat is None or flat.shape[0] < length:
                            raise PopRTRuntimeError(f"Output '{n}' has shape {list(dst.shape)}; a sequence of {length} "
                                                f"tokens gives {list(src.shape)}")
                        flat[:length] = src
                        flat[length:] = 0
                    else:
                        np.copyto(dst, src.reshape(dst.shape), casting="unsafe")
                fut.set_result(outs)
            except Exception as e:  # noqa: BLE001
                fut.set_exception(e)

    # -- figures --------------------------------------------------------------------------
    def pack_stats(self) -> dict:
        """Packing so far: ``samples``, ``batches`` run, ``rows`` holding data, ``valid_tokens``,
        ``samples_per_batch``, ``token_efficiency`` (valid tokens / tokens of the batches run;
        packed mode) and ``row_efficiency`` (rows with data / rows run); ``host_samples_per_second``
        (host wall time from the first sample's arrival to the last batch's end)."""
        with self._cv:
            st, b = dict(self._stats), self.batches_run
            span = (self._t_last - self._t_first) if self._t_first is not None else 0.0
        cap = b * self.rows * (self.seq if self.packed else 1)
        return {"samples": st["samples"], "batches": b, "rows": st["rows"], "valid_tokens": st["tokens"],
                "samples_per_batch": st["samples"] / b if b else 0.0,
                "token_efficiency": st["tokens"] / cap if (cap and self.packed) else 0.0,
                "row_efficiency": st["rows"] / (b * self.rows) if b else 0.0,
                "host_samples_per_second": st["samples"] / span if span > 0 else 0.0}

    def predicted_qps(self) -> float:
        """Predicted IPU samples/s at the packing achieved so far: samples per batch times batches
        per second of the compiled executable (its predicted steady-state batch period)."""
        p = self.runner.predicted
        st = self.pack_stats()
        return st["samples_per_batch"] * p.clock_hz / max(p.batch_period_cycles, 1.0)

    def report(self) -> str:
        """Predicted IPU figures (at the packing achieved) beside host figures, labelled."""
        st, p = self.pack_stats(), self.runner.predicted
        shape = f"{self.rows} rows x {self.seq} tokens" if self.packed else f"{self.rows} rows"
        eff = f", {st['token_efficiency']:.1%} of the tokens valid" if self.packed else ""
        return (f"packing: {st['samples']} samples in {st['batches']} batches of {shape} "
                f"({st['samples_per_batch']:.2f} samples a batch{eff}); "
                f"predicted IPU ({self.runner.executable.target['ipu_version']}): {self.predicted_qps():,.0f} samples/s, "
                f"{p.latency_seconds * 1e3:.3f} ms a batch; host simulation: {st['host_samples_per_second']:.2f} samples/s")

    def close(self):
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._worker.join()
        self.runner.close()


ModelRunner = Runner
