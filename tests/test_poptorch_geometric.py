"""PopTorch Geometric (``import poptorch_geometric``): fixed-size options, padding collaters and
their masks, the loaders (PadToMax, StreamPack, device iterations), neighbour sampling and
partitioning without pyg-lib, the static neighbourhood ops, ``poptorch.fps`` /
``poptorch.nearest`` and PyG ``Data`` as model arguments. Behaviour follows
``research/poptorch_geometric.md`` (PopTorch Geometric 3.4 on PyG 2.8)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")

import poptorch  # noqa: E402
import poptorch_geometric as pg  # noqa: E402
from torch_geometric.data import Batch, Data, HeteroData  # noqa: E402
from torch_geometric.datasets import FakeDataset, FakeHeteroDataset, KarateClub  # noqa: E402


def _dataset(n=30, seed=0, **kw):
    torch.manual_seed(seed)
    kw.setdefault("avg_num_nodes", 8)
    kw.setdefault("num_channels", 4)
    return FakeDataset(num_graphs=n, **kw)


def _graph(n, e, y=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Data(x=torch.randn(n, 3, generator=g), edge_index=torch.randint(0, n, (2, e), generator=g),
                edge_attr=torch.randn(e, 2, generator=g), y=torch.tensor([1]) if y is None else y)


# -- options ---------------------------------------------------------------------------------
def test_options_defaults_and_errors():
    o = pg.FixedSizeOptions(num_nodes=10)
    assert (o.num_edges, o.num_graphs, o.node_pad_value, o.pad_graph_defaults) == (90, 2, 0.0, {})
    with pytest.raises(ValueError, match="at least 2"):
        pg.FixedSizeOptions(num_nodes=10, num_graphs=1)
    assert "reserved for padding" in repr(o)
    h = pg.FixedSizeOptions(num_nodes=5, num_edges=7).to_hetero(["a", "b"], [("a", "r", "b")])
    assert h.is_hetero() and h.total_num_nodes == 10 and h.total_num_edges == 7


def test_options_from_dataset_and_loader():
    ds = _dataset()
    o = pg.FixedSizeOptions.from_dataset(ds, 5)
    max_n = max(int(d.num_nodes) for d in ds)
    max_e = max(int(d.num_edges) for d in ds)
    assert (o.num_nodes, o.num_edges, o.num_graphs) == (max_n * 4 + 1, max_e * 4 + 1, 5)
    from torch_geometric.loader import DataLoader
    o2 = pg.FixedSizeOptions.from_loader(DataLoader(ds, batch_size=3), sample_limit=5)
    assert o2.num_graphs == 4


# -- collater --------------------------------------------------------------------------------
def test_collater_pads_with_values_and_masks():
    opts = pg.FixedSizeOptions(num_nodes=20, num_edges=30, num_graphs=4, node_pad_value=22, edge_pad_value=34,
                               graph_pad_value=55)
    c = pg.FixedSizeCollater(opts, add_masks_to_batch=True)
    gs = [_graph(5, 6, seed=1), _graph(4, 7, seed=2)]
    b = c(gs)
    assert b.x.shape == (20, 3) and b.edge_index.shape == (2, 30) and b.num_graphs == 4
    assert b.graphs_mask.tolist() == [True, True, False, False]
    assert int(b.nodes_mask.sum()) == 9 and int(b.edges_mask.sum()) == 13
    assert (b.x[9:] == 22).all() and (b.edge_attr[13:] == 34).all() and (b.y[2:] == 55).all()
    # padding edges join padding nodes of their own graph
    pad = b.edge_index[:, 13:]
    assert (pad >= 9).all() and (b.batch[pad[0]] == b.batch[pad[1]]).all()
    torch.testing.assert_close(b.x[:9], torch.cat([gs[0].x, gs[1].x]))


def test_collater_errors():
    c = pg.FixedSizeCollater(pg.FixedSizeOptions(num_nodes=6, num_edges=30, num_graphs=2))
    with pytest.raises(TypeError, match="Expected list, got tuple"):
        c((_graph(3, 2),))
    with pytest.raises(RuntimeError, match="enough room"):
        c([_graph(2, 1), _graph(2, 1), _graph(2, 1)])
    with pytest.raises(RuntimeError, match="Increase the maximum number of nodes"):
        c([_graph(9, 2)])
    full = pg.FixedSizeCollater(pg.FixedSizeOptions(num_nodes=6, num_edges=30, num_graphs=2))
    with pytest.raises(RuntimeError, match="cannot create additional graphs"):
        full([_graph(3, 2), _graph(2, 2)])


def test_collater_trims():
    torch.manual_seed(0)
    c = pg.FixedSizeCollater(pg.FixedSizeOptions(num_nodes=10, num_edges=12, num_graphs=3), add_masks_to_batch=True,
                             trim_nodes=True, trim_edges=True)
    b = c([_graph(8, 20, seed=3), _graph(7, 20, seed=4)])
    assert b.x.shape[0] == 10 and b.edge_index.shape[1] == 12
    assert b.graphs_mask.tolist() == [True, True, False]
    assert int(b.nodes_mask.sum()) == 9                 # one node kept free for the padding graph
    assert (b.batch[:9].bincount() > 0).all()           # no real graph emptied


def test_collater_node_level_labels_and_non_tensors():
    opts = pg.FixedSizeOptions(num_nodes=10, num_edges=10, num_graphs=3, pad_graph_defaults={"name": "pad_graph"})
    g1, g2 = _graph(3, 2, y=torch.arange(3)), _graph(4, 2, y=torch.arange(4))
    g1.name, g2.name = "a", "b"
    b = pg.FixedSizeCollater(opts)([g1, g2])
    assert b.y.shape == (10,) and b.name == ["a", "b", "pad_graph"]


def test_collater_hetero_masks():
    torch.manual_seed(0)
    ds = FakeHeteroDataset(num_graphs=3, avg_num_nodes=6)
    data = [ds[0], ds[1]]
    nodes = {t: sum(int(d[t].num_nodes) for d in data) + 2 for t in data[0].node_types}
    edges = {t: sum(int(d[t].num_edges) for d in data) + 3 for t in data[0].edge_types}
    b = pg.FixedSizeCollater(pg.FixedSizeOptions(nodes, edges, num_graphs=3), add_masks_to_batch=True)(data)
    assert b.graphs_mask.tolist() == [True, True, False]
    for t in data[0].node_types:
        assert b[t].num_nodes == nodes[t] and int(b[t].nodes_mask.sum()) == nodes[t] - 2
    for t in data[0].edge_types:
        assert b[t].num_edges == edges[t] and int(b[t].edges_mask.sum()) == edges[t] - 3


def test_combined_batching_collater():
    opts = pg.FixedSizeOptions(num_nodes=12, num_edges=12, num_graphs=3)
    c = pg.CombinedBatchingCollater(pg.FixedSizeCollater(opts), 2)
    b = c([_graph(3, 2, seed=i) for i in range(6)])
    assert b.edge_index.shape == (6, 12) and b.x.shape == (36, 3) and b.ptr.shape == (12,)
    with pytest.raises(AssertionError, match="Invalid batch size"):
        c([_graph(3, 2)] * 3)


# -- loaders ---------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", [pg.FixedSizeStrategy.PadToMax, pg.FixedSizeStrategy.StreamPack])
@pytest.mark.parametrize("device_iterations", [1, 3])
def test_fixed_size_loader_shapes(strategy, device_iterations):
    ds = _dataset()
    opts = poptorch.Options().deviceIterations(device_iterations)
    loader = pg.FixedSizeDataLoader(ds, batch_size=4, fixed_size_strategy=strategy, options=opts)
    fo = loader.fixed_size_options
    k = device_iterations
    n = 0
    for b in loader:
        n += 1
        assert b.x.shape == (k * fo.num_nodes, 4) and b.edge_index.shape == (2 * k, fo.num_edges)
        assert b.graphs_mask.shape == (4 * k,) and b.nodes_mask.shape == (k * fo.num_nodes,)
        real = b.graphs_mask.view(k, 4)
        assert real.any(1).all() and not real[:, -1].any()
    assert n == len(loader) > 0
    assert isinstance(loader, poptorch.DataLoader)


def test_loader_argument_errors():
    ds = _dataset(10)
    with pytest.raises(AssertionError, match="must match provided batch size"):
        pg.FixedSizeDataLoader(ds, batch_size=3, fixed_size_options=pg.FixedSizeOptions(100, 100, num_graphs=4))
    with pytest.raises(AssertionError, match="collate_fn"):
        pg.FixedSizeDataLoader(ds, batch_size=3, collate_fn=lambda x: x)
    with pytest.raises(ValueError, match="incompatible with the provided batch_sampler"):
        pg.FixedSizeDataLoader(ds, batch_size=3, fixed_size_strategy=pg.FixedSizeStrategy.StreamPack,
                               batch_sampler=[[0, 1]])


def test_stream_packing_sampler():
    ds = _dataset(20)
    s = pg.StreamPackingSampler(ds, 4, max_num_nodes=30, max_num_edges=400)
    packs = list(s)
    assert sorted(i for p in packs for i in p) == list(range(20))
    for p in packs:
        assert len(p) <= 4 and sum(int(ds[i].num_nodes) for i in p) <= 30
    with pytest.raises(RuntimeError, match="does not fit"):
        list(pg.StreamPackingSampler(ds, 4, max_num_nodes=2, max_num_edges=400))
    assert list(pg.StreamPackingSampler(ds, 4, max_num_nodes=2, max_num_edges=400, allow_skip_data=True)) == []


def test_poptorch_dataloader_user_batch_sampler():
    ds = list(range(12))
    opts = poptorch.Options().deviceIterations(2)
    loader = poptorch.DataLoader(opts, ds, batch_sampler=[[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [0, 1, 2]])
    out = list(loader)
    assert len(out) == len(loader) == 2 and out[0].tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(poptorch.Error, match="mutually exclusive"):
        poptorch.DataLoader(opts, ds, batch_size=2, batch_sampler=[[0]])


def test_plain_dataloader():
    ds = _dataset(6)
    b = next(iter(pg.DataLoader(ds, batch_size=2)))
    assert isinstance(b, Batch) and b.num_graphs == 2


# -- sampling without pyg-lib ------------------------------------------------------------------
def test_neighbor_loader_fixed_size():
    data = KarateClub()[0]
    torch.manual_seed(0)
    loader = pg.FixedSizeNeighborLoader(data, num_neighbors=[3, 2], batch_size=4)
    fo = loader.fixed_size_options
    for b in loader:
        assert b.x.shape[0] == fo.num_nodes and b.edge_index.shape[1] == fo.num_edges
        assert b["batch_size"] == 4 and b.input_id.shape == (4,)
        real = int(b.nodes_mask.sum())
        assert (b.n_id[:4] == b.input_id).all()            # the seeds come first
        assert (b.n_id[real:] == 0).all()
        pad_edges = b.edge_index[:, int(b.edges_mask.sum()):]
        assert (pad_edges >= real).all()
        # sampled edges are edges of the graph
        src, dst = b.n_id[b.edge_index[:, :int(b.edges_mask.sum())]]
        edges = set(map(tuple, data.edge_index.t().tolist()))
        assert all((s, d) in edges for s, d in zip(src.tolist(), dst.tolist()))


def test_neighbor_loader_hetero():
    torch.manual_seed(0)
    data = FakeHeteroDataset(num_graphs=1, avg_num_nodes=20)[0]
    t = data.node_types[0]
    loader = pg.FixedSizeNeighborLoader(data, num_neighbors=[3, 2], batch_size=4, input_nodes=(t, None))
    b = next(iter(loader))
    assert b.graphs_mask.tolist() == [True, False]
    assert b[t]["batch_size"] == 4 and (b[t].n_id[:4] == b[t].input_id).all()


def test_cluster_loader():
    from torch_geometric.loader import ClusterData, ClusterLoader
    data = KarateClub()[0]
    cd = ClusterData(data, num_parts=4, log=False)
    assert sorted(int(cd[i].num_nodes) for i in range(4)) == [8, 8, 9, 9]
    opts = pg.FixedSizeOptions.from_loader(ClusterLoader(cd, batch_size=2), sample_limit=4)
    loader = pg.FixedSizeClusterLoader(cd, opts, batch_size=2)
    for b in loader:
        assert b.x.shape[0] == opts.num_nodes and b.edge_index.shape[1] == opts.num_edges
    with pytest.raises(AssertionError, match="must be 2"):
        pg.FixedSizeClusterLoader(cd, pg.FixedSizeOptions(40, 200, num_graphs=3))
    with pytest.raises(AssertionError, match="does not support"):
        pg.FixedSizeClusterLoader(cd, opts, shuffle=True)
    from poptorch_geometric.pyg_cluster_loader import FixedSizeClusterLoader as PlainLoader
    plain = PlainLoader(cd, opts, batch_size=2)
    assert not isinstance(plain, poptorch.DataLoader) and len(plain) == 2
    for b in plain:
        assert b.x.shape[0] == opts.num_nodes and b.edge_index.shape[1] == opts.num_edges
        assert "nodes_mask" not in b


_HOOK_SCRIPT = """
import site, sys
if sys.argv[1] == "hook":
    site.addsitedir(sys.argv[2])        # processes src/openipu-pyg.pth as site-packages would
from torch_geometric.datasets import KarateClub
from torch_geometric.loader import ClusterData, NeighborLoader
data = KarateClub()[0]
assert "openipu.poptorch_geometric" not in sys.modules
try:
    cd = ClusterData(data, num_parts=4, recursive=False, log=False)
except ImportError as e:
    print("ImportError", e)
    sys.exit(0)
b = next(iter(NeighborLoader(data, num_neighbors=[3, 3], batch_size=4)))
print("parts", sorted(int(cd[i].num_nodes) for i in range(4)), "seeds", b.batch_size)
"""


@pytest.mark.parametrize("hook", ["hook", pytest.param("none", marks=pytest.mark.slow)])
def test_startup_hook_partitions_before_poptorch_geometric_import(hook, tmp_path):
    """``ClusterData`` / ``NeighborLoader`` used before ``import poptorch_geometric`` (Graphcore's
    tutorial 5 order): with ``openipu-pyg.pth`` processed at start-up they use openipu's numpy
    partitioner and sampler; without it PyG raises its ImportError (no pyg-lib / torch-sparse)."""
    import importlib.util
    import os
    import pathlib
    import subprocess
    import sys
    src = pathlib.Path(importlib.util.find_spec("openipu_pyg_hook").origin).parent
    assert (src / "openipu-pyg.pth").read_text().strip() == "import openipu_pyg_hook"
    script = tmp_path / "order.py"
    script.write_text(_HOOK_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, str(script), hook, str(src)], env=env, capture_output=True, text=True,
                         check=True).stdout
    if hook == "hook":
        assert "parts [8, 8, 9, 9] seeds 4" in out, out
    else:
        assert "'ClusterData' requires either 'pyg-lib' or 'torch-sparse'" in out, out


# -- static ops ------------------------------------------------------------------------------
def _pairs(ei):
    return {tuple(p) for p in ei.t().tolist() if -1 not in p}


def test_static_knn_graph_and_radius_graph():
    from openipu.poptorch_geometric import ops
    torch.manual_seed(0)
    x = torch.randn(12, 3)
    batch = torch.tensor([0] * 7 + [1] * 5)
    ei = ops.knn_graph(x, 3, batch)
    assert ei.shape == (2, 36)
    d = torch.cdist(x, x).masked_fill(batch[:, None] != batch[None], float("inf")).fill_diagonal_(float("inf"))
    want = {(int(j), i) for i in range(12) for j in d[i].topk(3, largest=False).indices}
    assert _pairs(ei) == want
    r = ops.radius_graph(x, 1.2, batch, max_num_neighbors=4)
    assert r.shape == (2, 48)
    for s, t in _pairs(r):
        assert batch[s] == batch[t] and s != t and float((x[s] - x[t]).norm()) <= 1.2 + 1e-6
    # fewer candidates than k: -1
    small = ops.knn(x[:3], x[:1], 2, torch.tensor([0, 1, 1]), torch.tensor([0]))
    assert small.tolist() == [[0, 0], [0, -1]]
    # the eager PyG functions (no pyg-lib here) drop the -1 pairs
    from torch_geometric.nn import knn_graph
    assert _pairs(knn_graph(x, 3, batch)) == want


def test_radius_graph_of_more_than_255_points_captures():
    """PyTorch decomposes a bool ``torch.eye(n)`` into a uint16 ``arange`` past 255 points, which
    the capture cannot fold into a constant; the static radius graph builds its diagonal from an
    int64 ``arange`` (SchNet's 16-molecule batches have 436 atoms)."""
    from openipu.poptorch_geometric import ops

    class M(torch.nn.Module):
        def forward(self, pos):
            return (ops.radius_graph(pos, r=0.5, max_num_neighbors=2) >= 0).sum()

    pos = torch.randn(300, 3, generator=torch.Generator().manual_seed(0))
    n = int(poptorch.inferenceModel(M())(pos))
    assert n == int(M()(pos)) > 0


def test_fps_and_nearest():
    torch.manual_seed(0)
    x = torch.randn(10, 2)
    idx = poptorch.fps(x, [0, 4, 10], ratio=0.5)
    assert idx.tolist()[0] == 0 and idx.tolist()[2] == 4 and idx.shape == (5,)
    with pytest.raises(ValueError, match="list of integers"):
        poptorch.fps(x, torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="at least 2"):
        poptorch.fps(x, [0])
    y = x[[1, 7]]
    assert poptorch.nearest(x, y, [0] * 4 + [1] * 6, [0, 1]).tolist() == [0] * 4 + [1] * 6
    with pytest.raises(ValueError, match="sorted"):
        poptorch.nearest(x, y, [1] * 4 + [0] * 6, [0, 1])


# -- Data as model arguments -----------------------------------------------------------------
def test_data_argument_and_output():
    class M(torch.nn.Module):
        def forward(self, data):
            out = data.clone()
            out.x = data.x * 2
            return out

    d = Data(x=torch.randn(4, 3), edge_index=torch.tensor([[0, 1], [1, 2]]))
    out = poptorch.inferenceModel(M())(d)
    assert isinstance(out, Data)
    torch.testing.assert_close(out.x, d.x * 2)
    assert out.edge_index.tolist() == d.edge_index.tolist()


def test_parser_roundtrip_hetero():
    parser = pg.PyGArgsParser()
    h = HeteroData()
    h["a"].x = torch.randn(2, 2)
    h["a", "r", "a"].edge_index = torch.tensor([[0], [1]])
    ts = list(parser.yieldTensors(h))
    back = parser.reconstruct(h, iter([t + 1 for t in ts]))
    torch.testing.assert_close(back["a"].x, h["a"].x + 1)
    assert parser.sortedTensorKeys(h) == ("a.x", "a__r__a.edge_index")


def test_maskers():
    from poptorch_geometric import masker
    x = torch.randn(4, 3)
    assert masker.NoMasker().node_masker(x) is x
    mask = torch.tensor([True, True, False, False])
    zeroed = masker.MaskMasker(nodes_mask=mask).node_masker((x, x + 1))
    assert zeroed[0][2:].abs().sum() == 0 and torch.equal(zeroed[1][:2], x[:2] + 1)
    with pytest.raises(ValueError, match="no edge mask"):
        masker.MaskMasker(nodes_mask=mask).edge_masker(x)
    layer = masker.PreLayerMasker(masker.MaskMasker(nodes_mask=mask)).node_masker(lambda a, b: a.sum() + b.sum())
    torch.testing.assert_close(layer(x, x), 2 * x[:2].sum())
    with pytest.raises(TypeError):
        masker.Masker()


def test_common_batch_classes():
    from poptorch_geometric.common import DataBatch, call_once
    b = Batch.from_data_list([Data(x=torch.ones(2, 1)), Data(x=torch.ones(1, 1))])
    assert type(b) is DataBatch
    calls = []
    f = call_once(lambda: calls.append(1) or 5)
    assert (f(), f(), calls) == (5, None, [1])


def test_cluster_gcn_conv_captures_without_mask_writes():
    from torch_geometric.nn import ClusterGCNConv
    from torch_geometric.utils import add_self_loops
    torch.manual_seed(0)
    data = KarateClub()[0]
    edge_index, _ = add_self_loops(data.edge_index, num_nodes=data.num_nodes)
    conv = ClusterGCNConv(data.num_features, 4, diag_lambda=0.5, add_self_loops=False)  # (the guide's rule)
    out = poptorch.inferenceModel(conv)(data.x, edge_index)
    torch.testing.assert_close(out, conv(data.x, edge_index).detach(), rtol=1e-4, atol=1e-5)
    assert ClusterGCNConv.forward.__module__.startswith("torch_geometric")     # restored after capture


def test_training_stepper_compares_losses_and_weights():
    from torch_geometric.nn import GCNConv

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GCNConv(34, 4, add_self_loops=False)

        def forward(self, x, edge_index, y):
            out = self.conv(x, edge_index)
            return out, torch.nn.functional.cross_entropy(out, y)

    torch.manual_seed(0)
    data = KarateClub()[0]
    stepper = pg.TrainingStepper(M(), lr=0.01, atol=1e-5, rtol=1e-4, equal_nan=True)
    cpu, ipu = stepper.run(2, (data.x, data.edge_index, data.y))
    assert cpu.shape == ipu.shape == (2,)
    torch.testing.assert_close(stepper.ipu_model.conv.lin.weight, stepper.model.conv.lin.weight, rtol=1e-4, atol=1e-5)


def test_padding_edges_past_the_last_node():
    """A batch whose real nodes fill ``num_nodes`` leaves no padding node: PopTorch Geometric's
    padding edges then point one past the last node. Gathering their source rows gives zeros on
    the device (PopLibs' padding index) and their gradient rows are dropped, so a training step
    masked by ``edges_mask`` matches the CPU on the real edges (nothing raises)."""
    g = _graph(6, 8)
    b = pg.FixedSizeCollater(pg.FixedSizeOptions(num_nodes=6, num_edges=12, num_graphs=2), add_masks_to_batch=True)([g])
    assert b.x.shape[0] == 6 and int(b.edge_index.max()) == 6 and int(b.edges_mask.sum()) == 8

    class Messages(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(3, 4)

        def forward(self, x, edge_index, edges_mask):
            msg = self.lin(x).index_select(0, edge_index[0])
            return msg, poptorch.identity_loss((msg.sum(1) * edges_mask).pow(2), reduction="mean")

    model = Messages()
    cpu = Messages()
    out, loss = poptorch.trainingModel(model, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.1))(
        b.x, b.edge_index, b.edges_mask)
    assert (out[8:] == 0).all()
    real = g.edge_index[0]
    ref = cpu.lin(g.x).index_select(0, real).sum(1).pow(2).sum() / 12
    ref.backward()
    torch.testing.assert_close(torch.as_tensor(loss).reshape(()), ref.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach(), (q - 0.1 * q.grad).detach(), rtol=1e-5, atol=1e-6)
