"""``popart.DeviceManager`` and ``popart.DeviceInfo`` over simulated devices.

Every device is simulated by :mod:`openipu.poplar`. ``acquireAvailableDevice`` /
``tryAcquireAvailableDevice`` return simulated Mk2 (``ipu2``) IPUs of type ``DeviceType.Ipu``
(1472 tiles per IPU unless ``tilesPerIpu`` is given); ``createIpuModelDevice`` an IPU Model
(PopART's default of 4 tiles per IPU); ``createCpuDevice`` a one-tile CPU target;
``createOfflineIPUDevice`` a compile-only target (``run`` raises).
"""

from __future__ import annotations

from openipu import ipu, poplar
from openipu.poplar import device_locks
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
        """Attach (PopART's ``DeviceInfo::attach``): ``False`` when an IPU of the device is attached
        elsewhere (a system of fixed size, ``OPENIPU_NUM_IPUS``: :mod:`openipu.poplar.device_locks`)."""
        if self._type == DeviceType.Ipu and not self.device.attach():
            return False
        self._attached = True
        if self._type == DeviceType.Ipu:
            self._register()
        return True

    def tryAttachUntilTimeout(self) -> bool:  # noqa: N802
        """:meth:`attach`, retried every 0.1 s up to ``DeviceManager.setOnDemandAttachTimeout``
        seconds (host wall time); ``False`` when the device stayed busy."""
        import time
        deadline = time.monotonic() + DeviceManager()._timeout
        while not self.attach():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def detach(self) -> None:
        self._attached = False
        if self._type == DeviceType.Ipu:
            self.device.detach()
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
        """A simulated Mk2 device of ``numIpus`` IPUs (a power of two, at most 256; in a system of
        fixed size, ``OPENIPU_NUM_IPUS``, the first of gc-info's devices of that size whose IPUs
        are all free).

        Raises ``popart_exception`` when the request cannot be met (also when every device of
        that size is attached by another process)."""
        info = self._acquire(numIpus, tilesPerIpu, connectionType)
        if info is None:
            raise popart_exception(f"Failed to acquire device with {numIpus} IPUs. Ensure that there are sufficient "
                                   "IPUs available. All of them are attached by other processes")
        return info

    def _acquire(self, num_ipus, tiles_per_ipu, connection) -> DeviceInfo | None:
        # Shared by acquire* and tryAcquire*: user code often replaces
        # ``DeviceManager.acquireAvailableDevice`` with a retry loop around
        # ``tryAcquireAvailableDevice``, so neither may call the other. ``None``: all busy.
        if int(num_ipus) > poplar.DeviceManager.MAX_IPUS:
            raise popart_exception(f"Failed to acquire device with {num_ipus} IPUs. Ensure that there are sufficient "
                                   "IPUs available. The simulator offers at most "
                                   f"{poplar.DeviceManager.MAX_IPUS} IPUs")
        n = device_locks.system_ipus()
        if n is None:
            return self._ipu(num_ipus, tiles_per_ipu, connection)
        self._check_power_of_two(num_ipus)
        ids = device_locks.device_ids(n, int(num_ipus))
        if not ids:
            raise popart_exception(f"Failed to acquire device with {num_ipus} IPUs. Ensure that there are sufficient "
                                   f"IPUs available. This system has {n} IPUs (OPENIPU_NUM_IPUS)")
        for dev_id in ids:
            info = self._system_device(dev_id, tiles_per_ipu, connection)
            if info is not None:
                return info
        if connection != DeviceConnectionType.Always:   # OnDemand: attached on first use
            return self._system_device(ids[0], tiles_per_ipu, connection)
        return None

    @staticmethod
    def _check_power_of_two(num_ipus):
        n = int(num_ipus)
        if n < 1 or n & (n - 1):
            raise popart_exception(f"You have attempted to acquire {n} IPUs. The number of IPUs requested must be a "
                                   "power of two")

    def _system_device(self, dev_id, tiles_per_ipu, connection, version="ipu2") -> DeviceInfo | None:
        """Device ``dev_id`` of the fixed-size system, attached when ``connection`` is Always
        (``None`` when one of its IPUs is busy)."""
        ipus = device_locks.devices(device_locks.system_ipus())[int(dev_id)]
        over = {"target_type": TargetType.IPU, "is_ipu_model": False}
        if tiles_per_ipu:
            over["tiles_per_ipu"] = int(tiles_per_ipu)
        dev = poplar.Device(Target(ipu.target(version, len(ipus), **over)), int(dev_id), ipus=ipus)
        if connection == DeviceConnectionType.Always and not dev.attach():
            return None
        return DeviceInfo(dev, DeviceType.Ipu, int(dev_id), connection)

    def tryAcquireAvailableDevice(self, numIpus: int = 1, tilesPerIpu: int = 0, pattern="Full",  # noqa: N802,N803
                                  connectionType=DeviceConnectionType.Always,  # noqa: N803
                                  selectionCriterion=DeviceSelectionCriterion.First):  # noqa: N803
        """As :meth:`acquireAvailableDevice` but returns ``None`` instead of raising (also when
        every device of that size is busy)."""
        try:
            return self._acquire(numIpus, tilesPerIpu, connectionType)
        except popart_exception:
            return None

    def acquireDeviceById(self, id: int, pattern="Full", connectionType=DeviceConnectionType.Always):  # noqa: A002,N802,N803
        """Device ``id`` (in a system of fixed size, gc-info's ids). Raises ``popart_exception``
        when it is busy or not a device of the system."""
        info = self._by_id(id, connectionType)
        if info is None:
            raise popart_exception(f"Failed to acquire device with id '{id}'. Ensure it is available. "
                                   "It is attached by another process")
        return info

    def tryAcquireDeviceById(self, id: int, pattern="Full", connectionType=DeviceConnectionType.Always):  # noqa: A002,N802,N803
        """As :meth:`acquireDeviceById` but ``None`` when the device is busy or not in the system."""
        try:
            return self._by_id(id, connectionType)
        except popart_exception:
            return None

    def _by_id(self, device_id, connection) -> DeviceInfo | None:
        n = device_locks.system_ipus()
        if n is None:
            info = self._ipu(1, 0, connection)
            info._id = int(device_id)
            return info
        if not 0 <= int(device_id) < len(device_locks.devices(n)):
            raise popart_exception(f"Failed to acquire device with id '{device_id}'. Ensure it is available. This "
                                   f"system has devices 0 to {len(device_locks.devices(n)) - 1}")
        return self._system_device(device_id, 0, connection)

    def enumerateDevices(self, pattern="Full", numIpus: int = 1, deviceType=DeviceType.Ipu,  # noqa: N802,N803
                         connectionType=DeviceConnectionType.Always, tilesPerIPU: int = 0):  # noqa: N803
        """The devices of ``numIpus`` IPUs (not attached): gc-info's in a system of fixed size."""
        n = device_locks.system_ipus()
        if n is None:
            return [self._ipu(numIpus, tilesPerIPU, connectionType)]
        return [self._system_device(i, tilesPerIPU, DeviceConnectionType.Never)
                for i in device_locks.device_ids(n, int(numIpus))]

    def setOnDemandAttachTimeout(self, seconds: int) -> None:  # noqa: N802
        self._timeout = int(seconds)


def target_of(info) -> poplar.Target:
    """The poplar Target of a DeviceInfo (or a poplar Device)."""
    return info.device.getTarget() if isinstance(info, DeviceInfo) else info.getTarget()

