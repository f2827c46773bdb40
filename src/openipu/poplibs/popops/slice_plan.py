"""``popops`` slice planning and sliceable layouts (PopLibs ``DynamicSlice.hpp`` /
``Embedding.hpp``): :class:`SlicePlan`, :class:`embedding` (``embedding::plan``),
:func:`createSliceableTensor`, :func:`createSliceTensor`, :func:`createIndicesTensor`, and the
row split of a table with fewer columns than tiles (:func:`plan_row_split`, PopLibs'
``slicedDimSplit``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from openipu import poplar
from openipu.poplar.mapping import linear_tile_runs
from openipu.poplibs.popops._slice_layout import (_by_columns, _check_dims, _check_options, _column_major,
                                                  _column_runs, _columns_view)

__all__ = ["SlicePlan", "embedding", "createSliceableTensor", "createSliceTensor", "createIndicesTensor"]


@dataclass(frozen=True)
class SlicePlan:
    """``popops::SlicePlan``: what an embedding was planned for. :func:`createSliceableTensor`
    lays a table out by it (its rows split over tiles when it has fewer columns than tiles, see
    :func:`plan_row_split`); the slicing functions slice columns where they live (in two stages
    for a table split along its rows, see the module doc), whatever the plan. The default plan
    ``SlicePlan()`` plans nothing."""

    dataType: object = None  # noqa: N815 - PopLibs names
    numEntries: int = 0  # noqa: N815
    outputSize: int = 0  # noqa: N815
    numLookups: tuple = ()  # noqa: N815
    options: tuple = field(default=(), compare=False)


class embedding:  # noqa: N801 - PopLibs namespace ``popops::embedding``
    """``popops::embedding``: planning of embedding lookups."""

    @staticmethod
    def plan(graph, dataType, numEntries, outputSize, numLookups, options=None) -> SlicePlan:  # noqa: N803
        """``embedding::plan(graph, dataType, numEntries, outputSize, numLookups, options)``.

        Options ``usedForSlice``, ``usedForUpdate`` (not both false), ``operationForUpdate``
        ("none", "add", "max"), ``availableMemoryProportion``, ``indicesDistribution``
        ("uniform", "onePoint"), ``planMinimisationTarget`` ("memory", "cycles"),
        ``indicesAreSorted``. Raises ``poplar.invalid_option`` for others or bad values."""
        opts = _check_options(options, "embedding::plan")
        truthy = {"true": True, "false": False, True: True, False: False}
        try:
            use_slice = truthy[opts.get("usedForSlice", True)]
            use_update = truthy[opts.get("usedForUpdate", True)]
        except KeyError:
            raise poplar.invalid_option("embedding::plan: usedForSlice / usedForUpdate take true or false") from None
        if not (use_slice or use_update):
            raise poplar.invalid_option("embedding::plan: usedForSlice and usedForUpdate cannot both be false")
        if str(opts.get("operationForUpdate", "add")) not in ("none", "add", "max", "mul"):
            raise poplar.invalid_option("embedding::plan: operationForUpdate takes none, add or max")
        if str(opts.get("indicesDistribution", "uniform")) not in ("uniform", "onePoint"):
            raise poplar.invalid_option("embedding::plan: indicesDistribution takes uniform or onePoint")
        if str(opts.get("planMinimisationTarget", "memory")) not in ("memory", "cycles"):
            raise poplar.invalid_option("embedding::plan: planMinimisationTarget takes memory or cycles")
        return SlicePlan(poplar.types.as_type(dataType), int(numEntries), int(outputSize),
                         tuple(int(n) for n in np.atleast_1d(numLookups)), tuple(sorted((k, str(v)) for k, v in opts.items())))


def createSliceableTensor(graph, type_, shape, dims, sizes, minGrainSize=0, options=None,  # noqa: N802,N803
                          debug_name: str = ""):
    """``popops::createSliceableTensor(graph, type, shape, dims, sizes, minGrainSize=0, name)``
    or ``(graph, type, shape, dims, sizes, plan, options, name)``: a new tensor whose columns (all
    elements that differ only in ``dims``) each sit on one tile, the columns spread linearly over
    the tiles in grains of ``minGrainSize`` columns. With a plan from :meth:`embedding.plan`
    (``numEntries`` > 0) and one sliced dimension, a table with fewer columns than tiles has its rows
    split too, as :func:`plan_row_split` says for the plan's lookups (the tiles of every range
    hold each of its columns whole; :func:`multiSlice` slices it in two stages). The tensor is a
    view of a variable laid out column by column (see the module docstring). Raises
    ``poplar.index_error`` for bad dims or sizes, ``poplar.invalid_option`` for bad options."""
    plan = None
    if isinstance(minGrainSize, SlicePlan):
        _check_options(options, "createSliceableTensor")
        plan, minGrainSize = minGrainSize, 0
    elif isinstance(options, str) and not debug_name:
        debug_name = options
    shape = [int(s) for s in shape]
    dims, sizes = _check_dims(shape, dims, sizes, "createSliceableTensor")
    u, view = _column_major(graph, type_, shape, dims, debug_name or "sliceable")
    rows = int(np.prod([shape[d] for d in dims], dtype=np.int64))
    lookups = sum(plan.numLookups) if plan is not None and plan.numEntries and len(dims) == 1 else None
    map_sliceable(graph, u, rows, u.numElements() // max(rows, 1), type_, lookups, max(1, int(minGrainSize)))
    return view


def map_sliceable(graph, flat, rows: int, cols: int, type_, lookups=None, grain: int = 1) -> None:
    """Map ``flat``, a variable holding a table ``[rows, cols]`` column by column (``[cols,
    rows]`` flattened), for slicing its rows: each column on one tile, the columns spread
    linearly over the tiles in grains of ``grain``; when ``lookups`` is given (a lookup of that
    many offsets is planned: :meth:`embedding.plan`, PopART's Gather) and the table has fewer
    columns than tiles, its rows are split too as :func:`plan_row_split` says."""
    T = graph.getTarget().getNumTiles()
    flat = flat.reshape([flat.numElements()])
    split = row_split_runs(rows, cols, type_, T, lookups) if lookups is not None else None
    if split is not None:
        b, e, tiles = split
    else:
        b, e = linear_tile_runs(cols, T, grain, grain)
        b, e, tiles = b * rows, e * rows, np.arange(b.size)
    if b.size and rows:
        graph.set_tile_runs(flat, b, e, graph._global_tiles(tiles).astype(np.int64))


def createSliceTensor(graph, t, dims, sizes, numIndices, debug_name: str = ""):  # noqa: N802,N803
    """``popops::createSliceTensor(graph, t, dims, sizes, numIndices, name)``: a tensor of shape
    ``[numIndices, *t.shape with dims -> sizes]`` mapped like the columns of ``t`` it slices."""
    dims, sizes = _check_dims(t.shape(), dims, sizes, "createSliceTensor")
    view, rest, cols = _columns_view(t, dims)
    runs = _column_runs(graph, view, "createSliceTensor")
    shape = list(t.shape())
    for d, s in zip(dims, sizes):
        shape[d] = s
    return _by_columns(graph, t.elementType(), [int(numIndices)] + shape, [0] + [1 + d for d in dims],
                       debug_name or "slice", runs)


def createIndicesTensor(graph, dims, numIndices, plan=None, options=None, debug_name: str = ""):  # noqa: N802,N803
    """``popops::createIndicesTensor``: an UNSIGNED_INT tensor ``[numIndices, len(dims)]`` mapped
    linearly."""
    _check_options(options, "createIndicesTensor")
    t = graph.addVariable(poplar.UNSIGNED_INT, [int(numIndices), len(dims)], debug_name or "indices")
    from openipu.poplibs.poputil import mapTensorLinearly
    mapTensorLinearly(graph, t)
    return t


#: Most row partitions a two-stage multiSlice handles (PopLibs' plans split the sliced dimension
#: of the tables they create a few to a few tens of ways); a table mapped in more row ranges
#: is sliced in one stage, its columns moved to their first rows' tiles.
MAX_ROW_PARTITIONS = 64


def plan_row_split(rows: int, cols: int, type_, num_tiles: int, lookups: int = 0):
    """How a table ``[rows, cols]`` with fewer columns than tiles is spread over ``num_tiles``
    tiles when its rows are split as well (the partition of PopLibs' embedding plan: the sliced
    dimension split ``split`` ways, the unsliced one in groups of ``grain`` columns, ``split x
    ceil(cols / grain)`` tiles at most ``num_tiles``): ``(split, grain)``, or None to keep one
    range (or when ``cols >= num_tiles``).

    A tile of range ``p`` and column group ``j`` holds ``ceil(rows / split) x grain`` elements
    of the table and, for a lookup of ``lookups`` rows, the ``lookups x grain`` elements of its
    first stage (as a range's update reads every slice of its columns) and ``ceil(lookups /
    split) x grain`` of the output; unsplit, ``(rows + lookups) x grain``. Those elements also
    set its cycles; the plan minimises them. ``grain``
    is at least 4 bytes of columns (PopLibs' ``unslicedGrainSize``: 2 halves or 1 float) and
    ``split`` at most :data:`MAX_ROW_PARTITIONS`; ties go to fewer ranges. Examples (1,472
    tiles, fp32): BERT-base's 30522 x 768 word embedding with 128 lookups is split 15 ways in
    groups of 8 columns (1,440 tiles, 65 KB of table each, against 122 KB on 768 tiles
    unsplit); with no lookups (a plan made without them), 23 ways in groups of 12 (all 1,472
    tiles); its 512 x 768 position embedding is not split."""
    g0 = max(1, 4 // type_.size)
    if cols >= num_tiles or rows < 2 or cols <= 0:
        return None
    s = np.arange(1, min(rows, MAX_ROW_PARTITIONS, num_tiles) + 1, dtype=np.int64)
    grain = np.maximum(g0, -(-cols // (num_tiles // s)))
    n = max(0, int(lookups))
    per_tile = (-(-rows // s) + n + np.where(s > 1, -(-n // s), 0)) * grain
    k = int(np.argmin(per_tile))               # the first minimum: the fewest ranges
    split = int(s[k])
    return (split, int(grain[k])) if split >= 2 else None


def row_split_runs(rows: int, cols: int, type_, num_tiles: int, lookups: int = 0):
    """The tile runs of a table split as :func:`plan_row_split` says: ``(begins, ends, local
    tiles)`` of the flattened column-by-column variable ``[cols, rows]``, column group ``j`` of
    row range ``p`` on tile ``p * groups + j`` (int64 arrays, one interval per column and range);
    None when the rows are not split. :func:`multiSlice` slices such a table in two stages and
    the ``multiUpdate*`` functions update each range on its own tiles."""
    plan = plan_row_split(rows, cols, type_, num_tiles, lookups)
    if plan is None:
        return None
    split, grain = plan
    groups = -(-cols // grain)
    per = -(-rows // split)
    bounds = [(p * per, min(rows, (p + 1) * per)) for p in range(split) if p * per < rows]
    c = np.arange(cols, dtype=np.int64)
    begins = np.concatenate([c * rows + r0 for r0, _ in bounds])
    ends = np.concatenate([c * rows + r1 for _, r1 in bounds])
    tiles = np.concatenate([p * groups + c // grain for p in range(len(bounds))])
    return begins, ends, tiles


def plan_lookup_split(rows: int, cols: int, lookups: int, type_, num_tiles: int):
    """The partition of a planned ``multiSlice`` of a table ``[rows, cols]`` at ``lookups``
    offsets that does not follow the table's own layout (PopLibs' ``embedding::plan`` partition
    for a table that is an activation: ``multiSlicePlanned``): ``(lookup_split, sliced_split,
    unsliced_split, grain)``, or None when ``rows < 2``, ``cols == 0`` or ``lookups == 0``.

    Tile ``(i, s, h)`` (``i`` < lookup_split, ``s`` < sliced_split, ``h`` < unsliced_split; at
    most ``num_tiles`` of them) receives the table's rows ``[s x R, (s + 1) x R)`` (``R =
    ceil(rows / sliced_split)``) of column group ``h`` (``grain`` columns), looks up the offsets
    of lookup chunk ``i`` (``L = ceil(lookups / lookup_split)`` of them) and, with the rows
    split, keeps their ``L x grain`` partials; a second stage picks each slice from its row's
    partial, lookup chunk ``i`` split again over the ``sliced_split`` tiles of its column group.
    Elements a tile holds: ``(R + L) x grain``, plus ``(L + ceil(L / sliced_split)) x grain``
    for the second stage when the rows are split. The plan minimises them (PopLibs'
    ``planMinimisationTarget`` "memory"); ties go to fewer tiles, then to fewer row ranges.
    ``grain`` is a multiple of 4 bytes of columns (``unslicedGrainSize``), the row split at most
    :data:`MAX_ROW_PARTITIONS` and leaves 2 rows a range at least.

    Example (1,472 tiles, fp32): a GCN's 2,708 x 7 node features gathered at 10,492 edges is
    split 7 ways along the columns, 5 along the rows and 42 along the lookups (1,470 tiles,
    1,042 elements each, against 13,200 x 7 on one tile unplanned)."""
    rows, cols, n = int(rows), int(cols), int(lookups)
    if rows < 2 or cols <= 0 or n <= 0:
        return None
    g0 = max(1, 4 // type_.size)
    grains = -(-cols // g0)
    u = np.arange(1, min(grains, num_tiles) + 1, dtype=np.int64)
    u = u[np.r_[True, (-(-grains // u[1:])) != (-(-grains // u[:-1]))]]      # distinct group sizes
    s = np.arange(1, min(MAX_ROW_PARTITIONS, rows // 2, num_tiles) + 1, dtype=np.int64)
    U, S = np.meshgrid(u, s, indexing="ij")
    ok = U * S <= num_tiles
    U, S = U[ok], S[ok]
    L = np.minimum(n, num_tiles // (U * S))
    grain = -(-grains // U) * g0
    per = -(-n // L)
    elems = (-(-rows // S) + per + np.where(S > 1, per + -(-per // S), 0)) * grain
    order = np.lexsort((S, L * S * U, elems))
    k = int(order[0])
    unsliced = int(-(-cols // int(grain[k])))
    return int(L[k]), int(S[k]), unsliced, int(min(grain[k], cols))
