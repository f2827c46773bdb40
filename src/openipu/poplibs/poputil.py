"""``poputil``: tile-mapping helpers (PopLibs ``include/poputil/TileMapping.hpp``)."""

from __future__ import annotations

import numpy as np

from openipu.poplar.mapping import linear_tile_mapping


def mapTensorLinearly(graph, t, min_elements_per_tile: int | None = None, grain_size: int | None = None) -> None:  # noqa: N802
    """Spread ``t``'s flattened elements evenly over ``graph``'s tiles in index order.

    Grain: the target's vector width for the type (float 2, half 4); at least
    ceil(128 bytes / type size) elements per used tile (PopLibs defaults).
    """
    graph.setTileMapping(t, linear_tile_mapping(graph, t, min_elements_per_tile, grain_size))


def calcLinearTileMapping(graph, t, min_elements_per_tile: int | None = None, grain_size: int | None = None):  # noqa: N802
    """The mapping ``mapTensorLinearly`` would set: per tile, a list of ``Interval``."""
    from openipu.poplar.tensor import Interval
    tiles = linear_tile_mapping(graph, t, min_elements_per_tile, grain_size)
    out = [[] for _ in range(graph.getTarget().getNumTiles())]
    if tiles.size:
        brk = np.flatnonzero(np.diff(tiles)) + 1
        starts, ends = np.r_[0, brk], np.r_[brk, tiles.size]
        for s, e in zip(starts.tolist(), ends.tolist()):
            out[int(tiles[s])].append(Interval(s, e))
    return out


def getTileImbalance(graph, t) -> int:  # noqa: N802
    """Elements on the most loaded tile minus the mean per used tile (PopLibs' measure)."""
    tiles = graph.tile_of_elements(t)
    counts = np.bincount(tiles[tiles >= 0])
    used = counts[counts > 0]
    return int(used.max() - t.numElements() // max(used.size, 1)) if used.size else 0
