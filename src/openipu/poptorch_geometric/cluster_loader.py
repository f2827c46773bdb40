"""``FixedSizeClusterLoader`` (PopTorch Geometric's ``poptorch_geometric.cluster_loader``):
Cluster-GCN batches (several clusters of a ``ClusterData`` merged into one subgraph, as PyG's
``ClusterLoader`` does) padded or trimmed to fixed numbers of nodes and edges. Partitioning
works without METIS (:mod:`openipu.poptorch_geometric.sampling`)."""

from __future__ import annotations

from openipu import poptorch
from openipu.poptorch_geometric.collate import CombinedBatchingCollater
from openipu.poptorch_geometric.pyg_cluster_loader import _cluster_collater
from openipu.poptorch_geometric.pyg_dataloader import OverSizeStrategy


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
        per_batch = _cluster_collater(cluster_data, fixed_size_options, batch_size, over_size_strategy,
                                      add_pad_masks, kwargs)
        self.fixed_size_options = fixed_size_options
        self.cluster_data = cluster_data
        super().__init__(options or poptorch.Options(), range(len(cluster_data)), batch_size=batch_size,
                         collate_fn=CombinedBatchingCollater(per_batch, batch_size), **kwargs)
