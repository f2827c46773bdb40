"""Host time to load a saved executable against host time to compile it (PopRT path).

    python benchmarks/executable_load.py [--models resnet50 minilm] [--batch 4] [--precision fp16]

For each model: ``Compiler.compile`` (PopART IR, lowering to PopLibs, Poplar compile, one predicted
step: host seconds), ``Executable.save`` (file size, host seconds), and ``Runner(path)`` (read the
file, check its hashes, rebuild the objects from the allow-list, load the engine: host seconds),
then the ratio load / compile. Models: the light ResNet-50 shipped in ``onnx`` (seeded random
weights) and all-MiniLM-L6-v2 (real weights, sequence 16). All figures are host figures of this
machine (nothing here is a prediction for the IPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))


def _model(name: str, d: str, batch: int, precision: str) -> onnx.ModelProto:
    from openipu import runner
    from openipu.poprt import convert_float_to_half, set_batch_size
    if name == "resnet50":
        m = runner.randomize_constant_weights(onnx.load(str(runner.resolve_model("light_resnet50"))), seed=0)
    elif name == "minilm":
        from export_minilm import export
        export(Path(d) / "minilm.onnx", batch=2, seq=16)
        m = onnx.load(str(Path(d) / "minilm.onnx"))
    else:
        raise SystemExit(f"unknown model {name}: resnet50 or minilm")
    m = set_batch_size(m, batch)
    return convert_float_to_half(m) if precision == "fp16" else m


def main(argv=None) -> list[dict]:
    from poprt import runtime
    from poprt.compiler import Compiler, CompilerOptions
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50", "minilm"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp16")
    a = p.parse_args(argv)
    rows = []
    for name in a.models:
        with tempfile.TemporaryDirectory() as d:
            m = _model(name, d, a.batch, a.precision)
            t0 = time.perf_counter()
            exe = Compiler.compile(m, None, CompilerOptions(ipu_version="ipu21"))
            compile_s = time.perf_counter() - t0
            path = os.path.join(d, f"{name}.popef")
            t0 = time.perf_counter()
            exe.save(path)
            save_s = time.perf_counter() - t0
            del exe, m
            t0 = time.perf_counter()
            r = runtime.Runner(path)
            load_s = time.perf_counter() - t0
            size = os.path.getsize(path)
            r.close()
        row = {"model": name, "compile_s": compile_s, "save_s": save_s, "load_s": load_s, "bytes": size,
               "ratio": load_s / compile_s}
        rows.append(row)
        print(f"{name} {a.precision} batch {a.batch} (host): compile {compile_s:.2f} s, save {save_s:.2f} s, "
              f"file {size / 1e6:.1f} MB, load {load_s:.2f} s -> load / compile = {load_s / compile_s:.3f}")
    return rows


if __name__ == "__main__":
    main()
