"""Neighbour sampling and graph partitioning without pyg-lib or torch-sparse.

PyG 2.8's ``NeighborSampler`` (``NeighborLoader``) and ``ClusterData`` (``ClusterLoader``) call
compiled kernels of pyg-lib or torch-sparse and raise ``ImportError`` when neither is installed
(neither has wheels for torch 2.13). :func:`install` (run at ``import poptorch_geometric``, or on
the first partition / sample by the start-up hook ``openipu_pyg_hook`` when PyG is used before
``poptorch_geometric`` is imported) fills that gap, only when both are missing:

* ``NeighborSampler._sample`` gets a numpy path with torch-sparse's ``neighbor_sample`` /
  ``hetero_neighbor_sample`` semantics: seeds first, then each hop's new nodes in the order
  found; for every node of the frontier up to ``k`` of its in-neighbours (all when ``k < 0``
  or the degree is at most ``k``; without replacement unless ``replace``), drawn with torch's
  global RNG; ``row`` / ``col`` are local source / destination indices, ``edge`` the CSC
  positions (PyG maps them back). ``subgraph_type='induced'`` keeps every edge between the
  sampled nodes. ``disjoint`` and temporal or weighted sampling raise ``ValueError`` /
  ``ImportError`` as PyG does without pyg-lib.
* ``ClusterData._metis`` gets a partitioner standing in for METIS: nodes ordered by
  breadth-first search (each component from its lowest-degree node), the order cut into
  ``num_parts`` contiguous parts of equal size. Parts are balanced and connected-ish; their edge
  cut is larger than METIS's, so Cluster-GCN batches keep fewer edges than with METIS.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch


def _pick(lo: int, hi: int, k: int, replace: bool) -> np.ndarray:
    """Positions in [lo, hi) drawn for one node: all of them, or ``k`` at random."""
    deg = hi - lo
    if deg == 0 or k == 0:
        return np.empty(0, np.int64)
    if k < 0 or (deg <= k and not replace):
        return np.arange(lo, hi, dtype=np.int64)
    if replace:
        return lo + torch.randint(deg, (k,)).numpy().astype(np.int64)
    return lo + torch.randperm(deg)[:k].numpy().astype(np.int64)


class _Nodes:
    """The sampled nodes of one type: global ids in order, and global id -> local index."""

    def __init__(self):
        self.ids: list = []
        self.local: dict = {}

    def add(self, g: int) -> tuple:
        """(local index, True if new)."""
        i = self.local.get(g)
        if i is not None:
            return i, False
        i = len(self.ids)
        self.local[g] = i
        self.ids.append(g)
        return i, True


def neighbor_sample(colptr: torch.Tensor, row: torch.Tensor, seed: torch.Tensor, num_neighbors, replace: bool,
                    directed: bool):
    """Homogeneous sampling: (node, row, col, edge) int64 tensors (``module docstring``).
    ``colptr`` [N+1] and ``row`` [E] are the CSC of the graph, ``seed`` [S] global node ids,
    ``num_neighbors`` one count per hop."""
    cp, rw = colptr.numpy(), row.numpy()
    nodes = _Nodes()
    frontier = []
    for s in seed.tolist():
        i, new = nodes.add(int(s))
        if new:
            frontier.append(int(s))
    rows, cols, edges = [], [], []
    for k in num_neighbors:
        nxt = []
        for dst in frontier:
            dst_local = nodes.local[dst]
            for e in _pick(int(cp[dst]), int(cp[dst + 1]), int(k), replace):
                src = int(rw[e])
                i, new = nodes.add(src)
                if new:
                    nxt.append(src)
                if directed:
                    rows.append(i)
                    cols.append(dst_local)
                    edges.append(int(e))
        frontier = nxt
    node = torch.tensor(nodes.ids, dtype=torch.long)
    if not directed:        # induced: all edges between sampled nodes
        rows, cols, edges = [], [], []
        for dst_local, dst in enumerate(nodes.ids):
            for e in range(int(cp[dst]), int(cp[dst + 1])):
                i = nodes.local.get(int(rw[e]))
                if i is not None:
                    rows.append(i)
                    cols.append(dst_local)
                    edges.append(e)
    t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return node, t(rows), t(cols), t(edges)


def hetero_neighbor_sample(node_types, edge_types, colptr_dict, row_dict, seed_dict, num_neighbors_dict,
                           num_hops: int, replace: bool, directed: bool):
    """Heterogeneous sampling: (node dict by node type; row, col, edge dicts by relation
    string ``src__rel__dst``), as torch-sparse's ``hetero_neighbor_sample``."""
    nodes = {t: _Nodes() for t in node_types}
    frontier = {t: [] for t in node_types}
    for t, s in seed_dict.items():
        for g in s.tolist():
            _, new = nodes[t].add(int(g))
            if new:
                frontier[t].append(int(g))
    rels = [(et, "__".join(et)) for et in edge_types]
    out = {r: ([], [], []) for _, r in rels}
    for hop in range(num_hops):
        nxt = {t: [] for t in node_types}
        for et, r in rels:
            src_t, _, dst_t = et
            ks = num_neighbors_dict[r] if r in num_neighbors_dict else num_neighbors_dict[et]
            k = int(ks[hop]) if hop < len(ks) else 0
            cp, rw = colptr_dict[r].numpy(), row_dict[r].numpy()
            rows, cols, edges = out[r]
            for dst in frontier[dst_t]:
                dst_local = nodes[dst_t].local[dst]
                for e in _pick(int(cp[dst]), int(cp[dst + 1]), k, replace):
                    src = int(rw[e])
                    i, new = nodes[src_t].add(src)
                    if new:
                        nxt[src_t].append(src)
                    if directed:
                        rows.append(i)
                        cols.append(dst_local)
                        edges.append(int(e))
        frontier = nxt
    if not directed:
        for et, r in rels:
            src_t, _, dst_t = et
            cp, rw = colptr_dict[r].numpy(), row_dict[r].numpy()
            rows, cols, edges = [], [], []
            for dst_local, dst in enumerate(nodes[dst_t].ids):
                for e in range(int(cp[dst]), int(cp[dst + 1])):
                    i = nodes[src_t].local.get(int(rw[e]))
                    if i is not None:
                        rows.append(i)
                        cols.append(dst_local)
                        edges.append(e)
            out[r] = (rows, cols, edges)
    t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    node = {nt: t(n.ids) for nt, n in nodes.items()}
    return (node, {r: t(v[0]) for r, v in out.items()}, {r: t(v[1]) for r, v in out.items()},
            {r: t(v[2]) for r, v in out.items()})


def partition(edge_index: torch.Tensor, num_nodes: int, num_parts: int) -> torch.Tensor:
    """A part id per node ([num_nodes] int64): breadth-first order cut into ``num_parts``
    contiguous parts of (nearly) equal size (``module docstring``)."""
    src, dst = edge_index.numpy()
    adj = [[] for _ in range(num_nodes)]
    for a, b in zip(src.tolist(), dst.tolist()):
        adj[a].append(b)
        adj[b].append(a)
    deg = np.array([len(a) for a in adj])
    seen = np.zeros(num_nodes, bool)
    order = []
    for start in np.argsort(deg, kind="stable").tolist():
        if seen[start]:
            continue
        seen[start] = True
        q = deque([start])
        while q:
            v = q.popleft()
            order.append(v)
            for u in adj[v]:
                if not seen[u]:
                    seen[u] = True
                    q.append(u)
    cluster = np.empty(num_nodes, np.int64)
    cluster[np.array(order, np.int64)] = (np.arange(num_nodes) * num_parts) // max(num_nodes, 1)
    return torch.from_numpy(cluster)


def _have_native() -> bool:
    import torch_geometric.typing as tgt
    return bool(tgt.WITH_PYG_LIB or tgt.WITH_TORCH_SPARSE)


def install() -> None:
    """Give PyG's ``NeighborSampler`` and ``ClusterData`` the numpy paths above when neither
    pyg-lib nor torch-sparse is installed (idempotent)."""
    if _have_native():
        return
    from torch_geometric.loader.cluster import ClusterData
    from torch_geometric.sampler import NeighborSampler
    from torch_geometric.sampler.base import HeteroSamplerOutput, SamplerOutput, SubgraphType
    from torch_geometric.sampler.utils import remap_keys
    if getattr(NeighborSampler._sample, "_openipu", False):
        return
    # PyG's own method, also when openipu_pyg_hook's first-use stand-in is in its place
    native = getattr(NeighborSampler._sample, "_openipu_native", NeighborSampler._sample)

    def _sample(self, seed, seed_time=None, **kwargs):
        if seed_time is not None or getattr(self, "node_time", None) is not None or \
                getattr(self, "edge_time", None) is not None or getattr(self, "edge_weight", None) is not None:
            return native(self, seed, seed_time, **kwargs)
        if self.disjoint:
            raise ValueError("'disjoint' sampling is not supported without 'pyg-lib'")
        directed = self.subgraph_type != SubgraphType.induced
        if isinstance(seed, dict):
            node, row, col, edge = hetero_neighbor_sample(
                self.node_types, self.edge_types, self.colptr_dict, self.row_dict, seed,
                self.num_neighbors.get_mapped_values(self.edge_types), self.num_neighbors.num_hops, self.replace,
                directed)
            if self.sample_direction == "backward":
                row, col = col, row
            row, col, edge = (remap_keys(v, self.to_edge_type) for v in (row, col, edge))
            if self.sample_direction == "backward":
                row, col, edge = (remap_keys(v, self.to_restored_edge_type) for v in (row, col, edge))
            return HeteroSamplerOutput(node=node, row=row, col=col, edge=edge, batch=None)
        node, row, col, edge = neighbor_sample(self.colptr, self.row, seed, self.num_neighbors.get_mapped_values(),
                                               self.replace, directed)
        if self.sample_direction == "backward":
            row, col = col, row
        return SamplerOutput(node=node, row=row, col=col, edge=edge, batch=None)
    _sample._openipu = True
    NeighborSampler._sample = _sample

    def _metis(self, edge_index, num_nodes):
        return partition(edge_index.cpu(), int(num_nodes), int(self.num_parts)).to(edge_index.device)
    _metis._openipu = True
    ClusterData._metis = _metis
