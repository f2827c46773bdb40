"""Host memory of the simulator's own process: bound what the C allocator keeps after a run.

The functional run allocates and frees many torch / numpy temporaries of 0.1-32 MB (activations
read from the device storage, kernel results). glibc's malloc raises its mmap threshold each
time such a block is freed (up to 32 MB), after which blocks of those sizes come from its heaps
and per-thread arenas; interleaved with long-lived small allocations (access plans, caches) the
heaps fragment and are not given back. Measured on BERT (2-4 layers, 8 x 384, fp32, this
host): the run's peak host RSS is 1.8-1.9 GB above what the run holds. A fixed threshold of
4 MB (what ``MALLOC_MMAP_THRESHOLD_=4194304`` does) returns every larger block to the OS when
it is freed.

:meth:`openipu.poplar.Engine.load` applies it before it allocates the device storage, so every
front end that runs programs (PopART sessions, PopTorch, PopRT's ``Runner``, ``openipu run``)
gets it. It lives in the Poplar layer because the engine is its only caller.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: glibc's mallopt parameter number of M_MMAP_THRESHOLD (malloc.h)
_M_MMAP_THRESHOLD = -3
#: blocks from this size (bytes) are mmapped and unmapped when freed
MMAP_THRESHOLD = 4 << 20
_applied: bool | None = None


def user_set_threshold(environ=None) -> bool:
    """Whether the user fixed glibc's mmap threshold (M_MMAP_THRESHOLD) for this process: with
    the ``MALLOC_MMAP_THRESHOLD_`` variable or the ``glibc.malloc.mmap_threshold`` tunable of
    ``GLIBC_TUNABLES``. ``environ`` defaults to :data:`os.environ`."""
    env = os.environ if environ is None else environ
    return "MALLOC_MMAP_THRESHOLD_" in env or "glibc.malloc.mmap_threshold" in env.get("GLIBC_TUNABLES", "")


def bound_heap_retention(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process.

    Applied once per process (later calls return the first call's answer); a no-op when the user
    set the threshold (:func:`user_set_threshold`) or the C library is not glibc on Linux.
    Returns whether the threshold is in effect. Affects host memory and allocation speed only,
    never results."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux") or user_set_threshold():
        return _applied
    try:
        libc = ctypes.CDLL("libc.so.6")
        _applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        pass
    return _applied
