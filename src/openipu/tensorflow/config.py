"""``ipu.config``: :class:`IPUConfig`, its enums and ``configure_ipu_system`` (Graphcore TF2 API).

``IPUConfig`` is a tree of categories whose leaves are typed options with Graphcore's defaults;
setting an option checks its type (``TypeError``), an unknown name raises ``ValueError`` with a
difflib suggestion, assigning to a category raises ``Exception``. Nothing happens until
``configure_ipu_system(cfg)``, which validates the combination (Graphcore's error texts) and
records the IPUs: ``auto_select_ipus = n`` (int, or a list: one TF device ``/device:IPU:i`` per
entry) gives a simulated device of ``n`` IPUs (the architecture from ``ipu_model.version``,
``device_connection.version`` or the default target).
"""

import difflib
import enum
import json
import logging

logger = logging.getLogger("tensorflow.python.ipu")


class SelectionOrder(enum.Enum):
    AUTO = 0
    ZIGZAG = 1
    SNAKE = 2
    HOOF = 3


class DeviceConnectionType(enum.Enum):
    ALWAYS = 0
    ON_DEMAND = 1
    PRE_COMPILE = 2
    NEVER = 3


class StochasticRoundingBehaviour(enum.Enum):
    OFF = 0
    ON = 1
    REPLICA_IDENTICAL_ONLY = 2

    @classmethod
    def from_bool(cls, value: bool) -> "StochasticRoundingBehaviour":
        return cls.ON if value else cls.OFF


class MergeRemoteBuffersBehaviour(enum.Enum):
    NO_MERGING = 0
    MERGE = 1
    IF_BENEFICIAL = 2


class SchedulingAlgorithm(enum.Enum):
    CHOOSE_BEST = 0
    CLUSTERING = 1
    POST_ORDER = 2
    LOOK_AHEAD = 3
    SHORTEST_PATH = 4


class ExecutionProfileType(enum.Enum):
    NO_PROFILE = 0
    DEVICE_PROFILE = 1
    IPU_PROFILE = 2
    TILE_PROFILE = 3


_INT_OR_LIST = (int, list, tuple)

# dotted name -> (default, accepted type(s), deprecation message or None)
_SCHEMA = {
    "auto_select_ipus": ([], _INT_OR_LIST, None),
    "select_ipus": ([], _INT_OR_LIST, None),
    "allow_recompute": (False, bool, None),
    "selection_order": (SelectionOrder.AUTO, SelectionOrder, None),
    "serialization_output_folder": ("", str, None),
    "compilation_poplar_options": ({}, dict, None),
    "gcl_poplar_options": ({}, dict, None),
    "convolutions.poplar_options": ({}, dict, None),
    "matmuls.poplar_options": ({}, dict, None),
    "matmuls.clear_pass_type": (False, bool, None),
    "slices.poplar_options": ({}, dict, None),
    "pooling.poplar_options": ({}, dict, None),
    "device_connection.type": (DeviceConnectionType.ALWAYS, DeviceConnectionType, None),
    "device_connection.version": ("", str, None),
    "device_connection.enable_remote_buffers": (False, bool, None),
    "ipu_model.compile_ipu_code": (True, bool, None),
    "ipu_model.tiles_per_ipu": (0, int, None),
    "ipu_model.version": ("ipu2", str, None),
    "floating_point_behaviour.inv": (False, bool, None),
    "floating_point_behaviour.div0": (False, bool, None),
    "floating_point_behaviour.oflo": (False, bool, None),
    "floating_point_behaviour.nanoo": (False, bool, None),
    "floating_point_behaviour.set_all": (False, bool, None),
    "floating_point_behaviour.esr": (StochasticRoundingBehaviour.OFF, StochasticRoundingBehaviour, None),
    "io_tiles.num_io_tiles": (0, int, None),
    "io_tiles.place_ops_on_io_tiles": (False, bool, None),
    "io_tiles.available_memory_proportion": (0.9, float, None),
    "norms.use_stable_statistics": (False, bool, None),
    "norms.experimental.distributed_batch_norm_replica_group_size": (1, int, None),
    "optimizations.math.fast": (False, bool, None),
    "optimizations.math.dot_strength": (True, bool, None),
    "optimizations.prefetch_data_streams": (True, bool, None),
    "optimizations.combine_embedding_lookups": (False, bool, None),
    "optimizations.combine_matmuls": (False, bool, None),
    "optimizations.enable_graph_outlining": (True, bool, None),
    "optimizations.merge_infeed_io_copies": (True, bool, None),
    "optimizations.enable_gather_simplifier": (True, bool, None),
    "optimizations.enable_dynamic_slice_replacement": (True, bool, None),
    "optimizations.enable_fast_math": (False, bool, "Use optimizations.math.fast instead."),
    "optimizations.maximum_cross_replica_sum_buffer_size": (0, int, None),
    "optimizations.maximum_reduce_scatter_buffer_size": (0, int, None),
    "optimizations.maximum_inter_ipu_copies_buffer_size": (0, int, None),
    "optimizations.maximum_reduce_many_buffer_size": (0, int, None),
    "optimizations.maximum_all_gather_buffer_size": (0, int, None),
    "optimizations.maximum_send_recv_cluster_size": (0, int, None),
    "optimizations.triangular_solve_expander_block_size": (0, int, None),
    "optimizations.cholesky_block_size": (0, int, None),
    "optimizations.minimum_remote_tensor_size": (128, int, None),
    "optimizations.merge_remote_buffers": (MergeRemoteBuffersBehaviour.IF_BENEFICIAL, MergeRemoteBuffersBehaviour,
                                           None),
    "scheduling.algorithm": (SchedulingAlgorithm.CHOOSE_BEST, SchedulingAlgorithm, None),
    "scheduling.maximum_scheduler_lookahead_depth": (5, int, None),
    "scheduling.maximum_scheduler_search_space_size": (64, int, None),
    "experimental.always_rearrange_copies_on_the_host": (False, bool, None),
    "experimental.enable_remote_buffer_embedding": (False, bool, None),
    "experimental.enable_prng_stability": (False, bool, None),
    "experimental.multi_replica_distribution.process_index": (0, int, None),
    "experimental.multi_replica_distribution.process_count": (0, int, None),
}


class AttributeMetadata:
    """Metadata of one option: ``name`` (dotted), ``default``, ``type``, ``deprecated`` (the
    message or ``None``); ``check_type(value)`` raises Graphcore's ``TypeError``."""

    def __init__(self, name, default, types, deprecated=None):
        self.name, self.default, self._types, self.deprecated = name, default, types, deprecated
        self.type = types if isinstance(types, type) else types[0]

    def check_type(self, value):
        ok = isinstance(value, self._types) and not (isinstance(value, bool) and self._types in (int, float))
        if self._types is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            tname = self.type.__name__ if isinstance(self._types, type) else \
                " or ".join(t.__name__ for t in self._types)
            raise TypeError(f"Trying to set {self.name} to {value!r}, but it must be of type {tname}")

    def warn_if_deprecated(self):
        if self.deprecated:
            logger.warning("%s has been deprecated: %s", self.name, self.deprecated)


_METADATA = {k: AttributeMetadata(k, *v) for k, v in _SCHEMA.items()}


def _copy_default(v):
    return type(v)(v) if isinstance(v, (list, dict)) else v


class _Category:
    """A node of the config tree: ``cfg.matmuls``, ``cfg.optimizations.math`` ..."""

    def __init__(self, prefix: str):
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_children", {})
        for name in _SCHEMA:
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            if "." in rest:
                child = rest.split(".")[0]
                if child not in self._children:
                    self._children[child] = _Category(f"{prefix}{child}.")
            else:
                self._values[rest] = _copy_default(_SCHEMA[name][0])

    def _names(self):
        return list(self._values) + list(self._children)

    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        if k in self._values:
            return self._values[k]
        if k in self._children:
            return self._children[k]
        self._unknown(k)

    def _unknown(self, k):
        close = difflib.get_close_matches(k, self._names(), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"'{k}' is not a valid attribute of this config.{hint}")

    def __setattr__(self, k, v):
        if k in self._children:
            raise Exception(f"{self._prefix}{k} is a category and cannot be assigned to.")
        if k not in self._values:
            self._unknown(k)
        meta = _METADATA[self._prefix + k]
        meta.check_type(v)
        meta.warn_if_deprecated()
        if meta.type is float:
            v = float(v)
        self._values[k] = v

    def __dir__(self):
        return self._names()

    def _items(self):
        for k, v in self._values.items():
            yield self._prefix + k, v
        for c in self._children.values():
            yield from c._items()


class IPUConfig(_Category):
    """``ipu.config.IPUConfig()``: the IPU system configuration (Graphcore TF2 API).

    Options keep Graphcore's names and defaults (``auto_select_ipus``, ``device_connection.type``,
    ``matmuls.poplar_options``, ``floating_point_behaviour.esr`` ...). ``to_dict()`` gives dotted
    names with enums as ints; ``from_dict``/``to_json``/``from_json`` round-trip;
    ``get_attribute_metadata("a.b")`` returns an :class:`AttributeMetadata`.
    ``configure_ipu_system(device="cpu")`` applies it.
    """

    def __init__(self):
        super().__init__("")

    def get_attribute_metadata(self, name: str) -> AttributeMetadata:
        if name not in _METADATA:
            close = difflib.get_close_matches(name, list(_METADATA), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"'{name}' is not a valid attribute of this config.{hint}")
        return _METADATA[name]

    def to_dict(self) -> dict:
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in self._items()}

    def from_dict(self, dct: dict, _warn: bool = True) -> None:
        for name, v in dct.items():
            if not _warn and v == _METADATA[name].default:
                continue
            meta = self.get_attribute_metadata(name)
            if isinstance(meta.default, enum.Enum) and isinstance(v, int):
                v = type(meta.default)(v)
            node = self
            *cats, leaf = name.split(".")
            for c in cats:
                node = getattr(node, c)
            setattr(node, leaf, v)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def from_json(self, json_cfg: str) -> None:
        self.from_dict(json.loads(json_cfg))

    def __str__(self):
        return "\n".join(f"{k} = {v}" for k, v in self._items())

    def configure_ipu_system(self, device: str = "cpu") -> None:
        configure_ipu_system(self, device)


def _num_ipus(sel) -> int:
    if isinstance(sel, int):
        return sel
    return sum(int(s) for s in sel) if sel else 0


class _System:
    """The configured IPU system (the process-wide state ``configure_ipu_system`` sets)."""

    def __init__(self, config: IPUConfig):
        self.config = config
        auto = config.auto_select_ipus
        self.device_sizes = [auto] if isinstance(auto, int) else list(auto)
        if not self.device_sizes and config.select_ipus != []:
            sel = config.select_ipus
            self.device_sizes = [1] * (1 if isinstance(sel, int) else len(sel))

    @property
    def num_ipus(self) -> int:
        return int(self.device_sizes[0]) if self.device_sizes else 0

    def device_version(self) -> str:
        c = self.config
        return c.device_connection.version or c.ipu_model.version or "ipu2"


_SYSTEM = None


def _running_on_ipu_model() -> bool:
    import os
    return "--use_ipu_model" in os.environ.get("TF_POPLAR_FLAGS", "")


def _validate(config: IPUConfig) -> None:
    auto, sel = config.auto_select_ipus, config.select_ipus
    if auto not in ([], ()) and sel not in ([], ()):
        raise Exception("Only one of `auto_select_ipus` and `select_ipus` can be set.")
    if isinstance(sel, (list, tuple)) and len(set(sel)) != len(sel):
        raise ValueError("All MultiIPU indices in `select_ipus` must be unique.")
    model = _running_on_ipu_model()
    if model and sel not in ([], ()):
        raise Exception("When using the IPUModel, the devices to attach to can only be specified with "
                        "`auto_select_ipus`.")
    dc = config.device_connection
    if dc.type in (DeviceConnectionType.NEVER, DeviceConnectionType.PRE_COMPILE) and not dc.version:
        raise ValueError("device_connection.version must be set when device_connection.type is "
                         "DeviceConnectionType.NEVER or DeviceConnectionType.PRE_COMPILE")
    if model and not config.ipu_model.version:
        raise ValueError("ipu_model.version must be set when using the IPUModel.")
    io = config.io_tiles
    if io.place_ops_on_io_tiles and io.num_io_tiles == 0:
        raise ValueError("Cannot place ops on I/O tiles when io_tiles.num_io_tiles == 0")
    if io.num_io_tiles and config.norms.experimental.distributed_batch_norm_replica_group_size > 1:
        raise ValueError("norms.experimental.distributed_batch_norm_replica_group_size is not supported with I/O "
                         "tiles.")
    if model and config.experimental.multi_replica_distribution.process_count > 0:
        raise Exception("Multi-replica distribution is not supported on the IPU model.")
    for name, v in config._items():
        if name.endswith("poplar_options"):
            for k, val in v.items():
                if not isinstance(val, str):
                    raise TypeError(f"{name}: the value of option '{k}' must be a str, not {type(val).__name__}")


def configure_ipu_system(config, device: str = "cpu", reset_configuration: bool = True) -> None:
    """Apply ``config`` (an :class:`IPUConfig`) to the process: the IPUs that ``IPUStrategy``
    and Keras use. Raises ``TypeError("`config` must be an IpuOptions instance.")`` for another
    type and Graphcore's errors for invalid combinations (see :func:`_validate`)."""
    global _SYSTEM
    if not isinstance(config, IPUConfig):
        raise TypeError("`config` must be an IpuOptions instance.")
    _validate(config)
    if _SYSTEM is not None and _SYSTEM.config.to_dict() != config.to_dict():
        logger.info("Resetting existing IPU configuration before applying new configuration")
    copy = IPUConfig()
    copy.from_dict(config.to_dict(), _warn=False)
    _SYSTEM = _System(copy)


def reset_ipu_configuration() -> None:
    """Forget the configured system (``get_ipu_config`` then raises)."""
    global _SYSTEM
    _SYSTEM = None


def get_ipu_config(session=None) -> list:
    """The configured system's :class:`IPUConfig` in a list; ``RuntimeError("No IPU devices
    configured.")`` before ``configure_ipu_system``."""
    if _SYSTEM is None:
        raise RuntimeError("No IPU devices configured.")
    return [_SYSTEM.config]


def _system():
    return _SYSTEM
