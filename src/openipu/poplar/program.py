"""``poplar::program``: the control programs an Engine runs.

Programs are plain descriptions; :mod:`openipu.poplar.graph_compiler` compiles a program tree into
executable steps with their costs. Names and arguments follow Poplar's C++ API.
"""

from __future__ import annotations

from typing import Sequence as _Seq

from openipu.poplar import errors
from openipu.poplar.graph import ComputeSet, DataStream, Function, HostFunction, RemoteBuffer
from openipu.poplar.tensor import Tensor


class Program:
    """Base of every program (``poplar::program::Program``)."""

    debug_name = ""

    def isEmpty(self) -> bool:  # noqa: N802
        return False

    def children(self) -> list["Program"]:
        return []

    @property
    def kind(self) -> str:
        return type(self).__name__


class Sequence(Program):
    """Run programs in order. ``Sequence(p1, p2)``, ``Sequence([p1, p2])``, then ``.add(p)``."""

    def __init__(self, *programs, debugContext: str = "", name: str = ""):  # noqa: N803
        if len(programs) == 1 and isinstance(programs[0], (list, tuple)):
            programs = tuple(programs[0])
        self.programs: list[Program] = []
        for p in programs:
            self.add(p)
        self.debug_name = debugContext or name

    def add(self, p: Program) -> "Sequence":
        if not isinstance(p, Program):
            raise errors.control_program_error(f"Sequence.add expects a Program, got {type(p).__name__}")
        self.programs.append(p)
        return self

    def isEmpty(self) -> bool:  # noqa: N802
        return all(p.isEmpty() for p in self.programs)

    def children(self):
        return list(self.programs)


class Execute(Program):
    """Run a compute set (one BSP superstep)."""

    def __init__(self, cs: ComputeSet, debugContext: str = ""):  # noqa: N803
        if not isinstance(cs, ComputeSet):
            raise errors.control_program_error(f"Execute expects a ComputeSet, got {type(cs).__name__}")
        self.cs = cs
        self.debug_name = debugContext or cs.name


class Copy(Program):
    """Copy tensor -> tensor, stream -> tensor, tensor -> stream, or to/from a remote buffer.

    Raises :class:`poplar.graph_connection_error` when types or element counts differ.
    """

    def __init__(self, src, dst, dontOutline: bool = False, debugContext: str = "", *, offset=None):  # noqa: N803
        if isinstance(dontOutline, Tensor):   # Copy(remoteBuffer, tensor, offsetTensor)
            offset, dontOutline = dontOutline, False
        self.src, self.dst, self.offset = src, dst, offset
        self.debug_name = debugContext if isinstance(debugContext, str) else ""
        s_type, d_type = _io_type(src), _io_type(dst)
        if s_type != d_type:
            raise errors.graph_connection_error(
                f"Copy: source type {s_type} does not match destination type {d_type}")
        sn, dn = _io_elems(src), _io_elems(dst)
        if sn != dn:
            raise errors.graph_connection_error(
                f"Copy: source has {sn} elements but destination has {dn}; shapes must hold the same number of elements")
        if isinstance(dst, Tensor) and dst.containsConstant():
            raise errors.graph_connection_error("Copy: the destination tensor contains constants and cannot be written")

    @property
    def kind(self):
        if isinstance(self.src, DataStream) or isinstance(self.dst, DataStream):
            return "StreamCopy"
        return "Copy"


def _io_type(x):
    if isinstance(x, Tensor):
        return x.elementType()
    if isinstance(x, (DataStream, RemoteBuffer)):
        return x.type
    raise errors.control_program_error(f"Copy: cannot copy {type(x).__name__}")


def _io_elems(x):
    if isinstance(x, Tensor):
        return x.numElements()
    return x.numElements


class Repeat(Program):
    """Run ``body`` ``count`` times."""

    def __init__(self, count: int, body: Program, debugContext: str = ""):  # noqa: N803
        if int(count) < 0:
            raise errors.control_program_error(f"Repeat count must be non-negative, got {count}")
        self.count, self.body = int(count), body
        self.debug_name = debugContext

    def children(self):
        return [self.body]


def _check_predicate(t: Tensor, what: str):
    if not isinstance(t, Tensor) or t.numElements() != 1:
        raise errors.control_program_error(f"{what}: the predicate must be a scalar tensor")


class RepeatWhileTrue(Program):
    """Run ``cond``; while the scalar ``predicate`` is true run ``body`` and ``cond`` again."""

    until = False

    def __init__(self, cond: Program, predicate: Tensor, body: Program, debugContext: str = ""):  # noqa: N803
        _check_predicate(predicate, type(self).__name__)
        self.cond, self.predicate, self.body = cond, predicate, body
        self.debug_name = debugContext

    def children(self):
        return [self.cond, self.body]


class RepeatWhileFalse(RepeatWhileTrue):
    """Run ``cond``; while the scalar ``predicate`` is false run ``body`` and ``cond`` again."""

    until = True


class If(Program):
    """Run ``true_body`` if the scalar ``predicate`` is non-zero, else ``false_body``."""

    def __init__(self, predicate: Tensor, true_body: Program, false_body: Program | None = None,
                 debugContext: str = ""):  # noqa: N803
        _check_predicate(predicate, "If")
        self.predicate, self.true_body = predicate, true_body
        self.false_body = false_body if false_body is not None else Sequence()
        self.debug_name = debugContext

    def children(self):
        return [self.true_body, self.false_body]


class Switch(Program):
    """Run the case whose value equals the scalar ``control`` tensor, else ``default``."""

    def __init__(self, control: Tensor, cases=None, default: Program | None = None, debugContext: str = ""):  # noqa: N803
        _check_predicate(control, "Switch")
        if isinstance(cases, Program):
            cases, default = None, cases
        self.control = control
        self.cases: list[tuple[int, Program]] = []
        self.default = default if default is not None else Sequence()
        self.debug_name = debugContext
        for value, prog in (cases or []):
            self.add(value, prog)

    def add(self, value: int, prog: Program) -> "Switch":
        if any(v == value for v, _ in self.cases):
            raise errors.control_program_error(f"Switch already has a case for {value}")
        self.cases.append((int(value), prog))
        return self

    def children(self):
        return [p for _, p in self.cases] + [self.default]


class Call(Program):
    """Run a :class:`Function` (or a host function with its arguments)."""

    def __init__(self, f, inputs: _Seq[Tensor] = (), outputs: _Seq[Tensor] = (), debugContext: str = ""):  # noqa: N803
        if not isinstance(f, (Function, HostFunction)):
            raise errors.control_program_error(f"Call expects a Function, got {type(f).__name__}")
        self.function, self.inputs, self.outputs = f, list(inputs), list(outputs)
        self.debug_name = debugContext

    def children(self):
        return [self.function.program] if isinstance(self.function, Function) else []


class WriteUndef(Program):
    """Mark a tensor's contents undefined (ends its live range for the memory planner)."""

    def __init__(self, t: Tensor, debugContext: str = ""):  # noqa: N803
        self.tensor, self.debug_name = t, debugContext


class SyncType:
    INTERNAL = "INTERNAL"
    EXTERNAL = "EXTERNAL"
    GLOBAL = "GLOBAL"


class Sync(Program):
    """Synchronise the tiles of an IPU (INTERNAL) or all IPUs (EXTERNAL, GLOBAL)."""

    def __init__(self, sync_type: str = SyncType.INTERNAL, debugContext: str = ""):  # noqa: N803
        self.sync_type, self.debug_name = sync_type, debugContext


class PrintTensor(Program):
    """Print a tensor on the host: ``PrintTensor([title,] t)`` -> ``title: [1.0000000 ...]``."""

    def __init__(self, title, t: Tensor | None = None, debugContext: str = ""):  # noqa: N803
        if t is None:
            title, t = "", title
        self.title, self.tensor, self.debug_name = title, t, debugContext


class ErrorProgram(Program):
    """Abort with ``message`` and print ``t``."""

    def __init__(self, message: str, t: Tensor, debugContext: str = ""):  # noqa: N803
        self.message, self.tensor, self.debug_name = message, t, debugContext


class Abort(Program):
    """Stop the program with :class:`poplar.application_runtime_error`."""

    def __init__(self, message: str = "", debugContext: str = ""):  # noqa: N803
        self.message, self.debug_name = message, debugContext


class AbortOnCondition(Program):
    """Abort when the scalar ``predicate`` is non-zero."""

    def __init__(self, predicate: Tensor, message: str = "", debugContext: str = ""):  # noqa: N803
        _check_predicate(predicate, "AbortOnCondition")
        self.predicate, self.message, self.debug_name = predicate, message, debugContext


class AssumeEqualAcrossReplicas(Program):
    """Declare ``t`` equal on every replica (a no-op in the simulator)."""

    def __init__(self, t: Tensor, debugContext: str = ""):  # noqa: N803
        self.tensor, self.debug_name = t, debugContext


class CrossReplicaCopy(Program):
    """Copy ``src`` on replica i to ``dst`` on replica ``replica_map[i]``."""

    def __init__(self, src: Tensor, dst: Tensor, replica_map: dict, debugContext: str = ""):  # noqa: N803
        if src.numElements() != dst.numElements() or src.elementType() != dst.elementType():
            raise errors.graph_connection_error("CrossReplicaCopy: source and destination differ in type or size")
        self.src, self.dst, self.replica_map, self.debug_name = src, dst, dict(replica_map), debugContext


class Collective(Program):
    """openipu extension (no Poplar counterpart): one step of data movement across replicas or
    IPUs, run by one library kernel and costed by the library that built it (``gcl``).

    Args:
        kernel: ``kernel(ctx)``; ``ctx.read(t)`` gives ``[replicas, *shape]`` torch values and
            ``ctx.write(t, v)`` stores them (as in a ``VertexGroup`` kernel). Module-level function
            or ``functools.partial`` of one (executables pickle).
        reads / writes: tensors the step reads and writes (liveness and memory planning).
        cost: a :class:`openipu.poplar.cost.StepCost` over the IPUs of the graph's target.
        recv_bytes_per_tile: optional per-tile receive buffer bytes (global tile index), live for
            this step only.
    """

    def __init__(self, kernel, reads, writes, cost, recv_bytes_per_tile=None, debugContext: str = ""):  # noqa: N803
        self.kernel, self.reads, self.writes, self.cost = kernel, list(reads), list(writes), cost
        self.recv_bytes_per_tile = recv_bytes_per_tile
        self.debug_name = debugContext


# -- record kinds of Poplar executable files (openipu.poplar.graph_codec) ----------------------
def _register_records():
    from openipu.poplar.graph_codec import data_class
    for cls, fields in ((Sequence, ("programs", "debug_name")), (Execute, ("cs", "debug_name")),
                        (Copy, ("src", "dst", "offset", "debug_name")), (Repeat, ("count", "body", "debug_name")),
                        (RepeatWhileTrue, ("cond", "predicate", "body", "debug_name")),
                        (RepeatWhileFalse, ("cond", "predicate", "body", "debug_name")),
                        (If, ("predicate", "true_body", "false_body", "debug_name")),
                        (Switch, ("control", "cases", "default", "debug_name")),
                        (Call, ("function", "inputs", "outputs", "debug_name")), (WriteUndef, ("tensor", "debug_name")),
                        (Sync, ("sync_type", "debug_name")), (PrintTensor, ("title", "tensor", "debug_name")),
                        (ErrorProgram, ("message", "tensor", "debug_name")), (Abort, ("message", "debug_name")),
                        (AbortOnCondition, ("predicate", "message", "debug_name")),
                        (AssumeEqualAcrossReplicas, ("tensor", "debug_name")),
                        (CrossReplicaCopy, ("src", "dst", "replica_map", "debug_name")),
                        (Collective, ("kernel", "reads", "writes", "cost", "recv_bytes_per_tile", "debug_name"))):
        data_class(cls, fields=fields, types={"debug_name": str})


_register_records()
