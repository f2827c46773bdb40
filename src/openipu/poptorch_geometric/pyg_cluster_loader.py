"""``FixedSizeClusterLoader`` on a plain ``torch.utils.data.DataLoader`` (PopTorch Geometric's
``poptorch_geometric.pyg_cluster_loader``): Cluster-GCN batches (``batch_size`` clusters of a PyG
``ClusterData`` merged into one subgraph, as PyG's ``ClusterLoader`` does) padded or trimmed to
fixed numbers of nodes and edges, for a CPU loop or a hand-made IPU feed. The IPU loader is
:class:`openipu.poptorch_geometric.cluster_loader.FixedSizeClusterLoader`. Partitioning works
without METIS (:mod:`openipu.poptorch_geometric.sampling`)."""

from __future__ import annotations

import torch

from openipu.poptorch_geometric.collate import FixedSizeCollater
from openipu.poptorch_geometric.pyg_dataloader import OverSizeStrategy, _trims


class _ClusterCollate:
    """Cluster indices -> one merged ``Data`` (PyG's ``ClusterLoader``) -> a fixed-size batch."""

    def __init__(self, cluster_data, batch_size, collater):
        from torch_geometric.loader import ClusterLoader
        self.inner = ClusterLoader(cluster_data, batch_size=batch_size)
        self.collater = collater

    def __call__(self, index):
        return self.collater([self.inner._collate(list(index))])


def _cluster_collater(cluster_data, fixed_size_options, batch_size, over_size_strategy, add_pad_masks, kwargs):
    """Check the loader arguments (``AssertionError`` with PopTorch Geometric's wording) and
    return the per-mini-batch collate function."""
    refused = {k for k in ("collate_fn", "batch_sampler", "shuffle", "exclude_keys") if k in kwargs}
    assert not refused, f"`FixedSizeClusterLoader` does not support the following arguments: {refused}."
    assert fixed_size_options.num_graphs == 2, (
        "The number of graphs in a batch specified by the fixed sized options must be 2 when using the "
        f"FixedSizeClusterLoader, currently it is set to {fixed_size_options.num_graphs}")
    trim_nodes, trim_edges = _trims(over_size_strategy)
    collater = FixedSizeCollater(fixed_size_options, add_masks_to_batch=add_pad_masks, trim_nodes=trim_nodes,
                                 trim_edges=trim_edges)
    return _ClusterCollate(cluster_data, batch_size, collater)


class FixedSizeClusterLoader(torch.utils.data.DataLoader):
    """``FixedSizeClusterLoader(cluster_data, fixed_size_options, batch_size=1,
    over_size_strategy=OverSizeStrategy.TrimNodesAndEdges, add_pad_masks=False, **kwargs)``:
    each batch merges ``batch_size`` clusters of ``cluster_data`` into one graph and pads it to
    ``fixed_size_options`` (``num_graphs`` must be 2: the graph and one padding graph), so
    node tensors have ``num_nodes`` rows and ``edge_index`` is [2, ``num_edges``].
    ``collate_fn``, ``batch_sampler``, ``shuffle`` and ``exclude_keys`` are refused
    (``AssertionError``)."""

    def __init__(self, cluster_data, fixed_size_options, batch_size: int = 1,
                 over_size_strategy=OverSizeStrategy.TrimNodesAndEdges, add_pad_masks: bool = False, **kwargs):
        collate = _cluster_collater(cluster_data, fixed_size_options, batch_size, over_size_strategy, add_pad_masks,
                                    kwargs)
        self.fixed_size_options = fixed_size_options
        self.cluster_data = cluster_data
        super().__init__(range(len(cluster_data)), batch_size=batch_size, collate_fn=collate, **kwargs)
