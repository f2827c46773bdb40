"""Which simulated IPUs are in use, across processes: one advisory file lock per IPU.

A real IPU is held by one process at a time: a second process asking for a device whose IPUs are
attached elsewhere finds it busy (PopART's ``tryAcquireAvailableDevice`` returns no device,
PopTorch raises "Failed to acquire N IPU(s)" or, with ``POPTORCH_WAIT_FOR_IPU=1``, waits).

The simulated system has a fixed size only when ``OPENIPU_NUM_IPUS`` is set (the IPU-Machine
``gc-info`` shows): then its devices are gc-info's (ids ``0..N-1`` single IPUs, the next ids
devices of 2, 4, ... IPUs, see :func:`openipu.tools.gc.devices`) and attaching one takes an
exclusive ``fcntl.flock`` on ``ipu-<k>.lock`` for each of its IPUs, in the per-user state
directory of :mod:`openipu.poplar.runtime_state`. Detaching (or the process ending, also by a
crash: the kernel drops the locks with the file descriptors) frees them. Unset, the system is
unbounded and never busy (every request is served, as before): test runs that start many processes
at once do not wait on each other. The lock files are empty: nothing is read from them.
"""

from __future__ import annotations

import fcntl
import os

from openipu.poplar import runtime_state


def system_ipus() -> int | None:
    """The number of IPUs of the simulated system (``OPENIPU_NUM_IPUS``), or ``None`` when it is
    unset (unbounded, never busy). Raises ``ValueError`` for a value that is not a positive integer."""
    v = os.environ.get("OPENIPU_NUM_IPUS", "").strip()
    if not v:
        return None
    n = int(v)
    if n < 1:
        raise ValueError(f"OPENIPU_NUM_IPUS must be a positive integer, not {v!r}")
    return n


def devices(n: int) -> list[tuple[int, ...]]:
    """The devices of a system of ``n`` IPUs, by id: the IPUs of each (gc-info's numbering)."""
    out = [(i,) for i in range(n)]
    size = 2
    while size <= n:
        out.extend(tuple(range(first, first + size)) for first in range(0, n - size + 1, size))
        size *= 2
    return out


def device_ids(n: int, num_ipus: int) -> list[int]:
    """The ids of the devices of ``num_ipus`` IPUs in a system of ``n`` IPUs."""
    return [i for i, ipus in enumerate(devices(n)) if len(ipus) == num_ipus]


class IpuLock:
    """The exclusive hold of some IPUs of the system (one open, flocked file each)."""

    def __init__(self, ipus):
        self.ipus = tuple(int(i) for i in ipus)
        self._files: list = []

    @property
    def held(self) -> bool:
        return bool(self._files) or not self.ipus

    def acquire(self) -> bool:
        """Take every IPU at once, without blocking; ``False`` (nothing held) when one is in use by
        another holder (another process, or another device of this process)."""
        if self.held:
            return True
        d = runtime_state.state_dir()
        os.makedirs(d, exist_ok=True)
        files = []
        try:
            for k in self.ipus:
                f = open(os.path.join(d, f"ipu-{k}.lock"), "a")    # noqa: SIM115 (held while attached)
                files.append(f)
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            for f in files:
                f.close()
            return False
        self._files = files
        return True

    def release(self) -> None:
        for f in self._files:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            finally:
                f.close()
        self._files = []

    def __del__(self):
        try:
            self.release()
        except Exception:       # noqa: BLE001 (interpreter shutdown)
            pass
