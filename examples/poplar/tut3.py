"""Poplar tutorial 3 (writing vertex code), ported to openipu. Usage: ``python tut3.py``."""

import os

from openipu import poplar
from openipu.poplar import program

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    device = poplar.IPUModel().createDevice()
    graph = poplar.Graph(device.getTarget())
    graph.addCodelets(os.path.join(HERE, "tut3_codelets.py"))

    v1 = graph.addVariable(poplar.FLOAT, [4], "v1")
    v2 = graph.addVariable(poplar.FLOAT, [4], "v2")
    for i in range(4):
        graph.setTileMapping(v1[i], i)
        graph.setTileMapping(v2[i], i)

    prog = program.Sequence()
    c1 = graph.addConstant(poplar.FLOAT, [4], [1.0, 1.5, 2.0, 2.5])
    graph.setTileMapping(c1, 0)
    prog.add(program.Copy(c1, v1))

    compute_set = graph.addComputeSet("computeSet")
    for i in range(4):
        vtx = graph.addVertex(compute_set, "SumVertex")
        graph.connect(vtx["in"], v1.slice(i, 4))
        graph.connect(vtx["out"], v2[i])
        graph.setTileMapping(vtx, i)
        graph.setPerfEstimate(vtx, 20)
    prog.add(program.Execute(compute_set))
    prog.add(program.PrintTensor("v2", v2))

    engine = poplar.Engine(graph, prog)
    engine.load(device)
    print("Running program")
    engine.run(0)
    print("Program complete")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
