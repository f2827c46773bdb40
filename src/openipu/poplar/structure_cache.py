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
import weakref
from collections import OrderedDict

import numpy as np

_I64 = np.int64

#: Bytes of keys and stored arrays the memo keeps before it drops the least recently used entries
#: (``OPENIPU_STRUCTURE_CACHE_MB`` sets it in MiB; one MiniLM compile keeps ~52 MiB, measured
#: 2026-11-30 with an unbounded memo; ~200 MB before keys held tile maps as tokens).
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
    its tile), as the mapping's :func:`mapping_token`."""
    p = view.pieces
    state = view._state
    variables = state.variables
    hit = _PIECES_KEYS.get(id(p))
    if hit is not None and hit[0] is p and hit[1]() is state:
        body, uv, starts = hit[2:]
    else:
        if p.row is not None:
            uv = np.array([p.row[0]], _I64)
            inv = np.zeros(1, _I64)
        else:
            uv, inv = np.unique(p.var, return_inverse=True)
            inv = inv.reshape(-1)
        starts = np.array([variables[v].start for v in uv.tolist()], _I64)
        st = np.broadcast_to(p.st, p.sz.shape)
        body = b"".join(array_bytes(inv, p.addr - starts[inv], p.lo, p.sz, st))
        global _pieces_bytes
        if len(_PIECES_KEYS) >= _PIECES_KEYS_MAX or _pieces_bytes + len(body) > _PIECES_KEYS_MAX_BYTES:
            clear_pieces_keys()
        _PIECES_KEYS[id(p)] = (p, weakref.ref(state), body, uv, starts)
        _pieces_bytes += len(body)
    parts = [tag, np.int64(view.rank()).tobytes(), body]
    parts += array_bytes(*extra)
    if with_runs:
        space = state.space(view._type)
        for v in uv.tolist():
            parts.append(mapping_token(space.vars[variables[v].space_index]))
    return b"".join(parts), uv.copy(), starts.copy()


#: the structure part of :func:`view_key` per pieces object (``id`` -> the pieces, a weak
#: reference to their graph state, key bytes, variable ids, starts): a compute set's transfer is
#: keyed three times (its volume, its moves, its lattices) and an operand read by several compute
#: sets more. The entry holds the pieces, so their ``id`` is not reused while it is here; pieces
#: are never changed after they are made, and a variable's start address is fixed when it is
#: added. Bounded (entries and key bytes); the engine compile empties it when it ends.
_PIECES_KEYS: dict = {}
_PIECES_KEYS_MAX = 512
_PIECES_KEYS_MAX_BYTES = 32 << 20
_pieces_bytes = 0


def clear_pieces_keys() -> None:
    """Empty :func:`view_key`'s per-pieces cache (host memory only; no result changes)."""
    global _pieces_bytes
    _PIECES_KEYS.clear()
    _pieces_bytes = 0


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


class _Interned:
    """Distinct mapping byte strings -> serial numbers, never reused (so a number always stands
    for one byte string, also after the table is emptied). Bounded like the memo: past
    ``max_bytes`` of strings the table is emptied and numbering goes on, so a mapping seen again
    gets a new number and the memo's old entries for it are misses (never wrong hits)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.ids: dict[bytes, bytes] = {}
        self.nbytes = 0
        self.next = 0

    def token(self, b: bytes) -> bytes:
        t = self.ids.get(b)
        if t is None:
            if self.nbytes + len(b) > self.max_bytes:
                self.ids.clear()
                self.nbytes = 0
            t = self.ids[b] = b"m" + np.int64(self.next).tobytes()
            self.next += 1
            self.nbytes += len(b)
        return t


_INTERNED = _Interned(MAX_BYTES)


def mapping_token(var) -> bytes:
    """Short key bytes (9) standing for :func:`mapping_bytes` of ``var``: equal tokens mean equal
    mapping bytes (an exact interning, not a hash), so keys compare a variable's size and tile
    mapping without holding them. A MiniLM compile hashed and compared 45 MB of keys when they
    held the mapping bytes. Kept on the variable beside the bytes (made again only when the
    mapping changes, see :func:`mapping_bytes`)."""
    b = mapping_bytes(var)
    c = var.__dict__.get("_mapping_token")
    if c is not None and c[0] is b:
        return c[1]
    t = _INTERNED.token(b)
    var.__dict__["_mapping_token"] = (b, t)
    return t
