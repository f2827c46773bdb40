"""PopTorch's ops (``poptorch/ops.py``; ``research/poptorch.md`` 1.10). Each runs as the identity
(or its plain PyTorch meaning) on the CPU and is a ``torch.ops.poptorch.*`` node in the captured
graph, lowered to its PopART op (:mod:`openipu.poptorch.lower.poptorch_ops`)."""

from __future__ import annotations

import torch

from openipu.poptorch.errors import Error

_REDUCTIONS = {"sum": 2, "mean": 1, "none": 0}


def _identity_op(name: str, schema_args: str = ""):
    """A custom op ``poptorch::<name>(Tensor x<schema_args>) -> Tensor`` that returns a copy of
    ``x`` (a fresh tensor, so capture keeps it)."""
    lib_name = f"poptorch::{name}"
    torch.library.define(lib_name, f"(Tensor x{schema_args}) -> Tensor")

    @torch.library.impl(lib_name, "CompositeExplicitAutograd")
    def _impl(x, *args):
        return x.clone()

    @torch.library.register_fake(lib_name)
    def _fake(x, *args):
        return torch.empty_like(x)

    def _backward(ctx, grad):
        return (grad,) + (None,) * ctx.n_extra

    def _setup(ctx, inputs, output):
        ctx.n_extra = len(inputs) - 1

    torch.library.register_autograd(lib_name, _backward, setup_context=_setup)
    return getattr(torch.ops.poptorch, name)


_nop = _identity_op("nop")
_print = _identity_op("ipu_print_tensor", ", str title")
_available_memory = _identity_op("set_available_memory", ", float proportion")
_checkpoint = _identity_op("recomputation_checkpoint")

torch.library.define("poptorch::identity_loss", "(Tensor x, int reduction) -> Tensor")


@torch.library.impl("poptorch::identity_loss", "CompositeExplicitAutograd")
def _identity_loss_impl(x, reduction):
    return x.sum() if reduction == 2 else x.mean() if reduction == 1 else x.clone()


@torch.library.register_fake("poptorch::identity_loss")
def _identity_loss_fake(x, reduction):
    return x.new_empty(()) if reduction in (1, 2) else torch.empty_like(x)


def _identity_loss_backward(ctx, grad):
    g = grad.expand(ctx.shape)
    return (g / ctx.numel if ctx.reduction == 1 else g if ctx.reduction == 2 else grad), None


def _identity_loss_setup(ctx, inputs, output):
    ctx.shape, ctx.numel, ctx.reduction = inputs[0].shape, max(inputs[0].numel(), 1), inputs[1]


torch.library.register_autograd("poptorch::identity_loss", _identity_loss_backward, setup_context=_identity_loss_setup)


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mark ``x`` as the model's loss, reduced by ``reduction`` ("sum", "mean" or "none"): the
    backward pass starts here (PopTorch's ``identity_loss``)."""
    if reduction not in _REDUCTIONS:
        raise Error(f"Unknown reduction '{reduction}' for identity_loss: use 'sum', 'mean' or 'none'")
    return torch.ops.poptorch.identity_loss(x, _REDUCTIONS[reduction])


def nop(tensor: torch.Tensor) -> torch.Tensor:
    """An identity op PopART never removes."""
    return _nop(tensor)


def ipu_print_tensor(tensor: torch.Tensor, title: str = "", print_gradient: bool = True,
                     summarise_threshold: int = 1000, edge_items: int = 3, max_line_width: int = 80,
                     digits: int = 4, float_format: str = "auto", separator: str = ", ", open_bracket: str = "(",
                     close_bracket: str = ")") -> torch.Tensor:
    """Print ``tensor`` (and its gradient) when the IPU program runs; returns it (use the return
    value, or the op is pruned)."""
    return _print(tensor, str(title))


def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float) -> torch.Tensor:
    """The share of tile memory the convolution / matmul producing ``tensor`` may use for its
    temporaries (default 0.6)."""
    if not 0.0 < float(available_memory_proportion) <= 1.0:
        raise Error("available_memory_proportion must be in (0, 1]")
    return _available_memory(tensor, float(available_memory_proportion))


def recomputationCheckpoint(*tensors):  # noqa: N802
    """Checkpoint ``tensors``: recomputation in the backward pass restarts from them. Returns the
    tensors (one, or a tuple)."""
    out = tuple(_checkpoint(t) for t in tensors)
    return out[0] if len(out) == 1 else out


_running_on_ipu = [False]


def isRunningOnIpu() -> bool:  # noqa: N802
    """True only while the model is being captured for the IPU."""
    return _running_on_ipu[0]
