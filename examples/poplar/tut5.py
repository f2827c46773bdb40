"""Poplar tutorial 5 (matrix-vector multiplication), ported to openipu.

Usage: ``python tut5.py numRows numCols``. One DotProductVertex per matrix row, on tile ``row``.
"""

import os
import sys

import numpy as np

from openipu import poplar, poplibs
from openipu.poplar import program

HERE = os.path.dirname(os.path.abspath(__file__))


def build_multiply_program(graph, matrix, vin, vout):
    mul_cs = graph.addComputeSet("mulCS")
    for i in range(matrix.dim(0)):
        v = graph.addVertex(mul_cs, "DotProductVertex", {"a": matrix[i], "b": vin, "out": vout[i]})
        graph.setTileMapping(v, i)
        graph.setPerfEstimate(v, 20)
    return program.Execute(mul_cs)


def main(argv):
    if len(argv) != 3:
        print(f"usage: {argv[0]} numRows numCols", file=sys.stderr)
        return 1
    rows, cols = int(argv[1]), int(argv[2])
    print(f"Multiplying matrix of size {rows}x{cols} by vector of size {cols}")
    device = poplar.IPUModel().createDevice()
    target = device.getTarget()
    print("Creating new graph object and compiling vertex program additions")
    graph = poplar.Graph(target)
    graph.addCodelets(os.path.join(HERE, "matrix_mul_codelets.py"))
    print("Constructing full compute graph and control program")
    matrix = graph.addVariable(poplar.FLOAT, [rows, cols], "matrix")
    vin = graph.addVariable(poplar.FLOAT, [cols], "inputVector")
    vout = graph.addVariable(poplar.FLOAT, [rows], "outputVector")
    for t in (matrix, vin, vout):
        poplibs.poputil.mapTensorLinearly(graph, t)

    h_matrix = (np.arange(rows, dtype=np.float32)[:, None] * np.arange(cols, dtype=np.float32)[None, :]).reshape(-1)
    h_input = np.arange(cols, dtype=np.float32)
    h_output = np.zeros(rows, np.float32)

    mul_prog = build_multiply_program(graph, matrix, vin, vout)
    in_v = graph.addHostToDeviceFIFO("inputVector", poplar.FLOAT, cols)
    in_m = graph.addHostToDeviceFIFO("inputMatrix", poplar.FLOAT, cols * rows)
    out_s = graph.addDeviceToHostFIFO("out", poplar.FLOAT, rows)
    prog = program.Sequence([program.Copy(in_v, vin), program.Copy(in_m, matrix), mul_prog, program.Copy(vout, out_s)])

    engine = poplar.Engine(graph, prog)
    engine.load(device)
    engine.connectStream("inputVector", h_input)
    engine.connectStream("inputMatrix", h_matrix)
    engine.connectStream("out", h_output)
    print("Running graph program to multiply matrix by vector")
    engine.run()

    for row in range(rows):
        expected = np.float32(0)
        for col in range(cols):
            expected = np.float32(expected + h_matrix[row * cols + col] * h_input[col])
        if h_output[row] != expected:
            print(f"ERROR: output {row}: expected={expected}, actual={h_output[row]}")
            return 1
    print("Multiplication result OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
