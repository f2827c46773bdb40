"""Helpers shared by popops' op families: output allocation, per-tile element counts.

Not part of the PopLibs API.
"""

from __future__ import annotations

import numpy as np

from openipu import poplar


def output_like(graph, type_, shape, candidates, name: str):
    """A new variable of ``type_`` and ``shape``, mapped like the first of ``candidates`` whose
    shape equals ``shape`` and which is fully mapped; otherwise mapped linearly (PopLibs'
    ``createOutputForElementWiseOp`` rule, simplified)."""
    out = graph.addVariable(type_, list(shape), name)
    for src in candidates:
        if list(src.shape()) == list(shape) and graph.is_mapped(src):
            graph.copy_tile_mapping(out, src)
            return out
    from openipu.poplibs.poputil import mapTensorLinearly
    mapTensorLinearly(graph, out)
    return out


def tile_counts(graph, tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(used_tiles, elements_on_each)`` for a per-element global tile array."""
    counts = np.bincount(tiles.astype(np.int64), minlength=graph._top._target.getNumTiles())
    used = np.flatnonzero(counts)
    return used, counts[used]


def tile_counts_of(graph, t) -> tuple[np.ndarray, np.ndarray]:
    """``(used_tiles, elements_on_each)`` (global tiles, int64) of a mapped tensor, from its
    regions (no per-element work)."""
    counts = graph.tile_element_counts(t).astype(np.int64)
    used = np.flatnonzero(counts)
    return used, counts[used]


def broadcast_view(t, shape):
    """``t`` broadcast to ``shape`` as a view (numpy rules); raises Poplar's ``index_error``."""
    return t.broadcast_to(shape)
