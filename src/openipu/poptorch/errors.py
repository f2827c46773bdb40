"""PopTorch's exceptions (``poptorch.Error``, ``RecoverableError``, ``UnrecoverableError``;
``research/poptorch.md`` 1.11): an ``Error`` has ``message``, ``type`` and ``location``."""

from __future__ import annotations


class Error(Exception):
    """``poptorch.Error``: ``message`` (the text), ``type`` (``poptorch_py_error`` for errors
    raised in Python, else the PopART / Poplar error class), ``location`` (where it came from)."""

    def __init__(self, message: str, type: str = "poptorch_py_error", location: str = ""):  # noqa: A002
        super().__init__(message)
        self.message, self.type, self.location = message, type, location


class RecoverableError(Error):
    """``poptorch.RecoverableError``: the device can be recovered by ``recovery_action``."""

    def __init__(self, message: str, recovery_action: str = "IPU_RESET", **kw):
        super().__init__(message, **kw)
        self.recovery_action = recovery_action


class UnrecoverableError(Error):
    """``poptorch.UnrecoverableError``."""


def createPoptorchError(msg: str) -> Error:  # noqa: N802 - PopTorch's name
    """An :class:`Error` of type ``poptorch_py_error`` (PopTorch's ``createPoptorchError``)."""
    return Error(msg)


def from_popart(e: Exception) -> Error:
    """A PopART / Poplar exception as the :class:`Error` PopTorch raises for it."""
    return Error(str(e), type=type(e).__name__)
