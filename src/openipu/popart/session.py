"""``popart.InferenceSession``: IR in the constructor, ``prepareDevice`` compiles, ``run`` streams.

For tools (the ``openipu run`` CLI) after ``prepareDevice()``:

- ``session._engine``: the :class:`openipu.poplar.Engine` (``engine.memory`` is the tile memory
  plan, ``engine.printProfileSummary()`` / ``getProfile()`` the profile);
- ``session.ops()``: the IR ops in execution order, each with ``op_type``, ``inputs``,
  ``outputs``, ``vgraph`` and ``lowering`` (``"precise"`` or ``"generic"``);
- ``session.getCycleCount()``: predicted IPU cycles of the last ``run`` (max over IPUs).
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import time
import weakref

import numpy as np
import onnx
from onnx import numpy_helper

from openipu import poplar
from openipu.poplar import exefile
from openipu.popart.dataflow import AnchorReturnTypeId, DataFlow, anchor_elements, anchor_shape
from openipu.popart.devices import DeviceInfo, DeviceType
from openipu.popart.errors import (OutOfMemoryException, popart_exception, popart_runtime_error, poplar_exception,
                                   poplar_application_runtime_error)
from openipu.popart.grouped_weights import GroupedWeightsMixin
from openipu.popart import ir_json, rng_state, tensor_proto
from openipu.popart.ir import Ir, shard_rows
from openipu.popart.log import log
from openipu.popart.options import SessionOptions
from openipu.popart.stepio import PyStepIO, PyStepIOCallback
from openipu.popart.tensorinfo import TensorInfo, dtype_name


def _progress_bar(total: int):
    """tqdm "Graph compilation" bar on stderr, only when stderr is a terminal."""
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Graph compilation", file=sys.stderr, unit="step", leave=True)


#: Programs this process compiled, by session fingerprint (``poplar.Executable`` with its
#: ``popart_lowered``), while a session holds them: loading an executable file of the same
#: fingerprint takes the program from here instead of compiling the model again.
_COMPILED: "weakref.WeakValueDictionary[str, poplar.Executable]" = weakref.WeakValueDictionary()


def _validate_distributed(o) -> None:
    """Check ``enableDistributedReplicatedGraphs``' ``globalReplicationFactor`` and
    ``globalReplicaOffset`` against the local replication factor (this instance's replicas are a
    block of the global replicas). Raises ``popart_exception``."""
    if not o.enableDistributedReplicatedGraphs:
        return
    repl = o.replication_factor()
    g, off = int(o.globalReplicationFactor), int(o.globalReplicaOffset)
    if g < repl or g % repl or off % repl or not 0 <= off <= g - repl:
        raise popart_exception(
            f"Invalid distributed replication: globalReplicationFactor ({g}) must be a multiple of the local "
            f"replication factor ({repl}) and globalReplicaOffset ({off}) a multiple of it below {g - repl + 1}")

class _SessionBase(rng_state.RngStateApi, GroupedWeightsMixin):
    _KIND = "InferenceSession"

    def __init__(self, fnModel, dataFlow, deviceInfo, inputShapeInfo, patterns, userOptions, name,  # noqa: N803
                 training=None):
        if deviceInfo is None or not isinstance(deviceInfo, DeviceInfo):
            raise popart_exception(f"Must pass a valid deviceInfo to {self._KIND}::createFromOnnxModel")
        if not isinstance(dataFlow, DataFlow):
            raise popart_exception("dataFlow must be a popart.DataFlow")
        self.options = userOptions if userOptions is not None else SessionOptions()
        self.patterns = patterns
        if patterns is not None and hasattr(patterns, "check_mandatory"):
            patterns.check_mandatory()      # "Pattern 'X' must be enabled" (runtime asserts on)
        self.name = name
        self._dataflow = dataFlow
        self.deviceInfo = deviceInfo
        o = self.options
        if not o.enableReplicatedGraphs and int(o.replicatedGraphCount) > 1:
            raise popart_exception("enableReplicatedGraphs is false, but replicatedGraphCount > 1. Either enable "
                                   "replicated graphs, or set the replicated graph count to 1")
        if not o.enableGradientAccumulation and int(o.accumulationFactor) > 1:
            raise popart_exception("enableGradientAccumulation is false, but accumulationFactor > 1. Either enable "
                                   "gradient accumulation, or set the accumulation factor to 1")
        if o.enableGradientAccumulation and training is None:
            raise popart_exception("Gradient Accumulation only available when training.")
        n_ipus = deviceInfo.numIpus
        repl = o.replication_factor()
        _validate_distributed(o)
        if n_ipus % repl:
            raise popart_exception("For replicated graphs, the number of IPUs must be divisible by the replication "
                                   "factor.")
        from openipu.popart.options import VirtualGraphMode
        if o.virtualGraphMode == VirtualGraphMode.Off and repl > 1 and repl != n_ipus:
            raise popart_exception(f"If virtual graphs are disabled, the replicated graph count ({repl}) needs to be "
                                   f"equal to the number of IPUs ({n_ipus})")
        self._num_vgraphs = n_ipus // repl if o.virtualGraphMode in (VirtualGraphMode.Manual, VirtualGraphMode.Auto) else 1
        self._ir = Ir(fnModel, dataFlow, inputShapeInfo, o, self._num_vgraphs, training=training)
        self._engine = None
        self._lowered = None
        self._host_weights = {tid: np.require(self._ir.tensors[tid].value, requirements=["C", "W"]) for tid in self._ir.variables()}
        self._group_host_weights()
        self._warned_int64 = False
        self._last_run = False

    # -- PopART properties ----------------------------------------------------------------
    @property
    def dataFlow(self):  # noqa: N802
        return self._dataflow

    @property
    def replicationFactor(self) -> int:  # noqa: N802
        return self.options.replication_factor()

    @property
    def accumulationFactor(self) -> int:  # noqa: N802
        return self.options.accumulation_factor()

    # -- compile --------------------------------------------------------------------------
    def prepareDevice(self, loadEngine: bool = True) -> None:  # noqa: N802,N803
        """Lower the IR to Poplar and compile it (a "Graph compilation" progress bar on a
        terminal). Raises :class:`OutOfMemoryException` when the graph does not fit,
        ``poplar_exception`` for other Poplar errors, ``popart_exception`` for types the IPU
        lacks (DOUBLE).

        With engine caching (``enableEngineCaching`` with ``cachePath``, or the environment
        variable ``POPART_CACHE_DIR``), a compiled executable of the same model, data flow,
        options and target is loaded from the cache instead (:mod:`openipu.poplar.exefile`
        format); a fresh compile is written there. An unreadable cache file is compiled again
        with a warning."""
        if self._engine is not None:          # loadExecutable() gave the executable
            if loadEngine:
                self.loadEngineAndConnectStreams()
            return
        cache = self._cache_file()
        if cache is not None and os.path.isfile(cache):
            try:
                self._load_lowered(cache)
                log("session").info("Loaded the executable from the engine cache %s", cache)
                if loadEngine:
                    self.loadEngineAndConnectStreams()
                return
            except popart_exception as e:
                log("session").warning("Engine cache file %s cannot be used (%s): compiling again", cache, e)
        self._compile()
        if cache is not None:
            os.makedirs(os.path.dirname(cache) or ".", exist_ok=True)
            tmp = f"{cache}.{os.getpid()}.tmp"
            self._save_lowered(tmp)
            os.replace(tmp, cache)
        if loadEngine:
            self.loadEngineAndConnectStreams()

    def _compile(self) -> None:
        from openipu.popart.lowering import program as lowering_program
        bar = _progress_bar(len(self._ir.ops) + 3)
        target = self.deviceInfo.device.getTarget()
        try:
            from openipu.poplar import pvti
            from openipu.poplibs import gcl_instances
            o = self.options
            repl = o.replication_factor()
            dist = (o.getGlobalReplicationFactor(), int(o.globalReplicaOffset), repl) \
                if o.enableDistributedReplicatedGraphs else (repl, 0, repl)
            with pvti.span("PopART: graph construction (lower the IR to a Poplar graph)", "popart",
                           ops=len(self._ir.ops)), gcl_instances.scope(*dist):
                lowered = lowering_program.build(self._ir, target, self.options,
                                                 progress=(lambda: bar.update(1)) if bar else None,
                                                 patterns=self.patterns)
            state = {"done": 0}

            def engine_progress(i, n):
                if bar:
                    bar.update(i - state["done"])
                    state["done"] = i
            opts = self._engine_options()
            try:
                engine = poplar.Engine(lowered.graph, lowered.programs, opts, progress=engine_progress)
            except poplar.graph_memory_allocation_error as e:
                raise self._oom(e, lowered, opts) from None
            except poplar.poplar_error as e:
                raise poplar_exception(str(e), e) from None
            total = getattr(bar, "total", None)     # a tqdm bar (PopTorch's counts to 100 itself)
            if bar and total is not None and bar.n < total:     # compiled: the bar ends at 100%
                bar.update(total - bar.n)
        finally:
            if bar:
                bar.close()
        self._lowered = lowered
        self._engine = engine
        engine._exe.popart_lowered = lowered          # this process's compile, for executables of
        _COMPILED[self._fingerprint()] = engine._exe  # the same fingerprint (while the session lives)

    def _engine_options(self) -> dict:
        return {k: str(v) for k, v in dict(self.options.engineOptions).items()}

    # -- executables on file ----------------------------------------------------------------
    _EXE_KIND = "popart.Executable"

    def _fingerprint(self) -> str:
        """SHA-256 of what the compiled executable depends on: the IR's model, the data flow,
        the options, the patterns, the session kind and the target."""
        if getattr(self, "_fp", None) is not None:
            return self._fp
        h = hashlib.sha256()
        g = self._ir.model.graph
        name, g.name = g.name, ""                # the Builder numbers its graphs: not part of the model
        try:
            h.update(self._ir.model.SerializeToString())
        finally:
            g.name = name
        tgt = self.deviceInfo.device.getTarget()
        for part in (self._KIND, repr(self._dataflow), repr(self.options), repr(self.patterns),
                     repr(getattr(getattr(self, "_optimizer", None), "__dict__", None)), tgt.getTargetArchString(),
                     tgt.getNumIPUs(), tgt.getTilesPerIPU(), exefile.VERSION):
            h.update(repr(part).encode())
        self._fp = h.hexdigest()
        return self._fp

    def _cache_file(self):
        env = os.environ.get("POPART_CACHE_DIR")
        if not (self.options.enableEngineCaching or env):
            return None
        return os.path.join(env or str(self.options.cachePath), f"{self._fingerprint()[:32]}.popef")

    def _save_lowered(self, path) -> None:
        """Write the executable file: its kind, this session's fingerprint, inputs and anchors
        (:mod:`openipu.poplar.exefile`, kind ``popart.Executable``). The program itself is not in
        the file: loading compiles this session's own model again (or takes the program this
        process compiled for the same fingerprint), so a file can only ever select, never supply,
        what runs."""
        info = {"session": self._KIND, "fingerprint": self._fingerprint(),
                "inputs": sorted(self._lowered.inputs), "anchors": sorted(self._lowered.anchors)}
        try:
            exefile.write(path, self._EXE_KIND, {"session.json": info}, info)
        except exefile.executable_file_error as e:
            raise popart_exception(f"Cannot save the executable: {e}") from None

    def _load_lowered(self, path) -> None:
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else "<stream>"
        try:
            info = exefile.read(path, self._EXE_KIND).json("session.json")
        except exefile.executable_file_error as e:
            raise popart_exception(f"Cannot load the executable '{name}': {e}") from None
        if not isinstance(info, dict) or not isinstance(info.get("fingerprint"), str):
            raise popart_exception(f"Cannot load the executable '{name}': its session record is malformed")
        if info["fingerprint"] != self._fingerprint():
            raise popart_exception(f"The executable '{name}' was compiled from another model, data flow, "
                                   "options or target than this session's")
        done = _COMPILED.get(self._fingerprint())
        if done is None:
            self._compile()
            return
        try:
            exe = poplar.Executable.from_compiled(done.popart_lowered.graph, done.popart_lowered.programs,
                                                  self._engine_options(), done.compiled)
            engine = poplar.Engine(exe, None, self._engine_options())
        except poplar.poplar_error as e:
            raise poplar_exception(str(e), e) from None
        self._lowered, self._engine = done.popart_lowered, engine

    def compileAndExport(self, filename) -> None:  # noqa: N802
        """Compile (unless done) and write the executable to ``filename`` (a path or a binary file
        object) in openipu's executable format; :meth:`loadExecutable` reads it back."""
        if self._engine is None:
            self.prepareDevice(loadEngine=False)
        self._save_lowered(filename)

    def saveExecutable(self, path, savePopartMetadata: bool = True, saveVariables: bool = True) -> None:  # noqa: N802,N803
        """Write the prepared executable to ``path`` (a directory gets ``executable.popef``)."""
        if self._engine is None:
            raise popart_exception("There is no executatable. Try calling Session::prepareDevice first.")
        if os.path.isdir(path):
            path = os.path.join(path, "executable.popef")
        self._save_lowered(path)

    def loadExecutable(self, filename) -> None:  # noqa: N802
        """Use the executable in ``filename`` (from :meth:`compileAndExport` / :meth:`saveExecutable`)
        instead of compiling; call before ``prepareDevice`` (which then only loads the engine).
        Raises ``popart_exception`` for a file that is not a readable executable of this session's
        model, data flow, options and target."""
        self._load_lowered(filename)

    def _oom(self, e, lowered, opts):
        summary = ""
        try:
            eng = poplar.Engine(lowered.graph, lowered.programs, {**opts, "debug.allowOutOfMemory": "true"})
            buf = io.StringIO()
            eng.printProfileSummary(buf)
            summary = buf.getvalue()
        except Exception:  # the summary is best effort
            pass
        return OutOfMemoryException(e, summary, getattr(e, "profilePath", None))

    def loadEngineAndConnectStreams(self) -> None:  # noqa: N802
        if self._engine is None:
            raise popart_exception("There is no executatable. Try calling Session::prepareDevice first.")
        if self.deviceInfo.type == DeviceType.OfflineIpu:
            return
        self.deviceInfo.attach()
        self._engine.load(self.deviceInfo.device)
        self._fast = None               # a new device: the executor (if any) starts from the host copies
        self._ir_executor()
        self._send_seed()

    def _check_runnable(self):
        if self._engine is None:
            raise popart_exception("There is no executatable. Try calling Session::prepareDevice first.")
        if self.deviceInfo.type == DeviceType.OfflineIpu:
            raise popart_exception("Cannot run on an offline IPU device: it can only compile. Acquire a device with "
                                   "DeviceManager().acquireAvailableDevice() to run")
        if self._engine._storage is None:
            self.loadEngineAndConnectStreams()

    # -- run ------------------------------------------------------------------------------
    def run(self, stepio, debugName: str = "") -> None:  # noqa: N803
        """Run ``batchesPerStep`` batches with ``stepio`` (PyStepIO or PyStepIOCallback).

        Raises ``popart_exception`` / ``popart_runtime_error`` with PopART's messages for a
        missing, unknown, non-contiguous, wrongly sized or wrongly typed buffer; nothing runs
        then, and the session stays usable.
        """
        if isinstance(stepio, str) and not isinstance(debugName, str):   # run(programHandle, stepio)
            stepio, debugName = debugName, ""
        self._check_runnable()
        eng = self._engine
        if isinstance(stepio, PyStepIOCallback):
            self._connect_callbacks(stepio)
        elif isinstance(stepio, PyStepIO):
            self._connect_buffers(stepio)
        else:
            raise popart_exception(f"run expects a popart.PyStepIO or PyStepIOCallback, got {type(stepio).__name__}")
        fast = self._ir_executor()
        try:
            if fast is not None:        # outputs from the IR executor, the prediction from the program
                anchors = [t for t in self._lowered.anchors if self._lowered.anchors[t] is not None]
                t0 = time.perf_counter()
                if isinstance(stepio, PyStepIO):
                    fast.run(stepio.inputs, {t: stepio.outputs[t] for t in anchors}, self._dataflow.batchesPerStep())
                else:
                    fast.run_callbacks(stepio, anchors, self._dataflow.batchesPerStep())
                eng.predict_run(0, debugName, functional_seconds=time.perf_counter() - t0)
            else:
                eng.run(0, debugName)
        except poplar.application_runtime_error as e:
            raise poplar_application_runtime_error(str(e), e) from None
        except poplar.poplar_error as e:
            raise poplar_exception(str(e), e) from None
        self._last_run = True
        self._last_cycles = eng.last_run_cycles

    def _ir_executor(self):
        """The session's :class:`openipu.popart.execute.IrExecutor` (``OPENIPU_EXECUTION=ir``, the default)
        when it covers the session (else ``None``: the device emulation runs it)."""
        from openipu.popart import execute
        try:
            m = execute.mode()
        except ValueError as e:
            raise popart_exception(str(e)) from None
        if getattr(self, "_fast", None) is None and m == "ir":
            why = execute.unsupported(self)
            if why is None:
                self._fast = execute.IrExecutor(self._ir, self._host_weights, self.replicationFactor,
                                                self.accumulationFactor if self._ir.training is not None else 1,
                                                out=getattr(self._engine, "_out", None),
                                                distributed=self.options.getGlobalReplicationFactor()
                                                > self.replicationFactor, groups=self._replica_group)
                if self._ir.training is not None and self._engine is not None:
                    self._fast.set_weights({k: np.asarray(v) for k, v in self._scalars(self._optimizer).items()
                                            if k in self._ir.optimizer_tensors})
            else:
                log("session").info("Running on the device emulation: the IR executor does not cover %s", why)
                self._fast = False
        return getattr(self, "_fast", None) or None

    def _expected_in(self, tid):
        o = self.options
        return self._ir.tensors[tid].info.nelms() * int(o.accumulationFactor) * self._dataflow.batchesPerStep() * \
            int(o.replicatedGraphCount)

    def _size_message(self, tid, what, expected, got, art=None):
        o = self.options
        msg = (f"Unexpected number of {what} elements for Tensor {tid}. Expected {expected}, but received {got}.\n"
               "To disable this check at your own risk, use IStepIO::enableRuntimeAsserts.\nThis with, "
               f"\n   replication  factor = {int(o.replicatedGraphCount)}"
               f"\n   accumulation factor = {int(o.accumulationFactor)}"
               f"\n   batches per step    = {self._dataflow.batchesPerStep()}"
               f"\n   Tensor nelms        = {self._ir.tensors[tid].info.nelms()}")
        if art is not None:
            msg += f"\nThe anchor return type is  {art.str()}"
            if art.id() == AnchorReturnTypeId.EveryN:
                msg += f"\nThe return period is {art.rp()}"
        return msg

    def _check_array(self, tid, arr, what):
        info = self._ir.tensors[tid].info
        if not isinstance(arr, np.ndarray):
            raise popart_exception(f"PyStepIO {what} for tensor '{tid}' must be a numpy array, got "
                                   f"{type(arr).__name__}")
        if not arr.flags["C_CONTIGUOUS"]:
            raise popart_exception(
                f"PyStepIO is unable to use the numpy {what} array for tensor '{tid}' as it is not c-contiguous (a "
                "data conversion here could have a significant impact on performance and hence is not allowed)")
        try:
            user = dtype_name(arr.dtype)
        except popart_exception:
            user = str(arr.dtype).upper()
        if user != info.data_type():
            raise popart_exception(f"Type discrepancy for tensor {tid}. User provided : {user} and expected : "
                                   f"{info.data_type()}. Consider a custom copy here (as memcpy cannot be used)")
        if user in ("INT64", "UINT64") and self.options.enableSupportedDataTypeCasting and not self._warned_int64:
            log("devicex").warning("Tensor %s: %s host data is narrowed to %s32 on the device "
                                   "(enableSupportedDataTypeCasting)", tid, user, user[:-2])
            self._warned_int64 = True

    def _connect_buffers(self, stepio: PyStepIO):
        ir, low, eng = self._ir, self._lowered, self._engine
        for tid in stepio.inputs:
            if tid not in ir.tensors and tid not in ir.onnx_tensor_ids:
                raise popart_runtime_error(
                    f"Testing that the buffer provided by user for input Tensor {tid} has the correct number of "
                    f"elements, But there is no Tensor named {tid} in the Ir's main Graph, and it does not exist in "
                    "the original ONNX Model.")
            if tid not in ir.model_input_ids:
                raise popart_exception(
                    f"The tensor '{tid}' has been provided as one of the inputs to the stepIO, but it is not "
                    "registered as one of the inputs to the model. Please check this tensor and your stepIO.")
        plan = []
        for tid in ir.stream_inputs:
            if tid not in low.inputs:
                if tid in stepio.inputs:
                    log("session").warning(
                        "The input Tensor %s to the ONNX Model does not appear in the optimized PopART Ir, possibly "
                        "due to constant folding. Therefore, the input buffer provided will not be used. ", tid)
                continue
            if tid not in stepio.inputs:
                raise popart_runtime_error(f"No tensor {tid} provided in PyStepIO's inputs")
            arr = stepio.inputs[tid]
            if low.inputs[tid] is not None or not isinstance(arr, np.ndarray):
                # with syntheticDataMode (no host stream) PopART never reads the buffer, so
                # only its element count is checked, not its type or layout
                self._check_array(tid, arr, "input")
            exp = self._expected_in(tid)
            if stepio._runtime_asserts and arr.size != exp:
                raise popart_runtime_error(self._size_message(tid, "input", exp, arr.size))
            if arr.size % max(ir.tensors[tid].info.nelms(), 1) or arr.size == 0 and exp:
                raise popart_runtime_error(self._size_message(tid, "input", exp, arr.size))
            if low.inputs[tid] is not None:
                plan.append((low.inputs[tid], arr))
        bps, repl, accl = self._dataflow.batchesPerStep(), int(self.options.replicatedGraphCount), \
            int(self.options.accumulationFactor)
        for tid in stepio.outputs:
            if tid not in ir.tensors:
                raise popart_runtime_error(
                    f"Testing that the buffer provided by user for output Tensor {tid} has the correct number of "
                    f"elements, But there is no Tensor named {tid} in the Ir's tensors. ")
        for tid, h in low.anchors.items():
            if tid not in stepio.outputs:
                raise popart_runtime_error(f"No tensor {tid} provided in PyStepIO's outputs")
            arr = stepio.outputs[tid]
            self._check_array(tid, arr, "output")
            art = self._dataflow.art(tid)
            exp = anchor_elements(art, ir.tensors[tid].info.nelms(), bps, accl, repl)
            if arr.size != exp:
                raise popart_runtime_error(self._size_message(tid, "output", exp, arr.size, art))
            if not arr.flags["WRITEABLE"]:
                raise popart_exception(f"The output array for anchor '{tid}' is read-only")
            if h is not None:
                plan.append((h, arr))
        for h, arr in plan:
            eng.connectStream(h, arr.reshape(-1))

    def _connect_callbacks(self, cb: PyStepIOCallback):
        eng, low = self._engine, self._lowered

        def make_in(tid):
            def fill(arr):
                data = cb.input_callback(tid, False)
                if data is None:
                    raise popart_runtime_error(f"The input callback for tensor {tid} returned no data")
                arr.reshape(-1)[:] = np.asarray(data).reshape(-1)[:arr.size]
                cb.input_complete_callback(tid)
            return fill

        def make_out(tid):
            def take(arr):
                dst = cb.output_callback(tid)
                np.asarray(dst).reshape(-1)[:arr.size] = arr.reshape(-1)
                cb.output_complete_callback(tid)
            return take

        for tid, h in low.inputs.items():
            if h is not None:
                eng.connectStreamToCallback(h, make_in(tid))
        for tid, h in low.anchors.items():
            if h is not None:
                eng.connectStreamToCallback(h, make_out(tid))

    # -- anchors and info -----------------------------------------------------------------
    def initAnchorArrays(self) -> dict:  # noqa: N802
        """Zeroed numpy arrays for every anchor, shaped by PopART's rule
        (:func:`openipu.popart.dataflow.anchor_shape`)."""
        out = {}
        bps = self._dataflow.batchesPerStep()
        for a in self._dataflow.anchors():
            info = self.getInfo(a)
            shape = anchor_shape(self._dataflow.art(a), info.shape(), bps, self.accumulationFactor,
                                 self.replicationFactor)
            out[a] = np.zeros(shape, dtype=info.numpy_dtype())
        return out

    def getInfo(self, tid: str) -> TensorInfo:  # noqa: N802
        return self._ir.info(tid)

    def getAllTensorIds(self) -> set:  # noqa: N802
        return set(self._ir.tensors)

    def ops(self) -> list:
        """The IR ops in execution order (openipu extension; see the module docstring)."""
        return list(self._ir.ops)

    def getCycleCount(self, id: str = "") -> int:  # noqa: A002,N802
        """Predicted IPU cycles of the last ``run`` (max over IPUs). PopART needs
        ``instrumentWithHardwareCycleCounter``; the simulator always has the count."""
        if id:
            raise popart_exception(f"Invalid id for cycle counter, '{id}'. The simulator keeps one (the default) "
                                   "cycle count per run")
        if self._engine is None or not self._last_run:
            raise popart_exception("Must call run before getCycleCount.")
        return self._last_cycles

    def getSummaryReport(self, resetProfile: bool = True) -> str:  # noqa: N802,N803
        """Poplar's profile summary (predicted cycles and tile memory) as text."""
        if self._engine is None:
            raise popart_exception("Session must have been prepared before a report can be fetched")
        buf = io.StringIO()
        self._engine.printProfileSummary(buf)
        if resetProfile:
            self._engine.resetExecutionProfiling()
        return buf.getvalue()

    def getReport(self):  # noqa: N802
        """The profile as a ``pva.Report`` (libpva's API: ``report.compilation.tiles[i].memory``,
        ``report.execution.runs`` ...): the engine's ``profile.pop``, written to a temporary
        directory unless ``autoReport.directory`` names one."""
        if self._engine is None:
            raise popart_exception("Session must have been prepared before a report can be fetched")
        import tempfile

        from openipu.poplar.profile import write_profile
        from openipu.popvision import openReport
        opts = self._engine.options
        if opts.get_bool("autoReport.all") or opts.get_bool("autoReport.outputExecutionProfile"):
            return openReport(write_profile(opts.get("autoReport.directory", "./"), self._engine.graph,
                                            self._engine._compiled, self._engine))
        with tempfile.TemporaryDirectory(prefix="openipu-report-") as d:
            return openReport(write_profile(d, self._engine.graph, self._engine._compiled, self._engine))

    def getRandomSeed(self) -> int:  # noqa: N802
        """The seed last given to :meth:`setRandomSeed` (else the one the session drew). Warns
        and returns 0 when the session has no random op."""
        seed = self._ir.random_seed
        if seed is None:
            log("session").warning("Trying to get the random seed, but this session has no random behaviour. Doing "
                                   "nothing.")
            return 0
        if self._engine is None:
            raise popart_exception("There is no executatable. Try calling Session::prepareDevice first.")
        w = np.asarray(self._ir.tensors[seed].value, np.uint64).reshape(-1)
        return int(w[0]) | (int(w[1]) << 32)

    def _serializeIr(self, format=None) -> str:  # noqa: N802,A002
        """The IR as PopART's JSON text (:mod:`openipu.popart.ir_json`)."""
        return ir_json.serialize(self._ir)

    def setRandomSeed(self, seed: int) -> None:  # noqa: N802
        """Seed the session's random ops (dropout in training ...) with the 64-bit ``seed``: the
        same seed gives the same masks, batch after batch (the seed advances by one each
        batch). Needs ``prepareDevice()`` first; with no random op it only warns (PopART)."""
        tid = self._ir.random_seed
        if tid is None:
            log("session").warning("Trying to set the random seed, but this session has no random behaviour. Doing "
                                   "nothing.")
            return
        if self._engine is None:
            raise popart_exception("There is no executatable. Try calling Session::prepareDevice first.")
        from openipu.popart.transforms.random_seed import seed_words
        self._ir.tensors[tid].value = seed_words(seed)
        self._rng_words = rng_state.from_seed(seed, self._rng().size)     # PopART derives a new RNG state
        if self._engine._storage is not None:
            self._send_seed()

    def _send_seed(self) -> None:
        low = self._lowered
        tid = self._ir.random_seed
        if tid is None or tid not in low.seed_in:
            return
        buf = np.ascontiguousarray(np.asarray(self._ir.tensors[tid].value, np.uint32).reshape(-1))
        self._engine.connectStream(low.seed_in[tid], buf)
        self._engine.run(4, "randomSeedFromHost")
        if getattr(self, "_fast", None):
            self._fast.set_weights({tid: buf.reshape(2)})

    # -- weights --------------------------------------------------------------------------
    def weightsFromHost(self) -> None:  # noqa: N802
        """Copy the host copies of the weights (``constantWeights=False``) to the device."""
        self._check_runnable()
        if not self._lowered.weights_in:
            return
        sharded = self._ir.sharded_state
        for tid, h in self._lowered.weights_in.items():
            host = self._host_weights[tid]
            # a sharded optimizer state: each replica receives its piece
            if tid in self._replica_group:      # a grouped variable: each replica its group's value
                host = np.ascontiguousarray(self._replica_view(tid))
            self._engine.connectStream(h, self._local_pieces(tid).reshape(-1) if tid in sharded else host.reshape(-1))
        self._engine.run(1, "weightsFromHost")
        if getattr(self, "_fast", None):
            self._fast.set_weights(self._host_weights)

    def weightsToHost(self) -> None:  # noqa: N802
        """Copy the device weights back to their host copies."""
        self._check_runnable()
        if not self._lowered.weights_out:
            return
        if getattr(self, "_fast", None):
            for tid in self._lowered.weights_out:
                if tid in self._replica_group or self._returns_all(tid):
                    self._store_replicas(tid, self._fast.get_replica_weights(tid))
                else:
                    self._host_weights[tid].reshape(-1)[:] = self._fast.get_weight(tid).reshape(-1)
            return
        repl = self.replicationFactor
        sharded = self._ir.sharded_state
        # one replica, not sharded: the device writes straight into the host copy (the engine keeps
        # a connected buffer, so a staging buffer per weight would stay alive: one more host copy
        # of every weight and optimizer state)
        bufs = {tid: (self._local_pieces(tid) if tid in sharded else
                      np.zeros((repl, *self._ir.tensors[tid].info.shape()), self._host_weights[tid].dtype))
                for tid in self._lowered.weights_out if repl > 1 or tid in sharded}
        for tid, h in self._lowered.weights_out.items():
            self._engine.connectStream(h, (bufs[tid] if tid in bufs else self._host_weights[tid]).reshape(-1))
        self._engine.run(2, "weightsToHost")
        for tid, b in bufs.items():
            host = self._host_weights[tid]
            if tid in sharded and sharded[tid][1] > repl:       # the other instances' pieces too
                b = self._gather_pieces(tid, b)
            # a sharded optimizer state: the replicas' pieces, in order, trimmed
            if tid in sharded:
                host[...] = b.reshape(-1)[:host.size].reshape(host.shape)
            else:
                self._store_replicas(tid, b)

    def _local_pieces(self, tid: str) -> np.ndarray:
        """This instance's replicas' pieces of the sharded state ``tid``: ``[local replicas,
        ceil(n / shards)]``, the rows ``[globalReplicaOffset, + local)`` of its ``shard_rows`` over
        all (global) replicas."""
        shards = self._ir.sharded_state[tid][1]
        off = int(self.options.globalReplicaOffset) if shards > self.replicationFactor else 0
        return np.ascontiguousarray(shard_rows(self._host_weights[tid], shards)[off:off + self.replicationFactor])

    def _gather_pieces(self, tid: str, local: np.ndarray) -> np.ndarray:
        """Every instance's pieces of the sharded state ``tid`` (a distributed replicated graph):
        ``[global replicas, k]`` from this instance's ``[local, k]``, over ``torch.distributed``
        (every instance must call ``weightsToHost``). Raises ``popart_exception`` when an
        instance is lost or the gather times out."""
        import torch

        from openipu.poplar.errors import poplar_error
        from openipu.poplibs import gcl_instances
        try:
            return gcl_instances.gather_replicas(torch.from_numpy(local), f"weightsToHost {tid}").numpy()
        except poplar_error as e:
            raise popart_exception(str(e)) from None

    def _check_writable_weights(self, what: str):
        if self.options.constantWeights:
            raise popart_exception(f"Cannot call {what} when constantWeights is set. Set "
                                   "SessionOptions.constantWeights = False so that weights are device variables")

    def writeWeights(self, weightsIo) -> None:  # noqa: N802,N803
        """Set weights from ``PyWeightsIO``: the host copies, and the device too once prepared."""
        if not all(tid in self._host_weights for tid in weightsIo.weights):    # (grouped weights stay
            self._check_writable_weights("writeWeights")                         # variables)
        for tid, arr in weightsIo.weights.items():
            if tid not in self._host_weights:
                raise popart_exception(f"Tensor {tid} is not a weight of this session: weights are "
                                       f"{', '.join(sorted(self._host_weights)) or 'none'}")
            dst = self._host_weights[tid]
            arr = np.asarray(arr)
            per = self._ir.tensors[tid].info.nelms()
            if arr.size == self.replicationFactor * per != dst.size and self._returns_all(tid):
                # AllReplicas: one value per replica; each group takes its first replica's
                self._store_replicas(tid, arr.reshape(self.replicationFactor, -1))
                self._replica_values.pop(tid, None)
                continue
            if arr.size != dst.size:
                raise popart_exception(f"writeWeights: tensor {tid} has {dst.size} elements but the buffer has "
                                       f"{arr.size}")
            dst.reshape(-1)[:] = arr.reshape(-1).astype(dst.dtype)
            self._replica_values.pop(tid, None)
        if self._engine is not None and self._engine._storage is not None:
            self.weightsFromHost()

    def readWeights(self, weightsIo) -> None:  # noqa: N802,N803
        """Fill ``PyWeightsIO`` arrays from the host copies (call ``weightsToHost`` first)."""
        for tid, arr in weightsIo.weights.items():
            if tid in self._host_weights:
                src = self._returned_values(tid)
            elif tid in self._ir.tensors and self._ir.tensors[tid].kind == "Const" and tid in self._initializers():
                src = self._ir.tensors[tid].value
            else:
                raise popart_exception(f"Tensor {tid} is not a weight of this session")
            if arr.size != src.size:
                raise popart_exception(f"readWeights: tensor {tid} has {src.size} elements but the buffer has "
                                       f"{arr.size}")
            arr.reshape(-1)[:] = src.reshape(-1)

    def _initializers(self) -> set:
        return {i.name for i in self._ir.model.graph.initializer}

    def modelToHost(self, fn: str) -> None:  # noqa: N802
        """Write the ONNX model with the current weights (fetched from the device) to ``fn``. A
        training session also writes its optimizer state (``Accl1___<w>``, ``Step___<w>``, ...)
        as initializers, as PopART does: a session made from that file resumes from it."""
        if self._engine is not None and self._engine._storage is not None and self._host_weights:
            self.weightsToHost()
        m = onnx.ModelProto()
        m.CopyFrom(self._ir.model)
        names = set()
        # PopART's storage (openipu.popart.tensor_proto): each initializer keeps its field
        # (raw_data, or float_data ...), the optimizer state is added in the typed fields
        for init in m.graph.initializer:
            names.add(init.name)
            if init.name in self._host_weights:
                tensor_proto.write_into(init, self._host_weights[init.name])
                if init.name in self._replica_group:     # grouped: the [groups, *shape] value
                    del init.dims[:]
                    init.dims.extend(self._host_weights[init.name].shape)
                    for vi in m.graph.input:
                        if vi.name == init.name:
                            dims = vi.type.tensor_type.shape.dim
                            del dims[:]
                            for d in self._host_weights[init.name].shape:
                                dims.add().dim_value = int(d)
            elif init.name in self._ir.weights:     # a weight the IR took out of its proto
                tensor_proto.write_into(init, np.asarray(self._ir.weights[init.name]))
        for tid, arr in self._host_weights.items():
            if tid not in names:                   # optimizer state
                m.graph.initializer.append(tensor_proto.typed_tensor(arr, tid))
        onnx.save(m, fn)

    def resetHostWeights(self, modelProtoOrFilename, ignoreWeightsInModelWithoutCorrespondingHostWeight=False):  # noqa: N802,N803
        self._check_writable_weights("resetHostWeights")
        from openipu.popart.builder import _load_model
        m = _load_model(modelProtoOrFilename)
        for init in m.graph.initializer:
            if init.name in self._host_weights:
                self._host_weights[init.name][...] = numpy_helper.to_array(init)
            elif not ignoreWeightsInModelWithoutCorrespondingHostWeight:
                raise popart_exception(f"resetWeights, no tensor '{init.name}' in tensors")


class InferenceSession(_SessionBase):
    """``popart.InferenceSession(fnModel, dataFlow, deviceInfo, inputShapeInfo=InputShapeInfo(),
    patterns=None, userOptions=SessionOptions(), name="inference")``.

    ``fnModel``: ONNX bytes or a file path. The IR is built here (errors: bad model, unsupported
    op, no anchors, option conflicts); ``prepareDevice()`` compiles; ``run(PyStepIO)`` runs
    ``batchesPerStep`` batches. ``dataFeed=`` is accepted as the SDK 1.x name of ``dataFlow``.
    """

    def __init__(self, fnModel, dataFlow=None, deviceInfo=None, inputShapeInfo=None, patterns=None,  # noqa: N803
                 userOptions=None, name: str = "inference", dataFeed=None):  # noqa: N803
        if dataFlow is None and dataFeed is not None:
            dataFlow = dataFeed
        super().__init__(fnModel, dataFlow, deviceInfo, inputShapeInfo, patterns, userOptions, name)

    @classmethod
    def fromIr(cls, ir, deviceInfo, name="fromIr"):  # noqa: N802,N803
        raise popart_exception("InferenceSession.fromIr (PopXL) is not supported by openipu")

    def checkInplacingAmbiguity(self) -> None:  # noqa: N802
        pass



class TrainingSession(_SessionBase):
    """``popart.TrainingSession(fnModel, dataFlow, loss, optimizer, deviceInfo,
    inputShapeInfo=InputShapeInfo(), patterns=None, userOptions=SessionOptions(), name="training")``.

    ``loss``: the id of a scalar float tensor (a loss op's output, e.g. ``aiGraphcore.nllloss``);
    ``optimizer``: :class:`popart.SGD` / :class:`popart.ConstSGD` / :class:`popart.Adam` /
    :class:`popart.Adaptive`. The constructor builds the forward IR, the backward ops
    (:mod:`openipu.popart.transforms.autodiff`) and the updates of every trainable weight (every
    float initializer with a path to the loss; :mod:`openipu.popart.transforms.optimizer`); each
    ``run`` runs ``batchesPerStep`` weight updates, each of ``accumulationFactor`` micro-batches
    per replica (``replicatedGraphCount`` replicas all-reduce their gradients). Weight gradients
    are anchorable as ``Gradient___<weight>``.

    Raises ``popart_exception``: "Could not find loss tensor '...' in main graph tensors", "Loss
    tensor, '...', must be a scalar tensor", an op without a gradient on a weight's path to the
    loss, and the InferenceSession's errors.
    """

    _KIND = "TrainingSession"

    def __init__(self, fnModel, dataFlow=None, loss=None, optimizer=None, deviceInfo=None,  # noqa: N803
                 inputShapeInfo=None, patterns=None, userOptions=None, name: str = "training",  # noqa: N803
                 dataFeed=None, losses=None):
        from openipu.popart.optimizer import Optimizer
        if dataFlow is None and dataFeed is not None:
            dataFlow = dataFeed
        if losses is not None:
            raise popart_exception("TrainingSession takes loss=<tensor id> (the `losses` list was removed in PopART "
                                   "1.2): build the loss with builder.aiGraphcore.nllloss / l1loss / identityloss")
        if not isinstance(loss, str):
            raise popart_exception(f"TrainingSession needs loss=<tensor id> (a str), got {type(loss).__name__}")
        if not isinstance(optimizer, Optimizer):
            raise popart_exception("TrainingSession needs an optimizer (popart.ConstSGD, popart.SGD), got "
                                   f"{type(optimizer).__name__}")
        self._optimizer = optimizer
        self._weights_sent = False
        super().__init__(fnModel, dataFlow, deviceInfo, inputShapeInfo, patterns, userOptions, name,
                         training={"loss": loss, "optimizer": optimizer, "patterns": patterns})

    def getTensorIds(self) -> set:  # noqa: N802
        return set(self._ir.tensors)

    def _check_writable_weights(self, what: str):
        pass        # a training session's weights are always device variables

    def getIr(self):  # noqa: N802
        return self._ir

    def weightsFromHost(self) -> None:  # noqa: N802
        super().weightsFromHost()
        self._send_optimizer()
        self._weights_sent = True

    def broadcastWeights(self, rootRank: int = 0) -> None:  # noqa: N802,N803
        """PopART ``Session::broadcastWeights(rootRank=0)``: overwrite this instance's host copies
        of the weights (every variable: weights and optimizer state) with those of the PopRun
        instance ``rootRank``, over ``torch.distributed`` (:mod:`openipu.poplibs.gcl_instances`).
        Call ``weightsFromHost()`` afterwards to send them to the device. A no-op in a single
        instance. Raises ``popart_exception`` for a ``rootRank`` outside the instances, or when
        an instance is lost or the broadcast times out."""
        import torch

        from openipu.poplar.errors import poplar_error
        from openipu.poplibs import gcl_instances
        self._check_runnable()
        ids = sorted(self._host_weights)
        try:
            gcl_instances.broadcast_tensors_from([torch.from_numpy(self._host_weights[t]) for t in ids],
                                                 int(rootRank), "broadcastWeights")
        except poplar_error as e:
            raise popart_exception(str(e)) from None

    def run(self, stepio, debugName: str = "") -> None:  # noqa: N803
        """One step: ``batchesPerStep`` forward, backward and weight-update passes. Raises
        "Must call weightsFromHost before run ..." when the weights were never sent."""
        self._check_runnable()
        if not self._weights_sent and self._host_weights:
            raise popart_exception("Must call weightsFromHost before run as the model has initializers and the "
                                   "session has been created in training mode")
        super().run(stepio, debugName)

    def _scalars(self, opt) -> dict:
        from openipu.popart.transforms.optimizer import LOSS_SCALING_PREFIX, loss_seed, scalar_values
        vals = scalar_values(opt, list(self._ir.weight_grads), self.options, self._ir.variable_settings)
        loss = self._ir.training["loss"]
        ls = f"{LOSS_SCALING_PREFIX}{self._ir.tensors[loss].info.data_type()}"
        if ls in self._ir.optimizer_tensors:
            vals[ls] = loss_seed(opt, self.options)
        return vals

    def _send_optimizer(self):
        low = self._lowered
        if not low.optimizer_in:
            return
        bufs = {}
        for tid, val in self._scalars(self._optimizer).items():
            if tid in low.optimizer_in:
                info = self._ir.tensors[tid].info
                bufs[tid] = np.full(max(info.nelms(), 1), val, info.numpy_dtype())
                self._engine.connectStream(low.optimizer_in[tid], bufs[tid])
        self._engine.run(3, "optimizerFromHost")
        if getattr(self, "_fast", None):
            self._fast.set_weights({tid: b.reshape(self._ir.tensors[tid].info.shape()) for tid, b in bufs.items()})

    def updateOptimizerFromHost(self, optimizer) -> None:  # noqa: N802
        """Replace the optimizer's non-const values (learning rate, momentum, ...) on the device.
        Raises ``popart_exception`` when ``optimizer`` is not compatible (another type, or a const
        value changed: "Values are constant but do not match.")."""
        self._optimizer.check_compatible(optimizer)
        self._optimizer = optimizer
        for tid, val in self._scalars(optimizer).items():
            self._ir.tensors[tid].value = np.asarray(val, self._ir.tensors[tid].info.numpy_dtype())
        if self._engine is not None and self._engine._storage is not None:
            self._send_optimizer()
