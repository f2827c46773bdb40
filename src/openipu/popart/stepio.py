"""``popart.PyStepIO``, ``popart.PyStepIOCallback`` and ``popart.PyWeightsIO``.

``PyStepIO(inputs, outputs)`` maps tensor ids to numpy arrays. Arrays must be C-contiguous; only
their element count and dtype are checked (never their shape), as in PopART: input data is read
row-major as ``[batchesPerStep, accumulationFactor, replicas, *tensor shape]``.
"""

from __future__ import annotations

import numpy as np

from openipu.popart.errors import popart_exception


class PyStepIO:
    """Host buffers for one ``session.run``: ``{id: ndarray}`` for inputs and for anchors."""

    def __init__(self, inputs: dict, outputs: dict):
        self.inputs = dict(inputs)
        self.outputs = dict(outputs)
        self._runtime_asserts = True

    def enableRuntimeAsserts(self, enable: bool) -> None:  # noqa: N802
        """Turn the element-count check on or off (default on)."""
        self._runtime_asserts = bool(enable)


class PyStepIOCallback:
    """Callbacks instead of arrays: ``input_callback(id, prefetch) -> ndarray`` (``None`` when
    prefetching means "no data yet"), ``input_complete_callback(id)``,
    ``output_callback(id) -> ndarray`` to fill, ``output_complete_callback(id)``."""

    def __init__(self, input_callback, input_complete_callback, output_callback, output_complete_callback):
        self.input_callback = input_callback
        self.input_complete_callback = input_complete_callback
        self.output_callback = output_callback
        self.output_complete_callback = output_complete_callback
        self._runtime_asserts = False

    def enableRuntimeAsserts(self, enable: bool) -> None:  # noqa: N802
        self._runtime_asserts = bool(enable)


class PyWeightsIO:
    """``PyWeightsIO({id: ndarray})`` for ``session.readWeights`` / ``writeWeights``."""

    def __init__(self, weights: dict):
        self.weights = dict(weights)

    def contains(self, tid: str) -> bool:
        return tid in self.weights

    def weight(self, tid: str) -> np.ndarray:
        if tid not in self.weights:
            raise popart_exception(f"No tensor {tid} provided in PyWeightsIO")
        return self.weights[tid]
