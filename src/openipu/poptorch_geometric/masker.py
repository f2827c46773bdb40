"""Maskers (PopTorch Geometric's ``poptorch_geometric.masker``): objects that apply the padding
masks of a fixed-size batch (``nodes_mask`` [num_nodes] bool, ``edges_mask`` [num_edges],
``graphs_mask`` [num_graphs]; True for real entries) to node, edge or graph entries, and
wrappers that apply a masker to a layer's inputs.

As in PopTorch Geometric the loaders do not use them; :class:`NoMasker` leaves entries as they
are and :class:`PreLayerMasker` runs a masker over a layer's positional inputs before the layer.
:class:`MaskMasker` is an openipu addition that zeros the padded rows.
"""

from __future__ import annotations

import abc
import functools
from typing import Any, Callable, Optional, Tuple, Union

import torch

#: a tensor or a tuple of tensors (a layer's positional inputs)
Entries = Union[torch.Tensor, Tuple[torch.Tensor, ...]]
#: a callable taking entries
Layer = Callable[..., Any]


class Masker(abc.ABC):
    """Applies a mask to node, edge or graph entries: each method takes ``entries`` (a tensor
    or a tuple of tensors whose dim 0 runs over nodes / edges / graphs) and an optional
    ``mask`` and returns entries of the same structure."""

    @abc.abstractmethod
    def node_masker(self, entries: Entries, mask: Optional[torch.Tensor] = None) -> Entries:
        """``entries`` with the node mask applied."""

    @abc.abstractmethod
    def edge_masker(self, entries: Entries, mask: Optional[torch.Tensor] = None) -> Entries:
        """``entries`` with the edge mask applied."""

    @abc.abstractmethod
    def graph_masker(self, entries: Entries, mask: Optional[torch.Tensor] = None) -> Entries:
        """``entries`` with the graph mask applied."""


class NoMasker(Masker):
    """The masker that changes nothing: every method returns ``entries`` itself."""

    def node_masker(self, entries: Entries, mask: Optional[torch.Tensor] = None) -> Entries:
        return entries

    def edge_masker(self, entries: Entries, mask: Optional[torch.Tensor] = None) -> Entries:
        return entries

    def graph_masker(self, entries: Entries, mask: Optional[torch.Tensor] = None) -> Entries:
        return entries


def _zero_padded(entry: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    keep = mask.reshape([-1] + [1] * (entry.dim() - 1))
    return torch.where(keep, entry, torch.zeros((), dtype=entry.dtype))


class MaskMasker(Masker):
    """openipu: zeros the rows whose mask is False (``torch.where``, static shapes). The masks
    are given at construction (from a padded batch) or per call. Raises ``ValueError`` when no
    mask is known for the kind of entry."""

    def __init__(self, nodes_mask=None, edges_mask=None, graphs_mask=None):
        self.masks = {"node": nodes_mask, "edge": edges_mask, "graph": graphs_mask}

    def _apply(self, kind: str, entries: Entries, mask) -> Entries:
        mask = self.masks[kind] if mask is None else mask
        if mask is None:
            raise ValueError(f"MaskMasker: no {kind} mask")
        if isinstance(entries, tuple):
            return tuple(_zero_padded(e, mask) for e in entries)
        return _zero_padded(entries, mask)

    def node_masker(self, entries: Entries, mask: Optional[torch.Tensor] = None) -> Entries:
        return self._apply("node", entries, mask)

    def edge_masker(self, entries: Entries, mask: Optional[torch.Tensor] = None) -> Entries:
        return self._apply("edge", entries, mask)

    def graph_masker(self, entries: Entries, mask: Optional[torch.Tensor] = None) -> Entries:
        return self._apply("graph", entries, mask)


class LayerMasker(abc.ABC):
    """Turns a layer into a masked layer: each method takes a :data:`Layer` and returns a
    callable with the same signature."""

    @abc.abstractmethod
    def node_masker(self, layer: Layer) -> Layer:
        """``layer`` with node masking."""

    @abc.abstractmethod
    def edge_masker(self, layer: Layer) -> Layer:
        """``layer`` with edge masking."""

    @abc.abstractmethod
    def graph_masker(self, layer: Layer) -> Layer:
        """``layer`` with graph masking."""


class PreLayerMasker(LayerMasker):
    """Masks a layer's positional inputs with ``masker`` (a :class:`Masker`) before calling it;
    keyword arguments pass through unmasked."""

    def __init__(self, masker: Masker):
        self.masker = masker

    def _wrap(self, kind: str, layer: Layer) -> Layer:
        apply = getattr(self.masker, f"{kind}_masker")

        @functools.wraps(layer)
        def masked(*args, **kwargs):
            entries = apply(args[0] if len(args) == 1 else tuple(args))
            return layer(*(entries if isinstance(entries, tuple) else (entries,)), **kwargs)
        return masked

    def node_masker(self, layer: Layer) -> Layer:
        return self._wrap("node", layer)

    def edge_masker(self, layer: Layer) -> Layer:
        return self._wrap("edge", layer)

    def graph_masker(self, layer: Layer) -> Layer:
        return self._wrap("graph", layer)
