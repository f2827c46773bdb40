"""The torch device the IR executor (:mod:`openipu.popart.execute`) runs its kernels on.

``OPENIPU_TORCH_DEVICE``:

- ``cpu`` (the default): the host CPU;
- ``cuda`` / ``cuda:N``: a CUDA GPU (``torch.cuda``); the executor keeps the session's variables
  (weights, optimizer state, random seed) and every intermediate tensor there, and converts once
  at the host boundaries (``PyStepIO`` buffers, anchors, ``weightsToHost`` / ``readWeights``,
  PopTorch's inputs and outputs, PrintTensor);
- ``auto``: ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``.

An openipu extension (Graphcore's stack has no such setting: on an IPU the program runs on the
IPU). The device changes where the simulator computes the IPU's outputs, not the outputs (within
floating-point tolerance: GPU kernels may sum in another order) nor the predicted IPU figures,
which come from the compiled program. The device-storage emulation
(``OPENIPU_EXECUTION=device``, the verifying mode) always runs on the CPU.
"""

from __future__ import annotations

import os

import torch

from openipu.popart.errors import popart_exception

#: the environment variable naming the IR executor's torch device
ENV = "OPENIPU_TORCH_DEVICE"

_CPU = torch.device("cpu")


def resolve(value: str | None = None) -> torch.device:
    """The IR executor's torch device from ``value`` (default: ``$OPENIPU_TORCH_DEVICE``, unset
    or empty meaning ``cpu``): ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.

    Raises ``popart_exception`` for another value, and for ``cuda`` / ``cuda:N`` when torch sees
    no CUDA device (a CPU-only torch build, no driver, no GPU) or fewer than ``N + 1``."""
    raw = os.environ.get(ENV, "") if value is None else str(value)
    name = raw.strip().lower() or "cpu"
    if name == "cpu":
        return _CPU
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else _CPU
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type != "cuda":
        raise popart_exception(f"{ENV} must be 'cpu', 'cuda', 'cuda:N' or 'auto', not {raw!r}")
    if not torch.cuda.is_available():
        raise popart_exception(f"{ENV}={raw!r} asks for a CUDA device, but torch sees none "
                               f"(torch {torch.__version__}, built with CUDA {torch.version.cuda or 'no'}); "
                               "set it to 'cpu' or 'auto'")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise popart_exception(f"{ENV}={raw!r} asks for CUDA device {dev.index}, but torch sees {count} "
                               f"(cuda:0 to cuda:{count - 1})")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU (itself when it is there already): the one copy a host boundary makes."""
    return t if t.device.type == "cpu" else t.cpu()


def misplaced(tensors, device: torch.device) -> list[str]:
    """The names of the tensors of ``tensors`` (an iterable of ``(name, tensor)``) that are not on
    ``device`` (``cuda`` without an index matches any CUDA device)."""
    out = []
    for name, t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if t.device.type != device.type or (device.index is not None and t.device.index not in (None, device.index)):
            out.append(f"{name} ({t.device})")
    return out
