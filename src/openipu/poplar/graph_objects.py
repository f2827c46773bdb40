"""The objects a Poplar graph hands out and records: compute sets, vertex groups and their
accesses, data streams, remote buffers, functions, host functions, vertex and field handles, and
the enums of ``Graph``'s methods (``VariableMappingMethod``, ``TensorCloneMethod``,
``ReplicatedStreamMode``). Used by :class:`openipu.poplar.graph.Graph`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from openipu.poplar import errors
from openipu.poplar.tensor import Tensor
from openipu.poplar.types import Type

if TYPE_CHECKING:
    from openipu.poplar.graph import Graph


@dataclass(eq=False)
class ComputeSet:
    """``poplar::ComputeSet``: vertices that run in one BSP superstep."""

    id: int
    name: str
    state: Any = field(repr=False, default=None)
    user_vertices: list = field(default_factory=list, repr=False)   # vertex ids
    groups: list = field(default_factory=list, repr=False)          # VertexGroup (library ops)

    def getId(self) -> int:  # noqa: N802
        return self.id


@dataclass(eq=False)
class Access:
    """A tensor view a vertex group reads or writes, and where each element is used.

    ``on`` places the elements (for exchange costs):

    - ``None``: on the tile that owns each element (no exchange);
    - a :class:`Tensor` with as many elements: element ``i`` is used on the tile that owns
      element ``i`` of ``on`` (an elementwise op reads its operands where its output lives);
    - an int: every element on that global tile;
    - an :class:`openipu.poplar.exchange.Boxes`: boxes of the view's index space, each on a global
      tile (boxes may overlap when several tiles read the same elements).

    ``count_send`` is False when another Access sends the same values (multicast replicas).
    ``supertile_recv_scale``: receives from outside the reading tile's supertile count at this
    fraction of their bytes, for reads whose supertile partner reads the same values in the same
    phase (the two tiles of a supertile receive them in the same cycles: PopLibs
    ``ExchangeEstimator``, ``linearizeConvIndices``); 1 otherwise.
    """

    tensor: Tensor
    on: Any = None
    count_send: bool = True
    supertile_recv_scale: float = 1.0


@dataclass(eq=False)
class VertexGroup:
    """Many vertices of one codelet type, described by arrays (how library ops add work).

    Attributes:
        type_name: the vertex type, e.g. ``popops::ScaledAdd2D<float>``.
        tiles: int array, the tile of each vertex (global tile numbers).
        cycles: int array, each vertex's cycle estimate (worker cycles for single-worker vertices,
            tile cycles when ``multi`` is true).
        kernel: ``kernel(ctx)`` runs the whole group functionally; ``ctx.read(t)`` / ``ctx.write(t, v)``
            access tensors with a leading replica dimension.
        reads / writes: what the vertices read and write, each an :class:`Access` (a view and the
            tiles where its elements are used), or the older ``(tensor, consumer_tiles[, count_send])``
            with a tile per flattened element (small tensors only).
        flops: floating-point operations of the whole group (for the profile).
        state_bytes: vertex state bytes per vertex (int array or scalar).
    """

    type_name: str
    tiles: np.ndarray
    cycles: np.ndarray
    kernel: Callable
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)
    multi: bool = False
    flops: float = 0.0
    state_bytes: Any = 16
    code_bytes: int = 256


@dataclass(eq=False)
class DataStream:
    """A host<->device FIFO (``poplar::DataStream``)."""

    handle: str
    type: Type
    numElements: int
    to_device: bool
    replicatedMode: str = "REPLICATE"

    def elementType(self) -> Type:  # noqa: N802
        return self.type


@dataclass(eq=False)
class RemoteBuffer:
    """Off-chip memory in repeats of ``numElements`` (``poplar::RemoteBuffer``)."""

    handle: str
    type: Type
    numElements: int
    repeats: int = 1

    def getRepeats(self) -> int:  # noqa: N802
        return self.repeats


@dataclass(eq=False)
class Function:
    """``poplar::Function``: a program compiled once and run with ``program.Call``."""

    id: int
    program: Any


@dataclass(eq=False)
class HostFunction:
    """``poplar::HostFunction``: host code called from a device program."""

    handle: str
    inputs: list
    outputs: list


class VertexRef:
    """A vertex added with ``addVertex``; ``v["field"]`` gives a :class:`FieldRef`."""

    __slots__ = ("graph", "id")

    def __init__(self, graph: "Graph", vid: int):
        self.graph, self.id = graph, vid

    def __getitem__(self, name: str) -> "FieldRef":
        codelet = self.graph._state.codelet_of_vertex(self.id)
        if name not in codelet._fields:
            raise errors.unknown_field(
                f"Vertex type '{codelet.vertex_name}' has no field named '{name}'; its fields are "
                f"{', '.join(sorted(codelet._fields))}")
        return FieldRef(self, name)

    def getId(self) -> int:  # noqa: N802
        return self.id


class FieldRef:
    """A field of a vertex (``poplar::FieldRef``); ``f[i]`` names element ``i`` of a vector-list field."""

    __slots__ = ("vertex", "name", "index")

    def __init__(self, vertex: VertexRef, name: str, index: int | None = None):
        self.vertex, self.name, self.index = vertex, name, index

    def __getitem__(self, i: int) -> "FieldRef":
        return FieldRef(self.vertex, self.name, i)


# ----------------------------------------------------------------------------------------------


class VariableMappingMethod:
    NONE = "NONE"
    LINEAR = "LINEAR"


class TensorCloneMethod:
    PRESERVE_ORDER_AND_ALIASES = "PRESERVE_ORDER_AND_ALIASES"
    CREATE_NEW_ORDER = "CREATE_NEW_ORDER"
    PRESERVE_ORDER_UNLESS_ALIASES = "PRESERVE_ORDER_UNLESS_ALIASES"


CLONE_METHODS = frozenset(v for k, v in vars(TensorCloneMethod).items() if not k.startswith("_"))


class ReplicatedStreamMode:
    REPLICATE = "REPLICATE"
    BROADCAST = "BROADCAST"
