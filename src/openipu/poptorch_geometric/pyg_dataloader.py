"""Fixed-size data loaders on plain ``torch.utils.data.DataLoader`` (PopTorch Geometric's
``poptorch_geometric.pyg_dataloader``) and the strategy enums. The IPU loaders of
:mod:`openipu.poptorch_geometric.dataloader` derive from these and ``poptorch.DataLoader``."""

from __future__ import annotations

from enum import Enum

import torch
from torch.utils.data import RandomSampler, SequentialSampler

from openipu.poptorch_geometric.collate import FixedSizeCollater
from openipu.poptorch_geometric.fixed_size_options import FixedSizeOptions
from openipu.poptorch_geometric.pyg_collate import Collater
from openipu.poptorch_geometric.stream_packing_sampler import StreamPackingSampler


class FixedSizeStrategy(Enum):
    """How graphs are grouped into fixed-size batches: ``PadToMax`` (``batch_size - 1`` graphs,
    padded) or ``StreamPack`` (as many consecutive graphs as fit, padded)."""

    PadToMax = 0
    StreamPack = 1


class OverSizeStrategy(Enum):
    """What happens to a batch too large for the fixed sizes: ``Error`` raises, ``Skip`` drops
    graphs that cannot fit (with ``StreamPack``), ``TrimNodes`` / ``TrimEdges`` /
    ``TrimNodesAndEdges`` remove random nodes / edges."""

    Error = 0
    Skip = 1
    TrimNodes = 2
    TrimEdges = 3
    TrimNodesAndEdges = 4


def _trims(over_size_strategy):
    s = OverSizeStrategy(over_size_strategy)
    return (s in (OverSizeStrategy.TrimNodes, OverSizeStrategy.TrimNodesAndEdges),
            s in (OverSizeStrategy.TrimEdges, OverSizeStrategy.TrimNodesAndEdges))


class DataLoader(torch.utils.data.DataLoader):
    """``DataLoader(dataset, batch_size=1, shuffle=False, follow_batch=None,
    exclude_keys=None, **kwargs)``: a torch loader batching PyG graphs with PyG's collater."""

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, follow_batch=None, exclude_keys=None,
                 **kwargs):
        kwargs.pop("collate_fn", None)
        super().__init__(dataset=dataset, batch_size=batch_size, shuffle=shuffle,
                         collate_fn=self._create_collater(follow_batch=follow_batch, exclude_keys=exclude_keys,
                                                          batch_size=batch_size),
                         **kwargs)

    def _create_collater(self, batch_size=None, **collater_args):
        return Collater(**collater_args)


class FixedSizeDataLoader(torch.utils.data.DataLoader):
    """``FixedSizeDataLoader(dataset, batch_size=2, shuffle=False, fixed_size_options=None,
    fixed_size_strategy=FixedSizeStrategy.PadToMax, over_size_strategy=OverSizeStrategy.Error,
    add_pad_masks=True, follow_batch=None, exclude_keys=None, **kwargs)``: batches of
    ``batch_size`` graphs (one or more of them padding) with fixed numbers of nodes and edges
    (:class:`FixedSizeCollater`). ``fixed_size_options`` default to
    ``FixedSizeOptions.from_dataset(dataset, batch_size)``; their ``num_graphs`` must equal
    ``batch_size`` (``AssertionError``). ``PadToMax`` draws ``batch_size - 1`` graphs a batch;
    ``StreamPack`` packs graphs with a :class:`StreamPackingSampler` (a user ``batch_sampler`` is
    then refused with ``ValueError``). A ``collate_fn`` is refused (``AssertionError``)."""

    def __init__(self, dataset, batch_size: int = 2, shuffle: bool = False, fixed_size_options=None,
                 fixed_size_strategy=FixedSizeStrategy.PadToMax, over_size_strategy=OverSizeStrategy.Error,
                 add_pad_masks: bool = True, follow_batch=None, exclude_keys=None, **kwargs):
        assert "collate_fn" not in kwargs, (
            "Cannot set `collate_fn` with `FixedSizeDataLoader`. Consider attaching a "
            "torch_geometric.transforms.Pad transform to the dataset instead and using a plain DataLoader.")
        if fixed_size_options is None:
            fixed_size_options = FixedSizeOptions.from_dataset(dataset, batch_size)
        assert fixed_size_options.num_graphs == batch_size, (
            "`num_graphs` in fixed size options must match provided batch size in dataloader. `num_graphs` is "
            f"{fixed_size_options.num_graphs} but batch size is {batch_size}.")
        first = dataset[0] if len(dataset) else None
        if first is not None and hasattr(first, "node_types") and not fixed_size_options.is_hetero():
            fixed_size_options.to_hetero(first.node_types, first.edge_types)
        self.fixed_size_options = fixed_size_options
        self.fixed_size_strategy = FixedSizeStrategy(fixed_size_strategy)
        self.over_size_strategy = OverSizeStrategy(over_size_strategy)
        trim_nodes, trim_edges = _trims(over_size_strategy)
        user_sampler = kwargs.get("batch_sampler")
        if self.fixed_size_strategy == FixedSizeStrategy.PadToMax:
            torch_batch_size = batch_size - 1
            if user_sampler is not None:
                torch_batch_size, shuffle = 1, None
        elif self.fixed_size_strategy == FixedSizeStrategy.StreamPack:
            if user_sampler is not None:
                raise ValueError(f"Fixed size strategy {self.fixed_size_strategy} is incompatible with the provided "
                                 "batch_sampler. Either use a different strategy or set `batch_sampler` to `None`.")
            base = RandomSampler(dataset) if shuffle else SequentialSampler(dataset)
            kwargs["batch_sampler"] = StreamPackingSampler(
                dataset, batch_size - 1, max_num_nodes=fixed_size_options.total_num_nodes - 1,
                max_num_edges=fixed_size_options.total_num_edges - 1, base_sampler=base,
                allow_skip_data=self.over_size_strategy == OverSizeStrategy.Skip)
            torch_batch_size, shuffle = 1, None
            kwargs.pop("drop_last", None)
        else:
            raise NotImplementedError(f"Fixed size strategy {fixed_size_strategy} is not supported.")
        collater = self._create_collater(
            mini_batch_size=None if kwargs.get("batch_sampler") is not None else batch_size - 1,
            fixed_size_options=fixed_size_options, add_masks_to_batch=add_pad_masks, trim_nodes=trim_nodes,
            trim_edges=trim_edges, follow_batch=follow_batch, exclude_keys=exclude_keys)
        super().__init__(dataset=dataset, batch_size=torch_batch_size, shuffle=shuffle, collate_fn=collater, **kwargs)

    def _create_collater(self, mini_batch_size=None, **collater_args):
        return FixedSizeCollater(**collater_args)
