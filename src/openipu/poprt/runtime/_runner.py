"""``poprt.runtime.Runner``: one compiled executable on the simulated IPU (see the package
docstring for the call contract and ``batches_per_step``)."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future as _CFuture
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from openipu.poplar import exefile
from openipu.poprt.compiler import Executable
from openipu.poprt.runtime._timing import TIMINGS, PredictedDevice
from openipu.poprt.runtime._common import (DataDesc, Future, PackRunnerConfig, PopRTRuntimeError, RuntimeConfig,
                                           _case_hint, _timeout_seconds)

_log = logging.getLogger("poprt.runtime")


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
            from openipu.poprt.runtime._pack import PackRunner    # the pack runner is built on Runner
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
        timing = getattr(self.config, "timing", "host")
        if timing not in TIMINGS:
            raise PopRTRuntimeError(f"RuntimeConfig.timing is {timing!r}; expected one of {', '.join(TIMINGS)}")
        self.timing = timing
        self._device = self._fast = None
        if timing == "predicted":       # no program on the host: the modelled device keeps time
            p = exe.prediction
            self._device = PredictedDevice(p.latency_seconds, p.batch_period_cycles / p.clock_hz,
                                           float(getattr(self.config, "time_scale", 1.0)))
            _log.warning("predicted-time mode: outputs are not computed (zeros); each execute completes when the "
                         "simulated IPU would: %s with enough concurrent callers",
                         p.summary(exe.target["ipu_version"]))
        else:
            self._load_engine(exe)
        self.batches_per_step = bps = max(1, int(exe.options.get("batches_per_step", 1) or 1))
        lead = 1 if bps > 1 else 0          # the compiled step's leading batches_per_step dimension
        self._inputs = {d.name: DataDesc(d.name, list(d.shape)[lead:], d.dtype) for d in exe.inputs}
        self._outputs = {d.name: DataDesc(d.name, list(d.shape)[lead:], d.dtype) for d in exe.outputs}
        self._lock = threading.Lock()
        self._closed = False
        self._n_exec, self._host_exec_s = 0, 0.0
        if self._device is not None or self._fast is not None:
            self._stepper = None        # each call runs its own batch (the IR executor) or none
        elif bps == 1:
            self._in_bufs = {n: np.zeros(d.shape, d.dtype) for n, d in self._inputs.items()}
            self._out_bufs = {n: np.zeros(d.shape, d.dtype) for n, d in self._outputs.items()}
            self._connect_buffers()
            self._stepper = None
        else:
            self._stepper = _Stepper(self, _timeout_seconds(self.config.timeout_ns))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="poprt-device")
        self.load_seconds = time.perf_counter() - t0

    def _ir_executor(self, exe):
        """The PopART IR executor for this executable (``OPENIPU_EXECUTION=ir``, the default) when
        it covers the program, else None (the Poplar engine runs it)."""
        from openipu.popart import execute, torch_device
        from openipu.popart.errors import popart_exception
        session = getattr(exe, "_session", None)
        try:
            if session is None or execute.mode() != "ir" or execute.unsupported(session) is not None:
                return None
            device = torch_device.resolve()
        except (ValueError, popart_exception) as e:     # OPENIPU_EXECUTION, OPENIPU_TORCH_DEVICE
            raise PopRTRuntimeError(str(e)) from None
        return execute.IrExecutor(session._ir, session._host_weights, 1, 1, device=device)

    def _load_engine(self, exe) -> None:
        """Take the IR executor where it covers the program; else build and load the Poplar
        engine of the executable (host timing)."""
        self._fast = self._ir_executor(exe)
        if self._fast is not None:
            return
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
        """One compiled batch of a call that is its own step (the IR executor, or the Poplar
        engine with ``batches_per_step == 1``): run under the device lock, its host time and the
        execute counted. Returns ``{output name: new array}`` of the descriptor shapes."""
        with self._lock:
            t0 = time.perf_counter()
            out = self._run_ir(feeds) if self._fast is not None else self._run_engine(feeds)
            self._host_exec_s += time.perf_counter() - t0
            self._n_exec += 1
        return out

    def _run_engine(self, feeds: dict) -> dict:
        """The Poplar engine's step: copy in, run, copy out (the caller holds the device lock)."""
        for n, a in feeds.items():
            buf = self._in_bufs[n]
            np.copyto(buf, np.asarray(a).reshape(buf.shape), casting="unsafe")
        self._engine.run(0, "step")
        return {n: b.copy() for n, b in self._out_bufs.items()}

    def _run_ir(self, feeds: dict) -> dict:
        """The batch on the IR executor (whole-tensor kernels; the same outputs as the Poplar
        program within the plan's precision; the caller holds the device lock)."""
        ins = {n: np.asarray(a).astype(self._inputs[n].dtype, copy=False).reshape(1, -1) for n, a in feeds.items()}
        out = {n: np.zeros(d.shape, d.dtype) for n, d in self._outputs.items()}
        self._fast.run(ins, out, 1)
        return out

    def _submit(self, feeds: dict) -> _CFuture:
        """Queue one compiled batch; the future's result is ``{output name: array}``."""
        if self._device is not None:
            self._n_exec += 1
            return self._device.submit(self._predicted_outputs, self._device.arrival())[0]
        if self._stepper is not None:
            return self._stepper.submit(feeds)
        return self._pool.submit(self._run_step, feeds)

    def _run_one(self, feeds: dict) -> dict:
        """Run one compiled batch (``feeds`` by input name, descriptor-sized arrays) and return its
        outputs (new arrays of the descriptor shapes). Blocks; thread-safe."""
        if self._stepper is None and self._device is None:
            return self._run_step(feeds)
        return self._submit(feeds).result()

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
        out = self._finish(futs, ctx)
        if self._device is not None:        # predicted time: this thread's clock (see _timing)
            self._device.returned(max(f.completes for f in futs))
        return out

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

    # -- predicted-time mode ----------------------------------------------------------------
    def _predicted_outputs(self) -> dict:
        """The outputs of a batch in predicted-time mode: zeros of the descriptor shapes."""
        return {n: np.zeros(d.shape, d.dtype) for n, d in self._outputs.items()}

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
        """Predicted IPU figures beside host figures, labelled (in predicted-time mode: the
        device model the calls were timed by)."""
        p, h = self.predicted, self.host_stats()
        if self._device is not None:
            return (f"predicted-time mode (calls take predicted IPU time; outputs not computed): "
                    f"{p.summary(self.executable.target['ipu_version'])} with enough concurrent callers; "
                    f"{h['executes']} executes")
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
        if self._device is not None:
            self._device.close()
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
