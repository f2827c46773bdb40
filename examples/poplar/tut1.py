"""Poplar tutorial 1 (programs and variables), ported to openipu.

Variables and their tile mapping, a constant, copies, PrintTensor, host read/write handles and a
host-to-device FIFO used as a circular buffer. Usage: ``python tut1.py``.
"""

import numpy as np

from openipu import poplar
from openipu.poplar import program


def main():
    device = poplar.IPUModel().createDevice()
    target = device.getTarget()
    graph = poplar.Graph(target)

    v1 = graph.addVariable(poplar.FLOAT, [4], "v1")
    v2 = graph.addVariable(poplar.FLOAT, [4], "v2")
    v3 = graph.addVariable(poplar.FLOAT, [4, 4], "v3")
    v4 = graph.addVariable(poplar.INT, [10], "v4")
    graph.setTileMapping(v1, 0)
    for i in range(4):
        graph.setTileMapping(v2[i], i)
    graph.setTileMapping(v3, 0)
    graph.setTileMapping(v4, 0)

    prog = program.Sequence()
    c1 = graph.addConstant(poplar.FLOAT, [4], [1.0, 1.5, 2.0, 2.5])
    graph.setTileMapping(c1, 0)
    prog.add(program.Copy(c1, v1))
    prog.add(program.PrintTensor("v1-debug", v1))
    prog.add(program.Copy(v1, v2))
    prog.add(program.PrintTensor("v2-debug", v2))

    graph.createHostWrite("v3-write", v3)
    graph.createHostRead("v3-read", v3)
    v1slice = v1.slice(0, 3)
    v3slice = v3.slice([1, 1], [2, 4])
    prog.add(program.Copy(v1slice, v3slice))

    in_stream = graph.addHostToDeviceFIFO("v4-input-stream", poplar.INT, 10)
    prog.add(program.Copy(in_stream, v4))
    prog.add(program.PrintTensor("v4-0", v4))
    prog.add(program.Copy(in_stream, v4))
    prog.add(program.PrintTensor("v4-1", v4))

    engine = poplar.Engine(graph, prog)
    engine.load(device)

    h3 = np.zeros(16, np.float32)
    engine.writeTensor("v3-write", h3)
    in_data = np.arange(30, dtype=np.int32)
    engine.connectStream("v4-input-stream", in_data)

    print("Running program")
    engine.run(0)
    print("Program complete")

    engine.readTensor("v3-read", h3)
    print("\nh3 data:")
    for i in range(4):
        print("  " + "".join(f"{x:g} " for x in h3[i * 4:(i + 1) * 4]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
