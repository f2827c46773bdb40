"""Regions: how a tensor view is laid over its variables, described by structure, not elements.

A tensor of shape ``S`` (rank ``d``) is a partition of its index box ``[0, S)`` into *pieces*.
Piece ``k`` is a sub-box (corner ``lo[k]``, sizes ``sz[k]``) laid affinely over one variable: the
element at index ``i`` of the box sits at address ``addr[k] + sum((i - lo[k]) * st[k])`` of its
element type's address space (``st[k]`` may hold 0 for broadcast dims and negative strides for
reversed ones). A fresh variable is one piece; slices, dimShuffles, broadcasts, reverses and
subSamples keep the piece count; concat adds the operands' pieces; a reshape keeps it unless the
merged dims are not laid out contiguously, when it splits pieces along the outer merged dims (as
Poplar's own regions split). Host cost therefore follows the number of pieces, never the number
of elements.

All functions here are numpy-vectorised over pieces; the only Python loops run over dims.
Mixed-radix range decomposition (:func:`range_boxes`) turns a flattened index range of a box
into at most ``2 d - 1`` sub-boxes; it is how reshapes, tile mappings and exchange transfers
move between flat ranges and boxes.
"""

from __future__ import annotations

import numpy as np

from openipu.poplar import structure_cache as SC

_I64 = np.int64


class Pieces:
    """The pieces of one tensor view.

    Array attributes (int64): ``var`` ``[k]`` id of each piece's variable (index into the graph's
    variable list); ``addr`` ``[k]`` address of the element at the piece's corner; ``lo``, ``sz``,
    ``st`` ``[k, d]`` corner, sizes and strides (elements). A single piece is held as Python
    tuples (:attr:`row`) and the arrays are built only when asked for: most tensors are one
    piece, and their views then cost a few Python operations.
    """

    __slots__ = ("_var", "_addr", "_lo", "_sz", "_st", "row", "_d", "index")

    def __init__(self, var, addr, lo, sz, st):
        self._var, self._addr, self._lo, self._sz, self._st = var, addr, lo, sz, st
        self._d = int(lo.shape[1])
        self.row = None
        self.index = None        # a search index over many pieces, built by the exchange on demand
        if var.size == 1:
            self.row = (int(var[0]), int(addr[0]), tuple(lo[0].tolist()), tuple(sz[0].tolist()),
                        tuple(st[0].tolist()))

    @staticmethod
    def single(var: int, addr: int, lo: tuple, sz: tuple, st: tuple) -> "Pieces":
        """One piece, from Python ints and tuples (no numpy work until arrays are asked for)."""
        p = Pieces.__new__(Pieces)
        p.row = (var, addr, lo, sz, st)
        p._d = len(lo)
        p._var = None
        p.index = None
        return p

    def _build(self):
        v, a, lo, sz, st = self.row
        d = self._d
        self._var = np.array([v], _I64)
        self._addr = np.array([a], _I64)
        self._lo = np.array(lo, _I64).reshape(1, d)
        self._sz = np.array(sz, _I64).reshape(1, d)
        self._st = np.array(st, _I64).reshape(1, d)

    @property
    def var(self):
        if self._var is None:
            self._build()
        return self._var

    @property
    def addr(self):
        if self._var is None:
            self._build()
        return self._addr

    @property
    def lo(self):
        if self._var is None:
            self._build()
        return self._lo

    @property
    def sz(self):
        if self._var is None:
            self._build()
        return self._sz

    @property
    def st(self):
        if self._var is None:
            self._build()
        return self._st

    @staticmethod
    def of_variable(var_id: int, start: int, shape) -> "Pieces":
        """The single piece of a fresh row-major variable of ``shape`` starting at ``start``."""
        shape = tuple(int(s) for s in shape)
        if any(s == 0 for s in shape):
            return Pieces.empty(len(shape))
        return Pieces.single(var_id, start, (0,) * len(shape), shape, row_major_strides(shape))

    @staticmethod
    def empty(d: int) -> "Pieces":
        z = np.zeros(0, _I64)
        return Pieces(z, z, np.zeros((0, d), _I64), np.zeros((0, d), _I64), np.zeros((0, d), _I64))

    def __len__(self):
        return 1 if self.row is not None else int(self._var.size)

    @property
    def rank(self) -> int:
        return self._d

    def take(self, idx) -> "Pieces":
        return Pieces(self.var[idx], self.addr[idx], self.lo[idx], self.sz[idx], self.st[idx])

    def numel(self) -> np.ndarray:
        """Elements of each piece (``[k]``)."""
        return np.prod(self.sz, axis=1, dtype=_I64) if self.rank else np.ones(len(self), _I64)

    def address_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Lowest and highest address of each piece (``[k]`` each, inclusive)."""
        ext = (self.sz - 1) * self.st
        lo = self.addr + np.where(ext < 0, ext, 0).sum(axis=1)
        hi = self.addr + np.where(ext > 0, ext, 0).sum(axis=1)
        return lo, hi

    def __getstate__(self):
        return (self.var, self.addr, self.lo, self.sz, self.st)

    def __setstate__(self, s):
        Pieces.__init__(self, *s)


def row_major_strides(shape) -> tuple:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def grid_cells(edges):
    """The cells of a grid: ``edges[j]`` (increasing ints, first 0, last the dim's size) cut dim
    ``j`` into intervals; returns the corners and sizes ``[cells, d]`` of their products, in
    row-major cell order (empty cells dropped)."""
    edges = [np.asarray(e, _I64) for e in edges]
    d = len(edges)
    grids = np.meshgrid(*[np.arange(e.size - 1) for e in edges], indexing="ij")
    idx = [g_.reshape(-1) for g_ in grids]
    lo = np.stack([edges[j][:-1][idx[j]] for j in range(d)], axis=1).reshape(-1, d)
    sz = np.stack([np.diff(edges[j])[idx[j]] for j in range(d)], axis=1).reshape(-1, d)
    keep = (sz > 0).all(axis=1)
    return lo[keep], sz[keep]


def stacked_pieces(var_id: int, start: int, lo: np.ndarray, sz: np.ndarray) -> Pieces:
    """Boxes ``lo``, ``sz`` ``[k, d]`` stored one after the other from address ``start`` of a
    variable, each row-major inside (as Poplar's creators lay out blocks): one piece per box."""
    st = np.ones_like(sz)
    for j in range(sz.shape[1] - 2, -1, -1):
        st[:, j] = st[:, j + 1] * sz[:, j + 1]
    n = np.prod(sz, axis=1, dtype=_I64)
    return Pieces(np.full(lo.shape[0], var_id, _I64), start + np.cumsum(n) - n, lo, sz, st)


def concat_pieces(parts: list[Pieces], d: int) -> Pieces:
    parts = [p for p in parts if len(p)]
    if not parts:
        return Pieces.empty(d)
    if len(parts) == 1:
        return parts[0]
    return Pieces(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("var", "addr", "lo", "sz", "st")))


class _Mut:
    """Mutable copies of a piece set's arrays, frozen back into :class:`Pieces` by :func:`_freeze`."""

    __slots__ = ("var", "addr", "lo", "sz", "st")


def group_ranks(counts) -> tuple[np.ndarray, np.ndarray]:
    """For groups of ``counts[i]`` items laid end to end: the group of each item and its rank in
    its group (int64 arrays of ``sum(counts)``), i.e. ``repeat(arange(k), counts)`` and a ragged
    ``arange``."""
    counts = np.asarray(counts, _I64)
    owner = np.repeat(np.arange(counts.size, dtype=_I64), counts)
    return owner, np.arange(owner.size, dtype=_I64) - np.repeat(np.cumsum(counts) - counts, counts)


def _copy(p: Pieces) -> _Mut:
    m = _Mut()
    m.var, m.addr, m.lo, m.sz, m.st = p.var, p.addr.copy(), p.lo.copy(), p.sz.copy(), p.st.copy()
    return m


def _freeze(m: _Mut) -> Pieces:
    return Pieces(m.var, m.addr, m.lo, m.sz, m.st)


# ----------------------------------------------------------------------------------------------
# view operations (each returns new Pieces; shapes are handled by the caller)
# ----------------------------------------------------------------------------------------------
def slice_dim(p: Pieces, dim: int, begin: int, end: int) -> Pieces:
    """The pieces of ``t.slice(begin, end, dim)``."""
    if p.row is not None:
        v, a, lo, sz, st = p.row
        nlo, nhi = max(lo[dim], begin), min(lo[dim] + sz[dim], end)
        if nhi <= nlo:
            return Pieces.empty(len(lo))
        return Pieces.single(v, a + (nlo - lo[dim]) * st[dim], lo[:dim] + (nlo - begin,) + lo[dim + 1:],
                             sz[:dim] + (nhi - nlo,) + sz[dim + 1:], st)
    lo, hi = p.lo[:, dim], p.lo[:, dim] + p.sz[:, dim]
    nlo, nhi = np.maximum(lo, begin), np.minimum(hi, end)
    keep = nhi > nlo
    if not keep.all():
        p, lo, nlo, nhi = p.take(keep), lo[keep], nlo[keep], nhi[keep]
    q = _copy(p)
    q.addr += (nlo - lo) * q.st[:, dim]
    q.lo[:, dim] = nlo - begin
    q.sz[:, dim] = nhi - nlo
    return _freeze(q)


def permute(p: Pieces, perm) -> Pieces:
    perm = list(perm)
    if p.row is not None:
        v, a, lo, sz, st = p.row
        return Pieces.single(v, a, tuple(lo[i] for i in perm), tuple(sz[i] for i in perm), tuple(st[i] for i in perm))
    return Pieces(p.var, p.addr, p.lo[:, perm], p.sz[:, perm], p.st[:, perm])


def insert_unit_dims(p: Pieces, positions) -> Pieces:
    """Insert size-1 dims so that they end up at ``positions`` (sorted, in the new rank)."""
    if p.row is not None:
        v, a, lo, sz, st = p.row
        lo, sz, st = list(lo), list(sz), list(st)
        for pos in sorted(positions):
            lo.insert(pos, 0)
            sz.insert(pos, 1)
            st.insert(pos, 0)
        return Pieces.single(v, a, tuple(lo), tuple(sz), tuple(st))
    lo, sz, st = p.lo, p.sz, p.st
    for pos in sorted(positions):
        z = np.zeros((len(p), 1), _I64)
        lo = np.concatenate([lo[:, :pos], z, lo[:, pos:]], axis=1)
        sz = np.concatenate([sz[:, :pos], z + 1, sz[:, pos:]], axis=1)
        st = np.concatenate([st[:, :pos], z, st[:, pos:]], axis=1)
    return Pieces(p.var, p.addr, lo, sz, st)


def remove_dims(p: Pieces, dims) -> Pieces:
    """Drop size-1 dims (the caller has checked the tensor's size there is 1)."""
    drop = set(dims)
    keep = [i for i in range(p.rank) if i not in drop]
    if p.row is not None:
        v, a, lo, sz, st = p.row
        return Pieces.single(v, a, tuple(lo[i] for i in keep), tuple(sz[i] for i in keep), tuple(st[i] for i in keep))
    return Pieces(p.var, p.addr, p.lo[:, keep], p.sz[:, keep], p.st[:, keep])


def broadcast_unit(p: Pieces, dim: int, n: int) -> Pieces:
    """A size-1 dim repeated ``n`` times (stride 0: aliases, no copy)."""
    if n == 0:
        return Pieces.empty(p.rank)
    if p.row is not None:
        v, a, lo, sz, st = p.row
        return Pieces.single(v, a, lo, sz[:dim] + (n,) + sz[dim + 1:], st[:dim] + (0,) + st[dim + 1:])
    q = _copy(p)
    q.sz[:, dim] = n
    q.st[:, dim] = 0
    return _freeze(q)


def tile_dim(p: Pieces, dim: int, n: int, size: int) -> Pieces:
    """``numpy.tile`` along ``dim`` (of size ``size``) ``n`` times: the pieces repeated."""
    parts = []
    for j in range(n):
        q = _copy(p)
        q.lo[:, dim] += j * size
        parts.append(_freeze(q))
    return concat_pieces(parts, p.rank)


def shift_dim(p: Pieces, dim: int, offset: int) -> Pieces:
    q = _copy(p)
    q.lo[:, dim] += offset
    return _freeze(q)


def subsample(p: Pieces, dim: int, stride: int) -> Pieces:
    """Every ``stride``-th element along ``dim`` (``t.subSample(stride, dim)``)."""
    if p.row is not None:
        v, a, lo, sz, st = p.row
        j0 = -(-lo[dim] // stride) * stride
        cnt = max(0, -(-(lo[dim] + sz[dim] - j0) // stride))
        if cnt == 0:
            return Pieces.empty(len(lo))
        return Pieces.single(v, a + (j0 - lo[dim]) * st[dim], lo[:dim] + (j0 // stride,) + lo[dim + 1:],
                             sz[:dim] + (cnt,) + sz[dim + 1:], st[:dim] + (st[dim] * stride,) + st[dim + 1:])
    lo, s = p.lo[:, dim], p.sz[:, dim]
    j0 = -(-lo // stride) * stride
    cnt = np.maximum(0, -(-(lo + s - j0) // stride))
    keep = cnt > 0
    if not keep.all():
        p, lo, j0, cnt = p.take(keep), lo[keep], j0[keep], cnt[keep]
    q = _copy(p)
    q.addr += (j0 - lo) * q.st[:, dim]
    q.lo[:, dim] = j0 // stride
    q.sz[:, dim] = cnt
    q.st[:, dim] *= stride
    return _freeze(q)


def reverse(p: Pieces, dim: int, size: int) -> Pieces:
    if p.row is not None:
        v, a, lo, sz, st = p.row
        return Pieces.single(v, a + (sz[dim] - 1) * st[dim], lo[:dim] + (size - lo[dim] - sz[dim],) + lo[dim + 1:],
                             sz, st[:dim] + (-st[dim],) + st[dim + 1:])
    q = _copy(p)
    q.addr += (q.sz[:, dim] - 1) * q.st[:, dim]
    q.lo[:, dim] = size - (p.lo[:, dim] + p.sz[:, dim])
    q.st[:, dim] = -q.st[:, dim]
    return _freeze(q)


def split_singletons(p: Pieces, count_dims: np.ndarray) -> tuple[Pieces, np.ndarray]:
    """Split every piece into pieces of size 1 along the dims flagged in ``count_dims``
    (``[k, d]`` bool: per piece, which dims to enumerate). Returns the new pieces (piece by piece,
    row-major over the enumerated dims) and, for each, the index of the piece it came from."""
    eff = np.where(count_dims, p.sz, 1)
    counts = np.prod(eff, axis=1, dtype=_I64) if p.rank else np.ones(len(p), _I64)
    if np.all(counts == 1):
        return p, np.arange(len(p))
    rep, local = group_ranks(counts)
    q = _copy(p.take(rep))
    e = eff[rep]
    for d in range(p.rank - 1, -1, -1):
        dig = local % e[:, d]
        local //= e[:, d]
        m = count_dims[rep, d]
        q.addr += np.where(m, dig * q.st[:, d], 0)
        q.lo[:, d] += np.where(m, dig, 0)
        q.sz[:, d] = np.where(m, 1, q.sz[:, d])
    return _freeze(q), rep


def upsample(p: Pieces, dim: int, scale: int) -> Pieces:
    """Each element along ``dim`` repeated ``scale`` times (``numpy.repeat``)."""
    mask = np.zeros(p.lo.shape, bool)
    mask[:, dim] = True
    q = _copy(split_singletons(p, mask)[0])
    q.lo[:, dim] *= scale
    q.sz[:, dim] = scale
    q.st[:, dim] = 0
    return _freeze(q)


# ----------------------------------------------------------------------------------------------
# mixed-radix range decomposition
# ----------------------------------------------------------------------------------------------
def range_boxes(u: np.ndarray, v: np.ndarray, radices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cover each flat range ``[u[i], v[i])`` of a row-major box of ``radices`` by sub-boxes.

    Returns ``(owner, lo, sz)``: for each sub-box, the index ``i`` of its range and its corner and
    sizes (``[n, q]``). A range gives at most ``2 q - 1`` boxes (partial rows at each end at each
    level, one block of whole rows in the middle), in flat order.
    """
    R = np.asarray([int(r) for r in radices], _I64)
    q = R.size
    u = np.asarray(u, _I64)
    v = np.asarray(v, _I64)
    if q == 0:
        keep = np.flatnonzero(v > u)
        return keep, np.zeros((keep.size, 0), _I64), np.zeros((keep.size, 0), _I64)
    W = np.ones(q, _I64)
    for i in range(q - 2, -1, -1):
        W[i] = W[i + 1] * R[i + 1]
    owners, xs, ys, levels = [], [], [], []
    a = u.copy()
    idx = np.arange(u.size)

    def emit(mask, x, y, level):
        if mask.any():
            owners.append(idx[mask])
            xs.append(x[mask])
            ys.append(y[mask])
            levels.append(np.full(int(mask.sum()), level, _I64))

    active = v > a
    for lev in range(q - 1, 0, -1):
        r = -(-a // W[lev - 1]) * W[lev - 1]
        fits = active & (r <= v)
        emit(fits & (r > a), a, r, lev)
        a = np.where(fits, r, a)
        active = fits
    r = (v // W[0]) * W[0]
    m = r > a
    emit(m, a, r, 0)
    a = np.where(m, r, a)
    for lev in range(1, q):
        r = (v // W[lev]) * W[lev]
        m = r > a
        emit(m, a, r, lev)
        a = np.where(m, r, a)
    if not owners:
        z = np.zeros((0, q), _I64)
        return np.zeros(0, _I64), z, z
    owner = np.concatenate(owners)
    x, y, lev = np.concatenate(xs), np.concatenate(ys), np.concatenate(levels)
    order = np.lexsort((x, owner))
    owner, x, y, lev = owner[order], x[order], y[order], lev[order]
    dims = np.arange(q)[None, :]
    digits = (x[:, None] // W[None, :]) % R[None, :]
    lo = np.where(dims <= lev[:, None], digits, 0)
    sz = np.where(dims < lev[:, None], 1, np.where(dims == lev[:, None], ((y - x) // W[lev])[:, None], R[None, :]))
    return owner, lo, sz


# ----------------------------------------------------------------------------------------------
# reshape
# ----------------------------------------------------------------------------------------------
def _dense(sz, st) -> bool:
    """Whether ``st`` are the row-major strides of ``sz`` (size-1 dims ignored)."""
    expect = 1
    for s_, t_ in zip(reversed(sz), reversed(st)):
        if s_ == 1:
            continue
        if t_ != expect:
            return False
        expect *= s_
    return True


def _groups(a: list[int], b: list[int]) -> list[tuple[int, int, int, int]]:
    """Dim groups ``(i0, i1, j0, j1)`` (half-open) of two shapes without unit dims whose products
    match."""
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        i0, j0 = i, j
        pa, pb = a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa *= a[i]
                i += 1
            else:
                pb *= b[j]
                j += 1
        out.append((i0, i, j0, j))
    return out


def reshape(p: Pieces, old: list[int], new: list[int]) -> Pieces:
    """The pieces of a reshape from ``old`` to ``new`` (same element count, row-major).

    Within each group of dims whose products match, a piece keeps its affine form when its
    inner merged dims are whole and laid out contiguously; otherwise it is split along the
    outer dims of the group until they are. The merged range is then cut into boxes of the new
    dims (:func:`range_boxes`).
    """
    if 0 in old or 0 in new or len(p) == 0:
        return Pieces.empty(len(new))
    if p.row is not None:
        v, a, lo, sz, st = p.row
        if not any(lo) and list(sz) == list(old) and _dense(sz, st):
            return Pieces.single(v, a, (0,) * len(new), tuple(new), row_major_strides(new))
    keep_old = [i for i, s in enumerate(old) if s != 1]
    q = Pieces(p.var, p.addr, p.lo[:, keep_old], p.sz[:, keep_old], p.st[:, keep_old])
    a = [old[i] for i in keep_old]
    b = [s for s in new if s != 1]
    cur = q
    col = 0                              # first column of the current group in `cur`
    for i0, i1, j0, j1 in _groups(a, b):
        n_old = i1 - i0
        A = np.asarray(a[i0:i1], _I64)
        B = [int(x) for x in b[j0:j1]]
        lo, sz, st = cur.lo[:, col:col + n_old], cur.sz[:, col:col + n_old], cur.st[:, col:col + n_old]
        if n_old == 1 and len(B) == 1:
            col += 1
            continue
        # k: first dim of the contiguous inner suffix of each piece
        k = np.full(len(cur), n_old - 1, _I64)
        ok = np.ones(len(cur), bool)
        for d in range(n_old - 2, -1, -1):
            full = (lo[:, d + 1] == 0) & (sz[:, d + 1] == A[d + 1])
            chain = st[:, d] == st[:, d + 1] * A[d + 1]
            ok = ok & full & chain
            k = np.where(ok, d, k)
        enum = np.zeros(cur.lo.shape, bool)
        enum[:, col:col + n_old] = np.arange(n_old)[None, :] < k[:, None]
        if enum.any():
            cur, rep = split_singletons(cur, enum)
            k = k[rep]
            lo, sz, st = cur.lo[:, col:col + n_old], cur.sz[:, col:col + n_old], cur.st[:, col:col + n_old]
        Wold = np.ones(n_old, _I64)
        for d in range(n_old - 2, -1, -1):
            Wold[d] = Wold[d + 1] * A[d + 1]
        m_lo = (lo * Wold[None, :]).sum(axis=1)
        m_sz = sz[np.arange(len(cur)), k] * Wold[k]
        m_st = st[:, n_old - 1]
        owner, blo, bsz = range_boxes(m_lo, m_lo + m_sz, B)
        Wnew = np.ones(len(B), _I64)
        for d in range(len(B) - 2, -1, -1):
            Wnew[d] = Wnew[d + 1] * B[d + 1]
        flat_start = (blo * Wnew[None, :]).sum(axis=1)
        base = cur.take(owner)
        addr = base.addr + (flat_start - m_lo[owner]) * m_st[owner]
        bst = m_st[owner][:, None] * Wnew[None, :]
        nlo = np.concatenate([base.lo[:, :col], blo, base.lo[:, col + n_old:]], axis=1)
        nsz = np.concatenate([base.sz[:, :col], bsz, base.sz[:, col + n_old:]], axis=1)
        nst = np.concatenate([base.st[:, :col], bst, base.st[:, col + n_old:]], axis=1)
        cur = Pieces(base.var, addr, nlo, nsz, nst)
        col += len(B)
    unit = [i for i, s in enumerate(new) if s == 1]
    return insert_unit_dims(cur, unit) if unit else cur



# ----------------------------------------------------------------------------------------------
# address sets of pieces
# ----------------------------------------------------------------------------------------------
def sorted_lattices(addr: np.ndarray, sz: np.ndarray, st: np.ndarray):
    """Affine boxes as lattices with their dims sorted by stride: ``(base, T, n, dim, flip)``
    ``[k, d]``, ``T`` ascending and positive, unused dims (unit or stride 0) last with ``T = 0,
    n = 1``; ``dim`` / ``flip`` give each lattice dim's box dim and whether its stride was
    negative (``-1`` / False for unused)."""
    addr = np.asarray(addr, _I64)
    k, d = sz.shape
    st = np.broadcast_to(st, sz.shape)      # strides may come broadcast (one row, or one column)
    neg = st < 0
    base = addr + np.where(neg, (sz - 1) * st, 0).sum(axis=1)
    A = np.abs(st)
    used = (A > 0) & (sz > 1)
    key = np.where(used, A, np.iinfo(_I64).max)
    if k > 1 and (key == key[:1]).all():       # one stride pattern (most views): sort it once
        order = np.argsort(key[0], kind="stable")
        T = np.where(used, A, 0)[:, order]
        n = np.where(used, sz, 1)[:, order]
        dim = np.broadcast_to(np.where(used[0, order], order, -1), (k, d)).copy()
        flip = neg[:, order] & (dim >= 0)
        return base, T, n, dim, flip
    order = np.argsort(key, axis=1, kind="stable")
    rows = np.arange(k)[:, None]
    T = np.where(used, A, 0)[rows, order]
    n = np.where(used, sz, 1)[rows, order]
    dim = np.where(used[rows, order], order, -1)
    flip = neg[rows, order] & (dim >= 0)
    return base, T, n, dim, flip


def canonical(addr: np.ndarray, sz: np.ndarray, st: np.ndarray):
    """The address *set* of affine boxes as lattices: ``(base, T, n)`` with ``T`` ascending and
    positive (``[k, d]``; unused dims have ``T = 0, n = 1`` at the end) and dense neighbours
    merged (``T[j+1] == T[j] * n[j]``), so that ``T[:, 0] == 1`` marks a contiguous inner run of
    ``n[:, 0]`` addresses. Broadcast (stride-0) and unit dims are dropped."""
    base, T, n, _, _ = sorted_lattices(addr, sz, st)
    d = sz.shape[1]
    # merge dense neighbours from the inside out
    for j in range(d - 1):
        m = (T[:, j] > 0) & (T[:, j + 1] == T[:, j] * n[:, j])
        while m.any():
            n[m, j] *= n[m, j + 1]
            T[m, j + 1:d - 1] = T[m, j + 2:]
            n[m, j + 1:d - 1] = n[m, j + 2:]
            T[m, d - 1] = 0
            n[m, d - 1] = 1
            m = m & (T[:, j + 1] > 0) & (T[:, j + 1] == T[:, j] * n[:, j])
    return base, T, n


def address_runs(addr: np.ndarray, sz: np.ndarray, st: np.ndarray):
    """Runs of consecutive addresses making up each box's address set.

    Returns ``(owner, start, length)``: for every run, the index of its box, its first address and
    its length. A box whose inner dim is contiguous gives one run per row of its other dims; a box
    with no contiguous dim gives one run per element (Poplar's regions split the same way).
    Memoised (:mod:`structure_cache`) for many boxes: the runs move with ``addr``."""
    addr = np.asarray(addr, _I64)
    if addr.size < 64 or not SC.enabled():
        return _address_runs(addr, sz, st)
    shift = int(addr[0])
    key = b"".join([b"address_runs", np.int64(sz.shape[1]).tobytes()]
                   + SC.array_bytes(addr - shift, sz, np.broadcast_to(st, sz.shape)))
    hit = SC.MEMO.get(key)
    if hit is None:
        owner, start, length = _address_runs(addr, sz, st)
        hit = (owner, start - shift, length)
        SC.MEMO.put(key, hit)
    return hit[0].copy(), hit[1] + shift, hit[2].copy()


def _address_runs(addr: np.ndarray, sz: np.ndarray, st: np.ndarray):
    base, T, n = canonical(addr, sz, st)
    k, d = n.shape
    if k == 0:
        z = np.zeros(0, _I64)
        return z, z, z
    if d == 0:
        return np.arange(k), base, np.ones(k, _I64)
    contig = T[:, 0] == 1
    L = np.where(contig, n[:, 0], 1)
    outer_n = np.where(contig[:, None] & (np.arange(d)[None, :] == 0), 1, n)
    outer_T = np.where(contig[:, None] & (np.arange(d)[None, :] == 0), 0, T)
    cnt = np.prod(outer_n, axis=1, dtype=_I64)
    owner, local = group_ranks(cnt)
    start = base[owner].copy()
    on, oT = outer_n[owner], outer_T[owner]
    for j in range(d):
        dig = local % on[:, j]
        local //= on[:, j]
        start += dig * oT[:, j]
    return owner, start, L[owner]


def piece_runs(p: Pieces):
    """:func:`address_runs` of the pieces ``p``, returning ``(var, start, length)``."""
    if p.row is not None:
        v, a, lo, sz, st = p.row
        dims = sorted((abs(t), n) for n, t in zip(sz, st) if n > 1 and t != 0)
        base = a + sum((n - 1) * t for n, t in zip(sz, st) if t < 0)
        length, expect = 1, 1
        for t, n in dims:
            if t != expect:
                break
            length *= n
            expect *= n
        else:
            return np.array([v], _I64), np.array([base], _I64), np.array([length], _I64)
    owner, start, length = address_runs(p.addr, p.sz, p.st)
    return p.var[owner], start, length


def _crowded(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Which of the address spans ``[lo, hi]`` (inclusive, ``[k]``) overlap another's (bool ``[k]``):
    in order of ``lo``, a span meets an earlier one iff it starts within their reach, and a later
    one iff the next span starts within it."""
    k = lo.size
    order = np.argsort(lo, kind="stable")
    l, h = lo[order], hi[order]
    hit = np.zeros(k, bool)
    if k > 1:
        hit[1:] = l[1:] <= np.maximum.accumulate(h)[:-1]
        hit[:-1] |= l[1:] <= h[:-1]
    out = np.zeros(k, bool)
    out[order] = hit
    return out


def _may_fold(p: Pieces) -> np.ndarray:
    """Pieces that may map two indices to one address (bool ``[k]``): with dims sorted by stride,
    a piece is one-to-one when every stride exceeds the extent of the dims inside it."""
    _, T, n = canonical(p.addr, p.sz, p.st)
    if T.shape[1] < 2:
        return np.zeros(len(p), bool)
    ext = 1 + np.cumsum(T * (n - 1), axis=1)[:, :-1]
    return ((T[:, 1:] > 0) & (T[:, 1:] < ext)).any(axis=1)


def _merged_runs(start: np.ndarray, length: np.ndarray):
    """Sorted runs, and whether any two of them share an address."""
    order = np.argsort(start, kind="stable")
    s, e = start[order], start[order] + length[order]
    clash = bool(s.size > 1 and (s[1:] < np.maximum.accumulate(e)[:-1]).any())
    return s, e, clash


def pieces_alias(p: Pieces) -> bool:
    """Whether two elements of the view ``p`` have the same address (a broadcast, or overlapping
    pieces). Works on runs of consecutive addresses of the pieces whose spans overlap, never on
    the addresses of a whole tensor; exact."""
    if len(p) == 0:
        return False
    if np.any((p.st == 0) & (p.sz > 1)):
        return True
    dense = _dense_pieces_alias(p)
    if dense is not None:
        return dense
    lo, hi = p.address_bounds()
    sel = _crowded(lo, hi) | _may_fold(p)
    if not sel.any():
        return False
    _, start, length = piece_runs(p.take(np.flatnonzero(sel)))
    return _merged_runs(start, length)[2]


def _dense_pieces_alias(p: Pieces) -> bool | None:
    """:func:`pieces_alias` of several pieces that are each row-major dense (strides of their
    sizes, size-1 dims ignored: piece ``i`` covers exactly the addresses ``[addr, addr + n)``):
    then two elements share an address exactly when two of those intervals of one variable
    overlap, found by one sort. None when a piece is not dense (or there is one piece), for the
    general path. Used on the blocked outputs a layer hands to the next call of its subgraph."""
    if len(p) < 2:
        return None
    sz, st = p.sz, p.st
    expect = np.ones_like(sz)
    for j in range(sz.shape[1] - 2, -1, -1):
        expect[:, j] = expect[:, j + 1] * sz[:, j + 1]
    if not ((st == expect) | (sz == 1)).all():
        return None
    n = np.prod(sz, axis=1, dtype=_I64)
    keep = n > 0
    var, addr, n = p.var[keep], p.addr[keep], n[keep]
    order = np.lexsort((addr, var))
    var, addr, end = var[order], addr[order], (addr + n)[order]
    return bool(((var[1:] == var[:-1]) & (addr[1:] < end[:-1])).any())


def same_pieces(a: Pieces, b: Pieces) -> bool:
    """Whether ``a`` and ``b`` are the same pieces (variables, corner addresses, boxes, strides):
    then they lay the same elements in the same order. Structural, so it costs the number of
    pieces; two decompositions of one view (a concat of the two halves of a variable, and the
    variable) answer False."""
    if a.row is not None or b.row is not None:
        return a.row == b.row
    return all(np.array_equal(x, y) for x, y in ((a.var, b.var), (a.addr, b.addr), (a.lo, b.lo), (a.sz, b.sz),
                                                 (a.st, b.st)))


def pieces_intersect(a: Pieces, b: Pieces) -> bool:
    """Whether the views ``a`` and ``b`` share an address; on runs of the pieces whose spans meet
    the other view's, exact."""
    if len(a) == 0 or len(b) == 0:
        return False
    alo, ahi = a.address_bounds()
    blo, bhi = b.address_bounds()
    # pieces of each that meet a span of the other (sorted sweep, no k_a x k_b matrix)
    def meeting(lo, hi, olo, ohi):
        order = np.argsort(olo, kind="stable")
        ol, reach = olo[order], np.maximum.accumulate(ohi[order])
        j = np.searchsorted(ol, hi, side="right")      # other spans starting at or before hi
        return (j > 0) & (reach[np.maximum(j - 1, 0)] >= lo)
    ma, mb = meeting(alo, ahi, blo, bhi), meeting(blo, bhi, alo, ahi)
    if not ma.any() or not mb.any():
        return False
    _, sa, la = piece_runs(a.take(np.flatnonzero(ma)))
    _, sb, lb = piece_runs(b.take(np.flatnonzero(mb)))
    s, e, _ = _merged_runs(sa, la)
    e = np.maximum.accumulate(e)
    j = np.searchsorted(s, sb + lb, side="left")       # runs of a starting before b's run ends
    return bool(((j > 0) & (e[np.maximum(j - 1, 0)] > sb)).any())


def box_flat_runs(lo: np.ndarray, sz: np.ndarray, shape):
    """Runs of consecutive flat (row-major) indices of boxes of a tensor of ``shape``.

    Returns ``(owner, start, length)``. A box whose trailing dims are whole is one run per row of
    its leading dims."""
    shape = [int(s) for s in shape]
    k, d = sz.shape
    if k == 0:
        z = np.zeros(0, _I64)
        return z, z, z
    if d == 0:
        return np.arange(k), np.zeros(k, _I64), np.ones(k, _I64)
    S = np.asarray(shape, _I64)
    W = np.ones(d, _I64)
    for i in range(d - 2, -1, -1):
        W[i] = W[i + 1] * S[i + 1]
    # kk: the first dim of the box's run (dims after it are whole)
    kk = np.full(k, d - 1, _I64)
    whole = np.ones(k, bool)
    for j in range(d - 1, 0, -1):
        whole &= (lo[:, j] == 0) & (sz[:, j] == S[j])
        kk = np.where(whole, j - 1, kk)
    length = sz[np.arange(k), kk] * W[kk]
    rows_mask = np.arange(d)[None, :] < kk[:, None]
    cnt = np.prod(np.where(rows_mask, sz, 1), axis=1, dtype=_I64)
    owner, local = group_ranks(cnt)
    start = (np.asarray(lo, _I64) @ W)[owner]
    for j in range(d - 1, -1, -1):
        # a row dim of some box with more than one row (else every run's digit is 0)
        r = np.where(rows_mask[:, j], sz[:, j], 1)
        if (r == 1).all():
            continue
        r = r[owner]
        start += (local % r) * W[j]
        local //= r
    return owner, start, length[owner]


def _register_records():
    from openipu.poplar.graph_codec import data_class
    def no_index(p):
        p.index = None          # the exchange's search index, built again on demand
    data_class(Pieces, fields=("_var", "_addr", "_lo", "_sz", "_st", "row", "_d"), after_decode=no_index)


_register_records()
