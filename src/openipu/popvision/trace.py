"""Reader of the System Analyser trace (``PVTI_OPTIONS``; written by :mod:`openipu.poplar.pvti`).

The file is JSON in the Chrome trace event format; it is parsed with ``json`` (nothing in it is
executed) and checked against :data:`CHROME_TRACE_SCHEMA`. Host events are host wall time;
events on the "IPU n (predicted)" tracks are cost-model predictions.

Perfetto's Python trace processor would also read these files, but it downloads its
``trace_processor_shell`` binary on first use, which an offline machine cannot do; the tests use
this reader and a JSON-schema check of the Chrome trace event format instead.
"""

from __future__ import annotations

import json
import os

from openipu.popvision.errors import NotATrace

#: JSON schema of the Chrome trace event format (object form) as openipu writes and reads it:
#: the event fields of the "Trace Event Format" document (name, cat, ph, ts, dur, pid, tid, args).
CHROME_TRACE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["ph", "pid", "tid"],
                "properties": {
                    "name": {"type": "string"},
                    "cat": {"type": "string"},
                    "ph": {"type": "string", "enum": ["B", "E", "X", "i", "I", "M", "C", "b", "e", "n", "s", "t", "f"]},
                    "ts": {"type": "number"},
                    "dur": {"type": "number", "minimum": 0},
                    "pid": {"type": "integer"},
                    "tid": {"type": "integer"},
                    "s": {"type": "string", "enum": ["g", "p", "t"]},
                    "args": {"type": "object"},
                },
                "allOf": [
                    {"if": {"properties": {"ph": {"const": "X"}}}, "then": {"required": ["name", "ts", "dur"]}},
                    {"if": {"properties": {"ph": {"enum": ["B", "E", "i", "I"]}}}, "then": {"required": ["ts"]}},
                    {"if": {"properties": {"ph": {"const": "M"}}}, "then": {"required": ["name", "args"]}},
                ],
            },
        },
        "displayTimeUnit": {"type": "string", "enum": ["ms", "ns"]},
        "otherData": {"type": "object"},
    },
}


class Trace:
    """A loaded trace: ``events`` (complete and instant events, dicts), ``threads`` ({(pid,
    tid): name}), ``hostEvents`` and ``ipuEvents`` (the predicted IPU tracks)."""

    def __init__(self, path: str, doc: dict):
        self.path = path
        evs = doc["traceEvents"]
        self.threads = {(e["pid"], e["tid"]): e["args"].get("name", "") for e in evs
                        if e.get("ph") == "M" and e.get("name") == "thread_name"}
        self.events = [e for e in evs if e.get("ph") in ("X", "i", "I", "B", "E")]
        ipu_tids = {k for k, n in self.threads.items() if n.endswith("(predicted)")}
        self.ipuEvents = [e for e in self.events if (e["pid"], e["tid"]) in ipu_tids]
        self.hostEvents = [e for e in self.events if (e["pid"], e["tid"]) not in ipu_tids]

    def spans(self, prefix: str) -> list:
        """Host events whose name starts with ``prefix``."""
        return [e for e in self.hostEvents if e.get("name", "").startswith(prefix)]


#: Bounds on a trace file: its size in bytes and its number of events.
MAX_TRACE_BYTES = 1 << 30
MAX_TRACE_EVENTS = 20_000_000
_PHASES = frozenset(CHROME_TRACE_SCHEMA["properties"]["traceEvents"]["items"]["properties"]["ph"]["enum"])


def _read_regular_file(path: str) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most :data:`MAX_TRACE_BYTES` (opened
    without blocking, so a FIFO or a device cannot hang the reader). Raises :class:`NotATrace`."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise NotATrace(f"'{path}' cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        import stat
        if not stat.S_ISREG(st.st_mode):
            raise NotATrace(f"'{path}' is not a regular file")
        if st.st_size > MAX_TRACE_BYTES:
            raise NotATrace(f"'{path}' is larger than {MAX_TRACE_BYTES} bytes")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_TRACE_BYTES + 1)
    finally:
        os.close(fd)


def _check_events(doc, path: str) -> None:
    """The structure :class:`Trace` relies on, checked without the optional schema validator:
    a ``traceEvents`` list of objects with a known phase, integer ``pid`` / ``tid``, finite
    numbers, string names and object ``args``."""
    evs = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(evs, list):
        raise NotATrace(f"'{path}' is not a Chrome trace event file (no traceEvents list)")
    if len(evs) > MAX_TRACE_EVENTS:
        raise NotATrace(f"'{path}' has more than {MAX_TRACE_EVENTS} events")
    for i, e in enumerate(evs):
        ok = (isinstance(e, dict) and e.get("ph") in _PHASES and type(e.get("pid")) is int
              and type(e.get("tid")) is int and isinstance(e.get("name", ""), str)
              and isinstance(e.get("args", {}), dict)
              and all(isinstance(e.get(k, 0), (int, float)) and not isinstance(e.get(k, 0), bool)
                      for k in ("ts", "dur")))
        if not ok:
            raise NotATrace(f"'{path}' is not a Chrome trace event file (event {i} is malformed)")


def openTrace(path) -> Trace:  # noqa: N802
    """Load a trace file (or the newest ``*.pvti.json`` in a directory). The file is untrusted
    data: it must be a regular file of at most :data:`MAX_TRACE_BYTES`, valid JSON without NaN or
    infinity tokens, nested as the format is, with at most :data:`MAX_TRACE_EVENTS` well-formed
    events. Raises ``FileNotFoundError`` and :class:`NotATrace` (a ``pva.Error``) for anything
    else."""
    path = os.fspath(path)
    if os.path.isdir(path):
        files = sorted((os.path.join(path, f) for f in os.listdir(path) if f.endswith(".pvti.json")),
                       key=os.path.getmtime)
        if not files:
            raise FileNotFoundError(f"No trace (*.pvti.json) in '{path}'")
        path = files[-1]
    data = _read_regular_file(path)

    def no_constant(c):
        raise ValueError(f"{c} is not a JSON number")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise NotATrace(f"'{path}' is not a trace (not JSON: {type(e).__name__}: {str(e)[:120]})") from None
    _check_events(doc, path)
    try:
        import jsonschema
    except ImportError:          # the schema check needs the test extra; the structure is checked above
        jsonschema = None
    if jsonschema is not None:
        try:
            jsonschema.validate(doc, CHROME_TRACE_SCHEMA)
        except jsonschema.ValidationError as e:
            raise NotATrace(f"'{path}' is not a Chrome trace event file: {e.message[:200]}") from None
    return Trace(path, doc)
