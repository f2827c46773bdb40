"""``FixedSizeOptions``: the fixed numbers of nodes, edges and graphs of the padded batches
(PopTorch Geometric's ``poptorch_geometric.fixed_size_options``)."""

from __future__ import annotations

import itertools


def _total(v) -> int:
    return int(sum(v.values())) if isinstance(v, dict) else int(v)


class FixedSizeOptions:
    """``FixedSizeOptions(num_nodes, num_edges=None, num_graphs=2, node_pad_value=None,
    edge_pad_value=None, graph_pad_value=None, pad_graph_defaults=None)``.

    ``num_nodes`` / ``num_edges``: the nodes and edges of one padded batch, ints or (for
    heterogeneous graphs) dicts per node / edge type; ``num_edges`` defaults to ``n * (n - 1)``
    (``n`` the total number of nodes). ``num_graphs`` counts the graph reserved for padding, so
    it must be at least 2 (``ValueError`` otherwise). Pad values default to 0.0; values of the
    padding graphs' non-tensor attributes come from ``pad_graph_defaults`` (by key)."""

    def __init__(self, num_nodes, num_edges=None, num_graphs: int = 2, node_pad_value=None, edge_pad_value=None,
                 graph_pad_value=None, pad_graph_defaults=None):
        if num_graphs < 2:
            raise ValueError("The number of graphs in the batch must be at least 2. This is to ensure the batch "
                             "contains at least 1 real graph and a graph reserved for padding the batch to a fixed "
                             "size.")
        self.num_nodes = num_nodes
        if not num_edges:
            n = _total(num_nodes)
            num_edges = n * (n - 1)
        self.num_edges = num_edges
        self.num_graphs = num_graphs
        self.node_pad_value = 0.0 if node_pad_value is None else node_pad_value
        self.edge_pad_value = 0.0 if edge_pad_value is None else edge_pad_value
        self.graph_pad_value = 0.0 if graph_pad_value is None else graph_pad_value
        self.pad_graph_defaults = {} if pad_graph_defaults is None else pad_graph_defaults

    # -- heterogeneous graphs ------------------------------------------------------------------
    def is_hetero(self) -> bool:
        """True when both ``num_nodes`` and ``num_edges`` are per-type dicts."""
        return isinstance(self.num_nodes, dict) and isinstance(self.num_edges, dict)

    def to_hetero(self, node_types, edge_types) -> "FixedSizeOptions":
        """Turn int counts into per-type dicts (the same count for each type); returns self."""
        if not isinstance(self.num_nodes, dict):
            self.num_nodes = {t: self.num_nodes for t in node_types}
        if not isinstance(self.num_edges, dict):
            self.num_edges = {t: self.num_edges for t in edge_types}
        return self

    @property
    def total_num_nodes(self) -> int:
        """The nodes of a batch, summed over the node types."""
        return _total(self.num_nodes)

    @property
    def total_num_edges(self) -> int:
        """The edges of a batch, summed over the edge types."""
        return _total(self.num_edges)

    # -- from data -----------------------------------------------------------------------------
    @classmethod
    def from_dataset(cls, dataset, batch_size: int, sample_limit=None, progress_bar=None) -> "FixedSizeOptions":
        """Options that fit any ``batch_size - 1`` graphs of ``dataset`` plus a padding graph:
        per (node / edge type) ``max * (batch_size - 1) + 1``, ``num_graphs = batch_size``.
        Raises ``ValueError`` for ``batch_size < 2``."""
        from torch_geometric.data.summary import Summary
        if not isinstance(batch_size, int) or batch_size < 2:
            raise ValueError(f"Invalid value for batch_size: {batch_size}. It must be an integer of at least 2 (one "
                             "graph of the batch is reserved for padding).")
        summary = Summary.from_dataset(dataset, progress_bar=progress_bar)
        real = batch_size - 1

        def limit(stats) -> int:
            return int(stats.max) * real + 1
        if summary.num_nodes_per_type is not None and summary.num_edges_per_type is not None:
            nodes = {t: limit(s) for t, s in summary.num_nodes_per_type.items()}
            edges = {t: limit(s) for t, s in summary.num_edges_per_type.items()}
        else:
            nodes, edges = limit(summary.num_nodes), limit(summary.num_edges)
        return cls(num_nodes=nodes, num_edges=edges, num_graphs=batch_size)

    @classmethod
    def from_loader(cls, loader, sample_limit: int = 1000) -> "FixedSizeOptions":
        """Options that fit the largest of the first ``sample_limit`` batches of ``loader``
        (cycled if shorter), plus one node, edge and graph for padding."""
        max_nodes, max_edges, max_graphs = None, None, 1
        for sample in itertools.islice(itertools.cycle(loader), sample_limit):
            if hasattr(sample, "node_types"):       # HeteroData
                nodes = {t: int(sample[t].num_nodes) for t in sample.node_types}
                edges = {t: int(sample[t].num_edges) for t in sample.edge_types}
                max_nodes = nodes if max_nodes is None else {t: max(v, max_nodes.get(t, 0)) for t, v in nodes.items()}
                max_edges = edges if max_edges is None else {t: max(v, max_edges.get(t, 0)) for t, v in edges.items()}
            else:
                max_nodes = max(max_nodes or 0, int(sample.num_nodes))
                max_edges = max(max_edges or 0, int(sample.num_edges))
            max_graphs = max(max_graphs, int(getattr(sample, "num_graphs", 1) or 1))
        if max_nodes is None:
            raise ValueError("FixedSizeOptions.from_loader: the loader gave no samples")
        if isinstance(max_nodes, dict):
            max_nodes = {t: v + 1 for t, v in max_nodes.items()}
            max_edges = {t: v + 1 for t, v in max_edges.items()}
        else:
            max_nodes, max_edges = max_nodes + 1, max_edges + 1
        return cls(num_nodes=max_nodes, num_edges=max_edges, num_graphs=max_graphs + 1)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_nodes={self.num_nodes} (At least one node reserved for padding), "
                f"num_edges={self.num_edges} (At least one edge reserved for padding), "
                f"num_graphs={self.num_graphs} (At least one graph reserved for padding), "
                f"node_pad_value={self.node_pad_value}, edge_pad_value={self.edge_pad_value}, "
                f"graph_pad_value={self.graph_pad_value}, pad_graph_defaults={self.pad_graph_defaults})")
