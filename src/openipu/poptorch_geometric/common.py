"""Shared names (PopTorch Geometric's ``poptorch_geometric.common``): the batch classes PyG's
``Batch.from_data_list`` creates for ``Data`` and ``HeteroData`` (``DataBatch``,
``HeteroDataBatch``) and :func:`call_once`."""

from __future__ import annotations

import functools

from torch_geometric.data import Batch, Data, HeteroData

#: ``type(Batch.from_data_list([Data(...)]))``
DataBatch = type(Batch(_base_cls=Data))
#: ``type(Batch.from_data_list([HeteroData(...)]))``
HeteroDataBatch = type(Batch(_base_cls=HeteroData))


def call_once(fn):
    """Decorator: ``fn`` runs on the first call only; later calls return None."""
    done = []

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if done:
            return None
        done.append(True)
        return fn(*args, **kwargs)
    return wrapper
