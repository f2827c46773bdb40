"""Which simulated devices are attached right now, across processes (for ``gc-monitor``).

Attaching a device (``poplar.Device.attach``, PopART's ``DeviceInfo.attach`` or an IPU device
acquired attached) writes one small JSON file per process and device under the state directory
(``$OPENIPU_STATE_DIR``, else ``$XDG_RUNTIME_DIR/openipu``, else ``/tmp/openipu-<uid>``);
detaching or leaving the process removes it, and a reader drops the files of processes that no
longer exist. JSON only: reading the registry never runs code from it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

_mine: dict = {}


def state_dir() -> str:
    """The registry's directory (created on first write)."""
    d = os.environ.get("OPENIPU_STATE_DIR")
    if d:
        return d
    run = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(run, "openipu") if run else os.path.join("/tmp", f"openipu-{os.getuid()}")


def _path(key: str) -> str:
    return os.path.join(state_dir(), f"attached-{os.getpid()}-{key}.json")


def device_attached(key: str, device_id: int, spec) -> None:
    """Record that this process attached device ``device_id`` (an :class:`openipu.ipu.Target`
    ``spec``); ``key`` identifies the attachment within the process. Never raises on I/O errors
    (the registry is advisory)."""
    rec = {"pid": os.getpid(), "device_id": int(device_id), "num_ipus": int(spec.num_ipus),
           "arch": spec.arch, "version": spec.version, "tiles_per_ipu": int(spec.tiles_per_ipu),
           "clock_hz": float(spec.clock_hz), "target_type": spec.target_type,
           "command": " ".join(sys.argv)[:200], "attached_unix": time.time()}
    try:
        os.makedirs(state_dir(), exist_ok=True)
        tmp = _path(key) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, _path(key))
        _mine[key] = _path(key)
    except OSError:
        pass


def device_detached(key: str) -> None:
    """Remove this process's record ``key``, if any."""
    p = _mine.pop(key, None)
    if p:
        try:
            os.remove(p)
        except OSError:
            pass


@atexit.register
def _cleanup() -> None:
    for k in list(_mine):
        device_detached(k)


def attached_devices() -> list[dict]:
    """Records of the devices attached by live processes (dicts: pid, device_id, num_ipus, arch,
    version, tiles_per_ipu, clock_hz, target_type, command, attached_unix), sorted by device id.
    Records of dead processes are removed."""
    d = state_dir()
    out = []
    try:
        names = os.listdir(d)
    except OSError:
        return []
    for n in names:
        if not (n.startswith("attached-") and n.endswith(".json")):
            continue
        p = os.path.join(d, n)
        try:
            with open(p) as f:
                rec = json.load(f)
            pid = int(rec["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.remove(p)
            except OSError:
                pass
            continue
        except PermissionError:
            pass
        out.append(rec)
    return sorted(out, key=lambda r: (r.get("device_id", 0), r.get("pid", 0)))
