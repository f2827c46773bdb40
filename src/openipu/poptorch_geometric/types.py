"""``PyGArgsParser``: PyG's ``Data`` / ``HeteroData`` / ``Batch`` as arguments and outputs of a
wrapped model (PopTorch Geometric's ``poptorch_geometric.types``).

The tensors of an object are its stores' tensor attributes: the stores in the object's order
(global, node types, edge types), each store's keys sorted. Non-tensor attributes (``num_nodes``
given as an int, strings, the batch's slice bookkeeping) are kept from the object the tensors
came from. Importing this module registers the parser for ``Data``, ``HeteroData`` and their
batch classes with :func:`poptorch.registerCustomArgParser`.
"""

from __future__ import annotations

import copy

import torch
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.data.data import BaseData

from openipu.poptorch import ICustomArgParser, registerCustomArgParser
from openipu.poptorch_geometric.common import DataBatch, HeteroDataBatch


def _store_name(store) -> str:
    key = getattr(store, "_key", None)
    if key is None:
        return ""
    return ("__".join(key) if isinstance(key, tuple) else str(key)) + "."


def _tensor_items(struct: BaseData):
    for store in struct.stores:
        for key in sorted(store.keys()):
            value = store[key]
            if isinstance(value, torch.Tensor):
                yield store, key, value


class PyGArgsParser(ICustomArgParser):
    """Flattens a PyG ``BaseData`` into its tensors and rebuilds it (``yieldTensors`` /
    ``reconstruct``, PopTorch Geometric's ``PyGArgsParser``)."""

    @staticmethod
    def sortedTensorKeys(struct: BaseData) -> tuple:  # noqa: N802
        """The names of ``struct``'s tensors, in ``yieldTensors``' order (``x``,
        ``paper.x``, ``author__writes__paper.edge_index``)."""
        return tuple(_store_name(s) + k for s, k, _ in _tensor_items(struct))

    def tensorKeys(self, struct: BaseData) -> tuple:  # noqa: N802
        return self.sortedTensorKeys(struct)

    def yieldTensors(self, struct: BaseData):  # noqa: N802
        """Yield the tensors of ``struct`` (see the module docstring for the order)."""
        for _, _, value in _tensor_items(struct):
            yield value

    def reconstruct(self, original_structure: BaseData, tensor_iterator) -> BaseData:
        """A shallow copy of ``original_structure`` with its tensors taken in order from
        ``tensor_iterator``. A ``Batch`` keeps the ``num_nodes`` of ``original_structure`` (per
        node type, from its ``batch`` vector), as in PopTorch Geometric: a batch combined from
        k mini-batches (tensors concatenated on dim 0) reports one mini-batch's counts."""
        out = copy.copy(original_structure)
        if isinstance(original_structure, Batch):
            for store, orig in zip(out.node_stores, original_structure.node_stores):
                if "batch" in orig and isinstance(orig["batch"], torch.Tensor):   # (no data-dependent
                    store.num_nodes = int(orig["batch"].shape[0])                # inference from edge_index)
        for store, key in [(s, k) for s, k, _ in _tensor_items(original_structure)]:
            target = out[store._key] if getattr(store, "_key", None) is not None else out._store \
                if hasattr(out, "_store") else out._global_store
            target[key] = next(tensor_iterator)
        return out


def registerCustomArgParsers() -> None:  # noqa: N802
    """Register :class:`PyGArgsParser` for ``Data``, ``HeteroData`` and their batch classes."""
    parser = PyGArgsParser()
    for t in (Data, HeteroData, DataBatch, HeteroDataBatch):
        registerCustomArgParser(t, parser)


registerCustomArgParsers()
