"""``poprt.runtime``: load a compiled executable and run it (PopRT's ``Runner``, Model Runtime's
``ModelRunner``), on the simulated IPU.

``Runner(path_or_executable, RuntimeConfig())`` loads an executable written by
``Compiler.compile_and_export`` (no recompiling of the model: the Poplar program is rebuilt from
the file, see :mod:`openipu.poplar.exefile`) or takes one from ``Compiler.compile``. ``execute``
fills the caller's output arrays; ``execute_async`` / ``executeAsync`` queue the call on the
device's worker and return a future (``wait()``). ``RuntimeConfig.batching_dim`` turns on
dynamic batch: inputs of any batch are split into compiled batches (the last one padded) and the
outputs joined. :class:`PackRunner` collects single-sample requests from many threads into
compiled batches (a row per sample; see its docstring).

Two kinds of figures, kept apart: ``runner.predicted`` holds predicted IPU figures (cycles,
latency in IPU seconds, QPS) from the cost model; ``runner.host_stats()`` measures this machine
running the simulation (host seconds).
"""

from __future__ import annotations

import enum
import os
import threading
import time
from concurrent.futures import Future as _CFuture
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from openipu.poplar import exefile
from openipu.poprt.compiler import Executable, TensorDesc


class PopRTRuntimeError(RuntimeError):
    """PopRT runtime errors (a ``RuntimeError``, as PopRT's binding raises): bad inputs or outputs,
    a bad executable file, a closed runner."""


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
    ``timeout_ns`` (0: PackRunner waits for a full batch only this long; stored for Runner),
    ``validate_io_params`` (True: check names, shapes and dtypes of ``execute``'s arrays),
    ``check_package_hash`` (True: the executable file's SHA-256 check; it is always done),
    ``replica_to_device``, ``ring_buffer_size_multiplier`` (accepted and stored).
    """

    def __init__(self, **kw):
        self.batching_dim = -1
        self.timeout_ns = 0
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
                raise PopRTRuntimeError(f"Cannot load the executable: {e}") from None
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
        self._inputs = {d.name: d for d in exe.inputs}
        self._outputs = {d.name: d for d in exe.outputs}
        self._in_bufs = {d.name: np.zeros(d.shape, d.dtype) for d in exe.inputs}
        self._out_bufs = {d.name: np.zeros(d.shape, d.dtype) for d in exe.outputs}
        for tid, h in low.inputs.items():
            if h is not None and tid in self._in_bufs:
                self._engine.connectStream(h, self._in_bufs[tid].reshape(-1))
        for tid, h in low.anchors.items():
            if h is not None and tid in self._out_bufs:
                self._engine.connectStream(h, self._out_bufs[tid].reshape(-1))
        if low.weights_in:
            for tid, h in low.weights_in.items():
                self._engine.connectStream(h, np.ascontiguousarray(exe.host_weights[tid]).reshape(-1))
            self._engine.run(1, "weightsFromHost")
            for tid, h in low.inputs.items():     # the weight streams are done: inputs again
                if h is not None and tid in self._in_bufs:
                    self._engine.connectStream(h, self._in_bufs[tid].reshape(-1))
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="poprt-device")
        self._closed = False
        self._n_exec, self._host_exec_s = 0, 0.0
        self.load_seconds = time.perf_counter() - t0

    # -- descriptors ----------------------------------------------------------------------
    def get_model_inputs(self) -> list[TensorDesc]:
        """Input descriptors (``name``, ``shape`` with the compiled batch, ``numpy_data_type()``)."""
        return list(self._inputs.values())

    def get_model_outputs(self) -> list[TensorDesc]:
        return list(self._outputs.values())

    get_execute_inputs = get_model_inputs
    get_execute_outputs = get_model_outputs

    @property
    def batch_size(self) -> int:
        return self.predicted.batch_size

    # -- running --------------------------------------------------------------------------
    def _check(self, inputs: dict, outputs: dict | None, dynamic: bool):
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
        if not self.config.validate_io_params:
            return
        for n, d in self._inputs.items():
            a = np.asarray(inputs[n])
            want = list(d.shape)
            if dynamic:
                dim = self.config.batching_dim
                if a.ndim != len(want) or [s for i, s in enumerate(a.shape) if i != dim] != \
                        [s for i, s in enumerate(want) if i != dim]:
                    raise PopRTRuntimeError(f"Input '{n}' has shape {list(a.shape)}; the model wants {want} with any size "
                                        f"in dimension {dim} (batching_dim)")
            elif list(a.shape) != want and a.size != int(np.prod(want)):
                raise PopRTRuntimeError(f"Input '{n}' has shape {list(a.shape)}; the model wants {want}")

    def _run_one(self, feeds: dict) -> dict:
        """One compiled batch: copy in, run, copy out (the device lock held)."""
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

    def _execute(self, inputs: dict, outputs: dict | None) -> dict:
        dim = self.config.batching_dim
        dynamic = dim is not None and dim >= 0
        self._check(inputs, outputs, dynamic)
        if not dynamic:
            res = self._run_one(inputs)
        else:
            res = self._execute_dynamic(inputs, dim)
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

    def _execute_dynamic(self, inputs: dict, dim: int) -> dict:
        compiled = {n: d.shape[dim] for n, d in self._inputs.items()}
        sizes = {np.asarray(a).shape[dim] for a in inputs.values()}
        if len(sizes) != 1:
            raise PopRTRuntimeError(f"With batching_dim={dim} every input needs the same size in that dimension; got "
                                f"{sorted(sizes)}")
        (n_total,) = sizes
        cb = next(iter(compiled.values()))
        chunks = []
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
            out = self._run_one(feeds)
            chunks.append({n: np.take(v, np.arange(stop - start), axis=dim) for n, v in out.items()})
        return {n: np.concatenate([c[n] for c in chunks], axis=dim) for n in self._outputs}

    def execute(self, inputs: dict, outputs: dict | None = None) -> dict:
        """Run one step: ``inputs`` by name (cast to the descriptor dtypes), results copied into the
        caller's ``outputs`` arrays (any layout of the right size). Returns ``outputs`` (a new dict
        when none is given). Raises :class:`PopRTRuntimeError` for missing, unknown or misshaped arrays."""
        return self._execute(inputs, outputs)

    def execute_async(self, inputs: dict, outputs: dict | None = None) -> Future:
        """Queue :meth:`execute` on the device's worker thread; returns a :class:`Future`."""
        if self._closed:
            raise PopRTRuntimeError("The runner is closed")
        return Future(self._pool.submit(self._execute, inputs, outputs))

    executeAsync = execute_async  # noqa: N815 - Model Runtime's spelling

    # -- figures --------------------------------------------------------------------------
    def host_stats(self) -> dict:
        """Host figures (this machine simulating the IPU): executes so far, host seconds of
        execution, mean host seconds per execute, and load seconds."""
        n = self._n_exec
        return {"executes": n, "host_seconds": self._host_exec_s, "host_seconds_per_execute": self._host_exec_s / n
                if n else 0.0, "load_seconds": self.load_seconds}

    def report(self) -> str:
        """Predicted IPU figures beside host figures, labelled."""
        p, h = self.predicted, self.host_stats()
        return (f"predicted IPU ({self.executable.target['ipu_version']}, batch {p.batch_size}): latency "
                f"{p.latency_seconds * 1e3:.3f} ms, {p.qps:,.0f} samples/s"
                f"{f' (overlapped I/O, {p.num_io_tiles} I/O tiles)' if p.num_io_tiles else ''}; "
                f"host simulation: {h['host_seconds_per_execute'] * 1e3:.1f} ms per execute, "
                f"load {h['load_seconds']:.2f} s")

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ----------------------------------------------------------------------------------------------
# PackRunner
# ----------------------------------------------------------------------------------------------
class PackAlgorithm(enum.Enum):
    first_fit = 0
    next_fit = 1


class PackRunnerConfig:
    """``poprt.runtime.PackRunnerConfig(timeout_microseconds=..., max_valid_num=..., dynamic_input_name=...)``.

    ``timeout_microseconds``: how long a partial batch waits for more samples; ``max_valid_num``:
    samples per batch (default: the compiled batch); ``dynamic_input_name``: the input whose
    non-zero entries give a sample's valid length (the attention mask, or the token ids);
    ``enable_input_single_row_mode(name)`` marks that input as one row per sample;
    ``enable_padding_remove_mode`` zeroes outputs past each sample's valid length;
    ``algorithm`` (``PackAlgorithm.first_fit``) orders the queue.
    """

    def __init__(self, timeout_microseconds: int = 1000, max_valid_num: int = 0, dynamic_input_name: str = "",
                 algorithm: PackAlgorithm = PackAlgorithm.first_fit, enable_padding_remove_mode: bool = False):
        self.timeout_microseconds = int(timeout_microseconds)
        self.max_valid_num = int(max_valid_num)
        self.dynamic_input_name = dynamic_input_name
        self.algorithm = algorithm
        self.enable_padding_remove_mode = bool(enable_padding_remove_mode)
        self.single_row_input = ""

    def enable_input_single_row_mode(self, name: str) -> None:
        self.single_row_input = name


class PackRunner:
    """``poprt.runtime.PackRunner(executable_or_path, PackRunnerConfig())``: a server-side batcher
    for BERT-like models fed one sample at a time (Byte MLPerf's pack mode).

    ``executeAsync(inputs, outputs)`` takes ONE sample (each input without the batch dimension, or
    with a batch of 1) and returns a :class:`Future`; a worker fills the compiled batch, one sample
    per row, with queued samples (``first_fit``: in arrival order; ``next_fit``: the longest valid
    length first), or runs a partial batch (padded with zeros) after ``timeout_microseconds``. With
    ``dynamic_input_name`` the valid length of a sample is its number of non-zero entries there,
    and ``enable_padding_remove_mode`` zeroes outputs past it. Limitation: PopRT also packs several
    short sequences into one row; here a row holds one sample.
    """

    def __init__(self, executable_or_path, config: PackRunnerConfig | None = None,
                 runtime_config: RuntimeConfig | None = None):
        self.config = config if config is not None else PackRunnerConfig()
        self.runner = Runner(executable_or_path, runtime_config)
        self.batch = self.config.max_valid_num or self.runner.batch_size
        if self.batch > self.runner.batch_size:
            raise PopRTRuntimeError(f"max_valid_num {self.batch} is larger than the compiled batch "
                                f"{self.runner.batch_size}")
        if self.config.dynamic_input_name and self.config.dynamic_input_name not in self.runner._inputs:
            raise PopRTRuntimeError(f"dynamic_input_name '{self.config.dynamic_input_name}' is not an input of the model")
        self._queue: list = []
        self._cv = threading.Condition()
        self._stop = False
        self.batches_run = 0
        self._worker = threading.Thread(target=self._loop, name="poprt-pack", daemon=True)
        self._worker.start()

    def get_model_inputs(self):
        return self.runner.get_model_inputs()

    def get_model_outputs(self):
        return self.runner.get_model_outputs()

    def executeAsync(self, inputs: dict, outputs: dict | None = None) -> Future:  # noqa: N802
        for n, d in self.runner._inputs.items():
            if n not in inputs:
                raise PopRTRuntimeError(f"Input '{n}' is missing")
            a = np.asarray(inputs[n])
            row = d.shape[1:]
            if a.size != int(np.prod(row)):
                raise PopRTRuntimeError(f"PackRunner takes one sample: input '{n}' has shape {list(a.shape)}, a sample "
                                    f"is {list(row)}")
        fut = _CFuture()
        with self._cv:
            if self._stop:
                raise PopRTRuntimeError("The pack runner is closed")
            self._queue.append((inputs, outputs, fut, time.perf_counter()))
            self._cv.notify()
        return Future(fut)

    execute_async = executeAsync

    def execute(self, inputs: dict, outputs: dict | None = None) -> dict:
        return self.executeAsync(inputs, outputs).get()

    def _valid_len(self, inputs) -> int:
        name = self.config.dynamic_input_name
        if not name:
            return 0
        return int(np.count_nonzero(np.asarray(inputs[name]).reshape(-1)))

    def _loop(self):
        timeout = self.config.timeout_microseconds / 1e6
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop and not self._queue:
                    return
                deadline = self._queue[0][3] + timeout
                while len(self._queue) < self.batch and not self._stop:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                take = self._queue[:self.batch]
                del self._queue[:self.batch]
            if self.config.algorithm == PackAlgorithm.next_fit:
                take.sort(key=lambda r: -self._valid_len(r[0]))
            self._run_batch(take)

    def _run_batch(self, reqs):
        try:
            feeds = {}
            for n, d in self.runner._inputs.items():
                buf = np.zeros(d.shape, d.dtype)
                for i, (inp, *_rest) in enumerate(reqs):
                    buf[i] = np.asarray(inp[n]).reshape(d.shape[1:])
                feeds[n] = buf
            res = self.runner._run_one(feeds)
            self.batches_run += 1
        except Exception as e:  # noqa: BLE001 - handed to every waiting future
            for *_x, fut, _t in reqs:
                fut.set_exception(e)
            return
        for i, (inp, outs, fut, _t) in enumerate(reqs):
            sample = {n: v[i:i + 1].copy() for n, v in res.items()}
            if self.config.enable_padding_remove_mode and self.config.dynamic_input_name:
                L = self._valid_len(inp)
                for v in sample.values():
                    if v.ndim >= 2:
                        v[:, L:] = 0
            try:
                if outs is not None:
                    for n, dst in outs.items():
                        np.copyto(dst, sample[n].reshape(dst.shape), casting="unsafe")
                    fut.set_result(outs)
                else:
                    fut.set_result(sample)
            except Exception as e:  # noqa: BLE001
                fut.set_exception(e)

    def close(self):
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._worker.join()
        self.runner.close()


ModelRunner = Runner
