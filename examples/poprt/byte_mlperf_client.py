"""A PopRT client written the way Byte MLPerf's IPU backend drives PopRT (compile per batch size from
a JSON of "interact infos", then load each executable with a ``Runner`` and ``execute``).

    python examples/poprt/byte_mlperf_client.py MODEL.onnx INTERACT.json OUT_DIR [--batch-sizes 1 4 32]

``INTERACT.json`` (Byte MLPerf's ``interact_infos/<model>.json``): ``precision`` ("fp16" / "fp32"),
``converter_options`` (passed to ``Converter``), ``compiler_options`` (``CompilerOptions`` fields;
``num_iotiles`` means ``num_io_tiles``). Each batch size is compiled to
``OUT_DIR/<bs>/executable_<PREC>.popef``; an existing file is reused, as Byte MLPerf does.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import onnx

from poprt import runtime
from poprt.compiler import Compiler, CompilerOptions


def _converter(input_shape: dict, precision: str, **options):
    """``poprt.converter.Converter(input_shape=..., precision=...)`` where it exists; else the same
    two steps with openipu's PopRT passes (batch-size rewrite, float-to-half)."""
    try:
        from openipu.poprt.converter import Converter
        return Converter(input_shape=input_shape, precision=precision, **options)
    except ImportError:
        pass
    from openipu.poprt import convert_float_to_half, set_batch_size

    class _Fallback:
        def convert(self, model):
            batches = {v[0] for v in input_shape.values()}
            (bs,) = batches
            m = set_batch_size(model, bs)
            return convert_float_to_half(m) if precision == "fp16" else m
    return _Fallback()


def compiled_path(out_dir, bs: int, precision: str) -> str:
    return os.path.join(str(out_dir), str(bs), f"executable_{precision.upper()}.popef")


def compile_model(model_path, interact: dict, batch_sizes, out_dir) -> dict:
    """Compile ``model_path`` for each batch size; returns ``{bs: (path, host compile seconds)}``
    (0 seconds for a reused file)."""
    model = onnx.load(str(model_path))
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    precision = interact.get("precision", "fp16")
    out = {}
    for bs in batch_sizes:
        path = compiled_path(out_dir, bs, precision)
        if os.path.exists(path):
            out[bs] = (path, 0.0)
            continue
        shapes = {i.name: [bs] + [d.dim_value for d in i.type.tensor_type.shape.dim[1:]] for i in inputs}
        converted = _converter(shapes, precision, **interact.get("converter_options", {})).convert(model)
        options = CompilerOptions()
        for k, v in interact.get("compiler_options", {}).items():
            setattr(options, {"num_iotiles": "num_io_tiles"}.get(k, k), v)
        outputs = [o.name for o in converted.graph.output]
        t0 = time.perf_counter()
        Compiler.compile_and_export(converted.SerializeToString(), outputs, path, options)
        out[bs] = (path, time.perf_counter() - t0)
    return out


class IPURunner:
    """Byte MLPerf's runtime side: ``Runner(popef, RuntimeConfig())``, feeds cast to the descriptor
    dtypes, ``execute`` into preallocated outputs."""

    def __init__(self, path):
        self.runner = runtime.Runner(path, runtime.RuntimeConfig())
        self.inputs = self.runner.get_model_inputs()
        self.outputs = self.runner.get_model_outputs()

    def predict(self, feeds: dict) -> dict:
        ins = {d.name: np.ascontiguousarray(feeds[d.name]).astype(d.numpy_data_type()) for d in self.inputs}
        outs = {d.name: np.zeros(d.shape, d.numpy_data_type()) for d in self.outputs}
        self.runner.execute(ins, outs)
        return outs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("interact")
    p.add_argument("out_dir")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 32])
    a = p.parse_args()
    with open(a.interact) as f:
        interact = json.load(f)
    for bs, (path, secs) in compile_model(a.model, interact, a.batch_sizes, a.out_dir).items():
        r = IPURunner(path)
        print(f"batch {bs}: {path} (host compile {secs:.1f} s); {r.runner.report()}")


if __name__ == "__main__":
    main()
