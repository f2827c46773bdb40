"""``poptorch.poptorch_core``: the names PopTorch's C++ extension module gives Python, the ones
PopTorch programs use directly (``research/poptorch.md`` 1.1, 1.11).

- the exception classes :class:`Error`, :class:`RecoverableError`, :class:`UnrecoverableError`
  (``pytest.raises(poptorch.poptorch_core.Error, match=...)`` is the usual spelling);
- :class:`TestErrorType` and :func:`_throwTestError`, which raise one error of each kind the
  stack can raise, with PopTorch's texts, types and recovery action;
- :func:`isCompilingWithDispatcher` (True while a model is being captured), :class:`TracingMode`;
- :func:`importPoptorchMetadataFromFile`, :func:`ipuHardwareVersion`, :func:`setLogLevel`,
  :func:`_getPopartIR`, :func:`_getTensorNames`, :func:`getIpuTensorId`,
  :func:`isGraphNondeterministic`, :func:`cycleCount`.

In PopTorch these are bindings of C++ functions; here they are Python over openipu's compiler.
"""

from __future__ import annotations

import enum

from openipu.poptorch.errors import Error, RecoverableError, UnrecoverableError  # noqa: F401


class TestErrorType(enum.IntEnum):
    """The kinds of error :func:`_throwTestError` raises (PopTorch's ``TestErrorType``)."""

    __test__ = False        # not a pytest test class

    Poptorch = 0
    Popart = 1
    PopartInternal = 2
    Poplibs = 3
    PoplarUnrecoverable = 4
    PoplarUnknown = 5
    PoplarRecoverableFullReset = 6
    PoplarLinkError = 7


class TracingMode(enum.IntEnum):
    """``poptorch_core.TracingMode``: PopTorch 3.x traces for PopART only."""

    PopART = 0


_TEST_LOCATION = "throwTestError::topLevel\n throwTestError::bottomLevel"


def _throwTestError(error_type: TestErrorType) -> None:  # noqa: N802
    """Raise the error PopTorch's ``throwTestError`` raises for ``error_type``: an
    :class:`Error` (``poptorch_cpp_error`` "This is a PopTorch error", ``popart_exception`` /
    ``popart_internal_exception`` "This is a Popart error", ``poplibs_exception`` "This is a
    Poplibs error", ``poplar_unknown_runtime_error`` "Don't know what happened",
    ``poplar_link_error`` "Link error. Output: ..."), an :class:`UnrecoverableError`
    (``poplar_unrecoverable_runtime_error`` "This is not recoverable") or a
    :class:`RecoverableError` (``poplar_recoverable_runtime_error`` "Reboot needed",
    ``recovery_action`` ``FULL_RESET``). Raises ``ValueError`` for another value."""
    t = TestErrorType(int(error_type))
    loc = _TEST_LOCATION
    if t == TestErrorType.Poptorch:
        raise Error("This is a PopTorch error", type="poptorch_cpp_error", location=loc)
    if t == TestErrorType.Popart:
        raise Error("This is a Popart error", type="popart_exception", location=loc)
    if t == TestErrorType.PopartInternal:
        raise Error("This is a Popart error", type="popart_internal_exception", location=loc)
    if t == TestErrorType.Poplibs:
        raise Error("This is a Poplibs error", type="poplibs_exception", location=loc)
    if t == TestErrorType.PoplarUnrecoverable:
        raise UnrecoverableError("This is not recoverable", type="poplar_unrecoverable_runtime_error", location=loc)
    if t == TestErrorType.PoplarUnknown:
        raise Error("Don't know what happened", type="poplar_unknown_runtime_error", location=loc)
    if t == TestErrorType.PoplarRecoverableFullReset:
        raise RecoverableError("Reboot needed", recovery_action="FULL_RESET", type="poplar_recoverable_runtime_error",
                               location=loc)
    raise Error("Link error. Output: Library -lfoo not found\ncheck path", type="poplar_link_error", location=loc)


def isCompilingWithDispatcher() -> bool:  # noqa: N802
    """True while a model is being captured for the IPU (PopTorch: while the dispatcher traces)."""
    from openipu.poptorch import _impl
    return _impl.isDispatchTracing()


def importPoptorchMetadataFromFile(filename: str) -> dict:  # noqa: N802
    """The metadata saved with a PopTorch executable (``PoplarExecutor.save`` /
    ``compileAndExport``): a dict (openipu's safe format holds JSON, not PopTorch's pickle).
    Raises :class:`Error` for a file that is not such an executable."""
    from openipu.poptorch import export
    meta, _, _ = export.read(filename)
    return meta


def ipuHardwareVersion() -> int:  # noqa: N802
    """The simulated IPU's generation: 2."""
    return 2


def setLogLevel(level: int) -> None:  # noqa: N802
    """PopTorch's C++ log level (0 = TRACE .. 6 = OFF): the ``poptorch`` logger's level."""
    from openipu.poptorch import setLogLevel as _set
    _set(int(level))


def _getPopartIR(executor) -> str:  # noqa: N802
    """The PopART IR of ``executor``'s compiled model, as JSON text (``PoplarExecutor._debugGetPopartIR``)."""
    return executor._debugGetPopartIR()


def _getTensorNames(executor) -> list:  # noqa: N802
    """The PopART tensor ids of ``executor``'s compiled model."""
    return executor.getTensorNames()


def cycleCount(executor) -> int:  # noqa: N802
    """Predicted cycles of ``executor``'s last run (``logCycleCount`` on)."""
    return executor.cycleCount()


def isGraphNondeterministic(executor) -> bool:  # noqa: N802
    """Whether the compiled model has random ops (dropout, rand ...)."""
    s = executor._session
    return s is not None and s._ir.random_seed is not None


def getIpuTensorId(tensor) -> int:  # noqa: N802
    """PopTorch's id of an IPU tensor. openipu captures with fake tensors, so there is no IPU
    tensor on the host: raises :class:`Error`."""
    raise Error("getIpuTensorId: only IPU tensors (inside a model being traced) have an id; openipu traces with "
                "torch.export and keeps no IPU tensors")
