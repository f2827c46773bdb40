"""``popops``: sorting and top-k (PopLibs ``include/popops/Sort.hpp``, ``TopK.hpp``, ``SortOrder.hpp``).

Results are exact (torch stable sorts). The cost is that of a distributed sort [A] (PopLibs
publishes no estimator for it): each tile first sorts the elements of each row it holds
(``~log2(n) x`` passes of ``SORT_CYCLES_PER_ELEMENT`` cycles per element over 6 workers), then a
row spread over ``P`` tiles takes ``log2(P) x (log2(P) + 1) / 2`` bitonic merge steps; in every
step each tile exchanges its elements of the row with a partner tile (one compute set per step,
so the exchange and sync are costed) and merges them at ``MERGE_CYCLES_PER_ELEMENT`` cycles per
element (PopLibs' bitonic top-k, ``lib/popops/BitonicTopK.cpp``, works this way).
"""

from __future__ import annotations

import enum
import functools
import math

import numpy as np
import torch

from openipu import poplar
from openipu.poplar import sets as _sets
from openipu.poplar.exchange import Boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._common import row_intervals_per_tile

__all__ = ["SortOrder", "TopKParams", "sort", "sortInPlace", "sortKeyValue", "sortKeyValueInPlace", "topK",
           "topKWithPermutation", "topKKeyValue", "createTopKInput"]

WORKERS = 6
#: Worker cycles per element per pass of the on-tile sort. [A]
SORT_CYCLES_PER_ELEMENT = 4
#: Worker cycles per element of a compare-and-swap merge step. [A] (a load, compare, select, store)
MERGE_CYCLES_PER_ELEMENT = 4
#: Fixed worker cycles per sort / merge vertex. [A] (of the order of popops vertex prologues)
VERTEX_OVERHEAD_CYCLES = 20


class SortOrder(enum.Enum):
    """``popops::SortOrder``."""

    NONE = "NONE"
    ASCENDING = "ASCENDING"
    DESCENDING = "DESCENDING"


class TopKParams:
    """``popops::TopKParams(k, largest, sortOrder, stableSort=False)``."""

    def __init__(self, k: int, largest: bool = True, sortOrder=SortOrder.DESCENDING, stableSort: bool = False):  # noqa: N803
        self.k = int(k)
        self.largest = bool(largest)
        self.sortOrder = sortOrder if isinstance(sortOrder, SortOrder) else SortOrder(str(sortOrder).upper())  # noqa: N815
        self.stableSort = bool(stableSort)  # noqa: N815

    def __repr__(self):
        return f"TopKParams(k={self.k}, largest={self.largest}, sortOrder={self.sortOrder.name}, stableSort={self.stableSort})"


# ----------------------------------------------------------------------------------------------
# cost
# ----------------------------------------------------------------------------------------------
class _RowLayout:
    """How the rows of ``view`` ``[rows, n]`` (``t`` with ``dim`` last) lie on tiles, by structure:
    the view's tile boxes, and the rows cut into ranges over which the set of tiles holding
    each row is constant (``set_lo``, ``set_hi``; tiles of range ``k``: ``set_tiles[ptr[k]:ptr[k+1]]``,
    ascending, so a tile's rank in a row is its position there)."""

    def __init__(self, graph, t, dim):
        from openipu.poplar.exchange import tile_boxes
        perm = [d for d in range(t.rank()) if d != dim] + [dim]
        n = t.dim(dim)
        rows = t.numElements() // n if n else 0
        self.view = t.dimShuffle(perm).reshape([rows, n])
        if not graph.is_mapped(self.view):
            raise poplar.invalid_tile_mapping("sort: the input is not completely mapped to tiles; map it first")
        self.boxes = tile_boxes(self.view)
        st, slo, shi = row_intervals_per_tile(graph, self.view)
        bounds = _sets.unique(np.concatenate([slo, shi]))
        self.set_lo, self.set_hi = bounds[:-1], bounds[1:]
        i0, i1 = np.searchsorted(bounds, slo), np.searchsorted(bounds, shi)
        cnt = i1 - i0
        rng = np.repeat(i0, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        tl = np.repeat(st, cnt)
        order = np.lexsort((tl, rng))
        self.set_tiles = tl[order]
        self.ptr = np.searchsorted(rng[order], np.arange(self.set_lo.size + 1))
        self.num_tiles = graph._top._target.getNumTiles()
        self.set_key = rng[order] * self.num_tiles + self.set_tiles      # sorted: (range, tile)
        self.rows_per_tile = np.bincount(st, weights=shi - slo, minlength=graph._top._target.getNumTiles()).astype(np.int64)

    def max_tiles_per_row(self) -> int:
        return int(np.diff(self.ptr).max()) if self.ptr.size > 1 else 1

    def partner_boxes(self, dist: int) -> Boxes:
        """Boxes of the view, each used on the tile of rank ``rank ^ dist`` in its rows (its own
        tile where no such rank exists): the reads of one compare-and-swap step."""
        b = self.boxes
        r0, r1 = b.lo[:, 0], b.lo[:, 0] + b.sz[:, 0]
        k0 = np.searchsorted(self.set_lo, r0, side="right") - 1
        k1 = np.searchsorted(self.set_lo, r1 - 1, side="right") - 1
        cnt = k1 - k0 + 1
        bi = np.repeat(np.arange(len(b)), cnt)
        k = np.repeat(k0, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        lo, sz = b.lo[bi].copy(), b.sz[bi].copy()
        a = np.maximum(r0[bi], self.set_lo[k])
        z = np.minimum(r1[bi], self.set_hi[k])
        lo[:, 0], sz[:, 0] = a, z - a
        tile = b.tile[bi]
        base, size = self.ptr[k], np.diff(self.ptr)[k]
        # rank of the box's tile among its rows' tiles (the tiles of a range are sorted)
        rank = np.searchsorted(self.set_key, k * self.num_tiles + tile) - base
        partner = rank ^ dist
        has = partner < size
        on = np.where(has, self.set_tiles[np.minimum(base + partner, self.set_tiles.size - 1)], tile)
        return Boxes(lo, sz, on.astype(np.int64))


def _sort_groups(graph, t, dim, kernel, writes, name, extra_reads=()):
    """Compute sets of a distributed sort of ``t`` along ``dim``; ``kernel`` runs in the last."""
    lay = _RowLayout(graph, t, dim)
    view = lay.view
    E = graph.tile_element_counts(view).astype(np.int64)
    used = np.flatnonzero(E)
    rows_t = lay.rows_per_tile
    per_row = -(-E[used] // np.maximum(rows_t[used], 1))
    passes = np.ceil(np.log2(np.maximum(per_row, 2))).astype(np.int64)
    local = WORKERS * (VERTEX_OVERHEAD_CYCLES + -(-E[used] // WORKERS) * passes * SORT_CYCLES_PER_ELEMENT)
    groups = [[VertexGroup(f"popops::SortLocal<{t.elementType()}>", used, local, _noop, reads=[Access(view)],
                           multi=True, flops=0.0)]]
    P = lay.max_tiles_per_row()
    steps = []
    lp = math.ceil(math.log2(P)) if P > 1 else 0
    for i in range(lp):
        for j in range(i, -1, -1):
            steps.append(1 << j)
    merge = WORKERS * (VERTEX_OVERHEAD_CYCLES + -(-E[used] // WORKERS) * MERGE_CYCLES_PER_ELEMENT)
    for dist in steps:
        groups.append([VertexGroup(f"popops::CompareAndSwapAtDistance<{t.elementType()}>", used, merge, _noop,
                                   reads=[Access(view, lay.partner_boxes(dist))], multi=True,
                                   flops=float(t.numElements()))])
    # the final group does the work functionally and writes the outputs
    last = groups[-1][0]
    last.kernel = kernel
    last.reads = list(last.reads) + [Access(view)] + list(extra_reads)
    last.writes = writes
    for k, g in enumerate(groups):
        cs = graph.addComputeSet(f"{name}/{'sort' if k == 0 else f'merge{k}'}")
        for grp in g:
            graph.add_vertex_group(cs, grp)
        yield cs


@kernel
def _noop(ctx):
    pass


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------
@kernel
def _sort_kernel(keys, values, keys_out, values_out, dim, ctx):
    k = ctx.read(keys)
    sk, order = torch.sort(k, dim=dim + 1, stable=True)
    if keys_out is not None:
        ctx.write(keys_out, sk)
    if values is not None:
        v = ctx.read(values)
        ctx.write(values_out, torch.gather(v, dim + 1, order))


@kernel
def _topk_kernel(t, values_in, vals_out, idx_out, vsel_out, k, largest, order, ctx):
    x = ctx.read(t)
    # stable selection: among equal keys the lower index comes first
    _, perm = torch.sort(x, dim=-1, descending=largest, stable=True)
    sel = torch.sort(perm[..., :k], dim=-1).values                 # selected positions, index order
    sv = torch.gather(x, -1, sel)
    if order != SortOrder.NONE:
        _, o = torch.sort(sv, dim=-1, descending=order == SortOrder.DESCENDING, stable=True)
    else:
        _, o = torch.sort(sv, dim=-1, descending=largest, stable=True)
    sel = torch.gather(sel, -1, o)
    ctx.write(vals_out, torch.gather(x, -1, sel))
    if idx_out is not None:
        ctx.write(idx_out, sel)
    if vsel_out is not None:
        ctx.write(vsel_out, torch.gather(ctx.read(values_in), -1, sel))


# ----------------------------------------------------------------------------------------------
# API
# ----------------------------------------------------------------------------------------------
def _check(graph, t, dim, name):
    if not isinstance(t, poplar.Tensor):
        raise poplar.graph_connection_error(f"{name}: expected a Tensor, got {type(t).__name__}")
    if not 0 <= int(dim) < t.rank():
        raise poplar.index_error(f"{name}: dimension {dim} is out of range for a tensor of shape {t.shape()}")
    if t.numElements() and not graph.is_mapped(t):
        raise poplar.invalid_tile_mapping(f"{name}: the input is not completely mapped to tiles; map it first")
    return int(dim)


def _check_kv(k, v, name):
    if not isinstance(v, poplar.Tensor) or list(k.shape()) != list(v.shape()):
        raise poplar.graph_connection_error(
            f"{name}: keys {k.shape()} and values {getattr(v, 'shape', lambda: '?')()} must have the same shape")


def _emit(graph, t, dim, kernel, writes, prog, name, extra_reads=()):
    if t.numElements() == 0:
        return
    for cs in _sort_groups(graph, t, dim, kernel, writes, name, extra_reads):
        prog.add(poplar.program.Execute(cs))


def sort(graph, t, dim, prog, debug_name: str = ""):
    """``popops::sort(graph, t, dim, prog, debugPrefix)``: a new tensor, ``t`` sorted ascending along
    ``dim`` (mapped like ``t``). Raises ``poplar.index_error`` for a bad ``dim``."""
    name = debug_name or "sort"
    dim = _check(graph, t, dim, name)
    out = graph.clone(t, name)
    _emit(graph, t, dim, functools.partial(_sort_kernel, t, None, out, None, dim),
          [Access(out)], prog, name)
    return out


def sortInPlace(graph, t, dim, prog, debug_name: str = ""):  # noqa: N802
    """``popops::sortInPlace``: sorts ``t`` ascending along ``dim`` in place."""
    name = debug_name or "sortInPlace"
    dim = _check(graph, t, dim, name)
    _emit(graph, t, dim, functools.partial(_sort_kernel, t, None, t, None, dim),
          [Access(t)], prog, name)


def sortKeyValue(graph, k, v, dim, prog, debug_name: str = ""):  # noqa: N802
    """``popops::sortKeyValue(graph, k, v, dim, prog)``: a new tensor, ``v`` permuted so that ``k``
    is ascending along ``dim`` (stable). Raises ``poplar.graph_connection_error`` for mismatched
    shapes."""
    name = debug_name or "sortKeyValue"
    dim = _check(graph, k, dim, name)
    _check_kv(k, v, name)
    out = graph.clone(v, name)
    _emit(graph, k, dim, functools.partial(_sort_kernel, k, v, None, out, dim),
          [Access(out)], prog, name, extra_reads=[Access(v)])
    return out


def sortKeyValueInPlace(graph, k, v, dim, prog, debug_name: str = ""):  # noqa: N802
    """``popops::sortKeyValueInPlace``: sorts ``k`` along ``dim`` and permutes ``v`` the same way."""
    name = debug_name or "sortKeyValueInPlace"
    dim = _check(graph, k, dim, name)
    _check_kv(k, v, name)
    _emit(graph, k, dim, functools.partial(_sort_kernel, k, v, k, v, dim),
          [Access(k), Access(v)], prog, name, extra_reads=[Access(v)])


def createTopKInput(graph, type_, shape, params, debug_name: str = ""):  # noqa: N802
    """``popops::createTopKInput``: a tensor of ``shape`` mapped linearly (rows kept together
    where possible)."""
    t = graph.addVariable(type_, list(shape), debug_name or "topKInput")
    from openipu.poplibs.poputil import mapTensorLinearly
    n = int(shape[-1]) if len(shape) else 1
    mapTensorLinearly(graph, t, grain_size=max(1, n) if n <= 1024 else None)
    return t


def _topk(graph, prog, t, params, values, want_idx, name):
    if not isinstance(params, TopKParams):
        raise poplar.poplar_error(f"{name}: params must be a TopKParams, got {type(params).__name__}")
    if not isinstance(t, poplar.Tensor) or t.rank() < 1:
        raise poplar.index_error(f"{name}: the input must be a tensor of rank >= 1")
    n = t.dim(t.rank() - 1)
    if not 0 <= params.k <= n:
        raise poplar.index_error(f"{name}: k = {params.k} must be at most the innermost dimension's size {n}")
    if values is not None:
        _check_kv(t, values, name)
    shape = list(t.shape())[:-1] + [params.k]
    vals = graph.addVariable(t.elementType(), shape, f"{name}/values")
    idx = graph.addVariable(poplar.UNSIGNED_INT, shape, f"{name}/indices") if want_idx else None
    vsel = graph.addVariable(values.elementType(), shape, f"{name}/permuted") if values is not None else None
    from openipu.poplibs.poputil import mapTensorLinearly
    for x in (vals, idx, vsel):
        if x is not None:
            mapTensorLinearly(graph, x)
    writes = [Access(x) for x in (vals, idx, vsel) if x is not None]
    extra = [Access(values)] if values is not None else []
    if params.k and t.numElements():
        _emit(graph, t, t.rank() - 1, functools.partial(_topk_kernel, t, values, vals, idx, vsel, params.k,
                                                        params.largest, params.sortOrder),
              writes, prog, name, extra_reads=extra)
    return vals, idx, vsel


def topK(graph, prog, t, params, debug_name: str = ""):  # noqa: N802
    """``popops::topK(graph, prog, t, params)``: the ``params.k`` largest (or smallest) values of
    the innermost dimension of ``t``, shape ``[..., k]``, ordered by ``params.sortOrder``.
    Raises ``poplar.index_error`` when k exceeds the innermost dimension."""
    return _topk(graph, prog, t, params, None, False, debug_name or "topK")[0]


def topKWithPermutation(graph, prog, t, params, debug_name: str = ""):  # noqa: N802
    """``popops::topKWithPermutation``: ``(values, indices)``; indices (UNSIGNED_INT) of the values
    in the innermost dimension of ``t`` (equal values: lower index first)."""
    v, i, _ = _topk(graph, prog, t, params, None, True, debug_name or "topKWithPermutation")
    return v, i


def topKKeyValue(graph, prog, keys, values, params, debug_name: str = ""):  # noqa: N802
    """``popops::topKKeyValue``: ``(top keys, values permuted with them)``."""
    k, _, v = _topk(graph, prog, keys, params, values, False, debug_name or "topKKeyValue")
    return k, v


def _register_records():
    from openipu.poplar.graph_codec import data_enum
    data_enum(SortOrder)


_register_records()
