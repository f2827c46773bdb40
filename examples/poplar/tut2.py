"""Poplar tutorial 2 (using PopLibs), ported to openipu. Usage: ``python tut2.py``."""

from openipu import poplar
from openipu.poplar import program
from openipu.poplibs import popops


def main():
    device = poplar.IPUModel().createDevice()
    graph = poplar.Graph(device.getTarget())
    popops.addCodelets(graph)

    v1 = graph.addVariable(poplar.FLOAT, [2, 2], "v1")
    v2 = graph.addVariable(poplar.FLOAT, [2, 2], "v2")
    for i in range(2):
        for j in range(2):
            graph.setTileMapping(v1[i][j], i * 2 + j)
            graph.setTileMapping(v2[i][j], j * 2 + i)

    prog = program.Sequence()
    c1 = graph.addConstant(poplar.FLOAT, [4], [1.0, 1.5, 2.0, 2.5])
    c2 = graph.addConstant(poplar.FLOAT, [4], [4.0, 3.0, 2.0, 1.0])
    graph.setTileMapping(c1, 0)
    graph.setTileMapping(c2, 0)
    prog.add(program.Copy(c1, v1.flatten()))
    prog.add(program.Copy(c2, v2.flatten()))

    v3 = popops.add(graph, v1, v2, prog, "Add")
    prog.add(program.PrintTensor("v3", v3))
    v4 = popops.add(graph, v3, v2, prog, "Add")
    prog.add(program.PrintTensor("v4", v4))
    v5 = popops.add(graph, v1, v2.transpose(), prog, "Add")
    prog.add(program.PrintTensor("v5", v5))

    engine = poplar.Engine(graph, prog)
    engine.load(device)
    print("Running program")
    engine.run(0)
    print("Program complete")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
