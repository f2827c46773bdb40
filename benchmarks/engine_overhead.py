"""Host-side speed of the simulator (host wall time, not predicted IPU time).

1. Per executed program step: a ``Repeat`` of N iterations of a small compute set (one vertex
   per tile on 16 tiles, each adding 1 to 4 floats) plus an on-tile copy, against the same work
   done directly in torch (``x += 1`` on a [16, 4] tensor, and a copy) in the same loop.
2. Compile time of a graph with a variable mapped over all 1472 tiles of an ipu2 and a
   popops add over it, against building the same tensors in torch.

Prints each figure and the ratio openipu / torch (the figure that matters).
Usage: ``python benchmarks/engine_overhead.py [--steps N]``.
"""

import argparse
import time

import numpy as np
import torch

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplibs import popops, poputil


class AddOne(poplar.Vertex):
    x = poplar.InOut(poplar.Vector(poplar.FLOAT))

    def compute(self):
        self.x = self.x + 1


def bench_steps(n: int):
    m = poplar.IPUModel(); m.tilesPerIPU = 16
    dev = m.createDevice()
    g = poplar.Graph(dev.getTarget())
    g.addCodelets(AddOne)
    x = g.addVariable(poplar.FLOAT, [16, 4], "x")
    y = g.addVariable(poplar.FLOAT, [16, 4], "y")
    g.setTileMapping(x, np.repeat(np.arange(16), 4))
    g.setTileMapping(y, np.repeat(np.arange(16), 4))
    g.createHostRead("x", x)
    cs = g.addComputeSet("add")
    for t in range(16):
        g.setPerfEstimate(g.addVertex(cs, "AddOne", {"x": x[t]}, tile=t), 10)
    e = poplar.Engine(g, P.Repeat(n, P.Sequence(P.Execute(cs), P.Copy(x, y))))
    e.load(dev)
    t0 = time.perf_counter(); e.run(); t_ipu = time.perf_counter() - t0
    assert float(e.readTensor("x")[0, 0]) == n
    xt, yt = torch.zeros(16, 4), torch.zeros(16, 4)
    t0 = time.perf_counter()
    for _ in range(n):
        xt += 1
        yt.copy_(xt)
    t_torch = time.perf_counter() - t0
    steps = 2 * n
    print(f"program steps executed:        {steps}")
    print(f"  openipu host time per step:  {t_ipu / steps * 1e6:9.2f} us")
    print(f"  torch eager per same op:     {t_torch / steps * 1e6:9.2f} us")
    print(f"  ratio openipu / torch:       {t_ipu / t_torch:9.1f}x")
    print(f"  predicted IPU cycles per iteration: {e.last_run_cycles / n:,.0f} (IPU time, not host time)")


def bench_compile():
    dev = poplar.IPUModel("ipu2").createDevice()
    t0 = time.perf_counter()
    g = poplar.Graph(dev.getTarget())
    a = g.addVariable(poplar.FLOAT, [1472 * 256], "a")
    b = g.addVariable(poplar.FLOAT, [1472 * 256], "b")
    poputil.mapTensorLinearly(g, a)
    poputil.mapTensorLinearly(g, b)
    prog = P.Sequence()
    popops.add(g, a, b, prog, "add")
    e = poplar.Engine(g, prog)
    t_ipu = time.perf_counter() - t0
    tiles = len(np.unique(g.tile_of_elements(a)))
    t0 = time.perf_counter()
    ta, tb = torch.zeros(1472 * 256), torch.zeros(1472 * 256)
    _ = ta + tb
    t_torch = time.perf_counter() - t0
    print(f"compile: 2 x {1472 * 256:,} floats over {tiles} tiles + popops.add")
    print(f"  openipu graph build + compile: {t_ipu * 1e3:9.1f} ms (engine compile alone {e.compile_seconds * 1e3:.1f} ms)")
    print(f"  torch allocate + add:          {t_torch * 1e3:9.1f} ms")
    print(f"  ratio openipu / torch:         {t_ipu / t_torch:9.1f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20000)
    args = ap.parse_args()
    bench_steps(args.steps)
    bench_compile()
