"""The storage of a Poplar graph: one flat *address space* per element type (:class:`AddressSpace`)
in which each variable or constant (:class:`Variable`) owns a contiguous range, with the tile of
each address run-length encoded, and the conversion of host values into a type's storage.
Used by :class:`openipu.poplar.graph.Graph`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from openipu.poplar import tilemap
from openipu.poplar.deferred import DeferredValue
from openipu.poplar.types import Type
from openipu.poplar import sets as _sets


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


class AddressSpace:
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


def tile_count(target) -> int:
    return target.getNumTiles()



def storage_values(t, arr: np.ndarray) -> torch.Tensor:
    """``arr`` flattened into a new tensor of type ``t``'s storage dtype. Floats convert in one
    step (float16 / float32 / float64 values are exact in float64, so this rounds as a trip through
    float64 would, without a float64 copy of the weights); integers wrap to ``t``'s range."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    if t.is_float and flat.dtype.kind == "f":
        if t.torch_dtype in (torch.float16, torch.float32):
            return torch.from_numpy(flat.astype(t.numpy_dtype))    # a new array, rounded to nearest even
        return torch.from_numpy(flat.astype(np.float64)).to(t.torch_dtype)
    return t.wrap(torch.as_tensor(flat.astype(np.float64 if t.is_float else np.int64)))

def fresh_storage(t, arr) -> torch.Tensor:
    """A flat array made for ``t``'s storage (nobody else holds it) as its storage tensor: taken
    without a copy when it is of the storage dtype (float16 / float32), else converted."""
    if (isinstance(arr, np.ndarray) and arr.ndim == 1 and arr.flags.c_contiguous and t.is_float
            and t.torch_dtype in (torch.float16, torch.float32) and arr.dtype == t.numpy_dtype):
        return torch.from_numpy(arr)
    return storage_values(t, arr)
