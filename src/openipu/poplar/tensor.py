"""``poplar::Tensor``: views over graph variables that never copy.

A tensor is an element type plus a numpy array of *element addresses*, shaped like the tensor.
Each element type has one flat address space per graph (see ``graph._Space``); a variable owns
a contiguous range of it. Every view (slice, reshape, dimShuffle, broadcast, reverse, concat
...) is a numpy operation on the address array, so the semantics are numpy's and no storage is
touched. Reading a tensor is one gather from the type's storage; writing one is one scatter.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from openipu.poplar import errors
from openipu.poplar.types import Type


class Interval:
    """A half-open range ``[begin, end)`` of flattened elements (``poplar::Interval``)."""

    __slots__ = ("_b", "_e")

    def __init__(self, begin: int = 0, end: int = 0):
        self._b, self._e = int(begin), int(end)

    def begin(self) -> int:
        return self._b

    def end(self) -> int:
        return self._e

    def size(self) -> int:
        return self._e - self._b

    def __eq__(self, other):
        return isinstance(other, Interval) and (self._b, self._e) == (other._b, other._e)

    def __hash__(self):
        return hash((self._b, self._e))

    def __repr__(self):
        return f"[{self._b}, {self._e})"

    def __iter__(self):
        return iter((self._b, self._e))


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end positions of runs where ``values`` increases by exactly 1."""
    if values.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    brk = np.flatnonzero(np.diff(values) != 1) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [values.size]))
    return starts, ends


class Tensor:
    """A view over graph variables (``poplar::Tensor``).

    Shapes are lists of ints; dims are counted from 0. Views share storage with their source:
    writing through one is seen through the other. Methods raise :class:`poplar.index_error`
    for out-of-range slices and :class:`poplar.tensor_creation_error` for impossible reshapes.
    """

    __slots__ = ("_state", "_type", "_addr", "_view_type")

    def __init__(self, state, type_: Type, addr: np.ndarray, view_type: Type | None = None):
        self._state = state          # the graph state whose address spaces `addr` points into
        self._type = type_           # storage type (names the address space)
        self._addr = addr
        self._view_type = view_type  # set by reinterpret()

    # -- metadata -------------------------------------------------------------------------
    def elementType(self) -> Type:  # noqa: N802
        return self._view_type or self._type

    def shape(self) -> list[int]:
        return list(self._addr.shape)

    def rank(self) -> int:
        return self._addr.ndim

    def dim(self, i: int) -> int:
        if not 0 <= i < self._addr.ndim:
            raise errors.index_error(f"Dimension {i} out of range for tensor of rank {self._addr.ndim}")
        return self._addr.shape[i]

    def numElements(self) -> int:  # noqa: N802
        return int(self._addr.size)

    def valid(self) -> bool:
        return self._addr is not None

    def __len__(self):
        return self._addr.shape[0] if self._addr.ndim else 1

    def __repr__(self):
        return f"Tensor<{self.elementType()}{self.shape()}>"

    def shortString(self) -> str:  # noqa: N802
        return f"{self.elementType()} {self.shape()}"

    def _new(self, addr: np.ndarray) -> "Tensor":
        return Tensor(self._state, self._type, addr, self._view_type)

    def flat_addresses(self) -> np.ndarray:
        """Element addresses in row-major order (int64, 1-D). Internal to openipu."""
        return self._addr.reshape(-1)

    # -- views ----------------------------------------------------------------------------
    def _check_dim(self, dim):
        if not 0 <= dim < self._addr.ndim:
            raise errors.index_error(f"Dimension {dim} is out of range for a tensor of rank {self._addr.ndim}")

    def __getitem__(self, i):
        if isinstance(i, (int, np.integer)):
            if self._addr.ndim == 0:
                raise errors.index_error("Cannot index a scalar tensor")
            n = self._addr.shape[0]
            if not 0 <= i < n:
                raise errors.index_error(f"Index {i} is out of range for dimension 0 of size {n}")
            return self._new(self._addr[i])
        try:  # numpy-style convenience: t[1:3, 2]
            return self._new(self._addr[i])
        except IndexError as e:
            raise errors.index_error(str(e)) from None

    def slice(self, begin, end=None, dim: int = 0) -> "Tensor":
        """``slice(begin, end, dim)``, ``slice([begins], [ends])`` or ``slice(Interval, dim)``."""
        if isinstance(begin, Interval):
            dim = 0 if end is None else end
            begin, end = begin.begin(), begin.end()
        if isinstance(begin, (list, tuple)):
            if len(begin) != len(end) or len(begin) > self.rank():
                raise errors.index_error(f"slice: {len(begin)} begins and {len(end)} ends for a tensor of rank {self.rank()}")
            t = self
            for d, (b, e) in enumerate(zip(begin, end)):
                t = t.slice(b, e, d)
            return t
        self._check_dim(dim)
        n = self._addr.shape[dim]
        if not (0 <= begin <= end <= n):
            raise errors.index_error(f"Slice [{begin}, {end}) is out of range for dimension {dim} of size {n}")
        idx = [slice(None)] * self._addr.ndim
        idx[dim] = slice(begin, end)
        return self._new(self._addr[tuple(idx)])

    def slices(self, intervals: Iterable, dim: int = 0) -> list["Tensor"]:
        return [self.slice(Interval(*iv) if not isinstance(iv, Interval) else iv, dim) for iv in intervals]

    def index(self, indices: Sequence[int]) -> "Tensor":
        t = self
        for i in indices:
            t = t[i]
        return t

    def reshape(self, shape: Sequence[int]) -> "Tensor":
        shape = [int(s) for s in shape]
        if int(np.prod(shape, dtype=np.int64)) != self._addr.size:
            raise errors.tensor_creation_error(
                f"Cannot reshape a tensor of shape {self.shape()} ({self._addr.size} elements) to {shape}")
        return self._new(self._addr.reshape(shape))

    def reshapePartial(self, begin: int, end: int, new_dims: Sequence[int]) -> "Tensor":  # noqa: N802
        s = self.shape()
        return self.reshape(s[:begin] + list(new_dims) + s[end:])

    def flatten(self, begin: int | None = None, end: int | None = None) -> "Tensor":
        if begin is None:
            return self._new(self._addr.reshape(-1))
        s = self.shape()
        return self.reshape(s[:begin] + [int(np.prod(s[begin:end], dtype=np.int64))] + s[end:])

    def dimShuffle(self, permutation: Sequence[int]) -> "Tensor":  # noqa: N802
        if sorted(permutation) != list(range(self.rank())):
            raise errors.tensor_creation_error(f"dimShuffle: {list(permutation)} is not a permutation of {self.rank()} dims")
        return self._new(self._addr.transpose(permutation))

    def dimShufflePartial(self, source: Sequence[int], destination: Sequence[int]) -> "Tensor":  # noqa: N802
        return self._new(np.moveaxis(self._addr, list(source), list(destination)))

    def dimRoll(self, dim: int, new_pos: int = 0) -> "Tensor":  # noqa: N802
        return self.dimShufflePartial([dim], [new_pos])

    def transpose(self) -> "Tensor":
        if self.rank() != 2:
            raise errors.tensor_creation_error(f"transpose needs a 2-D tensor, this one has shape {self.shape()}")
        return self._new(self._addr.T)

    def expand(self, indices: Sequence[int]) -> "Tensor":
        """Insert singleton dims before the original dims named by ``indices``."""
        shape = self.shape()
        out, k = [], 0
        for pos in sorted(indices):
            if not 0 <= pos <= len(shape):
                raise errors.index_error(f"expand: index {pos} out of range for rank {len(shape)}")
            out.extend(shape[k:pos])
            out.append(1)
            k = pos
        out.extend(shape[k:])
        return self._new(self._addr.reshape(out))

    def squeeze(self, dims: Sequence[int] | None = None) -> "Tensor":
        if dims is None:
            return self._new(np.squeeze(self._addr))
        for d in dims:
            self._check_dim(d)
            if self._addr.shape[d] != 1:
                raise errors.tensor_creation_error(f"squeeze: dimension {d} has size {self._addr.shape[d]}, not 1")
        return self._new(np.squeeze(self._addr, axis=tuple(dims)))

    def broadcast(self, n: int, dim: int) -> "Tensor":
        """The tensor repeated ``n`` times along ``dim`` (aliases, no copy)."""
        self._check_dim(dim)
        reps = [1] * self.rank()
        reps[dim] = n
        if self._addr.shape[dim] == 1:
            shape = list(self._addr.shape)
            shape[dim] = n
            return self._new(np.broadcast_to(self._addr, shape))
        return self._new(np.tile(self._addr, reps))

    def subSample(self, stride: int, dim: int) -> "Tensor":  # noqa: N802
        self._check_dim(dim)
        idx = [slice(None)] * self.rank()
        idx[dim] = slice(None, None, stride)
        return self._new(self._addr[tuple(idx)])

    def upsample(self, scale: int, dim: int) -> "Tensor":
        self._check_dim(dim)
        return self._new(np.repeat(self._addr, scale, axis=dim))

    def reverse(self, dim: int) -> "Tensor":
        self._check_dim(dim)
        return self._new(np.flip(self._addr, axis=dim))

    def reinterpret(self, type_: Type) -> "Tensor":
        if type_.size != self.elementType().size:
            raise errors.tensor_creation_error(
                f"Cannot reinterpret {self.elementType()} as {type_}: element sizes differ")
        return Tensor(self._state, self._type, self._addr, None if type_ == self._type else type_)

    # -- queries --------------------------------------------------------------------------
    def getContiguousRegions(self) -> list[Interval]:  # noqa: N802
        """Runs of consecutive storage, as intervals over this tensor's flattened elements."""
        starts, ends = _runs(self.flat_addresses())
        return [Interval(s, e) for s, e in zip(starts.tolist(), ends.tolist())]

    def getVarRegions(self):  # noqa: N802
        """``[(variable, Interval)]`` in order: the variable ranges this tensor covers."""
        a = self.flat_addresses()
        starts, ends = _runs(a)
        space = self._state.space(self._type)
        out = []
        for s, e in zip(starts.tolist(), ends.tolist()):
            lo = int(a[s])
            var = space.variable_at(lo)
            out.append((var, Interval(lo - var.start, lo - var.start + (e - s))))
        return out

    def isContiguous(self) -> bool:  # noqa: N802
        a = self.flat_addresses()
        return a.size <= 1 or bool(np.all(np.diff(a) == 1))

    def containsAliases(self) -> bool:  # noqa: N802
        a = self.flat_addresses()
        if a.size < 2 or bool(np.all(a[1:] > a[:-1])):     # plain variables: no sort needed
            return False
        s = np.sort(a)
        return bool((s[1:] == s[:-1]).any())

    def containsConstant(self) -> bool:  # noqa: N802
        return self._state.space(self._type).is_constant(self.flat_addresses()).any()

    def isParallelWriteable(self) -> bool:  # noqa: N802
        return not self.containsAliases() and not self.containsConstant()

    def intersectsWith(self, other: "Tensor") -> bool:  # noqa: N802
        if other._type != self._type or other._state is not self._state:
            return False
        return np.intersect1d(self.flat_addresses(), other.flat_addresses()).size > 0

    def dump(self) -> str:
        return repr(self)


def concat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate tensors along ``dim`` (``poplar::concat``). All must share type and graph."""
    tensors = list(tensors)
    if not tensors:
        raise errors.tensor_creation_error("concat needs at least one tensor")
    t0 = tensors[0]
    for t in tensors[1:]:
        if t._type != t0._type or t._view_type != t0._view_type:
            raise errors.tensor_creation_error(f"concat: element types differ ({t0.elementType()} vs {t.elementType()})")
        if t.rank() != t0.rank() or any(a != b for i, (a, b) in enumerate(zip(t.shape(), t0.shape())) if i != dim):
            raise errors.tensor_creation_error(f"concat: shapes {t0.shape()} and {t.shape()} differ outside dimension {dim}")
    return t0._new(np.concatenate([t._addr for t in tensors], axis=dim))


def append(t: Tensor, s: Tensor, dim: int = 0) -> Tensor:
    """``poplar::append``: ``s`` (one rank lower) added as a new slice at the end of ``dim``."""
    return concat([t, s.expand([dim])], dim)
