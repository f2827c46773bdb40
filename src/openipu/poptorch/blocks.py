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
    # no annotation may outlive a capture: one left in torch's node metadata by a capture that
    # failed part-way (inside a block) would tag every op of the next model
    saved = fxt.current_meta.pop("custom", None)
    try:
        with fxt.preserve_node_meta():
            yield
    finally:
        _state.close()
        _state.active, ops._running_on_ipu[0], _impl._dispatch_tracing[0] = False, False, False
        fxt.current_meta.pop("custom", None)
        if saved is not None and _state_outer_annotation(saved):
            fxt.current_meta["custom"] = saved


def _state_outer_annotation(custom: dict) -> bool:
    """Whether an annotation found before a capture is the user's own (kept), not a stale block,
    name-scope or attribute annotation of an earlier capture (dropped)."""
    return not any(str(k).startswith("poptorch") for k in custom)


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

    def stage(self, block_id) -> Stage:
        """The :class:`Stage` that holds the block ``block_id`` (PopTorch's
        ``strategy.stage("B1").ipu(0)``). Raises ``AssertionError`` for an unknown block."""
        for st in self.stages:
            if str(block_id) in st.blocks:
                return st
        raise AssertionError(f"Unknown block {block_id}")

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


class Phase:
    """``Phase(*stages)`` or ``Phase(*block_ids)`` (one stage of those blocks): stages that run
    at the same time, each on its IPU (``.ipus(*ids)``, one per stage). Raises
    ``AssertionError`` (PopTorch's) for mixed arguments or a wrong number of IPUs."""

    def __init__(self, *arg):
        if arg and all(isinstance(a, Stage) for a in arg):
            self.stages = list(arg)
        else:
            assert all(isinstance(a, str) for a in arg), \
                "All arguments must either be block IDs (strings) or Stages: " + str([type(a) for a in arg])
            self.stages = [Stage(*arg)]

    def stage(self, idx: int) -> Stage:
        return self.stages[idx]

    def ipus(self, *ipus) -> "Phase":
        assert len(ipus) == len(self.stages), \
            f"Phase contains {len(self.stages)} stages but you provided {len(ipus)} ipus"
        for st, ipu in zip(self.stages, ipus):
            st.ipu(ipu)
        return self


class PhasedExecution(_Strategy):
    """Common base of :class:`SerialPhasedExecution` and :class:`ParallelPhasedExecution`
    (PopTorch's ``_IPhasedExecution``): the model's blocks run in phases, each a
    :class:`Phase`, a list of stages or a list of block ids (one stage). PopART runs such a
    model with ``VirtualGraphMode.ExecutionPhases``, streaming each phase's weights and
    activations in from remote memory; the simulated PopART has no execution phases, so openipu
    runs the phases one after another on their IPUs, as :class:`ShardedExecution` does (same
    results; the cost is that of the sharded model, without remote-memory streaming).
    ``useSeparateBackwardPhase`` and the liveness settings are recorded."""

    pipelined = False

    def __init__(self, *phases):
        from openipu.poptorch.enums import Liveness
        assert phases, "There is currently no AutoStage for PhasedExecution, please explicitly specify the phases"
        self.auto = AutoStage.SameAsIpu
        self._phases = []
        self._tensors_liveness = Liveness.AlwaysLive
        self._separate_backward_phase = False
        seen = set()
        for a in phases:
            ph = a if isinstance(a, Phase) else Phase(*(a if isinstance(a, list) else [a]))
            self._phases.append(ph)
            for st in ph.stages:
                for blk in st.blocks:
                    assert blk not in seen, f"{blk} associated with more than one stage"
                    seen.add(blk)

    @property
    def stages(self) -> list:
        out = []
        for p, ph in enumerate(self._phases):
            for k, st in enumerate(ph.stages):
                if st._ipu is None:
                    st._ipu = self._default_ipu(p, k)
                out.append(st)
        return out

    @stages.setter
    def stages(self, value):
        pass

    def _default_ipu(self, phase: int, k: int) -> int:
        return k

    def phase(self, phase: int) -> Phase:
        """The ``phase``-th :class:`Phase`."""
        assert isinstance(phase, int) and phase >= 0, "Phases are identified by positive integers"
        return self._phases[phase]

    def useSeparateBackwardPhase(self, use: bool = True):  # noqa: N802
        """Run the backward pass in phases of its own (recorded; see the class docstring)."""
        assert isinstance(use, bool)
        self._separate_backward_phase = use
        return self

    def backendOptions(self) -> dict:  # noqa: N802
        """PopTorch's backend options of the strategy (execution mode 2: phased)."""
        return {"execution_mode": 2, "separate_backward_phase": self._separate_backward_phase,
                "tensors_liveness": int(self._tensors_liveness)}


class ParallelPhasedExecution(PhasedExecution):
    """Phases alternate between two groups of IPUs (by default phase ``p``'s ``k``-th stage runs
    on IPU ``2k + p % 2``). See :class:`PhasedExecution`."""

    def _default_ipu(self, phase: int, k: int) -> int:
        return 2 * k + phase % 2

    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True):  # noqa: N802
        """Keep activations off chip between the forward and the backward pass (recorded)."""
        from openipu.poptorch.enums import Liveness
        assert isinstance(off_chip, bool)
        self._tensors_liveness = Liveness.OffChipAfterFwd if off_chip else Liveness.AlwaysLive
        return self

    def backendOptions(self) -> dict:  # noqa: N802
        return {**super().backendOptions(), "serial_phases_execution": False}


class SerialPhasedExecution(PhasedExecution):
    """All phases run one after another on one group of IPUs (by default a phase's ``k``-th
    stage on IPU ``k``). See :class:`PhasedExecution`."""

    def setTensorsLiveness(self, liveness):  # noqa: N802
        """Where tensors live between phases (a ``poptorch.Liveness``; recorded)."""
        from openipu.poptorch.enums import Liveness
        assert isinstance(liveness, Liveness)
        self._tensors_liveness = liveness
        return self

    def backendOptions(self) -> dict:  # noqa: N802
        return {**super().backendOptions(), "serial_phases_execution": True}


def resolve(gm: torch.fx.GraphModule, strategy) -> tuple[int, bool]:
    """Give every op of ``gm`` its ``ipu`` and ``stage`` (``custom`` metadata) under
    ``strategy`` (None: ``PipelinedExecution(AutoStage.SameAsIpu)``); ops before the first
    block get IPU 0, stage 0. Returns (IPUs used, pipelined: more than one stage, counting
    that leading one); (1, False) when the model has no blocks."""
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
    # ops before the first block run on IPU 0 in stage 0 (PopTorch's default); AutoIncrement
    # numbers the blocks' stages from 1 after them, so a first block on another IPU is a
    # stage of its own (graphcore/examples' FastPitch: one BeginBlock(ipu_id=1) mid-model)
    leading = bool(nodes) and _BLOCK_KEY not in (nodes[0].meta.get("custom") or {})
    if (leading and not getattr(strategy, "stages", None)
            and getattr(strategy, "auto", None) == AutoStage.AutoIncrement
            and place[order[0][0]][0] != 0):
        place = {b: (ipu, st + 1) for b, (ipu, st) in place.items()}
    cur = (0, 0)
    for n in nodes:
        c = dict(n.meta.get("custom") or {})
        if _BLOCK_KEY in c:
            cur = place[c[_BLOCK_KEY]]
        c["ipu"], c["stage"] = cur
        n.meta["custom"] = c
    num_ipus = max(ipu for ipu, _ in place.values()) + 1
    stages = {s for _, s in place.values()} | ({0} if leading else set())
    return num_ipus, strategy.pipelined and len(stages) > 1
