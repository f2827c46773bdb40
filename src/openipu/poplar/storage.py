"""Functional storage of a graph: one torch buffer per element type, shaped ``[replicas, size]``.

Variables are ranges of their type's buffer (see ``graph._Space``); an :class:`Accessor` reads
or writes a tensor view with one slice (contiguous views) or one gather / scatter.
"""

from __future__ import annotations

import numpy as np
import torch

from openipu.poplar.tensor import Tensor


class Storage:
    """The device memory of all replicas, as torch tensors (host RAM)."""

    def __init__(self, state, replicas: int):
        self.replicas = replicas
        self.bufs: dict[str, torch.Tensor] = {}
        for name, space in state.spaces.items():
            buf = torch.zeros(replicas, max(space.size, 1), dtype=space.type.torch_dtype)
            for var in space.vars:
                if var.init is not None:
                    buf[:, var.start:var.start + var.numel] = space.type.wrap(var.init)
            self.bufs[name] = buf
        for t, values in getattr(state, "initial_values", []):
            Accessor(t).write(self, values.reshape(t.shape()) if t.numElements() else values)
        for i, t in enumerate(getattr(state, "replication_index_vars", [])):
            acc = Accessor(t)
            acc.write(self, torch.arange(replicas).reshape(replicas, *([1] * t.rank())))


class Accessor:
    """Precomputed read / write of one tensor view (values shaped ``[replicas, *shape]``)."""

    __slots__ = ("key", "shape", "start", "stop", "index", "type", "view_type")

    def __init__(self, t: Tensor):
        self.key = t._type.name
        self.type = t._type
        self.view_type = t._view_type
        self.shape = tuple(t.shape())
        addr = t.flat_addresses()
        self.index = None
        self.start = self.stop = 0
        if addr.size and addr[-1] - addr[0] == addr.size - 1 and (addr.size == 1 or np.all(np.diff(addr) == 1)):
            self.start, self.stop = int(addr[0]), int(addr[-1]) + 1
        elif addr.size:
            self.index = torch.from_numpy(np.array(addr, dtype=np.int64, order="C", copy=not addr.flags.writeable or None))

    def read(self, storage: Storage) -> torch.Tensor:
        buf = storage.bufs[self.key]
        if self.index is None:
            v = buf[:, self.start:self.stop]
        else:
            v = buf.index_select(1, self.index)
        v = v.reshape((storage.replicas,) + self.shape)
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
        n = self.stop - self.start if self.index is None else self.index.numel()
        if n == 0:
            return
        value = value.reshape(-1, n) if value.numel() == storage.replicas * n else value.reshape(1, n).expand(storage.replicas, n)
        if self.index is None:
            buf[:, self.start:self.stop] = value
        else:
            buf[:, self.index] = value
