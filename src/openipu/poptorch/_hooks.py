"""PopTorch's compile hooks (``registerPreCompileHook`` / ``registerPostCompileHook``) and its
compilation progress bar over PopART's progress steps."""

from __future__ import annotations

import collections

import torch

#: handle id -> hook (``registerPreCompileHook`` / ``registerPostCompileHook``), in registration order
_PRECOMPILE_HOOKS: dict = collections.OrderedDict()
_POSTCOMPILE_HOOKS: dict = collections.OrderedDict()


def _register_hook(hooks: dict, hook, what: str) -> "torch.utils.hooks.RemovableHandle":
    if not callable(hook):
        raise RuntimeError(f"{what} hook must be callable")
    handle = torch.utils.hooks.RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def registerPreCompileHook(hook) -> "torch.utils.hooks.RemovableHandle":  # noqa: N802
    """Call ``hook()`` each time a model is compiled, before it is captured (PopTorch's
    ``registerPreCompileHook``). Returns a handle whose ``remove()`` unregisters it. Raises
    ``RuntimeError("Pre-compile hook must be callable")``."""
    return _register_hook(_PRECOMPILE_HOOKS, hook, "Pre-compile")


def registerPostCompileHook(hook) -> "torch.utils.hooks.RemovableHandle":  # noqa: N802
    """Call ``hook()`` each time a model has been compiled (PopTorch's
    ``registerPostCompileHook``). Returns a removable handle. Raises
    ``RuntimeError("Post-compile hook must be callable")``."""
    return _register_hook(_POSTCOMPILE_HOOKS, hook, "Post-compile")



class _PopTorchBar:
    """PopTorch's compilation progress bar over PopART's progress steps: tqdm on stderr,
    "Graph compilation" with PopTorch's ``{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]``
    format, counted to 100."""

    def __init__(self, total: int):
        import sys

        from tqdm import tqdm
        self._total, self._done, self._shown = max(int(total), 1), 0, 0
        self._bar = tqdm(desc="Graph compilation", total=100, file=sys.stderr,
                         bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]")

    def update(self, n: int = 1) -> None:
        self._done = min(self._done + n, self._total)
        pct = self._done * 100 // self._total
        if pct > self._shown:
            self._bar.update(pct - self._shown)
            self._shown = pct

    def close(self) -> None:
        if self._shown < 100:
            self._bar.update(100 - self._shown)
            self._shown = 100
        self._bar.close()


def _progress_bar(total: int):
    """A :class:`_PopTorchBar` when stderr is a terminal (and tqdm is installed), else None."""
    import sys
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return None
    try:
        return _PopTorchBar(total)
    except ImportError:
        return None
