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

from openipu import poplar
from openipu.poplar import exefile
from openipu.popart import debug_info
from openipu.popart.dataflow import DataFlow
from openipu.popart.devices import DeviceInfo, DeviceType
from openipu.popart.errors import (OutOfMemoryException, popart_exception, popart_runtime_error, poplar_exception,
                                   poplar_application_runtime_error)
from openipu.popart.grouped_weights import GroupedWeightsMixin
from openipu.popart.host_weights import HostWeightsMixin
from openipu.popart.step_io_checks import StepIoMixin
from openipu.popart import ir_json, rng_state
from openipu.popart.ir import Ir
from openipu.popart.log import log
from openipu.popart.options import Instrumentation, SessionOptions
from openipu.popart.stepio import PyStepIO, PyStepIOCallback
from openipu.popart.tensorinfo import TensorInfo


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

class _SessionBase(rng_state.RngStateApi, GroupedWeightsMixin, HostWeightsMixin, StepIoMixin):
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
        debug_info.record_ir(self._ir, type(self).__name__)      # popart.initializePoplarDebugInfo
        self._engine = None
        self._lowered = None
        self._host_weights = {tid: np.require(self._ir.tensors[tid].value, requirements=["C", "W"]) for tid in self._ir.variables()}
        self._group_host_weights()
        self._warned_int64 = False
        self._last_run = False
        self._last_ipu_cycles = None

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
        if not self.deviceInfo.isAttached and not self.deviceInfo.tryAttachUntilTimeout():
            raise popart_exception(f"Failed to attach to device {self.deviceInfo.id}: it is attached by another "
                                   "process (DeviceManager.setOnDemandAttachTimeout sets how long to wait)")
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
        self._last_ipu_cycles = eng._runs[-1]["cycles_per_ipu"].copy() if eng._runs else None

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
                                                > self.replicationFactor, groups=self._replica_group,
                                                sr_seed=getattr(self, "_sr_seed", 0),
                                                target=self.deviceInfo.device.getTarget())
                if self._ir.training is not None and self._engine is not None:
                    self._fast.set_weights({k: np.asarray(v) for k, v in self._scalars(self._optimizer).items()
                                            if k in self._ir.optimizer_tensors})
            else:
                log("session").info("Running on the device emulation: the IR executor does not cover %s", why)
                self._fast = False
        return getattr(self, "_fast", None) or None

    def getInfo(self, tid: str) -> TensorInfo:  # noqa: N802
        return self._ir.info(tid)

    def getAllTensorIds(self) -> set:  # noqa: N802
        return set(self._ir.tensors)

    def ops(self) -> list:
        """The IR ops in execution order (openipu extension; see the module docstring)."""
        return list(self._ir.ops)

    def getCycleCount(self, id: str = "") -> int:  # noqa: A002,N802
        """Predicted IPU cycles of the last ``run`` (PopART's hardware cycle counters, which need
        ``instrumentWithHardwareCycleCounter``; the simulator always has the counts). ``id``
        ``""`` (``Instrumentation.Outer``): the whole run, the maximum over the IPUs.
        ``"inner_ipu_<i>"`` (with ``Instrumentation.Inner`` in ``hardwareInstrumentations``, as
        PopART instruments the first tile of every IPU of a replica): IPU ``i``'s predicted
        cycles of one batch of the last run (the run's cycles on that IPU over
        ``batchesPerStep``). Raises ``popart_runtime_error`` before a run and for another id
        (PopART's texts)."""
        if self._engine is None or not self._last_run:
            raise popart_runtime_error("Must call run before getCycleCount.")
        if id == "":
            return self._last_cycles
        inner = Instrumentation.Inner in set(self.options.hardwareInstrumentations)
        per_replica = max(1, self._engine._exe.graph.getTarget().getNumIPUs() // max(1, self.replicationFactor))
        ids = {f"inner_ipu_{i}": i for i in range(per_replica)} if inner else {}
        if id not in ids or self._last_ipu_cycles is None:
            raise popart_runtime_error(f"Invalid id for cycle counter, '{id}'. Make sure you have set "
                                       "SessionOption::hardwareInstrumentations correctly.")
        return int(round(float(self._last_ipu_cycles[ids[id]]) / self._dataflow.batchesPerStep()))

    def getSummaryReport(self, resetProfile: bool = True) -> str:  # noqa: N802,N803
        """Poplar's profile summary (predicted cycles and tile memory) as text."""
        if self._engine is None:
            raise popart_exception("Session must have been prepared before a report can be fetched")
        buf = io.StringIO()
        self._engine.printProfileSummary(buf)
        if resetProfile:
            self._engine.resetExecutionProfiling()
        return buf.getvalue()

    def getSerializedGraph(self) -> bytes:  # noqa: N802
        """The compiled Poplar graph as bytes (PopART's ``getSerializedGraph``, whose bytes are
        Poplar's own graph serialisation; this one is openipu's): UTF-8 JSON ``{"format":
        "openipu-graph", "target": {numIPUs, tilesPerIPU, replicationFactor}, "variables":
        [{name, type, shape, constant, tiles}], "computeSets": [{name, vertices, vertexTypes}]}``
        (``tiles``: how many tiles hold the variable; ``vertices``: the vertex count of each
        compute set). Raises ``popart_exception`` before ``prepareDevice``."""
        if self._engine is None:
            raise popart_exception("Session must have been prepared before a report can be fetched")
        import json
        graph = self._engine._exe.graph
        state, tgt = graph._state, graph.getTarget()
        variables = [{"name": v.name, "type": str(v.type), "shape": [int(d) for d in v.shape],
                      "constant": bool(v.constant), "tiles": int(np.unique(v.tile_runs()[2]).size)}
                     for sp in state.spaces.values() for v in sp.vars]
        sets = []
        for cs in state.compute_sets:
            kinds = sorted({g.type_name for g in cs.groups})
            sets.append({"name": cs.name, "vertices": int(sum(len(g.tiles) for g in cs.groups)) + len(cs.user_vertices),
                         "vertexTypes": kinds})
        doc = {"format": "openipu-graph", "target": {"numIPUs": tgt.getNumIPUs(), "tilesPerIPU": tgt.getTilesPerIPU(),
                                                     "replicationFactor": self.replicationFactor},
               "variables": variables, "computeSets": sets}
        return json.dumps(doc).encode()

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
        self._sr_seed = int(seed)           # stochastic rounding's draws (IR executor)
        if getattr(self, "_fast", None) is not None:
            self._fast.sr_gen.manual_seed(int(seed) & 0xFFFFFFFFFFFFFFFF)
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
