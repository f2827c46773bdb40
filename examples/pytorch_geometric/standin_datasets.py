"""Generated stand-ins for the PyG datasets Graphcore's PyG tutorials download (Cora / CiteSeer /
PubMed, MUTAG, QM9, IMDB), with the real datasets' constructor arguments, tensor names, dtypes,
feature widths and class counts; contents are random but seeded and class-dependent (labels are
learnable from the features / structure), so losses can fall. Nothing is read from or written
to ``root``.

=================  ==========================================================================
stand-in           contents (scale 1)
=================  ==========================================================================
Planetoid Cora     2,708 nodes, 1,433 binary features, 7 classes, ~10.5k directed edges,
                   ``train_mask`` (20 per class) / ``val_mask`` (500) / ``test_mask`` (1,000)
Planetoid PubMed   19,717 nodes, 500 features, 3 classes, ~88k directed edges; CiteSeer 3,327 /
                   3,703 / 6
TUDataset MUTAG    188 molecules, 10-28 atoms, ``x`` one-hot [n, 7], ``edge_attr`` one-hot
                   [E, 4], ``y`` [1] in {0, 1}
QM9                ``n`` molecules (default 1,270) of 3-29 atoms: ``x`` [n, 11], ``z``, ``pos``
                   [n, 3], ``edge_attr`` [E, 4], ``y`` [1, 19] float, ``name``, ``idx``
IMDB               ``HeteroData``: movie 4,278 / director 2,081 / actor 5,257 nodes with 3,066
                   binary features, movie ``y`` (3 classes) and masks, movie<->director (4,278)
                   and movie<->actor (12,828) edges both ways
=================  ==========================================================================

``scale`` multiplies the node (and edge) counts of Planetoid and IMDB.
"""

from __future__ import annotations

import torch
from torch_geometric.data import Data, HeteroData, InMemoryDataset
from torch_geometric.utils import coalesce, to_undirected

_PLANETOID = {"cora": (2708, 1433, 7, 10556), "citeseer": (3327, 3703, 6, 9104), "pubmed": (19717, 500, 3, 88648)}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _class_graph(y: torch.Tensor, num_edges: int, g: torch.Generator, same_class: float = 0.8) -> torch.Tensor:
    """Undirected edges (both directions, coalesced, no self loops); ``same_class`` of them join
    nodes of the same class. About ``num_edges`` directed edges."""
    n = y.numel()
    half = num_edges // 2
    src = torch.randint(n, (half,), generator=g)
    dst = torch.randint(n, (half,), generator=g)
    order = torch.argsort(y)
    counts = torch.bincount(y, minlength=int(y.max()) + 1)
    start = torch.cumsum(counts, 0) - counts
    pick = torch.rand(half, generator=g) < same_class
    cls = y[src[pick]]
    off = (torch.rand(int(pick.sum()), generator=g) * counts[cls]).long()
    dst[pick] = order[start[cls] + off]
    keep = src != dst
    return to_undirected(torch.stack([src[keep], dst[keep]]), num_nodes=n)


def _bag_of_words(y: torch.Tensor, width: int, per_node: int, g: torch.Generator) -> torch.Tensor:
    """Binary features: ``per_node`` active words, half from a class-specific vocabulary."""
    n = y.numel()
    classes = int(y.max()) + 1
    x = torch.zeros(n, width)
    block = max(width // classes, 1)
    own = y.unsqueeze(1) * block + torch.randint(block, (n, per_node // 2), generator=g)
    any_ = torch.randint(width, (n, per_node - per_node // 2), generator=g)
    x.scatter_(1, torch.cat([own.clamp(max=width - 1), any_], 1), 1.0)
    return x


class _Generated(InMemoryDataset):
    def __init__(self, data_list, transform=None, pre_transform=None, pre_filter=None):
        super().__init__(None, transform)
        if pre_filter is not None:
            data_list = [d for d in data_list if pre_filter(d)]
        if pre_transform is not None:
            data_list = [pre_transform(d) for d in data_list]
        self._data, self.slices = self.collate(data_list)


class Planetoid(_Generated):
    """Stand-in for ``torch_geometric.datasets.Planetoid(root, name, split='public', ...)``: one
    graph with ``x`` float [N, F], ``y`` int64 [N], ``edge_index`` int64 [2, E] and the public
    split's bool masks. ``ValueError`` for names other than Cora / CiteSeer / PubMed."""

    scale = 1.0

    def __init__(self, root, name, split="public", num_train_per_class=20, num_val=500, num_test=1000,
                 transform=None, pre_transform=None, force_reload=False):
        key = name.lower()
        if key not in _PLANETOID:
            raise ValueError(f"no generated stand-in for Planetoid '{name}'")
        self.name = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}[key]
        n, width, classes, edges = _PLANETOID[key]
        n = max(int(n * self.scale), classes * (num_train_per_class + 2))
        g = _gen(len(key))
        y = torch.randint(classes, (n,), generator=g)
        data = Data(x=_bag_of_words(y, width, 18, g), edge_index=_class_graph(y, int(edges * self.scale), g), y=y)
        train = torch.zeros(n, dtype=torch.bool)
        for c in range(classes):
            train[(y == c).nonzero().view(-1)[:num_train_per_class]] = True
        rest = (~train).nonzero().view(-1)
        num_val, num_test = min(num_val, len(rest) // 3), min(num_test, len(rest) // 3)
        data.train_mask = train
        data.val_mask = torch.zeros(n, dtype=torch.bool).index_fill_(0, rest[:num_val], True)
        data.test_mask = torch.zeros(n, dtype=torch.bool).index_fill_(0, rest[num_val:num_val + num_test], True)
        super().__init__([data], transform, pre_transform)

    def __repr__(self):
        return f"{self.name}()"


def _molecule_bonds(n: int, g: torch.Generator, rings: int) -> torch.Tensor:
    """A random tree over ``n`` atoms plus ``rings`` ring-closing bonds, both directions."""
    parent = [int(torch.randint(i, (1,), generator=g)) for i in range(1, n)]
    src = list(range(1, n))
    dst = parent
    for _ in range(rings):
        a, b = (int(v) for v in torch.randint(n, (2,), generator=g))
        if a != b:
            src.append(a)
            dst.append(b)
    ei = torch.tensor([src, dst], dtype=torch.long).view(2, -1)
    return coalesce(to_undirected(ei, num_nodes=n), num_nodes=n)


class TUDataset(_Generated):
    """Stand-in for ``torch_geometric.datasets.TUDataset(root, name, ...)``, MUTAG only: 188
    molecules, ``x`` one-hot float [n, 7], ``edge_attr`` one-hot float [E, 4], ``y`` int64 [1]
    (1 when the molecule has more type-1 than type-2 atoms)."""

    def __init__(self, root, name, transform=None, pre_transform=None, pre_filter=None, force_reload=False,
                 use_node_attr=False, use_edge_attr=False, cleaned=False):
        if name != "MUTAG":
            raise ValueError(f"no generated stand-in for TUDataset '{name}'")
        self.name = name
        g = _gen(188)
        data_list = []
        for _ in range(188):
            n = int(torch.randint(10, 29, (1,), generator=g))
            types = torch.multinomial(torch.tensor([.6, .15, .15, .04, .02, .02, .02]), n, True, generator=g)
            ei = _molecule_bonds(n, g, rings=n // 6)
            bond = torch.randint(4, (ei.size(1) // 2,), generator=g).repeat_interleave(2)
            y = torch.tensor([int((types == 1).sum() > (types == 2).sum())])
            data_list.append(Data(x=torch.nn.functional.one_hot(types, 7).float(), edge_index=ei,
                                  edge_attr=torch.nn.functional.one_hot(bond, 4).float(), y=y))
        super().__init__(data_list, transform, pre_transform, pre_filter)

    def __repr__(self):
        return f"{self.name}({len(self)})"


class QM9(_Generated):
    """Stand-in for ``torch_geometric.datasets.QM9(root, ...)``: ``count`` molecules of 3-29
    atoms (H, C, N, O, F), ``x`` float [n, 11], ``z`` int64 [n], ``pos`` float [n, 3] (Angstrom),
    ``edge_attr`` one-hot float [E, 4], ``y`` float [1, 19], ``smiles``, ``name``, ``idx``."""

    count = 1270

    def __init__(self, root, transform=None, pre_transform=None, pre_filter=None, force_reload=False):
        g = _gen(9)
        data_list = []
        atomic = torch.tensor([1, 6, 7, 8, 9])
        for i in range(self.count):
            heavy = int(torch.randint(1, 10, (1,), generator=g))
            n = min(29, heavy + int(torch.randint(heavy, 2 * heavy + 5, (1,), generator=g)))
            kinds = torch.cat([torch.multinomial(torch.tensor([0., .7, .12, .15, .03]), heavy, True, generator=g),
                               torch.zeros(n - heavy, dtype=torch.long)])
            z = atomic[kinds]
            ei = _molecule_bonds(n, g, rings=heavy // 4)
            bond = torch.randint(4, (ei.size(1) // 2,), generator=g).repeat_interleave(2)
            x = torch.cat([torch.nn.functional.one_hot(kinds, 5).float(), z.view(-1, 1).float(),
                           torch.zeros(n, 5)], 1)
            pos = torch.cumsum(torch.randn(n, 3, generator=g), 0)
            y = torch.randn(1, 19, generator=g) + kinds.bincount(minlength=5)[:5].float().repeat(4)[:19] * 0.1
            data_list.append(Data(x=x, edge_index=ei, edge_attr=torch.nn.functional.one_hot(bond, 4).float(), y=y,
                                  pos=pos, z=z, smiles="", name=f"gdb_{i + 1}", idx=torch.tensor([i])))
        super().__init__(data_list, transform, pre_transform, pre_filter)

    def __repr__(self):
        return f"QM9({len(self)})"


class IMDB(_Generated):
    """Stand-in for ``torch_geometric.datasets.IMDB(root, ...)``: a ``HeteroData`` with movie /
    director / actor nodes (``x`` float [N, 3066]), movie ``y`` int64 (3 classes) and bool
    ``train_mask`` / ``val_mask`` / ``test_mask``, and the four edge types ``('movie', 'to',
    'director')``, ``('movie', 'to', 'actor')`` and their reverses."""

    scale = 1.0

    def __init__(self, root, transform=None, pre_transform=None, force_reload=False):
        g = _gen(3066)
        nm, nd, na = (max(int(v * self.scale), 10) for v in (4278, 2081, 5257))
        y = torch.randint(3, (nm,), generator=g)
        data = HeteroData()
        data["movie"].x = _bag_of_words(y, 3066, 20, g)
        data["director"].x = (torch.rand(nd, 3066, generator=g) < 0.005).float()
        data["actor"].x = (torch.rand(na, 3066, generator=g) < 0.005).float()
        data["movie"].y = y
        perm = torch.randperm(nm, generator=g)
        n_train, n_val = int(nm * 400 / 4278), int(nm * 400 / 4278)
        for name, idx in (("train_mask", perm[:n_train]), ("val_mask", perm[n_train:n_train + n_val]),
                          ("test_mask", perm[n_train + n_val:])):
            data["movie"][name] = torch.zeros(nm, dtype=torch.bool).index_fill_(0, idx, True)
        # directors and actors lean towards movies of one genre, so their edges carry the label
        md = torch.stack([torch.arange(nm), (y * (nd // 3) + torch.randint(max(nd // 3, 1), (nm,), generator=g)) % nd])
        ma_src = torch.arange(nm).repeat(3)
        ma_dst = (y[ma_src] * (na // 3) + torch.randint(max(na // 3, 1), (3 * nm,), generator=g)) % na
        ma = torch.stack([ma_src, ma_dst])
        ma = coalesce(ma)
        data["movie", "to", "director"].edge_index = md
        data["movie", "to", "actor"].edge_index = ma
        data["director", "to", "movie"].edge_index = md.flip(0)
        data["actor", "to", "movie"].edge_index = ma.flip(0)
        super().__init__([data], transform, pre_transform)

    def __repr__(self):
        return "IMDB()"


def install(scale: float = 1.0, qm9_molecules: int = 1270) -> None:
    """Put the stand-ins in ``torch_geometric.datasets`` (``from torch_geometric.datasets import
    QM9`` then finds them)."""
    import torch_geometric.datasets as datasets
    Planetoid.scale = IMDB.scale = scale
    QM9.count = qm9_molecules
    for cls in (Planetoid, TUDataset, QM9, IMDB):
        setattr(datasets, cls.__name__, cls)
