"""Acquiring the (simulated) IPUs a PopTorch model runs on, as PopTorch does on a shared system.

In a system of fixed size (``OPENIPU_NUM_IPUS``: :mod:`openipu.poplar.device_locks`) an IPU
attached by another process is busy. PopTorch then raises ``poptorch.Error("Failed to acquire N
IPU(s)")`` or, with ``POPTORCH_WAIT_FOR_IPU=1``, retries every :data:`WAIT_SECONDS` (PopTorch
sleeps 15 s) until a device is free. ``ConnectionType.OnDemand`` compiles without attaching and
attaches on the first run (or ``attachToDevice``); ``detachFromDevice`` frees the IPUs for other
processes. ``Options.useIpuId(id)`` asks for that device (gc-info's id).
"""

from __future__ import annotations

import logging
import os
import time

from openipu import popart
from openipu.poplar import device_locks
from openipu.poptorch.enums import ConnectionType
from openipu.poptorch.errors import Error

_log = logging.getLogger("poptorch")

#: Seconds between two attempts to acquire a busy device under ``POPTORCH_WAIT_FOR_IPU=1``
#: (host wall time; PopTorch's ``waitForAWhile``).
WAIT_SECONDS = 15.0


def wait_for_ipu() -> bool:
    """``POPTORCH_WAIT_FOR_IPU``: wait for a busy device instead of raising."""
    v = os.environ.get("POPTORCH_WAIT_FOR_IPU", "").strip()
    try:
        return bool(v) and int(v) != 0
    except ValueError:
        return False


def _system_config(num_ipus: int, ipu_id: int) -> str:
    """PopTorch's ``checkSystemConfig`` text: why no device can ever match ("" when one can)."""
    n = device_locks.system_ipus()
    if n is None or ipu_id >= 0:
        return ""
    if not device_locks.device_ids(n, num_ipus):
        return (f"\nNo device found on the system with {num_ipus} IPUs: the configuration needs changing")
    return ""


def acquire(num_ipus: int, ipu_id: int = -1, connection=ConnectionType.Always, must_attach: bool = False):
    """A PopART ``DeviceInfo`` of ``num_ipus`` simulated IPUs (device ``ipu_id`` when >= 0),
    attached unless ``connection`` is OnDemand and not ``must_attach``. Raises :class:`Error`
    ("Failed to acquire N IPU(s)" / "Failed to acquire device Id N") when the devices are busy
    and ``POPTORCH_WAIT_FOR_IPU`` is not set (or no device of the system can match); else waits."""
    dm = popart.DeviceManager()
    conn = popart.DeviceConnectionType.OnDemand if connection == ConnectionType.OnDemand and not must_attach \
        else popart.DeviceConnectionType.Always
    while True:
        try:
            if ipu_id >= 0:
                device = dm.tryAcquireDeviceById(ipu_id, connectionType=conn)
            else:
                device = dm.tryAcquireAvailableDevice(num_ipus, connectionType=conn)
        except popart.popart_exception as e:
            raise Error(str(e)) from None
        if device is not None:
            if ipu_id >= 0 and device.numIpus < num_ipus:
                raise Error(f"Expected at least replication factor * used IPUs = {num_ipus} device Ids but the "
                            f"user provided {device.numIpus}")
            _log.debug("Acquired %d IPU(s): running on device Id %d.", num_ipus, device.id)
            return device
        why = _system_config(num_ipus, ipu_id)
        if not wait_for_ipu() or why:
            raise Error((f"Failed to acquire device Id {ipu_id}" if ipu_id >= 0 else
                         f"Failed to acquire {num_ipus} IPU(s)") + why)
        _log.info("No IPU available, sleeping for %s seconds", WAIT_SECONDS)
        time.sleep(WAIT_SECONDS)
