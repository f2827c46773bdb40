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
from openipu.poplar import regions as R
from openipu.poplar import tilemap
from openipu.poplar.deferred import DeferredValue
from openipu.poplar.tensor import Interval, Tensor
from openipu.poplar.types import Type, as_type
from openipu.poplar.vertex import FieldSpec, Vertex, _Shape
from openipu.poplar import sets as _sets


# ----------------------------------------------------------------------------------------------
# storage bookkeeping
# ----------------------------------------------------------------------------------------------
@dataclass(eq=False)
class Variable:
    """A graph variable or constant: a contiguous range ``[start, start+numel)`` of its space.

    Its tile mapping is run-length (:mod:`openipu.poplar.tilemap`): ``tile_starts`` / ``tile_ids``.
    Mapping calls queue their intervals and are applied together when the mapping is next read,
    so mapping a variable slice by slice costs one sort, not one pass per call.
    """

    id: int
    name: str
    type: Type
    start: int
    numel: int
    shape: tuple
    constant: bool = False
    init: Any = None      # constant value / initial value (flat, storage dtype), or a DeferredValue
    space_index: int = -1                  # position in its type's space
    metadata: Any = None                   # QUARTER: its QUARTER_METADATA tensor (None: F143, scale 0)
    quarter_format: str | None = None      # QUARTER_METADATA: the format it names ("F143" / "F152")
    _ts: np.ndarray = field(default_factory=lambda: tilemap.unmapped()[0], repr=False)
    _ti: np.ndarray = field(default_factory=lambda: tilemap.unmapped()[1], repr=False)
    _pending: list = field(default_factory=list, repr=False)

    @property
    def nbytes(self) -> int:
        return self.numel * self.type.size

    def initial(self) -> torch.Tensor | None:
        """The constant's or initial value (flat, storage dtype), made now if it was deferred
        (:mod:`openipu.poplar.deferred`); ``None`` if it has none."""
        if isinstance(self.init, DeferredValue):
            self.init = self.init.resolve()
        return self.init

    def _flush(self) -> None:
        if self._pending:
            b = np.concatenate([np.atleast_1d(p[0]) for p in self._pending]).astype(np.int64, copy=False)
            e = np.concatenate([np.atleast_1d(p[1]) for p in self._pending]).astype(np.int64, copy=False)
            t = np.concatenate([np.atleast_1d(p[2]) for p in self._pending]).astype(np.int32, copy=False)
            self._pending = []
            self._ts, self._ti = tilemap.assign(self._ts, self._ti, self.numel, b, e, t)

    @property
    def tile_starts(self) -> np.ndarray:
        self._flush()
        return self._ts

    @property
    def tile_ids(self) -> np.ndarray:
        self._flush()
        return self._ti

    def map_intervals(self, b, e, t) -> None:
        """Queue: elements ``[b[i], e[i])`` (variable indices) go to global tile ``t[i]``; later
        calls win where intervals overlap. Scalars or arrays."""
        if isinstance(b, int):
            if b <= 0 and e >= self.numel:
                self._pending = []
                self._ts, self._ti = np.zeros(1, np.int64), np.array([t], np.int32)
                return
            self._pending.append((b, e, t))
            return
        b = np.asarray(b, np.int64).reshape(-1)
        e = np.asarray(e, np.int64).reshape(-1)
        t = np.asarray(t, np.int32)
        if t.size != b.size:
            t = np.broadcast_to(t, b.shape)
        if b.size == 1 and b[0] <= 0 and e[0] >= self.numel:
            self._pending = []
            self._ts, self._ti = np.zeros(1, np.int64), t[:1].copy()
            return
        if self._pending and int((e - b).sum()) == self.numel:
            order = np.argsort(b, kind="stable")
            bs, es = b[order], e[order]
            if bs[0] == 0 and es[-1] == self.numel and np.array_equal(bs[1:], es[:-1]):
                self._pending = []            # this batch covers the whole variable: earlier ones are moot
        self._pending.append((b, e, t))

    def tile_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(begin, end, tile)`` of each run of the mapping (element indices of the variable)."""
        s = self.tile_starts
        return s, tilemap.ends(s, self.numel), self.tile_ids


class _Space:
    """The address space of one element type: its variables, laid end to end.

    Tile mappings live in the variables (run-length); :meth:`runs` joins them into one sorted
    index over the space, rebuilt only after a mapping changes.
    """

    def __init__(self, type_: Type):
        self.type = type_
        self.size = 0
        self.vars: list[Variable] = []
        self._starts = np.zeros(0, np.int64)
        self._starts_n = 0
        self.version = 0
        self._runs = None

    def alloc(self, var: Variable) -> None:
        var.start = self.size
        var.space_index = len(self.vars)
        self.size += var.numel
        self.vars.append(var)
        self.version += 1

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_runs"] = None
        return d

    def _reset_caches(self) -> None:
        """Empty the caches (after the space is read from a file, which does not hold them)."""
        self._starts, self._starts_n, self._runs = np.zeros(0, np.int64), 0, None

    def starts(self) -> np.ndarray:
        if self._starts_n != len(self.vars):
            self._starts = np.array([v.start for v in self.vars], np.int64)
            self._starts_n = len(self.vars)
        return self._starts

    def variable_at(self, addr: int) -> Variable:
        return self.vars[int(np.searchsorted(self.starts(), addr, side="right")) - 1]

    def variable_index(self, addrs: np.ndarray) -> np.ndarray:
        """Index (in this space's variable list) of the variable holding each address."""
        addrs = np.asarray(addrs)
        if addrs.size and addrs.ndim == 1 and addrs[-1] - addrs[0] == addrs.size - 1:
            lo = int(np.searchsorted(self.starts(), addrs[0], side="right")) - 1
            hi = int(np.searchsorted(self.starts(), addrs[-1], side="right")) - 1
            if lo == hi:
                return np.full(addrs.size, lo, np.int64)
        return np.searchsorted(self.starts(), addrs, side="right") - 1

    def map_intervals(self, var: Variable, b, e, t) -> None:
        """Map elements ``[b, e)`` of ``var`` (variable indices, arrays) to global tiles ``t``."""
        var.map_intervals(b, e, t)
        self.version += 1

    def runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every run of every variable of the space, sorted by address: ``(start address, tile,
        index of the variable in this space)`` (int64, int32, int64)."""
        if self._runs is None or self._runs[0] != self.version:
            if self.vars:
                st = np.concatenate([v.tile_starts + v.start for v in self.vars])
                tl = np.concatenate([v.tile_ids for v in self.vars])
                vi = np.repeat(np.arange(len(self.vars)), [v.tile_starts.size for v in self.vars])
            else:
                st, tl, vi = np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64)
            self._runs = (self.version, st, tl, vi)
        return self._runs[1:]

    def runs_of(self, space_indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Like :meth:`runs` for some variables only (indices into :attr:`vars`): their runs,
        sorted by address. Cheap when few variables are asked for."""
        idx = _sets.unique(np.asarray(space_indices, np.int64))
        if idx.size > len(self.vars) // 2:
            return self.runs()
        vs = [self.vars[i] for i in idx.tolist()]
        if len(vs) == 1:
            v = vs[0]
            return v.tile_starts + v.start, v.tile_ids, np.full(v.tile_starts.size, idx[0], np.int64)
        st = np.concatenate([v.tile_starts + v.start for v in vs])
        tl = np.concatenate([v.tile_ids for v in vs])
        vi = np.repeat(idx, [v.tile_starts.size for v in vs])
        return st, tl, vi

    def run_ends(self, starts: np.ndarray, var_idx: np.ndarray) -> np.ndarray:
        """End address of each run from :meth:`runs_of` (the next run's start, or its variable's end)."""
        ends = np.append(starts[1:], 0)
        last = np.r_[var_idx[1:] != var_idx[:-1], True]
        var_end = np.array([self.vars[i].start + self.vars[i].numel for i in var_idx[last].tolist()], np.int64)
        ends[last] = var_end
        return ends

    def is_constant(self, addrs: np.ndarray) -> np.ndarray:
        const = np.array([v.constant for v in self.vars], bool)
        return const[self.variable_index(np.asarray(addrs))] if const.size else np.zeros(np.shape(addrs), bool)

    def tiles_of(self, addrs: np.ndarray) -> np.ndarray:
        """Global tile of each address (int32, -1 where unmapped)."""
        addrs = np.asarray(addrs)
        if addrs.size == 0:
            return np.zeros(addrs.shape, np.int32)
        ends = self.variable_index(np.array([addrs.min(), addrs.max()]))
        used = ends[:1] if ends[0] == ends[1] else _sets.unique(self.variable_index(addrs.reshape(-1)))
        st, tl, _ = self.runs_of(used)
        return tl[np.searchsorted(st, addrs, side="right") - 1]


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
        sp = self.spaces.get(t.space)
        if sp is None:
            sp = self.spaces[t.space] = _Space(t)
        return sp

    def codelet_of_vertex(self, vid: int) -> type:
        return self.codelets[self.v_type[vid]]


def _tile_count(target) -> int:
    return target.getNumTiles()



def _storage_values(t, arr: np.ndarray) -> torch.Tensor:
    """``arr`` flattened into a new tensor of type ``t``'s storage dtype. Floats convert in one
    step (float16 / float32 / float64 values are exact in float64, so this rounds as a trip through
    float64 would, without a float64 copy of the weights); integers wrap to ``t``'s range."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    if t.is_float and flat.dtype.kind == "f":
        if t.torch_dtype in (torch.float16, torch.float32):
            return torch.from_numpy(flat.astype(t.numpy_dtype))    # a new array, rounded to nearest even
        return torch.from_numpy(flat.astype(np.float64)).to(t.torch_dtype)
    return t.wrap(torch.as_tensor(flat.astype(np.float64 if t.is_float else np.int64)))

def _fresh_storage(t, arr) -> torch.Tensor:
    """A flat array made for ``t``'s storage (nobody else holds it) as its storage tensor: taken
    without a copy when it is of the storage dtype (float16 / float32), else converted."""
    if (isinstance(arr, np.ndarray) and arr.ndim == 1 and arr.flags.c_contiguous and t.is_float
            and t.torch_dtype in (torch.float16, torch.float32) and arr.dtype == t.numpy_dtype):
        return torch.from_numpy(arr)
    return _storage_values(t, arr)


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
        return Tensor(st, t, pieces=R.Pieces.of_variable(var.id, var.start, shape), shape=shape)

    def _quarter_args(self, type_, args: tuple, what: str):
        """``(storage type, metadata tensor or None, rest of args)`` for the QUARTER forms that take
        a metadata tensor after the type (``addVariable(QUARTER, metadata, shape, ...)``)."""
        from openipu.poplar import quarter
        t = as_type(type_)
        md = None
        if args and isinstance(args[0], Tensor) and args[0].elementType() == quarter.QUARTER_METADATA:
            md, args = args[0], args[1:]
        elif args and isinstance(args[0], quarter.QuarterMetadata):
            m = args[0]
            md = quarter.createConstantMetadataTensor(self, m.getFormat(), m.getScale(), f"{what}/metadata")
            args = args[1:]
        if md is None:
            return t, None, args
        if not t.requiresMetadata():
            raise errors.graph_connection_error(f"{what}: only QUARTER tensors take metadata, not {t}")
        quarter.check_metadata_tensor(md, what)
        return quarter.storage_type(self._metadata_format(md)), md, args

    def _metadata_format(self, md: Tensor):
        """The format a metadata tensor names, read from its initial value (the format of a
        metadata tensor is fixed when it is created)."""
        from openipu.poplar import quarter
        var = self._state.variables[int(md.pieces.var[0])]
        if var.quarter_format is not None:
            return quarter.as_format(var.quarter_format)
        b = self.metadata_byte(md)
        if b is None:
            return quarter.QuarterMetadata.Format.F143
        return quarter.QuarterMetadata.Format.F143 if b & 0x40 else quarter.QuarterMetadata.Format.F152

    def metadata_byte(self, md: Tensor) -> int | None:
        """The value a metadata tensor is created with (a constant's, or its initial value), or
        None when a program computes it (openipu helper)."""
        var = self._state.variables[int(md.pieces.var[0])]
        init = var.initial()
        if init is None:
            for t, values in getattr(self._state, "initial_values", []):
                if int(t.pieces.var[0]) == var.id:
                    init = values
        return None if init is None else int(init.reshape(-1)[0])

    def set_quarter_metadata(self, t: Tensor, md: Tensor | None) -> None:
        """Record ``md`` as the metadata of every variable ``t`` covers (openipu helper)."""
        for vid in _sets.unique(np.asarray(t.pieces.var)).tolist():
            self._state.variables[int(vid)].metadata = md

    def addVariable(self, type_, shape, mapping_or_name=None, name: str = "", *rest) -> Tensor:  # noqa: N802
        """``addVariable(type, shape[, VariableMappingMethod], debugName)`` -> Tensor; for QUARTER
        also ``addVariable(QUARTER, metadata, shape[, method], debugName)`` with a
        ``QUARTER_METADATA`` tensor (or a :class:`~openipu.poplar.quarter.QuarterMetadata`): the
        elements are stored in the metadata's format.

        With ``VariableMappingMethod.LINEAR`` the variable is spread over the graph's tiles.
        """
        type_, md, args = self._quarter_args(type_, (shape, mapping_or_name, name) + rest, "addVariable")
        if md is not None:
            shape, mapping_or_name, name = (list(args) + [None, ""])[:3]
            name = name or ""
        method = None
        if isinstance(mapping_or_name, str):
            name = mapping_or_name
        elif mapping_or_name is not None:
            method = mapping_or_name
        t = self._new_variable(type_, shape, name)
        if md is not None:
            self.set_quarter_metadata(t, md)
        if method == VariableMappingMethod.LINEAR:
            from openipu.poplar.mapping import map_linearly
            map_linearly(self, t)
        return t

    def addConstant(self, type_, shape, values, name: str = "", *rest) -> Tensor:  # noqa: N802
        """``addConstant(type, shape, values|scalar, debugName)``: a compile-time constant tensor.
        QUARTER also ``addConstant(QUARTER, metadata, shape, values, debugName)`` (a metadata tensor
        or a :class:`~openipu.poplar.quarter.QuarterMetadata`): ``values`` are the elements'
        values, stored as ``fp8(values * 2**-scale)`` in the metadata's format (saturated)."""
        t, md, args = self._quarter_args(type_, (shape, values, name) + rest, "addConstant")
        if md is not None:
            from openipu.poplar import quarter
            shape, values, name = (list(args) + [""])[:3]
            scale = quarter.metadata_initial_scale(self, md)
            fmt = quarter.format_of_type(t)
            arr = np.asarray(values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values, np.float32)
            vals = quarter.quantize_values(torch.from_numpy(np.ascontiguousarray(arr)), fmt, -scale)
            c = self.addConstant(t, shape, vals.float(), name)
            self.set_quarter_metadata(c, md)
            return c
        shape = [shape] if np.isscalar(shape) else list(shape)
        numel = int(np.prod(shape, dtype=np.int64))
        arr = np.asarray(values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else values)
        if arr.size == 1:
            arr = np.broadcast_to(arr.reshape(()), (numel,))
        elif arr.size != numel:
            raise errors.graph_object_creation_error(
                f"Constant '{name}' of shape {shape} needs {numel} values, got {arr.size}")
        return self._new_variable(t, shape, name, constant=True, init=_storage_values(t, arr))

    def add_deferred_constant(self, type_, shape, make: Callable[[], np.ndarray], name: str = "") -> Tensor:
        """A constant of ``type_`` and ``shape`` whose values ``make()`` returns (an array of
        ``shape``'s element count, row-major) when they are first read: when device storage is
        built or the graph is saved, never in an offline compile. ``make`` must read only arrays
        its caller will not change afterwards. openipu extension (``addConstant`` without the
        up-front conversion; the lowering's weights use it)."""
        t = as_type(type_)
        shape = [shape] if np.isscalar(shape) else list(shape)
        numel = int(np.prod(shape, dtype=np.int64))
        return self._new_variable(t, shape, name, constant=True,
                                  init=DeferredValue(lambda: _storage_values(t, np.asarray(make())), numel))

    def addConstantHalf(self, type_, shape, values, name: str = "") -> Tensor:  # noqa: N802
        return self.addConstant(type_, shape, np.asarray(values, np.float32), name)

    def clone(self, t_or_type, t: Tensor | None = None, name: str = "", method=None, *rest) -> Tensor:
        """``clone(tensor[, name][, method])`` or ``clone(type, tensor[, name][, method])``: a new
        variable with ``tensor``'s shape and tile mapping (``poplar::Graph::clone``). ``method`` is
        a :class:`TensorCloneMethod`; the default, ``PRESERVE_ORDER_UNLESS_ALIASES``, stores the
        elements in ``tensor``'s memory order (see :meth:`clone_layout`). QUARTER:
        ``clone(QUARTER, metadata, tensor[, name][, method])``; a clone of a QUARTER tensor shares
        its metadata."""
        md = None
        if isinstance(t_or_type, Tensor):                 # clone(tensor, name, method)
            src, type_ = t_or_type, t_or_type.elementType()
            md = src.getMetadata() if src.hasMetadata() else None
            if isinstance(t, str):
                name, method = t, (name or method)
        else:
            type_, md, args = self._quarter_args(t_or_type, (t, name, method) + rest, "clone")
            if md is not None:
                t, name, method = (list(args) + ["", None])[:3]
                name = name or ""
            src = t
        if isinstance(name, str) and name in _CLONE_METHODS:
            name, method = "", name
        out = self.clone_layout(type_, src, name or "clone", method)
        if md is not None:
            self.set_quarter_metadata(out, md)
        return out

    def clone_layout(self, type_, src: Tensor, name: str, method=None) -> Tensor:
        """A new variable of ``type_`` with ``src``'s shape and tile mapping.

        Unless ``method`` is ``TensorCloneMethod.CREATE_NEW_ORDER`` or ``src`` holds aliases (a
        broadcast), the variable is created with its dims in the memory order of ``src``'s largest
        piece and the returned tensor is its ``dimShuffle`` back to ``src``'s shape, as Poplar's
        default clone preserves the element order: a clone of a transposed view is a transposed
        view, whose tile map has as many runs as ``src``'s, not one per element. A view of a
        blocked variable (several pieces of one variable) is cloned block by block
        (:meth:`_clone_pieces`). openipu extension behind :meth:`clone` and PopLibs' output
        allocation."""
        if method != TensorCloneMethod.CREATE_NEW_ORDER and _blocked(src.pieces):
            perm = memory_order(src)
            if perm is None:
                return self._clone_pieces(type_, src, name)
            # the blocks in the memory order of the source's largest block
            inv = [perm.index(d) for d in range(len(perm))]
            return self._clone_pieces(type_, src.dimShuffle(perm), name).dimShuffle(inv)
        perm = None if method == TensorCloneMethod.CREATE_NEW_ORDER else memory_order(src)
        if perm is None:
            out = self._new_variable(type_, src.shape(), name)
            self.copy_tile_mapping(out, src)
            return out
        shape = src.shape()
        var = self._new_variable(type_, [shape[d] for d in perm], name)
        b, e, tl = self.tile_runs_of(src, perm)
        keep = tl >= 0
        self.set_tile_runs(var, b[keep], e[keep], tl[keep])
        return var.dimShuffle([perm.index(d) for d in range(len(perm))])

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
        self._state.initial_values.append((t, _storage_values(t.elementType(), arr)))

    # -- tile mapping ---------------------------------------------------------------------
    def setTileMapping(self, target, mapping) -> None:  # noqa: N802
        """Map a tensor to one tile, or by a per-tile list of intervals of its flattened elements
        (``poplar::Graph::TileToTensorMapping``); or map a vertex to a tile. A per-element numpy
        array of tiles is accepted too (openipu extension). Raises ``invalid_tile_mapping`` for a
        tile out of range or an interval outside the tensor."""
        if isinstance(target, VertexRef):
            self._state.v_tile[target.id] = self._global_tile(mapping)
            return
        t: Tensor = target
        n = t.numElements()
        if isinstance(mapping, (int, np.integer)):
            self._assign_set(t, self._global_tile(mapping))
            return
        if isinstance(mapping, np.ndarray) and mapping.ndim == 1 and mapping.size == n:
            self._assign_elements(t, self._global_tiles(mapping))   # per-element tiles (openipu extension)
            return
        b, e, tl = [], [], []
        for tile, intervals in enumerate(mapping):
            for iv in intervals:
                lo, hi = (iv.begin(), iv.end()) if isinstance(iv, Interval) else iv
                if not 0 <= lo <= hi <= n:
                    raise errors.invalid_tile_mapping(f"Interval [{lo}, {hi}) is outside a tensor of {n} elements")
                b.append(lo)
                e.append(hi)
                tl.append(tile)
        if not b:
            return
        self.set_tile_runs(t, np.array(b, np.int64), np.array(e, np.int64), self._global_tiles(np.array(tl, np.int64)))

    def set_tile_runs(self, t: Tensor, begins: np.ndarray, ends: np.ndarray, tiles: np.ndarray) -> None:
        """Map the flattened elements ``[begins[i], ends[i])`` of ``t`` to *global* tile ``tiles[i]``
        (int arrays; no checks). openipu extension: PopLibs' vectorised ``setTileMapping``."""
        flat = _flat_view(t)
        if flat is not None:
            space = self._state.space(t._type)
            var, off = flat
            space.map_intervals(var, begins + off, ends + off, tiles)
            return
        # any view: flat ranges -> boxes -> pieces -> address runs of each variable
        begins = np.asarray(begins, np.int64).reshape(-1)
        ends = np.asarray(ends, np.int64).reshape(-1)
        tiles = np.broadcast_to(np.asarray(tiles, np.int64), begins.shape)
        owner, lo, sz = R.range_boxes(begins, ends, t.shape())
        if owner.size == 0:
            return
        from openipu.poplar.exchange import Boxes
        self.set_tile_boxes(t, Boxes(lo, sz, tiles[owner]))

    def set_tile_boxes(self, t: Tensor, boxes) -> None:
        """Map the boxes (``exchange.Boxes`` of ``t``'s index space, disjoint) to their *global*
        tiles: each box is laid over ``t``'s pieces and mapped as the runs of consecutive
        addresses it covers. Host work follows boxes and runs. openipu extension."""
        if len(boxes) == 0:
            return
        from openipu.poplar.exchange import lattices
        bi, var_ids, base, T, n, _ = lattices(t, boxes)
        o2, start, length = R.address_runs(base, n, T)
        self._assign_address_runs(t, var_ids[o2], start, length, np.asarray(boxes.tile, np.int64)[bi][o2])

    def _assign_set(self, t: Tensor, tile: int) -> None:
        """Every element of ``t`` to one global tile (set semantics: one run per address run)."""
        p = t.pieces
        if len(p) == 0:
            return
        row = p.row
        if row is not None and R._dense(row[3], row[4]):        # consecutive addresses: one interval
            var = self._state.variables[row[0]]
            b = row[1] - var.start
            n = 1
            for s_ in row[3]:
                n *= s_
            var.map_intervals(b, b + n, int(tile))
            self._state.space(t._type).version += 1
            return
        var_ids, start, length = R.piece_runs(p)
        self._assign_address_runs(t, var_ids, start, length, tile)

    def _assign_address_runs(self, t: Tensor, var_ids, start, length, tiles) -> None:
        space = self._state.space(t._type)
        tiles = np.broadcast_to(np.asarray(tiles), np.shape(start))
        variables = self._state.variables
        if var_ids.size == 1:
            var = variables[int(var_ids[0])]
            space.map_intervals(var, start - var.start, start - var.start + length, tiles)
            return
        for v in _sets.unique(var_ids).tolist():
            m = var_ids == v
            var = variables[v]
            s0 = start[m] - var.start
            space.map_intervals(var, s0, s0 + length[m], tiles[m])

    def _assign_elements(self, t: Tensor, tiles: np.ndarray) -> None:
        """Per flattened element of ``t``, a global tile (-1: leave as it is)."""
        n = t.numElements()
        if n == 0:
            return
        tiles = np.broadcast_to(np.asarray(tiles), (n,))
        flat = _flat_view(t)
        if flat is not None:
            var, off = flat
            b, tl = tilemap.from_per_element(tiles)
            e = np.append(b[1:], n)
            keep = tl >= 0
            space = self._state.space(t._type)
            space.map_intervals(var, b[keep] + off, e[keep] + off, tl[keep])
            return
        addr = t.flat_addresses()
        keep = tiles >= 0
        addr, tiles = addr[keep], tiles[keep]
        order = np.argsort(addr, kind="stable")
        addr, tiles = addr[order], tiles[order]
        space = self._state.space(t._type)
        vi = space.variable_index(addr)
        if addr.size == 0:
            return
        brk = np.flatnonzero((np.diff(addr) > 1) | (np.diff(tiles) != 0) | (np.diff(vi) != 0)) + 1
        starts = np.concatenate(([0], brk))
        lens = np.diff(np.append(starts, addr.size))
        var_ids = np.array([v.id for v in space.vars], np.int64)[vi[starts]]
        # repeated addresses (aliases) collapse: a run's length counts distinct addresses
        dist = np.add.reduceat(np.r_[1, np.diff(addr) != 0].astype(np.int64), starts)
        self._assign_address_runs(t, var_ids, addr[starts], np.minimum(lens, dist), tiles[starts])

    def getTileMapping(self, t: Tensor, is_complete: list | None = None) -> list[list[Interval]]:  # noqa: N802
        """Per tile of this graph, the intervals of ``t``'s flattened elements mapped there.

        Raises :class:`invalid_tile_mapping` if some element is unmapped (unless ``is_complete`` is
        given, a list whose first item is set to the answer).
        """
        starts, ends, tiles = self.tile_runs_of(t)
        tiles = self._local_tiles(tiles.astype(np.int64)) if tiles.size else tiles.astype(np.int64)
        unmapped = int((ends - starts)[tiles < 0].sum())
        if is_complete is not None:
            is_complete[:1] = [unmapped == 0]
        elif unmapped:
            raise errors.invalid_tile_mapping(
                f"Tensor {t.shortString()} is not completely mapped to tiles ({unmapped} elements unmapped)")
        out: list[list[Interval]] = [[] for _ in range(self._tiles.size)]
        for s, e, tl in zip(starts.tolist(), ends.tolist(), tiles.tolist()):
            if tl >= 0:
                out[tl].append(Interval(s, e))
        return out

    def getVariableTileMapping(self, t: Tensor):  # noqa: N802
        return self.getTileMapping(t)

    def add_blocks(self, type_, shape, lo: np.ndarray, sz: np.ndarray, name: str, values=None) -> Tensor:
        """A new tensor of ``shape`` made of the boxes ``lo``, ``sz`` ``[k, rank]`` (a partition of
        its index space), stored one after the other, each row-major inside
        (:func:`regions.stacked_pieces`). ``values``: a constant's values in that memory order
        (flat), else a variable; a flat array already of the type's storage dtype (float16 /
        float32) becomes the constant's storage without a copy (the caller hands it over), and
        a :class:`~openipu.poplar.deferred.DeferredValue` of ``numel`` elements is made when first
        read. Unmapped. openipu extension for PopLibs' blocked layouts."""
        numel = int(np.prod(sz, axis=1, dtype=np.int64).sum())
        t = as_type(type_)
        if values is None:
            flat = self._new_variable(type_, [numel], name)
        elif isinstance(values, DeferredValue):
            if values.numel != numel:
                raise errors.graph_object_creation_error(
                    f"Constant '{name}' of {numel} elements given a deferred value of {values.numel}")
            flat = self._new_variable(type_, [numel], name, constant=True,
                                      init=DeferredValue(lambda: _fresh_storage(t, values.resolve()), numel))
        elif (isinstance(values, np.ndarray) and values.ndim == 1 and values.size == numel
              and values.flags.c_contiguous and t.is_float and t.torch_dtype in (torch.float16, torch.float32)
              and values.dtype == t.numpy_dtype):
            flat = self._new_variable(type_, [numel], name, constant=True, init=torch.from_numpy(values))
        else:
            flat = self.addConstant(type_, [numel], values, name)
        var, start = flat.pieces.row[0], flat.pieces.row[1]
        return Tensor(self._state, flat._type, pieces=R.stacked_pieces(var, start, lo, sz),
                      shape=tuple(int(x) for x in shape))

    def _clone_pieces(self, type_, src: Tensor, name: str) -> Tensor:
        """A clone of a view of several pieces: the same pieces (each row-major, stored one after
        the other in the order of the source's addresses), mapped like ``src`` box by box."""
        from openipu.poplar.exchange import tile_boxes
        p = src.pieces
        order = np.lexsort((p.addr, p.var))
        out = self.add_blocks(type_, src.shape(), p.lo[order], p.sz[order], name)
        boxes = tile_boxes(src)
        keep = boxes.tile >= 0
        self.set_tile_boxes(out, type(boxes)(boxes.lo[keep], boxes.sz[keep], boxes.tile[keep]))
        return out

    def tile_runs_of(self, t: Tensor, perm=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(begin, end, global tile)`` runs of ``t``'s flattened elements (-1: unmapped), adjacent
        runs on different tiles; with ``perm``, of the elements of ``t.dimShuffle(perm)``.
        openipu extension."""
        n = t.numElements()
        if n == 0:
            z = np.zeros(0, np.int64)
            return z, z, np.zeros(0, np.int32)
        flat = _flat_view(t) if perm is None else None
        if flat is not None:
            var, off = flat
            s = var.tile_starts
            i0 = int(np.searchsorted(s, off, side="right")) - 1
            i1 = int(np.searchsorted(s, off + n, side="left"))
            b = np.maximum(s[i0:i1], off) - off
            e = np.minimum(np.append(s[i0 + 1:i1], off + n), off + n) - off
            return b, e, var.tile_ids[i0:i1]
        if n <= SMALL_VIEW_ELEMENTS and perm is None:
            return self._small_tile_runs(t)
        from openipu.poplar.exchange import tile_boxes
        boxes = tile_boxes(t)
        lo, sz, shape = boxes.lo, boxes.sz, t.shape()
        if perm is not None:
            lo, sz, shape = lo[:, perm], sz[:, perm], [shape[d] for d in perm]
        b, tl = box_tile_runs(lo, sz, boxes.tile, shape)
        return b, np.append(b[1:], n), tl

    def _small_tile_runs(self, t: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`tile_runs_of` of a view of few elements, element by element: each element's
        address looked up in its variable's run-length tile map (cheaper than the view's tile
        boxes when the view is a strided row of a large tensor: a few hundred elements, each in
        a box of its own)."""
        addr = t.flat_addresses()
        sp = self._state.space(t._type)
        vi = np.searchsorted(sp.starts(), addr, side="right") - 1
        tiles = np.empty(addr.size, np.int32)
        for j in _sets.unique(vi).tolist():
            var = sp.vars[j]
            m = vi == j
            tiles[m] = var.tile_ids[np.searchsorted(var.tile_starts, addr[m] - var.start, side="right") - 1]
        b = np.flatnonzero(np.r_[True, tiles[1:] != tiles[:-1]]).astype(np.int64)
        return b, np.append(b[1:], addr.size), tiles[b]

    def copy_tile_mapping(self, dst: Tensor, src: Tensor) -> None:
        """Map each element of ``dst`` to the tile of the same element of ``src`` (equal element
        counts; unmapped stays unmapped). openipu extension, used by ``clone`` and PopLibs."""
        perm = memory_order(dst) if dst.shape() == src.shape() else None
        if perm is not None:            # walk both in dst's memory order: runs, not elements
            dst, src = dst.dimShuffle(perm), src.dimShuffle(perm)
        b, e, tl = self.tile_runs_of(src)
        keep = tl >= 0
        self.set_tile_runs(dst, b[keep], e[keep], tl[keep])

    def set_global_tile_mapping(self, t: Tensor, tiles) -> None:
        """Map each flattened element of ``t`` to a *global* tile number (``tiles``: int array of
        ``t.numElements()`` entries, or broadcastable to it), without checks. openipu extension for
        PopLibs, which computes tiles in global numbering (see :meth:`tile_of_elements`)."""
        tiles = np.asarray(tiles)
        if tiles.size == 1:
            self._assign_set(t, int(tiles.reshape(-1)[0]))
            return
        self._assign_elements(t, tiles)

    def tile_of_elements(self, t: Tensor) -> np.ndarray:
        """Global tile of each flattened element of ``t`` (int32, -1 when unmapped). Costs one
        int per element: openipu extension for small tensors; PopLibs uses :meth:`tile_runs_of`."""
        if t.numElements() == 0:
            return np.zeros(0, np.int32)
        b, e, tl = self.tile_runs_of(t)
        return np.repeat(tl, e - b)

    def is_mapped(self, t: Tensor) -> bool:
        """Whether every element of ``t`` is mapped to a tile. openipu extension."""
        if t.numElements() == 0:
            return True
        variables = self._state.variables
        ids = t.variable_ids().tolist()
        if all((variables[i].tile_ids >= 0).all() for i in ids):
            return True
        return bool((self.tile_runs_of(t)[2] >= 0).all())

    def tile_element_counts(self, t: Tensor) -> np.ndarray:
        """Elements of ``t`` on each global tile (float64, one entry per tile of the target).
        openipu extension."""
        from openipu.poplar.exchange import tile_counts
        return tile_counts(t, self._top._target.getNumTiles())

    # -- codelets and estimators ----------------------------------------------------------
    def addCodelets(self, src, compile_flags: str = "") -> None:  # noqa: N802
        """Load codelets: a :class:`Vertex` subclass, a list of them, a module, or a ``.py`` file path.

        Raises :class:`graph_object_load_error` for a missing file or C++ source (openipu runs
        codelets written in Python; port the C++ ``compute()`` to a Python class).
        """
        from openipu.poplar.graph_codec import LOADED_CODELETS
        for cls in _collect_codelets(src):
            self._state.codelets[cls.vertex_name] = cls
            LOADED_CODELETS[cls.vertex_name] = cls       # an executable file may name it

    def hasCodelet(self, name: str) -> bool:  # noqa: N802
        return name in self._state.codelets

    def registerPerfEstimator(self, vertex_type: str, fn: Callable) -> None:  # noqa: N802
        """``fn(vertex: VertexIntrospector, target) -> int | VertexPerfEstimate`` for every vertex of the type."""
        from openipu.poplar.graph_codec import LOADED_ESTIMATORS
        self._state.estimators[vertex_type] = fn
        LOADED_ESTIMATORS[vertex_type] = fn              # a graph read from a file takes it

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
                from openipu.poplar.graph_codec import LOADED_CODELETS
                st.codelets[name] = vertex_type
                LOADED_CODELETS[name] = vertex_type
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


def _flat_view(t: Tensor):
    """``(variable, offset)`` when ``t``'s flattened elements are the consecutive elements
    ``[offset, offset + n)`` of one variable (a variable, or a contiguous slice or reshape of one);
    else None."""
    p = t.pieces
    if p.row is None:
        return None
    v, a, lo, sz, st = p.row
    if any(lo) or tuple(sz) != t._shape or not R._dense(sz, st):
        return None
    var = t._state.variables[v]
    return var, a - var.start


#: views of at most this many elements have their tile runs looked up element by element
#: (:meth:`Graph.tile_runs_of`)
SMALL_VIEW_ELEMENTS = 2048


def box_tile_runs(lo: np.ndarray, sz: np.ndarray, tiles: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray]:
    """``(begin, tile)`` of the runs of flat (row-major) indices of a tensor of ``shape`` that the
    disjoint boxes ``lo``, ``sz`` on ``tiles`` cover, adjacent runs on the same tile merged
    (``tile`` int32). Host work follows boxes and runs."""
    owner, start, _ = R.box_flat_runs(lo, sz, shape)
    order = np.argsort(start, kind="stable")
    return tilemap.compress(start[order], np.asarray(tiles)[owner[order]].astype(np.int32))


def _blocked(p) -> bool:
    """Whether pieces ``p`` are several blocks of one variable, without aliases (a blocked tensor
    such as poplin's outputs, or a view of one)."""
    return len(p) > 1 and p.row is None and bool((p.var == p.var[0]).all()) and not _aliases(p)


def _aliases(p) -> bool:
    """Whether pieces ``p`` broadcast (a dim of stride 0 and size above 1)."""
    return bool(((p.st == 0) & (p.sz > 1)).any())


def memory_order(t: Tensor) -> list[int] | None:
    """The dims of ``t`` from outermost to innermost in memory, from the strides of its largest
    piece (unit dims keep their places), or None when that is the natural order or ``t`` holds
    aliases (a broadcast dim, or two dims with one stride)."""
    p = t.pieces
    if t.rank() < 2 or len(p) == 0:
        return None
    if p.row is not None:
        sz, st = p.row[3], p.row[4]
    else:
        k = int(np.argmax(p.numel()))
        sz, st = p.sz[k].tolist(), p.st[k].tolist()
    if len(p) > 1 and _aliases(p) or any(s > 1 and a == 0 for s, a in zip(sz, st)):
        return None
    big = [d for d in range(len(sz)) if sz[d] > 1]
    by_stride = sorted(big, key=lambda d: -abs(st[d]))
    if len({abs(st[d]) for d in big}) < len(big) or by_stride == big:
        return None
    it = iter(by_stride)
    return [next(it) if sz[d] > 1 else d for d in range(len(sz))]


class VariableMappingMethod:
    NONE = "NONE"
    LINEAR = "LINEAR"


class TensorCloneMethod:
    PRESERVE_ORDER_AND_ALIASES = "PRESERVE_ORDER_AND_ALIASES"
    CREATE_NEW_ORDER = "CREATE_NEW_ORDER"
    PRESERVE_ORDER_UNLESS_ALIASES = "PRESERVE_ORDER_UNLESS_ALIASES"


_CLONE_METHODS = frozenset(v for k, v in vars(TensorCloneMethod).items() if not k.startswith("_"))


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


# -- record kinds of Poplar executable files (openipu.poplar.graph_codec) ----------------------
def _take_estimators(state: "_State") -> None:
    """A graph read from a file takes the perf estimators this process registered for its codelets
    (functions are not written to files)."""
    from openipu.poplar.graph_codec import LOADED_ESTIMATORS
    state.estimators = {n: f for n, f in LOADED_ESTIMATORS.items() if n in state.codelets}


def _register_records():
    from openipu.poplar.graph_codec import data_class
    for cls in (Variable, ComputeSet, Access, VertexGroup, DataStream, RemoteBuffer, Function, HostFunction):
        data_class(cls)
    data_class(_Space, fields=("type", "size", "vars", "version"), types={"size": int, "vars": list, "version": int},
               after_decode=_Space._reset_caches)
    data_class(_State, fields=("target", "replication_factor", "spaces", "variables", "compute_sets", "codelets",
                               "streams", "remote_buffers", "host_writes", "host_reads", "functions",
                               "host_functions", "v_type", "v_cs", "v_tile", "v_fields", "v_perf", "v_values"),
               types={"codelets": dict, "variables": list, "compute_sets": list}, after_decode=_take_estimators)
    data_class(Graph, fields=("_state", "_tiles", "_target", "_top", "_replication_factor"),
               types={"_state": _State, "_tiles": np.ndarray, "_replication_factor": int})


_register_records()
