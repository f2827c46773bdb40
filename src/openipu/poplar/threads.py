"""Host threading of the simulator's torch work (not an IPU figure: how this host runs kernels)."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_torch_thread():
    """Run the enclosed torch work on one host thread, restoring torch's thread count after it.

    Small kernels gain little from a second OpenMP thread, and when other work shares the host's
    cores each parallel region can wait a scheduler slice for it (measurements at the callers:
    :func:`openipu.poplibs.poplin.kernels.host_threads`, :func:`openipu.tensorflow._program.host_threads`).
    Results do not change: the kernels are the same, only torch's work split."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
