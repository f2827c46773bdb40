"""``poptorch.fps`` and ``poptorch.nearest``: the point-cloud ops of torch-cluster with static
output shapes, as PopTorch provides them for PyG models (``research/poptorch_geometric.md``
2.2). Both are plain torch code, so they run eagerly on the CPU and capture into a static IPU
graph (dense distances, ``argmin`` / ``argmax``)."""

from __future__ import annotations

import math

import torch


def sqdist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances [N, M] between the rows of ``x`` [N, D] and ``y`` [M, D],
    as a matmul (static, and cheap on the IPU's AMP units)."""
    d = (x * x).sum(-1, keepdim=True) - 2.0 * x @ y.transpose(0, 1) + (y * y).sum(-1).unsqueeze(0)
    return d.clamp(min=0.0)


def fps(src: torch.Tensor, ptr, ratio: float = 0.5, random_start: bool = False) -> torch.Tensor:
    """Farthest point sampling (torch-cluster's ``fps``): for each point cloud ``i`` (points
    ``src[ptr[i]:ptr[i+1]]``, ``src`` [N, D] float) pick ``ceil(ratio * n_i)`` points, each the
    farthest (squared Euclidean) from those already picked, starting at the first point (or a
    random one with ``random_start``). Returns the picked global indices, int64
    [sum_i ceil(ratio * n_i)], cloud by cloud. ``ptr`` is a list of ints (the sizes are static).
    Raises ``ValueError`` for a ``ptr`` that is not a list of at least 2 ints or a ``ratio``
    outside (0, 1]. Mirrors ``poptorch.fps``."""
    if not isinstance(ptr, (list, tuple)) or not all(isinstance(p, int) for p in ptr):
        raise ValueError("`ptr` must be a list of integers.")
    if len(ptr) < 2:
        raise ValueError("`ptr` must containt at least 2 elements.")
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"`ratio` must be in (0, 1], got {ratio}.")
    out = []
    for lo, hi in zip(ptr[:-1], ptr[1:]):
        n = hi - lo
        if n <= 0:
            continue
        pts = src[lo:hi]
        k = int(math.ceil(ratio * n))
        start = int(torch.randint(n, ())) if random_start else 0
        picked = [torch.tensor(start)]
        dist = ((pts - pts[start]) ** 2).sum(-1)
        for _ in range(k - 1):
            nxt = torch.argmax(dist)
            picked.append(nxt)
            dist = torch.minimum(dist, ((pts - pts[nxt]) ** 2).sum(-1))
        out.append(torch.stack(picked) + lo)
    return torch.cat(out).to(torch.long) if out else torch.zeros(0, dtype=torch.long)


def _batch_tensor(batch, n: int, name: str, device):
    if batch is None:
        return torch.zeros(n, dtype=torch.long, device=device), None
    if isinstance(batch, (list, tuple)):
        if len(batch) != n:
            raise ValueError(f"`{name}` must hold one graph index per point ({n}), got {len(batch)}.")
        if any(b > a for a, b in zip(batch[1:], batch[:-1])):
            raise ValueError(f"`{name}` must be sorted.")
        return torch.tensor(batch, dtype=torch.long, device=device), set(batch)
    return batch.to(torch.long), None


def nearest(x: torch.Tensor, y: torch.Tensor, batch_x=None, batch_y=None) -> torch.Tensor:
    """For each point of ``x`` [N, D] the index (int64 [N]) of the nearest point of ``y``
    [M, D] in the same graph (torch-cluster's ``nearest``). ``batch_x`` / ``batch_y``: graph
    index per point, as tensors or lists; lists are checked (``ValueError`` if unsorted, or a
    graph has points in one of ``x`` / ``y`` only). Mirrors ``poptorch.nearest``."""
    if x.dim() == 1:
        x = x.unsqueeze(-1)
    if y.dim() == 1:
        y = y.unsqueeze(-1)
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"`x` and `y` must have the same number of features, got {x.shape[-1]} and {y.shape[-1]}.")
    bx, gx = _batch_tensor(batch_x, x.shape[0], "batch_x", x.device)
    by, gy = _batch_tensor(batch_y, y.shape[0], "batch_y", y.device)
    if gx is not None and gy is not None and gx != gy:
        raise ValueError("Some batch indices occur only in `batch_x` or only in `batch_y`.")
    d = sqdist(x.to(torch.float32), y.to(torch.float32))
    d = d.masked_fill(bx.unsqueeze(1) != by.unsqueeze(0), float("inf"))
    return torch.argmin(d, dim=1)
