"""``poplar::Target``, ``IPUModel``, ``Device`` and ``DeviceManager`` over :mod:`openipu.ipu`.

``poplar.Target`` wraps the frozen :class:`openipu.ipu.Target` with Poplar's getter names.
Devices are simulated: an IPU Model device (``IPUModel().createDevice()``), simulated
"hardware" IPUs from ``DeviceManager.getDevices()`` (same simulation, target type ``IPU``),
an offline compile-only target, and the CPU device (one tile, no cost model).
"""

from __future__ import annotations

import dataclasses

from openipu import ipu
from openipu.poplar import errors
from openipu.poplar.types import as_type


class TargetType:
    IPU = "IPU"
    IPU_MODEL = "IPU_MODEL"
    CPU = "CPU"


class Target:
    """The hardware a graph is compiled for (``poplar::Target``). Units: bytes, Hz, cycles."""

    def __init__(self, spec: ipu.Target):
        self.spec = spec

    def __eq__(self, other):
        return isinstance(other, Target) and self.spec == other.spec

    def __hash__(self):
        return hash(self.spec)

    def __repr__(self):
        s = self.spec
        return f"Target({s.target_type} {s.version} x{s.num_ipus}, {s.tiles_per_ipu} tiles/IPU)"

    # Poplar getters
    def getNumIPUs(self) -> int: return self.spec.num_ipus  # noqa: E704,N802
    def getTilesPerIPU(self) -> int: return self.spec.tiles_per_ipu  # noqa: E704,N802
    def getNumTiles(self) -> int: return self.spec.num_tiles  # noqa: E704,N802
    def getBytesPerTile(self) -> int: return self.spec.bytes_per_tile  # noqa: E704,N802
    def getMemoryBytes(self) -> int: return self.spec.bytes_per_tile * self.spec.num_tiles  # noqa: E704,N802
    def getTileClockFrequency(self) -> float: return self.spec.clock_hz  # noqa: E704,N802
    def getNumWorkerContexts(self) -> int: return self.spec.num_worker_contexts  # noqa: E704,N802
    def getExchangeBytesPerCycle(self) -> int: return self.spec.exchange_bytes_per_cycle  # noqa: E704,N802
    def getMemcpyBytesPerCycle(self) -> int: return self.spec.memcpy_bytes_per_cycle  # noqa: E704,N802
    def getDataPathWidth(self) -> int: return self.spec.data_path_width_bits  # noqa: E704,N802
    def getGlobalSyncCycles(self) -> int: return self.spec.global_sync_cycles  # noqa: E704,N802
    def getMinIPUSyncDelay(self) -> int: return self.spec.min_ipu_sync_delay  # noqa: E704,N802
    def getTilesPerSharedExchangeBus(self) -> int: return self.spec.tiles_per_shared_exchange_bus  # noqa: E704,N802
    def supportsExchangeBusSharing(self) -> bool: return True  # noqa: E704,N802
    def getTargetArchString(self) -> str: return self.spec.arch  # noqa: E704,N802
    def getTargetType(self) -> str: return self.spec.target_type  # noqa: E704,N802
    def getTypeSize(self, t) -> int: return as_type(t).size  # noqa: E704,N802
    def getFloatVectorWidth(self) -> int: return self.spec.vector_width(4)  # noqa: E704,N802
    def getHalfVectorWidth(self) -> int: return self.spec.vector_width(2)  # noqa: E704,N802
    def getAtomicStoreGranularity(self) -> int: return 4  # noqa: E704,N802
    def getInstructionBytes(self) -> int: return self.spec.instruction_bytes  # noqa: E704,N802

    def getVectorWidth(self, t) -> int:  # noqa: N802
        """Elements of type ``t`` in one 64-bit data-path vector (float 2, half 4)."""
        return self.spec.vector_width(as_type(t).size)

    def getAmpMacsPerCycle(self, in_type, partials_type=None) -> int:  # noqa: N802
        """AMP MACs per cycle per tile for ``in_type`` inputs and ``partials_type`` accumulation."""
        t = as_type(in_type).name
        if t == "half":
            return self.spec.amp_macs["half_fp32_partials" if partials_type is not None and as_type(partials_type).name == "float" else "half"]
        return self.spec.amp_macs.get(t, self.spec.amp_macs["float"])

    # openipu helpers
    def replica_target(self, replication_factor: int) -> "Target":
        s = self.spec
        return Target(dataclasses.replace(s, num_ipus=max(1, s.num_ipus // replication_factor)))

    def virtual(self, num_tiles: int) -> "Target":
        s = self.spec
        if num_tiles == s.num_tiles:
            return self
        ipus = max(1, min(s.num_ipus, -(-num_tiles // s.tiles_per_ipu)))
        return Target(dataclasses.replace(s, num_ipus=ipus, tiles_per_ipu=num_tiles // ipus))

    @staticmethod
    def createIPUTarget(num_ipus: int, arch: str = "ipu2", options=None, tiles_per_ipu: int | None = None) -> "Target":  # noqa: N802
        if isinstance(arch, int):   # createIPUTarget(numIPUs, tilesPerIPU, arch)
            arch, tiles_per_ipu = (options or "ipu2"), arch
        version = _version_of(arch)
        over = {"target_type": TargetType.IPU, "is_ipu_model": False}
        if tiles_per_ipu:
            over["tiles_per_ipu"] = int(tiles_per_ipu)
        return Target(ipu.target(version, num_ipus, **over))

    @staticmethod
    def createCPUTarget(accurate_half: bool = False, num_ipus: int = 1) -> "Target":  # noqa: N802
        return Target(ipu.target("ipu2", num_ipus, tiles_per_ipu=1, target_type=TargetType.CPU, is_ipu_model=False))


def _version_of(name: str) -> str:
    n = str(name).lower()
    if n in ("ipu1", "ipu2", "ipu21", "bow"):
        return n
    if n in ("mk1", "gc2"):
        return "ipu1"
    if n in ("mk2", "gc200", "m2000"):
        return "ipu2"
    if n in ("c600",):
        return "ipu21"
    raise errors.invalid_option(f"Unknown IPU version '{name}': use ipu1, ipu2, ipu21 or bow")


class Device:
    """A (simulated) device: ``getTarget``, ``attach``/``detach``, ``getId``."""

    def __init__(self, target: Target, device_id: int = 0, options=None, ipus=None):
        self._target = target
        self._id = device_id
        self._attached = target.getTargetType() != TargetType.IPU
        self.options = dict(options or {})
        #: the system IPUs this device holds while attached (:mod:`openipu.poplar.device_locks`;
        #: ``None``: an unbounded system, never busy)
        self._lock = None
        if ipus is not None:
            from openipu.poplar.device_locks import IpuLock
            self._lock = IpuLock(ipus)

    def getTarget(self) -> Target:  # noqa: N802
        return self._target

    def getId(self) -> int:  # noqa: N802
        return self._id

    def attach(self) -> bool:
        """Attach to the device: ``False`` when one of its IPUs is attached by another process or
        device (a system of fixed size, ``OPENIPU_NUM_IPUS``), as Poplar's ``Device::attach``."""
        if self._attached and self._target.getTargetType() == TargetType.IPU and \
                (self._lock is None or self._lock.held):
            return True
        if self._lock is not None and not self._lock.acquire():
            return False
        self._attached = True
        if self._target.getTargetType() == TargetType.IPU:
            from openipu.poplar import runtime_state
            runtime_state.device_attached(str(id(self)), self._id, self._target.spec)
        return True

    def detach(self) -> None:
        self._attached = False
        if self._lock is not None:
            self._lock.release()
        from openipu.poplar import runtime_state
        runtime_state.device_detached(str(id(self)))

    def isAttached(self) -> bool:  # noqa: N802
        return self._attached

    def reset(self) -> None:
        pass

    def supportsRemoteBuffers(self) -> bool:  # noqa: N802
        return True

    def createVirtualDevice(self, tiles_per_ipu: int) -> "Device":  # noqa: N802
        s = self._target.spec
        return Device(Target(dataclasses.replace(s, tiles_per_ipu=int(tiles_per_ipu))), self._id)

    @staticmethod
    def createCPUDevice(num_ipus: int = 1) -> "Device":  # noqa: N802
        return Device(Target.createCPUTarget(num_ipus=num_ipus))

    @staticmethod
    def createSimulatorDevice(target: Target, options=None) -> "Device":  # noqa: N802
        return Device(target, options=options)

    def __repr__(self):
        return f"Device({self._id}, {self._target!r})"


class IPUModel:
    """``poplar::IPUModel``: a device that runs on the host and models IPU performance.

    Public fields (Poplar's names) may be changed before ``createDevice()``. Defaults come
    from :mod:`openipu.ipu` (``ipu1``: 1216 tiles, 256 KiB, 1.6 GHz; ``ipu2``: 1472 tiles,
    624 KiB, 1.33 GHz; 6 workers and 4 exchange bytes per cycle for both).
    """

    class RelativeSyncDelayType:
        AUTO = "AUTO"
        NO_DELAY = "NO_DELAY"

    def __init__(self, IPUVersion: str = "ipu2"):  # noqa: N803
        version = _version_of(IPUVersion)
        t = ipu.target(version)
        self.IPUVersion = version
        self.numIPUs = 1
        self.tilesPerIPU = t.tiles_per_ipu
        self.tilesPerSuperTile = 4
        self.numWorkerContexts = t.num_worker_contexts
        self.memoryBytesPerTile = t.bytes_per_tile
        self.tileClockFrequency = t.clock_hz
        self.exchangeBytesPerCycle = t.exchange_bytes_per_cycle
        self.memcpyBytesPerCycle = t.memcpy_bytes_per_cycle
        self.instructionBytes = t.instruction_bytes
        self.supportsSuperTileSendReceive = True
        self.interleavedMemoryElementIndex = 0
        self.minIPUSyncDelay = t.min_ipu_sync_delay
        self.globalSyncCycles = t.global_sync_cycles
        self.relativeSyncDelay = IPUModel.RelativeSyncDelayType.AUTO
        self.compileIPUCode = False
        self.globalExchangeConstraints = []

    def target_spec(self) -> ipu.Target:
        return ipu.target(
            self.IPUVersion, int(self.numIPUs), tiles_per_ipu=int(self.tilesPerIPU),
            num_worker_contexts=int(self.numWorkerContexts), bytes_per_tile=int(self.memoryBytesPerTile),
            clock_hz=float(self.tileClockFrequency), exchange_bytes_per_cycle=int(self.exchangeBytesPerCycle),
            memcpy_bytes_per_cycle=int(self.memcpyBytesPerCycle), instruction_bytes=int(self.instructionBytes),
            min_ipu_sync_delay=int(self.minIPUSyncDelay), global_sync_cycles=int(self.globalSyncCycles),
            relative_sync_delay=self.relativeSyncDelay != IPUModel.RelativeSyncDelayType.NO_DELAY,
            compile_ipu_code=bool(self.compileIPUCode), target_type=TargetType.IPU_MODEL, is_ipu_model=True)

    def createDevice(self, options=None, accurate_half: bool = False, device_manager_id: int = 0) -> Device:  # noqa: N802
        """A simulated device with this model's parameters. Raises ``invalid_option`` for bad values."""
        for name in ("numIPUs", "tilesPerIPU", "memoryBytesPerTile", "numWorkerContexts", "exchangeBytesPerCycle"):
            if int(getattr(self, name)) < 1:
                raise errors.invalid_option(f"IPUModel.{name} must be at least 1, got {getattr(self, name)}")
        return Device(Target(self.target_spec()), device_manager_id, options)


class DeviceManager:
    """``poplar::DeviceManager``: lists simulated IPUs. Unbounded (every request is served, never
    busy) unless ``OPENIPU_NUM_IPUS`` fixes the system's size: then the devices are gc-info's and
    an IPU attached by one process is busy for the others (:mod:`openipu.poplar.device_locks`)."""

    MAX_IPUS = 256

    @staticmethod
    def createDeviceManager() -> "DeviceManager":  # noqa: N802
        return DeviceManager()

    def getNumDevices(self) -> int:  # noqa: N802
        from openipu.poplar.device_locks import devices, system_ipus
        n = system_ipus()
        return 1 if n is None else len(devices(n))

    def getDevices(self, target_type: str = TargetType.IPU, num_ipus: int = 1, options=None) -> list[Device]:  # noqa: N802
        from openipu.poplar.device_locks import device_ids, devices, system_ipus
        if num_ipus < 1 or num_ipus > self.MAX_IPUS or (num_ipus & (num_ipus - 1)):
            return []
        version = _version_of((options or {}).get("ipuVersion", "ipu2")) if isinstance(options, dict) else "ipu2"
        spec = ipu.target(version, num_ipus, target_type=TargetType.IPU, is_ipu_model=False)
        n = system_ipus()
        if n is None:
            return [Device(Target(spec), 0, options)]
        return [Device(Target(spec), i, options, ipus=devices(n)[i]) for i in device_ids(n, num_ipus)]

    def getDevice(self, device_id: int, options=None) -> Device:  # noqa: N802
        from openipu.poplar.device_locks import devices, system_ipus
        n = system_ipus()
        if n is None:
            return Device(Target(ipu.target("ipu2", 1, target_type=TargetType.IPU, is_ipu_model=False)), device_id, options)
        all_ = devices(n)
        if not 0 <= int(device_id) < len(all_):
            raise errors.poplar_error(f"Device id {device_id} is not valid: this system has devices 0 to {len(all_) - 1}")
        ipus = all_[int(device_id)]
        spec = ipu.target("ipu2", len(ipus), target_type=TargetType.IPU, is_ipu_model=False)
        return Device(Target(spec), int(device_id), options, ipus=ipus)


def createOfflineTarget(version: str = "ipu2", num_ipus: int = 1, tiles_per_ipu: int | None = None) -> Target:  # noqa: N802
    """A compile-only target (no device attached): graphs compile and report, engines cannot run."""
    over = {"target_type": TargetType.IPU, "is_ipu_model": False}
    if tiles_per_ipu:
        over["tiles_per_ipu"] = tiles_per_ipu
    return Target(ipu.target(_version_of(version), num_ipus, **over))


def _register_records():
    from openipu.poplar.graph_codec import data_class
    data_class(Target, fields=("spec",), types={"spec": ipu.Target})
    data_class(ipu.Target)


_register_records()
