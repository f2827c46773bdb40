"""Functional storage of a graph: one torch buffer per element type, shaped ``[replicas, size]``.

The buffers follow the memory plan (:func:`openipu.poplar.memory.host_offsets`): a variable's
elements lie at ``offset(variable) + index``, and variables whose lifetimes do not overlap share
offsets, as they share memory on the chip. An :class:`Accessor` reads or writes a tensor view
piece by piece with strided views of the buffer (no index arrays): a one-piece view is a single
strided view, a view of several pieces is assembled box by box.
"""

from __future__ import annotations

import numpy as np
import torch

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
                if var.init is not None:
                    buf[:, o:o + var.numel] = space.type.wrap(var.init)
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


class Accessor:
    """Precomputed read / write of one tensor view (values shaped ``[replicas, *shape]``)."""

    __slots__ = ("t", "key", "shape", "type", "view_type", "_bound", "_plan")

    def __init__(self, t: Tensor):
        self.t = t
        self.key = t._type.name
        self.type = t._type
        self.view_type = t._view_type
        self.shape = tuple(t.shape())
        self._bound = None
        self._plan = None

    def _pieces(self, storage: Storage):
        """Per piece: (box of the view, sizes, positive strides, buffer offset of the lowest
        element, dims to flip, broadcast dims); cached per storage."""
        if self._bound is storage:
            return self._plan
        p = self.t.pieces
        space = storage.state.spaces[self.key]
        delta = storage.delta[self.key]
        plan = []
        if len(p):
            vs = storage.state.variables
            sp_idx = np.array([vs[v].space_index for v in p.var.tolist()], np.int64)
            host = p.addr + delta[sp_idx]
            for k in range(len(p)):
                sz = tuple(int(x) for x in p.sz[k])
                st = [int(x) for x in p.st[k]]
                off = int(host[k]) + sum((s - 1) * t for s, t in zip(sz, st) if t < 0)
                flip = tuple(i for i, t in enumerate(st) if t < 0 and sz[i] > 1)
                bcast = tuple(i for i, t in enumerate(st) if t == 0 and sz[i] > 1)
                box = tuple(slice(int(a), int(a) + s) for a, s in zip(p.lo[k], sz))
                plan.append((box, sz, tuple(abs(t) for t in st), off, flip, bcast))
        del space
        self._bound, self._plan = storage, plan
        return plan

    def _view(self, buf, sz, st, off):
        return buf.as_strided((buf.shape[0],) + sz, (buf.stride(0),) + st, off)

    def read(self, storage: Storage) -> torch.Tensor:
        buf = storage.bufs[self.key]
        plan = self._pieces(storage)
        R = storage.replicas
        if len(plan) == 1 and plan[0][1] == self.shape:
            box, sz, st, off, flip, _ = plan[0]
            v = self._view(buf, sz, st, off)
            if flip:
                v = v.flip([d + 1 for d in flip])
        else:
            v = buf.new_empty((R,) + self.shape)
            for box, sz, st, off, flip, _ in plan:
                pv = self._view(buf, sz, st, off)
                v[(slice(None),) + box] = pv.flip([d + 1 for d in flip]) if flip else pv
        if self.view_type is not None:
            v = v.view(self.view_type.torch_dtype) if self.view_type.torch_dtype.itemsize == v.dtype.itemsize else self.view_type.wrap(v)
        return v

    def write(self, storage: Storage, value) -> None:
        buf = storage.bufs[self.key]
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(np.asarray(value))
        if self.view_type is not None and value.dtype == self.view_type.torch_dtype and value.dtype.itemsize == buf.dtype.itemsize:
            value = value.view(buf.dtype)
        elif value.dtype != buf.dtype or self.type.wrap_bits:
            value = self.type.wrap(value)
        n = 1
        for s in self.shape:
            n *= s
        if n == 0:
            return
        R = storage.replicas
        value = value.reshape((-1,) + self.shape) if value.numel() == R * n else value.reshape((1,) + self.shape)
        if value.shape[0] != R:
            value = value.expand((R,) + self.shape)
        for box, sz, st, off, flip, bcast in self._pieces(storage):
            part = value[(slice(None),) + box] if len(self._plan) > 1 or sz != self.shape else value
            if flip:
                part = part.flip([d + 1 for d in flip])
            if bcast:
                # several elements of the view are one address: the last one written wins (numpy)
                idx = tuple(slice(s - 1, s) if i in bcast else slice(None) for i, s in enumerate(sz))
                part = part[(slice(None),) + idx]
                sz = tuple(1 if i in bcast else s for i, s in enumerate(sz))
            self._view(buf, sz, st, off).copy_(part)
