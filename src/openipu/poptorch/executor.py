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

import numpy as np
import torch
import torch.utils._pytree as pytree

from openipu import popart
from openipu.poptorch import capture as cap
from openipu.poptorch import optim as poptorch_optim
from openipu.poptorch.enums import ConnectionType, OutputMode
from openipu.poptorch.errors import Error, from_popart
from openipu.poptorch.lower import NUMPY_TYPE, POPART_TYPE

_ART = {OutputMode.All: "All", OutputMode.Final: "Final", OutputMode.Sum: "Sum"}


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

    # -- properties --------------------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        return self._user_model

    @property
    def options(self):
        return self._options

    def __getattr__(self, name):
        # unknown attributes are the user model's (PopTorch forwards them)
        if name.startswith("_"):
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
        sig = inspect.signature(self._user_model.forward)
        try:
            ba = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise Error(f"The arguments do not match {type(self._user_model).__name__}.forward: {e}") from None
        ba.apply_defaults()
        args_, kwargs_ = ba.args, ba.kwargs
        leaves, _ = pytree.tree_flatten_with_path((args_, kwargs_))
        names = list(sig.parameters)
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

    def _make_session(self, built: "cap.Built") -> None:
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
        bufs = {tid: np.empty(self._session._host_weights[tid].shape, self._session._host_weights[tid].dtype)
                for tid in self._built.weights}
        self._session.readWeights(popart.PyWeightsIO(bufs))
        with torch.no_grad():
            for tid, path in self._built.weights.items():
                t = self._module_tensor(path)
                t.copy_(torch.from_numpy(bufs[tid]).reshape(t.shape).to(t.dtype))
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
        if not self._attached:
            raise Error("Device is not attached: call attachToDevice() before running the model")
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
        try:
            self._session.run(popart.PyStepIO(feeds, anchors))
        except popart.popart_exception as e:
            raise from_popart(e) from e
        if self._options.log_cycle_count:
            self._cycles = self._session.getCycleCount()
        self._anchors = anchors
        if self._training:
            self.copyWeightsToHost()
        outs = [self._output(anchors[tid]) for tid in self._built.outputs]
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
        return torch.from_numpy(np.ascontiguousarray(arr))

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
        """Free the compiled model (a training model copies its weights back first)."""
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
        return torch.from_numpy(np.ascontiguousarray(self._anchors[long_name]))

    def __repr__(self):
        return f"PoplarExecutor({'training' if self._training else 'inference'}, {self._user_model!r})"


def _is_param(model: torch.nn.Module, path: str) -> bool:
    try:
        model.get_parameter(path)
        return True
    except AttributeError:
        return False
