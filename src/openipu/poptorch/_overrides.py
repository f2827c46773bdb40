"""Substitution managers entered around capture (PopTorch's
``_poplar_executor._OverwriteContextManager``): a library registers a class whose ``replace()``
swaps functions for IPU-friendly (static-shape) versions and whose ``restore()`` undoes it; the
swap holds only while ``poptorch`` captures a model, so eager CPU calls run the stock code.
``poptorch_geometric`` registers its PyG substitutions here."""

from __future__ import annotations

import contextlib


class _OverwriteContextManager:
    """The registered manager classes; ``with _OverwriteContextManager():`` enters them all."""

    _subsitution_manager_types: list = []

    @classmethod
    def registerSubsitutionManager(cls, manager_type) -> None:  # noqa: N802  (PopTorch's spelling)
        """Register ``manager_type`` (a class with ``replace()`` and ``restore()``) once."""
        if manager_type not in cls._subsitution_manager_types:
            cls._subsitution_manager_types.append(manager_type)

    def __enter__(self):
        self._managers = []
        try:
            for t in self._subsitution_manager_types:
                m = t()
                m.replace()
                self._managers.append(m)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for m in reversed(self._managers):
            m.restore()
        self._managers = []
        return False


def substitutions():
    """A context manager applying the registered substitutions (a no-op when none is)."""
    if not _OverwriteContextManager._subsitution_manager_types:
        return contextlib.nullcontext()
    return _OverwriteContextManager()
