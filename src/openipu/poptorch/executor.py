"""``PoplarExecutor`` (``research/poptorch.md`` 1.3): a wrapped model that compiles on its first
call (capture, lowering, a PopART session on the simulated IPU), then runs each call's
``deviceIterations`` (x replicas x gradient accumulation) micro-batches and returns the outputs
by the output mode.

Weights stay in sync with the ``torch.nn.Module`` (shared parameters): a training model copies
the trained weights (and BatchNorm's running statistics) back into the module after each call;
an inference model re-sends the module's weights when they changed since the last call (e.g.
trained by a ``trainingModel`` of the same module). Predicted IPU cycles of the last call:
``cycleCount()`` (with ``Options.logCycleCount(True)``); a prediction, not host time.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import io
import json
import os
import logging
import time
import weakref

import numpy as np
import torch
import torch.utils._pytree as pytree

from openipu import popart
from openipu.poptorch import _utils
from openipu.poptorch import capture as cap
from openipu.poptorch import optim as poptorch_optim
from openipu.poptorch.enums import ConnectionType, OutputMode
from openipu.poptorch.errors import Error, from_popart
from openipu.poptorch.lower import NUMPY_TYPE, POPART_TYPE

_log = logging.getLogger("poptorch")
NO_EXECUTABLE_ERR = "Model has not been compiled or has been destroyed."
_pylog = logging.getLogger("poptorch::python")

_ART = {OutputMode.All: "All", OutputMode.Final: "Final", OutputMode.Sum: "Sum"}
#: user model -> weak reference to the training wrapper that owns it (until ``destroy()``)
_TRAINING_WRAPPERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_BACKWARD_ERROR = ("backward() cannot be called explicitly on outputs of a PopTorch model. If you're using a "
                   "trainingModel, the backwards pass is performed automatically when invoking the model. If "
                   "you're using an inferenceModel, you should use a trainingModel instead.")


#: torch.nn.Module's own attributes, which the wrapper forwards to the user model (``__getattr__``)
_MODULE_STATE = frozenset(torch.nn.Module().__dict__)

#: handle id -> hook (``registerPreCompileHook`` / ``registerPostCompileHook``), in registration order
_PRECOMPILE_HOOKS: dict = collections.OrderedDict()
_POSTCOMPILE_HOOKS: dict = collections.OrderedDict()


def _register_hook(hooks: dict, hook, what: str) -> "torch.utils.hooks.RemovableHandle":
    if not callable(hook):
        raise RuntimeError(f"{what} hook must be callable")
    handle = torch.utils.hooks.RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def registerPreCompileHook(hook) -> "torch.utils.hooks.RemovableHandle":  # noqa: N802
    """Call ``hook()`` each time a model is compiled, before it is captured (PopTorch's
    ``registerPreCompileHook``). Returns a handle whose ``remove()`` unregisters it. Raises
    ``RuntimeError("Pre-compile hook must be callable")``."""
    return _register_hook(_PRECOMPILE_HOOKS, hook, "Pre-compile")


def registerPostCompileHook(hook) -> "torch.utils.hooks.RemovableHandle":  # noqa: N802
    """Call ``hook()`` each time a model has been compiled (PopTorch's
    ``registerPostCompileHook``). Returns a removable handle. Raises
    ``RuntimeError("Post-compile hook must be callable")``."""
    return _register_hook(_POSTCOMPILE_HOOKS, hook, "Post-compile")


def _to_numpy(t: torch.Tensor, dtype: str) -> np.ndarray:
    """``t`` as a C-contiguous array of the IPU-side ``dtype`` (a transposed or sliced input is
    copied, as PopTorch copies inputs into its host buffers; no copy when already laid out)."""
    a = t.detach().cpu().numpy().astype(NUMPY_TYPE[dtype], copy=False)
    return a if a.flags.c_contiguous else a.copy(order="C")     # (ascontiguousarray makes 0-d 1-d)


class PoplarExecutor:
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

    # -- arguments ---------------------------------------------------------------------------
    def _bind(self, args, kwargs):
        """(positional args, kwargs, [(name, tensor)] of the tensor leaves in capture order,
        the non-tensor leaves)."""
        sig = inspect.signature(self._user_model.forward)
        try:
            ba = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise Error(f"The arguments do not match {type(self._user_model).__name__}.forward: {e}") from None
        ba.apply_defaults()
        args_, kwargs_ = ba.args, ba.kwargs
        leaves, _ = pytree.tree_flatten_with_path((args_, kwargs_))
        names = list(sig.parameters)
        var = next((p.name for p in sig.parameters.values() if p.kind == p.VAR_POSITIONAL), None)
        if var is not None:     # forward(self, *xs): the extra positionals are xs_0, xs_1, ...
            first = names.index(var)
            names = names[:first] + [f"{var}_{i}" for i in range(len(args_) - first)]
        tensors, others = [], []
        for path, v in leaves:
            if isinstance(v, torch.Tensor):
                key = path[1]
                name = names[key.idx] if isinstance(key, pytree.SequenceKey) and path[0].idx == 0 else \
                    str(getattr(key, "key", key))
                rest = "".join(f".{getattr(k, 'idx', getattr(k, 'key', k))}" for k in path[2:])
                tensors.append((name + rest, v))
            else:
                others.append(v)
        return args_, kwargs_, tensors, others

    def _factor(self) -> tuple[int, int, int]:
        o = self._options
        af = o.Training.gradient_accumulation if self._training else 1
        return o.device_iterations, af, o.replication_factor

    def _micro(self, tensors):
        di, af, rf = self._factor()
        rf //= self._options.input_group_size      # the replicas of an input group share their data
        f = di * af * rf
        out = []
        for name, t in tensors:
            if t.dim() == 0:
                out.append(t)
                continue
            if t.shape[0] % f:
                raise Error(f"Invalid batch dimension: In the input {name}, the batch dimension ({t.shape[0]}) must be "
                            f"a multiple of Options.deviceIterations({di}) * Options.replicationFactor({rf}) * "
                            f"Options.Training.gradientAccumulation({af}) = {f} because it is used to calculate the "
                            f"batch size which will be fetched from the host per device iteration.")
            out.append(t.narrow(0, 0, t.shape[0] // f))
        return out

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

    def _replica_grouped(self):
        """The replica-grouped parameters (``replicaGrouping``) for the capture: each is swapped
        for one replica's value (its first row) while the model is captured. Returns (path ->
        (``popart.VariableSettings``, host value ``[groups, *shape]``), a function putting the
        module's own parameters back). Raises :class:`Error` for a scalar parameter (PopTorch's
        "Scalars cannot be passed as per-replica weight tensor values")."""
        grouped, saved = {}, []
        model = self._user_model
        for path, (cgt, shards, mode) in self._per_replica_params.items():
            param = model.get_parameter(path)
            if param.dim() == 0:
                raise Error("Scalars cannot be passed as per-replica weight tensor values")
            name = {0: "All", 1: "Consecutive", 2: "Orthogonal", 3: "Ungrouped"}[int(cgt)]
            vs = popart.VariableSettings(popart.CommGroup(getattr(popart.CommGroupType, name), int(shards)),
                                         popart.VariableRetrievalMode.AllReplicas if int(mode) == 2 else
                                         popart.VariableRetrievalMode.OnePerGroup)
            n = vs.getGroupCount(self._options.replication_factor)
            full = param.detach().cpu().numpy()
            if n > 1 and (full.shape[0] != n):
                raise Error(f"Parameter '{path}': replicaGrouping({name}, {shards}) over "
                            f"{self._options.replication_factor} replicas makes {n} groups, so its first dimension "
                            f"must be {n} (one value per group), not {full.shape[0]}")
            grouped[path] = (vs, full)
            if n > 1:
                owner, attr = _owner(model, path)
                saved.append((owner, attr, param))
                owner._parameters[attr] = torch.nn.Parameter(param.detach()[0].clone(),
                                                             requires_grad=param.requires_grad)

        def restore():
            for owner, attr, param in saved:
                owner._parameters[attr] = param
        return grouped, restore

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
        else:
            device = dm.acquireAvailableDevice(num_ipus)
        flow = popart.DataFlow(di, anchors)
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

    def _broadcast_weights(self) -> None:
        """PopDist's start of a distributed training run: the model's weights and buffers of the
        PopRun instance 0 overwrite this instance's (in the user model, in place), so that the
        instances need not build identical initial weights. Every instance compiles its training
        model, so every instance takes part (inference models are not broadcast: one evaluated on
        some instances only must not wait for the others). Raises :class:`Error` when an instance
        is lost or the broadcast times out."""
        from openipu.poplar.errors import poplar_error
        from openipu.poplibs import gcl_instances
        try:
            gcl_instances.broadcast_tensors_from([self._module_tensor(p) for p in self._built.weights.values()], 0,
                                                 "weights broadcast from instance 0")
        except poplar_error as e:
            raise from_popart(e) from None

    # -- weights ---------------------------------------------------------------------------
    def _module_tensor(self, path: str) -> torch.Tensor:
        m = self._user_model
        return m.get_parameter(path) if _is_param(m, path) else m.get_buffer(path)

    def _weight_tensors(self) -> list:
        """``[(tensor id, module tensor)]`` of the compiled weights: the module's current
        parameter or buffer at each path (the owning submodules are looked up once per compiled
        model; the tensors each call, so that a replaced parameter is the one synced)."""
        if self._owners is None or self._owners[0] is not self._built:
            m = self._user_model
            owners = []
            for tid, path in self._built.weights.items():
                mod_path, _, name = path.rpartition(".")
                owners.append((tid, m.get_submodule(mod_path) if mod_path else m, name, path))
            self._owners = (self._built, owners)
        out = []
        for tid, mod, name, path in self._owners[1]:
            t = mod._parameters.get(name) if name in mod._parameters else mod._buffers.get(name)
            out.append((tid, t if t is not None else self._module_tensor(path)))
        return out

    def _versions(self):
        return [t._version for _, t in self._weight_tensors()]

    def _upload_weights(self, force: bool = False) -> None:
        if self._connection_never() or not self._attached:      # sent when the device is attached
            return
        versions = self._versions()
        if not force and versions == self._uploaded_versions:
            return
        if self._host_behind:       # the optimizer state is sent too: the device's, not a stale one
            self._session.weightsToHost()
            self._host_behind = False
        io = {tid: _to_numpy(t, POPART_TYPE[t.dtype]) for tid, t in self._weight_tensors()}
        self._session.writeWeights(popart.PyWeightsIO(io))
        self._session.weightsFromHost()
        self._uploaded_versions = versions

    def copyWeightsToDevice(self) -> None:  # noqa: N802
        """Send the module's weights to the device."""
        self._check_compiled()
        self._upload_weights(force=True)

    def copyWeightsToHost(self) -> None:  # noqa: N802
        """Copy the device's weights into the module."""
        self._check_compiled()
        if self._connection_never():
            return
        s = self._session
        device = s._device_weights()
        # copy_ into the module's tensors keeps their version counters right (other wrappers of
        # the module read them to know they must upload)
        with torch.no_grad():
            if device is not None and any(tid in s._replica_group or s._returns_all(tid)
                                          for tid in self._built.weights):
                device = None       # replica-grouped or AllReplicas weights: through the host copies
            if device is not None:
                # the IR executor's variables straight into the module: one copy of the weights,
                # no host copies of them nor of the optimizer state (those are fetched when
                # needed: _upload_weights, copyNamedBuffersToDevice)
                self._host_behind = True
            else:
                s.weightsToHost()
                self._host_behind = False
            for tid, t in self._weight_tensors():
                v = device.get(tid) if device is not None else None
                if v is None:       # a host copy (or a constant of the model, readWeights' fallback)
                    if tid in s._host_weights:
                        host = s._returned_values(tid)
                    else:
                        host = np.empty(t.shape, NUMPY_TYPE[POPART_TYPE[t.dtype]])
                        s.readWeights(popart.PyWeightsIO({tid: host}))
                    v = torch.from_numpy(host)
                    if t.numel() != v.numel():      # AllReplicas: one value per replica from now on
                        t.data = v.clone().to(t.dtype)
                        continue
                t.copy_(v.reshape(t.shape))
        self._uploaded_versions = self._versions()

    def copyNamedBuffersToDevice(self) -> None:  # noqa: N802
        """Send the module's buffers listed in ``Options.updatableNamedBuffers`` to the device,
        leaving the other weights (and the optimizer state) as the device has them. Raises
        :class:`Error` ("Model has not been compiled or has been destroyed.", "No named buffers
        marked as updatable via updatableNamedBuffers option")."""
        self._check_compiled()
        names = self._options._Popart.options.get("updatableNamedBuffers")
        if names is None:
            raise Error("No named buffers marked as updatable via updatableNamedBuffers option")
        if not self._attached or self._connection_never():
            return
        ids = {path: tid for tid, path in self._built.weights.items()}
        buffers = dict(self._user_model.named_buffers())
        io = {}
        for name in names:
            if name not in buffers:
                raise Error(f"updatableNamedBuffers: the model has no buffer '{name}'")
            if name in ids:
                io[ids[name]] = _to_numpy(buffers[name], POPART_TYPE[buffers[name].dtype])
        if not io:
            return
        try:
            self._session.weightsToHost()
            self._host_behind = False
            self._session.writeWeights(popart.PyWeightsIO(io))
            self._session.weightsFromHost()
        except popart.popart_exception as e:
            raise from_popart(e) from e

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

    def copyWeightsToHostIfNeeded(self) -> bool:  # noqa: N802
        """Weights are copied back after every training call, so there is nothing to do."""
        return False

    def _connection_never(self) -> bool:
        return self._options.connection_type == ConnectionType.Never

    def _check_compiled(self):
        if self._session is None:
            raise Error(NO_EXECUTABLE_ERR)

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
        except popart.popart_exception as e:
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

    def _output(self, arr: np.ndarray) -> torch.Tensor:
        """A PopART anchor (leading dims: iterations / micro-batches / replicas, as returned by
        the output mode) as PopTorch returns it: the leading dims merged into dim 0."""
        o = self._options
        di, af, rf = self._factor()
        mode = o.output_mode
        if mode == OutputMode.All:
            lead = [d for d in (di, af, rf) if d > 1]
        elif mode == OutputMode.EveryN:
            lead = [d for d in (di // o.output_return_period, af, rf) if d > 1]
        else:
            lead = [rf] if rf > 1 else []
        arr = np.asarray(arr)
        n = int(np.prod(lead)) if lead else 1
        shape = list(arr.shape[len(lead):]) if lead else list(arr.shape)
        if lead:
            arr = arr.reshape([n] + shape) if not shape else arr.reshape([n * shape[0]] + shape[1:])
        return torch.from_numpy(np.array(arr, order="C"))

    def _validate(self, tensors, others) -> None:
        want, want_others = self._signature
        got = [(n, tuple(t.shape), t.dtype) for n, t in tensors]
        if len(got) != len(want) or any(g[1:] != w[1:] for g, w in zip(got, want)) or others != want_others:
            raise Error(f"The inputs provided ({[(n, list(s), str(d)) for n, s, d in got]}) don't match the inputs used "
                        f"to compile the model ({[(n, list(s), str(d)) for n, s, d in want]}). To use different "
                        "inputs, create a new inferenceModel / trainingModel wrapper or call destroy() on the current "
                        "one first.")

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
        self._session = None
        self._attached = False

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

    # -- timings -------------------------------------------------------------------------------
    def compilationTime(self) -> float:  # noqa: N802
        """Host wall-clock seconds the last compile took (capture, lowering to PopART, the
        simulated IPU's compile): a measurement of this simulator, not of an IPU system."""
        if self._compile_seconds is None:
            raise Error("Model has not been compiled (or was loaded from a file): no compilation time")
        return float(self._compile_seconds)

    def getPerfCounters(self) -> dict:  # noqa: N802
        """PopTorch's performance counters of the last call, in seconds: ``input`` /
        ``input_complete`` (the IPU asks for an input tensor / has received it) and ``output`` /
        ``output_complete`` (it sends an output / the host has it), each ``[tensor][step]``, one
        step per device iteration (outputs: per iteration returned by the output mode). Before
        compilation every list is ``[[]]``.

        The timestamps are **predicted** for the simulated IPU (an IPU records them on the
        device): the predicted cycles of the call (the cost model's, as ``cycleCount()``) at the
        tile clock, split evenly over the device iterations, each input / output stream taking
        its bytes over the target's host link in turn, from the host time the run started (the
        reference point is arbitrary, as on an IPU; differences are predicted seconds)."""
        empty = {"input": [[]], "input_complete": [[]], "output": [[]], "output_complete": [[]]}
        if self._session is None or self._perf is None:
            return empty
        s, b, o = self._session, self._built, self._options
        di, af, rf = self._factor()
        spec = s.deviceInfo.device.getTarget().spec
        clock, link = float(spec.clock_hz), float(spec.host_bytes_per_s or 16e9)
        cycles = float(getattr(s, "_last_cycles", 0) or 0)
        step = cycles / clock / di
        n_out = di if o.output_mode == OutputMode.All else di // o.output_return_period \
            if o.output_mode == OutputMode.EveryN else 1
        t0 = self._perf[1]

        def seconds(info, per_step: int) -> float:
            return info.nbytes() * per_step / link
        ins = [seconds(i, af * rf) for i in b.input_info] or [0.0]
        outs = []
        for tid in b.outputs:
            info = s._ir.tensors[tid].info if tid in s._ir.tensors else None
            outs.append(seconds(info, (af if o.output_mode in (OutputMode.All, OutputMode.EveryN) else 1) * rf)
                        if info is not None else 0.0)
        outs = outs or [0.0]
        res = {k: [] for k in empty}
        for i in range(len(ins)):
            start = [t0 + k * step + sum(ins[:i]) for k in range(di)]
            res["input"].append(start)
            res["input_complete"].append([t + ins[i] for t in start])
        every = max(di // max(n_out, 1), 1)
        for j in range(len(outs)):
            last = [t0 + ((m + 1) * every - 1) * step + sum(ins) for m in range(n_out)]   # inputs of the step in
            ends = [max(t0 + ((m + 1) * every) * step - sum(outs[j + 1:]), last[m] + outs[j]) for m in range(n_out)]
            res["output"].append([e - outs[j] for e in ends])
            res["output_complete"].append(ends)
        return res

    def _latency(self, from_event, from_reduce, to_event, to_reduce) -> tuple:
        pc = self.getPerfCounters()
        starts = [from_reduce(col) for col in zip(*pc[from_event])]
        ends = [to_reduce(col) for col in zip(*pc[to_event])]
        if not ends:
            return (0.0, 0.0, 0.0)
        f = len(starts) // len(ends)
        groups = [min(starts[i:i + f]) for i in range(0, len(starts), f)]
        d = [e - s for s, e in zip(groups, ends)]
        return (min(d), max(d), sum(d) / len(d))

    def getHostIpuLatency(self) -> tuple:  # noqa: N802
        """(min, max, mean) seconds from the first input requested to the last input sent, per
        step of the last call: host-measured (see :meth:`getPerfCounters`)."""
        return self._latency("input", min, "input_complete", max)

    def getComputeLatency(self) -> tuple:  # noqa: N802
        """(min, max, mean) seconds from the last input sent to the last output ready:
        host-measured simulation time (see :meth:`getPerfCounters`), not the IPU's."""
        return self._latency("input_complete", max, "output", max)

    def getIpuHostLatency(self) -> tuple:  # noqa: N802
        """(min, max, mean) seconds from the first output ready to the last output copied:
        host-measured (see :meth:`getPerfCounters`)."""
        return self._latency("output", min, "output_complete", max)

    def getLatency(self) -> tuple:  # noqa: N802
        """(min, max, mean) round-trip seconds of the steps of the last call: host-measured (see
        :meth:`getPerfCounters`)."""
        return self._latency("input", min, "output_complete", max)

    # -- executable files ----------------------------------------------------------------------
    def save(self, filename: str, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Save the compiled model to ``filename`` (a directory gets ``model.poptorch``) in
        openipu's safe format (:mod:`openipu.poptorch.export`: JSON, the ONNX model and the
        weights; no pickle). ``export_model``: :func:`poptorch.load` may rebuild the wrapper from
        the file alone (else wrap the model again and call :meth:`loadExecutable`)."""
        from openipu.poptorch import __version__, export
        self._check_compiled()
        if self._training and self._attached and not self._connection_never():
            self.copyWeightsToHost()
        b = self._built
        weights = {tid: _to_numpy(self._module_tensor(p), POPART_TYPE[self._module_tensor(p).dtype])
                   for tid, p in b.weights.items()}
        want, others = self._signature
        params = {p: n for n, p in self._user_model.named_parameters()}
        meta = {"poptorch_version": __version__, "training": self._training, "export_model": bool(export_model),
                "options": export.options_to_json(self._options),
                "signature": [[n, list(shape), str(dt)] for n, shape, dt in want], "others": export.encode(others),
                "inputs": list(b.inputs), "input_info": [[i.data_type(), list(i.shape())] for i in b.input_info],
                "outputs": list(b.outputs), "out_spec": export.spec_dumps(b.out_spec), "loss": b.loss,
                "weights": dict(b.weights), "params": [p for p in b.weights.values() if _is_param(self._user_model, p)],
                "forward": _forward_signature(self._user_model),
                "num_ipus": b.num_ipus, "pipelined": b.pipelined,
                "input_mutations": [[int(k), str(t)] for k, t in b.input_mutations],
                "rng_state": self.rng_state if save_rng_state else None,
                "optimizer": export.optimizer_to_json(self._optimizer, params) if self._training else None}
        buf = io.BytesIO()
        try:
            self._session._save_lowered(buf)
            exe = buf.getvalue()
        except popart.popart_exception:      # a kernel that cannot be named: the file recompiles
            exe = None
        export.write(filename, meta, b.model, weights, exe)

    def compileAndExport(self, filename: str, *args, export_model: bool = True, **kwargs) -> None:  # noqa: N802
        """Compile for these inputs (without running) and :meth:`save` to ``filename``."""
        self.compile(*args, **kwargs)
        self.save(filename, export_model)

    def loadExecutable(self, filename: str) -> None:  # noqa: N802
        """Use the model compiled in ``filename`` (:meth:`save` / :meth:`compileAndExport`) with
        this wrapper's user model: its weights (not the file's) go to the device."""
        from openipu.poptorch import export
        meta, model_bytes, _ = export.read(filename)
        if bool(meta["training"]) != self._training:
            kind = "training" if meta["training"] else "inference"
            raise Error(f"Invalid file {filename}: it holds a {kind} model, this wrapper is not one")
        for p in meta["weights"].values():
            try:
                self._module_tensor(p)
            except AttributeError:
                raise Error(f"Invalid file {filename}: the model has no parameter or buffer '{p}'") from None
        self._install(meta, model_bytes, export.read_executable(filename))

    def _install(self, meta: dict, model_bytes: bytes, executable: bytes | None = None) -> None:
        """The saved executable (or, if it does not match, the saved ONNX model compiled again) as
        this wrapper's executable."""
        from openipu.poptorch import export
        built = cap.Built(model_bytes, list(meta["inputs"]),
                          [popart.TensorInfo(dt, shape) for dt, shape in meta["input_info"]], list(meta["outputs"]),
                          export.spec_loads(meta["out_spec"]), meta["loss"], dict(meta["weights"]),
                          int(meta["num_ipus"]), bool(meta["pipelined"]), _input_mutations(meta))
        self._built = built
        self._signature = ([(n, tuple(shape), export._DTYPES[dt]) for n, shape, dt in meta["signature"]],
                           export.decode(meta["others"]))
        self._session = None
        self._make_session(built, executable)
        if meta.get("rng_state"):
            self.rng_state = meta["rng_state"]

    def __repr__(self):
        return f"PoplarExecutor({'training' if self._training else 'inference'}, {self._user_model!r})"


def _input_mutations(meta: dict) -> list:
    """The saved ``[[input index, output id]]`` of inputs changed in place (files of an older
    openipu have none). Raises :class:`Error` for a malformed entry."""
    raw = meta.get("input_mutations") or []
    if not isinstance(raw, list) or not all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], int) and
                                            isinstance(e[1], str) and 0 <= e[0] < len(meta["inputs"])
                                            for e in raw):
        raise Error("Invalid file: malformed input_mutations")
    return [(k, t) for k, t in raw]


def _forward_signature(model) -> list:
    """``forward``'s parameters as JSON: ``[name, kind, has_default, default]``."""
    from openipu.poptorch import export
    out = []
    for p in inspect.signature(model.forward).parameters.values():
        has, default = p.default is not inspect.Parameter.empty, None
        if has:
            try:
                default = export.encode(p.default)
            except Error:
                has = False
        out.append([p.name, p.kind.name, has, default])
    return out


class _PopTorchBar:
    """PopTorch's compilation progress bar over PopART's progress steps: tqdm on stderr,
    "Graph compilation" with PopTorch's ``{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]``
    format, counted to 100."""

    def __init__(self, total: int):
        import sys

        from tqdm import tqdm
        self._total, self._done, self._shown = max(int(total), 1), 0, 0
        self._bar = tqdm(desc="Graph compilation", total=100, file=sys.stderr,
                         bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]")

    def update(self, n: int = 1) -> None:
        self._done = min(self._done + n, self._total)
        pct = self._done * 100 // self._total
        if pct > self._shown:
            self._bar.update(pct - self._shown)
            self._shown = pct

    def close(self) -> None:
        if self._shown < 100:
            self._bar.update(100 - self._shown)
            self._shown = 100
        self._bar.close()


def _progress_bar(total: int):
    """A :class:`_PopTorchBar` when stderr is a terminal (and tqdm is installed), else None."""
    import sys
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return None
    try:
        return _PopTorchBar(total)
    except ImportError:
        return None


def _detach_input(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, with PopTorch's warning, if it requires a gradient."""
    if t.requires_grad:
        _pylog.warning("Input tensor has requires_grad=True set. This tensor will be detached because backward pass "
                       "via inputs is not supported.")
        return t.detach()
    return t


def _tensor_attributes(model: torch.nn.Module) -> dict:
    """``{path: clone}`` of the plain tensor attributes (neither parameters nor buffers) of
    ``model``'s modules: the values a captured graph takes as constants."""
    out = {}
    for prefix, m in model.named_modules():
        for k, v in vars(m).items():
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and not k.startswith("_"):
                out[f"{prefix}.{k}" if prefix else k] = v.detach().clone()
    return out


#: modules whose buffers may be replaced while the model runs (PopTorch's ``BUFFERS_CAN_CHANGE``)
_BUFFERS_CAN_CHANGE = (torch.nn.modules.batchnorm._BatchNorm,)


@contextlib.contextmanager
def _no_reassignment(model: torch.nn.Module, plain: set = frozenset()):
    """While ``model`` is captured, assigning a new tensor to one of its buffers or parameters
    (``self.buf = self.buf + 1``) raises PopTorch's :class:`Error` ("Buffer buf is reassigned
    within the model when calling the forward method. This is not supported. Consider using
    self.buf.copy_(src) ..."); deleting one raises "... is removed from the model ...". BatchNorm
    modules may replace their buffers (PopTorch's exception), and so may the plain tensor
    attributes ``plain`` (paths) captured as buffers."""
    owners = {id(m): prefix for prefix, m in model.named_modules() if not isinstance(m, _BUFFERS_CAN_CHANGE)}
    param_owners = {id(m): prefix for prefix, m in model.named_modules()}
    orig_set, orig_del = torch.nn.Module.__setattr__, torch.nn.Module.__delattr__

    def check(mod, name, removed):
        kind = "Buffer" if name in mod._buffers and id(mod) in owners else \
            "Parameter" if name in mod._parameters and id(mod) in param_owners else None
        if kind is None:
            return
        prefix = param_owners[id(mod)]
        full = f"{prefix}.{name}" if prefix else name
        if full in plain:
            return
        if removed:
            raise Error(f"{kind} {full} is removed from the model when calling the forward method.")
        raise Error(f"{kind} {full} is reassigned within the model when calling the forward method. This is not "
                    f"supported. Consider using self.{full}.copy_(src) to copy data from a source tensor, where src "
                    "is the name of the source tensor.")

    def guarded_set(mod, name, value):
        if isinstance(value, torch.Tensor) or value is None:
            cur = mod.__dict__.get("_buffers", {}).get(name, mod.__dict__.get("_parameters", {}).get(name))
            if cur is not None and value is not cur:
                check(mod, name, False)
        return orig_set(mod, name, value)

    def guarded_del(mod, name):
        check(mod, name, True)
        return orig_del(mod, name)
    torch.nn.Module.__setattr__, torch.nn.Module.__delattr__ = guarded_set, guarded_del
    try:
        yield
    finally:
        torch.nn.Module.__setattr__, torch.nn.Module.__delattr__ = orig_set, orig_del


@contextlib.contextmanager
def _attributes_as_buffers(model: torch.nn.Module, attrs: dict):
    """The plain tensor attributes ``attrs`` (paths) of ``model`` registered as non-persistent
    buffers while the model is captured, so that changing one in place is captured (torch.export
    refuses to capture a changed constant). :func:`capture.build` then lowers them as the
    constants PopTorch makes of them (their values before the call)."""
    done = []
    try:
        for path in attrs:
            mod_path, _, name = path.rpartition(".")
            mod = model.get_submodule(mod_path) if mod_path else model
            t = vars(mod)[name]
            delattr(mod, name)
            mod.register_buffer(name, t, persistent=False)
            done.append((mod, name, t))
        yield
    finally:
        for mod, name, t in done:
            mod._buffers.pop(name, None)
            mod._non_persistent_buffers_set.discard(name)
            object.__setattr__(mod, name, t)


def _trace_attribute_mutations(model: torch.nn.Module, ep, attrs: dict, args, kwargs) -> None:
    """PopTorch traces the model on the host, so a plain tensor attribute (not a buffer) changed in
    place by ``forward`` (``self.i += 1``) is changed once on the host by the trace, while the
    graph keeps its value before the call as a constant (PopTorch's ``docs/user_guide/buffers.py``:
    two runs both return ``tensor([1.])`` and ``model.i`` is then ``tensor([1.])``). The captured
    program is run once on the micro-batch inputs when it mutates such an attribute, and the
    attribute takes the value it left (the host tensor is updated in place)."""
    mutated = [p for p in ep.graph_signature.buffers_to_mutate.values() if p in attrs]
    if not mutated:
        return
    gm = ep.module()
    with torch.no_grad():
        gm(*args, **kwargs)
    for path in mutated:
        mod_path, _, name = path.rpartition(".")
        mod = model.get_submodule(mod_path) if mod_path else model
        host = vars(mod).get(name)
        if isinstance(host, torch.Tensor):
            with torch.no_grad():
                host.copy_(gm.get_buffer(path))


def _error_on_backward(*args, **kwargs):
    raise Error(_BACKWARD_ERROR)


def _is_param(model: torch.nn.Module, path: str) -> bool:
    try:
        model.get_parameter(path)
        return True
    except AttributeError:
        return False


def _owner(model: torch.nn.Module, path: str):
    """(the module holding parameter ``path``, its attribute name)."""
    *mods, attr = path.split(".")
    owner = model
    for m in mods:
        owner = getattr(owner, m)
    return owner, attr


class _ReplicaGroupingParameter:
    """A parameter as ``model.<name>`` on a PopTorch wrapper gives it: the parameter, plus
    ``replicaGrouping(comm_group_type, shards, variable_retrieval_mode)`` making it a
    replica-grouped weight of that wrapper (``shards``: replicas per group; the parameter holds
    one value per group, ``[groups, *shape]``). Set before the model is compiled."""

    def __init__(self, wrapper, name, param):
        object.__setattr__(self, "_wrapper", wrapper)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_param", param)

    def replicaGrouping(self, comm_group_type, shards: int, variable_retrieval_mode):  # noqa: N802
        self._wrapper._per_replica_params[self._name] = (int(comm_group_type), int(shards),
                                                         int(variable_retrieval_mode))

    def __getattr__(self, attr):
        return getattr(self._param, attr)
