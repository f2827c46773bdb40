"""PyG workloads through ``poptorch.trainingModel`` with fixed-size batches, against PyG on the
CPU with the same weights and batches: GCN / GraphSAGE / GAT / GIN graph classification, GCN
node classification (full graph, Cluster-GCN, neighbour sampling), SchNet; forward loss and one
optimizer step match, and each reports a predicted IPU throughput (a prediction of the cost
model, not host time). GIN on a generated molecular dataset: the padded IPU run matches the
unpadded CPU run (masks applied)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torch_geometric")

import poptorch  # noqa: E402
import poptorch_geometric as pg  # noqa: E402
from torch_geometric.data import Batch, Data  # noqa: E402
from torch_geometric.datasets import FakeDataset, KarateClub  # noqa: E402
from torch_geometric.nn import MLP, GATConv, GCNConv, GINConv, SAGEConv, global_add_pool, global_mean_pool  # noqa: E402

from openipu.ipu.target import target  # noqa: E402

CLOCK = target("ipu2").clock_hz


def _train_step_matches(model, args, lr=0.05, atol=1e-5, rtol=1e-4):
    """One SGD step through poptorch.trainingModel and on the CPU from the same weights: the
    losses and the updated weights agree. Returns (loss, predicted seconds per step)."""
    cpu = copy.deepcopy(model)
    opt = torch.optim.SGD(cpu.parameters(), lr=lr)
    pm = poptorch.trainingModel(model, options=poptorch.Options().logCycleCount(True),
                                optimizer=poptorch.optim.SGD(model.parameters(), lr=lr))
    _, loss = pm(*args)
    opt.zero_grad()
    _, ref = cpu(*args)
    ref.backward()
    opt.step()
    torch.testing.assert_close(torch.as_tensor(loss).reshape(()), ref.detach(), atol=atol, rtol=rtol)
    for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), atol=atol, rtol=rtol, msg=name)
    cycles = pm.cycleCount()
    assert cycles > 0
    pm.destroy()
    return float(ref.detach()), cycles / CLOCK


class GraphClassifier(torch.nn.Module):
    def __init__(self, conv: str, in_ch: int, classes: int, num_graphs: int):
        super().__init__()
        torch.manual_seed(0)
        self.num_graphs = num_graphs
        self.conv = {"gcn": lambda: GCNConv(in_ch, 16, add_self_loops=False),
                     "sage": lambda: SAGEConv(in_ch, 16),
                     "gat": lambda: GATConv(in_ch, 8, heads=2, add_self_loops=False),
                     "gin": lambda: GINConv(MLP([in_ch, 16, 16], norm="layer_norm"))}[conv]()
        self.lin = torch.nn.Linear(16, classes)

    def forward(self, x, edge_index, batch, y, graphs_mask):
        x = self.conv(x, edge_index).relu()
        x = self.lin(global_mean_pool(x, batch, size=self.num_graphs))
        return x, F.cross_entropy(x, torch.where(graphs_mask, y, -100))


@pytest.mark.parametrize("conv", ["gcn", "sage", "gat", "gin"])
def test_graph_classification_step(conv):
    torch.manual_seed(0)
    ds = FakeDataset(num_graphs=12, avg_num_nodes=8, num_channels=6, num_classes=3)
    b = next(iter(pg.FixedSizeDataLoader(ds, batch_size=5)))
    _, seconds = _train_step_matches(GraphClassifier(conv, 6, 3, 5), (b.x, b.edge_index, b.batch, b.y, b.graphs_mask))
    assert 0 < 4 / seconds < 1e9          # predicted graphs per second (4 real graphs per step)


class NodeGCN(torch.nn.Module):
    def __init__(self, in_ch, classes):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = GCNConv(in_ch, 16, add_self_loops=False)
        self.conv2 = GCNConv(16, classes, add_self_loops=False)

    def forward(self, x, edge_index, y, mask):
        x = self.conv2(self.conv1(x, edge_index).relu(), edge_index)
        x = F.log_softmax(x, dim=-1)
        return x, F.nll_loss(x, torch.where(mask, y, -100))


def test_node_classification_full_graph():
    import torch_geometric.transforms as T
    data = T.AddSelfLoops()(KarateClub()[0])
    b = next(iter(pg.DataLoader([data], batch_size=1)))
    _train_step_matches(NodeGCN(34, 4), (b.x, b.edge_index, b.y, b.train_mask))


def test_cluster_gcn_step():
    from torch_geometric.loader import ClusterData, ClusterLoader
    data = KarateClub()[0]
    data.train_mask = torch.ones(data.num_nodes, dtype=torch.bool)
    cd = ClusterData(data, num_parts=4, log=False)
    opts = pg.FixedSizeOptions.from_loader(ClusterLoader(cd, batch_size=2), sample_limit=4)
    b = next(iter(pg.FixedSizeClusterLoader(cd, opts, batch_size=2)))
    mask = b.train_mask & b.nodes_mask
    _train_step_matches(NodeGCN(34, 4), (b.x, b.edge_index, b.y, mask))


def test_neighbor_sampled_sage_step():
    data = KarateClub()[0]
    torch.manual_seed(0)
    b = next(iter(pg.FixedSizeNeighborLoader(data, num_neighbors=[4, 2], batch_size=4)))

    class Sage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv1, self.conv2 = SAGEConv(34, 16), SAGEConv(16, 4)

        def forward(self, x, edge_index, y):
            x = self.conv2(self.conv1(x, edge_index).relu(), edge_index)
            return x, F.cross_entropy(x[:4], y[:4])      # the seed nodes come first
    _train_step_matches(Sage(), (b.x, b.edge_index, b.y))


def molecules(num: int, seed: int = 0, classes: int = 2):
    """Generated molecule-like graphs (per-node layer norms: PyG's default graph-mode LayerNorm would
    mix the padding nodes into the statistics): 3..14 atoms, a random tree of bonds (both directions),
    one-hot atom types x [n, 5], a class label y [1] from the atom-type counts."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        n = int(torch.randint(3, 15, (1,), generator=g))
        types = torch.randint(0, 5, (n,), generator=g)
        parent = (torch.rand(n - 1, generator=g) * torch.arange(1, n)).long()
        src = torch.arange(1, n)
        ei = torch.cat([torch.stack([src, parent]), torch.stack([parent, src])], 1)
        y = torch.tensor([int((types == 0).sum() > (types == 1).sum()) % classes])
        out.append(Data(x=F.one_hot(types, 5).float(), edge_index=ei, y=y))
    return out


class GIN(torch.nn.Module):
    def __init__(self, num_graphs):
        super().__init__()
        torch.manual_seed(0)
        self.num_graphs = num_graphs
        self.convs = torch.nn.ModuleList([GINConv(MLP([5, 32, 32], norm="layer_norm", norm_kwargs={"mode": "node"})),
                                          GINConv(MLP([32, 32, 32], norm="layer_norm", norm_kwargs={"mode": "node"}))])
        self.head = torch.nn.Linear(32, 2)

    def forward(self, x, edge_index, batch, y, graphs_mask=None):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        x = self.head(global_add_pool(x, batch, size=self.num_graphs))
        if graphs_mask is not None:
            y = torch.where(graphs_mask, y, -100)
        return x, F.cross_entropy(x, y)


def test_gin_padded_matches_unpadded_cpu():
    graphs = molecules(7)
    b = next(iter(pg.FixedSizeDataLoader(graphs, batch_size=8)))
    assert int(b.graphs_mask.sum()) == 7
    model = GIN(8)
    cpu = copy.deepcopy(model)
    ref_batch = Batch.from_data_list(graphs)
    cpu.num_graphs = 7
    opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pm = poptorch.trainingModel(model, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.1))
    out, loss = pm(b.x, b.edge_index, b.batch, b.y, b.graphs_mask)
    ref_out, ref = cpu(ref_batch.x, ref_batch.edge_index, ref_batch.batch, ref_batch.y)
    ref.backward()
    grads = {n: p.grad.clone() for n, p in cpu.named_parameters()}
    opt.step()
    torch.testing.assert_close(torch.as_tensor(loss).reshape(()), ref.detach(), atol=1e-5, rtol=1e-4)
    for n, p in model.named_parameters():      # the IPU's gradient, from its SGD step
        torch.testing.assert_close((before[n] - p.detach()) / 0.1, grads[n], atol=1e-4, rtol=1e-3,
                                   msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.slow
def test_gin_losses_fall_over_epochs():
    graphs = molecules(96, seed=1)
    loader = pg.FixedSizeDataLoader(graphs, batch_size=16, fixed_size_strategy=pg.FixedSizeStrategy.StreamPack)
    model = GIN(16)
    pm = poptorch.trainingModel(model, optimizer=poptorch.optim.Adam(model.parameters(), lr=0.01))
    epochs = []
    for _ in range(4):
        epochs.append(sum(float(pm(b.x, b.edge_index, b.batch, b.y, b.graphs_mask)[1]) for b in loader) / len(loader))
    assert epochs[-1] < epochs[0]


class _FixedReadout(torch.nn.Module):
    """SchNet's readout aggregation with a static ``dim_size`` (the graphs of the batch)."""

    def __init__(self, aggr, num_graphs):
        super().__init__()
        self.aggr, self.num_graphs = aggr, num_graphs

    def forward(self, x, index, dim=0):
        return self.aggr(x, index, dim=dim, dim_size=self.num_graphs)


def test_schnet_step():
    from torch_geometric.nn.models import SchNet
    g = torch.Generator().manual_seed(0)
    mols = []
    for _ in range(5):
        n = int(torch.randint(3, 10, (1,), generator=g))
        mols.append(Data(z=torch.randint(1, 10, (n,), generator=g), pos=torch.randn(n, 3, generator=g),
                         y=torch.randn(1, generator=g), num_nodes=n))
    b = next(iter(pg.FixedSizeDataLoader(mols, batch_size=4)))

    class Energy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = SchNet(hidden_channels=16, num_filters=16, num_interactions=2, num_gaussians=10, cutoff=3.0)
            self.net.readout = _FixedReadout(self.net.readout, 4)

        def forward(self, z, pos, batch, y, graphs_mask):
            out = self.net(z, pos, batch).view(-1)
            err = torch.where(graphs_mask, out - y, torch.zeros_like(out))
            return out, poptorch.identity_loss((err * err).sum() / graphs_mask.sum(), reduction="none")
    _, seconds = _train_step_matches(Energy(), (b.z, b.pos, b.batch, b.y, b.graphs_mask), lr=0.01, atol=1e-4,
                                     rtol=1e-3)
    assert seconds > 0
