"""Functional storage of a graph: one torch buffer per element type, shaped ``[replicas, size]``.

The buffers follow the memory plan (:func:`openipu.poplar.memory.host_offsets`): a variable's
elements lie at ``offset(variable) + index``, and variables whose lifetimes do not overlap share
offsets, as they share memory on the chip. An :class:`Accessor` reads or writes a tensor view
with strided views of the buffer: a one-piece view is a single strided view, a view of a few
pieces is assembled box by box, and a view of many pieces (blocked layouts) is planned once, on its
first use, as groups of equal pieces: a group on a regular grid with affine buffer positions moves
by one strided copy (its plan a few integers), the rest through index gathers whose element indices
are built only while they are used. Plans follow pieces, never elements. Storage copies run on one
torch thread (exact copies; kernels keep their own thread policy).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from openipu.poplar.regions import row_major_strides
from openipu.poplar.tensor import Tensor


class Storage:
    """The device memory of all replicas, as torch tensors (host RAM).

    Args:
        state: the graph state (its spaces and variables).
        replicas: replicas held side by side (the leading dim of every buffer).
        layout: ``{type name: (offset of each variable of the space, buffer size)}`` from the
            memory plan; without it every variable gets its own range (no sharing).
    """

    def __init__(self, state, replicas: int, layout: dict | None = None):
        self.replicas = replicas
        self.state = state
        self.bufs: dict[str, torch.Tensor] = {}
        self.delta: dict[str, np.ndarray] = {}      # host offset - address, per variable of a space
        for name, space in state.spaces.items():
            starts = np.array([v.start for v in space.vars], np.int64)
            if layout and name in layout:
                off, size = layout[name]
            else:
                off, size = starts, max(space.size, 1)
            self.delta[name] = np.asarray(off, np.int64) - starts
            buf = torch.zeros(replicas, int(size), dtype=space.type.torch_dtype)
            for var, o in zip(space.vars, np.asarray(off).tolist()):
                init = var.initial()
                if init is not None:
                    buf[:, o:o + var.numel] = space.type.wrap(init)
            self.bufs[name] = buf
        for t, values in getattr(state, "initial_values", []):
            Accessor(t).write(self, values.reshape(t.shape()) if t.numElements() else values)
        for t in getattr(state, "replication_index_vars", []):
            Accessor(t).write(self, torch.arange(replicas).reshape(replicas, *([1] * t.rank())))

    @property
    def nbytes(self) -> int:
        """Host bytes held by the buffers."""
        return sum(b.numel() * b.element_size() for b in self.bufs.values())

    def host_positions(self, type_name: str, addrs: np.ndarray) -> np.ndarray:
        """Buffer positions of element addresses of a space (int64, like ``addrs``)."""
        space = self.state.spaces[type_name]
        delta = self.delta[type_name]
        if not delta.any():
            return np.asarray(addrs, np.int64)
        return np.asarray(addrs, np.int64) + delta[space.variable_index(np.asarray(addrs).reshape(-1))].reshape(np.shape(addrs))


#: Views of more pieces than this are read and written through grouped index gathers
#: (:class:`_Groups`) instead of one strided copy per piece.
LOOP_MAX_PIECES = 8
#: Elements per transient index chunk of a grouped gather (two int64 arrays of this size).
INDEX_CHUNK = 1 << 21


class _Groups:
    """The pieces of a view grouped by equal sizes and strides: in a group, element ``i`` of piece
    ``k`` is at buffer position ``base[k] + local[i]`` and at flat view position ``pos[k] +
    pos_local[i]``.

    A group whose pieces tile a regular grid of the view (corners ``lo0 + idx * step`` over a
    full grid of ``idx``) with buffer positions affine in the grid index (``b0 + idx @ B``) --
    blocked layouts, the common case -- is moved by one strided copy between two rank
    ``grid + piece`` views (:attr:`grids`), planned once and holding a few integers. Other groups
    (:attr:`groups`) go through index gathers whose element indices are built only while they
    are used, in bounded chunks (:meth:`indices`). Host memory follows pieces and distinct piece
    shapes, never elements.

    Args:
        lo, sz, st: per piece (``[k, rank]`` int64) the view corner, sizes and buffer strides.
        host: ``[k]`` buffer position of each piece's corner element.
        shape: the view's shape.
        write: plan writes: grid dims that map several pieces to one address keep their last
            piece (as numpy's last write wins); piece dims must already be cut by the caller.
    """

    __slots__ = ("groups", "grids")

    def __init__(self, lo, sz, st, host, shape, write: bool = False):
        S = np.array(row_major_strides(shape), np.int64).reshape(len(shape))
        key = np.concatenate([sz, st], axis=1)
        if (key == key[0]).all():
            order, cuts = np.arange(len(key)), []
        else:
            order = np.lexsort(key.T[::-1])
            ks = key[order]
            cuts = np.flatnonzero((ks[1:] != ks[:-1]).any(axis=1)) + 1
        self.groups = []
        self.grids = []
        for members in np.split(order, cuts):
            k0 = members[0]
            grids = _grid_plans(lo[members], sz[k0], st[k0], host[members], write)
            if grids is not None:
                self.grids.extend(grids)
                continue
            local = np.zeros((), np.int64)
            pos_local = np.zeros((), np.int64)
            for j, n in enumerate(sz[k0].tolist()):
                ar = np.arange(n, dtype=np.int64)
                local = np.add.outer(local, ar * st[k0, j])
                pos_local = np.add.outer(pos_local, ar * S[j])
            self.groups.append((torch.from_numpy(host[members]), torch.from_numpy(lo[members] @ S),
                                torch.from_numpy(local.reshape(-1)), torch.from_numpy(pos_local.reshape(-1))))

    def indices(self):
        """``(buffer positions, view positions)``, int64, per chunk of at most
        :data:`INDEX_CHUNK` elements (or one piece) of a group."""
        for base, pos, local, pos_local in self.groups:
            step = max(1, INDEX_CHUNK // max(1, local.numel()))
            for a in range(0, base.numel(), step):
                yield ((base[a:a + step, None] + local).reshape(-1),
                       (pos[a:a + step, None] + pos_local).reshape(-1))

    def repeats(self) -> bool:
        """Whether a grid puts several of its pieces at one address (a zero grid stride)."""
        return any(s == 0 and n > 1 for g in self.grids for n, s in zip(g[0][:len(g[4])], g[1][:len(g[4])]))

    def strided(self, buf: torch.Tensor, view: torch.Tensor):
        """``(buffer side, view side, dims to flip)``: equal-shape strided views, one per grid
        group, of ``buf`` (a ``[replicas, size]`` buffer) and ``view`` (a ``[replicas or 1,
        *shape]`` tensor, any strides). A read copies the buffer side, flipped, into the view
        side; a write the view side, flipped, into the buffer side."""
        vst = view.stride()[1:]
        for size, bst, boff, flip, gdims, steps, lo0 in self.grids:
            vs = tuple(s * vst[j] for j, s in zip(gdims, steps)) + vst
            b = buf.as_strided((buf.shape[0],) + size, (buf.stride(0),) + bst, buf.storage_offset() + boff)
            v = view.as_strided((view.shape[0],) + size, (view.stride(0),) + vs,
                                view.storage_offset() + sum(a * b_ for a, b_ in zip(lo0, vst)))
            yield b, v, flip


def _grid_plan(lo: np.ndarray, sz: np.ndarray, st: np.ndarray, host: np.ndarray, write: bool):
    """The strided plan of a group of equal pieces (corners ``lo`` ``[k, rank]``, sizes ``sz``
    and buffer strides ``st`` ``[rank]``, corner buffer positions ``host`` ``[k]``) if the
    corners form a full regular grid and the positions are affine in the grid index, else
    ``None``. The plan: sizes and non-negative buffer strides of the ``grid dims + piece dims``
    view, its buffer offset, the dims to flip (negative strides), the view dims of the grid, their
    corner steps and the first corner."""
    k, rank = lo.shape
    if k == 1:
        return _normalise(sz.tolist(), st.tolist(), int(host[0]), (), (), lo[0])
    gdims, steps, counts, idx = [], [], [], []
    first = lo.min(axis=0)
    span = lo.max(axis=0) - first
    for j in np.flatnonzero(span).tolist():
        rel = lo[:, j] - first[j]
        step = int(np.gcd.reduce(rel))
        gdims.append(j), steps.append(step), counts.append(int(span[j]) // step + 1), idx.append(rel // step)
    if math.prod(counts) != k:
        return None
    # k cells of a grid of k: a full grid iff no cell is taken twice
    cell = np.ravel_multi_index(tuple(idx), counts)
    if np.bincount(cell, minlength=k).max() != 1:
        return None
    base = np.empty(k, np.int64)
    base[cell] = host
    base = base.reshape(counts)
    b0 = int(base.reshape(-1)[0])
    B = [int(np.take(base, [1], axis=a).reshape(-1)[0]) - b0 for a in range(len(counts))]
    for a, b in enumerate(B):       # affine: every step along a grid axis moves by the same B
        if (np.diff(base, axis=a) != b).any():
            return None
    lo0 = first.astype(np.int64).copy()
    size = list(counts) + sz.tolist()
    strides = B + st.tolist()
    if write:
        # several grid cells at one address: keep the last cell (the last write wins)
        keep = []
        for i, (j, b, c) in enumerate(zip(gdims, B, counts)):
            if b == 0 and c > 1:
                lo0[j] += (c - 1) * steps[i]
            else:
                keep.append(i)
        gdims, steps = [gdims[i] for i in keep], [steps[i] for i in keep]
        size = [counts[i] for i in keep] + sz.tolist()
        strides = [B[i] for i in keep] + st.tolist()
    return _normalise(size, strides, b0, gdims, steps, lo0)


def _normalise(size, strides, off, gdims, steps, lo0):
    """A grid plan with its negative buffer strides made positive (the offset moved to the lowest
    element and the dim flipped)."""
    strides = [int(s) for s in strides]
    flip = []
    for i, (n, s) in enumerate(zip(size, strides)):
        if s < 0:
            off += (n - 1) * s
            strides[i] = -s
            if n > 1:
                flip.append(i + 1)
    return (tuple(int(x) for x in size), tuple(strides), int(off), tuple(flip),
            tuple(gdims), tuple(steps), tuple(int(x) for x in lo0))


#: A group of equal pieces that is not one grid may be cut along one view dim into at most this
#: many grids (one strided copy each per run), of at least :data:`MIN_SPLIT_ELEMENTS` elements
#: on average (a copy's fixed host cost is that of gathering about that many elements);
#: otherwise it goes through index gathers.
MAX_GRID_SPLIT = 32
MIN_SPLIT_ELEMENTS = 4096


def _grid_plans(lo, sz, st, host, write: bool):
    """Grid plans (:func:`_grid_plan`) covering a group of equal pieces: one grid, or the group
    cut by the corner of one view dim into at most :data:`MAX_GRID_SPLIT` grids of
    :data:`MIN_SPLIT_ELEMENTS` elements on average; ``None`` if neither works (the group then
    goes through index gathers)."""
    plan = _grid_plan(lo, sz, st, host, write)
    if plan is not None:
        return [plan]
    cands = []
    most = min(MAX_GRID_SPLIT, len(lo) * int(np.prod(sz)) // MIN_SPLIT_ELEMENTS)
    for j in range(lo.shape[1] if most > 1 else 0):
        u, inv = np.unique(lo[:, j], return_inverse=True)
        if 1 < len(u) <= most:
            cands.append((len(u), j, inv.reshape(-1)))
    for n, j, inv in sorted(cands, key=lambda c: c[:2]):
        order = np.argsort(inv, kind="stable")
        plans = []
        for m in np.split(order, np.flatnonzero(np.diff(inv[order])) + 1):
            p = _grid_plan(lo[m], sz, st, host[m], write)
            if p is None:
                break
            plans.append(p)
        else:
            return plans
    return None


class Accessor:
    """Precomputed read / write of one tensor view (values shaped ``[replicas, *shape]``): one
    strided view of the buffer for a single piece, one per piece for a few pieces, and for many
    (:data:`LOOP_MAX_PIECES`) the grid copies and index gathers of :class:`_Groups`. The plan is
    built on the first read or write and kept for that storage."""

    __slots__ = ("t", "key", "shape", "numel", "type", "view_type", "_bound", "_plan", "_groups", "_span")

    def __init__(self, t: Tensor):
        self.t = t
        self.key = t._type.space
        self.type = t._type
        self.view_type = t._view_type
        self.shape = tuple(t.shape())
        self.numel = int(np.prod(self.shape, dtype=np.int64))
        self._bound = None
        self._plan = None
        self._groups = None
        self._span = (0, -1)

    def _host_addresses(self, storage: Storage) -> np.ndarray:
        """Buffer position of each piece's corner element (``[k]``)."""
        p = self.t.pieces
        vs = storage.state.variables
        var, inv = np.unique(p.var, return_inverse=True)
        sp_idx = np.array([vs[v].space_index for v in var.tolist()], np.int64)[inv.reshape(-1)]
        return p.addr + storage.delta[self.key][sp_idx]

    def _pieces(self, storage: Storage):
        """Per piece: (box of the view, sizes, positive strides, buffer offset of the lowest
        element, dims to flip, broadcast dims); or, for many pieces, ``None`` and the groups of
        :class:`_Groups` (for reads, and for writes with broadcast dims cut to their last
        element). Cached per storage."""
        if self._bound is storage:
            return self._plan
        p = self.t.pieces
        plan = []
        self._groups = None
        self._span = (0, -1)
        if len(p):
            # buffer positions [first, last] the view touches (row 0; replica r adds r * row size)
            h = self._host_addresses(storage)
            ext = (p.sz - 1) * p.st
            self._span = (int((h + np.minimum(ext, 0).sum(axis=1)).min()),
                          int((h + np.maximum(ext, 0).sum(axis=1)).max()))
        if len(p) > LOOP_MAX_PIECES:
            host = h
            lo, sz, st = p.lo, p.sz, p.st
            read = _Groups(lo, sz, st, host, self.shape)
            bc = (st == 0) & (sz > 1)
            if bc.any() or read.repeats():
                # several elements of the view at one address: the last one written wins (numpy)
                lo, sz = np.where(bc, lo + sz - 1, lo), np.where(bc, 1, sz)
                write = _Groups(lo, sz, st, host, self.shape, write=True)
            else:
                write = read
            self._groups = (read, write)
            plan = None
        elif len(p):
            host = h.tolist()
            for k in range(len(p)):
                sz = tuple(int(x) for x in p.sz[k])
                st = [int(x) for x in p.st[k]]
                off = int(host[k]) + sum((s - 1) * t for s, t in zip(sz, st) if t < 0)
                flip = tuple(i for i, t in enumerate(st) if t < 0 and sz[i] > 1)
                bcast = tuple(i for i, t in enumerate(st) if t == 0 and sz[i] > 1)
                box = tuple(slice(int(a), int(a) + s) for a, s in zip(p.lo[k], sz))
                plan.append((box, sz, tuple(abs(t) for t in st), off, flip, bcast))
        self._bound, self._plan = storage, plan
        return plan

    def _view(self, buf, sz, st, off):
        return buf.as_strided((buf.shape[0],) + sz, (buf.stride(0),) + st, off)

    def read(self, storage: Storage) -> torch.Tensor:
        buf = storage.bufs[self.key]
        plan = self._pieces(storage)
        R = storage.replicas
        threads = _serial(R * self.numel)
        try:
            v = self._read(buf, plan, R)
        finally:
            if threads:
                torch.set_num_threads(threads)
        if self.view_type is not None:
            v = v.view(self.view_type.torch_dtype) if self.view_type.torch_dtype.itemsize == v.dtype.itemsize else self.view_type.wrap(v)
        return v

    def _read(self, buf, plan, R):
        if plan is None:
            v = buf.new_empty((R,) + self.shape)
            for b, part, flip in self._groups[0].strided(_raw(buf), _raw(v)):
                part.copy_(b.flip(flip) if flip else b)
            flat = v.view(R, -1)
            for src, dst in self._groups[0].indices():
                _raw(flat).index_copy_(1, dst, _raw(buf).index_select(1, src))
        elif len(plan) == 1 and plan[0][1] == self.shape:
            box, sz, st, off, flip, _ = plan[0]
            v = self._view(buf, sz, st, off)
            if flip:
                v = v.flip([d + 1 for d in flip])
        else:
            v = buf.new_empty((R,) + self.shape)
            for box, sz, st, off, flip, _ in plan:
                pv = self._view(buf, sz, st, off)
                v[(slice(None),) + box] = pv.flip([d + 1 for d in flip]) if flip else pv
        return v

    def write(self, storage: Storage, value) -> None:
        buf = storage.bufs[self.key]
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(np.asarray(value))
        if self.view_type is not None and value.dtype == self.view_type.torch_dtype and value.dtype.itemsize == buf.dtype.itemsize:
            value = value.view(buf.dtype)
        elif value.dtype != buf.dtype or self.type.wrap_bits:
            value = self.type.wrap(value)
        n = self.numel
        if n == 0:
            return
        R = storage.replicas
        value = value.reshape((-1,) + self.shape) if value.numel() == R * n else value.reshape((1,) + self.shape)
        if value.shape[0] != R:
            value = value.expand((R,) + self.shape)
        plan = self._pieces(storage)
        threads = _serial(R * n)
        try:
            self._write(buf, plan, value)
        finally:
            if threads:
                torch.set_num_threads(threads)

    def _overlaps(self, buf, value) -> bool:
        """Whether ``value`` is a view of ``buf`` over positions this view writes."""
        if value.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr() or buf.numel() == 0:
            return False
        row = buf.stride(0)
        a = value.storage_offset() - buf.storage_offset()
        b = a + sum((n - 1) * s for n, s in zip(value.shape, value.stride()))
        return a <= self._span[1] + (buf.shape[0] - 1) * row and self._span[0] <= b

    def _write(self, buf, plan, value):
        if self._overlaps(buf, value):
            value = value.clone()           # a view of the buffer over what is written: copy it first
        if plan is None:
            for b, part, flip in self._groups[1].strided(_raw(buf), _raw(value)):
                b.copy_(part.flip(flip) if flip else part)
            if not self._groups[1].groups:
                return
            flat = value.reshape(value.shape[0], -1)
            for dst, src in self._groups[1].indices():
                _raw(buf).index_copy_(1, dst, _raw(flat).index_select(1, src))
            return
        for box, sz, st, off, flip, bcast in plan:
            part = value[(slice(None),) + box] if len(self._plan) > 1 or sz != self.shape else value
            if flip:
                part = part.flip([d + 1 for d in flip])
            if bcast:
                # several elements of the view are one address: the last one written wins (numpy)
                idx = tuple(slice(s - 1, s) if i in bcast else slice(None) for i, s in enumerate(sz))
                part = part[(slice(None),) + idx]
                sz = tuple(1 if i in bcast else s for i, s in enumerate(sz))
            self._view(buf, sz, st, off).copy_(part)


#: Elements above which torch splits a copy over its threads (``at::internal::GRAIN_SIZE``).
PARALLEL_GRAIN = 32768


def _serial(elements: int) -> int:
    """Make torch copy on one thread; returns the thread count to restore (0: nothing to restore).
    Storage reads and writes are copies (bandwidth-bound, exact): a second thread gains little
    on an idle host, and when another process holds a core each parallel copy waits for a
    scheduler slice (measured on this 2-core host, loaded: a 1M-element copy 10.3 ms on two
    threads, 0.6 ms on one). Kernels keep their own thread policy, so results do not change."""
    if elements <= PARALLEL_GRAIN:
        return 0
    n = torch.get_num_threads()
    if n == 1:
        return 0
    torch.set_num_threads(1)
    return n


_FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}


def _raw(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as bytes when its type is float8 (torch has no index_copy / index_select for
    float8): the copies move bits, so the values are unchanged."""
    return t.view(torch.uint8) if t.dtype in _FLOAT8 else t
