"""Static-shape versions of PyG's neighbourhood ops (PopTorch Geometric's
``poptorch_geometric.ops``): ``knn``, ``knn_graph``, ``radius``, ``radius_graph``,
``knn_interpolate``. Dense distances and ``topk`` give a fixed number of neighbours per point;
a missing neighbour (fewer points in the graph, or beyond the radius) is index **-1**, as in
PopTorch Geometric. :mod:`.override` puts them in PyG's place while ``poptorch`` captures a
model; on the CPU (no pyg-lib / torch-cluster) :func:`dynamic` versions drop the -1 pairs.

Distances are squared Euclidean (``cosine=True``: 1 - cosine similarity); points of different
graphs (``batch``) never neighbour each other. Ties are broken by ``topk`` (lowest index first
on the CPU), which may differ from torch-cluster's order.
"""

from __future__ import annotations

import torch

from openipu.poptorch._geometric_ops import sqdist

_INF = float("inf")


def _diagonal(n: int, device=None):
    """Bool [n, n], True on the diagonal. Built from int64 ``arange`` rather than ``torch.eye``:
    PyTorch decomposes a bool ``eye`` into an ``arange`` of the narrowest unsigned type that
    holds ``n`` (uint16 past 255 points), which has no CPU kernel to fold the constant with."""
    i = torch.arange(n, device=device)
    return i.view(-1, 1) == i.view(1, -1)


def _distances(x, y, batch_x, batch_y, cosine=False):
    x = x.view(-1, 1) if x.dim() == 1 else x
    y = y.view(-1, 1) if y.dim() == 1 else y
    if cosine:
        xn = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        yn = y / y.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        d = 1.0 - yn @ xn.transpose(0, 1)
    else:
        d = sqdist(y, x)                    # [|y|, |x|]
    if batch_x is not None or batch_y is not None:
        bx = batch_x if batch_x is not None else x.new_zeros(x.shape[0], dtype=torch.long)
        by = batch_y if batch_y is not None else y.new_zeros(y.shape[0], dtype=torch.long)
        d = d.masked_fill(by.view(-1, 1) != bx.view(1, -1), _INF)
    return d


def _pairs(d, k, limit=None):
    """[2, |y| * k]: (y index, x index) of the ``k`` smallest entries per row of ``d``; -1 for
    the x index of entries that are infinite (or above ``limit``), and then for the y index too
    when ``limit`` is given (radius)."""
    k = min(int(k), d.shape[1])
    vals, idx = torch.topk(d, k, dim=1, largest=False)
    bad = torch.isinf(vals) if limit is None else (vals > limit) | torch.isinf(vals)
    col = torch.where(bad, torch.full_like(idx, -1), idx).reshape(-1)
    row = torch.arange(d.shape[0], device=d.device).view(-1, 1).expand(-1, k)
    if limit is not None:
        row = torch.where(bad, torch.full_like(idx, -1), row)
    return torch.stack([row.reshape(-1), col])


def knn(x, y, k: int, batch_x=None, batch_y=None, cosine: bool = False, num_workers: int = 1, batch_size=None):
    """For each row of ``y`` [M, D] its ``k`` nearest rows of ``x`` [N, D]: int64 [2, M * k]
    (row 0: y index, row 1: x index, -1 where there are fewer than ``k`` candidates). Mirrors
    ``torch_geometric.nn.knn`` with PopTorch Geometric's static shape."""
    return _pairs(_distances(x, y, batch_x, batch_y, cosine), k)


def knn_graph(x, k: int, batch=None, loop: bool = False, flow: str = "source_to_target", cosine: bool = False,
              num_workers: int = 1, batch_size=None):
    """The k-NN graph of ``x`` [N, D]: int64 [2, N * k] edges (neighbour -> point for
    ``flow='source_to_target'``), -1 marking missing neighbours. Without ``loop`` a point is not
    its own neighbour (the diagonal is excluded, so the shape stays static). Raises
    ``ValueError`` for an unknown ``flow``."""
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError(f"Invalid flow '{flow}'")
    d = _distances(x, x, batch, batch, cosine)
    if not loop:
        d = d.masked_fill(_diagonal(d.shape[0], d.device), _INF)
    row, col = _pairs(d, k)
    return torch.stack([col, row]) if flow == "source_to_target" else torch.stack([row, col])


def radius(x, y, r: float, batch_x=None, batch_y=None, max_num_neighbors: int = 32, num_workers: int = 1,
           batch_size=None):
    """For each row of ``y`` the rows of ``x`` within distance ``r`` (at most
    ``max_num_neighbors``, nearest first): int64 [2, M * min(N, max_num_neighbors)], pairs
    beyond ``r`` are (-1, -1). Mirrors ``torch_geometric.nn.radius`` (static shape)."""
    return _pairs(_distances(x, y, batch_x, batch_y), max_num_neighbors, limit=float(r) ** 2 + 1e-8)


def radius_graph(x, r: float, batch=None, loop: bool = False, max_num_neighbors: int = 32,
                 flow: str = "source_to_target", num_workers: int = 1, batch_size=None):
    """Edges between rows of ``x`` within distance ``r``: int64 [2, N * min(N,
    max_num_neighbors)], (-1, -1) for unused slots. Mirrors ``torch_geometric.nn.radius_graph``
    (static shape)."""
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError(f"Invalid flow '{flow}'")
    d = _distances(x, x, batch, batch)
    if not loop:
        d = d.masked_fill(_diagonal(d.shape[0], d.device), _INF)
    row, col = _pairs(d, max_num_neighbors, limit=float(r) ** 2 + 1e-8)
    return torch.stack([col, row]) if flow == "source_to_target" else torch.stack([row, col])


def knn_interpolate(x, pos_x, pos_y, batch_x=None, batch_y=None, k: int = 3, num_workers: int = 1):
    """``x`` [N, F] at ``pos_x`` interpolated to ``pos_y`` [M, D] by inverse squared distance
    over the ``k`` nearest points (PyG's ``knn_interpolate``); missing neighbours weigh 0.
    Returns [M, F]."""
    with torch.no_grad():
        y_idx, x_idx = knn(pos_x, pos_y, k, batch_x=batch_x, batch_y=batch_y)
        valid = x_idx >= 0
        xi = x_idx.clamp(min=0)
        diff = pos_x[xi] - pos_y[y_idx]
        sq = (diff * diff).sum(dim=-1, keepdim=True)
        weights = torch.where(valid.unsqueeze(-1), 1.0 / sq.clamp(min=1e-16), torch.zeros_like(sq))
    num = torch.zeros(pos_y.shape[0], x.shape[1], dtype=x.dtype).index_add(0, y_idx, x[xi] * weights)
    den = torch.zeros(pos_y.shape[0], 1, dtype=x.dtype).index_add(0, y_idx, weights)
    return num / den.clamp(min=1e-16)


def _drop_missing(edge_index):
    keep = (edge_index >= 0).all(dim=0)
    return edge_index[:, keep]


def dynamic(fn):
    """``fn`` (one of the static ops above) with its -1 pairs removed: PyG's result shape, for
    eager CPU runs without pyg-lib / torch-cluster."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return _drop_missing(fn(*args, **kwargs))
    wrapper._openipu_dynamic = True
    return wrapper
