"""Codelets of Poplar tutorials 5 and 6: a dot product per (row, column segment), and a reduction."""

from openipu import poplar


class DotProductVertex(poplar.Vertex):
    a = poplar.Input(poplar.Vector(poplar.FLOAT))
    b = poplar.Input(poplar.Vector(poplar.FLOAT))
    out = poplar.Output(poplar.FLOAT)

    def compute(self):
        self.out = (self.a * self.b).sum()
        return True


class ReduceVertex(poplar.Vertex):
    in_ = poplar.Input(poplar.Vector(poplar.FLOAT))
    out = poplar.Output(poplar.FLOAT)

    def compute(self):
        self.out = self.in_.sum()
        return True
