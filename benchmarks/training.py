"""Training predictions: what the cost model predicts for a training step of real models, and how
recomputation, gradient accumulation, replication and pipelining change it, beside the host
wall time of the same training step in PyTorch eager.

    python benchmarks/training.py [--models resnet50,bert-base] [--quick] [--batch N] [--cache DIR]

Each scenario is one function that builds a ``popart.TrainingSession`` with its
``SessionOptions`` for an offline IPU (``DeviceManager.createOfflineIPUDevice``: no device
memory, no kernels), compiles it (``prepareDevice``) and predicts one step
(``engine.predict_run(0)``, :func:`openipu.poplar.profile.run_breakdown`): one batch
(``batchesPerStep`` 1) of ``accumulationFactor`` micro-batches on each replica, then one weight
update. Optimizer: SGD, learning rate 0.01, momentum 0.9 (velocity in the weights' type, fp16).
The scenarios, and the figures printed for each model:

- ``baseline``: predicted cycles of a batch, seconds, samples/s and peak tile memory (bytes on
  the fullest tile; whether every tile fits);
- ``recompute``: ``autoRecomputation`` Standard and RecomputeAll: peak tile memory and cycles
  against the baseline (expected: less memory, more cycles), at the batch used and, when that is
  not the first one tried (the real batch did not fit), at the first too. (RecomputeAll without
  pipelining recomputes the whole forward pass when the backward pass starts, so it frees no
  activations; PopART meant it for pipelined stages);
- ``accumulation``: ``accumulationFactor`` N against 1: the weight-update share of a batch's
  cycles, and the ratio of the two shares (expected: about N). The update is the ops PopART runs
  once per weight update, in the accumulate outer fragment when N > 1 (``SGD1VarUpdate``,
  ``SGD1AcclUpdate``; :data:`UPDATE_OPS`), found by their compute sets' names;
- ``replication``: R replicas (one IPU each) against 1: the predicted all-reduce time (the
  ``ReplicatedAllReduce`` steps), the growth of the batch's time, beside the gradient bytes over
  the target's IPU-Link bandwidth;
- ``pipeline`` against ``sharded``: the model cut into 4 contiguous chunks of ONNX nodes, one per
  IPU and pipeline stage (``__ipu_number``, ``__pipeline_stage``; ``virtualGraphMode`` Manual),
  with and without ``enablePipelining``; the steady-state samples/s of each is the marginal cost
  of a micro-batch, from accumulation factors N and 2N; the speed-up (expected > 1; the chunks
  are not balanced by cost, so the slowest IPU bounds it). Skipped, with the reason, if the
  TrainingSession does not support pipelining (openipu before pipelining landed); any other
  error is printed as a failure;
- PyTorch eager: host wall time of one training step (forward, backward, SGD step; fp32 on this
  machine's CPU; median of ``--torch-steps`` after one warm-up) of the same model at the same
  batch. A host figure, not a prediction.

Models (random weights; the ONNX models of ``benchmarks/scale.py``, cached in ``--cache``):

- ResNet-50: the light ResNet-50 of ``onnx`` with seeded random weights (``scale.model_path``),
  fp16 on one C600 (``ipu21``), its BatchNormalizations switched to training mode (batch
  statistics; running statistics updated by copy); loss ``nllloss`` of its softmax. Batch: the
  calibration point's 32 (``research/ipu_calibration.md``) if it fits one IPU, else the largest
  of :data:`MODELS`' candidates that fits; when none fits, the first, flagged as not fitting
  (the graph is compiled with ``debug.allowOutOfMemory``). PyTorch peer: :func:`torch_resnet50`
  (ResNet-50 v1.5, the light model's architecture).
- BERT-base: ``BertForQuestionAnswering`` (``BertConfig()`` defaults, ``export_transformers.py``,
  eval mode: no dropout) exported at sequence length 128 (pre-training phase 1 and fine-tuning
  length), its scalar initializers made constants (:func:`scalars_to_constants`: the attention
  scale is no parameter) and its weights untied (:func:`untie_weights`: the export stores equal
  initial values, e.g. all zero biases, once), fp16 on ``ipu21``; SQuAD loss: ``nllloss`` of the softmax of the start and of the end
  logits, summed (``identityloss``). Batch as for ResNet-50, from 32 down. PyTorch peer: the same
  ``transformers`` model.

``--quick``: a smoke test at micro-batch 2, BERT-base cut to 2 of its 12 layers, accumulation
factors 4 / 8. Run on an otherwise idle machine for host times that mean something; the
predictions do not depend on the machine.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import scale  # noqa: E402  (also puts examples/models on sys.path)

MODELS = {
    "resnet50": {"label": "ResNet-50 (light, random weights) fp16, one C600 (ipu21)", "ipu": "ipu21",
                 "batches": (32, 16, 8, 4, 2, 1),
                 "why": "32 is the batch of the calibration point (research/ipu_calibration.md)"},
    "bert-base": {"label": "BERT-base SQuAD, sequence 128, fp16, one C600 (ipu21)", "ipu": "ipu21", "seq": 128,
                  "batches": (32, 16, 8, 4, 2, 1),
                  "why": "32 is a common BERT-base batch at sequence 128; smaller ones are tried until one fits"},
}
QUICK_BATCH = 2
QUICK_BERT_LAYERS = 2

#: The ops PopART runs once per weight update (in the accumulate outer fragment when the
#: accumulation factor is above 1): the weight and optimizer-state updates.
UPDATE_OPS = ("SGD0VarUpdate", "SGD1VarUpdate", "SGD1AcclUpdate", "AccumulatorUpdate", "AdamUpdater",
              "AdamVarUpdate", "LambSquare", "ScaledVarUpdate", "RMSPropUpdater", "AdaDeltaUpdater")
ALL_REDUCE_OPS = ("ReplicatedAllReduce", "ReplicatedAllReduceInplace")


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------
@dataclass
class TrainModel:
    """An ONNX training model: the model with its loss, as bytes, and how to feed it."""

    name: str
    label: str
    proto: bytes          # serialized ModelProto, with the loss op
    loss: str             # the loss tensor id
    batch: int            # micro-batch
    ipu: str
    tiles_per_ipu: int | None = None      # None: the target's


def _fp16(proto: onnx.ModelProto) -> onnx.ModelProto:
    from openipu.poprt import convert_float_to_half
    with np.errstate(over="ignore"):       # -3.4e38 attention-mask fills become -inf, as intended
        return convert_float_to_half(proto)


def _bn_training(proto: onnx.ModelProto) -> None:
    """Switch every (opset < 14) BatchNormalization to training mode: the 5-output form (running
    mean and variance, saved mean and variance), as PopART's BatchNormOp decides."""
    for n in proto.graph.node:
        if n.op_type == "BatchNormalization" and len(n.output) == 1:
            o = n.output[0]
            n.output.extend([f"{o}/runningMean", f"{o}/runningVar", f"{o}/savedMean", f"{o}/savedVar"])


def scalars_to_constants(proto: onnx.ModelProto) -> int:
    """Turn the rank-0 float initializers into ``Constant`` nodes (what PopART's
    ``GraphTransformer.convertInitializersToConstants`` does): a training session trains every
    float initializer, and BERT's export keeps its attention scale and mask values as scalar
    initializers, which are no parameters (BERT has no rank-0 parameter); trained, each would
    cost a reduction of its whole broadcast gradient. Returns the number converted."""
    keep, nodes = [], []
    for t in proto.graph.initializer:
        if len(t.dims) == 0 and t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            nodes.append(onnx.helper.make_node("Constant", [], [t.name], value=t, name=f"{t.name}/constant"))
        else:
            keep.append(t)
    if nodes:
        names = {n.output[0] for n in nodes}
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(keep)
        inputs = [i for i in proto.graph.input if i.name not in names]
        del proto.graph.input[:]
        proto.graph.input.extend(inputs)
        rest = list(proto.graph.node)
        del proto.graph.node[:]
        proto.graph.node.extend(nodes + rest)
    return len(nodes)


def untie_weights(proto: onnx.ModelProto) -> int:
    """Give every reader but the first of a float initializer read by several nodes its own copy
    (``<name>/untied<k>``). ``torch.onnx.export`` stores initializers of equal value once: in a
    freshly initialised BERT all 85 zero biases of 768 are one tensor, and all 25 LayerNorm
    scales another, which training would then tie (and pipelining could not split). Returns the
    number of copies made."""
    from onnx import numpy_helper
    inits = {t.name: t for t in proto.graph.initializer}
    seen: set = set()
    copies = []
    for node in proto.graph.node:
        for k, x in enumerate(node.input):
            t = inits.get(x)
            if t is None or t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
                continue
            if x not in seen:
                seen.add(x)
                continue
            c = numpy_helper.from_array(numpy_helper.to_array(t), f"{x}/untied{len(copies)}")
            copies.append(c)
            node.input[k] = c.name
    proto.graph.initializer.extend(copies)
    return len(copies)


def resnet50_model(cache: Path, batch: int) -> TrainModel:
    import popart

    from openipu import runner
    proto = runner.set_batch_size(onnx.load(str(scale.model_path("resnet50", cache))), batch)
    _bn_training(proto)
    proto = _fp16(proto)
    b = popart.Builder(proto.SerializeToString())
    label = b.addInputTensor(popart.TensorInfo("INT32", [batch]), "label")
    loss = b.aiGraphcore.nllloss([proto.graph.output[0].name, label], popart.ReductionType.Mean)
    m = MODELS["resnet50"]
    return TrainModel("resnet50", m["label"], b.getModelProto(), loss, batch, m["ipu"])


def bert_path(cache: Path, seq: int, layers: int | None) -> Path:
    """BERT-base QA exported at batch 1 and sequence ``seq`` into ``cache`` (once); the batch is
    set later with PopRT's batch-size pass."""
    from export_transformers import export
    p = cache / f"bert-base_b1_s{seq}{f'_l{layers}' if layers else ''}.onnx"
    if not p.exists():
        export("bert-base-squad", p, 1, seq, layers)
    return p


def bert_model(cache: Path, batch: int, layers: int | None = None) -> TrainModel:
    import popart

    from openipu import runner
    m = MODELS["bert-base"]
    proto = runner.set_batch_size(onnx.load(str(bert_path(cache, m["seq"], layers))), batch)
    scalars_to_constants(proto)
    untie_weights(proto)
    proto = _fp16(proto)
    b = popart.Builder(proto.SerializeToString())
    losses = []
    for out, lab in zip(proto.graph.output[:2], ("start_positions", "end_positions")):
        label = b.addInputTensor(popart.TensorInfo("INT32", [batch]), lab)
        losses.append(b.aiGraphcore.nllloss([b.aiOnnx.softmax([out.name], axis=1), label], popart.ReductionType.Mean))
    loss = b.aiGraphcore.identityloss([b.aiOnnx.add(losses)], popart.ReductionType.Mean)
    label = m["label"] if not layers else m["label"].replace("BERT-base", f"BERT-base ({layers} of 12 layers)")
    return TrainModel("bert-base", label, b.getModelProto(), loss, batch, m["ipu"])


def make_model(name: str, cache: Path, batch: int, quick: bool) -> TrainModel:
    if name == "resnet50":
        return resnet50_model(cache, batch)
    return bert_model(cache, batch, QUICK_BERT_LAYERS if quick else None)


def annotate_stages(proto: bytes, stages: int) -> bytes:
    """The model with its ONNX nodes cut into ``stages`` contiguous chunks (by node count, in the
    graph's topological order), chunk k on IPU k and pipeline stage k (PopART's
    ``__ipu_number`` / ``__pipeline_stage`` node attributes, what ``builder.virtualGraph`` and
    ``builder.pipelineStage`` set)."""
    from openipu.popart.builder import PIPELINE_ATTR, VGRAPH_ATTR
    m = onnx.ModelProto()
    m.ParseFromString(proto)
    n = len(m.graph.node)
    for i, node in enumerate(m.graph.node):
        k = i * stages // n
        for a in [a for a in node.attribute if a.name in (VGRAPH_ATTR, PIPELINE_ATTR)]:
            node.attribute.remove(a)
        node.attribute.extend([onnx.helper.make_attribute(VGRAPH_ATTR, k), onnx.helper.make_attribute(PIPELINE_ATTR, k)])
    return m.SerializeToString()


# ---------------------------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------------------------
def _steps_of(engine, names) -> float:
    """Predicted cycles (on the slowest IPU of the last run) of the steps whose compute-set name
    is ``<op name>`` or ``<op name>/...`` for an op name in ``names``."""
    rec = engine._runs[-1]
    ipu = int(np.argmax(rec["cycles_per_ipu"]))
    total = 0.0
    for st, n in zip(engine._compiled.compiler.steps, rec["counts"]):
        if n and st.name:
            parts = st.name.split("/")
            if any("/".join(parts[:k]) in names for k in range(1, len(parts) + 1)):
                total += n * float(st.total[ipu])
    return total


def _op_names(ir, types) -> set:
    """``<op type>/<first output>`` (the compute sets' name prefix) of the IR ops of ``types``."""
    return {f"{op.op_type}/{op.outputs[0]}" for op in ir.ops if op.op_type in types and op.outputs}


def predict(model: TrainModel, opts, num_ipus: int = 1, proto: bytes | None = None) -> dict:
    """Compile ``model`` (or ``proto``) as a TrainingSession with ``opts`` on ``num_ipus`` offline
    IPUs (all replicas) and predict one step. Returns predicted IPU figures: ``cycles`` (one
    batch), ``seconds``, ``samples`` (per batch), ``samples_per_s``, ``peak_tile_bytes``, ``fits``,
    ``oom_tiles``, ``peak_live_bytes`` (the most bytes of not-always-live variables, activations
    and temporaries, that any tile holds at once), ``update_cycles``, ``all_reduce_cycles``, ``grad_bytes`` (of the trainable
    weights), ``link_bytes_per_s``, ``clock_hz``; and ``host_compile_s`` (host)."""
    import popart

    from openipu.ipu import target as ipu_target
    from openipu.poplar.profile import run_breakdown
    opts.engineOptions = {"debug.allowOutOfMemory": "true"}
    dev = popart.DeviceManager().createOfflineIPUDevice(
        {"numIPUs": num_ipus, "ipuVersion": model.ipu,
         "tilesPerIPU": model.tiles_per_ipu or ipu_target(model.ipu).tiles_per_ipu})
    t0 = time.perf_counter()
    s = popart.TrainingSession(fnModel=proto or model.proto,
                               dataFlow=popart.DataFlow(1, {model.loss: popart.AnchorReturnType("Final")}),
                               loss=model.loss,
                               optimizer=popart.SGD({"defaultLearningRate": (0.01, True),
                                                     "defaultMomentum": (0.9, True)}),
                               deviceInfo=dev, userOptions=opts)
    s.prepareDevice(loadEngine=False)
    compile_s = time.perf_counter() - t0
    e, ir = s._engine, s._ir
    e.predict_run(0)
    b = run_breakdown(e)
    mem = e.memory
    af = opts.accumulationFactor if opts.enableGradientAccumulation else 1
    rf = opts.replicatedGraphCount if opts.enableReplicatedGraphs else 1
    samples = model.batch * af * rf
    grad_bytes = sum(ir.tensors[g].info.nbytes() for g in ir.weight_grads.values())
    fullest = int(np.argmax(mem.total))
    out = {"cycles": b["cycles"], "seconds": b["seconds"], "samples": samples,
           "samples_per_s": samples / b["seconds"], "peak_tile_bytes": int(mem.total.max()), "fits": mem.fits(),
           "peak_live_bytes": int(mem.not_always_live_peak.max()),
           "oom_tiles": int(mem.out_of_memory_tiles.size), "bytes_per_tile": int(e._spec.bytes_per_tile),
           "fullest_tile": {k: int(v[fullest]) for k, v in mem.categories.items()},
           "update_cycles": _steps_of(e, _op_names(ir, UPDATE_OPS)),
           "all_reduce_cycles": _steps_of(e, _op_names(ir, ALL_REDUCE_OPS)),
           "grad_bytes": int(grad_bytes), "link_bytes_per_s": float(e._spec.ipu_link_bytes_per_s),
           "clock_hz": float(e._spec.clock_hz), "host_compile_s": compile_s}
    del s, e, ir
    gc.collect()
    return out


def _options(**kw):
    import popart
    o = popart.SessionOptions()
    for k, v in kw.items():
        setattr(o, k, v)
    return o


# one function per scenario: SessionOptions -> predicted figures
def baseline(model: TrainModel) -> dict:
    return predict(model, _options())


def recompute(model: TrainModel, kind: str) -> dict:
    import popart
    return predict(model, _options(autoRecomputation=getattr(popart.RecomputationType, kind)))


def accumulation(model: TrainModel, factor: int) -> dict:
    return predict(model, _options(enableGradientAccumulation=True, accumulationFactor=factor))


def replication(model: TrainModel, replicas: int) -> dict:
    return predict(model, _options(enableReplicatedGraphs=True, replicatedGraphCount=replicas), num_ipus=replicas)


def sharded(model: TrainModel, stages: int, factor: int, pipelined: bool = False) -> dict:
    """The model over ``stages`` IPUs (one chunk of nodes each, :func:`annotate_stages`),
    ``factor`` micro-batches per batch, with or without pipelining."""
    import popart
    o = _options(virtualGraphMode=popart.VirtualGraphMode.Manual, enablePipelining=pipelined,
                 enableGradientAccumulation=True, accumulationFactor=factor)
    return predict(model, o, num_ipus=stages, proto=annotate_stages(model.proto, stages))


def pipeline(model: TrainModel, stages: int, factor: int) -> dict:
    return sharded(model, stages, factor, pipelined=True)


def steady_state(run, model: TrainModel, stages: int, factor: int) -> dict:
    """``run(model, stages, f)`` at f = ``factor`` and 2 ``factor``: the batch at ``factor``, and
    the steady-state samples/s from the marginal cost of a micro-batch."""
    a, b = run(model, stages, factor), run(model, stages, 2 * factor)
    per_micro = (b["cycles"] - a["cycles"]) / factor
    return a | {"steady_samples_per_s": model.batch * a["clock_hz"] / per_micro, "micro_cycles": per_micro}


# ---------------------------------------------------------------------------------------------
# PyTorch eager (host wall time)
# ---------------------------------------------------------------------------------------------
def torch_resnet50(num_classes: int = 1000):
    """ResNet-50 v1.5 (stride in the 3x3 convolution, as the light ONNX model; 25.56 M
    parameters), random weights, in plain torch (no torchvision here)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = mid * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                          if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.short(x))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Block(cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def torch_step_seconds(name: str, batch: int, quick: bool, steps: int) -> float:
    """Host wall time of one training step (forward, loss, backward, SGD momentum step) in
    PyTorch eager, fp32 on this machine's CPU: the median of ``steps`` after one warm-up."""
    import torch
    torch.manual_seed(0)
    if name == "resnet50":
        model = torch_resnet50().train()
        x = torch.randn(batch, 3, 224, 224)
        y = torch.randint(0, 1000, (batch,))

        def loss_fn():
            return torch.nn.functional.cross_entropy(model(x), y)
    else:
        from export_transformers import build
        model, vocab, _ = build("bert-base-squad", QUICK_BERT_LAYERS if quick else None)   # eval: no dropout
        seq = MODELS["bert-base"]["seq"]
        ids = torch.randint(0, vocab, (batch, seq))
        mask = torch.ones(batch, seq, dtype=torch.long)
        start, end = torch.randint(0, seq, (batch,)), torch.randint(0, seq, (batch,))

        def loss_fn():
            out = model(ids, attention_mask=mask)
            return (torch.nn.functional.cross_entropy(out.start_logits, start)
                    + torch.nn.functional.cross_entropy(out.end_logits, end))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
    step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def _b(x: float) -> str:
    return f"{x:,.0f}"


def _fit(r: dict) -> str:
    return "yes" if r["fits"] else f"no ({r['oom_tiles']} tiles over)"


def choose_batch(name: str, cache: Path, candidates, quick: bool) -> tuple[TrainModel, dict, list]:
    """The first of ``candidates`` whose baseline fits one IPU (or the first, when none does):
    (model, its baseline figures, [(batch, baseline)] of every batch tried)."""
    tried = []
    for batch in candidates:
        model = make_model(name, cache, batch, quick)
        r = baseline(model)
        tried.append((batch, r))
        print(f"  batch {batch}: predicted peak tile memory {_b(r['peak_tile_bytes'])} B of {_b(r['bytes_per_tile'])}"
              f" per tile, fits: {_fit(r)} (host compile {r['host_compile_s']:.0f} s)", flush=True)
        if r["fits"]:
            return model, r, tried
    batch, r = tried[0]
    return make_model(name, cache, batch, quick), r, tried


def run_model(name: str, cache: Path, quick: bool, batch: int | None, af: int, replicas: int, stages: int,
              pipe_af: int, torch_steps: int) -> dict:
    m = MODELS[name]
    candidates = (batch,) if batch else ((QUICK_BATCH,) if quick else m["batches"])
    print(f"\n=== {m['label']} ===", flush=True)
    print("Batch search (predicted; each baseline compiled for an offline IPU):", flush=True)
    model, base, tried = choose_batch(name, cache, candidates, quick)
    if batch or quick:
        why = f"batch {model.batch} given ({'--quick' if quick else '--batch'})"
    elif base["fits"]:
        why = (f"batch {model.batch}: {m['why']}" if model.batch == candidates[0] else
               f"batch {model.batch}: the largest of {', '.join(map(str, candidates))} that fits one IPU ({m['why']})")
    else:
        why = (f"batch {model.batch}: none of {', '.join(map(str, candidates))} fits one IPU, so the figures are "
               "for the first, over tile memory (compiled with debug.allowOutOfMemory)")
    print(f"Micro-batch used: {why}.", flush=True)
    res = {"model": model, "base": base, "tried": tried}
    for kind in ("Standard", "RecomputeAll"):
        res[f"recompute {kind}"] = recompute(model, kind)
    if model.batch != candidates[0]:
        # recomputation also at the first batch tried (the real one), where activations dominate
        first = make_model(name, cache, candidates[0], quick)
        res["first"] = {"batch": candidates[0], "base": tried[0][1]}
        for kind in ("Standard", "RecomputeAll"):
            res["first"][kind] = recompute(first, kind)
        del first
    res[f"accumulation {af}"] = accumulation(model, af)
    res[f"replication {replicas}"] = replication(model, replicas)
    import popart
    try:
        res["pipeline"] = steady_state(pipeline, model, stages, pipe_af)
    except popart.popart_exception as e:
        # skipped where the session does not support pipelining; any other error is openipu's
        unsupported = "does not support pipelining" in str(e)
        res["pipeline skipped" if unsupported else "pipeline failed"] = str(e)
    if "pipeline" in res:
        res["sharded"] = steady_state(sharded, model, stages, pipe_af)
    res["torch_s"] = torch_step_seconds(name, model.batch, quick, torch_steps)
    report(res, af, replicas, stages, pipe_af, torch_steps)
    return res


def report(res: dict, af: int, replicas: int, stages: int, pipe_af: int, torch_steps: int) -> None:
    model, base = res["model"], res["base"]
    print(f"\nPredicted IPU figures ({model.label}, micro-batch {model.batch}; openipu's cost model, not host "
          "measurements):")
    print("| scenario | IPUs | samples / batch | cycles / batch | ms / batch | samples/s | peak tile memory B | fits |"
          " memory vs baseline | cycles vs baseline |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    rows = [("baseline", 1, base)] + [(k, 1, res[k]) for k in res if k.startswith("recompute")]
    rows += [(f"accumulation factor {af}", 1, res[f"accumulation {af}"]),
             (f"replication {replicas}", replicas, res[f"replication {replicas}"])]
    if "pipeline" in res:
        rows += [(f"sharded, {stages} stages, accumulation {pipe_af}", stages, res["sharded"]),
                 (f"pipeline, {stages} stages, accumulation {pipe_af}", stages, res["pipeline"])]
    for label, ipus, r in rows:
        print(f"| {label} | {ipus} | {r['samples']} | {_b(r['cycles'])} | {r['seconds'] * 1e3:,.2f} | "
              f"{r['samples_per_s']:,.0f} | {_b(r['peak_tile_bytes'])} | {_fit(r)} | "
              f"x{r['peak_tile_bytes'] / base['peak_tile_bytes']:.3f} | x{r['cycles'] / base['cycles']:.3f} |")
    print("The fullest tile by category (predicted bytes):")
    for label, _, r in rows:
        c = r["fullest_tile"]
        code = c["Internal Exchange Code"] + c["Control Code"] + c["Vertex Code"]
        print(f"  {label}: variables {_b(c['Variables'])}, exchange + control + vertex code {_b(code)} "
              f"(exchange {_b(c['Internal Exchange Code'])}), vertex state {_b(c['Vertex Instances'])}")
    first = res.get("first")
    for kind in ("Standard", "RecomputeAll"):
        if first:
            r, b0 = first[kind], first["base"]
            print(f"Recomputation {kind} at batch {first['batch']} (does not fit one IPU; the real batch): peak tile "
                  f"memory x{r['peak_tile_bytes'] / b0['peak_tile_bytes']:.3f} ({_b(b0['peak_tile_bytes'])} -> "
                  f"{_b(r['peak_tile_bytes'])} B), cycles x{r['cycles'] / b0['cycles']:.3f} (predicted).")
        r = res[f"recompute {kind}"]
        print(f"Recomputation {kind}: peak tile memory x{r['peak_tile_bytes'] / base['peak_tile_bytes']:.3f} "
              f"({_b(base['peak_tile_bytes'])} -> {_b(r['peak_tile_bytes'])} B), peak live activations on a tile "
              f"x{r['peak_live_bytes'] / max(base['peak_live_bytes'], 1):.3f} ({_b(base['peak_live_bytes'])} -> "
              f"{_b(r['peak_live_bytes'])} B), cycles x{r['cycles'] / base['cycles']:.3f} (predicted).")
    acc = res[f"accumulation {af}"]
    s1, sn = base["update_cycles"] / base["cycles"], acc["update_cycles"] / acc["cycles"]
    print(f"Weight-update share of a batch (predicted; {', '.join(UPDATE_OPS[:3])} ...): accumulation 1: {s1:.2%} "
          f"({_b(base['update_cycles'])} of {_b(base['cycles'])} cycles); accumulation {af}: {sn:.2%} "
          f"({_b(acc['update_cycles'])} of {_b(acc['cycles'])}); share ratio {s1 / sn:.2f} (expected about {af}).")
    rep = res[f"replication {replicas}"]
    ar_s = rep["all_reduce_cycles"] / rep["clock_hz"]
    added_s = rep["seconds"] - base["seconds"]
    bw = rep["link_bytes_per_s"]
    simple = rep["grad_bytes"] / bw
    print(f"Replication {replicas} (predicted): all-reduce {_b(rep['all_reduce_cycles'])} cycles = {ar_s * 1e3:.4g} ms; "
          f"the batch grows by {added_s * 1e3:.4g} ms ({_b(rep['cycles'] - base['cycles'])} cycles). Gradient bytes "
          f"{_b(rep['grad_bytes'])} / IPU-Link bandwidth {bw / 1e9:.0f} GB/s = {simple * 1e3:.4g} ms; all-reduce / "
          f"(bytes / bandwidth) = {ar_s / simple:.2f} (a ring all-reduce sends 2 (R-1)/R of the bytes per IPU, over "
          "half the links in each direction).")
    if "pipeline" in res:
        p, sh = res["pipeline"], res["sharded"]
        print(f"Pipeline vs sharded ({stages} IPUs, predicted steady state, marginal micro-batch): pipeline "
              f"{p['steady_samples_per_s']:,.0f} samples/s, sharded {sh['steady_samples_per_s']:,.0f} samples/s; "
              f"speed-up x{p['steady_samples_per_s'] / sh['steady_samples_per_s']:.2f}.")
    elif "pipeline skipped" in res:
        print(f"Pipeline vs sharded: skipped: {res['pipeline skipped']}")
    else:
        print(f"Pipeline vs sharded: FAILED, an openipu error (please report it): {res['pipeline failed']}")
    ipu_s = base["seconds"]
    print(f"PyTorch eager, HOST wall time of one training step (fp32, this machine's CPU, median of {torch_steps}; "
          f"not a prediction): {res['torch_s']:.3f} s at batch {model.batch}; the predicted IPU time of the baseline "
          f"batch is {ipu_s * 1e3:.2f} ms (host / predicted = {res['torch_s'] / ipu_s:,.0f}).", flush=True)


def summary(results: dict, af: int, replicas: int) -> None:
    print("\nSummary (ratios of predicted IPU figures; the last column is host wall time):")
    print(f"| model | micro-batch | fits | recompute Standard: memory, cycles | RecomputeAll: memory, cycles | "
          f"update share 1 / share {af} | all-reduce / (grad bytes / link bw) | pipeline / sharded | "
          "PyTorch eager host s / step |")
    print("|---|---:|---|---|---|---:|---:|---:|---:|")
    for res in results.values():
        base, model = res["base"], res["model"]
        cells = []
        for kind in ("Standard", "RecomputeAll"):
            r = res[f"recompute {kind}"]
            cell = f"x{r['peak_tile_bytes'] / base['peak_tile_bytes']:.3f}, x{r['cycles'] / base['cycles']:.3f}"
            if res.get("first"):
                f, b0 = res["first"][kind], res["first"]["base"]
                cell += (f" (batch {res['first']['batch']}: x{f['peak_tile_bytes'] / b0['peak_tile_bytes']:.3f}, "
                         f"x{f['cycles'] / b0['cycles']:.3f})")
            cells.append(cell)
        acc, rep = res[f"accumulation {af}"], res[f"replication {replicas}"]
        share = (base["update_cycles"] / base["cycles"]) / (acc["update_cycles"] / acc["cycles"])
        ar = (rep["all_reduce_cycles"] / rep["clock_hz"]) / (rep["grad_bytes"] / rep["link_bytes_per_s"])
        pipe = (f"x{res['pipeline']['steady_samples_per_s'] / res['sharded']['steady_samples_per_s']:.2f}"
                if "pipeline" in res else "skipped" if "pipeline skipped" in res else "FAILED")
        print(f"| {model.label} | {model.batch} | {_fit(base)} | {cells[0]} | {cells[1]} | {share:.2f} | {ar:.2f} | "
              f"{pipe} | {res['torch_s']:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--quick", action="store_true", help="micro-batch 2, BERT-base cut to 2 layers: a smoke test")
    p.add_argument("--batch", type=int, default=None, help="use this micro-batch (no search)")
    p.add_argument("--cache", type=Path, default=ROOT / "build" / "scale-models")
    p.add_argument("--torch-steps", type=int, default=3)
    a = p.parse_args()
    import logging
    logging.disable(logging.WARNING)
    af, pipe_af = (4, 8) if a.quick else (8, 16)
    replicas, stages = 2, 4
    results = {}
    for name in a.models.split(","):
        if name not in MODELS:
            p.error(f"unknown model '{name}'; known: {', '.join(MODELS)}")
        results[name] = run_model(name, a.cache, a.quick, a.batch, af, replicas, stages, pipe_af, a.torch_steps)
    summary(results, af, replicas)


if __name__ == "__main__":
    main()
