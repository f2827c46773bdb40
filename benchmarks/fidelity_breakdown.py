"""Where ResNet-50's predicted IPU cycles go: per layer and per category, beside each layer's
arithmetic at the peak AMP rate.

    python benchmarks/fidelity_breakdown.py [--batch-size 32] [--precision fp16] [--top 25] [--json out.json]

The light ResNet-50 shipped in ``onnx`` (seeded random weights) is converted and compiled for one
C600 (``ipu21``) the way Byte MLPerf's IPU backend does (:data:`poprt_resnet50_qps.BYTE_MLPERF_OPTIONS`).
The engine's predicted run (one batch, ``Engine.predict_run``) is then split:

- per **step** of the Poplar program, its predicted duration in each category (compute, IPU
  exchange, global exchange, host exchange, sync) times the times the step ran;
- **compute by vertex type**: a compute set's duration (its slowest tile) is shared among its
  vertex types in proportion to the tile cycles each type's vertices take (the cost model's
  ``by_vertex_type``); every vertex type holding more than 2% of the cycles is printed with the
  PopLibs estimator its cycle estimate follows (:data:`ESTIMATORS`);
- **per layer**: a step belongs to the (longest) ONNX node name its debug name contains (PopART
  names compute sets ``<op type>/<node name>_output_0/...``); steps named otherwise (stream
  copies, layout copies) are grouped under their own name. An op that PopART outlines or whose
  convolution PopLibs caches runs one step for several identical layers: its cycles all go to
  the first such layer, whose ``runs`` column then exceeds 1. Beside each layer: its FLOPs (as the cost model counts them)
  at the peak AMP rate of the target (``2 x amp_macs x tiles x clock``), i.e. the roofline cycles;
- **control**: the run's predicted cycles minus the sum of the steps' category durations (cycles
  the step tree adds outside any step, e.g. IPU alignment). The check ``unaccounted`` is printed
  and must be 0.

Everything printed is a *predicted IPU* figure (cycles of the target clock), never host time;
the host seconds to compile are printed separately.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The PopLibs cycle estimator each vertex type's estimate follows (graphcore/poplibs: the
#: ``*CycleEstimate*`` functions of ``lib/poplin/PerformanceEstimation.hpp``,
#: ``lib/popops/popopsCycleEstimators.cpp``, ``lib/popnn/popnnCycleEstimators.cpp``,
#: ``lib/poplin/poplinCycleEstimators.cpp``) or the Poplar figure it is built from.
ESTIMATORS = {
    "poplin::ConvPartial1x1Out": "poplin getConvPartial1x1SupervisorCycleEstimate (PerformanceEstimation.hpp)",
    "poplin::ConvPartialnx1": "poplin getConvPartialnx1SupervisorCycleEstimate + getZeroSupervisorVertexCycleEstimate",
    "poplin::ConvPartialHorizontalMac": "poplin getConvPartialHorizontalMacSupervisorCycleEstimate",
    "poplin::ReduceAdd": "poplin getReduceCycleEstimate (PerformanceEstimation.hpp; single-input variant "
                         "as ConvReduce.cpp picks it)",
    "poplin::AddToChannel": "[A] shape of popops' broadcast add (supervisor 20, worker 26 + 1 per vector)",
    "popops::ScaledAddToChannel": "popops getScaledAddToChannelCycleEstimate",
    "popops::ChannelMul": "popops getChannelMulCycleEstimate",
    "popops::BroadcastScalar": "popops BroadcastScalar*D cycle estimators (popopsCycleEstimators.cpp)",
    "popops::BinaryOp": "popops BinaryOp1D/2D cycle estimators (binaryOpInnerLoopCycles)",
    "popops::UnaryOp": "popops UnaryOp1D/2D cycle estimators (unaryOpInnerLoopCycles)",
    "popops::Cast": "popops getCast1D/2D cycle estimate (castWorkerCycles)",
    "popops::Reduce": "popops getCyclesEstimateForReduce (ContinuousReduce / PartialsEquals...)",
    "popops::Fill": "popops getFill1D/2D cycle estimate",
    "popnn::NonLinearity": "popnn NonLinearity1D/2D cycle estimators (popnnCycleEstimators.cpp)",
    "popnn::MaxPooling": "popnn getMaxPoolingCycleEstimate / poolingCycleEstimate",
    "popnn::SumPooling": "popnn poolingCycleEstimate",
    "popnn::LossSoftmaxTransform": "popnn LossSoftmaxTransform cycle estimator",
    "poplar_rt::Memcpy": "Poplar on-tile copy: bytes / Target::getMemcpyBytesPerCycle() + launch",
    "poplar_rt::DstStridedCopy": "Poplar on-tile copy: bytes / Target::getMemcpyBytesPerCycle()",
}


def estimator_of(vertex_type: str) -> str:
    """The :data:`ESTIMATORS` entry of a vertex type (template arguments stripped; longest prefix)."""
    base = vertex_type.split("<")[0]
    hits = [k for k in ESTIMATORS if base == k or base.startswith(k)]
    return ESTIMATORS[max(hits, key=len)] if hits else "(no PopLibs estimator named)"


def capture_engine(fn, *args, **kwargs):
    """Run ``fn`` and return ``(result, the last poplar Engine constructed while it ran)``."""
    import openipu.poplar.engine as E
    made = []
    orig = E.Engine.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        made.append(self)
    E.Engine.__init__ = init
    try:
        out = fn(*args, **kwargs)
    finally:
        E.Engine.__init__ = orig
    return out, (made[-1] if made else None)


def breakdown(engine, layer_names, run: int = -1) -> dict:
    """Split the predicted cycles of ``engine``'s run ``run`` (see the module docstring).

    Args:
        engine: a :class:`openipu.poplar.Engine` with at least one (predicted) run.
        layer_names: ONNX node names; a step belongs to the longest name that prefixes its debug
            name (after PopART's scope separators).

    Returns a dict: ``total`` (cycles of the slowest IPU), ``by_category``, ``by_vertex_type``
    ({type: cycles}), ``layers`` ([{name, cycles, by_category, flops}], in program order),
    ``control`` and ``unaccounted`` (should be 0), ``flops``, ``steps`` (per step that ran: name,
    times run, and its duration in each category of ``step_columns``).
    """
    from openipu.poplar.cost import CATEGORIES
    rec = engine._runs[run]
    steps = engine._compiled.compiler.steps
    ipu = int(np.argmax(rec["cycles_per_ipu"]))
    total = float(rec["cycles_per_ipu"][ipu])
    names = sorted(set(layer_names), key=len, reverse=True)
    by_cat = defaultdict(float)
    by_type = defaultdict(float)
    layers: dict = {}
    order = []
    flops = 0.0
    step_rows = []
    for step, n in zip(steps, rec["counts"]):
        if not n:
            continue
        c = step.cost
        step_rows.append([getattr(step, "name", "") or step.kind, int(n)]
                         + [float(c.duration[cat][ipu]) for cat in CATEGORIES])
        sname = getattr(step, "name", "") or step.kind
        layer = next((x for x in names if x in sname), None)
        if layer is None:
            head = sname.split("/")[0]
            layer = "[" + (re.sub(r"[0-9]+", "#", head) if head.startswith(("StreamCopy", "Copy")) else head) + "]"
        if layer not in layers:
            layers[layer] = {"name": layer, "cycles": 0.0, "by_category": defaultdict(float), "flops": 0.0,
                             "runs": 0}
            order.append(layer)
        L = layers[layer]
        for cat in CATEGORIES:
            d = n * float(c.duration[cat][ipu])
            by_cat[cat] += d
            L["by_category"][cat] += d
            L["cycles"] += d
        L["flops"] += n * c.flops
        L["runs"] = max(L["runs"], int(n))
        flops += n * c.flops
        comp = n * float(c.duration["compute"][ipu])
        vt = {k: cyc for k, (_, cyc) in c.by_vertex_type.items()}
        s = sum(vt.values())
        if comp and s:
            for k, cyc in vt.items():
                by_type[k] += comp * cyc / s
        elif comp:
            by_type["(compute without vertex types)"] += comp
    summed = sum(by_cat.values())
    control = total - summed
    return {"total": total, "by_category": dict(by_cat), "by_vertex_type": dict(by_type),
            "layers": [dict(layers[k], by_category=dict(layers[k]["by_category"])) for k in order],
            "control": control, "unaccounted": total - summed - control, "flops": flops,
            "steps": step_rows, "step_columns": ["name", "count", *CATEGORIES]}


#: Byte MLPerf's compiler options for ``resnet50-torch-fp32`` on the IPU: the task's interact
#: infos (``backends/IPU/interact_infos/resnet50-torch-fp32.json``: 64 I/O tiles, 128 batches per
#: step, prefetch, buffering depth 2) over the defaults of the backend's ``_poprt_compile``
#: (``backends/IPU/compile_backend_ipu.py``); ``ipu_version`` is what a C600 reports.
BYTE_MLPERF_OPTIONS = {
    "ipu_version": "ipu21", "num_iotiles": 64, "batches_per_step": 128, "enable_prefetch_datastreams": True,
    "stream_buffering_depth": 2, "available_memory_proportion": 0.6, "partials_type": "half",
    "use_128bit_conv_unit_load": False, "enable_fast_reduce": False, "group_host_sync": False,
    "rearrange_anchors_on_host": False, "enable_outlining": True, "outline_threshold": 1.0}

#: Byte MLPerf's fp8 converter options for the task (``fp8_configs`` of the same interact infos).
BYTE_MLPERF_FP8 = {"fp8_params": "F143,F143,-3,-3", "fp8_skip_op_names": "/layer1/layer1.0/downsample/downsample.0/Conv"}


def resnet50_onnx(path: Path, model: str = "torch") -> list:
    """Write the ResNet-50 to compile to ``path``; returns its input names.

    ``torch``: the model Byte MLPerf measured, ``resnet50-torch-fp32`` -- torchvision's ResNet-50
    v1.5 with a softmax (``examples/poprt/byte_mlperf_backend.resnet50``, seeded random weights)
    exported as Byte MLPerf's ``tools/torch_to_onnx.py`` does (TorchScript exporter, opset 11,
    eval mode: batch norms folded into the convolutions). ``light``: the light ResNet-50 shipped in
    ``onnx`` (the ONNX model zoo's graph: batch norms and ``Sum`` nodes kept)."""
    import onnx

    from openipu import runner as orunner
    if model == "light":
        m = orunner.randomize_constant_weights(onnx.load(str(orunner.resolve_model("light_resnet50"))), seed=0)
        onnx.save(m, str(path))
        return [i.name for i in m.graph.input if i.name not in {x.name for x in m.graph.initializer}]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "poprt"))
    from byte_mlperf_backend import export_onnx, resnet50
    info = {"inputs": "actual_input_1", "outputs": "output1", "input_type": "FLOAT32",
            "input_shape": {"actual_input_1": [1, 3, 224, 224]}}
    export_onnx(resnet50(seed=0), info, path)
    return ["actual_input_1"]


def per_batch(b: dict, batches_per_step: int) -> dict:
    """A step's :func:`breakdown` divided by its batches (every figure per batch)."""
    k = float(batches_per_step)
    if k == 1:
        return b
    out = dict(b, total=b["total"] / k, control=b["control"] / k, unaccounted=b["unaccounted"] / k,
               flops=b["flops"] / k)
    out["by_category"] = {c: v / k for c, v in b["by_category"].items()}
    out["by_vertex_type"] = {c: v / k for c, v in b["by_vertex_type"].items()}
    out["layers"] = [dict(L, cycles=L["cycles"] / k, flops=L["flops"] / k, runs=L.get("runs", k) / k,
                          by_category={c: v / k for c, v in L["by_category"].items()}) for L in b["layers"]]
    return out


def compile_resnet50(batch: int, precision: str = "fp16", model: str = "torch", **overrides):
    """Compile ResNet-50 (:func:`resnet50_onnx`) for one C600 with Byte MLPerf's options
    (:data:`BYTE_MLPERF_OPTIONS`, ``overrides`` on top) through its converter. Returns
    ``(poprt Executable, poplar Engine, ONNX node names, host seconds)``."""
    import tempfile

    import onnx

    from openipu.poprt.compiler import Compiler, CompilerOptions
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "poprt"))
    from byte_mlperf_client import _converter

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "resnet50.onnx"
        inputs = resnet50_onnx(path, model)
        m = onnx.load(str(path))
    shapes = {i.name: [batch] + [d.dim_value for d in i.type.tensor_type.shape.dim[1:]] for i in m.graph.input
              if i.name in inputs}
    conv_opts = dict(BYTE_MLPERF_FP8) if precision == "fp8" else {}
    converted = _converter(shapes, precision, **conv_opts).convert(m)
    names = [n.name for n in converted.graph.node if n.name]
    options = CompilerOptions()
    for k, v in dict(BYTE_MLPERF_OPTIONS, **overrides).items():
        setattr(options, {"num_iotiles": "num_io_tiles"}.get(k, k), v)
    t0 = time.perf_counter()
    exe, engine = capture_engine(Compiler.compile, converted.SerializeToString(),
                                 [o.name for o in converted.graph.output], options)
    return exe, engine, names, time.perf_counter() - t0


def report(b: dict, spec, precision: str, top: int = 25, out=print) -> None:
    """Print a :func:`breakdown` (predicted IPU cycles)."""
    macs = spec.amp_macs.get({"fp16": "half", "fp8": "quarter", "fp32": "float"}[precision], 0)
    peak = 2.0 * macs * spec.tiles_per_ipu     # FLOP per cycle (all tiles, peak AMP rate)
    T = b["total"]
    out(f"Predicted IPU cycles per batch, host I/O not overlapped (slowest IPU): {T:,.0f}")
    out(f"  arithmetic at peak AMP rate ({macs} MAC/cycle/tile x {spec.tiles_per_ipu} tiles): "
        f"{b['flops'] / peak:,.0f} cycles ({b['flops'] / 1e9:.2f} GFLOP) = {b['flops'] / peak / T:.1%} of predicted")
    out("By category (predicted cycles, share):")
    for k, v in sorted(b["by_category"].items(), key=lambda kv: -kv[1]):
        out(f"  {k:<18} {v:>14,.0f}  {v / T:6.1%}")
    out(f"  {'control':<18} {b['control']:>14,.0f}  {b['control'] / T:6.1%}")
    out(f"  {'unaccounted':<18} {b['unaccounted']:>14,.0f}")
    out("Compute by vertex type (predicted cycles, share of all cycles, estimator followed):")
    for k, v in sorted(b["by_vertex_type"].items(), key=lambda kv: -kv[1]):
        share = v / T
        est = estimator_of(k) if share > 0.02 else ""
        out(f"  {k[:70]:<70} {v:>12,.0f} {share:6.1%}  {est}")
    out(f"Layers (top {top} by predicted cycles): runs | cycles | compute exch sync host | roofline cycles | ratio")
    rows = sorted(b["layers"], key=lambda L: -L["cycles"])[:top]
    for L in rows:
        c = L["by_category"]
        roof = L["flops"] / peak
        ratio = f"{L['cycles'] / roof:7.1f}x" if roof else "      -"
        out(f"  {L['name'][:44]:<44} {L.get('runs', 1):>4g} | {L['cycles']:>11,.0f} | {c.get('compute', 0):>10,.0f} "
            f"{c.get('exchange', 0) + c.get('global_exchange', 0):>9,.0f} {c.get('sync', 0):>7,.0f} "
            f"{c.get('host_exchange', 0):>8,.0f} | {roof:>10,.0f} | {ratio}")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--precision", default="fp16", choices=["fp16", "fp8"])
    p.add_argument("--model", default="torch", choices=["torch", "light"],
                   help="torch: the model Byte MLPerf measured (default); light: onnx's light ResNet-50")
    p.add_argument("--num-io-tiles", type=int, default=None, help="override Byte MLPerf's 64")
    p.add_argument("--batches-per-step", type=int, default=None, help="override Byte MLPerf's 128")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", help="write the breakdown as JSON here")
    a = p.parse_args(argv)
    over = {k: v for k, v in (("num_iotiles", a.num_io_tiles), ("batches_per_step", a.batches_per_step))
            if v is not None}
    exe, engine, names, secs = compile_resnet50(a.batch_size, a.precision, a.model, **over)
    io_tiles = over.get("num_iotiles", BYTE_MLPERF_OPTIONS["num_iotiles"])
    b = breakdown(engine, names)
    spec = engine._spec
    pr = exe.prediction
    b = per_batch(b, pr.batches_per_step)
    print(f"ResNet-50 ({a.model}) {a.precision}, ipu21 (C600), batch {a.batch_size}, {io_tiles} I/O tiles, "
          f"{pr.batches_per_step} batches per step (host compile {secs:.1f} s)")
    report(b, spec, a.precision, a.top)
    print(f"Steady state (host I/O on the I/O tiles overlapped with compute): period "
          f"max(compute {pr.compute_cycles:,.0f} + I/O-tile transfer {pr.io_to_compute_cycles:,.0f}, "
          f"host I/O {pr.host_io_cycles:,.0f}) = {pr.batch_period_cycles:,.0f} cycles -> {pr.qps:,.0f} samples/s "
          "(predicted)")
    if a.json:
        Path(a.json).write_text(json.dumps(b, indent=1))
    return b


if __name__ == "__main__":
    main()
