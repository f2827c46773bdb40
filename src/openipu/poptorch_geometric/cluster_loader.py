"""``FixedSizeClusterLoader`` (PopTorch Geometric's ``poptorch_geometric.cluster_loader``):
Cluster-GCN batches (several clusters of a ``ClusterData`` merged into one subgraph, as PyG's
``ClusterLoader`` does) padded or trimmed to fixed numbers of nodes and edges. Partitioning
works without METIS (:mod:`openipu.poptorch_geometric.sampling`)."""

from __future__ import annotations

from openipu import poptorch
from openipu.poptorch_geometric.collate import CombinedBatchingCollater, FixedSizeCollater
from openipu.poptorch_geometric.pyg_dataloader import OverSizeStrategy, _trims


class _ClusterCollate:
    def __init__(self, cluster_data, batch_size, collater):
        from torch_geometric.loader import ClusterLoader
        self.inner = ClusterLoader(cluster_data, batch_size=batch_size)
        self.collater = collater

    def __call__(self, index):
        return self.collater([self.inner._collate(list(index))])


class FixedSizeClusterLoader(poptorch.DataLoader):
    """``FixedSizeClusterLoader(cluster_data, fixed_size_options, batch_size=1,
    over_size_strategy=OverSizeStrategy.TrimNodesAndEdges, add_pad_masks=True, options=None,
    **kwargs)``: each mini-batch merges ``batch_size`` clusters of ``cluster_data`` (a PyG
    ``ClusterData``) into one graph and pads it (one padding graph: ``fixed_size_options``
    must say ``num_graphs=2``, else ``AssertionError``). ``collate_fn``, ``batch_sampler``,
    ``shuffle`` and ``exclude_keys`` are refused (``AssertionError``)."""

    def __init__(self, cluster_data, fixed_size_options, batch_size: int = 1,
                 over_size_strategy=OverSizeStrategy.TrimNodesAndEdges, add_pad_masks: bool = True, options=None,
                 **kwargs):
        refused = {k for k in ("collate_fn", "batch_sampler", "shuffle", "exclude_keys") if k in kwargs}
        assert not refused, f"`FixedSizeClusterLoader` does not support the following arguments: {refused}."
        assert fixed_size_options.num_graphs == 2, (
            "The number of graphs in a batch specified by the fixed sized options must be 2 when using the "
            f"FixedSizeClusterLoader, currently it is set to {fixed_size_options.num_graphs}")
        trim_nodes, trim_edges = _trims(over_size_strategy)
        self.fixed_size_options = fixed_size_options
        self.cluster_data = cluster_data
        collater = FixedSizeCollater(fixed_size_options, add_masks_to_batch=add_pad_masks, trim_nodes=trim_nodes,
                                     trim_edges=trim_edges)
        per_batch = _ClusterCollate(cluster_data, batch_size, collater)
        super().__init__(options or poptorch.Options(), range(len(cluster_data)), batch_size=batch_size,
                         collate_fn=CombinedBatchingCollater(per_batch, batch_size), **kwargs)
