"""Predicted QPS of ResNet-50 in fp16 (and fp8) on one C600 (ipu21) through PopRT, beside Byte MLPerf's measurement.

    python benchmarks/poprt_resnet50_qps.py [--batch-sizes 4 32] [--num-io-tiles 32] [--precisions fp16 fp8]

The light ResNet-50 shipped in ``onnx`` (the real architecture, seeded random weights) is compiled
the way Byte MLPerf's IPU backend compiles it (``examples/poprt/byte_mlperf_client.py``: fp16,
``CompilerOptions`` from interact infos, one executable per batch size), then loaded with a
``Runner``. Printed per batch size: the predicted IPU latency and QPS (cost model, steady state with
overlapped I/O), the measured point from ``shared/research/ipu_calibration.md`` (ByteMLPerf
``reports/IPU/resnet50-torch-fp32``: BS 4: 7,062 QPS; BS 32: 13,542 QPS on a C600, PopRT 1.4) and
the ratio; and the host seconds to compile and to load. With ``fp8`` in ``--precisions`` (the
default: fp16 and fp8) the same model is also compiled in fp8 (E4M3, scales calibrated by the
converter on seeded random inputs) and its predicted QPS printed with the speed-up over fp16.
Predicted figures and host figures are different things: the first are for the IPU, the second
for this machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "poprt"))

#: ByteMLPerf IPU report, resnet50-torch-fp32, FP16 on one C600 (see ipu_calibration.md).
MEASURED_QPS = {4: 7062, 32: 13542}


def main(argv=None) -> list[dict]:
    from byte_mlperf_client import IPURunner, compile_model

    from openipu import runner as orunner
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[32])
    p.add_argument("--num-io-tiles", type=int, default=32)
    p.add_argument("--precisions", nargs="+", default=["fp16", "fp8"], choices=["fp16", "fp8"])
    a = p.parse_args(argv)
    model = orunner.randomize_constant_weights(onnx.load(str(orunner.resolve_model("light_resnet50"))), seed=0)
    base = {"compiler_options": {
        "ipu_version": "ipu21", "num_iotiles": a.num_io_tiles, "batches_per_step": 1,
        "available_memory_proportion": 0.6, "partials_type": "half", "stream_buffering_depth": 2,
        "enable_prefetch_datastreams": True}}
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "resnet50.onnx"
        onnx.save(model, str(path))
        del model
        for bs in a.batch_sizes:
            qps16 = None
            for prec in a.precisions:
                interact = dict(base, precision=prec)
                exe, secs = compile_model(path, interact, [bs], Path(d) / prec)[bs]
                t0 = time.perf_counter()
                r = IPURunner(exe).runner
                load = time.perf_counter() - t0
                pr = r.predicted
                meas = MEASURED_QPS.get(bs) if prec == "fp16" else None
                row = {"batch": bs, "precision": prec, "qps": pr.qps, "latency_ms": pr.latency_seconds * 1e3,
                       "measured": meas, "compile_s": secs, "load_s": load}
                rows.append(row)
                print(f"ResNet-50 {prec}, ipu21 (C600), batch {bs}, {a.num_io_tiles} I/O tiles:")
                print(f"  predicted IPU: {pr.qps:,.0f} samples/s, latency {pr.latency_seconds * 1e3:.3f} ms "
                      f"(compute {pr.compute_cycles:,.0f} cycles, host I/O {pr.host_io_cycles:,.0f} cycles per batch)")
                if meas:
                    print(f"  measured (ByteMLPerf, C600, PopRT 1.4): {meas:,} samples/s -> predicted / measured = "
                          f"{pr.qps / meas:.2f}")
                if prec == "fp16":
                    qps16 = pr.qps
                elif qps16:
                    print(f"  predicted fp8 / fp16 = {pr.qps / qps16:.2f}")
                print(f"  host: compile {secs:.1f} s, load {load:.2f} s (load / compile = {load / max(secs, 1e-9):.3f})")
                r.close()
    return rows


if __name__ == "__main__":
    main()
