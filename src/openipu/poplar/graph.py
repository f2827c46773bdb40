"""``poplar::Graph``: variables, constants, tile mapping, compute sets, vertices, streams.

Storage model: each element type has one flat *address space* per top-level graph (``_Space``);
a variable or constant owns a contiguous range of it. Per space the graph keeps, as numpy
arrays over addresses, the tile each element is mapped to (-1: unmapped) and whether it is a
constant. A ``Tensor`` is an address array, so tile mapping, exchange and memory accounting are
array operations over addresses, never Python loops over tiles or elements.

Virtual graphs (``createVirtualGraph``) and replicated graphs (``createReplicatedGraph``) share
their parent's state and translate tile numbers.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from openipu.poplar import errors
from openipu.poplar.tensor import Interval, Tensor
from openipu.poplar.types import Type, as_type
from openipu.poplar.vertex import FieldSpec, Vertex, _Shape


# ----------------------------------------------------------------------------------------------
# storage bookkeeping
# ----------------------------------------------------------------------------------------------
@dataclass(eq=False)
class Variable:
    """A graph variable or constant: a contiguous range ``[start, start+numel)`` of its space."""

    id: int
    name: str
    type: Type
    start: int
    numel: int
    shape: tuple
    constant: bool = False
    init: torch.Tensor | None = None      # constant value / initial value (flat, storage dtype)

    @property
    def nbytes(self) -> int:
        return self.numel * self.type.size


class _Space:
    """The address space of one element type: tile of each element, constant flag, variables."""

    def __init__(self, type_: Type):
        self.type = type_
        self.size = 0
        self.tile = np.full(64, -1, np.int32)
        self.const = np.zeros(64, bool)
        self.vars: list[Variable] = []
        self._starts = np.zeros(0, np.int64)
        self._starts_n = 0

    def alloc(self, var: Variable) -> None:
        var.start = self.size
        self.size += var.numel
        if self.size > self.tile.size:
            # grow into one new buffer each (no temporaries); only [0, size) is ever written, so
            # the spare capacity costs no page faults until a later variable uses it
            cap = max(2 * self.size, 2 * self.tile.size)
            tile = np.empty(cap, np.int32)
            tile[:var.start] = self.tile[:var.start]
            const = np.zeros(cap, bool)
            const[:var.start] = self.const[:var.start]
            self.tile, self.const = tile, const
        self.tile[var.start:self.size] = -1
        if var.constant:
            self.const[var.start:self.size] = True
        self.vars.append(var)

    def __getstate__(self):
        # pickle (serialised executables) only the used part of the arrays, not spare capacity
        d = dict(self.__dict__)
        d["tile"], d["const"] = self.tile[:self.size].copy(), self.const[:self.size].copy()
        return d

    def starts(self) -> np.ndarray:
        if self._starts_n != len(self.vars):
            self._starts = np.array([v.start for v in self.vars], np.int64)
            self._starts_n = len(self.vars)
        return self._starts

    def variable_at(self, addr: int) -> Variable:
        return self.vars[int(np.searchsorted(self.starts(), addr, side="right")) - 1]

    def variable_index(self, addrs: np.ndarray) -> np.ndarray:
        addrs = np.asarray(addrs)
        if addrs.size and addrs.ndim == 1 and addrs[-1] - addrs[0] == addrs.size - 1:
            lo = int(np.searchsorted(self.starts(), addrs[0], side="right")) - 1
            hi = int(np.searchsorted(self.starts(), addrs[-1], side="right")) - 1
            if lo == hi:
                return np.full(addrs.size, lo, np.int64)
        return np.searchsorted(self.starts(), addrs, side="right") - 1

    def is_constant(self, addrs: np.ndarray) -> np.ndarray:
        return self.const[addrs]

    def tiles_of(self, addrs: np.ndarray) -> np.ndarray:
        return self.tile[addrs]


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
class VertexGroup:
    """Many vertices of one codelet type, described by arrays (how library ops add work).

    Attributes:
        type_name: the vertex type, e.g. ``popops::ScaledAdd2D<float>``.
        tiles: int array, the tile of each vertex (global tile numbers).
        cycles: int array, each vertex's cycle estimate (worker cycles for single-worker vertices,
            tile cycles when ``multi`` is true).
        kernel: ``kernel(ctx)`` runs the whole group functionally; ``ctx.read(t)`` / ``ctx.write(t, v)``
            access tensors with a leading replica dimension.
        reads / writes: ``[(tensor, consumer_tiles)]`` where ``consumer_tiles`` gives, for each
            flattened element of ``tensor``, the tile that reads or writes it (for exchange costs).
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
class _State:
    """What a top-level graph and all its virtual / replicated sub-graphs share."""

    def __init__(self, target, replication_factor: int):
        self.target = target
        self.replication_factor = replication_factor
        self.spaces: dict[str, _Space] = {}
        self.variables: list[Variable] = []
        self.compute_sets: list[ComputeSet] = []
        self.codelets: dict[str, type] = {}
        self.estimators: dict[str, Callable] = {}
        self.streams: dict[str, DataStream] = {}
        self.remote_buffers: dict[str, RemoteBuffer] = {}
        self.host_writes: dict[str, Tensor] = {}
        self.host_reads: dict[str, Tensor] = {}
        self.functions: list[Function] = []
        self.host_functions: dict[str, HostFunction] = {}
        # user vertices (addVertex), one entry per vertex id
        self.v_type: list[str] = []
        self.v_cs: list[int] = []
        self.v_tile: list[int] = []
        self.v_fields: list[dict] = []
        self.v_perf: list = []
        self.v_values: list[dict] = []

    def space(self, t: Type) -> _Space:
        sp = self.spaces.get(t.name)
        if sp is None:
            sp = self.spaces[t.name] = _Space(t)
        return sp

    def codelet_of_vertex(self, vid: int) -> type:
        return self.codelets[self.v_type[vid]]


def _tile_count(target) -> int:
    return target.getNumTiles()


class Graph:
    """``poplar::Graph(target, replication_factor=1)``.

    Tile numbers given to a graph are local to it: a virtual graph's tile 0 is its first tile,
    and a replicated graph's tiles are those of one replica. Errors are Poplar's classes (see
    :mod:`openipu.poplar.errors`).
    """

    def __init__(self, target, replication_factor: int = 1, *, _parent: "Graph | None" = None,
                 _tiles: np.ndarray | None = None):
        from openipu.poplar.device import Device, Target
        if isinstance(target, Device):
            target = target.getTarget()
        if not isinstance(target, Target):
            raise errors.graph_object_creation_error(f"Graph needs a poplar Target or Device, got {type(target).__name__}")
        if _parent is None:
            if replication_factor < 1 or target.getNumIPUs() % replication_factor and replication_factor > 1:
                raise errors.graph_object_creation_error(
                    f"Replication factor {replication_factor} does not divide the target's {target.getNumIPUs()} IPUs")
            self._state = _State(target, replication_factor)
            per_replica = target.getNumTiles() // replication_factor
            self._tiles = np.arange(per_replica, dtype=np.int32)
            self._target = target.replica_target(replication_factor) if replication_factor > 1 else target
            self._top = self
        else:
            self._state = _parent._state
            self._tiles = _tiles
            self._target = _parent._target.virtual(len(_tiles))
            self._top = _parent._top
        self._replication_factor = replication_factor

    # -- target and sub-graphs ------------------------------------------------------------
    def getTarget(self):  # noqa: N802
        return self._target

    def getReplicationFactor(self) -> int:  # noqa: N802
        return self._state.replication_factor

    def getTopLevelGraph(self) -> "Graph":  # noqa: N802
        return self._top

    def createVirtualGraph(self, low_or_tiles, high: int | None = None) -> "Graph":  # noqa: N802
        """``createVirtualGraph(lowTile, highTile)``, ``(numTilesPerIPU)`` or ``(list of tiles)``."""
        if isinstance(low_or_tiles, (list, tuple, np.ndarray)):
            local = np.asarray(low_or_tiles, np.int64)
        elif high is None:
            per_ipu = int(low_or_tiles)
            tpi = self._target.getTilesPerIPU()
            local = np.concatenate([np.arange(i * tpi, i * tpi + per_ipu) for i in range(self._target.getNumIPUs())])
        else:
            local = np.arange(int(low_or_tiles), int(high))
        if local.size == 0 or local.min() < 0 or local.max() >= self._tiles.size:
            raise errors.graph_object_creation_error(
                f"Virtual graph tiles must lie in [0, {self._tiles.size}) of the parent graph")
        return Graph(self._target, _parent=self, _tiles=self._tiles[local])

    def createReplicatedGraph(self, replication_factor: int) -> "Graph":  # noqa: N802
        if self._state.replication_factor != 1 or self._tiles.size % replication_factor:
            raise errors.graph_object_creation_error(
                f"Cannot replicate a graph of {self._tiles.size} tiles {replication_factor} times")
        st = self._state
        st.replication_factor = replication_factor
        g = Graph(self._target, _parent=self, _tiles=self._tiles[: self._tiles.size // replication_factor])
        g._target = self._target.replica_target(replication_factor)
        return g

    def _global_tile(self, local) -> int:
        n = self._tiles.size
        if not 0 <= local < n:
            raise errors.invalid_tile_mapping(
                f"Tile {int(local)} is out of range: this graph has {n} tiles (0..{n - 1})")
        return int(self._tiles[local])

    def _global_tiles(self, local) -> np.ndarray:
        local = np.asarray(local)
        if local.dtype.kind not in "iu":
            local = local.astype(np.int64)
        if local.size and (local.min() < 0 or local.max() >= self._tiles.size):
            bad = local[(local < 0) | (local >= self._tiles.size)][0]
            raise errors.invalid_tile_mapping(
                f"Tile {int(bad)} is out of range: this graph has {self._tiles.size} tiles (0..{self._tiles.size - 1})")
        if self._tiles_are_identity():
            return local          # local tile numbers are global ones (no per-element gather)
        return self._tiles[local]

    def _tiles_are_identity(self) -> bool:
        n = self._tiles.size
        return bool(n and self._tiles[0] == 0 and self._tiles[-1] == n - 1 and np.all(np.diff(self._tiles) == 1))

    def _local_tiles(self, glob: np.ndarray) -> np.ndarray:
        if self._tiles.size and self._tiles[0] == 0 and np.all(np.diff(self._tiles) == 1):
            return glob
        lut = np.full(max(int(self._tiles.max()) + 1, int(glob.max(initial=0)) + 1), -1, np.int64)
        lut[self._tiles] = np.arange(self._tiles.size)
        return np.where(glob >= 0, lut[np.maximum(glob, 0)], -1)

    # -- variables and constants ----------------------------------------------------------
    def _new_variable(self, type_, shape, name, constant=False, init=None) -> Tensor:
        t = as_type(type_)
        shape = tuple(int(s) for s in ([shape] if np.isscalar(shape) else shape))
        if any(s < 0 for s in shape):
            raise errors.graph_object_creation_error(f"Variable '{name}' has a negative dimension in {list(shape)}")
        numel = int(np.prod(shape, dtype=np.int64))
        st = self._state
        var = Variable(len(st.variables), name or f"var{len(st.variables)}", t, 0, numel, shape, constant, init)
        st.space(t).alloc(var)
        st.variables.append(var)
        addr = np.arange(var.start, var.start + numel, dtype=np.int64).reshape(shape)
        return Tensor(st, t, addr)

    def addVariable(self, type_, shape, mapping_or_name=None, name: str = "") -> Tensor:  # noqa: N802
        """``addVariable(type, shape[, VariableMappingMethod], debugName)`` -> Tensor.

        With ``VariableMappingMethod.LINEAR`` the variable is spread over the graph's tiles.
        """
        method = None
        if isinstance(mapping_or_name, str):
            name = mapping_or_name
        elif mapping_or_name is not None:
            method = mapping_or_name
        t = self._new_variable(type_, shape, name)
        if method == VariableMappingMethod.LINEAR:
            from openipu.poplar.mapping import linear_tile_mapping
            self.setTileMapping(t, linear_tile_mapping(self, t))
        return t

    def addConstant(self, type_, shape, values, name: str = "") -> Tensor:  # noqa: N802
        """``addConstant(type, shape, values|scalar, debugName)``: a compile-time constant tensor."""
        t = as_type(type_)
        shape = [shape] if np.isscalar(shape) else list(shape)
        numel = int(np.prod(shape, dtype=np.int64))
        arr = np.asarray(values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values)
        if arr.size == 1:
            arr = np.broadcast_to(arr.reshape(()), (numel,))
        elif arr.size != numel:
            raise errors.graph_object_creation_error(
                f"Constant '{name}' of shape {shape} needs {numel} values, got {arr.size}")
        if t.is_float and (arr.dtype, t.torch_dtype) in ((np.float32, torch.float32), (np.float16, torch.float16)):
            # already the storage dtype: one copy, no round trip through float64
            init = torch.from_numpy(np.array(arr, copy=True, order="C").reshape(-1))
        else:
            init = t.wrap(torch.as_tensor(np.ascontiguousarray(arr).reshape(-1).astype(np.float64 if t.is_float else np.int64)))
        return self._new_variable(t, shape, name, constant=True, init=init)

    def addConstantHalf(self, type_, shape, values, name: str = "") -> Tensor:  # noqa: N802
        return self.addConstant(type_, shape, np.asarray(values, np.float32), name)

    def clone(self, t_or_type, t: Tensor | None = None, name: str = "", method=None) -> Tensor:
        """``clone(tensor[, name])`` or ``clone(type, tensor[, name])``: same shape and tile mapping."""
        if isinstance(t_or_type, Tensor):
            src, type_ = t_or_type, t_or_type.elementType()
            if isinstance(t, str):
                name = t
        else:
            src, type_ = t, as_type(t_or_type)
        out = self._new_variable(type_, src.shape(), name or "clone")
        self.copy_tile_mapping(out, src)
        return out

    def cloneN(self, t: Tensor, n: int, name: str = "") -> Tensor:  # noqa: N802
        from openipu.poplar.tensor import concat
        return concat([self.clone(t, name).expand([0]) for _ in range(n)], 0)

    def addReplicationIndexConstant(self, name: str = "") -> Tensor:  # noqa: N802
        from openipu.poplar.types import UNSIGNED_INT
        t = self._new_variable(UNSIGNED_INT, [], name or "replicationIndex", constant=True,
                               init=torch.zeros(1, dtype=UNSIGNED_INT.torch_dtype))
        self._state.replication_index_vars = getattr(self._state, "replication_index_vars", []) + [t]
        return t

    def setInitialValue(self, target, values) -> None:  # noqa: N802
        """Set a tensor's (or a vertex field's) value at load time."""
        if isinstance(target, FieldRef):
            self._state.v_values[target.vertex.id][target.name] = values
            return
        t: Tensor = target
        arr = np.asarray(values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values)
        if arr.size == 1:
            arr = np.broadcast_to(arr.reshape(()), (t.numElements(),))
        if arr.size != t.numElements():
            raise errors.graph_object_creation_error(
                f"setInitialValue: tensor has {t.numElements()} elements, got {arr.size} values")
        self._state.initial_values = getattr(self._state, "initial_values", [])
        self._state.initial_values.append((t, torch.as_tensor(np.ascontiguousarray(arr).reshape(-1).astype(
            np.float64 if t.elementType().is_float else np.int64))))

    # -- tile mapping ---------------------------------------------------------------------
    def setTileMapping(self, target, mapping) -> None:  # noqa: N802
        """Map a tensor to one tile, or by a per-tile list of intervals; or map a vertex to a tile."""
        if isinstance(target, VertexRef):
            self._state.v_tile[target.id] = self._global_tile(mapping)
            return
        t: Tensor = target
        addr = t.flat_addresses()
        space = self._state.space(t._type)
        if isinstance(mapping, (int, np.integer)):
            space.tile[addr] = self._global_tile(mapping)
            return
        if isinstance(mapping, np.ndarray) and mapping.ndim == 1 and mapping.size == addr.size:
            tiles = self._global_tiles(mapping)   # per-element tiles (openipu extension)
            n = addr.size
            if n > 1 and int(addr[-1]) - int(addr[0]) == n - 1 and np.all(addr[1:] > addr[:-1]):
                space.tile[int(addr[0]):int(addr[0]) + n] = tiles     # a contiguous range: no scatter
            else:
                space.tile[addr] = tiles
            return
        per_elem = np.full(addr.size, -1, np.int64)
        for tile, intervals in enumerate(mapping):
            for iv in intervals:
                b, e = (iv.begin(), iv.end()) if isinstance(iv, Interval) else iv
                if not 0 <= b <= e <= addr.size:
                    raise errors.invalid_tile_mapping(f"Interval [{b}, {e}) is outside a tensor of {addr.size} elements")
                per_elem[b:e] = tile
        keep = per_elem >= 0
        space.tile[addr[keep]] = self._global_tiles(per_elem[keep])

    def getTileMapping(self, t: Tensor, is_complete: list | None = None) -> list[list[Interval]]:  # noqa: N802
        """Per tile of this graph, the intervals of ``t``'s flattened elements mapped there.

        Raises :class:`invalid_tile_mapping` if some element is unmapped (unless ``is_complete`` is
        given, a list whose first item is set to the answer).
        """
        tiles = self._local_tiles(self._state.space(t._type).tiles_of(t.flat_addresses()).astype(np.int64))
        complete = bool(np.all(tiles >= 0))
        if is_complete is not None:
            is_complete[:1] = [complete]
        elif not complete:
            raise errors.invalid_tile_mapping(
                f"Tensor {t.shortString()} is not completely mapped to tiles ({int((tiles < 0).sum())} elements unmapped)")
        out: list[list[Interval]] = [[] for _ in range(self._tiles.size)]
        if tiles.size == 0:
            return out
        brk = np.flatnonzero(np.diff(tiles) != 0) + 1
        starts = np.concatenate(([0], brk))
        ends = np.concatenate((brk, [tiles.size]))
        for s, e, tl in zip(starts.tolist(), ends.tolist(), tiles[starts].tolist()):
            if tl >= 0:
                out[tl].append(Interval(s, e))
        return out

    def getVariableTileMapping(self, t: Tensor):  # noqa: N802
        return self.getTileMapping(t)

    def copy_tile_mapping(self, dst: Tensor, src: Tensor) -> None:
        """Map each element of ``dst`` to the tile of the same element of ``src`` (equal element
        counts; unmapped stays unmapped). openipu extension, used by ``clone`` and PopLibs."""
        self.set_global_tile_mapping(dst, self.tile_of_elements(src))

    def set_global_tile_mapping(self, t: Tensor, tiles) -> None:
        """Map each flattened element of ``t`` to a *global* tile number (``tiles``: int array of
        ``t.numElements()`` entries, or broadcastable to it), without checks. openipu extension for
        PopLibs, which computes tiles in global numbering (see :meth:`tile_of_elements`)."""
        self._state.space(t._type).tile[t.flat_addresses()] = tiles

    def tile_of_elements(self, t: Tensor) -> np.ndarray:
        """Global tile of each flattened element of ``t`` (-1 when unmapped). openipu extension."""
        return self._state.space(t._type).tiles_of(t.flat_addresses())

    # -- codelets and estimators ----------------------------------------------------------
    def addCodelets(self, src, compile_flags: str = "") -> None:  # noqa: N802
        """Load codelets: a :class:`Vertex` subclass, a list of them, a module, or a ``.py`` file path.

        Raises :class:`graph_object_load_error` for a missing file or C++ source (openipu runs
        codelets written in Python; port the C++ ``compute()`` to a Python class).
        """
        for cls in _collect_codelets(src):
            self._state.codelets[cls.vertex_name] = cls

    def hasCodelet(self, name: str) -> bool:  # noqa: N802
        return name in self._state.codelets

    def registerPerfEstimator(self, vertex_type: str, fn: Callable) -> None:  # noqa: N802
        """``fn(vertex: VertexIntrospector, target) -> int | VertexPerfEstimate`` for every vertex of the type."""
        self._state.estimators[vertex_type] = fn

    # -- compute sets and vertices --------------------------------------------------------
    def addComputeSet(self, name: str = "") -> ComputeSet:  # noqa: N802
        st = self._state
        cs = ComputeSet(len(st.compute_sets), name or f"cs{len(st.compute_sets)}", st)
        st.compute_sets.append(cs)
        return cs

    def addVertex(self, cs: ComputeSet, vertex_type, connections: dict | None = None,
                  tile: int | None = None) -> VertexRef:  # noqa: N802
        """Add a vertex of a loaded codelet to ``cs``; ``connections`` maps field names to tensors.

        Raises :class:`unknown_vertex_type` if no codelet of that name is loaded.
        """
        st = self._state
        name = vertex_type.vertex_name if isinstance(vertex_type, type) else str(vertex_type)
        if name not in st.codelets:
            if isinstance(vertex_type, type) and issubclass(vertex_type, Vertex):
                st.codelets[name] = vertex_type
            else:
                raise errors.unknown_vertex_type(
                    f"Unknown vertex type '{name}': add its codelet with graph.addCodelets() before addVertex")
        vid = len(st.v_type)
        st.v_type.append(name)
        st.v_cs.append(cs.id)
        st.v_tile.append(-1)
        st.v_fields.append({})
        st.v_perf.append(None)
        st.v_values.append({})
        cs.user_vertices.append(vid)
        v = VertexRef(self, vid)
        for fname, t in (connections or {}).items():
            self.connect(v[fname], t)
        if tile is not None:
            self.setTileMapping(v, tile)
        return v

    def connect(self, fld: FieldRef, value) -> None:
        """Connect a vertex field to a tensor (or a list of tensors for a vector-list field).

        Raises :class:`graph_connection_error` for a tensor of the wrong type, a multi-element
        tensor on a scalar field, or a list on a non-list field.
        """
        st = self._state
        codelet = st.codelet_of_vertex(fld.vertex.id)
        spec: FieldSpec = codelet._fields[fld.name]
        vname = codelet.vertex_name
        if spec.direction == "value":
            self.setInitialValue(fld, value)
            return
        fields = st.v_fields[fld.vertex.id]
        if isinstance(value, (list, tuple)):
            if spec.shape != _Shape.VECTOR_LIST:
                raise errors.graph_connection_error(
                    f"Field '{fld.name}' of vertex type '{vname}' is not a list of vectors; connect one tensor to it")
            for x in value:
                _check_connect(vname, fld.name, spec, x)
            fields[fld.name] = list(value)
            return
        if not isinstance(value, Tensor):
            raise errors.graph_connection_error(f"Field '{fld.name}' of vertex type '{vname}' must be connected to a Tensor")
        _check_connect(vname, fld.name, spec, value)
        if fld.index is not None:
            lst = fields.setdefault(fld.name, [])
            while len(lst) <= fld.index:
                lst.append(None)
            lst[fld.index] = value
        elif spec.shape == _Shape.VECTOR_LIST:
            fields[fld.name] = [value]
        else:
            fields[fld.name] = value

    def setFieldSize(self, fld: FieldRef, n: int) -> None:  # noqa: N802
        lst = self._state.v_fields[fld.vertex.id].setdefault(fld.name, [])
        lst.extend([None] * (n - len(lst)))
        del lst[n:]

    def getFieldSize(self, fld: FieldRef) -> int:  # noqa: N802
        return len(self._state.v_fields[fld.vertex.id].get(fld.name, []))

    def setPerfEstimate(self, v: VertexRef, cycles: int, flops: int = 0) -> None:  # noqa: N802
        """The vertex's cycle estimate (worker cycles for a Vertex, tile cycles for a MultiVertex)."""
        self._state.v_perf[v.id] = (int(cycles), int(flops))

    setCycleEstimate = setPerfEstimate

    def getPerfEstimate(self, v: VertexRef):  # noqa: N802
        return self._state.v_perf[v.id]

    def getNumVertices(self) -> int:  # noqa: N802
        st = self._state
        return len(st.v_type) + sum(int(g.tiles.size) for cs in st.compute_sets for g in cs.groups)

    def add_vertex_group(self, cs: ComputeSet, group: VertexGroup) -> None:
        """Add a library vertex group (tiles already global). Used by PopLibs; not a Poplar API."""
        cs.groups.append(group)

    # -- host I/O -------------------------------------------------------------------------
    def createHostWrite(self, handle: str, t: Tensor, rearrange_on_host: bool = False) -> None:  # noqa: N802
        self._check_handle(handle)
        self._state.host_writes[handle] = t

    def createHostRead(self, handle: str, t: Tensor, rearrange_on_host: bool = False) -> None:  # noqa: N802
        self._check_handle(handle)
        self._state.host_reads[handle] = t

    def _check_handle(self, handle):
        st = self._state
        if handle in st.host_writes or handle in st.host_reads or handle in st.streams:
            raise errors.graph_object_creation_error(f"Handle '{handle}' is already in use in this graph")

    def addHostToDeviceFIFO(self, handle: str, type_, num_elements: int,  # noqa: N802
                            replicated_mode="REPLICATE", options=None) -> DataStream:
        self._check_handle(handle)
        s = DataStream(handle, as_type(type_), int(num_elements), True, str(replicated_mode))
        self._state.streams[handle] = s
        return s

    def addDeviceToHostFIFO(self, handle: str, type_, num_elements: int, options=None) -> DataStream:  # noqa: N802
        self._check_handle(handle)
        s = DataStream(handle, as_type(type_), int(num_elements), False)
        self._state.streams[handle] = s
        return s

    def addRemoteBuffer(self, handle: str, type_, num_elements: int, repeats: int = 1,  # noqa: N802
                        rearrange_on_host: bool = False, optimise_memory: bool = False) -> RemoteBuffer:
        rb = RemoteBuffer(handle, as_type(type_), int(num_elements), int(repeats))
        self._state.remote_buffers[handle] = rb
        return rb

    # -- functions ------------------------------------------------------------------------
    def addFunction(self, program) -> Function:  # noqa: N802
        f = Function(len(self._state.functions), program)
        self._state.functions.append(f)
        return f

    def addHostFunction(self, handle: str, inputs, outputs) -> HostFunction:  # noqa: N802
        hf = HostFunction(handle, list(inputs), list(outputs))
        self._state.host_functions[handle] = hf
        return hf

    # -- introspection --------------------------------------------------------------------
    def getComputeSets(self) -> list[ComputeSet]:  # noqa: N802
        return list(self._state.compute_sets)


class VariableMappingMethod:
    NONE = "NONE"
    LINEAR = "LINEAR"


class TensorCloneMethod:
    PRESERVE_ORDER_AND_ALIASES = "PRESERVE_ORDER_AND_ALIASES"
    CREATE_NEW_ORDER = "CREATE_NEW_ORDER"
    PRESERVE_ORDER_UNLESS_ALIASES = "PRESERVE_ORDER_UNLESS_ALIASES"


class ReplicatedStreamMode:
    REPLICATE = "REPLICATE"
    BROADCAST = "BROADCAST"


def _check_connect(vname: str, fname: str, spec: FieldSpec, t: Tensor) -> None:
    if t.elementType() != spec.type:
        raise errors.graph_connection_error(
            f"Cannot connect field '{fname}' of vertex type '{vname}': the field has type {spec.type} "
            f"but the tensor has type {t.elementType()}")
    if spec.shape == _Shape.SCALAR and t.numElements() != 1:
        raise errors.graph_connection_error(
            f"Cannot connect field '{fname}' of vertex type '{vname}': it holds one {spec.type} but the tensor "
            f"has {t.numElements()} elements (shape {t.shape()})")


def _collect_codelets(src) -> list[type]:
    if isinstance(src, type):
        if not issubclass(src, Vertex):
            raise errors.graph_object_load_error(f"{src.__name__} is not a poplar.Vertex subclass")
        return [src]
    if isinstance(src, (list, tuple)):
        return [c for s in src for c in _collect_codelets(s)]
    if inspect.ismodule(src):
        return [v for v in vars(src).values()
                if isinstance(v, type) and issubclass(v, Vertex) and v.__module__ == src.__name__]
    path = os.fspath(src)
    if not os.path.exists(path):
        raise errors.graph_object_load_error(f"Codelet file '{path}' not found")
    if not path.endswith(".py"):
        raise errors.graph_object_load_error(
            f"Cannot load codelets from '{path}': openipu runs codelets written in Python. "
            "Port the vertex to a poplar.Vertex subclass in a .py file")
    spec = importlib.util.spec_from_file_location(f"_codelets_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return _collect_codelets(mod)
