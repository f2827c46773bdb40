"""Codelet of Poplar tutorial 3: SumVertex adds up its input vector."""

from openipu import poplar


class SumVertex(poplar.Vertex):
    in_ = poplar.Input(poplar.Vector(poplar.FLOAT))
    out = poplar.Output(poplar.FLOAT)

    def compute(self):
        self.out = self.in_.sum()
        return True
