"""Poplar tutorial 6 (matrix-vector optimisation), ported to openipu.

Usage: ``python tut6.py numRows numCols [--device model-ipu2|model-ipu1|ipu] [--profile]``.
The host searches the column split with a cycle estimate built from the target (tiles, worker
contexts, exchange bytes per cycle), builds the graph for the best split, runs it and checks
the result. ``--profile`` prints the profile summary (predicted IPU cycles) at the end.
"""

import os
import sys

import numpy as np

from openipu import poplar
from openipu.poplar import program

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICES = ("model-ipu1", "model-ipu2", "ipu")
SIZEOF_FLOAT = 4


def ceil_div(a, b):
    return (a + b - 1) // b


def estimate_cycles(target, rows, cols, split, verbose=False):
    """The tutorial's estimate of the cycles of the multiply for a column split."""
    tiles, workers, xbpc = target.getNumTiles(), target.getNumWorkerContexts(), target.getExchangeBytesPerCycle()
    max_vertices = max(ceil_div(rows * split, tiles), 1)
    vertex_cycles = 5 + (ceil_div(cols, split) + 1) // 2
    compute = ceil_div(max_vertices, workers) * workers * vertex_cycles
    exchange = ceil_div(max_vertices, rows) * ceil_div(cols, split) * SIZEOF_FLOAT // xbpc
    max_reduce_vertices = max(ceil_div(rows, tiles), 1)
    reduce_compute = ceil_div(max_reduce_vertices, workers) * workers * (5 + (split + 1) // 2)
    reduce_exchange = max_reduce_vertices * split * SIZEOF_FLOAT // xbpc
    total = compute + exchange + reduce_compute + reduce_exchange
    if verbose:
        print(f"colsAxisSplit={split}, total cost={total} (compute cost={compute}, exchange cost={exchange}, "
              f"reduce exchange cost={reduce_exchange}, reduce compute cost={reduce_compute})")
    return total


def calc_optimal_col_axis_split(target, rows, cols):
    best, best_cost, worst_cost = 1, 2**32 - 1, 0
    for split in range(1, cols):
        cost = estimate_cycles(target, rows, cols, split)
        if cost < best_cost:
            best, best_cost = split, cost
        worst_cost = max(worst_cost, cost)
    print("Best split chosen:")
    estimate_cycles(target, rows, cols, best, verbose=True)
    print(f"Worst cost seen: {worst_cost}")
    return best


def build_multiply_program(graph, matrix, vin, vout):
    target = graph.getTarget()
    rows, cols = matrix.shape()
    tiles = target.getNumTiles()
    split = calc_optimal_col_axis_split(target, rows, cols)
    partials = graph.addVariable(poplar.FLOAT, [rows, split], "partials")
    for i in range(cols):
        graph.setTileMapping(vin[i], i * tiles // cols)
    mul_cs = graph.addComputeSet("mulCS")
    for i in range(split):
        begin, end = i * cols // split, (i + 1) * cols // split
        if begin == end:
            continue
        for row in range(rows):
            v = graph.addVertex(mul_cs, "DotProductVertex", {
                "a": matrix[row].slice(begin, end), "b": vin.slice(begin, end), "out": partials[row][i]})
            tile = (i * rows + row) * tiles // (split * rows)
            graph.setTileMapping(v, tile)
            graph.setTileMapping(matrix[row].slice(begin, end), tile)
            graph.setTileMapping(partials[row][i], tile)
            graph.setPerfEstimate(v, 5 + (end - begin + 1) // 2)
    reduce_cs = graph.addComputeSet("reduceCS")
    for row in range(rows):
        v = graph.addVertex(reduce_cs, "ReduceVertex", {"in": partials[row], "out": vout[row]})
        tile = row * tiles // rows
        graph.setTileMapping(v, tile)
        graph.setTileMapping(vout[row], tile)
        graph.setPerfEstimate(v, 5 + (split + 1) // 2)
    return program.Sequence([program.Execute(mul_cs), program.Execute(reduce_cs)])


def parse_args(argv):
    rows = cols = 0
    device, profile = "model-ipu2", False
    args = iter(argv[1:])
    for a in args:
        if a == "--device":
            device = next(args, None)
            if device is None:
                print("Missing argument following --device")
                return None
            if device not in DEVICES:
                print(f"Unrecognised device {device}")
                return None
        elif a == "--profile":
            profile = True
        elif not rows:
            rows = int(a) if a.isdigit() else 0
            if not rows:
                print("Malformed numRows argument")
                return None
        elif not cols:
            cols = int(a) if a.isdigit() else 0
            if not cols:
                print("Malformed numCols argument")
                return None
        else:
            print("Unexpected arguments")
            return None
    if not rows or not cols:
        print("Missing rows/cols arguments")
        return None
    return rows, cols, device, profile


def main(argv):
    parsed = parse_args(argv)
    if parsed is None:
        print("Failed to parse arguments")
        print(f"usage: {argv[0]} numRows numCols --device {{model-ipu1,model-ipu2,ipu}}", file=sys.stderr)
        return 255
    rows, cols, dev, profile = parsed
    print(f"Device {dev}")
    print(f"Multiplying matrix of size {rows}x{cols} by vector of size {cols}")
    print("Constructing compute graph and control program")
    if dev == "ipu":
        print("Trying to attach to IPU")
        device = next((d for d in poplar.DeviceManager.createDeviceManager().getDevices(poplar.TargetType.IPU, 1)
                       if d.attach()), None)
        if device is None:
            print("Error attaching to device", file=sys.stderr)
            return 1
        print(f"Attached to IPU {device.getId()}")
    else:
        model = poplar.IPUModel(dev[6:])
        model.minIPUSyncDelay = 0
        model.relativeSyncDelay = poplar.IPUModel.RelativeSyncDelayType.NO_DELAY
        device = model.createDevice()
    graph = poplar.Graph(device)
    graph.addCodelets(os.path.join(HERE, "matrix_mul_codelets.py"))
    matrix = graph.addVariable(poplar.FLOAT, [rows, cols], "matrix")
    vin = graph.addVariable(poplar.FLOAT, [cols], "inputVector")
    vout = graph.addVariable(poplar.FLOAT, [rows], "outputVector")

    h_matrix = (np.arange(rows, dtype=np.float32)[:, None] * np.arange(cols, dtype=np.float32)[None, :]).reshape(-1)
    h_input = np.arange(cols, dtype=np.float32)
    h_output = np.zeros(rows, np.float32)

    mul_prog = build_multiply_program(graph, matrix, vin, vout)
    in_v = graph.addHostToDeviceFIFO("inputVector", poplar.FLOAT, cols)
    in_m = graph.addHostToDeviceFIFO("inputMatrix", poplar.FLOAT, cols * rows)
    out_s = graph.addDeviceToHostFIFO("out", poplar.FLOAT, rows)
    prog = program.Sequence([program.Copy(in_v, vin), program.Copy(in_m, matrix), mul_prog, program.Copy(vout, out_s)])
    engine = poplar.Engine(graph, prog, {"autoReport.all": "true", "autoReport.directory": os.environ.get("TUT6_REPORT_DIR", "./report")}
                           if os.environ.get("TUT6_REPORT_DIR") else {})
    engine.load(device)
    engine.connectStream("inputVector", h_input)
    engine.connectStream("inputMatrix", h_matrix)
    engine.connectStream("out", h_output)
    print("Running graph program to multiply matrix by vector")
    engine.run()

    expected = h_matrix.reshape(rows, cols).astype(np.float64) @ h_input.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(1 - expected / h_output)
    bad = np.flatnonzero(rel > 1e-5)
    if bad.size:
        r = int(bad[0])
        print(f"ERROR: output {r}: expected={expected[r]}, actual={h_output[r]}, relative error={rel[r]}")
        return 1
    print("Multiplication result OK")
    if profile:
        engine.printProfileSummary(sys.stdout, {"showExecutionSteps": "true"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
