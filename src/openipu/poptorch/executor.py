"""``PoplarExecutor`` (``research/poptorch.md`` 1.3): a wrapped model that compiles on its first
call (capture, lowering, a PopART session on the simulated IPU), then runs each call's
``deviceIterations`` (x replicas x gradient accumulation) micro-batches and returns the outputs
by the output mode.

Weights stay in sync with the ``torch.nn.Module`` (shared parameters): a training model copies
the trained weights (and BatchNorm's running statistics) back into the module after each call;
an inference model re-sends the module's weights when they changed since the last call (e.g.
trained by a ``trainingModel`` of the same module). Predicted IPU cycles of the last call:
``cycleCount()`` (with ``Options.logCycleCount(True)``); a prediction, not host time.

The class is split along its families: this module holds construction, compile, the call and
the device's lifetime; :mod:`._marshal` the call's inputs and outputs, :mod:`._weights` the
weights' sync with the module, :mod:`._timings` the timings, :mod:`._files` the executable files,
:mod:`._capture_guards` what the compile does around the capture, :mod:`._replica_grouping` the
replica-grouped parameters and :mod:`._hooks` the compile hooks and progress bar.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
import weakref

import numpy as np
import torch
import torch.utils._pytree as pytree

from openipu import popart
from openipu.poptorch import _device, _utils
from openipu.poptorch import capture as cap
from openipu.poptorch import optim as poptorch_optim
from openipu.poptorch.enums import ConnectionType, OutputMode
from openipu.poptorch._capture_guards import (_attributes_as_buffers, _no_reassignment, _tensor_attributes,
                                              _trace_attribute_mutations)
from openipu.poptorch._files import ExecutableFiles
from openipu.poptorch._hooks import (_POSTCOMPILE_HOOKS, _PRECOMPILE_HOOKS, _PopTorchBar,  # noqa: F401
                                     _progress_bar, registerPostCompileHook, registerPreCompileHook)
from openipu.poptorch._marshal import Marshalling, _detach_input, _error_on_backward
from openipu.poptorch._replica_grouping import ReplicaGrouping, _ReplicaGroupingParameter
from openipu.poptorch._timings import Timings
from openipu.poptorch._weights import WeightSync, _is_param, _to_numpy
from openipu.poptorch.errors import Error, from_popart

_log = logging.getLogger("poptorch")
NO_EXECUTABLE_ERR = "Model has not been compiled or has been destroyed."
_pylog = logging.getLogger("poptorch::python")

_ART = {OutputMode.All: "All", OutputMode.Final: "Final", OutputMode.Sum: "Sum"}
#: user model -> weak reference to the training wrapper that owns it (until ``destroy()``)
_TRAINING_WRAPPERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

#: torch.nn.Module's own attributes, which the wrapper forwards to the user model (``__getattr__``)
_MODULE_STATE = frozenset(torch.nn.Module().__dict__)

class PoplarExecutor(Marshalling, WeightSync, ReplicaGrouping, Timings, ExecutableFiles):
    """The object ``trainingModel`` / ``inferenceModel`` return (module docstring)."""

    def __init__(self, model: torch.nn.Module, options, training: bool, optimizer=None):
        from openipu.poptorch.options import Options
        if isinstance(model, PoplarExecutor):
            model = model._user_model
        options = (options or Options()).clone()
        if options.output_mode == OutputMode.Default:
            options.outputMode(OutputMode.Final if training else OutputMode.All)
        if not training and options.Training.gradient_accumulation != 1:
            raise Error("You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it as its default "
                        "value (1) when running a poptorch.inferenceModel().")
        options._freeze()
        if training:
            owner = _TRAINING_WRAPPERS.get(model)
            if owner is not None and owner() is not None:
                raise RuntimeError("Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy() "
                                   "on the model to unwrap before wrapping again.")
        if training:
            for b in model.buffers():
                if type(b) is not torch.Tensor:
                    raise Error(f"All buffers must be an instance of torch.Tensor (Got {type(b)})")
        if training and optimizer is None:
            optimizer = poptorch_optim.SGD(model.parameters(), lr=0.01)
        self._user_model = model
        # PopTorch wraps a shallow copy of the model: its own ``training`` flag is the one at
        # wrapping time (a later model.eval() / model.train() on the original does not change it)
        self._wrapped_training = model.training
        self._options = options
        self._training = training
        self._optimizer = optimizer
        self._session = None
        self._built = None
        self._signature = None
        self._attached = False
        self._uploaded_versions = None
        self._owners = None         # (built, [(tensor id, owning module, name, path)]): _weight_tensors
        #: the session's host copies of the variables are older than its device's (the weights
        #: were synced from the IR executor straight into the module): weightsToHost before
        #: sending host copies
        self._host_behind = False
        self._cycles = None
        self._compile_seconds = None
        self._perf = None
        self._rng_state = None
        #: replica-grouped parameters: path -> (CommGroupType, shards, VariableRetrievalMode)
        self._per_replica_params = {}
        if training:
            _TRAINING_WRAPPERS[model] = weakref.ref(self)
            parent = weakref.ref(self)

            def destroy():      # ``model.destroy()`` on the user model, as PopTorch's wrapped class has
                if parent() is not None:
                    parent().destroy()
            object.__setattr__(model, "destroy", destroy)

    # -- properties --------------------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        return self._user_model

    @property
    def options(self):
        return self._options

    def __getattr__(self, name):
        # unknown attributes are the user model's (PopTorch forwards them); of the private ones
        # only torch.nn.Module's own state (``_modules``, ``_parameters`` ...), which tools such
        # as torchinfo read: PopTorch's wrapper is a subclass of the model's class
        if name.startswith("_") and name not in _MODULE_STATE:
            raise AttributeError(name)
        attr = getattr(self._user_model, name)
        if isinstance(attr, torch.nn.Parameter):
            return _ReplicaGroupingParameter(self, name, attr)
        return attr

    def train(self, mode: bool = True):
        """``torch.nn.Module.train`` on the wrapped model, as on PopTorch's shallow copy: the
        wrapper's own top-level ``training`` flag becomes ``mode`` (the mode the model is captured
        in), the submodules, shared with the user's model, follow; the user model's top-level flag
        is left as it was. Takes effect at the next compile. Returns the wrapper."""
        top = self._user_model.training
        self._user_model.train(mode)
        self._user_model.training = top
        self._wrapped_training = bool(mode)
        return self

    def eval(self):
        """``train(False)``: ``inferenceModel(model).eval()`` captures ``model``'s inference path
        even when ``model`` was in training mode at wrapping time (PopTorch's shallow copy)."""
        return self.train(False)

    def isCompiled(self) -> bool:  # noqa: N802
        return self._session is not None

    def isAttachedToDevice(self) -> bool:  # noqa: N802
        return self._session is not None and self._attached

    # -- compile -------------------------------------------------------------------------------
    def compile(self, *args, **kwargs) -> None:
        """Capture and compile for these inputs without running (PopTorch's ``compile``; logs
        "Call to compile() ignored: the executable is already compiled" when it is). Calls the
        pre- and post-compile hooks (:func:`registerPreCompileHook`)."""
        if self._session is not None:
            _pylog.warning("Call to compile() ignored: the executable is already compiled")
            return
        start = time.perf_counter()
        model = self._user_model
        with _utils.custom_pytree_nodes((args, kwargs)):
            args_, kwargs_, tensors, others = self._bind(args, kwargs)
            micro = [_detach_input(t) for t in self._micro(tensors)]
            it = iter(micro)
            margs, mkwargs = pytree.tree_map(lambda v: next(it) if isinstance(v, torch.Tensor) else v,
                                             (args_, kwargs_))
            for hook in list(_PRECOMPILE_HOOKS.values()):
                hook()
            modes = [(m, m.training) for m in model.modules()]
            model.training = self._wrapped_training
            grouped, restore = self._replica_grouped()
            attrs = _tensor_attributes(model)
            from openipu.poptorch import ops as _ops
            _ops._overlaps.clear()
            _ops._capturing_training[0] = self._training
            try:
                with _attributes_as_buffers(model, attrs), _no_reassignment(model, set(attrs)):
                    ep = cap.capture(model, margs, mkwargs)
                _trace_attribute_mutations(model, ep, attrs, margs, mkwargs)
            finally:
                for m, mode in modes:
                    m.training = mode
                _ops._capturing_training[0] = False
                restore()
        strategy = getattr(self._options, "_execution_strategy", None)
        if _ops._overlaps:
            self._check_overlapped_io(strategy)
        built = cap.build(ep, [n for n, _ in tensors], self._training, strategy, constants=attrs,
                          broadcast_buffers=self._options.broadcast_buffers and self._options.replication_factor > 1,
                          grouped=grouped)
        self._built = built
        self._signature = ([(n, tuple(t.shape), t.dtype) for n, t in tensors], others)
        self._make_session(built)
        self._compile_seconds = time.perf_counter() - start
        for hook in list(_POSTCOMPILE_HOOKS.values()):
            hook()

    def _check_overlapped_io(self, strategy) -> None:
        """PopTorch's checks of a model with overlapped host I/O (``verifySettingsForOverlappedIO``)."""
        if getattr(strategy, "pipelined", True):        # None: PipelinedExecution, PopTorch's default
            raise Error("Overlapped IO is not supported with poptorch.PipelinedExecution. If you are using only one "
                        "IPU, please switch to poptorch.ShardedExecution.", type="poptorch_cpp_error")
        if self._options.TensorLocations.num_io_tiles == 0:
            raise Error("No IO tiles allocated. You must allocate at least 32 IO tiles using "
                        "poptorch.Options().TensorLocations.numIOTiles.", type="poptorch_cpp_error")
        if self._options.output_mode not in (OutputMode.All, OutputMode.Sum):
            raise Error("Unsupported output mode for overlapped IO. Please switch output mode to "
                        "poptorch.OutputMode.All or poptorch.OutputMode.Sum.", type="poptorch_cpp_error")

    def _report_options(self, so) -> dict | None:
        """PopART writes a session's reports to ``<autoReport.directory>/<session name>``, the
        name being ``Options.modelName`` or ``training`` / ``inference``: the engine options
        (code and ``POPLAR_ENGINE_OPTIONS``) with that directory, or None without reports."""
        from openipu.poplar.options import engine_options
        eff = engine_options(dict(so.engineOptions or {}))
        wanted = any(eff.get_bool(k) for k in ("autoReport.all", "autoReport.outputGraphProfile",
                                              "autoReport.outputExecutionProfile"))
        if not wanted:
            return None
        name = self._options.model_name or ("training" if self._training else "inference")
        return {"autoReport.directory": os.path.join(eff.get("autoReport.directory", "./") or ".", name)}

    def _prepare(self, s, so) -> None:
        """``s.prepareDevice()`` with PopTorch's progress bar (``showCompilationProgressBar``:
        "Graph compilation: 100%|...| 100/100 [00:03<00:00]" on stderr when it is a terminal)
        and report directory (:meth:`_report_options`)."""
        from openipu.popart import session as popart_session
        report = self._report_options(so)
        saved_bar, saved_env = popart_session._progress_bar, os.environ.get("POPLAR_ENGINE_OPTIONS")
        popart_session._progress_bar = _progress_bar if self._options.show_compilation_progress_bar else \
            (lambda total: None)
        if report is not None:
            so.engineOptions = {**dict(so.engineOptions or {}), **report}
            if saved_env is not None:       # the environment overrides code options: give it the directory too
                try:
                    env = json.loads(saved_env)
                    os.environ["POPLAR_ENGINE_OPTIONS"] = json.dumps({**env, **report})
                except ValueError:
                    pass
        try:
            s.prepareDevice(loadEngine=self._options.connection_type == ConnectionType.Always)
        finally:
            popart_session._progress_bar = saved_bar
            if saved_env is not None:
                os.environ["POPLAR_ENGINE_OPTIONS"] = saved_env

    def _make_session(self, built: "cap.Built", executable: bytes | None = None) -> None:
        o = self._options
        di, af, rf = self._factor()
        mode = o.output_mode
        art = popart.AnchorReturnType("EveryN", o.output_return_period) if mode == OutputMode.EveryN else \
            popart.AnchorReturnType(_ART[mode])
        anchors = {t: art for t in built.outputs}
        anchors.update({t: art for _, t in built.input_mutations})
        for short, (long_name, m, period) in o.anchored_tensors.items():
            m = mode if m is None else OutputMode(m)
            anchors[long_name] = popart.AnchorReturnType("EveryN", period) if m == OutputMode.EveryN else \
                popart.AnchorReturnType(_ART[m])
        num_ipus = built.num_ipus * rf
        so = o.session_options(self._training, built.num_ipus, built.pipelined)
        so.constantWeights = False
        if o.available_memory_proportion:     # the smallest of the per-IPU proportions, for every IPU
            amp = min(o.available_memory_proportion.values())
            so.matmulOptions = {**so.matmulOptions, "availableMemoryProportion": str(amp)}
            so.convolutionOptions = {**so.convolutionOptions, "availableMemoryProportion": str(amp)}
        dm = popart.DeviceManager()
        version = o.ipu_version()
        if o.connection_type == ConnectionType.Never:
            device = dm.createOfflineIPUDevice({"numIPUs": num_ipus, "ipuVersion": version})
        elif o.use_ipu_model:
            device = dm.createIpuModelDevice({"numIPUs": num_ipus, "ipuVersion": version})
        else:       # busy devices: raise, or wait with POPTORCH_WAIT_FOR_IPU (OnDemand: attach later)
            device = _device.acquire(num_ipus, o.ipu_id, o.connection_type)
        flow = popart.DataFlow(di, anchors)
        if o._Popart.options.get("saveInitializersToFile"):
            self._save_initializers(built, str(o._Popart.options["saveInitializersToFile"]))
        try:
            if self._training:
                weight_ids = {self._user_model.get_parameter(path): tid for tid, path in built.weights.items()
                              if _is_param(self._user_model, path)}
                opt = poptorch_optim.to_popart(self._optimizer, weight_ids)
                s = popart.TrainingSession(built.model, flow, built.loss, opt, device, userOptions=so)
            else:
                s = popart.InferenceSession(built.model, flow, device, userOptions=so)
            self._loaded_executable = False
            if executable is not None:
                try:
                    s.loadExecutable(io.BytesIO(executable))
                    self._loaded_executable = True
                except popart.popart_exception as e:
                    _log.info("The saved executable does not match (%s): compiling the saved model again", e)
            self._prepare(s, so)
        except popart.popart_exception as e:
            raise from_popart(e) from e
        self._session = s
        # Always: attached once compiled; OnDemand: on the first run (attachToDevice); Never: not
        self._attached = o.connection_type == ConnectionType.Always
        if o.random_seed is not None:
            s.setRandomSeed(o.random_seed)
        if self._training and o.Distributed.numProcesses > 1:
            self._broadcast_weights()
        if self._attached:
            self._upload_weights(force=True)

    def _debugGetPopartIR(self) -> str:  # noqa: N802
        """The compiled model's PopART IR as JSON text, in the layout of PopART's
        ``serializeIr`` (``{"maingraph": [{"type", "domain", "version", "name", "inputs",
        "outputs", "attributes"}, ...]}``, each tensor ``{"name", "type", "shape"}``). Raises
        :class:`Error` before compilation."""
        self._check_compiled()
        ir = self._session._ir

        def tensor(tid):
            t = ir.tensors.get(tid)
            return {"name": tid, "type": t.info.data_type() if t else "", "shape": list(t.info.shape()) if t else []}
        ops = []
        for op in ir.ops:
            attrs = {k: (v if isinstance(v, (int, float, str, list, bool)) or v is None else str(v))
                     for k, v in dict(op.attrs or {}).items()}
            ops.append({"type": op.op_type, "domain": op.domain or "ai.onnx", "version": str(op.opset),
                        "name": op.name, "inputs": [tensor(t) for t in op.inputs if t],
                        "outputs": [tensor(t) for t in op.outputs if t], "attributes": attrs})
        return json.dumps({"maingraph": ops}, default=str)

    def _connection_never(self) -> bool:
        return self._options.connection_type == ConnectionType.Never

    def _check_compiled(self):
        if self._session is None:
            raise Error(NO_EXECUTABLE_ERR)

    def _save_initializers(self, built: "cap.Built", path: str) -> None:
        """``_Popart.set("saveInitializersToFile", path)``: write the model's weights to ``path``
        in PopART's external-data layout (``Builder.saveInitializersExternally``: their bytes one
        after the other), as PopTorch does when it builds the session. The file is written under a
        temporary name and renamed, so instances sharing a directory never read a partial file;
        the session itself is built from the in-memory model. Raises ``Error`` where PopART
        raises (a missing parent directory ...)."""
        import onnx

        from openipu.popart.graph_transformer import save_initializers_externally
        model = onnx.load_from_string(built.model)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            save_initializers_externally(model, list(built.weights), tmp)
            os.replace(tmp, path)
        except popart.popart_exception as e:
            raise from_popart(e) from e
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    # -- run -----------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        assert not self._connection_never(), ("Trying to run a model on an offline device (ConnectionType.Never): use "
                                              "model.compile(inputs) instead of model(inputs)")
        if self._session is None:
            self.compile(*args, **kwargs)
        if not self._attached:       # PopTorch re-attaches a detached model when it is called
            self.attachToDevice()
        t0 = time.perf_counter()
        with _utils.custom_pytree_nodes((args, kwargs)):
            _, _, tensors, others = self._bind(args, kwargs)
        self._validate(tensors, others)
        if not self._training:
            self._upload_weights()
        di, af, rf = self._factor()
        lead = [d for d in (di, af, rf) if d > 1]
        gs = self._options.input_group_size
        feeds = {}
        for tid, info, (name, t) in zip(self._built.inputs, self._built.input_info, tensors):
            arr = _to_numpy(t, info.data_type())
            if gs > 1 and t.dim():      # inputReplicaGrouping: each replica its input group's data
                arr = arr.reshape([di, af, rf // gs] + list(info.shape()))[:, :, self._options.input_group_of()]
                arr = np.ascontiguousarray(arr)
            feeds[tid] = arr.reshape(lead + list(info.shape())) if t.dim() else \
                np.broadcast_to(arr, lead + list(info.shape())).copy()
        anchors = self._session.initAnchorArrays()
        t1 = time.perf_counter()
        try:
            self._session.run(popart.PyStepIO(feeds, anchors))
        except (popart.popart_exception, popart.poplar_exception, popart.poplibs_exception) as e:
            raise from_popart(e) from e
        t2 = time.perf_counter()
        if self._options.log_cycle_count:
            self._cycles = self._session.getCycleCount()
        self._anchors = anchors
        if self._training:
            self.copyWeightsToHost()
        outs = [self._output(anchors[tid]) for tid in self._built.outputs]
        # inputs the model changed in place: PopTorch copies the returned value into them
        for k, tid in self._built.input_mutations:
            t, new = tensors[k][1], self._output(anchors[tid])
            with torch.no_grad():
                t.copy_(new.reshape(t.shape) if new.numel() == t.numel() else new)
        for o in outs:
            o.backward = _error_on_backward
        self._perf = (t0, t1, t2, time.perf_counter())
        return _utils.tree_unflatten(outs, self._built.out_spec)

    # -- device and lifetime -------------------------------------------------------------------
    def detachFromDevice(self) -> None:  # noqa: N802
        """Release the IPU (PopTorch's ``detachFromDevice``): the random state is read and, for
        a training model, the weights are copied to the host first. Raises :class:`Error`
        ("Model has not been compiled or has been destroyed.", "Device is not attached")."""
        if self._session is None:
            raise Error(NO_EXECUTABLE_ERR)
        if not self._attached:
            raise Error("Device is not attached")
        self._rng_state = self.rng_state
        if self._training:
            self.copyWeightsToHost()
        self._release_device()
        self._attached = False

    def attachToDevice(self) -> None:  # noqa: N802
        """Take the IPU (back): loads the executable when the model was compiled with
        ``ConnectionType.OnDemand``, then sends the weights. Raises :class:`Error` ("Model has not
        been compiled or has been destroyed.", "Device is already attached") and
        ``AssertionError`` ("Trying to attach to an offline device (ConnectionType.Never)")."""
        if self._session is None:
            raise Error(NO_EXECUTABLE_ERR)
        assert not self._connection_never(), "Trying to attach to an offline device (ConnectionType.Never)"
        if self._attached:
            raise Error("Device is already attached")
        self._take_device()
        engine = getattr(self._session, "_engine", None)
        if engine is not None and getattr(engine, "_storage", True) is None:
            try:
                self._session.loadEngineAndConnectStreams()
            except popart.popart_exception as e:
                raise from_popart(e) from e
        self._attached = True
        self._upload_weights(force=True)

    def destroy(self) -> None:
        """Free the compiled model (a training model copies its weights back first, and releases
        the user model so that it can be wrapped again)."""
        if self._training:
            owner = _TRAINING_WRAPPERS.get(self._user_model)
            if owner is not None and owner() is self:
                del _TRAINING_WRAPPERS[self._user_model]
                self._user_model.__dict__.pop("destroy", None)
        if self._session is None:
            return
        if self._training and self._attached and not self._connection_never():
            self.copyWeightsToHost()
        self._release_device()
        self._session = None
        self._attached = False

    def _release_device(self) -> None:
        """Free the session's IPUs for other processes (PopTorch's device ``detach``)."""
        info = getattr(self._session, "deviceInfo", None)
        if info is not None and info.type == popart.DeviceType.Ipu and info.isAttached:
            info.detach()

    def _take_device(self) -> None:
        """Attach the session's device, or another free device of its size (PopTorch asks PopART
        for a new device and swaps it into the session); raises :class:`Error` or waits for one
        (``POPTORCH_WAIT_FOR_IPU``) when all are busy (:func:`openipu.poptorch._device.acquire`)."""
        info = getattr(self._session, "deviceInfo", None)
        if info is None or info.type != popart.DeviceType.Ipu or info.isAttached:
            return
        if info.attach():
            return
        self._session.deviceInfo = _device.acquire(info.numIpus, self._options.ipu_id, must_attach=True)

    def setOptimizer(self, optimizer) -> None:  # noqa: N802
        """Use ``optimizer``'s (changed) hyper-parameters from the next call. Changing one compiled
        as a constant raises."""
        if not self._training:
            raise Error("setOptimizer can only be called on a training model")
        self._optimizer = optimizer
        if self._session is None:
            return
        weight_ids = {self._user_model.get_parameter(p): tid for tid, p in self._built.weights.items()
                      if _is_param(self._user_model, p)}
        try:
            self._session.updateOptimizerFromHost(poptorch_optim.to_popart(optimizer, weight_ids))
        except popart.popart_exception as e:
            raise from_popart(e) from e

    # -- introspection ---------------------------------------------------------------------------
    def cycleCount(self) -> int:  # noqa: N802
        """Predicted IPU cycles of the last call (a prediction of the chip, not host time)."""
        if not self._options.log_cycle_count:
            raise Error("Error: Cycle count logging is disabled. Please set option logCycleCount to True to enable.")
        if self._cycles is None:
            raise Error("Please run the model at least once before obtaining cycle count.")
        return int(self._cycles)

    def getTensorNames(self) -> list:  # noqa: N802
        """The PopART tensor ids of the compiled model (``Gradient___fc1.weight`` ...)."""
        self._check_compiled()
        return sorted(self._session.getTensorIds()) if self._training else \
            sorted(self._session._ir.tensors)

    def getAnchoredTensor(self, short_name: str) -> torch.Tensor:  # noqa: N802
        """The value of the tensor anchored as ``short_name`` (``Options.anchorTensor``) in the
        last call."""
        if short_name not in self._options.anchored_tensors:
            raise Error(f"Tensor {short_name} has not been anchored: use Options.anchorTensor")
        long_name = self._options.anchored_tensors[short_name][0]
        return torch.from_numpy(np.array(self._anchors[long_name], order="C"))

    # -- state ---------------------------------------------------------------------------------
    def load_state_dict(self, state_dict, strict: bool = True):
        """``load_state_dict`` on the user model, then the weights go to the device if attached.
        Returns torch's ``(missing_keys, unexpected_keys)``."""
        out = self._user_model.load_state_dict(state_dict, strict)
        if self.isAttachedToDevice():
            self.copyWeightsToDevice()
        return out

    @property
    def rng_state(self) -> list:
        """``[seed]``: the seed of the device's random ops (dropout ...), PopART's
        ``getRandomSeed``. PopTorch appends the per-tile hardware RNG state; the simulated IPU
        draws from the seed alone, so the list has one entry."""
        self._check_compiled()
        s = self._session
        if s._ir.random_seed is None:      # no random op: nothing on the device to read
            return list(self._rng_state or [self._options.random_seed or 0])
        return [int(s.getRandomSeed())] + list((self._rng_state or [])[1:])

    @rng_state.setter
    def rng_state(self, state) -> None:
        self._check_compiled()
        state = [int(v) for v in state]
        if not state:
            raise Error("rng_state must hold at least the seed")
        self._rng_state = state
        if self._session._ir.random_seed is not None:
            self._session.setRandomSeed(state[0])

    def __repr__(self):
        return f"PoplarExecutor({'training' if self._training else 'inference'}, {self._user_model!r})"
