"""Run Byte MLPerf's IPU backend, unmodified, on the simulated IPU, with local random-weight models.

Byte MLPerf's backend (``byte_infer_perf/general_perf/backends/IPU`` of bytedance/ByteMLPerf) is
imported from a checkout you make; nothing of it is copied here. This script plays Byte MLPerf's
``core/perf_engine.py`` for one task, in its order: ``get_interact_profile`` (answering its
precision question with ``fp16``, as a user picking the default in the dialog), ``pre_optimize``,
``get_best_batch_size``, ``compile``, then for each batch size the runtime backend's ``load``,
``predict`` (checked against onnxruntime) and ``benchmark``.

    git clone <ByteMLPerf snapshot> /tmp/bytemlperf          # a throwaway checkout: the backend
                                                               # writes compiled_models/ into it
    python examples/poprt/byte_mlperf_backend.py --checkout /tmp/bytemlperf --task resnet50-torch-fp32
    python examples/poprt/byte_mlperf_backend.py --checkout /tmp/bytemlperf --task bert-torch-fp32

Models (random weights, seeded; no download): ``resnet50-torch-fp32`` is torchvision's ResNet-50
(v1.5, built here in plain torch, with a softmax: output ``softmax_tensor:0``), ``bert-torch-fp32``
is ``transformers``' ``BertForQuestionAnswering`` with ``BertConfig()`` (BERT-base; ``--layers``
for fewer layers), wrapped as ``model`` so that its exported node names are those Byte MLPerf's
pack-mode rewrite looks for. Both are exported with PyTorch's TorchScript-based ONNX exporter
(opset 11, the input and output names and dynamic batch axis of Byte MLPerf's
``tools/torch_to_onnx.py``) into the backend's ``pre_optimized_models/<task>.onnx``, where
``pre_optimize`` finds a converted model and skips its own conversion: Byte MLPerf's converter
calls ``torch.onnx.export`` with the defaults of its pinned torch 1.13, and this environment's
torch defaults to the dynamo exporter, whose node names differ.

Harness details (not the backend): ``tools/saved_to_onnx.py`` imports ``tf2onnx`` at import time,
for TensorFlow models only; when it is not installed a placeholder module is registered that
raises if used. ``--iterations`` sets the workload's ``iterations`` (Byte MLPerf's workloads say
100; each simulated batch takes host seconds to minutes).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np


# -- local models --------------------------------------------------------------------------------
def resnet50(seed: int = 0):
    """torchvision's ResNet-50 (v1.5: the stride on the 3x3 convolution), random weights, eval mode,
    with a softmax on the logits. Input ``[N, 3, 224, 224]`` float32, output ``[N, 1000]``."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride, down):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(width * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = nn.Sequential(nn.Conv2d(cin, width * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(width * 4)) if down else None

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + idt)

    class ResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            cin, layers = 64, []
            for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                mods = []
                for b in range(blocks):
                    mods.append(Bottleneck(cin, width, stride if b == 0 else 1, b == 0))
                    cin = width * 4
                layers.append(nn.Sequential(*mods))
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(2048, 1000)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return torch.softmax(self.fc(torch.flatten(self.avgpool(x), 1)), dim=1)

    torch.manual_seed(seed)
    m = ResNet50()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for mod in m.modules():          # trained-like batch-norm statistics, residual branches damped
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
            if isinstance(mod, Bottleneck):
                mod.bn3.weight.mul_(0.3)
        m.fc.weight.mul_(30.0)            # logits of a few units: a peaked softmax, a telling top-1
    return m.eval()


def bert_squad(layers: int | None = None, seed: int = 0):
    """``BertForQuestionAnswering(BertConfig())`` (random weights, eager attention) as the
    attribute ``model`` of a module taking ``(input_ids, attention_mask, token_type_ids)`` and
    returning ``(start_logits, end_logits)`` ``[N, S]``."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering
    torch.manual_seed(seed)
    cfg = BertConfig() if layers is None else BertConfig(num_hidden_layers=layers)

    class Squad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = BertForQuestionAnswering(cfg).eval()
            self.model.config._attn_implementation = "eager"

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return o.start_logits, o.end_logits

    return Squad().eval()


def export_onnx(model, model_info: dict, path: Path) -> None:
    """Export as Byte MLPerf's ``tools/torch_to_onnx.py`` does (opset 11, names from the model-zoo
    JSON, batch axis dynamic), with PyTorch's TorchScript-based exporter."""
    import torch
    names = model_info["inputs"].split(",")
    outs = model_info["outputs"].split(",")
    types_ = [t.strip().lower() for t in model_info["input_type"].split(",")]
    ex = []
    for (name, shape), t in zip(model_info["input_shape"].items(), types_):
        ex.append(torch.zeros(shape, dtype=torch.int64) if t in ("long", "int64") else torch.rand(shape))
    path.parent.mkdir(parents=True, exist_ok=True)
    dyn = {n: {0: "batch_size"} for n in names + outs}
    torch.onnx.export(model, tuple(ex), str(path), opset_version=11, input_names=names, output_names=outs,
                      dynamic_axes=dyn, dynamo=False)


# -- onnxruntime reference --------------------------------------------------------------------------
def ort_session(path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


# -- the perf engine's sequence ----------------------------------------------------------------------
def _setup_imports(root: Path) -> None:
    os.chdir(root)
    for p in (str(root / "general_perf"), str(root)):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        import tf2onnx  # noqa: F401
    except ImportError:
        stub = types.ModuleType("tf2onnx")

        def _missing(*_a, **_k):
            raise ImportError("tf2onnx is not installed (only TensorFlow models need it)")
        stub.convert = types.SimpleNamespace(from_graph_def=_missing)
        stub.tf_loader = types.ModuleType("tf2onnx.tf_loader")
        sys.modules["tf2onnx"] = stub
        sys.modules["tf2onnx.tf_loader"] = stub.tf_loader


def run(args) -> dict:
    root = Path(args.checkout).resolve() / "byte_infer_perf"
    _setup_imports(root)
    from general_perf.backends.IPU.compile_backend_ipu import CompileBackendIPU
    from general_perf.backends.IPU.runtime_backend_ipu import RuntimeBackendIPU

    task = args.task
    model_info = json.loads((root / "general_perf/model_zoo" / f"{task}.json").read_text())
    workload = json.loads((root / "general_perf/workloads" / f"{task}.json").read_text())
    workload["iterations"] = args.iterations
    onnx_path = root / "general_perf/backends/IPU/pre_optimized_models" / f"{model_info['model']}.onnx"
    if not onnx_path.exists():
        t0 = time.perf_counter()
        model = resnet50() if task.startswith("resnet50") else bert_squad(args.layers)
        export_onnx(model, model_info, onnx_path)
        print(f"[harness] exported {onnx_path.name} in {time.perf_counter() - t0:.1f} s")
    ref_model = str(onnx_path)

    cb = CompileBackendIPU()
    print(f"[harness] backend version (poprt.__version__): {cb.version()}")
    pre = {"workload": workload, "model_info": model_info}
    profile = cb.get_interact_profile(pre)
    answers = {q["name"]: "fp16" for q in profile if q["name"] == "precision"}
    print(f"[harness] interact profile asks {[q['name'] for q in profile]}; answers {answers}")
    pre["interact_info"] = answers
    pre = cb.pre_optimize(pre)
    best = cb.get_best_batch_size()
    if isinstance(best, list):
        pre["workload"]["batch_sizes"] = best
    if args.batch_sizes:
        pre["workload"]["batch_sizes"] = args.batch_sizes
        cb.model_config["batch_sizes"] = args.batch_sizes
    t0 = time.perf_counter()
    info = cb.compile(pre, None)
    print(f"[harness] compile: {info['compile_status']}, precision {info['compile_precision']}, "
          f"{time.perf_counter() - t0:.0f} s host")

    rb = RuntimeBackendIPU()
    rb.configs, rb.workload, rb.model_info = info, workload, model_info
    report = {"task": task, "version": cb.version(), "batches": []}
    ref = ort_session(ref_model)
    pack = bool(info["interact_info"].get("pack_config"))
    for bs in (pre["workload"]["batch_sizes"] if not pack else [1]):
        t0 = time.perf_counter()
        rb.load(bs)
        print(f"[harness] load batch {bs}: {time.perf_counter() - t0:.0f} s host; runner "
              f"{type(rb.engine.runner).__name__}")
        entry = {"batch": bs}
        if pack:
            entry.update(check_bert_pack(rb, ref, args))
        else:
            entry.update(check_resnet(rb, ref, bs, args))
        if args.iterations and args.timing == "predicted":
            # the backend's own benchmark with the runner in predicted-time mode: a new load reads
            # OPENIPU_TIMING, and each execute then takes the predicted IPU time
            os.environ["OPENIPU_TIMING"] = "predicted"
            try:
                rb.batch_size = None        # the backend loads a runner only when the batch size changes
                rb.engine = None
                rb.load(bs)
                t0 = time.perf_counter()
                entry["benchmark"] = bench = rb.benchmark(None)
            finally:
                os.environ.pop("OPENIPU_TIMING", None)
            runner = rb.engine.runner
            want = runner.predicted_qps() if hasattr(runner, "predicted_qps") else runner.predicted.qps
            entry["predicted_qps"] = want
            print(f"[harness] benchmark batch {bs} in predicted-time mode: {bench} "
                  f"({time.perf_counter() - t0:.0f} s host); the backend's QPS / predicted QPS "
                  f"{bench['QPS']:,} / {want:,.0f} = {bench['QPS'] / want:.3f}")
        elif args.iterations:
            t0 = time.perf_counter()
            entry["benchmark"] = rb.benchmark(None)
            print(f"[harness] benchmark batch {bs}: {entry['benchmark']} ({time.perf_counter() - t0:.0f} s host)")
        runner = rb.engine.runner
        entry["runner"] = runner.report()
        print(f"[harness] {entry['runner']}; {getattr(runner, 'host_stats', dict)()}")
        report["batches"].append(entry)
    return report


def check_resnet(rb, ref, bs: int, args) -> dict:
    rng = np.random.default_rng(bs)
    x = rng.standard_normal((bs, 3, 224, 224)).astype(np.float32)
    t0 = time.perf_counter()
    out = rb.predict({"input_1.1": x})["softmax_tensor:0"].astype(np.float32)
    secs = time.perf_counter() - t0
    want = ref.run(["softmax_tensor:0"], {"input_1.1": x})[0]
    err = float(np.abs(out - want).max())
    top1 = int((out.argmax(1) == want.argmax(1)).sum())
    print(f"[harness] ResNet-50 batch {bs}: predict {secs:.1f} s host; max |ipu - onnxruntime| = {err:.3g} "
          f"(largest probability {float(want.max()):.3g}); top-1 agree {top1}/{bs}")
    return {"max_abs_err": err, "max_prob": float(want.max()), "top1_agree": f"{top1}/{bs}", "predict_s": secs}


def check_bert_pack(rb, ref, args) -> dict:
    """``args.samples`` SQuAD-like samples of random lengths, padded to 384 as Byte MLPerf's
    dataset gives them, sent by concurrent callers of ``predict`` (the pack runner packs them);
    each sample's logits against onnxruntime running it alone."""
    rng = np.random.default_rng(7)
    lens = rng.integers(20, 384, args.samples)
    samples, results = [], [None] * len(lens)
    for n in lens:
        ids = np.zeros((1, 384), np.int64)
        ids[0, :n] = rng.integers(1000, 30000, n)
        ids[0, 0] = 101
        mask = np.zeros((1, 384), np.int64)
        mask[0, :n] = 1
        tt = np.zeros((1, 384), np.int64)
        tt[0, n // 2:n] = 1
        samples.append({"input_ids.1": ids, "attention_mask.1": mask, "token_type_ids.1": tt})

    def client(i):
        results[i] = rb.predict(dict(samples[i]))
    t0 = time.perf_counter()
    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(samples))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    secs = time.perf_counter() - t0
    errs, scale = [], 0.0
    for s, r, n in zip(samples, results, lens):
        want = ref.run(["start_logits", "end_logits"], s)
        for k, name in enumerate(("start_logits", "end_logits")):
            got = r[name].reshape(-1)[:n].astype(np.float32)
            errs.append(float(np.abs(got - want[k][0, :n]).max()))
            scale = max(scale, float(np.abs(want[k][0, :n]).max()))
    stats = rb.engine.runner.pack_stats()
    print(f"[harness] BERT pack: {len(lens)} samples (lengths {sorted(int(x) for x in lens)}) by concurrent "
          f"callers in {secs:.0f} s host; max |ipu - onnxruntime| over the valid tokens = {max(errs):.3g} "
          f"(logit scale {scale:.3g}); packing {stats}")
    return {"max_abs_err": max(errs), "logit_scale": scale, "pack_stats": stats, "predict_s": secs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkout", required=True, help="a ByteMLPerf checkout (it gets compiled_models/ written)")
    p.add_argument("--task", default="resnet50-torch-fp32", choices=["resnet50-torch-fp32", "bert-torch-fp32"])
    p.add_argument("--batch-sizes", type=int, nargs="+", help="instead of the interact infos' batch_sizes")
    p.add_argument("--iterations", type=int, default=2, help="benchmark iterations per client (0: no benchmark)")
    p.add_argument("--layers", type=int, help="BERT layers (default 12, BERT-base)")
    p.add_argument("--samples", type=int, default=8, help="BERT samples checked against onnxruntime")
    p.add_argument("--timing", choices=["host", "predicted"], default="host",
                   help="benchmark with the runner in host time (the simulation's) or predicted time (the modelled "
                        "IPU's: the backend's QPS and latencies become predictions; OPENIPU_TIMING=predicted)")
    p.add_argument("--report", help="write the results as JSON here")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s: %(message)s")
    rep = run(a)
    if a.report:
        Path(a.report).write_text(json.dumps(rep, indent=2, default=str))
    print(json.dumps(rep, indent=2, default=str))


if __name__ == "__main__":
    main()
