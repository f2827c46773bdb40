"""PopART's exception classes (``popart.popart_exception`` and friends).

PopART binds its C++ errors with ``py::exception``, so every class derives from ``Exception``
(not ``RuntimeError``). Hierarchy (``popart.cpp`` bindings, ``research/popart.md`` section 4)::

    popart_exception
        popart_internal_exception
        popart_runtime_error
        OutOfMemoryException          (Python class in PopART's session.py)
    poplibs_exception
    poplar_exception
        poplar_runtime_error
            poplar_application_runtime_error
            poplar_system_runtime_error
                poplar_recoverable_runtime_error   (.recoveryAction)
                poplar_unrecoverable_runtime_error
                poplar_unknown_runtime_error

Messages start with PopART's exact text where PopART has one; openipu may append a sentence
saying what to do.
"""

from __future__ import annotations


class popart_exception(Exception):  # noqa: N801 - PopART spelling
    """``popart::error``: bad model, options, API use or stepio data."""


class popart_internal_exception(popart_exception):  # noqa: N801
    """``popart::internal_error``: an inconsistency inside PopART (a bug)."""


class popart_runtime_error(popart_exception):  # noqa: N801
    """``popart::runtime_error``: raised by ``Session.run`` (e.g. wrong stepio buffer sizes)."""


class poplibs_exception(Exception):  # noqa: N801
    """``poplibs_support::poplibs_error`` seen through PopART."""


class poplar_exception(Exception):  # noqa: N801
    """``poplar::poplar_error`` seen through PopART; ``.error`` holds the openipu.poplar error."""

    def __init__(self, message, error=None):
        super().__init__(message)
        self.error = error


class poplar_runtime_error(poplar_exception):  # noqa: N801
    pass


class poplar_application_runtime_error(poplar_runtime_error):  # noqa: N801
    pass


class RecoveryAction:
    """``poplar::RecoveryAction`` (the binding's names)."""

    IPU_RESET = "IPU_RESET"
    LINK_RESET = "LINK_RESET"
    PARTITION_RESET = "PARTITION_RESET"
    FULL_RESET = "FULL_RESET"


class poplar_system_runtime_error(poplar_runtime_error):  # noqa: N801
    pass


class poplar_recoverable_runtime_error(poplar_system_runtime_error):  # noqa: N801
    recoveryAction = RecoveryAction.IPU_RESET


class poplar_unrecoverable_runtime_error(poplar_system_runtime_error):  # noqa: N801
    pass


class poplar_unknown_runtime_error(poplar_system_runtime_error):  # noqa: N801
    pass


class OutOfMemoryException(popart_exception):
    """Raised by ``prepareDevice`` when the graph does not fit in tile memory.

    ``getSummaryReport()`` gives the memory summary (PopART needs the engine option
    ``debug.allowOutOfMemory`` for it; openipu always has the memory plan), ``getProfilePath()``
    the profile directory written (``None`` unless ``autoReport`` options asked for one).
    ``.error`` is the underlying ``poplar.graph_memory_allocation_error``.
    """

    def __init__(self, error, summary: str = "", profile_path=None):
        super().__init__(str(error))
        self.error = error
        self._summary = summary
        self._profile_path = profile_path

    def getSummaryReport(self) -> str:  # noqa: N802
        return self._summary

    def getProfilePath(self):  # noqa: N802
        return self._profile_path


def _throw_popart_error(msg: str):
    raise popart_exception(msg)


def _throw_popart_internal_error(msg: str):
    raise popart_internal_exception(msg)


def _throw_popart_runtime_error(msg: str):
    raise popart_runtime_error(msg)


def _throw_poplar_error(msg: str):
    raise poplar_exception(msg)


def _throw_poplibs_error(msg: str):
    raise poplibs_exception(msg)


def _throw_application_runtime_error(msg: str):
    raise poplar_application_runtime_error(msg)
