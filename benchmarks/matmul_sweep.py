"""Predicted IPU throughput of poplin matmuls and convolutions, and the planner's host time.

For square matmuls, BERT-Large-shaped matmuls and ResNet-50 convolutions, in fp16 and fp32, on
``ipu2`` (GC200) and ``bow``, prints for each op:

- **predicted IPU** TFLOPS: 2 x MACs / (the plan's estimated cycles / the target's clock), for one IPU;
- the fraction of the target's peak (``2 x AMP MACs/cycle/tile x tiles x clock`` from the
  target table, for the op's input type with float partials, the default ``partialsType``:
  ipu2 fp16 32, fp32 16 MACs/cycle/tile);
- the **host** time to plan the op (milliseconds of wall time on this machine, cold cache).

Then it sets the model beside the calibration points of ``shared/research/ipu_calibration.md``
(nothing here is fitted to them):

- ``gc-flops`` FP32 peak on Bow, 87.1078 TFLOPS: the target's fp32 peak, and the best fp32
  matmul of the sweep as a fraction of it;
- ResNet-50 inference on one C600 (``ipu21``), FP16, batch 32: 13,542 images/s (ByteMLPerf).
  The sum of the predicted cycles of all 53 convolutions and the final fully-connected layer at
  batch 32 gives an upper bound on images/s (the other layers are not counted).

It also builds one matmul into a graph and runs it on an IPU Model, to show the engine's
predicted cycles beside the planner's estimate. Usage: ``python benchmarks/matmul_sweep.py
[--quick]``; runs in about a minute.
"""

from __future__ import annotations

import argparse
import sys
import time

from openipu import poplar
from openipu.poplibs import poplin
from openipu.poplibs.poplin import InputTransform as IT
from openipu.poplibs.poplin import OutputTransform as OT

GC_FLOPS_BOW_FP32 = 87.1078e12          # ipu_calibration.md: gc-flops FP32 peak, Bow, per IPU
RESNET50_C600_QPS = 13_542              # ipu_calibration.md: ByteMLPerf ResNet-50, C600, FP16, batch 32


def target(version):
    return poplar.IPUModel(version).createDevice().getTarget()


def peak_flops(t, in_type, partials):
    return 2 * t.getAmpMacsPerCycle(in_type, partials) * t.getNumTiles() * t.getTileClockFrequency()


def conv(N, hw, k, ci, co, stride=1):
    pad = k // 2
    return poplin.ConvParams(poplar.HALF, N, [hw, hw], [k, k], ci, co, 1,
                             inputTransform=IT(paddingLower=[pad, pad], paddingUpper=[pad, pad]),
                             outputTransform=OT(stride=[stride, stride]))


def resnet50_convs(N):
    """(name, ConvParams) of ResNet-50 v1.5's convolutions at batch N (fp16, 224x224 input)."""
    layers = [("conv1 7x7/2 3->64 @224", conv(N, 224, 7, 3, 64, 2))]
    cin, hw = 64, 56
    for stage, (mid, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        out = mid * 4
        for b in range(blocks):
            s = 2 if (b == 0 and stage > 0) else 1
            tag = f"res{stage + 2}.{b}"
            layers.append((f"{tag} 1x1 {cin}->{mid} @{hw}", conv(N, hw, 1, cin, mid)))
            layers.append((f"{tag} 3x3/{s} {mid}->{mid} @{hw}", conv(N, hw, 3, mid, mid, s)))
            hw2 = hw // s
            layers.append((f"{tag} 1x1 {mid}->{out} @{hw2}", conv(N, hw2, 1, mid, out)))
            if b == 0:
                layers.append((f"{tag} ds 1x1/{s} {cin}->{out} @{hw}", conv(N, hw, 1, cin, out, s)))
            cin, hw = out, hw2
    return layers


def plan_op(kind, spec, t, dtype, options):
    cache = poplin.PlanningCache()
    t0 = time.perf_counter()
    if kind == "mm":
        g, m, k, n = spec
        plan = poplin.plan_matmul(g, m, k, n, dtype, t, options, cache)
        macs = float(g) * m * k * n
    else:
        p = spec if dtype == poplar.HALF else spec._with(inputType=dtype, outputType=dtype)
        plan = poplin.plan_convolution(p, t, options, cache)
        macs = poplin.getFwdFlops(p) / 2
    return plan, macs, (time.perf_counter() - t0) * 1e3


def sweep(quick: bool):
    sq = [512, 1024, 2048] if quick else [512, 1024, 2048, 4096]
    tokens = 384 * 4                     # BERT-Large, sequence 384, micro-batch 4
    ops = [(f"square {s}", "mm", (1, s, s, s)) for s in sq]
    ops += [("BERT QKV [1536x1024]x[1024x3072]", "mm", (1, tokens, 1024, 3072)),
            ("BERT attn-out [1536x1024]x[1024x1024]", "mm", (1, tokens, 1024, 1024)),
            ("BERT FF1 [1536x1024]x[1024x4096]", "mm", (1, tokens, 1024, 4096)),
            ("BERT FF2 [1536x4096]x[4096x1024]", "mm", (1, tokens, 4096, 1024)),
            ("BERT scores 64x[384x64]x[64x384]", "mm", (64, 384, 64, 384))]
    picked = ("conv1 ", "res2.0 3x3", "res2.1 1x1 256->64", "res3.1 3x3", "res4.1 1x1 1024->256",
              "res4.1 3x3", "res5.1 1x1 512->2048", "res5.1 3x3")
    for N in (16, 32):
        for name, p in resnet50_convs(N):
            if name.startswith(picked):
                ops.append((f"ResNet50 b{N} {name}", "conv", p))
    rows = []
    print("Default options (availableMemoryProportion 0.6, partialsType float). '% peak': of the target's peak for\n"
          "the input type with float partials. 'serial': serial steps of the plan.\n")
    print(f"{'op':<44} {'tgt':<5} {'type':<5} {'predicted IPU TFLOPS':>21} {'% peak':>7} {'tiles':>6} "
          f"{'serial':>6} {'host plan ms':>13}")
    for name, kind, spec in ops:
        for tv in ("ipu2", "bow"):
            t = target(tv)
            for dtype in (poplar.HALF, poplar.FLOAT):
                try:
                    plan, macs, ms = plan_op(kind, spec, t, dtype, None)
                except poplin.poplibs_error as e:
                    print(f"{name:<44} {tv:<5} {dtype.name:<5} no plan fits: {str(e)[:60]}...")
                    continue
                secs = plan.cycles / t.getTileClockFrequency()
                tf = 2 * macs / secs / 1e12
                pk = peak_flops(t, dtype, poplar.FLOAT)
                rows.append((name, tv, dtype.name, tf, 2 * macs / secs / pk, ms))
                print(f"{name:<44} {tv:<5} {dtype.name:<5} {tf:>21.1f} {100 * tf * 1e12 / pk:>6.1f}% "
                      f"{plan.tiles:>6} {plan.serial_steps:>6} {ms:>13.1f}")
    return rows


def calibration(rows):
    print("\nCalibration points (ipu_calibration.md; not fitted):")
    bow = target("bow")
    pk = peak_flops(bow, poplar.FLOAT, poplar.FLOAT)
    print(f"  gc-flops FP32 peak, Bow: published {GC_FLOPS_BOW_FP32 / 1e12:.4f} TFLOPS; target table "
          f"{pk / 1e12:.4f} TFLOPS (ratio {pk / GC_FLOPS_BOW_FP32:.4f})")
    best = max((r for r in rows if r[1] == "bow" and r[2] == "float"), key=lambda r: r[3], default=None)
    if best:
        print(f"  best fp32 op of the sweep on Bow: {best[0]}: predicted IPU {best[3]:.1f} TFLOPS = "
              f"{100 * best[3] * 1e12 / GC_FLOPS_BOW_FP32:.1f}% of gc-flops' measured peak")
    c600 = target("ipu21")
    for partials in ("float", "half"):
        total, host = 0.0, 0.0
        layers = resnet50_convs(32)
        for _, p in layers:
            plan, _, ms = plan_op("conv", p, c600, poplar.HALF, {"partialsType": partials})
            total += plan.cycles
            host += ms
        fc, _, ms = plan_op("mm", (1, 32, 2048, 1000), c600, poplar.HALF, {"partialsType": partials})
        total += fc.cycles
        host += ms
        secs = total / c600.getTileClockFrequency()
        qps = 32 / secs
        print(f"  ResNet-50 C600 fp16 batch 32 ({partials} partials): {len(layers)} convs + FC predicted IPU "
              f"{total:,.0f} cycles = {secs * 1e3:.3f} ms -> at most {qps:,.0f} images/s (convs and FC only); "
              f"published {RESNET50_C600_QPS:,} images/s (ratio {qps / RESNET50_C600_QPS:.2f}); host planning "
              f"{host:.0f} ms for {len(layers) + 1} ops")


def engine_check():
    print("\nPlanner estimate against the engine (one op built, run on an ipu2 IPU Model):")
    from openipu.poplar import program as P
    dev = poplar.IPUModel("ipu2").createDevice()
    g = poplar.Graph(dev.getTarget())
    m = k = n = 1024
    a = poplin.createMatMulInputLHS(g, poplar.HALF, [m, k], [k, n], "a")
    b = poplin.createMatMulInputRHS(g, poplar.HALF, [m, k], [k, n], "b")
    prog = P.Sequence()
    t0 = time.perf_counter()
    poplin.matMul(g, a, b, prog, "c")
    build = time.perf_counter() - t0
    plan = poplin.plan_matmul(1, m, k, n, poplar.HALF, dev.getTarget())
    eng = poplar.Engine(g, prog)
    eng.load(dev)
    t0 = time.perf_counter()
    eng.run(0)
    run = time.perf_counter() - t0
    print(f"  matMul [1024x1024]x[1024x1024] fp16: planner predicted IPU {plan.cycles:,.0f} cycles, engine predicted "
          f"IPU {eng.last_run_cycles:,} cycles (ratio {eng.last_run_cycles / plan.cycles:.3f}); host: build "
          f"{build * 1e3:.0f} ms, run {run * 1e3:.0f} ms")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer square sizes")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = sweep(args.quick)
    calibration(rows)
    engine_check()
    print(f"\nhost wall time {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
