"""PopTorch's logging (``poptorch/_logging.py``): the Python layer logs to ``poptorch::python``
(``poptorch.logger``) with PopTorch's line format ``[HH:MM:SS.mmm] [poptorch::python] [warning]
message`` on stderr; what PopTorch's C++ compiler logs ("Writing weights from host to IPU
memory." ...) goes to the ``poptorch`` logger. ``setLogLevel`` takes ``TRACE``, ``DEBUG``,
``INFO``, ``WARN``, ``ERR``, ``OFF`` or PopTorch's legacy integers 0 .. 6; the environment
variable ``POPTORCH_LOG_LEVEL`` sets the level at import (default ``WARN``)."""

from __future__ import annotations

import datetime as dt
import logging
import os

logger = logging.getLogger("poptorch::python")
#: the C++ side of PopTorch (its compiler's log lines)
cpp_logger = logging.getLogger("poptorch")

#: name -> (PopTorch's integer level, Python level)
_LEVELS = {"TRACE": (0, logging.DEBUG), "TRACE_ALL": (0, logging.DEBUG), "DEBUG": (1, logging.DEBUG),
           "DEBUG_IR": (1, logging.DEBUG), "INFO": (2, logging.INFO), "WARN": (3, logging.WARNING),
           "ERR": (4, logging.ERROR), "OFF": (6, logging.CRITICAL + 10)}
_PUBLIC = ("DEBUG", "ERR", "INFO", "OFF", "TRACE", "WARN")


def setLogLevel(level) -> None:  # noqa: N802
    """Set PopTorch's log level: a name (module docstring) or a legacy integer (0 TRACE,
    1 DEBUG, 2 INFO, 3 WARN, 4 ERR, 6 OFF). Raises ``ValueError`` ("Invalid log level integer",
    "Unknown log level: X. Valid values are DEBUG, ERR, INFO, OFF, TRACE and WARN")."""
    if isinstance(level, int) and not isinstance(level, bool):
        for name, (n, _) in _LEVELS.items():
            if n == level:
                return setLogLevel(name)
        if level == 5:       # PopTorch has no 5; openipu took it for CRITICAL before
            return setLogLevel("OFF")
        raise ValueError("Invalid log level integer")
    key = str(level).upper()
    if key not in _LEVELS:
        raise ValueError(f"Unknown log level: {level}. Valid values are {', '.join(_PUBLIC[:-1])} and {_PUBLIC[-1]}")
    py = _LEVELS[key][1]
    logger.setLevel(py)
    cpp_logger.setLevel(py)


class _Formatter(logging.Formatter):
    """``[HH:MM:SS.mmm] [poptorch::python] [info] message`` (PopTorch's, without colours)."""

    def __init__(self):
        super().__init__("[%(asctime)s] [%(name)s] [%(levelname)s] %(message)s")

    def formatTime(self, record, datefmt=None):  # noqa: N802
        ct = dt.datetime.fromtimestamp(record.created)
        return f"{ct.strftime('%H:%M:%S')}.{int(record.msecs):03d}"

    def format(self, record):
        record = logging.makeLogRecord(record.__dict__)
        record.levelname = record.levelname.lower()
        return super().format(record)


if not any(getattr(h, "_poptorch", False) for h in logger.handlers):
    _console = logging.StreamHandler()
    _console.setFormatter(_Formatter())
    _console._poptorch = True
    logger.addHandler(_console)
setLogLevel(os.environ.get("POPTORCH_LOG_LEVEL", "WARN"))
