"""The ``gc-*`` command-line tools on simulated IPUs: ``gc-info``, ``gc-flops``,
``gc-exchangetest``, ``gc-iputraffictest``, ``gc-monitor`` (``gc-docker`` is omitted).

The simulated system is one IPU-Machine: ``OPENIPU_NUM_IPUS`` IPUs (default 4) of the generation
``OPENIPU_IPU_VERSION`` (``ipu1``, ``ipu2`` (default), ``bow``, ``ipu21``); every tool also takes
``--arch`` (an openipu option). Device ids follow gc-info: ids ``0..N-1`` are single IPUs, the
next ids multi-IPU devices of 2, 4, ... IPUs. Every bandwidth and FLOP figure is a *prediction*
of openipu's target model and cost model, not a measurement; the tools say so in their output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from openipu.ipu import target as ipu_target

_VERSIONS = ("ipu1", "ipu2", "bow", "ipu21")
_PART = {"ipu1": "GC2", "ipu2": "GC200", "bow": "Bow IPU", "ipu21": "C600 (GC200 with FP8)"}
_BOARD = {"ipu1": "C2 card", "ipu2": "IPU-M2000", "bow": "Bow-2000", "ipu21": "C600 card"}


def _system(arch: str | None) -> tuple[str, int]:
    version = arch or os.environ.get("OPENIPU_IPU_VERSION", "ipu2")
    if version not in _VERSIONS:
        raise SystemExit(f"unknown IPU version '{version}': expected one of {', '.join(_VERSIONS)}")
    try:
        n = int(os.environ.get("OPENIPU_NUM_IPUS", "4"))
    except ValueError:
        raise SystemExit("OPENIPU_NUM_IPUS must be an integer") from None
    return version, max(1, n)


def devices(arch: str | None = None) -> list[dict]:
    """The simulated devices: ``[{"id", "num_ipus", "ipus" (list of IPU ids), "version"}]``."""
    version, n = _system(arch)
    out = [{"id": i, "num_ipus": 1, "ipus": [i], "version": version} for i in range(n)]
    size = 2
    while size <= n:
        for first in range(0, n - size + 1, size):
            out.append({"id": len(out), "num_ipus": size, "ipus": list(range(first, first + size)), "version": version})
        size *= 2
    return out


def _device(dev_id: int, arch: str | None) -> dict:
    ds = devices(arch)
    if not 0 <= dev_id < len(ds):
        raise SystemExit(f"Error: device id {dev_id} is not valid: this system has devices 0 to {len(ds) - 1}")
    return ds[dev_id]


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--arch", choices=_VERSIONS, default=None,
                   help="IPU generation of the simulated system (openipu; default $OPENIPU_IPU_VERSION or ipu2)")
    return p


# ----------------------------------------------------------------------------------------------
# gc-info
# ----------------------------------------------------------------------------------------------
def gc_info(argv: list[str] | None = None) -> int:
    """``gc-info --list-devices`` / ``--device-info -d ID`` / ``--ipu-count``."""
    p = _common(argparse.ArgumentParser(prog="gc-info", description="Information about the (simulated) IPU devices."))
    p.add_argument("-l", "--list-devices", action="store_true", help="list the devices")
    p.add_argument("-i", "--device-info", action="store_true", help="show the attributes of a device")
    p.add_argument("-d", "--device-id", type=int, default=0, help="device id (default 0)")
    p.add_argument("-c", "--ipu-count", action="store_true", help="print the number of IPUs")
    p.add_argument("-j", "--json-output", action="store_true", help="emit JSON")
    a = p.parse_args(argv)
    ds = devices(a.arch)
    if a.ipu_count:
        print(sum(1 for d in ds if d["num_ipus"] == 1))
        return 0
    if a.device_info:
        info = device_attributes(_device(a.device_id, a.arch))
        if a.json_output:
            print(json.dumps(info, indent=2))
        else:
            print(f"Device Info ({'simulated by openipu'}):")
            for k, v in info.items():
                print(f"  {k}: {v}")
        return 0
    # default: --list-devices
    if a.json_output:
        print(json.dumps({"devices": ds}, indent=2))
        return 0
    for d in ds:
        if d["num_ipus"] == 1:
            print(f"-+- Id: [{d['id']}], target: [Simulated {_PART[d['version']]}], IPU#: [{d['ipus'][0]}]")
        else:
            print(f"-+- Id: [{d['id']}], type:      [Multi IPU]")
            for i in d["ipus"]:
                print(f" |--- Id: [{i}]")
    return 0


def device_attributes(d: dict) -> dict:
    """gc-info's device attributes of simulated device ``d`` (strings; sizes in bytes, clock in MHz)."""
    spec = ipu_target(d["version"], d["num_ipus"])
    return {"id": str(d["id"]), "target": f"Simulated {_PART[d['version']]} ({_BOARD[d['version']]})",
            "IPU version": d["version"], "architecture": spec.arch, "number of IPUs": str(spec.num_ipus),
            "IPU ids": ",".join(map(str, d["ipus"])), "tiles per IPU": str(spec.tiles_per_ipu),
            "worker contexts per tile": str(spec.num_worker_contexts),
            "memory per tile": f"{spec.bytes_per_tile} bytes ({spec.bytes_per_tile / 1024:.1f} KiB)",
            "memory per IPU": f"{spec.bytes_per_tile * spec.tiles_per_ipu:,} bytes",
            "clock frequency": f"{spec.clock_hz / 1e6:.0f} MHz",
            "exchange bytes per cycle per tile": str(spec.exchange_bytes_per_cycle),
            "IPU-Link bandwidth": f"{spec.ipu_link_bytes_per_s / 1e9:.0f} GB/s per IPU",
            "attached": "no (simulated; see gc-monitor)"}


# ----------------------------------------------------------------------------------------------
# gc-flops
# ----------------------------------------------------------------------------------------------
_AMP_KEY = {"FP16": "half", "FP32": "float", "FP8": "quarter"}


def peak_flops(version: str, precision: str = "FP16") -> tuple[float, float]:
    """``(FLOP/s per IPU, clock Hz)`` of IPU ``version`` at ``precision`` (FP16, FP32, FP8):
    2 x AMP MACs per cycle per tile x tiles x clock (the target model's figures)."""
    spec = ipu_target(version, 1)
    macs = spec.amp_macs.get(_AMP_KEY[precision], 0)
    return 2.0 * macs * spec.tiles_per_ipu * spec.clock_hz, spec.clock_hz


def gc_flops(argv: list[str] | None = None) -> int:
    """``gc-flops [-d ID] [-p FP16|FP32|FP8] [-j]``: peak FLOPs per IPU (predicted)."""
    p = _common(argparse.ArgumentParser(prog="gc-flops", description="Floating-point operations per second of an IPU "
                                        "(predicted by openipu's target model)."))
    p.add_argument("-p", "--fp", default="FP16", type=str.upper, choices=["FP16", "FP32", "FP8"],
                   help="floating point precision (default FP16)")
    p.add_argument("-d", "--device-id", type=int, default=0, help="device id")
    p.add_argument("-j", "--json-output", action="store_true", help="emit JSON output")
    p.add_argument("-l", "--low-clock-rate", action="store_true", help="permit low clock-rate (no effect)")
    a = p.parse_args(argv)
    d = _device(a.device_id, a.arch)
    t0 = time.perf_counter()
    flops, clock = peak_flops(d["version"], a.fp)
    took = time.perf_counter() - t0
    if flops == 0:
        print(f"Error: {a.fp} is not supported on {d['version']}", file=sys.stderr)
        return 1
    if a.json_output:
        print(json.dumps({"device_id": d["id"], "precision": a.fp, "flops_per_ipu": flops,
                          "tera_flops_per_ipu": round(flops / 1e12, 4), "clock_mhz": round(clock / 1e6),
                          "predicted": True}))
        return 0
    print("Loading binary into IPU(s) (simulated: openipu predicts from the target model)")
    print(f"Starting {a.fp} FLOPS calculation...")
    print(f"Flops per IPU ({a.fp}): {flops / 1e12:.4f} teraFLOPS (took: {took:.4f} seconds)")
    print(f"IPU clock speed: {clock / 1e6:.0f} MHz")
    return 0


# ----------------------------------------------------------------------------------------------
# gc-exchangetest, gc-iputraffictest
# ----------------------------------------------------------------------------------------------
def exchange_bandwidth(version: str, bytes_per_tile: int) -> dict:
    """Predicted tile-to-tile exchange on one IPU: every tile sends ``bytes_per_tile`` to the next
    tile in one exchange phase. Returns ``cycles`` (of the phase), ``bytes_per_s_per_tile`` and
    ``bytes_per_s_total`` (all tiles), from :func:`openipu.poplar.cost.exchange_cost`."""
    from openipu.poplar import cost as costmod
    spec = ipu_target(version, 1)
    T = spec.num_tiles
    b = np.full(T, float(bytes_per_tile))
    one = np.ones(T)
    vol = costmod.ExchangeVolume(b, b, one, one, np.zeros(spec.num_ipus))
    cyc = float(costmod.exchange_cost(spec, vol).duration["exchange"].max())
    per_tile = bytes_per_tile / (cyc / spec.clock_hz)
    return {"cycles": cyc, "bytes_per_s_per_tile": per_tile, "bytes_per_s_total": per_tile * T}


def link_bandwidth(version: str, nbytes: int) -> dict:
    """Predicted IPU-to-IPU traffic: ``nbytes`` into each IPU of a 2-IPU device over IPU-Links.
    Returns ``cycles`` and ``bytes_per_s`` per IPU, from the cost model's global exchange."""
    from openipu.poplar import cost as costmod
    spec = ipu_target(version, 2)
    T = spec.num_tiles
    per_tile = np.full(T, nbytes / spec.tiles_per_ipu)      # the data lands spread over the tiles
    one = np.ones(T)
    vol = costmod.ExchangeVolume(per_tile, per_tile, one, one, np.full(2, float(nbytes)))
    cyc = float(costmod.exchange_cost(spec, vol).duration["global_exchange"].max())
    return {"cycles": cyc, "bytes_per_s": nbytes / (cyc / spec.clock_hz)}


def gc_exchangetest(argv: list[str] | None = None) -> int:
    """``gc-exchangetest [-d ID] [-s BYTES]``: predicted on-IPU exchange bandwidth."""
    p = _common(argparse.ArgumentParser(prog="gc-exchangetest", description="Tile-to-tile exchange bandwidth of an "
                                        "IPU (predicted by openipu's cost model)."))
    p.add_argument("-d", "--device-id", type=int, default=0)
    p.add_argument("-s", "--size", type=int, default=65536, help="bytes each tile sends (default 65536)")
    p.add_argument("-j", "--json-output", action="store_true")
    a = p.parse_args(argv)
    d = _device(a.device_id, a.arch)
    rows = []
    for ipu in d["ipus"]:
        r = exchange_bandwidth(d["version"], a.size)
        rows.append({"ipu": ipu, **r})
    if a.json_output:
        print(json.dumps({"device_id": d["id"], "bytes_per_tile": a.size, "predicted": True, "ipus": rows}))
        return 0
    print(f"Exchange test on device {d['id']} ({d['version']}), {a.size:,} bytes per tile "
          "(predicted by openipu's cost model; no IPU measured)")
    for r in rows:
        print(f"  IPU {r['ipu']}: {r['cycles']:,.0f} cycles; {r['bytes_per_s_per_tile'] / 1e9:.2f} GB/s per tile, "
              f"{r['bytes_per_s_total'] / 1e12:.2f} TB/s all tiles")
    return 0


def gc_iputraffictest(argv: list[str] | None = None) -> int:
    """``gc-iputraffictest [--size BYTES] [--all-links]``: predicted IPU-Link bandwidth between
    the IPUs of the system, pair by pair."""
    p = _common(argparse.ArgumentParser(prog="gc-iputraffictest", description="IPU-to-IPU traffic over IPU-Links "
                                        "(predicted by openipu's cost model)."))
    p.add_argument("-s", "--size", type=int, default=64 << 20, help="bytes per transfer (default 64 MiB)")
    p.add_argument("-j", "--json-output", action="store_true")
    a = p.parse_args(argv)
    version, n = _system(a.arch)
    if n < 2:
        print("Error: IPU traffic needs at least 2 IPUs (OPENIPU_NUM_IPUS)", file=sys.stderr)
        return 1
    r = link_bandwidth(version, a.size)
    pairs = [(i, i + 1) for i in range(0, n - 1)]
    if a.json_output:
        print(json.dumps({"version": version, "bytes": a.size, "predicted": True,
                          "pairs": [{"from": x, "to": y, **r} for x, y in pairs]}))
        return 0
    print(f"IPU traffic test, {n} x {version}, {a.size:,} bytes per transfer (predicted by openipu's cost model)")
    for x, y in pairs:
        print(f"  IPU {x} -> IPU {y}: {r['cycles']:,.0f} cycles, {r['bytes_per_s'] / 1e9:.1f} GB/s")
    return 0


# ----------------------------------------------------------------------------------------------
# gc-monitor
# ----------------------------------------------------------------------------------------------
def gc_monitor(argv: list[str] | None = None) -> int:
    """``gc-monitor [-j]``: the simulated devices attached by running processes."""
    from openipu.poplar.runtime_state import attached_devices
    p = _common(argparse.ArgumentParser(prog="gc-monitor", description="Simulated IPUs in use (attached devices of "
                                        "running openipu processes)."))
    p.add_argument("-j", "--json-output", action="store_true")
    a = p.parse_args(argv)
    recs = attached_devices()
    if a.json_output:
        print(json.dumps({"attached": recs}))
        return 0
    version, n = _system(a.arch)
    print(f"+{'-' * 78}+")
    title = f"  gc-monitor (openipu simulated system: {n} x {version})"
    print(f"|{title:<78}|")
    print(f"+{'-' * 10}+{'-' * 10}+{'-' * 8}+{'-' * 10}+{'-' * 37}+")
    print(f"| {'Device':<9}| {'PID':<9}| {'IPUs':<7}| {'Arch':<9}| {'Command':<36}|")
    print(f"+{'-' * 10}+{'-' * 10}+{'-' * 8}+{'-' * 10}+{'-' * 37}+")
    for r in recs:
        print(f"| {r['device_id']:<9}| {r['pid']:<9}| {r['num_ipus']:<7}| {r['version']:<9}| {r['command'][:35]:<36}|")
    if not recs:
        print(f"| {'No attached devices':<77}|")
    print(f"+{'-' * 78}+")
    return 0
