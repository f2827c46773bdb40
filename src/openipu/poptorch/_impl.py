"""``poptorch._impl``: the internal helpers scripts import (optimum-graphcore imports
``rewrapModelIfNecessary`` / ``unwrapModelIfNecessary``).

PopTorch swaps the classes of a training model's parameters and buffers (``PoptorchParameter``,
``PoptorchBuffer``) so that reading them copies the weights back from the IPU; these functions
take the swap off and put it back (around ``copy.deepcopy`` or pickling). openipu copies the
weights back into the module after every training call instead, so it swaps no class and both
functions leave the model as it is."""

from __future__ import annotations

import torch

from openipu.poptorch.errors import createPoptorchError  # noqa: F401
from openipu.poptorch.ops import isRunningOnIpu  # noqa: F401


def unwrapModelIfNecessary(model: torch.nn.Module) -> None:  # noqa: N802
    """No-op in openipu (see the module docstring)."""


def rewrapModelIfNecessary(model: torch.nn.Module) -> None:  # noqa: N802
    """No-op in openipu (see the module docstring)."""


def isWrapped(model) -> bool:  # noqa: N802
    """Whether ``model`` is owned by a live ``trainingModel`` wrapper."""
    from openipu.poptorch.executor import _TRAINING_WRAPPERS
    ref = _TRAINING_WRAPPERS.get(model)
    return ref is not None and ref() is not None
