"""``popart.DeviceManager`` and ``popart.DeviceInfo`` over simulated devices.

Every device is simulated by :mod:`openipu.poplar`. ``acquireAvailableDevice`` /
``tryAcquireAvailableDevice`` return simulated Mk2 (``ipu2``) IPUs of type ``DeviceType.Ipu``
(1472 tiles per IPU unless ``tilesPerIpu`` is given); ``createIpuModelDevice`` an IPU Model
(PopART's default of 4 tiles per IPU); ``createCpuDevice`` a one-tile CPU target;
``createOfflineIPUDevice`` a compile-only target (``run`` raises).
"""

from __future__ import annotations

from openipu import ipu, poplar
from openipu.poplar.device import Target, TargetType
from openipu.popart.errors import popart_exception
from openipu.popart.options import _enum

DeviceType = _enum("DeviceType", ["IpuModel", "Cpu", "Ipu", "OfflineIpu", "Sim"])
DeviceConnectionType = _enum("DeviceConnectionType", ["Always", "OnDemand", "Never"])
DeviceSelectionCriterion = _enum("DeviceSelectionCriterion", ["First", "Random"])

#: PopART's ``defaultFewTiles`` for IPU Model devices (``defaulttilecount.hpp``).
DEFAULT_IPU_MODEL_TILES = 4
_VERSIONS = ("ipu1", "ipu2", "ipu21", "bow")


class DeviceInfo:
    """A (simulated) device from :class:`DeviceManager`: PopART's ``DeviceInfo`` fields and
    ``attach``/``detach``; usable as a context manager (``__exit__`` detaches).
    ``device`` is the :class:`openipu.poplar.Device` sessions compile for (openipu extension)."""

    def __init__(self, device: poplar.Device, dtype: str, dev_id: int = 0,
                 connection=DeviceConnectionType.Always, options=None):
        self.device = device
        self._type = dtype
        self._id = dev_id
        self._connection = connection
        self._attached = dtype != DeviceType.Ipu or connection == DeviceConnectionType.Always
        self._options = dict(options or {})
        if dtype == DeviceType.Ipu and self._attached:
            self._register()

    def _register(self):
        from openipu.poplar import runtime_state
        runtime_state.device_attached(str(id(self)), self._id, self.device.getTarget().spec)

    # PopART properties
    @property
    def type(self):
        return self._type

    @property
    def connectionType(self):  # noqa: N802
        return self._connection

    @property
    def version(self) -> str:
        return self.device.getTarget().getTargetArchString()

    ipuVersion = version

    @property
    def id(self) -> int:
        return self._id

    @property
    def numIpus(self) -> int:  # noqa: N802
        return self.device.getTarget().getNumIPUs()

    @property
    def tilesPerIPU(self) -> int:  # noqa: N802
        return self.device.getTarget().getTilesPerIPU()

    tilesPerIpu = tilesPerIPU

    @property
    def driverIds(self) -> list[int]:  # noqa: N802
        return list(range(self._id, self._id + self.numIpus)) if self._type == DeviceType.Ipu else []

    @property
    def isAttached(self) -> bool:  # noqa: N802
        return self._attached

    @property
    def numWorkerContexts(self) -> int:  # noqa: N802
        return self.device.getTarget().getNumWorkerContexts()

    def attach(self) -> bool:
        self._attached = True
        if self._type == DeviceType.Ipu:
            self._register()
        return True

    def tryAttachUntilTimeout(self) -> bool:  # noqa: N802
        return self.attach()

    def detach(self) -> None:
        self._attached = False
        from openipu.poplar import runtime_state
        runtime_state.device_detached(str(id(self)))

    def getTarget(self):  # noqa: N802
        return self.device.getTarget()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()
        return False

    def __repr__(self):
        return (f"Device Type:{self._type} Connection Type:{self._connection} Id:{self._id} "
                f"Version:{self.version} NumIPUs:{self.numIpus} NumTilesPerIPU:{self.tilesPerIPU}")

    __str__ = __repr__


def _check_keys(opts: dict, allowed, what: str):
    for k in opts:
        if k not in allowed:
            raise popart_exception(f"Invalid option `{k}' passed to DevicexManager::createHostDevice for device type "
                                   f"{what}. Allowed options are {', '.join(allowed)}")


def _version(v) -> str:
    v = str(v).lower()
    if v not in _VERSIONS:
        raise popart_exception(f"Unknown ipuVersion '{v}': use one of {', '.join(_VERSIONS)}")
    return v


class DeviceManager:
    """``popart.DeviceManager()`` (a singleton, as in PopART)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
            cls._instance._timeout = 0
            cls._instance._next_id = 0
        return cls._instance

    def createCpuDevice(self) -> DeviceInfo:  # noqa: N802
        return DeviceInfo(poplar.Device.createCPUDevice(), DeviceType.Cpu)

    def createIpuModelDevice(self, opts: dict | None = None) -> DeviceInfo:  # noqa: N802
        """``{"numIPUs": 1, "tilesPerIPU": 4, "compileIPUCode": True, "ipuVersion": "ipu2"}``."""
        opts = dict(opts or {})
        _check_keys(opts, ("numIPUs", "tilesPerIPU", "compileIPUCode", "ipuVersion"), "IpuModel")
        m = poplar.IPUModel(_version(opts.get("ipuVersion", "ipu2")))
        m.numIPUs = int(opts.get("numIPUs", 1))
        m.tilesPerIPU = int(opts.get("tilesPerIPU", DEFAULT_IPU_MODEL_TILES))
        m.compileIPUCode = bool(opts.get("compileIPUCode", True))
        return DeviceInfo(m.createDevice(), DeviceType.IpuModel, options=opts)

    def createSimDevice(self, opts: dict | None = None) -> DeviceInfo:  # noqa: N802
        info = self.createIpuModelDevice({k: v for k, v in (opts or {}).items() if k in ("numIPUs", "tilesPerIPU", "ipuVersion")})
        info._type = DeviceType.Sim
        return info

    def createOfflineIPUDevice(self, opts: dict | None = None) -> DeviceInfo:  # noqa: N802
        """Compile-only device: ``{"numIPUs", "tilesPerIPU", "ipuVersion", "syncPattern", "gatewayMode"}``."""
        opts = dict(opts or {})
        _check_keys(opts, ("numIPUs", "tilesPerIPU", "ipuVersion", "syncPattern", "gatewayMode"), "OfflineIpu")
        t = poplar.createOfflineTarget(_version(opts.get("ipuVersion", "ipu2")), int(opts.get("numIPUs", 1)),
                                       int(opts["tilesPerIPU"]) if opts.get("tilesPerIPU") else None)
        return DeviceInfo(poplar.Device(t), DeviceType.OfflineIpu, options=opts)

    def createOfflineIpuFromDeviceInfo(self, info: DeviceInfo) -> DeviceInfo:  # noqa: N802
        return DeviceInfo(poplar.Device(info.device.getTarget()), DeviceType.OfflineIpu)

    def _ipu(self, num_ipus, tiles_per_ipu, connection, version="ipu2"):
        n = int(num_ipus)
        if n < 1 or n & (n - 1):
            raise popart_exception(f"You have attempted to acquire {n} IPUs. The number of IPUs requested must be a "
                                   "power of two")
        over = {"target_type": TargetType.IPU, "is_ipu_model": False}
        if tiles_per_ipu:
            over["tiles_per_ipu"] = int(tiles_per_ipu)
        dev = poplar.Device(Target(ipu.target(version, n, **over)), self._next_id)
        info = DeviceInfo(dev, DeviceType.Ipu, self._next_id, connection)
        self._next_id += n
        return info

    def acquireAvailableDevice(self, numIpus: int = 1, tilesPerIpu: int = 0,  # noqa: N802,N803
                               pattern="Full",
                               connectionType=DeviceConnectionType.Always,  # noqa: N803
                               selectionCriterion=DeviceSelectionCriterion.First) -> DeviceInfo:  # noqa: N803
        """A simulated Mk2 device of ``numIpus`` IPUs (a power of two, at most 256).

        Raises ``popart_exception`` when the request cannot be met."""
        return self._acquire(numIpus, tilesPerIpu, connectionType)

    def _acquire(self, num_ipus, tiles_per_ipu, connection) -> DeviceInfo:
        # Shared by acquire* and tryAcquire*: user code often replaces
        # ``DeviceManager.acquireAvailableDevice`` with a retry loop around
        # ``tryAcquireAvailableDevice``, so neither may call the other.
        if int(num_ipus) > poplar.DeviceManager.MAX_IPUS:
            raise popart_exception(f"Failed to acquire device with {num_ipus} IPUs. Ensure that there are sufficient "
                                   "IPUs available. The simulator offers at most "
                                   f"{poplar.DeviceManager.MAX_IPUS} IPUs")
        return self._ipu(num_ipus, tiles_per_ipu, connection)

    def tryAcquireAvailableDevice(self, numIpus: int = 1, tilesPerIpu: int = 0, pattern="Full",  # noqa: N802,N803
                                  connectionType=DeviceConnectionType.Always,  # noqa: N803
                                  selectionCriterion=DeviceSelectionCriterion.First):  # noqa: N803
        """As :meth:`acquireAvailableDevice` but returns ``None`` instead of raising."""
        try:
            return self._acquire(numIpus, tilesPerIpu, connectionType)
        except popart_exception:
            return None

    def acquireDeviceById(self, id: int, pattern="Full", connectionType=DeviceConnectionType.Always):  # noqa: A002,N802,N803
        return self._by_id(id, connectionType)

    def tryAcquireDeviceById(self, id: int, pattern="Full", connectionType=DeviceConnectionType.Always):  # noqa: A002,N802,N803
        return self._by_id(id, connectionType)

    def _by_id(self, device_id, connection) -> DeviceInfo:
        info = self._ipu(1, 0, connection)
        info._id = int(device_id)
        return info

    def enumerateDevices(self, pattern="Full", numIpus: int = 1, deviceType=DeviceType.Ipu,  # noqa: N802,N803
                         connectionType=DeviceConnectionType.Always, tilesPerIPU: int = 0):  # noqa: N803
        return [self._ipu(numIpus, tilesPerIPU, connectionType)]

    def setOnDemandAttachTimeout(self, seconds: int) -> None:  # noqa: N802
        self._timeout = int(seconds)


def target_of(info) -> poplar.Target:
    """The poplar Target of a DeviceInfo (or a poplar Device)."""
    return info.device.getTarget() if isinstance(info, DeviceInfo) else info.getTarget()

