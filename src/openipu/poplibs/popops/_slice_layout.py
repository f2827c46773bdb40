"""Shared layout and argument checks of the slicing families (PopLibs ``DynamicSlice.hpp``):
options, dims / sizes checks, the *columns* view of a sliced tensor, runs of columns on one
tile (:class:`_Cols`) and column-by-column variables. See :mod:`.dynamic_slice` for the layout
rules."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from openipu import poplar
from openipu.poplar.exchange import Boxes
from openipu.poplar.graph import Access
from openipu.poplibs.popops._common import read_on_tiles, unmapped_count

WORKERS = 6
_OPTIONS = {"remapOutOfBoundIndices", "paddingIndexUsed", "usedForSlice", "usedForUpdate", "operationForUpdate",
            "availableMemoryProportion", "indicesDistribution", "planMinimisationTarget", "indicesAreSorted",
            "partialType"}

def _check_options(options, name) -> dict:
    opts = dict(options or {})
    bad = sorted(k for k in opts if k not in _OPTIONS)
    if bad:
        raise poplar.invalid_option(f"{name}: unknown option(s) {bad}; known options are {sorted(_OPTIONS)}")
    return opts


def _flag(opts, key) -> bool:
    v = opts.get(key, False)
    if isinstance(v, str):
        if v.lower() not in ("true", "false"):
            raise poplar.invalid_option(f"option {key} takes true or false, got {v!r}")
        return v.lower() == "true"
    return bool(v)

# ----------------------------------------------------------------------------------------------
# layout
# ----------------------------------------------------------------------------------------------
def _check_dims(shape, dims, sizes, name, sizes_one=False):
    try:
        dims = [int(d) for d in dims]
        sizes = [int(s) for s in sizes]
    except TypeError:
        raise poplar.index_error(f"{name}: dims and sizes must be lists of integers") from None
    if len(dims) != len(sizes):
        raise poplar.index_error(f"{name}: {len(dims)} dims but {len(sizes)} sizes; give one size per sliced dimension")
    rank = len(shape)
    for d, s in zip(dims, sizes):
        if not 0 <= d < rank:
            raise poplar.index_error(f"{name}: dimension {d} is out of range for a tensor of shape {list(shape)}")
        if not 1 <= s <= shape[d]:
            raise poplar.index_error(
                f"{name}: slice size {s} in dimension {d} must be between 1 and the dimension's size {shape[d]}")
        if sizes_one and s != 1:
            raise poplar.index_error(f"{name}: slice sizes must be 1 (got {s} in dimension {d})")
    if len(set(dims)) != len(dims):
        raise poplar.index_error(f"{name}: dims {dims} repeat a dimension")
    return dims, sizes


def _columns_view(t, dims):
    """``t`` as ``[*t.dim(dims), columns]`` and the rest dims."""
    rest = [d for d in range(t.rank()) if d not in dims]
    cols = int(np.prod([t.dim(d) for d in rest], dtype=np.int64))
    return t.dimShuffle(dims + rest).reshape([t.dim(d) for d in dims] + [cols]), rest, cols



@dataclass
class _Cols:
    """Runs of columns on one tile: columns ``[begin[i], end[i])`` sit on global tile ``tile[i]``
    (the tile of each column's first element), adjacent runs on different tiles."""

    begin: np.ndarray
    end: np.ndarray
    tile: np.ndarray
    cols: int

    def boxes(self, view) -> Boxes:
        """Boxes of ``view`` ``[*rows, cols]``, each used on the tile of its columns: the view's
        own tile boxes cut at the column runs (so that each box lies in one run of its owner's
        tile map, and elements already on their column's tile are seen to stay)."""
        tb = _column_tile_boxes(view)
        if tb is None:
            from openipu.poplar.exchange import tile_boxes
            tb = tile_boxes(view)
        c0 = tb.lo[:, -1]
        c1 = c0 + tb.sz[:, -1]
        a = np.searchsorted(self.end, c0, side="right")          # first column run reaching past c0
        z = np.searchsorted(self.begin, c1, side="left")         # runs starting before c1
        cnt = np.maximum(z - a, 0)
        k = np.repeat(np.arange(len(tb)), cnt)
        r = np.repeat(a, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        lo, sz = tb.lo[k].copy(), tb.sz[k].copy()
        x0 = np.maximum(c0[k], self.begin[r])
        x1 = np.minimum(c1[k], self.end[r])
        lo[:, -1], sz[:, -1] = x0, x1 - x0
        return Boxes(lo, sz, self.tile[r].astype(np.int64))

    def column_boxes(self, view, rows: int) -> Boxes:
        """:meth:`boxes` of ``view`` ``[rows, cols]``, a variable :func:`_by_columns` made and
        mapped by these runs (``row_dims`` ``[0]``), in closed form: one box of all rows per
        column run, in column order (each run's columns are consecutive addresses on its tile,
        so its tile boxes, cut at the runs, are those boxes). Falls back to :meth:`boxes` when
        nothing was mapped (no rows or no runs)."""
        if rows <= 0 or not self.begin.size:
            return self.boxes(view)
        k = self.begin.size
        return Boxes(np.stack([np.zeros(k, np.int64), self.begin.astype(np.int64)], axis=1),
                     np.stack([np.full(k, rows, np.int64), (self.end - self.begin).astype(np.int64)], axis=1),
                     self.tile.astype(np.int64))

    def per_tile(self, num_tiles):
        """``(used tiles, columns on each, runs of columns on each)``."""
        n = np.bincount(self.tile, weights=self.end - self.begin, minlength=num_tiles).astype(np.int64)
        r = np.bincount(self.tile, minlength=num_tiles).astype(np.int64)
        used = np.flatnonzero(n)
        return used, n[used], r[used]


def _column_tile_boxes(view) -> Boxes | None:
    """``exchange.tile_boxes(view)`` in closed form for a view ``[rows, cols]`` of a table stored
    column by column (one piece, strides ``(1, s)`` with ``s >= rows``: each column is ``rows``
    consecutive addresses) whose every column lies inside one run of its variable's tile map
    and no two columns share a run: then each overlap of a run with the view is one whole column,
    so the tile boxes are one box ``[rows, 1]`` per column, in column order, on the run's tile.
    None when the view is not of that form (the caller takes the general path). Used for the
    row partitions of a table split along its sliced dimension (``multiSlice``' stage 0 reads:
    23 partitions of 384 columns for a BERT vocabulary)."""
    p = view.pieces
    if p.row is None or view.rank() != 2:
        return None
    v, a, _, (rows, cols), (s0, s1) = p.row
    if rows < 1 or cols < 1 or (s0 != 1 and rows > 1) or (cols > 1 and s1 < rows):
        return None
    var = view._state.variables[v]
    s = var.tile_starts
    first = a - var.start + np.arange(cols, dtype=np.int64) * s1
    i0 = np.searchsorted(s, first, side="right") - 1
    i1 = np.searchsorted(s, first + (rows - 1), side="right") - 1
    if not np.array_equal(i0, i1) or (cols > 1 and not (np.diff(i0) > 0).all()):
        return None
    lo = np.zeros((cols, 2), np.int64)
    lo[:, 1] = np.arange(cols)
    sz = np.empty((cols, 2), np.int64)
    sz[:, 0], sz[:, 1] = rows, 1
    return Boxes(lo, sz, var.tile_ids[i0].astype(np.int64))


def _column_runs(graph, view, name) -> _Cols:
    """The column runs of ``view`` ``[*rows, cols]`` (from its runs; raises if not mapped)."""
    if not graph.is_mapped(view):
        raise poplar.invalid_tile_mapping(
            f"{name}: {unmapped_count(graph, view)} elements of the sliced tensor are not mapped to a tile; map it "
            "first (createSliceableTensor makes a well-mapped one)")
    cols = view.shape()[-1]
    if cols == 0 or view.numElements() == 0:
        z = np.zeros(0, np.int64)
        return _Cols(z, z, z, cols)
    first = view.reshape([view.numElements() // cols, cols])[0]
    b, e, tl = graph.tile_runs_of(first)
    return _Cols(b, e, tl.astype(np.int64), cols)


def _column_major(graph, type_, shape, row_dims, name):
    """A new variable holding ``shape`` column by column: the dims not in ``row_dims`` form the
    columns (row-major among themselves), each column's elements (``row_dims`` row-major)
    contiguous. Returns the variable (unmapped) and its view of ``shape``."""
    shape = [int(s) for s in shape]
    col_dims = [d for d in range(len(shape)) if d not in row_dims]
    order = col_dims + list(row_dims)
    u = graph.addVariable(type_, [shape[d] for d in order], name)
    inv = [0] * len(order)
    for k, d in enumerate(order):
        inv[d] = k
    return u, u.dimShuffle(inv)


def _by_columns(graph, type_, shape, row_dims, name, runs: _Cols | None):
    """A new variable of ``shape`` laid out column by column (:func:`_column_major`), returned
    as a view of ``shape``; mapped by ``runs`` of columns when given."""
    u, view = _column_major(graph, type_, shape, row_dims, name)
    rows = int(np.prod([int(shape[d]) for d in row_dims], dtype=np.int64))
    if runs is not None and runs.begin.size and rows:
        graph.set_tile_runs(u.reshape([u.numElements()]), runs.begin * rows, runs.end * rows, runs.tile)
    return view


def _map_by_columns(graph, view, runs: _Cols) -> None:
    """Map an existing view ``[*rows, cols]`` column run by column run (every row)."""
    if not runs.begin.size:
        return
    rows = view.numElements() // runs.cols
    base = (np.arange(rows, dtype=np.int64) * runs.cols)[:, None]
    graph.set_tile_runs(view.reshape([view.numElements()]), (base + runs.begin).reshape(-1),
                        (base + runs.end).reshape(-1), np.broadcast_to(runs.tile, (rows, runs.begin.size)).reshape(-1))

def _check_offset(offset, n, name, rank_two=False):
    if not isinstance(offset, poplar.Tensor):
        raise poplar.graph_connection_error(f"{name}: offsets must be a Tensor, got {type(offset).__name__}")
    if offset.elementType() not in (poplar.UNSIGNED_INT, poplar.INT):
        raise poplar.graph_connection_error(
            f"{name}: offsets must be UNSIGNED_INT or INT, got {offset.elementType()}; cast them first")
    if not rank_two and offset.numElements() != n:
        raise poplar.graph_connection_error(
            f"{name}: the offset tensor has {offset.numElements()} elements (shape {offset.shape()}) but {n} "
            "dimensions are sliced; give one offset per sliced dimension")


def _bcast(t, used) -> Access:
    """Every tile of ``used`` reads all of ``t`` (offsets, a scale)."""
    flat = t.reshape([t.numElements()])
    return Access(flat, read_on_tiles(flat, used))
