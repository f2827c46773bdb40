"""A constant's value made when something first reads it (openipu's host bookkeeping).

A graph constant built from a model's weights (a PopLibs-blocked matmul weight, an embedding
table laid out for slicing) needs its values reordered into the variable's storage order only
when device storage is built or the graph is saved: an offline compile (prediction and memory
plan) never reads them. :class:`DeferredValue` holds the function that makes the flat storage
tensor and calls it once, on first :meth:`resolve`. Nothing here is a Poplar API.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class DeferredValue:
    """The flat value ``make()`` returns (``numel`` elements: a 1-D ``torch.Tensor`` of the
    variable's storage dtype, or, inside a graph's own wrappers, a numpy array that the graph
    converts), made on the first :meth:`resolve` and kept. ``make``
    must read only values its caller will not change afterwards (the IR's weights)."""

    __slots__ = ("_make", "_value", "numel")

    def __init__(self, make: Callable[[], torch.Tensor], numel: int):
        self._make = make
        self._value = None
        self.numel = int(numel)

    @property
    def resolved(self) -> bool:
        return self._value is not None

    def resolve(self) -> torch.Tensor:
        """The value (made now if not yet). Raises ``ValueError`` if ``make`` returned a tensor
        of another element count (a bug in the caller, not a user error)."""
        if self._value is None:
            v = self._make()
            if (v.numel() if isinstance(v, torch.Tensor) else v.size) != self.numel:
                raise ValueError(f"deferred constant value has {v.numel()} elements, expected {self.numel}")
            self._value, self._make = v, None
        return self._value


def resolve(init):
    """``init`` (a variable's ``init``: ``None``, a tensor or a :class:`DeferredValue`) as a tensor
    or ``None``."""
    return init.resolve() if isinstance(init, DeferredValue) else init
