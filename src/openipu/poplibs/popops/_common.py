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
        if list(src.shape()) == list(shape) and (graph.tile_of_elements(src) >= 0).all():
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


def broadcast_view(t, shape):
    """``t`` broadcast to ``shape`` as a view (numpy rules); raises Poplar's ``index_error``."""
    try:
        addr = np.broadcast_to(t._addr, tuple(shape))
    except ValueError:
        raise poplar.index_error(f"shape {t.shape()} cannot be broadcast to {list(shape)}") from None
    return poplar.Tensor(t._state, t._type, addr, t._view_type)
