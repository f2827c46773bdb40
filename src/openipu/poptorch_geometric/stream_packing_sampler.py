"""``StreamPackingSampler``: packs consecutive graphs into batches that fit fixed numbers of
nodes, edges and graphs (PopTorch Geometric's ``poptorch_geometric.stream_packing_sampler``)."""

from __future__ import annotations

from typing import Iterator, List, Optional

import torch
from torch.utils.data import RandomSampler, Sampler, SequentialSampler


class StreamPackingSampler(Sampler):
    """``StreamPackingSampler(data_source, max_num_graphs, max_num_nodes=None,
    max_num_edges=None, base_sampler=None, allow_skip_data=False)``: a batch sampler yielding
    lists of indices. Graphs are taken in ``base_sampler``'s order (default sequential) and added
    to the current pack while it stays within ``max_num_graphs`` graphs and ``max_num_nodes`` /
    ``max_num_edges`` (defaults: ``max_num_graphs`` times the largest graph) with at least one
    node and one edge left for each graph slot still free; a graph that does not fit closes
    the pack and starts the next. A graph too large for an empty pack raises ``RuntimeError``,
    or is skipped with ``allow_skip_data``."""

    def __init__(self, data_source, max_num_graphs: int, max_num_nodes: Optional[int] = None,
                 max_num_edges: Optional[int] = None, base_sampler: Optional[Sampler] = None,
                 allow_skip_data: bool = False):
        super().__init__()
        self.data_source = data_source
        self.max_num_graphs = int(max_num_graphs)
        self._sizes = None
        if max_num_nodes is None or max_num_edges is None:
            nodes, edges = zip(*self._all_sizes())
            if max_num_nodes is None:
                max_num_nodes = max(nodes) * self.max_num_graphs
            if max_num_edges is None:
                max_num_edges = max(edges) * self.max_num_graphs
        self.max_num_nodes = int(max_num_nodes)
        self.max_num_edges = int(max_num_edges)
        self.base_sampler = base_sampler if base_sampler is not None else SequentialSampler(data_source)
        self.allow_skip_data = allow_skip_data

    def _all_sizes(self):
        if self._sizes is None:
            self._sizes = [self._size(self.data_source[i]) for i in range(len(self.data_source))]
        return self._sizes

    @staticmethod
    def _size(data):
        return int(data.num_nodes), int(data.num_edges)

    def _fits(self, pack_nodes, pack_edges, pack_graphs, nodes, edges) -> bool:
        graphs = pack_graphs + 1
        free = self.max_num_graphs - graphs
        return (graphs <= self.max_num_graphs and pack_nodes + nodes + free <= self.max_num_nodes
                and pack_edges + edges <= self.max_num_edges)

    def __iter__(self) -> Iterator[List[int]]:
        pack: List[int] = []
        pack_nodes = pack_edges = 0
        for idx in self.base_sampler:
            idx = int(idx)
            nodes, edges = self._sizes[idx] if self._sizes is not None else self._size(self.data_source[idx])
            if not self._fits(0, 0, 0, nodes, edges):
                if self.allow_skip_data:
                    continue
                raise RuntimeError(f"The graph at index {idx} ({nodes} nodes, {edges} edges) does not fit in an empty "
                                   f"pack (max_num_nodes={self.max_num_nodes}, max_num_edges={self.max_num_edges}, "
                                   f"max_num_graphs={self.max_num_graphs}). Increase the limits or set "
                                   "allow_skip_data=True to skip such graphs.")
            if pack and not self._fits(pack_nodes, pack_edges, len(pack), nodes, edges):
                yield pack
                pack, pack_nodes, pack_edges = [], 0, 0
            pack.append(idx)
            pack_nodes += nodes
            pack_edges += edges
        if pack:
            yield pack

    def __len__(self) -> int:
        return sum(1 for _ in self)


def random_base_sampler(data_source, generator: Optional[torch.Generator] = None) -> RandomSampler:
    """The shuffling base sampler the loaders use for ``shuffle=True``."""
    return RandomSampler(data_source, generator=generator)
