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


def openTrace(path) -> Trace:  # noqa: N802
    """Load a trace file (or the newest ``*.pvti.json`` in a directory). Raises
    ``FileNotFoundError``, :class:`NotATrace` (not JSON, or not the Chrome trace event format)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        files = sorted((os.path.join(path, f) for f in os.listdir(path) if f.endswith(".pvti.json")),
                       key=os.path.getmtime)
        if not files:
            raise FileNotFoundError(f"No trace (*.pvti.json) in '{path}'")
        path = files[-1]
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise NotATrace(f"'{path}' is not a trace (not JSON: {e})") from None
    try:
        import jsonschema
    except ImportError:          # the schema check needs the test extra; the structure is still checked
        jsonschema = None
    if jsonschema is not None:
        try:
            jsonschema.validate(doc, CHROME_TRACE_SCHEMA)
        except jsonschema.ValidationError as e:
            raise NotATrace(f"'{path}' is not a Chrome trace event file: {e.message}") from None
    elif not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NotATrace(f"'{path}' is not a Chrome trace event file (no traceEvents list)")
    return Trace(path, doc)
