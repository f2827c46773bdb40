"""A memo of exchange geometry keyed on structure, shared by identical layers (host work only).

The exchange and layout functions of :mod:`openipu.poplar.exchange` (:func:`~exchange.lattices`,
:func:`~exchange.tile_boxes`) depend on a view only through its pieces and, for tile boxes, on
the tile mappings of the variables those pieces read. Both results are *translation invariant*:
moving a variable elsewhere in its address space moves the addresses of the result by the same
amount and changes nothing else. So the key here describes the view relative to its variables
(each piece's variable as a local index, its address as an offset into that variable, its box and
strides; with ``runs``, each variable's size and run-length tile mapping), and a hit maps the
stored result back onto the caller's variables. Twelve identical encoder layers then compute
their weights' and activations' geometry once, and a sweep reuses it across its points.

Exact: the key holds every input the result depends on (a byte string compared in full, not a
hash), so a hit returns what the computation would. ``OPENIPU_STRUCTURE_CACHE=0`` turns it off
(the tests compare both ways). The memo is bounded (:data:`MAX_BYTES` of keys and values, least
recently used first out; entries over a quarter of it are not kept) and lives for the process.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np

_I64 = np.int64

#: Bytes of keys and stored arrays the memo keeps before it drops the least recently used entries
#: (``OPENIPU_STRUCTURE_CACHE_MB`` sets it in MiB; one MiniLM compile would keep ~200 MB).
MAX_BYTES = int(float(os.environ.get("OPENIPU_STRUCTURE_CACHE_MB", "128")) * (1 << 20))


class _Memo:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.data: OrderedDict[bytes, tuple] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes):
        v = self.data.get(key)
        if v is None:
            self.misses += 1
            return None
        self.data.move_to_end(key)
        self.hits += 1
        return v[1]

    def put(self, key: bytes, arrays: tuple) -> None:
        size = len(key) + sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))
        if size > self.max_bytes // 4:
            return
        for a in arrays:
            if isinstance(a, np.ndarray):
                a.setflags(write=False)
        old = self.data.pop(key, None)
        if old is not None:
            self.nbytes -= old[0]
        self.data[key] = (size, arrays)
        self.nbytes += size
        while self.nbytes > self.max_bytes and self.data:
            _, (s, _) = self.data.popitem(last=False)
            self.nbytes -= s

    def clear(self) -> None:
        self.data.clear()
        self.nbytes = 0
        self.hits = self.misses = 0


MEMO = _Memo(MAX_BYTES)


def enabled() -> bool:
    """Whether the memo is on (``OPENIPU_STRUCTURE_CACHE`` not ``0``)."""
    return os.environ.get("OPENIPU_STRUCTURE_CACHE", "1") != "0"


def array_bytes(*arrays) -> list[bytes]:
    """The arrays as int64 bytes, each after its rank and shape (an unambiguous key, also for
    empty arrays of different shapes: the boxes ``[k, 0]`` of a scalar view hold no bytes)."""
    out = []
    for a in arrays:
        a = np.ascontiguousarray(a, _I64)
        out.append(np.array([a.ndim, *a.shape], _I64).tobytes())
        out.append(a.tobytes())
    return out


def view_key(tag: bytes, view, with_runs: bool, extra=()):
    """``(key, var_ids, var_starts)`` of ``view`` relative to its variables (sorted ids and their
    start addresses, int64 ``[v]``). ``tag``
    names the function; ``extra`` arrays (e.g. the boxes) join the key. ``with_runs``: the key
    also holds each variable's size and tile mapping (start of each run within the variable,
    its tile)."""
    p = view.pieces
    state = view._state
    variables = state.variables
    if p.row is not None:
        uv = np.array([p.row[0]], _I64)
        inv = np.zeros(1, _I64)
    else:
        uv, inv = np.unique(p.var, return_inverse=True)
        inv = inv.reshape(-1)
    starts = np.array([variables[v].start for v in uv.tolist()], _I64)
    st = np.broadcast_to(p.st, p.sz.shape)
    parts = [tag, np.int64(view.rank()).tobytes()]
    parts += array_bytes(inv, p.addr - starts[inv], p.lo, p.sz, st, *extra)
    if with_runs:
        space = state.space(view._type)
        for v in uv.tolist():
            parts.append(mapping_bytes(space.vars[variables[v].space_index]))
    return b"".join(parts), uv, starts


def mapping_bytes(var) -> bytes:
    """Key bytes of a variable's size and run-length tile mapping (:func:`array_bytes` of
    ``[numel]``, its run starts and its run tiles). Kept on the variable with the mapping arrays
    it was made from: a mapping change replaces those arrays (never writes into them), so the
    bytes are made again only then, not at every key of a view of a large activation."""
    ts, ti = var.tile_starts, var.tile_ids          # applies pending mapping calls first
    c = var.__dict__.get("_mapping_key")
    if c is not None and c[0] is ts and c[1] is ti and c[2] == var.numel:
        return c[3]
    b = b"".join(array_bytes(np.array([var.numel]), ts, ti))
    var.__dict__["_mapping_key"] = (ts, ti, var.numel, b)
    return b
