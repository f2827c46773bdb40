"""PopTorch's exceptions (``poptorch.Error``, ``RecoverableError``, ``UnrecoverableError``, also
reachable as ``poptorch.poptorch_core.Error`` ...; ``research/poptorch.md`` 1.11).

An ``Error`` has ``message`` (the text alone), ``type`` (the part of the stack that raised it:
``poptorch_py_error`` for PopTorch's Python layer, ``poptorch_cpp_error`` for its compiler,
``popart_exception``, ``poplibs_exception``, ``poplar_<kind>`` ...) and ``location``; its string
is PopTorch's long message ``'<type>': <message>`` (PopTorch's C++ errors start with the source
file and line, which openipu has not got), followed by ``Recovery action required: <action>``
for a :class:`RecoverableError` and ``Error raised in:`` the location when there is one.
"""

from __future__ import annotations


class Error(Exception):
    """``poptorch.Error``: ``message``, ``type`` and ``location`` (module docstring)."""

    def __init__(self, message: str = "", type: str = "poptorch_py_error", location: str = ""):  # noqa: A002
        self.message, self.type, self.location = str(message), str(type), str(location)
        super().__init__(self._long_message())

    def _long_message(self) -> str:
        out = f"'{self.type}': {self.message}"
        if self.location:
            out += f"\nError raised in:\n{self.location}"
        return out


class RecoverableError(Error):
    """``poptorch.RecoverableError``: a transient runtime error; ``recovery_action`` is what
    recovers the device: ``IPU_RESET``, ``LINK_RESET``, ``PARTITION_RESET`` or ``FULL_RESET``."""

    def __init__(self, message: str = "", recovery_action: str = "IPU_RESET", **kw):
        self.recovery_action = str(recovery_action)
        super().__init__(message, **kw)

    def _long_message(self) -> str:
        out = f"'{self.type}': {self.message}\nRecovery action required: {self.recovery_action}"
        if self.location:
            out += f"\nError raised in:\n{self.location}"
        return out


class UnrecoverableError(Error):
    """``poptorch.UnrecoverableError``: a runtime error that persists (the system needs repair)."""


def createPoptorchError(msg: str) -> Error:  # noqa: N802 - PopTorch's name
    """An :class:`Error` of type ``poptorch_py_error`` whose string is
    ``'poptorch_py_error': <msg>`` (PopTorch's ``_impl.createPoptorchError``)."""
    return Error(msg)


def compiler_error(msg: str) -> Error:
    """An :class:`Error` raised where PopTorch's C++ compiler raises it (type
    ``poptorch_cpp_error``: "Couldn't find a loss in graph!", unsupported ops ...)."""
    return Error(msg, type="poptorch_cpp_error")


def from_popart(e: Exception) -> Error:
    """A PopART / PopLibs / Poplar exception as the :class:`Error` PopTorch raises for it
    (``rethrowPopartOrPoplarException``): recoverable Poplar runtime errors become
    :class:`RecoverableError` (with the recovery action), unrecoverable ones
    :class:`UnrecoverableError`; ``type`` is the exception's class name (``popart_exception``,
    ``poplar_recoverable_runtime_error`` ...)."""
    from openipu.popart import errors as pe
    name = type(e).__name__
    if isinstance(e, pe.poplar_recoverable_runtime_error):
        action = getattr(e, "recoveryAction", "IPU_RESET")
        return RecoverableError(str(e), recovery_action=str(getattr(action, "name", action)), type=name)
    if isinstance(e, pe.poplar_unrecoverable_runtime_error):
        return UnrecoverableError(str(e), type=name)
    if isinstance(e, pe.OutOfMemoryException):
        name = "poplar_graph_memory_allocation_error"
    return Error(str(e), type=name)
