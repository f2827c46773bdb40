"""Collaters of PopTorch Geometric (``poptorch_geometric.collate``): :class:`FixedSizeCollater`
pads (or trims) a list of graphs into a batch of fixed numbers of nodes, edges and graphs;
:class:`CombinedBatchingCollater` builds the combined batch of one call of a wrapped model
(``deviceIterations x replicas x gradientAccumulation`` mini-batches concatenated on dim 0)."""

from __future__ import annotations

from typing import List, Optional

import torch
from torch_geometric.data import Batch, Data, HeteroData
from torch_geometric.data.data import BaseData

from openipu.poptorch._utils import combine_batch_tensors_gen
from openipu.poptorch_geometric.fixed_size_options import FixedSizeOptions
from openipu.poptorch_geometric.types import PyGArgsParser


def make_exclude_keys(include_keys, data: BaseData) -> tuple:
    """The keys of ``data`` not in ``include_keys`` (for ``exclude_keys=``)."""
    include = set(include_keys)
    return tuple(k for k in data.keys() if k not in include)


def _divide_evenly(amount: int, pieces: int) -> list:
    """``amount`` split in ``pieces`` parts, the first ``amount % pieces`` one larger."""
    base, rem = divmod(int(amount), pieces)
    return [base + (1 if i < rem else 0) for i in range(pieces)]


def _is_edge_key(store, key, value) -> bool:
    if "edge" in key or "index" in key or "face" in key:
        return store.is_edge_attr(key) if hasattr(store, "is_edge_attr") else True
    return store.is_edge_attr(key) and not store.is_node_attr(key)


def _label_level(data_list) -> Optional[str]:
    """'node' or 'graph' for the ``y`` of ``data_list`` (None when there is no ``y``)."""
    ys = [d.y for d in data_list if isinstance(d, Data) and isinstance(getattr(d, "y", None), torch.Tensor)]
    if not ys or len(ys) != len(data_list):
        return None
    shapes = [(int(y.shape[0]) if y.dim() else 1, int(d.num_nodes)) for y, d in zip(ys, data_list)]
    graph = all(s == 1 for s, _ in shapes)
    node = all(s == n for s, n in shapes)
    if graph:
        return "graph"
    if node:
        return "node"
    raise AssertionError("Incorrect input data. The size of the shape of labels `y` must be either the number of nodes "
                         "or the number of graphs")


class FixedSizeCollater:
    """``FixedSizeCollater(fixed_size_options, add_masks_to_batch=False, trim_nodes=False,
    trim_edges=False, follow_batch=None, exclude_keys=None)``: called on a list of ``Data`` /
    ``HeteroData``, returns a ``Batch`` of exactly ``fixed_size_options.num_graphs`` graphs
    (the real ones first, then padding graphs holding the padding nodes and edges, whose edges
    join padding nodes), ``num_nodes`` nodes and ``num_edges`` edges (per type for hetero).
    As in PopTorch Geometric, padding edges whose padding graph has no node of their type
    (all nodes of the type are real, e.g. after trimming) point one past the last node: out of
    range, so the IPU's scatters drop them; ``edges_mask`` marks them.

    Padding values: node / edge attributes ``node_pad_value`` / ``edge_pad_value``, graph-level
    tensors ``graph_pad_value``, non-tensor attributes ``pad_graph_defaults[key]`` (else the
    first graph's value). ``add_masks_to_batch``: bool ``graphs_mask`` [num_graphs],
    ``nodes_mask`` [num_nodes], ``edges_mask`` [num_edges] (per store for hetero), True for
    real entries. ``trim_nodes`` / ``trim_edges``: drop random nodes / edges (keeping one node
    per graph) from a list too large for the options; trimming nodes keeps one node free for
    the padding graph.

    Raises ``TypeError`` for a non-list, ``RuntimeError`` when the list does not fit (PopTorch
    Geometric's messages), ``AssertionError`` when ``y`` is neither node- nor graph-level."""

    def __init__(self, fixed_size_options: FixedSizeOptions, add_masks_to_batch: bool = False, trim_nodes: bool = False,
                 trim_edges: bool = False, follow_batch=None, exclude_keys=None):
        self.opts = fixed_size_options
        self.add_masks_to_batch = add_masks_to_batch
        self.trim_nodes = trim_nodes
        self.trim_edges = trim_edges
        self.follow_batch = follow_batch
        self.exclude_keys = exclude_keys

    # -- counting ------------------------------------------------------------------------------
    def _hetero(self, data_list) -> bool:
        return isinstance(data_list[0], HeteroData)

    def _limits(self, data_list):
        """(num real nodes, num pad nodes, num real edges, num pad edges): ints, or dicts by type."""
        if not self._hetero(data_list):
            nodes = sum(int(d.num_nodes) for d in data_list)
            edges = sum(int(d.num_edges) for d in data_list)
            return nodes, self.opts.num_nodes - nodes, edges, self.opts.num_edges - edges
        rn, pn, re, pe = {}, {}, {}, {}
        for t in self.opts.num_nodes:
            rn[t] = sum(int(d[t].num_nodes) if t in d.node_types else 0 for d in data_list)
            pn[t] = self.opts.num_nodes[t] - rn[t]
        for t in self.opts.num_edges:
            re[t] = sum(int(d[t].num_edges) if t in d.edge_types else 0 for d in data_list)
            pe[t] = self.opts.num_edges[t] - re[t]
        return rn, pn, re, pe

    # -- trimming ------------------------------------------------------------------------------
    @staticmethod
    def _keep_mask(counts: List[int], keep_total: int, one_per_item: bool) -> torch.Tensor:
        """A bool mask over ``sum(counts)`` elements keeping ``keep_total`` at random (at least
        one of each item's elements when ``one_per_item``), from torch's global RNG."""
        total = sum(counts)
        mask = torch.zeros(total, dtype=torch.bool)
        start = 0
        firsts = []
        if one_per_item:
            for c in counts:
                if c:
                    firsts.append(start + int(torch.randint(c, ())))
                start += c
            mask[firsts] = True
        rest = (~mask).nonzero().flatten()
        need = keep_total - len(firsts)
        if need > 0:
            mask[rest[torch.randperm(len(rest))[:need]]] = True
        return mask

    @staticmethod
    def _counts(data_list, t, kind: str) -> List[int]:
        """Per graph, the number of ``kind`` ('nodes' / 'edges') of type ``t`` (``None``:
        homogeneous; 0 where a graph lacks the type)."""
        types_of = "node_types" if kind == "nodes" else "edge_types"
        return [int(getattr(d[t] if t else d, f"num_{kind}")) if (t is None or t in getattr(d, types_of)) else 0
                for d in data_list]

    @staticmethod
    def _apply_keep_masks(data_list, masks: dict, hetero: bool, kind: str) -> list:
        """Cut each graph down to the elements kept by ``masks`` (type -> (counts, bool mask over
        the batch's ``kind``, 'nodes' or 'edges')): ``Data.subgraph`` / ``edge_subgraph`` with
        the graph's slice of each mask; types without a mask are kept whole."""
        if not masks:
            return data_list
        types_of, cut = ("node_types", "subgraph") if kind == "nodes" else ("edge_types", "edge_subgraph")

        def piece(t, i, d):
            if t not in masks:
                return torch.ones(int(getattr(d[t], f"num_{kind}")), dtype=torch.bool)
            counts, m = masks[t]
            start = sum(counts[:i])
            return m[start:start + counts[i]]
        return [getattr(d, cut)({t: piece(t, i, d) for t in getattr(d, types_of)} if hetero else piece(None, i, d))
                for i, d in enumerate(data_list)]

    def _trim_nodes(self, data_list, num_pad_graphs):
        """Drop random nodes (and their edges) so each node type fits ``num_nodes`` (one kept per
        graph, one left for the padding graph when there is one); ``RuntimeError`` when fewer
        nodes than graphs would remain."""
        hetero = self._hetero(data_list)
        masks = {}
        for t in (list(self.opts.num_nodes) if hetero else [None]):
            counts = self._counts(data_list, t, "nodes")
            limit = self.opts.num_nodes[t] if hetero else self.opts.num_nodes
            target = limit - (1 if num_pad_graphs > 0 else 0)
            if sum(counts) <= limit:
                continue
            if target < len([c for c in counts if c]):
                raise RuntimeError(f"The number of nodes to trim to ({target}) is less than the number of graphs in "
                                   f"the batch ({len(data_list)}), which would result in empty graphs.")
            masks[t] = (counts, self._keep_mask(counts, target, True))
        return self._apply_keep_masks(data_list, masks, hetero, "nodes")

    def _trim_edges(self, data_list):
        """Drop random edges so each edge type fits ``num_edges``."""
        hetero = self._hetero(data_list)
        masks = {}
        for t in (list(self.opts.num_edges) if hetero else [None]):
            counts = self._counts(data_list, t, "edges")
            limit = self.opts.num_edges[t] if hetero else self.opts.num_edges
            if sum(counts) > limit:
                masks[t] = (counts, self._keep_mask(counts, limit, False))
        return self._apply_keep_masks(data_list, masks, hetero, "edges")

    # -- padding graphs ------------------------------------------------------------------------
    def _pad_store(self, src, dst, n, e, kind, level):
        """Fill ``dst`` with the padding versions of ``src``'s attributes (``kind``: 'global',
        'node' or 'edge' store; ``n`` / ``e`` the padding graph's nodes / edges)."""
        opts = self.opts
        excluded = set(self.exclude_keys or ())
        for key in src.keys():
            if key in excluded:
                continue
            value = src[key]
            if key == "num_nodes":
                continue
            if not isinstance(value, torch.Tensor):
                dst[key] = opts.pad_graph_defaults.get(key, value)
                continue
            if key == "y" and level is not None:
                if level == "node":
                    dst[key] = value.new_full((n,) + tuple(value.shape[1:]), opts.node_pad_value)
                else:
                    dst[key] = value.new_full(value.shape, opts.graph_pad_value)
                continue
            is_edge = kind == "edge" or kind == "global" and value.dim() > 0 and _is_edge_key(src, key, value)
            is_node = kind == "node" or kind == "global" and value.dim() > 0 and not is_edge and src.is_node_attr(key)
            if is_edge and key in ("edge_index",) or is_edge and value.dim() == 2 and value.shape[0] == 2 and \
                    not value.is_floating_point() and "index" in key:
                dst[key] = value.new_zeros((2, e))
            elif is_edge:
                dst[key] = value.new_full((e,) + tuple(value.shape[1:]), opts.edge_pad_value)
            elif is_node:
                dst[key] = value.new_full((n,) + tuple(value.shape[1:]), opts.node_pad_value)
            else:
                dst[key] = value.new_full(value.shape, opts.graph_pad_value)

    def _pad_graph(self, template, n, e, level):
        if isinstance(template, HeteroData):
            g = HeteroData()
            self._pad_store(template._global_store, g._global_store, 0, 0, "graph", None)
            for t in template.node_types:
                self._pad_store(template[t], g[t], n.get(t, 0), 0, "node", None)
                g[t].num_nodes = n.get(t, 0)
            for t in template.edge_types:
                self._pad_store(template[t], g[t], 0, e.get(t, 0), "edge", None)
            return g
        g = Data()
        self._pad_store(template._store, g._store, n, e, "global", level)
        g.num_nodes = n
        return g

    # -- the call ------------------------------------------------------------------------------
    def __call__(self, data_list: List[BaseData]) -> Batch:
        if not isinstance(data_list, list):
            raise TypeError(f"Expected list, got {type(data_list).__name__}.")
        hetero = self._hetero(data_list)
        if hetero and not self.opts.is_hetero():
            self.opts.to_hetero(data_list[0].node_types, data_list[0].edge_types)
        level = None if hetero else _label_level(data_list)
        num_real_graphs = len(data_list)
        num_pad_graphs = self.opts.num_graphs - num_real_graphs
        if num_pad_graphs < 0:
            raise RuntimeError("The maximum number of graphs requested doesn't allocate enough room for all the graphs "
                               "in the batch plus at least one extra graph required for padding the batch to a fixed "
                               f"size. The number of graphs received for batching is {num_real_graphs} but the "
                               f"maximum number of graphs, including padding, is set to {self.opts.num_graphs}.")
        _, pad_nodes, _, pad_edges = self._limits(data_list)
        neg = (lambda v: any(x < 0 for x in v.values())) if hetero else (lambda v: v < 0)
        if self.trim_nodes and neg(pad_nodes):
            data_list = self._trim_nodes(data_list, num_pad_graphs)
            _, pad_nodes, _, pad_edges = self._limits(data_list)
        if self.trim_edges and neg(pad_edges):
            data_list = self._trim_edges(data_list)
            _, pad_nodes, _, pad_edges = self._limits(data_list)
        for what, pads, limits in (("nodes", pad_nodes, self.opts.num_nodes), ("edges", pad_edges, self.opts.num_edges)):
            items = pads.items() if hetero else [(None, pads)]
            for t, v in items:
                if v < 0:
                    name = f"{t} {what}" if t is not None else what
                    limit = limits[t] if t is not None else limits
                    raise RuntimeError(
                        f"The fixed sizes given don't allocate enough space for the number of {name} required to fit "
                        f"{num_real_graphs} sample(s) into a batch ({num_real_graphs + num_pad_graphs} including extra "
                        f"padded graph(s)). Increase the maximum number of {name}, currently set to {limit}, or set "
                        f"`trim_{what}` to remove any excess {what} to achieve the given maximum number of {what}.")
        positive = any(v > 0 for v in pad_nodes.values()) or any(v > 0 for v in pad_edges.values()) if hetero \
            else pad_nodes > 0 or pad_edges > 0
        if num_pad_graphs == 0 and positive:
            raise RuntimeError(f"Requested to pad a batch to {self.opts.num_graphs} graphs but collater got a list of "
                               f"{num_real_graphs} graphs and cannot create additional graphs to pad nodes and edges.")
        padded = list(data_list)
        if num_pad_graphs and positive:
            if hetero:
                node_split = {t: _divide_evenly(v, num_pad_graphs) for t, v in pad_nodes.items()}
                edge_split = {t: _divide_evenly(v, num_pad_graphs) for t, v in pad_edges.items()}
                for i in range(num_pad_graphs):
                    n = {t: s[i] for t, s in node_split.items()}
                    e = {t: s[i] for t, s in edge_split.items()}
                    padded.append(self._pad_graph(data_list[0], n, e, None))
            else:
                ns, es = _divide_evenly(pad_nodes, num_pad_graphs), _divide_evenly(pad_edges, num_pad_graphs)
                for n, e in zip(ns, es):
                    padded.append(self._pad_graph(data_list[0], n, e, level))
        batch = Batch.from_data_list(padded, follow_batch=self.follow_batch, exclude_keys=self.exclude_keys)
        if self.add_masks_to_batch:
            self._add_masks(batch, hetero, num_real_graphs, pad_nodes, pad_edges)
        return batch

    def _add_masks(self, batch, hetero, num_real_graphs, pad_nodes, pad_edges):
        batch.graphs_mask = torch.arange(self.opts.num_graphs) < num_real_graphs
        if not hetero:
            batch.nodes_mask = torch.arange(self.opts.num_nodes) < self.opts.num_nodes - max(pad_nodes, 0)
            batch.edges_mask = torch.arange(self.opts.num_edges) < self.opts.num_edges - max(pad_edges, 0)
            return
        for t in batch.node_types:
            n = self.opts.num_nodes[t]
            batch[t].nodes_mask = torch.arange(n) < n - max(pad_nodes.get(t, 0), 0)
        for t in batch.edge_types:
            n = self.opts.num_edges[t]
            batch[t].edges_mask = torch.arange(n) < n - max(pad_edges.get(t, 0), 0)


class CombinedBatchingCollater:
    """``CombinedBatchingCollater(collater, mini_batch_size=None)``: splits the list a
    ``poptorch.DataLoader`` gives (one call's worth: ``batch_size x deviceIterations x
    replicas x gradientAccumulation`` items) into mini-batches of ``mini_batch_size`` (all of
    it when None), collates each with ``collater`` and concatenates their tensors on dim 0
    (``edge_index`` becomes [2k, E] for k mini-batches; the executor splits dim 0 back); the
    result's ``num_nodes`` (per node type) and ``num_edges`` are those of one mini-batch.
    Raises ``AssertionError`` ('Invalid batch size. ...') when the list does not divide."""

    def __init__(self, collater, mini_batch_size: Optional[int] = None):
        self.collater = collater
        self.mini_batch_size = mini_batch_size
        self.parser = PyGArgsParser()

    def __call__(self, batch: list):
        n = len(batch)
        size = self.mini_batch_size if self.mini_batch_size is not None else n
        assert size and n % size == 0, f"Invalid batch size. Got {n} graphs and `mini_batch_size={size}`."
        batches = [self.collater(batch[i:i + size]) for i in range(0, n, size)]
        if len(batches) == 1:
            return batches[0]
        tensors = [list(self.parser.yieldTensors(b)) for b in batches]
        return self.parser.reconstruct(batches[0], combine_batch_tensors_gen(tensors))
