"""``poptorch.profiling``: PopTorch's trace channels for the PopVision System Analyser
(``Channel(name).tracepoint(label)`` around host code, ``instrument(obj, *methods)``). They
record into openipu's host trace (``libpvti``, written when ``PVTI_OPTIONS`` enables it, as
PopTorch's are); without ``PVTI_OPTIONS`` they do nothing, as in PopTorch."""

from __future__ import annotations

import contextlib
import functools
import os


def _enabled() -> bool:
    return os.environ.get("PVTI_OPTIONS") is not None


class Channel:
    """A named trace channel (PopTorch's ``poptorch.profiling.Channel``)."""

    def __init__(self, name: str):
        self._name = str(name)
        self._channel = None
        if _enabled():
            import libpvti
            self._channel = libpvti.createTraceChannel(self._name)

    def tracepoint(self, name: str):
        """A context manager: the code inside is one ``<channel>.<name>`` span of the trace."""
        if self._channel is None:
            return contextlib.nullcontext()
        import libpvti
        return libpvti.Tracepoint(self._channel, f"{self._name}.{name}")

    def instrument(self, obj, *methods: str):
        """Wrap each method ``methods`` of ``obj`` in a tracepoint named after it; returns ``obj``."""
        if self._channel is None:
            return obj
        for m in methods:
            fn = getattr(obj, m)

            @functools.wraps(fn)
            def wrapper(*args, _fn=fn, _m=m, **kwargs):
                with self.tracepoint(_m):
                    return _fn(*args, **kwargs)
            setattr(obj, m, wrapper)
        return obj
