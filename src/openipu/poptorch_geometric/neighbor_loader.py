"""``FixedSizeNeighborLoader`` (PopTorch Geometric's ``poptorch_geometric.neighbor_loader``):
PyG ``NeighborLoader`` subgraphs padded or trimmed to fixed numbers of nodes and edges. The
sampling works without pyg-lib or torch-sparse (:mod:`openipu.poptorch_geometric.sampling`)."""

from __future__ import annotations

from openipu import poptorch
from openipu.poptorch_geometric.collate import CombinedBatchingCollater, FixedSizeCollater
from openipu.poptorch_geometric.fixed_size_options import FixedSizeOptions
from openipu.poptorch_geometric.pyg_dataloader import OverSizeStrategy, _trims


class PyGFixedSizeNeighborLoader:
    """The sampling and collation of :class:`FixedSizeNeighborLoader` without a loader:
    ``nativeCollate(index)`` samples the subgraph of the seed positions ``index`` (PyG's
    ``NeighborLoader``), ``fixedSizeCollate(data)`` pads it (keeping ``batch_size``,
    ``input_id`` and ``n_id``)."""

    def __init__(self, data, num_neighbors, input_nodes=None, input_time=None, subgraph_type="directional",
                 replace=False, directed=True, disjoint=False, temporal_strategy="uniform", time_attr=None,
                 transform=None, transform_sampler_output=None, is_sorted=False, neighbor_sampler=None,
                 batch_size: int = 1, over_size_strategy=OverSizeStrategy.TrimNodesAndEdges, fixed_size_options=None,
                 add_pad_masks: bool = False, follow_batch=None, exclude_keys=None):
        from torch_geometric.loader import NeighborLoader
        self.neighbor_loader = NeighborLoader(
            data, num_neighbors, input_nodes=input_nodes, input_time=input_time, subgraph_type=subgraph_type,
            replace=replace, directed=directed, disjoint=disjoint, temporal_strategy=temporal_strategy,
            time_attr=time_attr, transform=transform, transform_sampler_output=transform_sampler_output,
            is_sorted=is_sorted, filter_per_worker=True, neighbor_sampler=neighbor_sampler, batch_size=batch_size)
        if fixed_size_options is None:
            fixed_size_options = FixedSizeOptions.from_loader(self.neighbor_loader)
        self.fixed_size_options = fixed_size_options
        self.input_type = self.neighbor_loader.input_data.input_type
        trim_nodes, trim_edges = _trims(over_size_strategy)
        self.collater = FixedSizeCollater(fixed_size_options, add_masks_to_batch=add_pad_masks, trim_nodes=trim_nodes,
                                          trim_edges=trim_edges, follow_batch=follow_batch, exclude_keys=exclude_keys)
        self.num_inputs = len(self.neighbor_loader.input_data.node)

    def nativeCollate(self, index):  # noqa: N802
        """The sampled subgraph (``Data`` / ``HeteroData``) of the seeds at positions ``index``."""
        return self.neighbor_loader.collate_fn(list(index))

    def fixedSizeCollate(self, data):  # noqa: N802
        """``data`` padded to the fixed sizes (a batch of the sample and a padding graph)."""
        store = data[self.input_type] if self.input_type is not None else data
        saved = {k: store[k] for k in ("batch_size", "input_id") if k in store}
        for k in saved:
            del store[k]
        out = self.collater([data])
        target = out[self.input_type] if self.input_type is not None else out
        for k, v in saved.items():
            target[k] = v
        return out

    def __call__(self, index):
        return self.fixedSizeCollate(self.nativeCollate(index))


class FixedSizeNeighborLoader(poptorch.DataLoader):
    """``FixedSizeNeighborLoader(data, num_neighbors, input_nodes=None, ..., batch_size=1,
    over_size_strategy=OverSizeStrategy.TrimNodesAndEdges, fixed_size_options=None,
    add_pad_masks=True, follow_batch=None, exclude_keys=None, options=None, **kwargs)``: the
    subgraphs of PyG's ``NeighborLoader`` (same arguments; ``batch_size`` seeds each), padded to
    ``fixed_size_options`` (default ``FixedSizeOptions.from_loader`` of that loader); the batches
    keep ``n_id``, ``input_id`` and ``batch_size``. Other ``kwargs`` (``shuffle``, ...) go to
    ``poptorch.DataLoader``."""

    def __init__(self, data, num_neighbors, input_nodes=None, input_time=None, subgraph_type="directional",
                 replace=False, directed=True, disjoint=False, temporal_strategy="uniform", time_attr=None,
                 transform=None, transform_sampler_output=None, is_sorted=False, filter_per_worker=None,
                 neighbor_sampler=None, batch_size: int = 1, over_size_strategy=OverSizeStrategy.TrimNodesAndEdges,
                 fixed_size_options=None, add_pad_masks: bool = True, follow_batch=None, exclude_keys=None,
                 options=None, **kwargs):
        self.sampler = PyGFixedSizeNeighborLoader(
            data, num_neighbors, input_nodes=input_nodes, input_time=input_time, subgraph_type=subgraph_type,
            replace=replace, directed=directed, disjoint=disjoint, temporal_strategy=temporal_strategy,
            time_attr=time_attr, transform=transform, transform_sampler_output=transform_sampler_output,
            is_sorted=is_sorted, neighbor_sampler=neighbor_sampler, batch_size=batch_size,
            over_size_strategy=over_size_strategy, fixed_size_options=fixed_size_options, add_pad_masks=add_pad_masks,
            follow_batch=follow_batch, exclude_keys=exclude_keys)
        self.fixed_size_options = self.sampler.fixed_size_options
        kwargs.pop("collate_fn", None)
        super().__init__(options or poptorch.Options(), range(self.sampler.num_inputs), batch_size=batch_size,
                         collate_fn=CombinedBatchingCollater(self.sampler, batch_size), **kwargs)

    def nativeCollate(self, index):  # noqa: N802
        return self.sampler.nativeCollate(index)

    def fixedSizeCollate(self, data):  # noqa: N802
        return self.sampler.fixedSizeCollate(data)
