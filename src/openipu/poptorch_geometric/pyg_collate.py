"""``Collater``: PyG's batching collater with PopTorch Geometric's signature (no dataset
argument; ``follow_batch`` / ``exclude_keys`` default to empty lists)."""

from __future__ import annotations

from torch_geometric.loader.dataloader import Collater as _PyGCollater


class Collater(_PyGCollater):
    """``Collater(follow_batch=None, exclude_keys=None)``: a list of ``Data`` -> ``Batch``
    (``torch_geometric.loader.dataloader.Collater`` of PyG 2.8 without its ``dataset``)."""

    def __init__(self, follow_batch=None, exclude_keys=None):
        super().__init__(None, follow_batch or [], exclude_keys or [])
