"""Multi-IPU annotations (``research/poptorch.md`` 1.9): ``BeginBlock``, ``Block``,
``BlockFunction``, ``removeBlocks``, ``Stage`` and the execution strategies
``PipelinedExecution`` / ``ShardedExecution``.

Outside capture the annotations do nothing, so annotated models run unchanged on the CPU. While a
model is captured (:func:`capturing`), a block tags every op it records with its id and IPU
(``torch.fx.traceback.annotate``: the ``custom`` node metadata, kept through the
decompositions); :func:`resolve` then gives each op its virtual graph (IPU) and pipeline stage
under the strategy. Ops before the first block run on IPU 0; an op outside any block takes the
placement of the op before it.
"""

from __future__ import annotations

import contextlib

import torch
import torch.fx.traceback as fxt

from openipu.poptorch.enums import AutoStage
from openipu.poptorch.errors import Error

_BLOCK_KEY, _IPU_KEY = "poptorch_block", "poptorch_block_ipu"


class _CaptureState:
    """The blocks open while a model is captured: a stack of entered annotation contexts."""

    def __init__(self):
        self.active = False
        self.stack: list = []
        self.unscoped = None

    def push(self, user_id, ipu_id):
        ctx = fxt.annotate({_BLOCK_KEY: str(user_id), _IPU_KEY: ipu_id})
        ctx.__enter__()
        self.stack.append(ctx)
        return ctx

    def pop(self, ctx):
        if ctx in self.stack:
            while self.stack:
                top = self.stack.pop()
                top.__exit__(None, None, None)
                if top is ctx:
                    break
        if ctx is self.unscoped:
            self.unscoped = None

    def start(self, user_id, ipu_id):
        """An un-scoped block (``Block.start``, ``BeginBlock``): ends the previous un-scoped one."""
        if self.unscoped is not None:
            self.pop(self.unscoped)
        self.unscoped = self.push(user_id, ipu_id)

    def close(self):
        while self.stack:
            self.stack.pop().__exit__(None, None, None)
        self.unscoped = None


_state = _CaptureState()


@contextlib.contextmanager
def capturing():
    """Blocks annotate the ops recorded in this context (the executor's capture)."""
    from openipu.poptorch import _impl, ops
    _state.active, ops._running_on_ipu[0], _impl._dispatch_tracing[0] = True, True, True
    Block._auto_id = 0
    try:
        with fxt.preserve_node_meta():
            yield
    finally:
        _state.close()
        _state.active, ops._running_on_ipu[0], _impl._dispatch_tracing[0] = False, False, False


class Block:
    """``with poptorch.Block(user_id=None, ipu_id=None):`` the ops inside run in block
    ``user_id`` (an automatic id when None) on IPU ``ipu_id`` (the strategy's choice when None)."""

    _auto_id = 0

    def __init__(self, user_id=None, ipu_id=None):
        if user_id is None:
            user_id = Block._auto_id
            Block._auto_id += 1
        self.user_id, self.ipu_id = str(user_id), ipu_id
        self._ctx = None

    def __enter__(self):
        if _state.active:
            self._ctx = _state.push(self.user_id, self.ipu_id)
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            _state.pop(self._ctx)
            self._ctx = None

    @staticmethod
    def start(user_id=None, ipu_id=None):
        """Begin a block that lasts until the next one starts."""
        if user_id is None:
            user_id = Block._auto_id
            Block._auto_id += 1
        if _state.active:
            _state.start(str(user_id), ipu_id)

    @staticmethod
    def useAutoId():  # noqa: N802
        """Restart the automatic block ids at 0."""
        Block._auto_id = 0


class _BlockHook:
    def __init__(self, user_id, ipu_id):
        self.user_id, self.ipu_id = user_id, ipu_id

    def __call__(self, module, inputs):
        Block.start(self.user_id, self.ipu_id)


def BeginBlock(layer_to_call, user_id=None, ipu_id=None):  # noqa: N802
    """Start a block at ``layer_to_call`` (a module: returned, with a forward pre-hook; a function:
    wrapped). Annotating a module twice raises."""
    if isinstance(layer_to_call, torch.nn.Module):
        if any(isinstance(h, _BlockHook) for h in layer_to_call._forward_pre_hooks.values()):
            raise Error("module has already been assigned to a block")
        layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
        return layer_to_call

    def wrapper(*args, **kwargs):
        Block.start(user_id, ipu_id)
        return layer_to_call(*args, **kwargs)
    return wrapper


def BlockFunction(user_id=None, ipu_id=None):  # noqa: N802
    """Decorator: the function's ops run in one block."""
    def deco(fn):
        def wrapper(*args, **kwargs):
            with Block(user_id, ipu_id):
                return fn(*args, **kwargs)
        return wrapper
    return deco


def removeBlocks(module: torch.nn.Module) -> torch.nn.Module:  # noqa: N802
    """Remove every ``BeginBlock`` hook of ``module`` and its children."""
    for m in module.modules():
        for k, h in list(m._forward_pre_hooks.items()):
            if isinstance(h, _BlockHook):
                del m._forward_pre_hooks[k]
    return module


class Stage:
    """``Stage(*block_ids).ipu(n)``: blocks run as one pipeline stage on IPU ``n``."""

    def __init__(self, *block_ids):
        self.blocks = [str(b) for b in block_ids]
        self._ipu = None

    def ipu(self, ipu: int) -> "Stage":
        self._ipu = int(ipu)
        return self


class _Strategy:
    pipelined = True

    def __init__(self, *args):
        self.auto = AutoStage.SameAsIpu
        self.stages: list[Stage] = []
        for a in args:
            if isinstance(a, AutoStage):
                self.auto = a
            elif isinstance(a, Stage):
                self.stages.append(a)
            else:
                self.stages.append(Stage(a))

    def place(self, order: list[tuple[str, object]]) -> dict:
        """block id -> (ipu, stage) for the blocks in capture ``order`` ((id, ipu or None))."""
        out = {}
        if self.stages:
            for k, st in enumerate(self.stages):
                for b in st.blocks:
                    ipu = st._ipu if st._ipu is not None else dict(order).get(b)
                    out[b] = (int(ipu) if ipu is not None else k, k)
            for b, ipu in order:
                if b not in out:
                    raise Error(f"Block '{b}' is not in any Stage of the execution strategy")
            return out
        stage, prev_ipu = -1, None
        for b, ipu in order:
            if ipu is None:
                raise Error(f"Block '{b}' has no ipu_id: give BeginBlock / Block an ipu_id or use Stage(...).ipu(n)")
            ipu = int(ipu)
            if self.auto == AutoStage.SameAsIpu:
                out[b] = (ipu, ipu)
            else:
                if ipu != prev_ipu:
                    stage += 1
                out[b] = (ipu, stage)
            prev_ipu = ipu
        return out


class PipelinedExecution(_Strategy):
    """Blocks run as pipeline stages (PopART pipelining); the default strategy."""


class ShardedExecution(_Strategy):
    """Blocks run on their IPUs one after another (no pipelining)."""

    pipelined = False


def resolve(gm: torch.fx.GraphModule, strategy) -> tuple[int, bool]:
    """Give every op of ``gm`` its ``ipu`` and ``stage`` (``custom`` metadata) under
    ``strategy`` (None: ``PipelinedExecution(AutoStage.SameAsIpu)``). Returns (IPUs used,
    pipelined); (1, False) when the model has no blocks."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    order = []
    for n in nodes:
        c = n.meta.get("custom") or {}
        if _BLOCK_KEY in c and c[_BLOCK_KEY] not in dict(order):
            order.append((c[_BLOCK_KEY], c.get(_IPU_KEY)))
    if not order:
        return 1, False
    strategy = strategy or PipelinedExecution()
    place = strategy.place(order)
    cur = (0, 0)
    for n in nodes:
        c = dict(n.meta.get("custom") or {})
        if _BLOCK_KEY in c:
            cur = place[c[_BLOCK_KEY]]
        c["ipu"], c["stage"] = cur
        n.meta["custom"] = c
    num_ipus = max(ipu for ipu, _ in place.values()) + 1
    return num_ipus, strategy.pipelined and len({s for _, s in place.values()}) > 1
