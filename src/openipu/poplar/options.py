"""Option flags (``poplar::OptionFlags``), ``POPLAR_ENGINE_OPTIONS`` and Poplar-style logging."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from openipu.poplar import errors

#: Engine options openipu knows, with defaults. Unknown options raise ``invalid_option``.
ENGINE_OPTIONS = {
    "autoReport.all": "false",
    "autoReport.directory": "./",
    "autoReport.outputGraphProfile": "false",
    "autoReport.outputExecutionProfile": "false",
    "autoReport.outputLoweredVars": "false",
    "autoReport.outputSerializedGraph": "false",
    "autoReport.outputDebugInfo": "false",
    "autoReport.outputArchive": "false",
    "autoReport.executionProfileProgramRunCount": "2",
    "autoReport.streamAtEachRun": "true",
    "debug.allowOutOfMemory": "false",
    "debug.retainDebugInformation": "true",
    "debug.instrument": "false",
    "debug.instrumentCompute": "false",
    "debug.instrumentExternalExchange": "false",
    "debug.instrumentControlFlow": "false",
    "debug.computeInstrumentationLevel": "tile",
    "debug.outputAllSymbols": "false",
    "debug.verify": "false",
    "debug.checkForNaN": "false",
    "opt.maxCompilationThreads": "0",
    "opt.enableInlining": "true",
    "profiler.includeFlopEstimates": "false",
    "profiler.includeCycleEstimates": "true",
    "profiler.perExecutionStreamCopyCycles": "false",
    "target.saveArchive": "",
    "target.syncReplicasIndependently": "false",
    "target.deterministicWorkers": "true",
    "exchange.enablePrefetch": "true",
    "exchange.streamBufferOverlap": "hostRearrangeOnly",
}


class OptionFlags(dict):
    """``poplar::OptionFlags``: string keys and string values (booleans as ``"true"``)."""

    def __init__(self, items=None):
        super().__init__()
        for k, v in dict(items or {}).items():
            self.set(k, v)

    def set(self, key: str, value) -> None:
        if isinstance(value, bool):
            value = "true" if value else "false"
        self[str(key)] = str(value)

    def get_bool(self, key: str, default: bool = False) -> bool:
        v = self.get(key)
        return default if v is None else v.lower() in ("true", "1", "yes", "on")


def engine_options(code_options=None) -> OptionFlags:
    """Defaults, then options from code, then ``POPLAR_ENGINE_OPTIONS`` (which overrides code).

    Raises:
        poplar.parse_error: ``POPLAR_ENGINE_OPTIONS`` is not a JSON object.
        poplar.invalid_option: an option name openipu does not know.
    """
    opts = OptionFlags(ENGINE_OPTIONS)
    env = os.environ.get("POPLAR_ENGINE_OPTIONS")
    env_opts = {}
    if env:
        try:
            env_opts = json.loads(env)
        except json.JSONDecodeError as e:
            raise errors.parse_error(f"POPLAR_ENGINE_OPTIONS is not valid JSON: {e}") from None
        if not isinstance(env_opts, dict):
            raise errors.parse_error("POPLAR_ENGINE_OPTIONS must be a JSON object of option names to values")
    for source in (dict(code_options or {}), env_opts):
        for k, v in source.items():
            if k not in ENGINE_OPTIONS and not k.startswith(("profiler.", "autoReport.", "debug.", "opt.", "target.")):
                raise errors.invalid_option(f"Unrecognised option '{k}'")
            opts.set(k, v)
    if opts.get_bool("autoReport.all"):
        for k in ("autoReport.outputGraphProfile", "autoReport.outputExecutionProfile"):
            if k not in dict(code_options or {}) and k not in env_opts:
                opts.set(k, "true")
    return opts


# -- logging ----------------------------------------------------------------------------------
_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERR": logging.ERROR, "OFF": logging.CRITICAL + 10}
_LETTER = {5: "T", logging.DEBUG: "D", logging.INFO: "I", logging.WARNING: "W", logging.ERROR: "E"}
logging.addLevelName(5, "TRACE")


class _PoplarFormatter(logging.Formatter):
    def format(self, record):
        t = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        module = record.name.split(".")[-1].upper()
        return f"{t} {os.getpid()} PO:{module} [{_LETTER.get(record.levelno, 'I')}] {record.getMessage()}"


_configured: dict[str, tuple] = {}


def get_logger(module: str = "engine") -> logging.Logger:
    """A logger for a Poplar module that honours ``POPLAR_LOG_LEVEL`` / ``POPLAR_LOG_DEST``
    (and ``POPLAR_<MODULE>_LOG_LEVEL``). Levels: TRACE, DEBUG, INFO, WARN, ERR, OFF (default OFF);
    destinations: ``stderr`` (default), ``stdout`` or a file name."""
    name = f"openipu.poplar.{module}"
    level_name = os.environ.get(f"POPLAR_{module.upper()}_LOG_LEVEL") or os.environ.get("POPLAR_LOG_LEVEL", "OFF")
    dest = os.environ.get("POPLAR_LOG_DEST", "stderr")
    logger = logging.getLogger(name)
    key = (level_name, dest)
    if _configured.get(name) != key:
        for h in list(logger.handlers):
            logger.removeHandler(h)
        if dest == "stdout":
            h = logging.StreamHandler(sys.stdout)
        elif dest == "stderr":
            h = logging.StreamHandler(sys.stderr)
        else:
            h = logging.FileHandler(dest)
        h.setFormatter(_PoplarFormatter())
        logger.addHandler(h)
        logger.propagate = False
        logger.setLevel(_LEVELS.get(level_name.upper(), logging.CRITICAL + 10))
        _configured[name] = key
    return logger
