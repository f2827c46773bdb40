"""``poptorch._impl``: the internal helpers scripts import: ``isRunningOnIpu`` /
``setIpuContext``, ``isDispatchTracing`` / ``setDispatchTracing``, ``createPoptorchError``,
``unwrapModelIfNecessary`` / ``rewrapModelIfNecessary`` (optimum-graphcore), ``isWrapped``,
``forEachParameterAndBuffer``.

PopTorch swaps the classes of a training model's parameters and buffers (``PoptorchParameter``,
``PoptorchBuffer``) so that reading them copies the weights back from the IPU; the unwrap /
rewrap functions take the swap off and put it back (around ``copy.deepcopy`` or pickling).
openipu copies the weights back into the module after every training call instead, so it swaps
no class and both functions leave the model as it is."""

from __future__ import annotations

import torch

from openipu.poptorch.errors import createPoptorchError  # noqa: F401
from openipu.poptorch.ops import _running_on_ipu, isRunningOnIpu  # noqa: F401

_dispatch_tracing = [False]


def setIpuContext(val: bool) -> None:  # noqa: N802
    """Set what :func:`isRunningOnIpu` returns (the executor sets it while capturing)."""
    _running_on_ipu[0] = bool(val)


def isDispatchTracing() -> bool:  # noqa: N802
    """True while a model is being captured for the IPU (PopTorch: inside the IPU scope)."""
    return _dispatch_tracing[0]


def setDispatchTracing(val: bool) -> None:  # noqa: N802
    _dispatch_tracing[0] = bool(val)


def unwrapModelIfNecessary(model: torch.nn.Module) -> None:  # noqa: N802
    """No-op in openipu (see the module docstring)."""


def rewrapModelIfNecessary(model: torch.nn.Module) -> None:  # noqa: N802
    """No-op in openipu (see the module docstring)."""


def isWrapped(model) -> bool:  # noqa: N802
    """Whether ``model`` is owned by a live ``trainingModel`` wrapper."""
    from openipu.poptorch.executor import _TRAINING_WRAPPERS
    ref = _TRAINING_WRAPPERS.get(model)
    return ref is not None and ref() is not None


def forEachParameterAndBuffer(model: torch.nn.Module, fn) -> None:  # noqa: N802
    """``fn(name, tensor)`` for every named buffer, then every named parameter of ``model``."""
    for name, b in model.named_buffers():
        fn(name, b)
    for name, p in model.named_parameters():
        fn(name, p)
