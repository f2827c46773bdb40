"""Linear tile mapping (the rule of PopLibs' ``mapTensorLinearly`` / ``VariableMappingMethod.LINEAR``).

The flattened tensor is cut into grains of ``grain_size`` elements; grains are spread evenly over
tiles in index order, with at least ``min_elements_per_tile`` elements on each used tile. Defaults:
grain = the target's vector width for the type, minimum = ceil(128 bytes / type size) (PopLibs
``lib/poputil/TileMapping.cpp``, ``splitRegions``).
"""

from __future__ import annotations

import numpy as np


def linear_tile_runs(num_elements: int, num_tiles: int, grain_size: int, min_elements_per_tile: int):
    """The linear rule as runs: ``(begins, ends)`` (int64) of the elements on tiles ``0, 1, ...``
    (local), one run per used tile, in order."""
    n = int(num_elements)
    if n == 0:
        z = np.zeros(0, np.int64)
        return z, z
    grain = max(1, int(grain_size))
    num_grains = -(-n // grain)
    max_g = -(-num_grains // num_tiles)
    if min_elements_per_tile:
        min_g = -(-int(min_elements_per_tile) // grain)
        max_parts = max(1, num_grains // min_g)
        max_g = max(max_g, -(-num_grains // max_parts))
    n_parts = -(-num_grains // max_g)
    first_grain = np.arange(n_parts + 1, dtype=np.int64) * num_grains // n_parts
    bounds = np.minimum(first_grain * grain, n)
    return bounds[:-1], bounds[1:]


def linear_tile_of_elements(num_elements: int, num_tiles: int, grain_size: int, min_elements_per_tile: int) -> np.ndarray:
    """Tile (0..num_tiles-1, local) of each of ``num_elements`` elements, as an int32 array
    (non-decreasing: tile ``v`` holds one contiguous range of elements)."""
    begins, ends = linear_tile_runs(num_elements, num_tiles, grain_size, min_elements_per_tile)
    return np.repeat(np.arange(begins.size, dtype=np.int32), ends - begins)


def map_linearly(graph, t, min_elements_per_tile: int | None = None, grain_size: int | None = None) -> None:
    """Map ``t`` over ``graph``'s tiles by the linear rule (one run per tile; no per-element work).
    Defaults: grain = the vector width of the type, minimum = ceil(128 bytes / type size)."""
    target = graph.getTarget()
    et = t.elementType()
    grain = grain_size or target.getVectorWidth(et)
    min_el = -(-128 // et.size) if min_elements_per_tile is None else min_elements_per_tile
    b, e = linear_tile_runs(t.numElements(), target.getNumTiles(), grain, min_el)
    if b.size:
        graph.set_tile_runs(t, b, e, graph._global_tiles(np.arange(b.size)))
