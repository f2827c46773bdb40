"""``poplar::Graph``: variables, constants, tile mapping, compute sets, vertices, streams.

Storage model: each element type has one flat *address space* per top-level graph (``AddressSpace``);
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
from typing import Callable

import numpy as np
import torch

from openipu.poplar import errors
from openipu.poplar import regions as R
from openipu.poplar.deferred import DeferredValue
from openipu.poplar.tensor import Tensor
from openipu.poplar.types import Type, as_type
from openipu.poplar.vertex import FieldSpec, Vertex, _Shape
from openipu.poplar import sets as _sets
from openipu.poplar.address_space import AddressSpace, Variable, storage_values
from openipu.poplar.graph_mapping import TileMapping, blocked, box_tile_runs, memory_order
from openipu.poplar.graph_objects import (CLONE_METHODS, Access, ComputeSet, DataStream, FieldRef, Function,
                                          HostFunction, RemoteBuffer, ReplicatedStreamMode, TensorCloneMethod,
                                          VariableMappingMethod, VertexGroup, VertexRef)

#: the graph's API, with the objects it hands out (defined in :mod:`.graph_objects`,
#: :mod:`.graph_mapping` and :mod:`.address_space`, imported from here as before the split)
__all__ = ["Graph", "Access", "ComputeSet", "DataStream", "FieldRef", "Function", "HostFunction", "RemoteBuffer",
           "ReplicatedStreamMode", "TensorCloneMethod", "VariableMappingMethod", "Variable", "VertexGroup",
           "VertexRef", "box_tile_runs", "memory_order"]


# ----------------------------------------------------------------------------------------------
# storage bookkeeping
# ----------------------------------------------------------------------------------------------
class _State:
    """What a top-level graph and all its virtual / replicated sub-graphs share."""

    def __init__(self, target, replication_factor: int):
        self.target = target
        self.replication_factor = replication_factor
        self.spaces: dict[str, AddressSpace] = {}
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

    def space(self, t: Type) -> AddressSpace:
        sp = self.spaces.get(t.space)
        if sp is None:
            sp = self.spaces[t.space] = AddressSpace(t)
        return sp

    def codelet_of_vertex(self, vid: int) -> type:
        return self.codelets[self.v_type[vid]]


class Graph(TileMapping):
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
        return self._new_variable(t, shape, name, constant=True, init=storage_values(t, arr))

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
                                  init=DeferredValue(lambda: storage_values(t, np.asarray(make())), numel))

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
        if isinstance(name, str) and name in CLONE_METHODS:
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
        if method != TensorCloneMethod.CREATE_NEW_ORDER and blocked(src.pieces):
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
        self._state.initial_values.append((t, storage_values(t.elementType(), arr)))

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
    # files name these kinds as they were named when all of them lived in this module
    for cls in (Variable, ComputeSet, Access, VertexGroup, DataStream, RemoteBuffer, Function, HostFunction):
        data_class(cls, key=f"poplar.graph:{cls.__qualname__}")
    data_class(AddressSpace, fields=("type", "size", "vars", "version"), types={"size": int, "vars": list, "version": int},
               after_decode=AddressSpace._reset_caches, key="poplar.graph:_Space")
    data_class(_State, fields=("target", "replication_factor", "spaces", "variables", "compute_sets", "codelets",
                               "streams", "remote_buffers", "host_writes", "host_reads", "functions",
                               "host_functions", "v_type", "v_cs", "v_tile", "v_fields", "v_perf", "v_values"),
               types={"codelets": dict, "variables": list, "compute_sets": list}, after_decode=_take_estimators)
    data_class(Graph, fields=("_state", "_tiles", "_target", "_top", "_replication_factor"),
               types={"_state": _State, "_tiles": np.ndarray, "_replication_factor": int})


_register_records()
