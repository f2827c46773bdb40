"""The System Analyser trace (PopVision Trace Instrumentation, ``PVTI_OPTIONS``).

``PVTI_OPTIONS='{"enable":"true","directory":"DIR"}'`` records the host side of a program —
graph construction, compile phases, engine loads, each run, each stream copy — and writes it at
process exit (or on :func:`flush`) to ``DIR/openipu-<pid>.pvti.json`` in the Chrome trace event
format (JSON object with ``traceEvents``; complete events ``ph: "X"`` with ``ts``/``dur`` in
microseconds of host wall time). Each engine run also adds the **predicted IPU timeline** on its
own tracks (one thread per IPU, named "IPU n (predicted)"): its steps laid out in predicted
cycles converted to microseconds at the target clock, starting when the host run started — they
are cost-model predictions, not host time. Read it with ``pva.openTrace``; Perfetto and
chrome://tracing open it too.

:func:`span` is a no-op context manager when tracing is off. Graphcore's ``libpvti`` Python API
(``createTraceChannel``, ``Tracepoint``, ``instrument_fn``) is in the ``libpvti`` drop-in module.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time

_lock = threading.Lock()
_events: list = []
_state = {"checked": False, "enabled": False, "directory": ".", "ipu_threads": set()}
#: At most this many predicted steps per run go into the trace.
MAX_IPU_STEPS_PER_RUN = 20_000
#: The thread ids of the predicted IPU tracks are IPU_TID_BASE + IPU number.
IPU_TID_BASE = 1_000_000
_T0 = time.perf_counter()
_EPOCH_US = time.time() * 1e6


def _options() -> None:
    if _state["checked"]:
        return
    _state["checked"] = True
    raw = os.environ.get("PVTI_OPTIONS", "")
    if not raw:
        return
    try:
        opts = json.loads(raw)
    except ValueError:
        return
    if str(opts.get("enable", "false")).lower() == "true":
        _state["enabled"] = True
        _state["directory"] = str(opts.get("directory", "."))
        atexit.register(flush)


def enabled() -> bool:
    """True when ``PVTI_OPTIONS`` enables tracing."""
    _options()
    return _state["enabled"]


def reset_from_environment() -> None:
    """Read ``PVTI_OPTIONS`` again (tests change it) and drop the recorded events."""
    with _lock:
        _events.clear()
        _state.update(checked=False, enabled=False, directory=".", ipu_threads=set())


def _now_us() -> float:
    return _EPOCH_US + (time.perf_counter() - _T0) * 1e6


def _add(ev: dict) -> None:
    with _lock:
        _events.append(ev)


@contextlib.contextmanager
def span(name: str, channel: str = "openipu", **args):
    """Record the host wall time of the ``with`` body as one complete event on this thread."""
    if not enabled():
        yield
        return
    t = _now_us()
    try:
        yield
    finally:
        _add({"name": name, "cat": channel, "ph": "X", "ts": t, "dur": max(_now_us() - t, 0.0),
              "pid": os.getpid(), "tid": threading.get_ident() % 1_000_000, "args": args})


def instant(name: str, channel: str = "openipu", **args) -> None:
    """Record an instant event (``ph: "i"``)."""
    if enabled():
        _add({"name": name, "cat": channel, "ph": "i", "s": "t", "ts": _now_us(), "pid": os.getpid(),
              "tid": threading.get_ident() % 1_000_000, "args": args})


def counter(graph: str, series: str, value: float, unit: str = "") -> None:
    """Record one value of a series of a libpvti ``Graph`` (a counter event, ``ph: "C"``, named
    by the graph, its ``args`` the series' value; ``unit`` kept in the event's category)."""
    if enabled():
        _add({"name": graph, "cat": f"graph{':' + unit if unit else ''}", "ph": "C", "ts": _now_us(),
              "pid": os.getpid(), "tid": threading.get_ident() % 1_000_000, "args": {series: float(value)}})


def ipu_timeline(start_us: float, clock_hz: float, steps, run_name: str = "") -> None:
    """Add a run's predicted IPU timeline: ``steps`` = [(name, category, ipu, start cycle,
    cycles)] (predicted cycles from the run's start), drawn from host time ``start_us``."""
    if not enabled():
        return
    pid = os.getpid()
    us_per_cycle = 1e6 / clock_hz
    evs = []
    for name, cat, ipu, c0, n in steps[:MAX_IPU_STEPS_PER_RUN]:
        evs.append({"name": name, "cat": f"ipu.{cat}", "ph": "X", "ts": start_us + c0 * us_per_cycle,
                    "dur": n * us_per_cycle, "pid": pid, "tid": IPU_TID_BASE + int(ipu),
                    "args": {"cycles": n, "fromCycle": c0, "run": run_name, "predicted": True}})
    with _lock:
        for ipu in {s[2] for s in steps}:
            if ipu not in _state["ipu_threads"]:
                _state["ipu_threads"].add(ipu)
                _events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": IPU_TID_BASE + int(ipu),
                                "args": {"name": f"IPU {ipu} (predicted)"}})
        _events.extend(evs)


def now_us() -> float:
    """The trace clock (microseconds) now: pass to :func:`ipu_timeline` as a run's start."""
    return _now_us()


def flush() -> str | None:
    """Write the trace recorded so far to ``DIR/openipu-<pid>.pvti.json`` (the whole trace, each
    time). Returns the path, or None when tracing is off."""
    if not enabled():
        return None
    pid = os.getpid()
    with _lock:
        evs = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"openipu host {pid}"}},
               {"name": "thread_name", "ph": "M", "pid": pid, "tid": threading.main_thread().ident % 1_000_000,
                "args": {"name": "host (main thread)"}}] + list(_events)
    d = _state["directory"]
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"openipu-{pid}.pvti.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": evs, "displayTimeUnit": "ns",
                   "otherData": {"producer": "openipu", "format": "chrome-trace-event", "version": 1}}, f)
    os.replace(tmp, path)
    return path
