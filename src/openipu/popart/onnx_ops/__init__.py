"""Host kernels for ONNX operators: ``kernel(inputs, attrs, opset) -> outputs`` on torch tensors.

These are the functional definitions the PopART lowering runs inside vertex groups (and constant
folding runs on the host). One op family per module; each module registers its ops with
:func:`onnx_op` when imported, and :func:`get_kernel` imports them all on first use.

A kernel receives:

- ``inputs``: list of ``torch.Tensor`` (``None`` for an omitted optional input), without a
  replica dimension;
- ``attrs``: dict of the node's attributes, decoded (ints, floats, strings as ``str``, lists,
  tensors as ``torch.Tensor``, graphs as ``onnx.GraphProto``), defaults *not* filled in; plus
  ``attrs["__num_outputs__"]``: the node's output count including empty optional names (callers
  set it; ``Split`` without ``split``/``num_outputs`` needs it, and kernels with optional outputs,
  e.g. Dropout's mask or MaxPool's indices, may skip work when it is smaller). Control-flow kernels
  (If, Loop, Scan) also read ``attrs["__opsets__"]`` (domain -> version for the subgraphs) and
  ``attrs["__outer__"]`` (name -> tensor of the enclosing scope), which :mod:`._reference` sets;
- ``opset``: the model's opset version for the op's domain (semantics that changed between
  versions, e.g. ``Split``'s ``split`` attribute becoming an input in opset 13, branch on it);

and returns a list of output tensors (one per node output, in order). Kernels raise
``OnnxKernelError`` (a ``ValueError``) for attribute values they do not support.

``flops(in_shapes, out_shapes, attrs)`` (optional, per registration) estimates floating-point
operations for the cost model of the generic lowering; by default, one per output element.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

_REGISTRY: dict[tuple[str, str], "OpKernel"] = {}
_LOADED = False


class OnnxKernelError(ValueError):
    """An ONNX node this kernel cannot run (unsupported attribute value or input kind)."""


@dataclass(frozen=True)
class OpKernel:
    """One ONNX operator's host kernel and cost hint."""

    domain: str
    op_type: str
    fn: Callable
    flops: Callable | None = None


def onnx_op(*op_types: str, domain: str = "", flops: Callable | None = None):
    """Decorator registering ``fn`` as the kernel of ``op_types`` in ``domain`` ("" is ai.onnx)."""
    def register(fn):
        for op in op_types:
            _REGISTRY[(_norm(domain), op)] = OpKernel(_norm(domain), op, fn, flops)
        return fn
    return register


def _norm(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _load_all() -> None:
    global _LOADED
    if not _LOADED:
        for mod in pkgutil.iter_modules(__path__):
            if not mod.name.startswith("_"):
                importlib.import_module(f"{__name__}.{mod.name}")
        _LOADED = True


def get_kernel(domain: str, op_type: str) -> OpKernel | None:
    """The registered kernel for ``(domain, op_type)``, or ``None``."""
    _load_all()
    return _REGISTRY.get((_norm(domain), op_type))


def supported_ops() -> list[tuple[str, str]]:
    """All registered ``(domain, op_type)`` pairs, sorted."""
    _load_all()
    return sorted(_REGISTRY)
