"""The hardware RNG state of a session (``getRNGState`` / ``setRNGState``), PopART's API for
saving and restoring the generators that drive stochastic rounding.

PopART needs ``SessionOptions.enableLoadAndOffloadRNGState``, else it raises its
``popart_runtime_error`` "Trying to get (set) the RNG state, but the session option
enableLoadAndOffloadRNGState must be set to True."; the state is 4 x uint32 per worker context
(6) per tile, for every IPU of every replica. ``setRandomSeed`` derives a new state from the
seed, so ``seed = s0.getRandomSeed(); state = s0.getRNGState()`` then
``s1.setRandomSeed(seed); s1.setRNGState(state)`` restores a session's random state (PopART's
documented order). [A] openipu's simulated stochastic rounding does not consume this state: it
is held, derived from the seed and returned exactly as set.
"""

from __future__ import annotations

import numpy as np

from openipu.popart.errors import popart_runtime_error

WORDS_PER_WORKER = 4
WORKERS = 6


def size(num_ipus: int, tiles_per_ipu: int, replicas: int) -> int:
    """uint32 words of the state of ``replicas`` replicas of ``num_ipus`` IPUs each."""
    return WORDS_PER_WORKER * WORKERS * tiles_per_ipu * num_ipus * replicas


def from_seed(seed: int, n: int) -> np.ndarray:
    """The state ``setRandomSeed(seed)`` derives: ``n`` uint32 words."""
    return np.random.default_rng(int(seed) & ((1 << 64) - 1)).integers(0, 1 << 32, n, dtype=np.uint64)\
        .astype(np.uint32)


def check_enabled(options, what: str) -> None:
    """PopART's check (``what``: "get" or "set"). Raises ``popart_runtime_error``."""
    if not options.enableLoadAndOffloadRNGState:
        raise popart_runtime_error(f"Trying to {what} the RNG state, but the session option "
                                   "enableLoadAndOffloadRNGState must be set to True.")


class RngStateApi:
    """``getRNGState`` / ``setRNGState`` of a session (mixed into PopART's session classes;
    reads ``options``, ``deviceInfo``, ``replicationFactor`` and ``_engine``)."""

    def getRNGState(self) -> list[int]:  # noqa: N802
        """The hardware RNG state (uint32 words, :mod:`openipu.popart.rng_state`); needs
        ``enableLoadAndOffloadRNGState`` and ``prepareDevice()``."""
        check_enabled(self.options, "get")
        if self._engine is None:
            raise popart_runtime_error("Devicex::prepare() must be called before Devicex::getRngStateToHost is "
                                       "called.")
        return [int(v) for v in self._rng()]

    def setRNGState(self, rngValue) -> None:  # noqa: N802,N803
        """Set the hardware RNG state from ``getRNGState``'s words (same count)."""
        check_enabled(self.options, "set")
        if self._engine is None:
            raise popart_runtime_error("Devicex::prepare() must be called before Devicex::setRngStateFromHost is "
                                       "called.")
        v = np.asarray(rngValue, np.uint64).reshape(-1)
        if v.size != self._rng().size:
            raise popart_runtime_error(f"setRNGState: {v.size} values given, but the RNG state has "
                                       f"{self._rng().size} (4 per worker, 6 workers per tile, per IPU and replica)")
        self._rng_words = v.astype(np.uint32)

    def _rng(self) -> np.ndarray:
        if getattr(self, "_rng_words", None) is None:
            n = size(self.deviceInfo.numIpus // max(1, self.replicationFactor) or 1,
                               self.deviceInfo.tilesPerIPU, self.replicationFactor)
            self._rng_words = from_seed(0, n)
        return self._rng_words
