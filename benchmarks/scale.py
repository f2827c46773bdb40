"""Host cost at scale: what simulating real models at their real batch sizes costs this machine.

    python benchmarks/scale.py [--models bert-base,resnet50,...] [--offline-only] [--cache DIR]

Per model it runs ``openipu run`` twice, each in its own process under ``/usr/bin/time -v``:
the functional run (compile, then run one step with torch kernels) and the offline run
(``--offline``: compile and predict, no device memory, no kernels); and onnxruntime on the same
model and inputs as the peer. Printed, per model and run:

- IPU tensor elements: the elements of every variable of the compiled graph;
- peak host RSS (``/usr/bin/time``), host bytes per element, host compile and run seconds;
- the predicted IPU throughput (a prediction of the cost model, not a host figure);
- for the functional run, max |openipu - onnxruntime| over the output scale (onnxruntime runs
  the fp32 model; openipu the model in the precision named).

Models (random weights, exported once with ``torch.onnx.export(dynamo=True)`` into the cache):
BERT-base SQuAD 40 x 384 fp16 on ipu21 (available memory proportion 0.3: at the default 0.6
its matmul temporaries do not fit); BERT-large SQuAD 8 x 384 fp16 sharded over 4 ipu2;
GPT-2 small 1 x 1024 fp16 on ipu21; light ResNet-50 (random weights) 32 fp16 on ipu21;
all-MiniLM-L6-v2 (real weights) 2 x 16 fp32 on ipu2. Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "models"))

MODELS = {
    "bert-base": {"arch": "bert-base-squad", "batch": 40, "seq": 384,
                  "run": ["--ipu", "ipu21", "--precision", "fp16", "--available-memory-proportion", "0.3"],
                  "label": "BERT-base SQuAD 40x384 fp16, ipu21, AMP 0.3"},
    "bert-large": {"arch": "bert-large-squad", "batch": 8, "seq": 384,
                   "run": ["--ipu", "ipu2", "--num-ipus", "4", "--precision", "fp16"],
                   "label": "BERT-large SQuAD 8x384 fp16, 4 x ipu2"},
    "gpt2": {"arch": "gpt2", "batch": 1, "seq": 1024, "run": ["--ipu", "ipu21", "--precision", "fp16"],
             "label": "GPT-2 small 1x1024 fp16, ipu21"},
    "resnet50": {"arch": "light_resnet50", "batch": 32, "run": ["--ipu", "ipu21", "--precision", "fp16", "--batch-size", "32"],
                 "label": "ResNet-50 (light, random weights) 32 fp16, ipu21",
                 "published": ("13,542 samples/s: one C600, fp16, batch 32, PopRT 1.4 (ByteMLPerf; a calibration "
                               "point of research/ipu_calibration.md)")},
    "minilm": {"arch": "minilm", "batch": 2, "seq": 16, "run": ["--ipu", "ipu2"],
               "label": "all-MiniLM-L6-v2 2x16 fp32, ipu2"},
}


def model_path(name: str, cache: Path) -> Path:
    """The ONNX file of a benchmark model, exported into ``cache`` on first use."""
    m = MODELS[name]
    if m["arch"] == "light_resnet50":
        p = cache / "resnet50_random.onnx"
        if not p.exists():
            import onnx

            from openipu import runner
            cache.mkdir(parents=True, exist_ok=True)
            onnx.save(runner.randomize_constant_weights(onnx.load(str(runner.resolve_model("light_resnet50"))), 0), str(p))
        return p
    if m["arch"] == "minilm":
        p = cache / "minilm.onnx"
        if not p.exists():
            from export_minilm import export
            cache.mkdir(parents=True, exist_ok=True)
            export(p, m["batch"], m["seq"])
        return p
    p = cache / f"{name}_b{m['batch']}_s{m['seq']}.onnx"
    if not p.exists():
        from export_transformers import export
        export(m["arch"], p, m["batch"], m["seq"])
    return p


def _timed(cmd: list[str]) -> tuple[int, str, float]:
    """Run ``cmd`` under /usr/bin/time -v: (exit status, output, peak RSS bytes)."""
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stdout)
    return p.returncode, p.stdout, (int(m.group(1)) * 1024 if m else float("nan"))


def _one(mode: str, path: str, args: list[str], io_dir: str) -> None:
    """Child process: one openipu run (mode functional / offline) or the onnxruntime peer."""
    from openipu import runner
    import onnx
    inputs_file = Path(io_dir) / "inputs.npz"
    if mode == "ort":
        import onnxruntime as ort
        with np.load(inputs_file) as f:
            feeds = {k: f[k] for k in f.files}
        so = ort.SessionOptions()
        so.log_severity_level = 3
        t = time.perf_counter()
        peer = Path(io_dir) / "peer.onnx"          # the model at the batch openipu ran, if it changed it
        s = ort.InferenceSession(str(peer) if peer.exists() else path, so, providers=["CPUExecutionProvider"])
        create = time.perf_counter() - t
        t = time.perf_counter()
        outs = s.run(None, feeds)
        run_s = time.perf_counter() - t
        np.savez(Path(io_dir) / "ort.npz", *outs)
        print(json.dumps({"compile": create, "run": run_s}))
        return
    opts = dict(zip(args[0::2], args[1::2]))
    kw = {"ipu": opts.get("--ipu", "ipu2"), "num_ipus": int(opts.get("--num-ipus", 1)),
          "precision": opts.get("--precision", "fp32"),
          "batch_size": int(opts["--batch-size"]) if "--batch-size" in opts else None,
          "available_memory_proportion": (float(opts["--available-memory-proportion"])
                                          if "--available-memory-proportion" in opts else None)}
    feeds = None
    if mode == "functional":
        proto = onnx.load(path, load_external_data=False)
        if kw["batch_size"]:
            proto = runner.set_batch_size(proto, kw["batch_size"])
            onnx.save(runner.set_batch_size(onnx.load(path), kw["batch_size"]), str(Path(io_dir) / "peer.onnx"))
        feeds = runner.random_inputs(proto, seed=0)
        np.savez(inputs_file, **feeds)
    r = runner.run_model(path, inputs=feeds, offline=(mode == "offline"), **kw)
    if r.outputs:
        np.savez(Path(io_dir) / "openipu.npz", *[r.outputs[k] for k in r.outputs])
    print(json.dumps({"elements": r.num_elements, "compile": r.host_compile_seconds, "run": r.host_run_seconds,
                      "fits": r.fits, "throughput": r.throughput, "tile_max": r.tile_bytes_max,
                      "oom_tiles": r.out_of_memory_tiles, "worst": r.worst_tiles[:3]}))


def _fmt_bytes(b: float) -> str:
    return f"{b / 2**30:.2f} GB" if b >= 2**30 else f"{b / 2**20:.0f} MB"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--offline-only", action="store_true", help="skip the functional runs and the peer")
    p.add_argument("--cache", type=Path, default=ROOT / "build" / "scale-models")
    p.add_argument("--one", nargs=4, metavar=("MODE", "PATH", "IO_DIR", "ARGS_JSON"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        _one(a.one[0], a.one[1], json.loads(a.one[3]), a.one[2])
        return
    rows = []
    for name in a.models.split(","):
        m = MODELS[name]
        path = str(model_path(name, a.cache))
        with tempfile.TemporaryDirectory() as io:
            res = {}
            for mode in (["offline"] if a.offline_only else ["functional", "offline", "ort"]):
                if mode == "ort" and not res.get("functional", {}).get("fits", True):
                    continue
                code, out, rss = _timed([sys.executable, __file__, "--one", mode, path, io, json.dumps(m["run"])])
                lines = [ln for ln in out.splitlines() if ln.startswith("{")]
                if code or not lines:
                    print(f"{name} {mode}: failed\n{out[-3000:]}", file=sys.stderr)
                    res[mode] = {"failed": True, "rss": rss}
                    continue
                res[mode] = json.loads(lines[-1]) | {"rss": rss}
            err = ""
            if "functional" in res and "ort" in res and not res["functional"].get("failed") and not res["ort"].get("failed"):
                with np.load(Path(io) / "openipu.npz") as f1, np.load(Path(io) / "ort.npz") as f2:
                    diffs = [float(np.abs(f1[k].astype(np.float64) - f2[k].astype(np.float64)).max() /
                                   max(float(np.abs(f2[k]).max()), 1e-30)) for k in f1.files if k in f2.files]
                err = f"{max(diffs):.1e}" if diffs else ""
        rows.append((name, m, res, err))
    print()
    print("| model | run | IPU tensor elements | peak host RSS | host B/element | compile s (host) | run s (host) | "
          "predicted throughput (IPU) | max err / scale |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, m, res, err in rows:
        el = next((r["elements"] for r in res.values() if "elements" in r), 0)
        for mode, r in res.items():
            if r.get("failed"):
                print(f"| {m['label']} | {mode} | | {_fmt_bytes(r['rss'])} | | | | failed | |")
                continue
            if mode == "ort":
                print(f"| {m['label']} | onnxruntime (peer, fp32) | | {_fmt_bytes(r['rss'])} | | {r['compile']:.1f} | "
                      f"{r['run']:.2f} | | |")
                continue
            thr = f"{r['throughput']:,.0f} samples/s" if r["fits"] else f"does not fit ({r['oom_tiles']} tiles over)"
            if r["fits"] and m.get("published") and mode == "offline":
                thr += f" (published {m['published'].split(':')[0]})"
            print(f"| {m['label']} | openipu {mode} | {el / 1e6:,.0f} M | {_fmt_bytes(r['rss'])} | "
                  f"{r['rss'] / max(el, 1):.2f} | {r['compile']:.1f} | {r['run']:.2f} | {thr} | "
                  f"{err if mode == 'functional' else ''} |")
    _published(rows)


def _published(rows) -> None:
    for name, m, res, _ in rows:
        if m.get("published"):
            print(f"\nPublished for {m['label']}: {m['published']}.")


if __name__ == "__main__":
    main()
