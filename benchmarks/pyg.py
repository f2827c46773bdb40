"""PyTorch Geometric training on the simulated IPU: host time per training step of GCN and SchNet
through ``poptorch.trainingModel`` with ``poptorch_geometric`` fixed-size batches, against PyG
eager on the CPU in the same run, and the predicted IPU throughput.

    python benchmarks/pyg.py [--quick] [--steps N] [--models gcn,schnet]

Workloads (random weights, fp32, SGD lr 0.01; generated data, no download):

- ``gcn``: 2-layer GCN (hidden 64, ``add_self_loops=False``) + mean pool + linear, graph
  classification of ``FakeDataset`` graphs (avg 20 nodes, 32 features, 4 classes), fixed-size
  batches of 32 graphs (31 real + 1 padding; ``--quick``: 8);
- ``schnet``: PyG ``SchNet`` (hidden 64, 64 filters, 3 interactions, 25 Gaussians, cutoff 5),
  energy regression on generated molecules (3-29 atoms), batches of 16 (``--quick``: 4, 2
  interactions); the radius graph is built on the device with the static ``radius_graph``.

Figures per workload (a table and one JSON line): ``compile_s`` (host wall-clock seconds of the first call);
``poptorch_step_s`` (host CPU seconds, ``time.process_time``, per ``trainingModel`` call after the
first, median of ``--steps``: the simulator's functional run and cost model;
``poptorch_step_wall_s`` the same in wall-clock seconds); ``eager_step_s`` (host CPU seconds per
PyG eager step on the CPU with the same padded batch, median); ``ratio`` = poptorch / eager
(CPU time, so less sensitive to other jobs on the machine);
``ipu_step_cycles`` / ``ipu_step_s`` (the cost model's PREDICTION of one step on a Mk2 IPU, a
device time, not a host time) and ``ipu_graphs_per_s`` = real graphs per step / ``ipu_step_s``; ``fits`` / ``max_tile_bytes``: whether
the step fits one IPU's tile memory (each workload is compiled with ``debug.allowOutOfMemory``,
so one that does not fit is still predicted, and flagged).
Host times depend on the machine and its load; the predictions do not.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torch.nn.functional as F


def _gcn(quick: bool):
    from torch_geometric.datasets import FakeDataset
    from torch_geometric.nn import GCNConv, global_mean_pool

    import poptorch_geometric as pg
    bs = 8 if quick else 32
    torch.manual_seed(0)
    ds = FakeDataset(num_graphs=4 * bs, avg_num_nodes=20, num_channels=32, num_classes=4)
    b = next(iter(pg.FixedSizeDataLoader(ds, batch_size=bs)))

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(32, 64, add_self_loops=False)
            self.conv2 = GCNConv(64, 64, add_self_loops=False)
            self.lin = torch.nn.Linear(64, 4)

        def forward(self, x, edge_index, batch, y, graphs_mask):
            x = self.conv2(self.conv1(x, edge_index).relu(), edge_index).relu()
            x = self.lin(global_mean_pool(x, batch, size=bs))
            return x, F.cross_entropy(x, torch.where(graphs_mask, y, -100))
    return GCN(), (b.x, b.edge_index, b.batch, b.y, b.graphs_mask), bs - 1


def _schnet(quick: bool):
    from torch_geometric.data import Data
    from torch_geometric.nn.models import SchNet

    import poptorch
    import poptorch_geometric as pg
    bs = 4 if quick else 16
    g = torch.Generator().manual_seed(0)
    mols = []
    for _ in range(4 * bs):
        n = int(torch.randint(3, 30, (1,), generator=g))
        mols.append(Data(z=torch.randint(1, 10, (n,), generator=g), pos=torch.randn(n, 3, generator=g) * 2,
                         y=torch.randn(1, generator=g), num_nodes=n))
    b = next(iter(pg.FixedSizeDataLoader(mols, batch_size=bs)))

    class Readout(torch.nn.Module):
        def __init__(self, aggr):
            super().__init__()
            self.aggr = aggr

        def forward(self, x, index, dim=0):
            return self.aggr(x, index, dim=dim, dim_size=bs)

    class Energy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = SchNet(hidden_channels=64, num_filters=64, num_interactions=2 if quick else 3,
                              num_gaussians=25, cutoff=5.0)
            self.net.readout = Readout(self.net.readout)

        def forward(self, z, pos, batch, y, graphs_mask):
            out = self.net(z, pos, batch).view(-1)
            err = torch.where(graphs_mask, out - y, torch.zeros_like(out))
            return out, poptorch.identity_loss((err * err).sum() / graphs_mask.sum(), reduction="none")
    return Energy(), (b.z, b.pos, b.batch, b.y, b.graphs_mask), bs - 1


WORKLOADS = {"gcn": _gcn, "schnet": _schnet}


def run(name: str, quick: bool, steps: int) -> dict:
    import poptorch
    from openipu.ipu.target import target
    torch.manual_seed(0)
    model, args, real = WORKLOADS[name](quick)
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(eager.parameters(), lr=0.01)

    def eager_step():
        opt.zero_grad()
        eager(*args)[1].backward()
        opt.step()
    eager_step()
    eager_times = []
    for _ in range(steps):
        t = time.process_time()
        eager_step()
        eager_times.append(time.process_time() - t)
    opts = poptorch.Options().logCycleCount(True)
    # compiled with Poplar's debug.allowOutOfMemory: a workload that does not fit one IPU's tile
    # memory is predicted anyway and flagged (``fits``, ``max_tile_bytes``)
    opts._Popart.setEngineOptions({"debug.allowOutOfMemory": "true"})
    pm = poptorch.trainingModel(model, options=opts, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.01))
    t = time.perf_counter()
    pm(*args)
    compile_s = time.perf_counter() - t
    times, walls = [], []
    for _ in range(steps):
        t, w = time.process_time(), time.perf_counter()
        pm(*args)
        times.append(time.process_time() - t)
        walls.append(time.perf_counter() - w)
    cycles = pm.cycleCount()
    plan = pm._session._engine.memory
    ipu_s = cycles / target("ipu2").clock_hz
    step, eager_s = statistics.median(times), statistics.median(eager_times)
    return {"model": name, "real_graphs_per_step": real, "compile_s": round(compile_s, 2),
            "poptorch_step_s": round(step, 4),
            "poptorch_step_wall_s": round(statistics.median(walls), 4), "eager_step_s": round(eager_s, 4), "ratio": round(step / eager_s, 1),
            "ipu_step_cycles": int(cycles), "ipu_step_s": ipu_s, "ipu_graphs_per_s": round(real / ipu_s, 1),
            "fits": bool(plan.fits()), "max_tile_bytes": int(plan.total.max())}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small batches (CI)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--models", default="gcn,schnet")
    a = p.parse_args(argv)
    rows = [run(m, a.quick, a.steps) for m in a.models.split(",")]
    print("host CPU seconds per step; IPU figures are the cost model's predictions (Mk2)")
    print(f"{'model':8} {'compile s':>9} {'poptorch s/step':>15} {'eager s/step':>12} {'ratio':>6} "
          f"{'IPU cycles':>11} {'IPU graphs/s':>12} {'fits':>5}")
    for r in rows:
        print(f"{r['model']:8} {r['compile_s']:9.2f} {r['poptorch_step_s']:15.4f} {r['eager_step_s']:12.4f} "
              f"{r['ratio']:6.1f} {r['ipu_step_cycles']:11d} {r['ipu_graphs_per_s']:12.1f} {str(r['fits']):>5}")
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
