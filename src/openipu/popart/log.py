"""PopART's logging: ``popart.getLogger(name="all")`` and the ``POPART_LOG_*`` variables.

Environment (as PopART): ``POPART_LOG_LEVEL`` (TRACE, DEBUG, INFO, WARN, ERR, CRITICAL, OFF;
default OFF), ``POPART_LOG_DEST`` (``stderr`` default, ``stdout`` or a file name),
``POPART_LOG_CONFIG`` (a JSON file mapping module names to levels). Lines look like PopART's:
``HH:MM:SS.mmm popart:<module> <pid>.<tid> <L>: message``. Modules: popart, session, ir, devicex,
transform, pattern, builder, op, opx, ces, python, none.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

MODULES = ("popart", "session", "ir", "devicex", "transform", "pattern", "builder", "op", "opx", "ces",
           "python", "none")
_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERR": logging.ERROR, "CRITICAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}
_LETTER = {5: "T", logging.DEBUG: "D", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E",
           logging.CRITICAL: "C"}
logging.addLevelName(5, "TRACE")


class _Formatter(logging.Formatter):
    def format(self, record):
        t = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        module = record.name.split(".")[-1]
        return (f"{t} popart:{module} {os.getpid()}.{threading.get_native_id()} "
                f"{_LETTER.get(record.levelno, 'I')}: {record.getMessage()}")


class _StdHandler(logging.StreamHandler):
    """A handler writing to ``sys.stdout`` / ``sys.stderr`` as they are when a message is
    emitted (not when the handler was made: a redirected or captured stream then still gets it)."""

    def __init__(self, name: str):
        super().__init__()
        self._name = name

    @property
    def stream(self):
        return getattr(sys, self._name)

    @stream.setter
    def stream(self, value):
        pass


_configured: dict[str, tuple] = {}
#: levels set with ``Logger.setLevel``, with the environment they were set in: they hold until
#: set again or until the ``POPART_LOG_*`` environment changes
_user_levels: dict[str, tuple] = {}


def _env_level(module: str) -> str:
    cfg = os.environ.get("POPART_LOG_CONFIG")
    if cfg:
        try:
            with open(cfg) as f:
                levels = json.load(f)
            if module in levels:
                return str(levels[module])
        except (OSError, ValueError):
            pass
    return os.environ.get("POPART_LOG_LEVEL", "OFF")


def _logger(module: str) -> logging.Logger:
    name = f"openipu.popart.{module}"
    lg = logging.getLogger(name)
    key = (_env_level(module), os.environ.get("POPART_LOG_DEST", "stderr"))
    if _configured.get(name) != key:
        for h in list(lg.handlers):
            lg.removeHandler(h)
        dest = key[1]
        h = _StdHandler(dest) if dest in ("stdout", "stderr") else logging.FileHandler(dest)
        h.setFormatter(_Formatter())
        lg.addHandler(h)
        lg.propagate = False
        _configured[name] = key
    user = _user_levels.get(name)
    if user is not None and user[1] != key:
        del _user_levels[name]          # the environment changed since: it decides again
        user = None
    lg.setLevel(user[0] if user is not None else _LEVELS.get(key[0].upper(), _LEVELS["OFF"]))
    return lg


class Logger:
    """``popart.Logger``: ``setLevel(level)``, ``debug/info/warn/error/critical(msg)``."""

    def __init__(self, name: str = "all"):
        self.name = name

    def _targets(self):
        return [_logger(m) for m in MODULES] if self.name == "all" else [_logger(self.name)]

    def setLevel(self, level: str) -> None:  # noqa: N802
        lv = _LEVELS.get(str(level).upper())
        if lv is None:
            raise ValueError(f"Unknown log level '{level}': use one of {', '.join(_LEVELS)}")
        for lg in self._targets():
            _user_levels[lg.name] = (lv, _configured.get(lg.name))
            lg.setLevel(lv)

    def _emit(self, lv, msg):
        _logger("python" if self.name == "all" else self.name).log(lv, msg)

    def trace(self, msg): self._emit(5, msg)  # noqa: E704
    def debug(self, msg): self._emit(logging.DEBUG, msg)  # noqa: E704
    def info(self, msg): self._emit(logging.INFO, msg)  # noqa: E704
    def warn(self, msg): self._emit(logging.WARNING, msg)  # noqa: E704
    def error(self, msg): self._emit(logging.ERROR, msg)  # noqa: E704
    def critical(self, msg): self._emit(logging.CRITICAL, msg)  # noqa: E704


def getLogger(name: str = "all") -> Logger:  # noqa: N802
    """``popart.getLogger(name="all")``: a :class:`Logger` for one module or all of them."""
    if name != "all" and name not in MODULES:
        raise ValueError(f"Unknown PopART log module '{name}': use 'all' or one of {', '.join(MODULES)}")
    return Logger(name)


def log(module: str) -> logging.Logger:
    """The Python logger openipu's PopART code writes to for ``module``."""
    return _logger(module)
