"""``torch.nn`` models the PopTorch tests, benchmarks and the op census share (random weights).

    sys.path.insert(0, "examples/models"); from torch_models import GCN, ResNet18WithLoss, karate_club

- :func:`resnet18`: ``transformers`` ``ResNetForImageClassification`` with ResNet-18's shape
  (``ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], layer_type="basic")``,
  11.7 M parameters at 1000 labels); :class:`ResNet18WithLoss` adds a cross-entropy loss.
  Inputs: ``pixel_values`` float32 ``[N, 3, H, W]``; labels int64 ``[N]``.
- :class:`GCN`: a two-layer ``torch_geometric`` GCN (``GCNConv``), and :func:`karate_club`, its
  graph (34 -> 16 -> 4 on KarateClub), normalised once on the host (``GCNNorm``: self loops and the
  symmetric normalisation build a data-dependent edge list, which a compiled graph cannot).

Parameters are created in a fixed order, so ``torch.manual_seed`` before construction fixes them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resnet18(num_labels: int = 10):
    """ResNet-18 (``transformers`` ``ResNetForImageClassification``, random weights)."""
    from transformers import ResNetConfig, ResNetForImageClassification
    cfg = ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], layer_type="basic", num_labels=num_labels)
    return ResNetForImageClassification(cfg)


class ResNet18WithLoss(torch.nn.Module):
    """:func:`resnet18` (10 labels) and its mean cross-entropy: ``forward(x, y) -> (logits
    float32 [N, 10], loss float32 [])``."""

    def __init__(self, num_labels: int = 10):
        super().__init__()
        self.m = resnet18(num_labels)

    def forward(self, x, y):
        logits = self.m(pixel_values=x).logits
        return logits, F.cross_entropy(logits, y)


class GCN(torch.nn.Module):
    """Two ``GCNConv`` layers (``normalize=False``: give it a normalised graph) with a ReLU
    between: ``forward(x, edge_index, edge_weight, y, mask=None) -> (out float32 [nodes,
    classes], loss float32 [])``. The loss is the mean cross-entropy over all nodes, or with
    ``mask`` (float32 ``[nodes]``, 1 for training nodes) over the masked nodes, returned through
    ``poptorch.identity_loss`` (as a PopTorch training model needs a loss it can name)."""

    def __init__(self, in_features: int, hidden: int, classes: int):
        super().__init__()
        from torch_geometric.nn import GCNConv
        self.c1 = GCNConv(in_features, hidden, normalize=False)
        self.c2 = GCNConv(hidden, classes, normalize=False)

    def forward(self, x, edge_index, edge_weight, y, mask=None):
        h = torch.relu(self.c1(x, edge_index, edge_weight))
        out = self.c2(h, edge_index, edge_weight)
        if mask is None:
            return out, F.cross_entropy(out, y)
        import poptorch
        loss = F.cross_entropy(out, y, reduction="none")
        return out, poptorch.identity_loss((loss * mask).sum() / mask.sum(), reduction="none")


def karate_club():
    """KarateClub (``torch_geometric``'s bundled copy: 34 nodes with 34 features, 4 classes)
    after ``GCNNorm``: self loops added, ``data.edge_weight`` the symmetric normalisation, ready
    for ``GCN(data.num_features, 16, 4)``. Raises ImportError without ``torch_geometric``."""
    from torch_geometric.datasets import KarateClub
    from torch_geometric.transforms import GCNNorm
    return GCNNorm()(KarateClub()[0])
