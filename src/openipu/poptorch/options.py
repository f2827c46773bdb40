"""``poptorch.Options`` (``research/poptorch.md`` 1.4): how a wrapped model is batched, placed and
compiled, translated to PopART ``SessionOptions`` and an IPU device.

Setters return the options so calls chain (``Options().deviceIterations(20).randomSeed(1)``).
``set(**kw)`` and attribute assignment are type-checked ("Invalid option ...", "Unexpected
type ..."); once a model is wrapped its options are frozen (``AttributeError("Can't modify frozen
Options")``) and ``clone()`` gives an unfrozen copy. ``toDict()`` lists every value.

Batching (1.7): each call's inputs hold ``deviceIterations * replicationFactor *
gradientAccumulation`` micro-batches along dim 0 (:meth:`Options.batch_factor`), in PopART's
order ``[deviceIterations][gradientAccumulation][replicationFactor][micro-batch]``.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import logging
import os

import torch

from openipu import popart
from openipu.poptorch.enums import (ConnectionType, MeanReductionStrategy, OutputMode, ReductionType,
                                    SyncPattern)
from openipu.poptorch.errors import Error
from openipu.poptorch.ops import Attribute  # noqa: F401 - poptorch.options.Attribute (optimum-graphcore)

_log = logging.getLogger("poptorch::python")


class _OptionsDict:
    """Type-checked, freezable option storage: ``_values`` name -> value (the type of the default
    is the allowed type)."""

    def __init__(self, **defaults):
        object.__setattr__(self, "_values", dict(defaults))
        object.__setattr__(self, "_frozen", False)

    def set(self, **kw):
        """Set options by name; asserts "Invalid option ..." / "Unexpected type ..." (PopTorch)."""
        for k, v in kw.items():
            self._check(k, v)
        for k, v in kw.items():
            self._values[k] = v
        return self

    def _check(self, k, v):
        if self._frozen:
            raise AttributeError("Can't modify frozen Options")
        if k not in self._values:
            raise AssertionError(f"Invalid option {k}, valid options are {sorted(self._values)}")
        cur = self._values[k]
        ok = cur is None or isinstance(v, type(cur)) or (type(cur) is float and type(v) is int)
        if not ok:
            raise AssertionError(f"Unexpected type {type(v)} for option {k}. Expected {type(cur)}")

    def __getattr__(self, k):
        values = object.__getattribute__(self, "_values")
        if k in values:
            return values[k]
        raise AttributeError(f"Unknown option '{k}'")

    def __setattr__(self, k, v):
        if k.startswith("_") or k in type(self).__dict__:
            object.__setattr__(self, k, v)
        else:
            self.set(**{k: v})

    def _freeze(self):
        object.__setattr__(self, "_frozen", True)
        for v in vars(self).values():
            if isinstance(v, _OptionsDict):
                v._freeze()

    def toDict(self) -> dict:  # noqa: N802
        return dict(self._values)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


class OptionError(ValueError, AssertionError):
    """An invalid option value: PopTorch asserts (``AssertionError``); openipu raised
    ``ValueError`` before, so the error is both."""


class ConfigFileError(Exception):
    """``poptorch.ConfigFileError``: a line of an options file (:meth:`Options.loadFromFile`)
    that cannot be applied."""


def _load_config(options, filepath: str) -> None:
    """Apply the option calls of ``filepath`` to ``options`` (:meth:`Options.loadFromFile`)."""
    name = os.path.basename(filepath)
    with open(filepath) as f:
        lines = [ln.strip() for ln in f]
    cmds = [ln for ln in lines if ln and not ln.startswith("#")]
    for lineno, line in enumerate(cmds, 1):
        try:
            tree = ast.parse(line, mode="eval")
        except SyntaxError as err:
            raise ConfigFileError(f"SyntaxError at line {lineno} of {name}: {err.args[0]}\n> {line}") from None
        try:
            _ConfigCall(options, line, lineno, name).run(tree.body)
        except ConfigFileError:
            raise
        except (AttributeError, TypeError, ValueError, AssertionError, Error) as err:
            raise ConfigFileError(f"{type(err).__name__} at line {lineno} of {name}: {err}\n> {line}") from None


class _ConfigCall:
    """One line of an options file evaluated as data: a call chain on the options with literal,
    ``poptorch.*`` / ``torch.*`` arguments (no other names, no private attributes)."""

    ROOTS = ("poptorch", "torch")
    PRIVATE_OK = ("_Popart",)

    def __init__(self, options, line, lineno, name):
        self.options, self.line, self.lineno, self.name = options, line, lineno, name
        self.created: list = []

    def owners(self) -> list:
        """The objects whose methods a line may call: the options, their sub-objects and the
        poptorch objects the line built."""
        o = self.options
        return [o, o.Precision, o.Training, o.Jit, o.TensorLocations, o.Distributed, o._Popart, *self.created]

    def fail(self, what):
        raise ConfigFileError(f"Unsupported option line at line {self.lineno} of {self.name}: {what}\n> {self.line}")

    def run(self, node):
        if not isinstance(node, ast.Call):
            self.fail("each line must call an option setter, e.g. deviceIterations(4)")
        return self.value(node, target=True)

    def root(self, name, target):
        import torch as _torch

        import openipu.poptorch as _poptorch
        if name == "poptorch":
            return _poptorch
        if name == "torch":
            return _torch
        if target and (not name.startswith("_") or name in self.PRIVATE_OK):
            return getattr(self.options, name)
        self.fail(f"unknown name '{name}'")

    def value(self, node, target=False):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            vals = [self.value(e) for e in node.elts]
            return vals if isinstance(node, ast.List) else tuple(vals)
        if isinstance(node, ast.Dict):
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Name):
            return self.root(node.id, target)
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_") and node.attr not in self.PRIVATE_OK:
                self.fail(f"private attribute '{node.attr}'")
            return getattr(self.value(node.value, target), node.attr)
        if isinstance(node, ast.Call):
            fn = self.value(node.func, target)
            owner = getattr(fn, "__self__", None)
            is_class = isinstance(fn, type) and str(getattr(fn, "__module__", "")).startswith("openipu.poptorch")
            if not is_class and not (inspect.ismethod(fn) and any(owner is o for o in self.owners())):
                self.fail(f"only option setters and poptorch classes may be called, not {getattr(fn, '__name__', fn)}")
            args = [self.value(a) for a in node.args]
            kwargs = {k.arg: self.value(k.value) for k in node.keywords}
            out = fn(*args, **kwargs)
            if is_class:
                self.created.append(out)
            return out
        self.fail(f"unsupported expression {type(node).__name__}")


class _DistributedOptions(_OptionsDict):
    """``Options.Distributed``: this process's place among the processes of a distributed run
    (PopTorch reads ``OMPI_COMM_WORLD_SIZE`` / ``OMPI_COMM_WORLD_RANK`` by default; ``poprun``
    sets them). With several processes each process's ``replicationFactor`` replicas are a block
    of the global replicated graph (PopART ``enableDistributedReplicatedGraphs``,
    ``globalReplicationFactor = replicationFactor * numProcesses``, ``globalReplicaOffset =
    replicationFactor * processId``); the cross-replica collectives run between the processes over
    ``torch.distributed`` (:mod:`openipu.poplibs.gcl_instances`), and ``poptorch.DataLoader`` gives
    each process its share of the dataset."""

    def __init__(self):
        super().__init__(num_distributed_processes=1, distributed_process_id=0)
        self._env = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
        self.setEnvVarNames(*self._env)

    def disable(self):
        """One process, id 0, whatever the environment says."""
        return self.set(num_distributed_processes=1, distributed_process_id=0)

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str):  # noqa: N802
        """Read the number of processes and this process's id from these environment variables."""
        object.__setattr__(self, "_env", (str(var_num_processes), str(var_process_id)))
        return self.configureProcessId(int(os.environ.get(var_process_id, "0")),
                                       int(os.environ.get(var_num_processes, "1")))

    def configureProcessId(self, process_id: int, num_processes: int):  # noqa: N802
        """This process is ``process_id`` of ``num_processes``. Raises :class:`OptionError` unless
        ``0 <= process_id < num_processes``."""
        if not 0 <= int(process_id) < int(num_processes):
            raise OptionError(f"Invalid process id {process_id} for {num_processes} processes")
        return self.set(distributed_process_id=int(process_id), num_distributed_processes=int(num_processes))

    @property
    def processId(self) -> int:  # noqa: N802
        return self.distributed_process_id

    @property
    def numProcesses(self) -> int:  # noqa: N802
        return self.num_distributed_processes


class _PrecisionOptions(_OptionsDict):
    """``Options.Precision``."""

    def __init__(self):
        super().__init__(partials_type="", stochastic_rounding=False, fp_exceptions=False)

    def setPartialsType(self, dtype):  # noqa: N802
        """``torch.float`` or ``torch.half``: the partials of matmuls and convolutions."""
        if dtype not in (torch.float, torch.half, torch.float32, torch.float16):
            raise ValueError("setPartialsType only accepts torch.float or torch.half")
        return self.set(partials_type="half" if dtype in (torch.half, torch.float16) else "float")

    def enableStochasticRounding(self, enabled: bool):  # noqa: N802
        return self.set(stochastic_rounding=bool(enabled))

    def enableFloatingPointExceptions(self, enabled: bool):  # noqa: N802
        return self.set(fp_exceptions=bool(enabled))

    def halfFloatCasting(self, *_):  # noqa: N802
        import warnings
        warnings.warn("halfFloatCasting is deprecated and has no effect", DeprecationWarning)
        return self

    def runningStatisticsAlwaysFloat(self, *_):  # noqa: N802
        import warnings
        warnings.warn("runningStatisticsAlwaysFloat is deprecated and has no effect", DeprecationWarning)
        return self


class _TrainingOptions(_OptionsDict):
    """``Options.Training``."""

    def __init__(self):
        super().__init__(gradient_accumulation=1, accumulation_and_replication_reduction_type=ReductionType.Mean,
                         mean_accumulation_and_replication_reduction_strategy=MeanReductionStrategy.Post,
                         automatic_loss_scaling=False, convolution_dithering=False)

    @property
    def meanAccumulationAndReplicationReductionStrategy(self):  # noqa: N802
        """PopTorch's name of the option :meth:`setMeanAccumulationAndReplicationReductionStrategy` sets."""
        return self.mean_accumulation_and_replication_reduction_strategy

    def gradientAccumulation(self, gradient_accumulation: int):  # noqa: N802
        """Micro-batches summed (or meaned) into one weight update."""
        if int(gradient_accumulation) < 1:
            raise ValueError("gradientAccumulation must be at least 1")
        return self.set(gradient_accumulation=int(gradient_accumulation))

    def accumulationAndReplicationReductionType(self, t):  # noqa: N802
        if str(t).split(".")[-1] not in ("Mean", "Sum"):
            raise ValueError("accumulationAndReplicationReductionType must be ReductionType.Mean or ReductionType.Sum")
        return self.set(accumulation_and_replication_reduction_type=t)

    def setMeanAccumulationAndReplicationReductionStrategy(self, s):  # noqa: N802
        return self.set(mean_accumulation_and_replication_reduction_strategy=s)

    def setAutomaticLossScaling(self, enabled: bool):  # noqa: N802
        return self.set(automatic_loss_scaling=bool(enabled))

    def setConvolutionDithering(self, enabled: bool):  # noqa: N802
        return self.set(convolution_dithering=bool(enabled))


#: ``Options._Popart.set`` keys PopTorch handles itself rather than passing to PopART's
#: ``SessionOptions``: ``saveInitializersToFile`` (the executor writes the weights to that file,
#: PopART's external-data layout, when it builds the session).
POPTORCH_ONLY_POPART_KEYS = frozenset({"saveInitializersToFile"})


class _PopartOptions:
    """``Options._Popart``: raw PopART ``SessionOptions`` keys (``set``), engine options and
    patterns, applied last."""

    def __init__(self):
        self.options: dict = {}
        self.patterns: dict = {}
        self.pattern_level = 2

    def set(self, key: str, value):
        self.options[key] = value
        return self

    def setEngineOptions(self, engine_options: dict):  # noqa: N802
        self.options["engineOptions"] = dict(engine_options)
        return self

    def setPatterns(self, patterns: dict, level: int = 2):  # noqa: N802
        self.patterns, self.pattern_level = dict(patterns), int(level)
        return self


class TensorLocationSettings(_OptionsDict):
    """``poptorch.TensorLocationSettings``: where one kind of tensor lives (PopART's
    ``TensorLocationSettings``)."""

    def __init__(self):
        super().__init__(on_chip=True, replicated_tensor_sharding=False, io_tiles_to_load=False,
                         io_tiles_to_store=False, min_elements_off_chip=2, min_elements_rts=8192)

    def useOnChipStorage(self, use: bool = True):  # noqa: N802
        return self.set(on_chip=bool(use))

    def useReplicatedTensorSharding(self, use: bool = True):  # noqa: N802
        return self.set(replicated_tensor_sharding=bool(use))

    def useIOTilesToLoad(self, use: bool = True):  # noqa: N802
        return self.set(io_tiles_to_load=bool(use))

    def useIOTilesToStore(self, use: bool = True):  # noqa: N802
        return self.set(io_tiles_to_store=bool(use))

    def minElementsForOffChip(self, n: int):  # noqa: N802
        return self.set(min_elements_off_chip=int(n))

    def minElementsForReplicatedTensorSharding(self, n: int):  # noqa: N802
        return self.set(min_elements_rts=int(n))

    def to_popart(self, settings) -> None:
        """Write these settings into PopART's ``TensorLocationSettings`` ``settings``."""
        loc = settings.location
        loc.storage = popart.TensorStorage.OnChip if self.on_chip else popart.TensorStorage.OffChip
        loc.replicatedTensorSharding = popart.ReplicatedTensorSharding.On if self.replicated_tensor_sharding \
            else popart.ReplicatedTensorSharding.Off
        loc.loadTileSet = "IO" if self.io_tiles_to_load else "Compute"
        loc.storageTileSet = "IO" if self.io_tiles_to_store else "Compute"
        settings.minElementsForOffChip = self.min_elements_off_chip
        settings.minElementsForReplicatedTensorSharding = self.min_elements_rts


class _TensorLocationOptions(_OptionsDict):
    """``Options.TensorLocations``: IO tiles and the location of activations, weights, optimizer
    state and accumulators."""

    KINDS = {"activation": "activationTensorLocationSettings", "weight": "weightTensorLocationSettings",
             "optimizer": "optimizerStateTensorLocationSettings", "accumulator": "accumulatorTensorLocationSettings"}

    def __init__(self):
        super().__init__(num_io_tiles=0, locations={})

    def numIOTiles(self, n: int):  # noqa: N802
        """Tiles set aside for IO: even, in [32, 192]."""
        n = int(n)
        if n % 2 or not 32 <= n <= 192:
            raise AssertionError("numIOTiles must be an even number between 32 and 192.")
        return self.set(num_io_tiles=n)

    def _location(self, kind, settings: TensorLocationSettings):
        if not isinstance(settings, TensorLocationSettings):
            raise ValueError(f"set{kind.capitalize()}Location takes a poptorch.TensorLocationSettings")
        return self.set(locations={**self.locations, kind: settings})

    def setActivationLocation(self, settings):  # noqa: N802
        return self._location("activation", settings)

    def setWeightLocation(self, settings):  # noqa: N802
        return self._location("weight", settings)

    def setOptimizerLocation(self, settings):  # noqa: N802
        return self._location("optimizer", settings)

    def setAccumulatorLocation(self, settings):  # noqa: N802
        return self._location("accumulator", settings)


class _JitOptions(_OptionsDict):
    def __init__(self):
        super().__init__(trace_model=False)

    def traceModel(self, trace: bool):  # noqa: N802
        """Deprecated in PopTorch: warns "[Deprecated] Do not call options.Jit.traceModel(): ..."
        and raises ``ValueError`` ("options.Jit.traceModel(True) is no longer supported") for
        ``True`` (the dispatcher, here ``torch.export``, is the only frontend)."""
        _log.warning("[Deprecated] Do not call options.Jit.traceModel(): options.Jit.traceModel(False) is now the "
                     "default, and True is no longer supported, therefore this function will be removed shortly")
        if trace:
            raise ValueError("options.Jit.traceModel(True) is no longer supported")
        return self


class Options(_OptionsDict):
    """``poptorch.Options()`` (module docstring). Environment: ``POPTORCH_DEFAULT_OPTIONS`` (JSON
    ``{"name": value}`` applied at construction), ``POPTORCH_IPU_MODEL`` (``useIpuModel``),
    ``POPTORCH_CACHE_DIR`` (``enableExecutableCaching``)."""

    def __init__(self):
        super().__init__(device_iterations=1, replication_factor=1, input_group_size=1, input_cgt=1,
                         output_mode=OutputMode.Default,
                         output_return_period=1, random_seed=None, use_ipu_model=None, ipu_id=-1,
                         offline_ipu_version=None, connection_type=ConnectionType.Always, sync_pattern=SyncPattern.Full,
                         auto_round_num_ipus=False, log_cycle_count=False, log_dir=".", max_repeat_logs=4,
                         executable_cache_dir="", synthetic_data=False, available_memory_proportion={},
                         enable_stable_norm=False, broadcast_buffers=True, model_name="", profile_dir="",
                         anchored_tensors={}, updatable_named_buffers=[], relax_optimizer_attributes_checks=False,
                         show_compilation_progress_bar=True, disable_module_namescope=False)
        object.__setattr__(self, "Precision", _PrecisionOptions())
        object.__setattr__(self, "Training", _TrainingOptions())
        object.__setattr__(self, "Jit", _JitOptions())
        object.__setattr__(self, "TensorLocations", _TensorLocationOptions())
        object.__setattr__(self, "_Popart", _PopartOptions())
        object.__setattr__(self, "Distributed", _DistributedOptions())
        object.__setattr__(self, "_execution_strategy", None)
        env = os.environ.get("POPTORCH_DEFAULT_OPTIONS")
        if env:
            for k, v in json.loads(env).items():
                target = self
                *path, name = k.split(".")
                for p in path:
                    target = getattr(target, p)
                target.set(**{name: v})
        if os.environ.get("POPTORCH_CACHE_DIR"):
            self.enableExecutableCaching(os.environ["POPTORCH_CACHE_DIR"])

    @property
    def _popart(self):
        """OG spells it lower-case."""
        return self._Popart

    # -- batching --------------------------------------------------------------------------
    def deviceIterations(self, device_iterations: int):  # noqa: N802
        """Batches run per call (PopART's ``batchesPerStep``)."""
        if int(device_iterations) < 1:
            raise ValueError("deviceIterations must be at least 1")
        return self.set(device_iterations=int(device_iterations))

    def replicationFactor(self, replication_factor: int):  # noqa: N802
        """Copies of the model, each on its own IPUs, each fed its share of the batch."""
        if int(replication_factor) < 1:
            raise ValueError("replicationFactor must be at least 1")
        return self.set(replication_factor=int(replication_factor))

    def inputReplicaGrouping(self, input_group_size: int, input_group_type=1):  # noqa: N802
        """Split each input batch between groups of ``input_group_size`` replicas
        (``poptorch.CommGroupType`` ``Consecutive`` or ``Orthogonal``; ``NoGrouping``: groups of
        one): the replicas of a group read the same data, so a call's batch dimension is
        ``deviceIterations * replicationFactor / input_group_size * gradientAccumulation``
        micro-batches. Raises ``ValueError`` as PopTorch does for ``All``, a size larger than the
        replication factor or one that does not divide it."""
        from openipu.poptorch.enums import CommGroupType
        input_group_type = CommGroupType(int(input_group_type))
        if input_group_type == CommGroupType.NoGrouping:
            input_group_size = 1
            input_group_type = CommGroupType.Consecutive
        if input_group_type == CommGroupType.All:
            raise ValueError("input_group_type cannot be All")
        if self.replication_factor < input_group_size:
            raise ValueError("input_group_size cannot be larger than replication_factor")
        if self.replication_factor % input_group_size:
            raise ValueError("input_group_size must be a factor of replication_factor")
        self.set(input_group_size=int(input_group_size))
        return self.set(input_cgt=int(input_group_type))

    def input_group_of(self) -> list[int]:
        """The input group of each replica (openipu helper): ``Consecutive`` groups of
        ``input_group_size`` neighbours, ``Orthogonal`` groups ``replicas / size`` apart."""
        r, k = self.replication_factor, self.input_group_size
        n = r // k
        return [i // k if int(self.input_cgt) == 1 else i % n for i in range(r)]

    def outputMode(self, mode: OutputMode, output_return_period: int | None = None):  # noqa: N802
        """What each call returns (module docstring). ``EveryN`` needs a positive
        ``output_return_period`` (else raises :class:`OptionError`, an ``AssertionError`` as in
        PopTorch, and a ``ValueError``); for the other modes a period is ignored, with PopTorch's
        info log "Anchor return period argument ignored with output_mode set to ..."."""
        mode = OutputMode(mode)
        if mode == OutputMode.EveryN:
            if not output_return_period or int(output_return_period) < 1:
                raise OptionError("EveryN anchor must have output_return_period set to valid positive integer")
        elif output_return_period:
            from openipu.poptorch._logging import logger
            logger.info("Anchor return period argument ignored with output_mode set to %s", mode)
            output_return_period = None
        return self.set(output_mode=mode, output_return_period=int(output_return_period or 1))

    def anchorMode(self, anchor_mode: OutputMode, anchor_return_period: int | None = None):  # noqa: N802
        """PopTorch's name for :meth:`outputMode` before 2.5 (deprecated in 2.4, removed in 2.5):
        warns (``DeprecationWarning``) and sets the output mode; raises as :meth:`outputMode`."""
        import warnings
        warnings.warn("Options.anchorMode is deprecated (removed in PopTorch 2.5): use Options.outputMode",
                      DeprecationWarning, stacklevel=2)
        return self.outputMode(anchor_mode, anchor_return_period)

    def defaultOutputMode(self) -> bool:  # noqa: N802
        return self.output_mode == OutputMode.Default

    def anchorTensor(self, short_name: str, long_name: str, output_mode=None, output_return_period: int = 1):  # noqa: N802
        """Return PopART tensor ``long_name`` (e.g. ``Gradient___fc1.weight``) as
        ``getAnchoredTensor(short_name)``."""
        anchors = dict(self.anchored_tensors)
        anchors[short_name] = (long_name, output_mode, int(output_return_period))
        return self.set(anchored_tensors=anchors)

    def batch_factor(self) -> int:
        """Micro-batches per call: ``deviceIterations * replicationFactor / inputGroupSize *
        gradientAccumulation`` (openipu helper; PopTorch's ``_combined_batch``)."""
        return self.device_iterations * (self.replication_factor // self.input_group_size) * \
            self.Training.gradient_accumulation

    # -- device ----------------------------------------------------------------------------
    def randomSeed(self, random_seed: int):  # noqa: N802
        """The device's seed (and ``torch.manual_seed``, as PopTorch does)."""
        torch.manual_seed(int(random_seed))
        return self.set(random_seed=int(random_seed))

    def useIpuModel(self, use: bool):  # noqa: N802
        return self.set(use_ipu_model=bool(use))

    def useIpuId(self, ipu_id: int):  # noqa: N802
        return self.set(ipu_id=int(ipu_id))

    def useOfflineIpuTarget(self, ipu_version: int = 2):  # noqa: N802
        """Compile for an IPU without one attached (``ConnectionType.Never``): predictions only."""
        self.set(offline_ipu_version=int(ipu_version))
        return self.connectionType(ConnectionType.Never)

    def connectionType(self, t: ConnectionType):  # noqa: N802
        return self.set(connection_type=ConnectionType(t))

    def syncPattern(self, p: SyncPattern):  # noqa: N802
        return self.set(sync_pattern=SyncPattern(p))

    def autoRoundNumIPUs(self, enabled: bool):  # noqa: N802
        return self.set(auto_round_num_ipus=bool(enabled))

    def setAvailableMemoryProportion(self, proportions: dict):  # noqa: N802
        """``{"IPU0": 0.5, ...}``: the share of tile memory matmuls and convolutions may use."""
        for k, v in proportions.items():
            assert str(k).startswith("IPU"), ("Available memory proportions are expected to be in a dictionary of "
                                              "{\"IPU0\": 0.5} where the 0 in IPU is the index of the IPU. "
                                              f"Invalid key: {k}")
            if not 0.0 < float(v) <= 1.0:
                raise ValueError(f"Invalid available memory proportion {v} for {k}: it must be in (0, 1]")
        return self.set(available_memory_proportion={str(k): float(v) for k, v in proportions.items()})

    def setExecutionStrategy(self, strategy):  # noqa: N802
        object.__setattr__(self, "_execution_strategy", strategy)
        return self

    def enableExecutableCaching(self, path: str | None):  # noqa: N802
        return self.set(executable_cache_dir=str(path) if path else "")

    def enableSyntheticData(self, enabled: bool):  # noqa: N802
        return self.set(synthetic_data=bool(enabled))

    def enableStableNorm(self, enabled: bool):  # noqa: N802
        return self.set(enable_stable_norm=bool(enabled))

    def broadcastBuffers(self, enabled: bool):  # noqa: N802
        return self.set(broadcast_buffers=bool(enabled))

    def logCycleCount(self, enabled: bool):  # noqa: N802
        """Count the cycles of each call (``PoplarExecutor.cycleCount()``)."""
        return self.set(log_cycle_count=bool(enabled))

    def logDir(self, path: str):  # noqa: N802
        return self.set(log_dir=str(path))

    def maxRepeatLogs(self, n: int | None):  # noqa: N802
        """Repeated log lines shown at most ``n`` times (default 4); ``None`` shows them all
        (PopTorch stores ``2**64 - 1``)."""
        return self.set(max_repeat_logs=(1 << 64) - 1 if n is None else int(n))

    def modelName(self, name: str):  # noqa: N802
        return self.set(model_name=str(name))

    def enableProfiling(self, profile_dir: str | None = None):  # noqa: N802
        return self.set(profile_dir=str(profile_dir or "."))

    def disableModuleNamescope(self):  # noqa: N802
        return self.set(disable_module_namescope=True)

    def updatableNamedBuffers(self, buffers: list):  # noqa: N802
        """Buffers (module paths) that ``PoplarExecutor.copyNamedBuffersToDevice()`` sends to the
        device on their own (PopTorch keeps the list in the PopART option of that name)."""
        self._Popart.set("updatableNamedBuffers", list(buffers))
        return self.set(updatable_named_buffers=list(buffers))

    def relaxOptimizerAttributesChecks(self, relaxed: bool = True):  # noqa: N802
        return self.set(relax_optimizer_attributes_checks=bool(relaxed))

    def showCompilationProgressBar(self, show: bool = True):  # noqa: N802
        return self.set(show_compilation_progress_bar=bool(show))

    def loadFromFile(self, filepath: str):  # noqa: N802
        """Apply the options in ``filepath``, PopTorch's format: one setter call per line, as it
        would be written in Python without the ``options.`` prefix (``deviceIterations(32)``,
        ``Training.gradientAccumulation(4)``, ``setExecutionStrategy(poptorch.ShardedExecution())``,
        ``_Popart.set("key", 1)``); ``#`` starts a comment line. May be called several times:
        later values win. Raises :class:`ConfigFileError` ("SyntaxError at line N of FILE: ...")
        for a line that is not Python.

        The file is read as data, not run: each line must be a call chain on the options whose
        arguments are literals, ``poptorch.*`` / ``torch.*`` names (enums, dtypes) or calls of
        public ``poptorch`` classes (``ShardedExecution``, ``Stage`` ...); anything else raises
        :class:`ConfigFileError` (PopTorch ``exec``-utes the lines)."""
        _load_config(self, filepath)
        return self

    # -- whole-object ----------------------------------------------------------------------
    def clone(self) -> "Options":
        """An unfrozen deep copy."""
        out = copy.deepcopy(self)
        for o in (out, out.Precision, out.Training, out.Jit, out.TensorLocations, out.Distributed):
            object.__setattr__(o, "_frozen", False)
        return out

    def toDict(self) -> dict:  # noqa: N802
        if self.output_mode == OutputMode.Default:
            raise AssertionError("An output mode must be picked: call outputMode() or wrap the model first")
        out = dict(self._values)
        out.update({f"Precision.{k}": v for k, v in self.Precision.toDict().items()})
        out.update({f"Training.{k}": v for k, v in self.Training.toDict().items()})
        out.update({f"_Popart.{k}": v for k, v in self._Popart.options.items()})
        return out

    # -- to PopART (openipu) ---------------------------------------------------------------
    def session_options(self, training: bool, num_ipus: int, pipelined: bool) -> "popart.SessionOptions":
        """The PopART ``SessionOptions`` these options compile to: ``batchesPerStep`` is the
        DataFlow's, so not here; gradient accumulation and its reduction (training only),
        replication, virtual graphs and pipelining, partials, stochastic rounding, the raw
        ``_Popart`` keys last."""
        o = popart.SessionOptions()
        af = self.Training.gradient_accumulation if training else 1
        if af > 1:
            o.enableGradientAccumulation, o.accumulationFactor = True, af
        if self.replication_factor > 1:
            o.enableReplicatedGraphs, o.replicatedGraphCount = True, self.replication_factor
        procs = self.Distributed.numProcesses
        if procs > 1:       # PopDist: this process's replicas are a block of the global replicas
            o.enableDistributedReplicatedGraphs = True
            o.globalReplicationFactor = self.replication_factor * procs
            o.globalReplicaOffset = self.replication_factor * self.Distributed.processId
        if training:
            o.accumulationAndReplicationReductionType = self.Training.accumulation_and_replication_reduction_type
            o.meanAccumulationAndReplicationReductionStrategy = \
                self.Training.mean_accumulation_and_replication_reduction_strategy
            o.automaticLossScalingSettings.enabled = self.Training.automatic_loss_scaling
        if num_ipus > 1:
            o.virtualGraphMode = popart.VirtualGraphMode.Manual
            o.enablePipelining = pipelined
        if self.Precision.partials_type:
            o.partialsTypeMatMuls = self.Precision.partials_type
            o.convolutionOptions = {**o.convolutionOptions, "partialsType": self.Precision.partials_type}
        o.enableStochasticRounding = self.Precision.stochastic_rounding
        o.enableFloatingPointChecks = self.Precision.fp_exceptions
        o.enableStableNorm = self.enable_stable_norm
        o.numIOTiles = self.TensorLocations.num_io_tiles
        for kind, settings in self.TensorLocations.locations.items():
            settings.to_popart(getattr(o, _TensorLocationOptions.KINDS[kind]))
        if self.log_cycle_count:
            o.instrumentWithHardwareCycleCounter = True
        if self.profile_dir:       # enableProfiling: the engine writes profile.pop there (read it with pva)
            o.engineOptions = {**dict(o.engineOptions or {}), "autoReport.all": "true",
                               "autoReport.directory": self.profile_dir}
        for k, v in self._Popart.options.items():
            if k in POPTORCH_ONLY_POPART_KEYS:     # PopTorch's own keys, not SessionOptions fields
                continue
            try:
                popart.set_session_option(o, k, v)
            except AttributeError:
                raise Error(f"Unknown PopART option '{k}' given to Options._Popart.set") from None
        if self.executable_cache_dir:      # PopART's engine cache, in openipu's safe executable format
            o.enableEngineCaching = True
            o.cachePath = self.executable_cache_dir
        return o

    def ipu_version(self) -> str:
        """The simulated target: ``ipu2`` unless ``useOfflineIpuTarget(21)`` or
        ``POPTORCH_IPU_MODEL_VERSION`` say otherwise."""
        v = self.offline_ipu_version or os.environ.get("POPTORCH_IPU_MODEL_VERSION", "2")
        v = str(v).replace("ipu", "")
        return {"1": "ipu1", "2": "ipu2", "21": "ipu21"}.get(v, "ipu2")
