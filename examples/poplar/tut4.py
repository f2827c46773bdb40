"""Poplar tutorial 4 (profiling), ported to openipu.

Usage: ``python tut4.py [--oom]``. Two matmuls (m1[900,600] x m2[600,300], then x m3[300,200])
through poplin, then ``printProfileSummary``. ``--oom`` uses the README's out-of-memory sizes
(m1[9000,7500], m2[7500,300]) with ``debug.allowOutOfMemory`` false, which raises Poplar's
out-of-memory error. Set ``POPLAR_ENGINE_OPTIONS='{"autoReport.all":"true"}'`` to write a profile.
"""

import sys

from openipu import poplar
from openipu.poplar import program
from openipu.poplibs import poplin, popops, poputil


def main(argv):
    oom = "--oom" in argv
    device = poplar.IPUModel().createDevice()
    graph = poplar.Graph(device.getTarget())
    popops.addCodelets(graph)
    poplin.addCodelets(graph)

    m1 = graph.addVariable(poplar.FLOAT, [9000, 7500] if oom else [900, 600], "m1")
    m2 = graph.addVariable(poplar.FLOAT, [7500, 300] if oom else [600, 300], "m2")
    m3 = graph.addVariable(poplar.FLOAT, [300, 200], "m3")
    for t in (m1, m2, m3):
        poputil.mapTensorLinearly(graph, t)

    prog = program.Sequence()
    m4 = poplin.matMul(graph, m1, m2, prog, "m4")
    poplin.matMul(graph, m4, m3, prog, "m5")

    options = {"debug.retainDebugInformation": "true"}
    if oom:
        options["debug.allowOutOfMemory"] = "false"
    try:
        engine = poplar.Engine(graph, prog, options)
    except poplar.graph_memory_allocation_error as e:
        print(f"poplar::graph_memory_allocation_error: {e}")
        return 1
    engine.load(device)
    print("Running program")
    engine.run(0)
    print("Program complete")
    engine.printProfileSummary(sys.stdout, {"showExecutionSteps": "true"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
