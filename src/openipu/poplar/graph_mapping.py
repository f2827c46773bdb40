"""Tile mapping of a Poplar graph's tensors (``Graph.setTileMapping``, ``getTileMapping`` and the
run-length, box and element forms the compile uses), as :class:`TileMapping`, a base class of
:class:`openipu.poplar.graph.Graph` (it works on the graph's state: its address spaces and
tiles), and the view helpers it needs (memory order of a view, box tile runs)."""

from __future__ import annotations


import numpy as np
import torch

from openipu.poplar import errors
from openipu.poplar import regions as R
from openipu.poplar import tilemap
from openipu.poplar.deferred import DeferredValue
from openipu.poplar.tensor import Interval, Tensor
from openipu.poplar.types import as_type
from openipu.poplar import sets as _sets
from openipu.poplar.address_space import fresh_storage
from openipu.poplar.graph_objects import VertexRef


class TileMapping:
    """The tile-mapping methods of ``poplar::Graph`` (a base class of
    :class:`openipu.poplar.graph.Graph`, sharing its state)."""

    # -- tile mapping ---------------------------------------------------------------------
    def setTileMapping(self, target, mapping) -> None:  # noqa: N802
        """Map a tensor to one tile, or by a per-tile list of intervals of its flattened elements
        (``poplar::Graph::TileToTensorMapping``); or map a vertex to a tile. A per-element numpy
        array of tiles is accepted too (openipu extension). Raises ``invalid_tile_mapping`` for a
        tile out of range or an interval outside the tensor."""
        if isinstance(target, VertexRef):
            self._state.v_tile[target.id] = self._global_tile(mapping)
            return
        t: Tensor = target
        n = t.numElements()
        if isinstance(mapping, (int, np.integer)):
            self._assign_set(t, self._global_tile(mapping))
            return
        if isinstance(mapping, np.ndarray) and mapping.ndim == 1 and mapping.size == n:
            self._assign_elements(t, self._global_tiles(mapping))   # per-element tiles (openipu extension)
            return
        b, e, tl = [], [], []
        for tile, intervals in enumerate(mapping):
            for iv in intervals:
                lo, hi = (iv.begin(), iv.end()) if isinstance(iv, Interval) else iv
                if not 0 <= lo <= hi <= n:
                    raise errors.invalid_tile_mapping(f"Interval [{lo}, {hi}) is outside a tensor of {n} elements")
                b.append(lo)
                e.append(hi)
                tl.append(tile)
        if not b:
            return
        self.set_tile_runs(t, np.array(b, np.int64), np.array(e, np.int64), self._global_tiles(np.array(tl, np.int64)))

    def set_tile_runs(self, t: Tensor, begins: np.ndarray, ends: np.ndarray, tiles: np.ndarray) -> None:
        """Map the flattened elements ``[begins[i], ends[i])`` of ``t`` to *global* tile ``tiles[i]``
        (int arrays; no checks). openipu extension: PopLibs' vectorised ``setTileMapping``."""
        flat = _flat_view(t)
        if flat is not None:
            space = self._state.space(t._type)
            var, off = flat
            space.map_intervals(var, begins + off, ends + off, tiles)
            return
        # any view: flat ranges -> boxes -> pieces -> address runs of each variable
        begins = np.asarray(begins, np.int64).reshape(-1)
        ends = np.asarray(ends, np.int64).reshape(-1)
        tiles = np.broadcast_to(np.asarray(tiles, np.int64), begins.shape)
        owner, lo, sz = R.range_boxes(begins, ends, t.shape())
        if owner.size == 0:
            return
        from openipu.poplar.exchange import Boxes
        self.set_tile_boxes(t, Boxes(lo, sz, tiles[owner]))

    def set_tile_boxes(self, t: Tensor, boxes) -> None:
        """Map the boxes (``exchange.Boxes`` of ``t``'s index space, disjoint) to their *global*
        tiles: each box is laid over ``t``'s pieces and mapped as the runs of consecutive
        addresses it covers. Host work follows boxes and runs. openipu extension."""
        if len(boxes) == 0:
            return
        from openipu.poplar.exchange import lattices
        bi, var_ids, base, T, n, _ = lattices(t, boxes)
        o2, start, length = R.address_runs(base, n, T)
        self._assign_address_runs(t, var_ids[o2], start, length, np.asarray(boxes.tile, np.int64)[bi][o2])

    def _assign_set(self, t: Tensor, tile: int) -> None:
        """Every element of ``t`` to one global tile (set semantics: one run per address run)."""
        p = t.pieces
        if len(p) == 0:
            return
        row = p.row
        if row is not None and R._dense(row[3], row[4]):        # consecutive addresses: one interval
            var = self._state.variables[row[0]]
            b = row[1] - var.start
            n = 1
            for s_ in row[3]:
                n *= s_
            var.map_intervals(b, b + n, int(tile))
            self._state.space(t._type).version += 1
            return
        var_ids, start, length = R.piece_runs(p)
        self._assign_address_runs(t, var_ids, start, length, tile)

    def _assign_address_runs(self, t: Tensor, var_ids, start, length, tiles) -> None:
        space = self._state.space(t._type)
        tiles = np.broadcast_to(np.asarray(tiles), np.shape(start))
        variables = self._state.variables
        if var_ids.size == 1:
            var = variables[int(var_ids[0])]
            space.map_intervals(var, start - var.start, start - var.start + length, tiles)
            return
        for v in _sets.unique(var_ids).tolist():
            m = var_ids == v
            var = variables[v]
            s0 = start[m] - var.start
            space.map_intervals(var, s0, s0 + length[m], tiles[m])

    def _assign_elements(self, t: Tensor, tiles: np.ndarray) -> None:
        """Per flattened element of ``t``, a global tile (-1: leave as it is)."""
        n = t.numElements()
        if n == 0:
            return
        tiles = np.broadcast_to(np.asarray(tiles), (n,))
        flat = _flat_view(t)
        if flat is not None:
            var, off = flat
            b, tl = tilemap.from_per_element(tiles)
            e = np.append(b[1:], n)
            keep = tl >= 0
            space = self._state.space(t._type)
            space.map_intervals(var, b[keep] + off, e[keep] + off, tl[keep])
            return
        addr = t.flat_addresses()
        keep = tiles >= 0
        addr, tiles = addr[keep], tiles[keep]
        order = np.argsort(addr, kind="stable")
        addr, tiles = addr[order], tiles[order]
        space = self._state.space(t._type)
        vi = space.variable_index(addr)
        if addr.size == 0:
            return
        brk = np.flatnonzero((np.diff(addr) > 1) | (np.diff(tiles) != 0) | (np.diff(vi) != 0)) + 1
        starts = np.concatenate(([0], brk))
        lens = np.diff(np.append(starts, addr.size))
        var_ids = np.array([v.id for v in space.vars], np.int64)[vi[starts]]
        # repeated addresses (aliases) collapse: a run's length counts distinct addresses
        dist = np.add.reduceat(np.r_[1, np.diff(addr) != 0].astype(np.int64), starts)
        self._assign_address_runs(t, var_ids, addr[starts], np.minimum(lens, dist), tiles[starts])

    def getTileMapping(self, t: Tensor, is_complete: list | None = None) -> list[list[Interval]]:  # noqa: N802
        """Per tile of this graph, the intervals of ``t``'s flattened elements mapped there.

        Raises :class:`invalid_tile_mapping` if some element is unmapped (unless ``is_complete`` is
        given, a list whose first item is set to the answer).
        """
        starts, ends, tiles = self.tile_runs_of(t)
        tiles = self._local_tiles(tiles.astype(np.int64)) if tiles.size else tiles.astype(np.int64)
        unmapped = int((ends - starts)[tiles < 0].sum())
        if is_complete is not None:
            is_complete[:1] = [unmapped == 0]
        elif unmapped:
            raise errors.invalid_tile_mapping(
                f"Tensor {t.shortString()} is not completely mapped to tiles ({unmapped} elements unmapped)")
        out: list[list[Interval]] = [[] for _ in range(self._tiles.size)]
        for s, e, tl in zip(starts.tolist(), ends.tolist(), tiles.tolist()):
            if tl >= 0:
                out[tl].append(Interval(s, e))
        return out

    def getVariableTileMapping(self, t: Tensor):  # noqa: N802
        return self.getTileMapping(t)

    def add_blocks(self, type_, shape, lo: np.ndarray, sz: np.ndarray, name: str, values=None) -> Tensor:
        """A new tensor of ``shape`` made of the boxes ``lo``, ``sz`` ``[k, rank]`` (a partition of
        its index space), stored one after the other, each row-major inside
        (:func:`regions.stacked_pieces`). ``values``: a constant's values in that memory order
        (flat), else a variable; a flat array already of the type's storage dtype (float16 /
        float32) becomes the constant's storage without a copy (the caller hands it over), and
        a :class:`~openipu.poplar.deferred.DeferredValue` of ``numel`` elements is made when first
        read. Unmapped. openipu extension for PopLibs' blocked layouts."""
        numel = int(np.prod(sz, axis=1, dtype=np.int64).sum())
        t = as_type(type_)
        if values is None:
            flat = self._new_variable(type_, [numel], name)
        elif isinstance(values, DeferredValue):
            if values.numel != numel:
                raise errors.graph_object_creation_error(
                    f"Constant '{name}' of {numel} elements given a deferred value of {values.numel}")
            flat = self._new_variable(type_, [numel], name, constant=True,
                                      init=DeferredValue(lambda: fresh_storage(t, values.resolve()), numel))
        elif (isinstance(values, np.ndarray) and values.ndim == 1 and values.size == numel
              and values.flags.c_contiguous and t.is_float and t.torch_dtype in (torch.float16, torch.float32)
              and values.dtype == t.numpy_dtype):
            flat = self._new_variable(type_, [numel], name, constant=True, init=torch.from_numpy(values))
        else:
            flat = self.addConstant(type_, [numel], values, name)
        var, start = flat.pieces.row[0], flat.pieces.row[1]
        return Tensor(self._state, flat._type, pieces=R.stacked_pieces(var, start, lo, sz),
                      shape=tuple(int(x) for x in shape))

    def _clone_pieces(self, type_, src: Tensor, name: str) -> Tensor:
        """A clone of a view of several pieces: the same pieces (each row-major, stored one after
        the other in the order of the source's addresses), mapped like ``src`` box by box."""
        from openipu.poplar.exchange import tile_boxes
        p = src.pieces
        order = np.lexsort((p.addr, p.var))
        out = self.add_blocks(type_, src.shape(), p.lo[order], p.sz[order], name)
        if self._clone_piece_rows(src, out, order):
            return out
        boxes = tile_boxes(src)
        keep = boxes.tile >= 0
        self.set_tile_boxes(out, type(boxes)(boxes.lo[keep], boxes.sz[keep], boxes.tile[keep]))
        return out

    def _clone_piece_rows(self, src: Tensor, out: Tensor, order: np.ndarray) -> bool:
        """:meth:`_clone_pieces`' mapping in closed form, row by row: each piece of ``src`` is cut
        into rows, the dims inside which its strides are row-major (size-1 dims ignored) making
        one row of consecutive addresses (a dense piece is one row; a slice of a block is one row
        per outer index). Piece ``order[i]`` of ``src`` lists its elements in the order piece ``i``
        of ``out`` stores them, so ``out``'s runs are the source variable's runs over the rows'
        intervals, moved to their places in ``out``. Returns False (nothing mapped) when the
        pieces are not of one variable or make more than :data:`CLONE_ROWS_MAX` rows; the caller
        then maps ``out`` box by box."""
        p = src.pieces
        var_id = p.var[0]
        if not (p.var == var_id).all():
            return False
        sz, st = p.sz[order], p.st[order]
        k, d = sz.shape
        inner = np.ones(k, np.int64)             # elements of the dims inside dim j
        suffix = np.ones(k, bool)                # dims j.. are row-major so far
        outer = sz.copy()                        # sizes of the dims outside each piece's rows
        for j in range(d - 1, -1, -1):
            suffix &= (sz[:, j] == 1) | (st[:, j] == inner)
            outer[suffix, j] = 1
            inner = inner * sz[:, j]
        n = inner                                 # elements per piece
        rows = np.prod(outer, axis=1, dtype=np.int64)
        rows[n == 0] = 0
        total = int(rows.sum())
        if total > CLONE_ROWS_MAX:
            return False
        length = n // np.maximum(rows, 1)          # elements per row
        var = self._state.variables[int(var_id)]
        out_var = self._state.variables[int(out.pieces.var[0])]
        piece = np.repeat(np.arange(k), rows)
        r = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(rows) - rows, rows)
        a = p.addr[order][piece] - var.start      # each row's first address in its variable
        q = r.copy()
        for j in range(d - 1, -1, -1):            # the row's outer index, innermost dim first
            size = outer[piece, j]
            a += (q % size) * st[piece, j]
            q //= size
        L = length[piece]
        off = (out.pieces.addr - out_var.start)[piece] + r * L
        e = a + L
        s, ids = var.tile_starts, var.tile_ids
        i0 = np.searchsorted(s, a, side="right") - 1
        i1 = np.searchsorted(s, e, side="left")
        cnt = i1 - i0
        row = np.repeat(np.arange(total), cnt)
        idx = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt) + i0[row]
        nxt = np.append(s[1:], var.numel)[idx]
        lo_ = np.maximum(s[idx], a[row]) - a[row] + off[row]
        hi_ = np.minimum(nxt, e[row]) - a[row] + off[row]
        tl = ids[idx]
        keep = tl >= 0
        if keep.any():
            self._state.space(out._type).map_intervals(out_var, lo_[keep], hi_[keep], tl[keep])
        return True

    def tile_runs_of(self, t: Tensor, perm=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(begin, end, global tile)`` runs of ``t``'s flattened elements (-1: unmapped), adjacent
        runs on different tiles; with ``perm``, of the elements of ``t.dimShuffle(perm)``.
        openipu extension."""
        n = t.numElements()
        if n == 0:
            z = np.zeros(0, np.int64)
            return z, z, np.zeros(0, np.int32)
        flat = _flat_view(t) if perm is None else None
        if flat is not None:
            var, off = flat
            s = var.tile_starts
            i0 = int(np.searchsorted(s, off, side="right")) - 1
            i1 = int(np.searchsorted(s, off + n, side="left"))
            b = np.maximum(s[i0:i1], off) - off
            e = np.minimum(np.append(s[i0 + 1:i1], off + n), off + n) - off
            return b, e, var.tile_ids[i0:i1]
        if n <= SMALL_VIEW_ELEMENTS and perm is None:
            return self._small_tile_runs(t)
        from openipu.poplar.exchange import tile_boxes
        boxes = tile_boxes(t)
        lo, sz, shape = boxes.lo, boxes.sz, t.shape()
        if perm is not None:
            lo, sz, shape = lo[:, perm], sz[:, perm], [shape[d] for d in perm]
        b, tl = box_tile_runs(lo, sz, boxes.tile, shape)
        return b, np.append(b[1:], n), tl

    def _small_tile_runs(self, t: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`tile_runs_of` of a view of few elements, element by element: each element's
        address looked up in its variable's run-length tile map (cheaper than the view's tile
        boxes when the view is a strided row of a large tensor: a few hundred elements, each in
        a box of its own)."""
        addr = t.flat_addresses()
        sp = self._state.space(t._type)
        vi = np.searchsorted(sp.starts(), addr, side="right") - 1
        tiles = np.empty(addr.size, np.int32)
        for j in _sets.unique(vi).tolist():
            var = sp.vars[j]
            m = vi == j
            tiles[m] = var.tile_ids[np.searchsorted(var.tile_starts, addr[m] - var.start, side="right") - 1]
        b = np.flatnonzero(np.r_[True, tiles[1:] != tiles[:-1]]).astype(np.int64)
        return b, np.append(b[1:], addr.size), tiles[b]

    def copy_tile_mapping(self, dst: Tensor, src: Tensor) -> None:
        """Map each element of ``dst`` to the tile of the same element of ``src`` (equal element
        counts; unmapped stays unmapped). openipu extension, used by ``clone`` and PopLibs."""
        perm = memory_order(dst) if dst.shape() == src.shape() else None
        if perm is not None:            # walk both in dst's memory order: runs, not elements
            dst, src = dst.dimShuffle(perm), src.dimShuffle(perm)
        b, e, tl = self.tile_runs_of(src)
        keep = tl >= 0
        self.set_tile_runs(dst, b[keep], e[keep], tl[keep])

    def set_global_tile_mapping(self, t: Tensor, tiles) -> None:
        """Map each flattened element of ``t`` to a *global* tile number (``tiles``: int array of
        ``t.numElements()`` entries, or broadcastable to it), without checks. openipu extension for
        PopLibs, which computes tiles in global numbering (see :meth:`tile_of_elements`)."""
        tiles = np.asarray(tiles)
        if tiles.size == 1:
            self._assign_set(t, int(tiles.reshape(-1)[0]))
            return
        self._assign_elements(t, tiles)

    def tile_of_elements(self, t: Tensor) -> np.ndarray:
        """Global tile of each flattened element of ``t`` (int32, -1 when unmapped). Costs one
        int per element: openipu extension for small tensors; PopLibs uses :meth:`tile_runs_of`."""
        if t.numElements() == 0:
            return np.zeros(0, np.int32)
        b, e, tl = self.tile_runs_of(t)
        return np.repeat(tl, e - b)

    def is_mapped(self, t: Tensor) -> bool:
        """Whether every element of ``t`` is mapped to a tile. openipu extension."""
        if t.numElements() == 0:
            return True
        variables = self._state.variables
        ids = t.variable_ids().tolist()
        if all((variables[i].tile_ids >= 0).all() for i in ids):
            return True
        return bool((self.tile_runs_of(t)[2] >= 0).all())

    def tile_element_counts(self, t: Tensor) -> np.ndarray:
        """Elements of ``t`` on each global tile (float64, one entry per tile of the target).
        openipu extension."""
        from openipu.poplar.exchange import tile_counts
        return tile_counts(t, self._top._target.getNumTiles())


def _flat_view(t: Tensor):
    """``(variable, offset)`` when ``t``'s flattened elements are the consecutive elements
    ``[offset, offset + n)`` of one variable (a variable, or a contiguous slice or reshape of one);
    else None."""
    p = t.pieces
    if p.row is None:
        return None
    v, a, lo, sz, st = p.row
    if any(lo) or tuple(sz) != t._shape or not R._dense(sz, st):
        return None
    var = t._state.variables[v]
    return var, a - var.start


#: most rows of consecutive addresses :meth:`TileMapping._clone_piece_rows` maps a clone by;
#: a view of more (a transposed or finely strided view of a blocked tensor) is mapped box by box
CLONE_ROWS_MAX = 1 << 16

#: views of at most this many elements have their tile runs looked up element by element
#: (:meth:`Graph.tile_runs_of`)
SMALL_VIEW_ELEMENTS = 2048


def box_tile_runs(lo: np.ndarray, sz: np.ndarray, tiles: np.ndarray, shape) -> tuple[np.ndarray, np.ndarray]:
    """``(begin, tile)`` of the runs of flat (row-major) indices of a tensor of ``shape`` that the
    disjoint boxes ``lo``, ``sz`` on ``tiles`` cover, adjacent runs on the same tile merged
    (``tile`` int32). Host work follows boxes and runs."""
    owner, start, _ = R.box_flat_runs(lo, sz, shape)
    order = np.argsort(start, kind="stable")
    return tilemap.compress(start[order], np.asarray(tiles)[owner[order]].astype(np.int32))


def blocked(p) -> bool:
    """Whether pieces ``p`` are several blocks of one variable, without aliases (a blocked tensor
    such as poplin's outputs, or a view of one)."""
    return len(p) > 1 and p.row is None and bool((p.var == p.var[0]).all()) and not _aliases(p)


def _aliases(p) -> bool:
    """Whether pieces ``p`` broadcast (a dim of stride 0 and size above 1)."""
    return bool(((p.st == 0) & (p.sz > 1)).any())


def memory_order(t: Tensor) -> list[int] | None:
    """The dims of ``t`` from outermost to innermost in memory, from the strides of its largest
    piece (unit dims keep their places), or None when that is the natural order or ``t`` holds
    aliases (a broadcast dim, or two dims with one stride)."""
    p = t.pieces
    if t.rank() < 2 or len(p) == 0:
        return None
    if p.row is not None:
        sz, st = p.row[3], p.row[4]
    else:
        k = int(np.argmax(p.numel()))
        sz, st = p.sz[k].tolist(), p.st[k].tolist()
    if len(p) > 1 and _aliases(p) or any(s > 1 and a == 0 for s, a in zip(sz, st)):
        return None
    big = [d for d in range(len(sz)) if sz[d] > 1]
    by_stride = sorted(big, key=lambda d: -abs(st[d]))
    if len({abs(st[d]) for d in big}) < len(big) or by_stride == big:
        return None
    it = iter(by_stride)
    return [next(it) if sz[d] > 1 else d for d in range(len(sz))]
