"""Module-level codelets used by the tests (module level so executables can be serialised)."""

import torch

from openipu import poplar


class Scale(poplar.Vertex):
    x = poplar.InOut(poplar.Vector(poplar.FLOAT))
    k = poplar.Value(poplar.FLOAT)

    def compute(self):
        self.x = self.x * self.k


class Incr(poplar.Vertex):
    x = poplar.InOut(poplar.INT)

    def compute(self):
        self.x = self.x + 1


class DataDependent(poplar.Vertex):
    """Python control flow on data: cannot run under vmap, runs vertex by vertex."""
    in_ = poplar.Input(poplar.Vector(poplar.FLOAT))
    out = poplar.Output(poplar.FLOAT)

    def compute(self):
        total = 0.0
        for v in self.in_.tolist():
            if v > 0:
                total += v
        self.out = total


class ListSum(poplar.Vertex):
    in_ = poplar.Input(poplar.VectorList(poplar.FLOAT))
    out = poplar.Output(poplar.Vector(poplar.FLOAT))

    def compute(self):
        self.out = torch.stack([x.sum() for x in self.in_])


class Halver(poplar.MultiVertex):
    x = poplar.InOut(poplar.Vector(poplar.HALF))

    def compute(self, worker_id):
        n = self.x.shape[0]
        lo, hi = worker_id * n // 6, (worker_id + 1) * n // 6
        self.x[lo:hi] = self.x[lo:hi] / 2
