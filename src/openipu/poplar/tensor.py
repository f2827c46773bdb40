"""``poplar::Tensor``: views over graph variables that never copy.

A tensor is an element type, a shape and a short list of *pieces* (:mod:`openipu.poplar.regions`):
sub-boxes of the tensor's index space, each laid affinely over one variable of the type's address
space (``address_space.AddressSpace``). Every view (slice, reshape, dimShuffle, broadcast, reverse, subSample,
concat ...) composes pieces, so the host cost of a view follows the number of pieces, not the
number of elements, the way Poplar's ``Tensor`` is a list of variable regions. Element addresses
are only built on request (:meth:`Tensor.flat_addresses`), for small tensors and tests.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from openipu.poplar import errors
from openipu.poplar import regions as R
from openipu.poplar import sets as _sets
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

    ``Tensor(state, type, addresses)`` builds a view from an array of element addresses (shaped
    like the view); openipu's own code builds views from pieces.
    """

    __slots__ = ("_state", "_type", "_p", "_shape", "_view_type")

    def __init__(self, state, type_: Type, addr=None, view_type: Type | None = None, *,
                 pieces: R.Pieces | None = None, shape=None):
        self._state = state          # the graph state whose address spaces the pieces point into
        self._type = type_           # storage type (names the address space)
        self._view_type = view_type  # set by reinterpret()
        if pieces is not None:
            self._p = pieces
            self._shape = tuple(int(s) for s in shape)
        else:
            a = np.asarray(addr)
            self._shape = tuple(int(s) for s in a.shape)
            self._p = _pieces_from_addresses(state.space(type_), a)

    # -- metadata -------------------------------------------------------------------------
    def elementType(self) -> Type:  # noqa: N802
        return self._view_type or self._type

    def shape(self) -> list[int]:
        return list(self._shape)

    def hasMetadata(self) -> bool:  # noqa: N802
        """True for a QUARTER tensor created with a metadata tensor (``poplar::Tensor::hasMetadata``)."""
        return self.getMetadata(_strict=False) is not None

    def getMetadata(self, _strict: bool = True) -> "Tensor":  # noqa: N802
        """The ``QUARTER_METADATA`` tensor of this QUARTER tensor (of its first variable: the
        variables of one QUARTER view share their metadata).

        Raises:
            poplar_error: the tensor has no metadata.
        """
        md = None
        if self.elementType().name == "quarter" and self.numElements():
            md = self._state.variables[int(self._p.var[0])].metadata
        if md is None and _strict:
            raise errors.poplar_error(f"Tensor of type {self.elementType()} has no metadata")
        return md

    def rank(self) -> int:
        return len(self._shape)

    def dim(self, i: int) -> int:
        if not 0 <= i < len(self._shape):
            raise errors.index_error(f"Dimension {i} out of range for tensor of rank {len(self._shape)}")
        return self._shape[i]

    def numElements(self) -> int:  # noqa: N802
        n = 1
        for s in self._shape:
            n *= s
        return n

    def valid(self) -> bool:
        return self._p is not None

    def __len__(self):
        return self._shape[0] if self._shape else 1

    def __repr__(self):
        return f"Tensor<{self.elementType()}{self.shape()}>"

    def shortString(self) -> str:  # noqa: N802
        return f"{self.elementType()} {self.shape()}"

    def _new(self, pieces: R.Pieces, shape) -> "Tensor":
        t = Tensor.__new__(Tensor)
        t._state, t._type, t._view_type, t._p, t._shape = self._state, self._type, self._view_type, pieces, tuple(shape)
        return t

    @property
    def pieces(self) -> R.Pieces:
        """The view's pieces (:class:`openipu.poplar.regions.Pieces`). Internal to openipu."""
        return self._p

    def variable_ids(self) -> np.ndarray:
        """Ids (sorted, unique) of the variables this view touches. Internal to openipu."""
        if self._p.row is not None:
            return np.array([self._p.row[0]], np.int64)
        return _sets.unique(self._p.var)

    @property
    def _addr(self) -> np.ndarray:
        """Element addresses shaped like the tensor (legacy PopLibs code; see :meth:`addresses`)."""
        return self.addresses()

    def flat_addresses(self) -> np.ndarray:
        """Element addresses in row-major order (int64, 1-D), built from the pieces. Costs one
        int64 per element: internal to openipu, for small tensors, user vertices and tests."""
        return self.addresses().reshape(-1)

    def addresses(self) -> np.ndarray:
        """Element addresses shaped like the tensor (int64; see :meth:`flat_addresses`)."""
        p = self._p
        d = len(self._shape)
        if p.row is not None and not any(p.row[2]) and tuple(p.row[3]) == self._shape:
            v, a, lo, sz, st = p.row
            out = np.full(self._shape, a, np.int64)
            for i in range(d):
                if sz[i] > 1 and st[i]:
                    shp = [1] * d
                    shp[i] = sz[i]
                    out += (np.arange(sz[i], dtype=np.int64) * st[i]).reshape(shp)
            return out
        out = np.empty(self._shape, np.int64)
        if len(p) == 0:
            return out
        addr, pos = _piece_addresses(p, self._shape)
        out.reshape(-1)[pos] = addr
        return out

    # -- views ----------------------------------------------------------------------------
    def _check_dim(self, dim):
        if not 0 <= dim < len(self._shape):
            raise errors.index_error(f"Dimension {dim} is out of range for a tensor of rank {len(self._shape)}")

    def __getitem__(self, i):
        if isinstance(i, (int, np.integer)):
            if not self._shape:
                raise errors.index_error("Cannot index a scalar tensor")
            n = self._shape[0]
            if not 0 <= i < n:
                raise errors.index_error(f"Index {i} is out of range for dimension 0 of size {n}")
            row = self._p.row
            if row is not None:
                v, a, lo, sz, st = row
                if lo[0] <= i < lo[0] + sz[0]:
                    return self._new(R.Pieces.single(v, a + (i - lo[0]) * st[0], lo[1:], sz[1:], st[1:]), self._shape[1:])
            return self.slice(int(i), int(i) + 1, 0).squeeze([0])
        items = i if isinstance(i, tuple) else (i,)
        if not all(isinstance(x, (int, np.integer, slice)) for x in items):
            # arbitrary numpy indexing: gather the addresses (small tensors only)
            try:
                return Tensor(self._state, self._type, self.addresses()[i], self._view_type)
            except IndexError as e:
                raise errors.index_error(str(e)) from None
        if len(items) > len(self._shape):
            raise errors.index_error(f"too many indices for a tensor of rank {len(self._shape)}")
        t, drop = self, []
        for d, it in enumerate(items):
            n = self._shape[d]
            if isinstance(it, slice):
                b, e, s = it.indices(n)
                if s > 0:
                    t = t.slice(b, max(b, e), d)
                    if s > 1:
                        t = t.subSample(s, d)
                else:
                    lo = e + 1
                    t = t.slice(lo, max(lo, b + 1), d).reverse(d)
                    if s < -1:
                        t = t.subSample(-s, d)
            else:
                k = int(it) + (n if it < 0 else 0)
                if not 0 <= k < n:
                    raise errors.index_error(f"index {int(it)} is out of bounds for dimension {d} with size {n}")
                t = t.slice(k, k + 1, d)
                drop.append(d)
        return t.squeeze(drop) if drop else t

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
        begin, end = int(begin), int(end)
        n = self._shape[dim]
        if not (0 <= begin <= end <= n):
            raise errors.index_error(f"Slice [{begin}, {end}) is out of range for dimension {dim} of size {n}")
        if begin == 0 and end == n:
            return self
        shape = list(self._shape)
        shape[dim] = end - begin
        return self._new(R.slice_dim(self._p, dim, begin, end), shape)

    def slices(self, intervals: Iterable, dim: int = 0) -> list["Tensor"]:
        return [self.slice(Interval(*iv) if not isinstance(iv, Interval) else iv, dim) for iv in intervals]

    def index(self, indices: Sequence[int]) -> "Tensor":
        t = self
        for i in indices:
            t = t[i]
        return t

    def reshape(self, shape: Sequence[int]) -> "Tensor":
        shape = [int(s) for s in shape]
        if int(np.prod(shape, dtype=np.int64)) != self.numElements() or any(s < 0 for s in shape):
            raise errors.tensor_creation_error(
                f"Cannot reshape a tensor of shape {self.shape()} ({self.numElements()} elements) to {shape}")
        if shape == list(self._shape):
            return self
        return self._new(R.reshape(self._p, list(self._shape), shape), shape)

    def reshapePartial(self, begin: int, end: int, new_dims: Sequence[int]) -> "Tensor":  # noqa: N802
        s = self.shape()
        return self.reshape(s[:begin] + list(new_dims) + s[end:])

    def flatten(self, begin: int | None = None, end: int | None = None) -> "Tensor":
        if begin is None:
            return self.reshape([self.numElements()])
        s = self.shape()
        return self.reshape(s[:begin] + [int(np.prod(s[begin:end], dtype=np.int64))] + s[end:])

    def dimShuffle(self, permutation: Sequence[int]) -> "Tensor":  # noqa: N802
        perm = [int(x) for x in permutation]
        if sorted(perm) != list(range(self.rank())):
            raise errors.tensor_creation_error(f"dimShuffle: {list(permutation)} is not a permutation of {self.rank()} dims")
        if perm == list(range(self.rank())):
            return self
        return self._new(R.permute(self._p, perm), [self._shape[i] for i in perm])

    def dimShufflePartial(self, source: Sequence[int], destination: Sequence[int]) -> "Tensor":  # noqa: N802
        r = self.rank()
        source = [int(x) % r if r else 0 for x in source]
        destination = [int(x) % r if r else 0 for x in destination]
        perm = [n for n in range(r) if n not in source]
        for dest, src in sorted(zip(destination, source)):
            perm.insert(dest, src)
        return self.dimShuffle(perm)

    def dimRoll(self, dim: int, new_pos: int = 0) -> "Tensor":  # noqa: N802
        return self.dimShufflePartial([dim], [new_pos])

    def transpose(self) -> "Tensor":
        if self.rank() != 2:
            raise errors.tensor_creation_error(f"transpose needs a 2-D tensor, this one has shape {self.shape()}")
        return self.dimShuffle([1, 0])

    def expand(self, indices: Sequence[int]) -> "Tensor":
        """Insert singleton dims before the original dims named by ``indices``."""
        shape = self.shape()
        out, k, new_pos = [], 0, []
        for pos in sorted(indices):
            if not 0 <= pos <= len(shape):
                raise errors.index_error(f"expand: index {pos} out of range for rank {len(shape)}")
            out.extend(shape[k:pos])
            new_pos.append(len(out))
            out.append(1)
            k = pos
        out.extend(shape[k:])
        return self._new(R.insert_unit_dims(self._p, new_pos), out)

    def squeeze(self, dims: Sequence[int] | None = None) -> "Tensor":
        if dims is None:
            dims = [i for i, s in enumerate(self._shape) if s == 1]
        dims = [int(d) for d in dims]
        for d in dims:
            self._check_dim(d)
            if self._shape[d] != 1:
                raise errors.tensor_creation_error(f"squeeze: dimension {d} has size {self._shape[d]}, not 1")
        if not dims:
            return self
        return self._new(R.remove_dims(self._p, dims), [s for i, s in enumerate(self._shape) if i not in set(dims)])

    def broadcast(self, n: int, dim: int) -> "Tensor":
        """The tensor repeated ``n`` times along ``dim`` (aliases, no copy)."""
        self._check_dim(dim)
        n = int(n)
        shape = list(self._shape)
        size = shape[dim]
        shape[dim] = size * n
        if size == 1:
            return self._new(R.broadcast_unit(self._p, dim, n), shape)
        return self._new(R.tile_dim(self._p, dim, n, size), shape)

    def broadcast_to(self, shape: Sequence[int]) -> "Tensor":
        """The view broadcast to ``shape`` by numpy's rules (unit dims prepended, size-1 dims
        repeated with stride 0). openipu extension. Raises ``index_error`` if it cannot."""
        shape = [int(s) for s in shape]
        mine = list(self._shape)
        if len(mine) > len(shape) or any(a != b and a != 1 for a, b in zip(reversed(mine), reversed(shape))):
            raise errors.index_error(f"shape {mine} cannot be broadcast to {shape}")
        t = self.expand([0] * (len(shape) - len(mine))) if len(shape) > len(mine) else self
        p = t._p
        for d, (a, b) in enumerate(zip(t._shape, shape)):
            if a != b:
                p = R.broadcast_unit(p, d, b)
        return t._new(p, shape) if p is not t._p else t

    def subSample(self, stride: int, dim: int) -> "Tensor":  # noqa: N802
        self._check_dim(dim)
        stride = int(stride)
        if stride < 1:
            raise errors.index_error(f"subSample: stride must be at least 1, got {stride}")
        if stride == 1:
            return self
        shape = list(self._shape)
        shape[dim] = -(-shape[dim] // stride)
        return self._new(R.subsample(self._p, dim, stride), shape)

    def upsample(self, scale: int, dim: int) -> "Tensor":
        self._check_dim(dim)
        scale = int(scale)
        shape = list(self._shape)
        shape[dim] *= scale
        if scale == 0:
            return self._new(R.Pieces.empty(self.rank()), shape)
        return self._new(R.upsample(self._p, dim, scale), shape)

    def reverse(self, dim: int) -> "Tensor":
        self._check_dim(dim)
        return self._new(R.reverse(self._p, dim, self._shape[dim]), self._shape)

    def reinterpret(self, type_: Type) -> "Tensor":
        if type_.size != self.elementType().size:
            raise errors.tensor_creation_error(
                f"Cannot reinterpret {self.elementType()} as {type_}: element sizes differ")
        return Tensor(self._state, self._type, None, None if type_ == self._type else type_, pieces=self._p,
                      shape=self._shape)

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
            if lo + (e - s) > var.start + var.numel:       # a run across two variables
                k = var.start + var.numel - lo
                out.append((var, Interval(lo - var.start, var.numel)))
                nxt = space.variable_at(lo + k)
                out.append((nxt, Interval(0, e - s - k)))
                continue
            out.append((var, Interval(lo - var.start, lo - var.start + (e - s))))
        return out

    def isContiguous(self) -> bool:  # noqa: N802
        """Whether the flattened elements are consecutive addresses of one variable."""
        p = self._p
        if len(p) == 0:
            return True
        if p.row is not None:
            return R._dense(p.row[3], p.row[4])
        a = self.flat_addresses()
        return bool(np.all(np.diff(a) == 1)) and _sets.unique(p.var).size == 1

    def containsAliases(self) -> bool:  # noqa: N802
        return R.pieces_alias(self._p)

    def containsConstant(self) -> bool:  # noqa: N802
        vs = self._state.variables
        if self._p.row is not None:
            return vs[self._p.row[0]].constant
        return any(vs[v].constant for v in _sets.unique(self._p.var).tolist())

    def isParallelWriteable(self) -> bool:  # noqa: N802
        return not self.containsAliases() and not self.containsConstant()

    def intersectsWith(self, other: "Tensor") -> bool:  # noqa: N802
        if other._type != self._type or other._state is not self._state:
            return False
        a, b = self._p, other._p
        if len(a) == 0 or len(b) == 0:
            return False
        return R.pieces_intersect(a, b)

    def same_view(self, other: "Tensor") -> bool:
        """Whether ``other`` views the same elements as this tensor, in the same order, with the
        same shape and type (openipu extension; the test of :func:`~openipu.poplar.regions.same_pieces`:
        structural, costs the number of pieces, and may answer False for one view built two ways)."""
        return (self._shape == other._shape and self._type == other._type and self.elementType() == other.elementType()
                and self._state is other._state and R.same_pieces(self._p, other._p))

    def dump(self) -> str:
        return repr(self)


def _pieces_from_addresses(space, a: np.ndarray) -> R.Pieces:
    """Pieces of a view given by an array of element addresses: one affine piece when the
    addresses are affine in the index and lie in one variable, else runs of consecutive
    addresses within one variable (each a piece of the flattened view), reshaped."""
    d = a.ndim
    n = a.size
    if n == 0:
        return R.Pieces.empty(d)
    a = a.astype(np.int64, copy=False)
    first = int(a.reshape(-1)[0])
    st = np.zeros(d, np.int64)
    for i in range(d):
        if a.shape[i] > 1:
            idx = [0] * d
            idx[i] = 1
            st[i] = int(a[tuple(idx)]) - first
    lo_addr, hi_addr = int(a.min()), int(a.max())
    vidx = space.variable_index(np.array([lo_addr, hi_addr]))
    if vidx[0] == vidx[1]:
        grid = np.full(a.shape, first, np.int64)
        for i in range(d):
            shp = [1] * d
            shp[i] = a.shape[i]
            grid += (np.arange(a.shape[i], dtype=np.int64) * st[i]).reshape(shp)
        if np.array_equal(grid, a):
            var = space.vars[int(vidx[0])]
            return R.Pieces(np.array([var.id], np.int64), np.array([first], np.int64), np.zeros((1, d), np.int64),
                            np.array([a.shape], np.int64), st.reshape(1, d))
    flat = a.reshape(-1)
    vi = space.variable_index(flat)
    brk = np.flatnonzero((np.diff(flat) != 1) | (np.diff(vi) != 0)) + 1
    starts = np.concatenate(([0], brk))
    lens = np.diff(np.append(starts, n))
    var_ids = np.array([v.id for v in space.vars], np.int64)[vi[starts]]
    flat_p = R.Pieces(var_ids, flat[starts], starts.reshape(-1, 1), lens.reshape(-1, 1), np.ones((starts.size, 1), np.int64))
    return R.reshape(flat_p, [n], list(a.shape)) if d != 1 else flat_p


def concat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate tensors along ``dim`` (``poplar::concat``). All must share type and graph."""
    tensors = list(tensors)
    if not tensors:
        raise errors.tensor_creation_error("concat needs at least one tensor")
    t0 = tensors[0]
    if not 0 <= dim < max(t0.rank(), 1):
        raise errors.tensor_creation_error(f"concat: dimension {dim} is out of range for rank {t0.rank()}")
    for t in tensors[1:]:
        if t._type != t0._type or t._view_type != t0._view_type:
            raise errors.tensor_creation_error(f"concat: element types differ ({t0.elementType()} vs {t.elementType()})")
        if t.rank() != t0.rank() or any(a != b for i, (a, b) in enumerate(zip(t.shape(), t0.shape())) if i != dim):
            raise errors.tensor_creation_error(f"concat: shapes {t0.shape()} and {t.shape()} differ outside dimension {dim}")
        if t._state is not t0._state:
            raise errors.tensor_creation_error("concat: the tensors belong to different graphs")
    if len(tensors) == 1:
        return t0
    parts, off = [], 0
    for t in tensors:
        parts.append(R.shift_dim(t._p, dim, off) if off else t._p)
        off += t._shape[dim]
    shape = list(t0._shape)
    shape[dim] = off
    return t0._new(R.concat_pieces(parts, t0.rank()), shape)


def append(t: Tensor, s: Tensor, dim: int = 0) -> Tensor:
    """``poplar::append``: ``s`` (one rank lower) added as a new slice at the end of ``dim``."""
    return concat([t, s.expand([dim])], dim)


def _register_records():
    from openipu.poplar.graph_codec import data_class
    data_class(Tensor)
    data_class(Interval)


_register_records()


def _piece_digits(p: R.Pieces):
    """Per element of the pieces laid end to end (row-major within each piece): the piece and the
    ``(dim, digit)`` of each dim some piece spans (more than one element), innermost first.
    Digits of a dim whose size all pieces share use that size as a scalar (no gather)."""
    cnt = p.numel()
    rep, local = R.group_ranks(cnt)
    used = [i for i in range(p.sz.shape[1]) if (p.sz[:, i] > 1).any()]
    digits = []
    for n, i in enumerate(reversed(used)):
        if n == len(used) - 1:
            digits.append((i, local))                 # the outermost used dim: the rest of the rank
            break
        col = p.sz[:, i]
        r = int(col[0]) if (col == col[0]).all() else col[rep]
        digits.append((i, local % r))
        local = local // r
    return rep, digits



def _piece_addresses(p: R.Pieces, shape) -> tuple[np.ndarray, np.ndarray]:
    """The address of each element of the pieces laid end to end, and its row-major position in
    a tensor of ``shape`` (int64 arrays)."""
    rep, digits = _piece_digits(p)
    st = np.broadcast_to(p.st, p.sz.shape)
    W = np.ones(len(shape), np.int64)
    for i in range(len(shape) - 2, -1, -1):
        W[i] = W[i + 1] * shape[i + 1]
    addr = p.addr[rep]
    pos = (p.lo @ W)[rep] if len(shape) else np.zeros(rep.size, np.int64)
    for i, dig in digits:
        col = st[:, i]
        addr = addr + dig * (int(col[0]) if (col == col[0]).all() else col[rep])
        pos = pos + dig * int(W[i])
    return addr, pos
