"""Drop-in ``libpvti`` (PopVision trace instrumentation for Python code): channels and
tracepoints recorded into openipu's System Analyser trace when ``PVTI_OPTIONS`` enables it
(see :mod:`openipu.poplar.pvti`). Host wall time."""

from __future__ import annotations

import functools

from openipu.poplar import pvti as _pvti


class TraceChannel:
    """A named channel (the trace's ``cat``)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"TraceChannel({self.name!r})"


def createTraceChannel(name: str) -> TraceChannel:  # noqa: N802
    return TraceChannel(name)


class Tracepoint:
    """``with Tracepoint(channel, "label"):`` records the body as one event."""

    def __init__(self, channel: TraceChannel, label: str):
        self._cm = _pvti.span(label, channel.name)

    def __enter__(self):
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)

    @staticmethod
    def event(channel: TraceChannel, label: str) -> None:
        _pvti.instant(label, channel.name)


class Series:
    """One line of a :class:`Graph`: ``add(value)`` records the value at the current host time."""

    def __init__(self, graph: "Graph", name: str):
        self.graph, self.name = graph, name

    def add(self, value) -> None:
        _pvti.counter(self.graph.name, self.name, float(value), self.graph.unit)

    def __repr__(self):
        return f"Series({self.graph.name!r}, {self.name!r})"


class Graph:
    """``libpvti.Graph(name, unit)``: values plotted against time in the System Analyser;
    ``addSeries(name)`` gives a :class:`Series` (counter events in the trace)."""

    def __init__(self, name: str, unit: str = ""):
        self.name, self.unit = name, unit

    def addSeries(self, name: str) -> Series:  # noqa: N802
        return Series(self, name)

    def __repr__(self):
        return f"Graph({self.name!r}, {self.unit!r})"


def instrument_fn(channel: TraceChannel):
    """Decorator: record each call of the function (label = its qualified name)."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            with _pvti.span(fn.__qualname__, channel.name):
                return fn(*a, **k)
        return wrapper
    return deco


def flush() -> None:
    """Write the trace now (it is also written at exit)."""
    _pvti.flush()
