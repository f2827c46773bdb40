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

import inspect
import io
import logging
import time
import weakref

import numpy as np
import torch
import torch.utils._pytree as pytree

from openipu import popart
from openipu.poptorch import capture as cap
from openipu.poptorch import optim as poptorch_optim
from openipu.poptorch.enums import ConnectionType, OutputMode
from openipu.poptorch.errors import Error, from_popart
from openipu.poptorch.lower import NUMPY_TYPE, POPART_TYPE

_log = logging.getLogger("poptorch")

_ART = {OutputMode.All: "All", OutputMode.Final: "Final", OutputMode.Sum: "Sum"}
#: user model -> weak reference to the training wrapper that owns it (until ``destroy()``)
_TRAINING_WRAPPERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_BACKWARD_ERROR = ("backward() cannot be called explicitly on outputs of a PopTorch model. If you're using a "
                   "trainingModel, the backwards pass is performed automatically when invoking the model. If "
                   "you're using an inferenceModel, you should use a trainingModel instead.")


_MODULE_STATE = frozenset(torch.nn.Module().__dict__)


def _to_numpy(t: torch.Tensor, dtype: str) -> np.ndarray:
    return t.detach().cpu().numpy().astype(NUMPY_TYPE[dtype], copy=False)


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
        if training and optimizer is None:
            optimizer = poptorch_optim.SGD(model.parameters(), lr=0.01)
        self._user_model = model
        self._options = options
        self._training = training
        self._optimizer = optimizer
        self._session = None
        self._built = None
        self._signature = None
        self._attached = False
        self._uploaded_versions = None
        self._cycles = None
        self._compile_seconds = None
        self._perf = None
        self._rng_state = None
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
        return getattr(self._user_model, name)

    def isCompiled(self) -> bool:  # noqa: N802
        return self._session is not None

    def isAttachedToDevice(self) -> bool:  # noqa: N802
        return self._session is not None and self._attached

    # -- arguments ---------------------------------------------------------------------------
    def _bind(self, args, kwargs):
        """(positional args, kwargs, [(name, tensor)] of the tensor leaves in capture order,
        the non-tensor leaves)."""
        from openipu.poptorch._args import ensure_geometric_parsers
        ensure_geometric_parsers()
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
        """Capture and compile for these inputs without running (warns if already compiled)."""
        if self._session is not None:
            import warnings
            warnings.warn("Call to compile() ignored: the model is already compiled")
            return
        start = time.perf_counter()
        args_, kwargs_, tensors, others = self._bind(args, kwargs)
        micro = self._micro(tensors)
        it = iter(micro)
        margs, mkwargs = pytree.tree_map(lambda v: next(it) if isinstance(v, torch.Tensor) else v, (args_, kwargs_))
        model = self._user_model
        was_training = model.training
        try:
            ep = cap.capture(model, margs, mkwargs)
        finally:
            model.train(was_training)
        strategy = getattr(self._options, "_execution_strategy", None)
        built = cap.build(ep, [n for n, _ in tensors], self._training, strategy)
        self._built = built
        self._signature = ([(n, tuple(t.shape), t.dtype) for n, t in tensors], others)
        self._make_session(built)
        self._compile_seconds = time.perf_counter() - start

    def _make_session(self, built: "cap.Built", executable: bytes | None = None) -> None:
        o = self._options
        di, af, rf = self._factor()
        mode = o.output_mode
        art = popart.AnchorReturnType("EveryN", o.output_return_period) if mode == OutputMode.EveryN else \
            popart.AnchorReturnType(_ART[mode])
        anchors = {t: art for t in built.outputs}
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
            s.prepareDevice()
        except popart.popart_exception as e:
            raise from_popart(e) from e
        self._session = s
        self._attached = o.connection_type != ConnectionType.Never
        if o.random_seed is not None:
            s.setRandomSeed(o.random_seed)
        self._upload_weights(force=True)

    # -- weights ---------------------------------------------------------------------------
    def _module_tensor(self, path: str) -> torch.Tensor:
        m = self._user_model
        return m.get_parameter(path) if _is_param(m, path) else m.get_buffer(path)

    def _versions(self):
        return [self._module_tensor(p)._version for p in self._built.weights.values()]

    def _upload_weights(self, force: bool = False) -> None:
        if self._connection_never():
            return
        versions = self._versions()
        if not force and versions == self._uploaded_versions:
            return
        io = {}
        for tid, path in self._built.weights.items():
            t = self._module_tensor(path)
            io[tid] = _to_numpy(t, POPART_TYPE[t.dtype])
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
        self._session.weightsToHost()
        # one weight at a time through a staging array (copy_ keeps the module tensors' version
        # counters right, which other wrappers of the module use to know they must upload): at
        # most one weight's extra host copy, not one of every weight
        with torch.no_grad():
            for tid, path in self._built.weights.items():
                host = self._session._host_weights[tid]
                buf = np.empty(host.shape, host.dtype)
                self._session.readWeights(popart.PyWeightsIO({tid: buf}))
                t = self._module_tensor(path)
                t.copy_(torch.from_numpy(buf).reshape(t.shape).to(t.dtype))
        self._uploaded_versions = self._versions()

    def copyWeightsToHostIfNeeded(self) -> bool:  # noqa: N802
        """Weights are copied back after every training call, so there is nothing to do."""
        return False

    def _connection_never(self) -> bool:
        return self._options.connection_type == ConnectionType.Never

    def _check_compiled(self):
        if self._session is None:
            raise Error("Model has not been compiled or has been destroyed.")

    # -- run -----------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if self._session is None:
            self.compile(*args, **kwargs)
        if self._connection_never():
            raise Error("Trying to run a model compiled for an offline IPU target (useOfflineIpuTarget / "
                        "ConnectionType.Never): it can be compiled and exported, not run")
        if not self._attached:       # PopTorch re-attaches a detached model when it is called
            self.attachToDevice()
        t0 = time.perf_counter()
        _, _, tensors, others = self._bind(args, kwargs)
        self._validate(tensors, others)
        if not self._training:
            self._upload_weights()
        di, af, rf = self._factor()
        lead = [d for d in (di, af, rf) if d > 1]
        feeds = {}
        for tid, info, (name, t) in zip(self._built.inputs, self._built.input_info, tensors):
            arr = _to_numpy(t, info.data_type())
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
        for o in outs:
            o.backward = _error_on_backward
        self._perf = (t0, t1, t2, time.perf_counter())
        return pytree.tree_unflatten(outs, self._built.out_spec)

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
        """Release the IPU (the weights are read back first for a training model)."""
        if self._session is None:
            raise Error("Cannot detach a model that has not been compiled.")
        if not self._attached:
            raise Error("Device is not attached")
        if self._training:
            self.copyWeightsToHost()
        self._attached = False

    def attachToDevice(self) -> None:  # noqa: N802
        """Take the IPU back and re-send the weights (and optimizer)."""
        if self._session is None:
            raise Error("Cannot attach a model that has not been compiled.")
        if self._attached:
            raise Error("Device is already attached")
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
        return [int(s.getRandomSeed())]

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
        """PopTorch's performance counters of the last call, in seconds (``time.perf_counter``):
        ``input`` / ``input_complete`` / ``output`` / ``output_complete``, each ``[tensor][step]``.

        These are **host-measured** timestamps of the simulation, not predictions of the IPU (for
        those see ``cycleCount()``): the host's input preparation, the run and the output copies
        are timed once per call and spread evenly over its device iterations (one output step per
        iteration returned by the output mode)."""
        empty = {"input": [[]], "input_complete": [[]], "output": [[]], "output_complete": [[]]}
        if self._session is None or self._perf is None:
            return empty
        t0, t1, t2, t3 = self._perf
        di = self._options.device_iterations
        mode = self._options.output_mode
        n_out = di if mode == OutputMode.All else di // self._options.output_return_period \
            if mode == OutputMode.EveryN else 1
        d_in, d_run, d_out = (t1 - t0) / di, (t2 - t1) / di, (t3 - t2) / max(n_out, 1)
        starts = [t1 + k * d_run for k in range(di)]
        ins = [s - d_in for s in starts]
        step = di // max(n_out, 1)
        outs = [t1 + (k + 1) * step * d_run for k in range(n_out)]
        n_in, n_o = max(len(self._built.inputs), 1), max(len(self._built.outputs), 1)
        return {"input": [list(ins) for _ in range(n_in)], "input_complete": [list(starts) for _ in range(n_in)],
                "output": [list(outs) for _ in range(n_o)],
                "output_complete": [[o + d_out for o in outs] for _ in range(n_o)]}

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
                          int(meta["num_ipus"]), bool(meta["pipelined"]))
        self._built = built
        self._signature = ([(n, tuple(shape), export._DTYPES[dt]) for n, shape, dt in meta["signature"]],
                           export.decode(meta["others"]))
        self._session = None
        self._make_session(built, executable)
        if meta.get("rng_state"):
            self.rng_state = meta["rng_state"]

    def __repr__(self):
        return f"PoplarExecutor({'training' if self._training else 'inference'}, {self._user_model!r})"


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


def _error_on_backward(*args, **kwargs):
    raise Error(_BACKWARD_ERROR)


def _is_param(model: torch.nn.Module, path: str) -> bool:
    try:
        model.get_parameter(path)
        return True
    except AttributeError:
        return False
