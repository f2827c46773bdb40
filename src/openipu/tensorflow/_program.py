"""A captured Keras model as a PopART program on the simulated IPU (training or inference).

Training: the forward graph from :mod:`._capture`, the Keras loss as PopART's loss ops, the Keras
optimizer as PopART's optimizer; ``TrainingSession`` grows the backward pass and the weight
updates. One ``run`` is one Keras execution: ``steps_per_execution`` micro-batches per replica
(``steps_per_execution / gradient_accumulation`` weight updates).
"""

import logging

import numpy as np

from openipu import popart
from openipu.poplar.threads import one_torch_thread

logger = logging.getLogger("tensorflow.python.ipu")

LABEL = "openipu_label"


def host_threads():
    """A context running the enclosed simulated-IPU execution with torch on one host thread
    (:func:`openipu.poplar.threads.one_torch_thread`).

    The executor's kernels for these models are small (an MNIST MLP step: 57 ops, a
    ``[32, 784] x [784, 128]`` matmul at most), and TensorFlow's own thread pools share the host:
    on two threads each torch kernel waits for a scheduler slice for its second thread. Measured
    on this 2-core host with other jobs running (2026-11-29): that matmul 0.66 ms wall on one
    thread, 51 ms on two with TensorFlow imported; Graphcore's ``mnist_with_feeds.py`` step
    0.415 s of CPU per ``strategy.run`` (10 steps) on two threads, 0.041 s on one. Results do not
    change (the kernels are the same; only torch's work split)."""
    return one_torch_thread()


# -- losses --------------------------------------------------------------------------------------
def loss_kind(loss):
    """``(kind, from_logits)`` of a Keras loss: kind ``"sparse_ce"`` (sparse categorical
    cross-entropy without label smoothing: PopART's ``nllloss``), ``"mse"`` (mean squared error:
    an ``identityloss`` of the squared error) or ``"keras"``: any other Keras loss (categorical
    and binary cross-entropy, MAE, Huber, label smoothing...), whose own TensorFlow code is
    captured as ONNX by :func:`capture_loss` and joined to the forward graph, so it is Keras's
    exact formula (clipping epsilons included)."""
    import keras
    name, logits = None, False
    if isinstance(loss, str):
        name = loss
    elif isinstance(loss, keras.losses.Loss):
        cfg = loss.get_config()
        logits = bool(cfg.get("from_logits", False))
        if cfg.get("label_smoothing") or cfg.get("reduction") not in (None, "sum_over_batch_size"):
            return "keras", logits
        name = type(loss).__name__
    elif callable(loss):
        name = getattr(loss, "__name__", "")
    key = name.lower().replace("_", "") if name else ""
    table = {"sparsecategoricalcrossentropy": "sparse_ce", "meansquarederror": "mse", "mse": "mse"}
    return table.get(key, "keras"), logits


def labels_for(kind: str, y: np.ndarray) -> np.ndarray:
    """Host-side labels as the IPU program takes them: class indices (int32) for ``sparse_ce``,
    float32 targets for ``mse``, ``y`` as Keras gives it (float64 as float32) for ``keras``."""
    y = np.asarray(y)
    if kind == "sparse_ce":
        return y.reshape(y.shape[:1] + tuple(d for d in y.shape[1:] if d != 1)).astype(np.int32)
    if kind == "keras" and y.dtype.kind in "iub":
        return y.astype(np.int32)
    return y.astype(np.float32)


def capture_loss(model, batch_shape_pred, label, y_structure=None, pred_structure=None):
    """The model's compiled Keras loss (``model._compile_loss(y_true, y_pred)``: the reduced
    scalar with Keras's ``sum_over_batch_size``, per-output losses times ``loss_weights``
    summed) as an ONNX model (a :class:`._capture.Captured` without variables).

    One output: inputs ``y_true`` (the labels' dtype, ``[batch, ...]``) and ``y_pred``
    (``batch_shape_pred``, float32); one scalar output. Several outputs (``label`` and
    ``batch_shape_pred`` lists in ``tf.nest.flatten`` order of ``y_structure`` /
    ``pred_structure``): the inputs are the flat labels then the flat predictions; the outputs
    are the total then each output's unweighted loss, which Keras records in its per-output
    ``<name>_loss`` trackers (their updates are not part of the graph: the caller applies them on
    the host). ``n_labels`` on the result is the number of label inputs."""
    import tensorflow as tf

    from ._capture import capture_function
    compile_loss = model._compile_loss
    if y_structure is None:
        labels, preds = [label], [batch_shape_pred]
    else:
        labels, preds = list(label), list(batch_shape_pred)
    specs = [tf.TensorSpec(tuple(lab.shape), tf.as_dtype(lab.dtype), name=f"y_true{i}" if i else "y_true")
             for i, lab in enumerate(labels)]
    specs += [tf.TensorSpec(tuple(sh), tf.float32, name=f"y_pred{i}" if i else "y_pred") for i, sh in enumerate(preds)]
    n = len(labels)

    def pack(flat, structure):
        return flat[0] if structure is None else tf.nest.pack_sequence_as(structure, list(flat))
    if not compile_loss.built:
        zeros = [tf.zeros(sp.shape, sp.dtype) for sp in specs]
        compile_loss.build(pack(zeros[:n], y_structure), pack(zeros[n:], pred_structure))
    trackers = list(compile_loss.metrics)
    recorded = []

    def fn(*flat):
        recorded.clear()
        total = compile_loss(pack(flat[:n], y_structure), pack(flat[n:], pred_structure))
        return [total] + recorded if trackers else total
    try:               # the trackers' updates recorded instead of assigned (tf2onnx drops assignments)
        for t in trackers:
            t.update_state = lambda value, sample_weight=None: recorded.append(tf.identity(value))
        cap = capture_function(fn, specs, [])
    finally:
        for t in trackers:
            del t.update_state
    cap.n_labels = n
    return cap


def join_loss(forward, loss):
    """One ONNX model: the captured forward with the captured loss fed by its outputs (the loss
    graph's names prefixed ``loss/``); its inputs are the forward's then the loss's labels; its
    outputs the forward's outputs then the loss's (the total first)."""
    from onnx import compose
    n = getattr(loss, "n_labels", 1)
    return compose.merge_models(forward.model, loss.model,
                                io_map=[(o, loss.inputs[n + i]) for i, o in enumerate(forward.outputs)],
                                prefix2="loss/", outputs=list(forward.outputs) + ["loss/" + o for o in loss.outputs])


# -- optimizers ----------------------------------------------------------------------------------
def _lr(opt) -> float:
    import keras
    import tensorflow as tf
    if isinstance(opt, tf.compat.v1.train.Optimizer):      # GradientDescent / Momentum: _learning_rate; Adam: _lr
        lr = getattr(opt, "_learning_rate", getattr(opt, "_lr", None))
        return float(np.asarray(lr() if callable(lr) else lr))
    lr = opt.learning_rate
    if isinstance(opt._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        return float(opt._learning_rate(opt.iterations))
    return float(np.asarray(lr))


def popart_optimizer(opt):
    """PopART's optimizer for a Keras optimizer, with Keras's update formulas:

    - ``SGD(momentum, nesterov)`` → ``popart.SGD`` (PopART's velocity ``v = m v + g``,
      ``w -= lr v``, nesterov ``w -= lr (g + m v)``: Keras's for a constant learning rate);
    - ``Adam`` / ``AdamW`` → ``popart.Adam`` with Keras's epsilon placement
      (``w -= lr m / (sqrt(v) + eps) sqrt(1 - b2^t) / (1 - b1^t)``) and, for ``weight_decay``,
      decoupled decay (``WeightDecayMode.Decay``: ``w -= lr wd w``, Keras's); an embedding
      table's second moment adds each lookup's squared gradient, as Keras 3 does with
      TensorFlow's ``IndexedSlices`` (``Adam.per_lookup_second_moment``);
    - ``RMSprop`` → ``popart.Adaptive`` (RMSProp, TF variant: epsilon inside the root; an
      embedding table's mean square per lookup, as Adam's second moment).

    The learning rate is non-const (updated from the host each execution: learning-rate
    schedules work). Raises ``NotImplementedError`` for other optimizers and for ``clipnorm``,
    ``clipvalue``, ``global_clipnorm``, ``amsgrad``, ``use_ema``, ``centered``, and
    ``weight_decay`` on SGD / RMSprop."""
    import keras
    import tensorflow as tf
    if isinstance(opt, tf.compat.v1.train.Optimizer):
        return _v1_popart_optimizer(opt)
    cfg = opt.get_config()
    for k in ("clipnorm", "clipvalue", "global_clipnorm", "amsgrad", "use_ema", "centered"):
        if cfg.get(k):
            raise NotImplementedError(f"the Keras optimizer option {k}={cfg[k]!r} on the IPU")
    if (cfg.get("gradient_accumulation_steps") or 0) > 1:
        raise NotImplementedError("Keras's own gradient_accumulation_steps on the IPU: use "
                                  "model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=n)")
    wd = float(cfg.get("weight_decay") or 0.0)
    if wd and not isinstance(opt, keras.optimizers.Adam | keras.optimizers.AdamW):
        raise NotImplementedError(f"weight_decay on the Keras optimizer {type(opt).__name__} on the IPU (supported "
                                  "with Adam and AdamW)")
    lr = _lr(opt)
    if isinstance(opt, keras.optimizers.SGD):
        m = float(cfg.get("momentum", 0.0))
        return popart.SGD({"defaultLearningRate": (lr, False), "defaultMomentum": (m, True),
                           "defaultDampening": (0.0, True), "nesterov": (1.0 if cfg.get("nesterov") and m else 0.0,
                                                                         True)})
    if isinstance(opt, keras.optimizers.Adam | keras.optimizers.AdamW):
        adam = popart.Adam({"defaultLearningRate": (lr, False), "defaultBeta1": (float(cfg["beta_1"]), True),
                            "defaultBeta2": (float(cfg["beta_2"]), True), "defaultEps": (float(cfg["epsilon"]), True),
                            "defaultWeightDecay": (wd, True)},
                           mode=popart.AdamMode.Adam, weight_decay_mode=popart.WeightDecayMode.Decay)
        adam.eps_before_correction = True
        adam.per_lookup_second_moment = True     # IndexedSlices: each lookup's gradient squared
        return adam
    if isinstance(opt, keras.optimizers.RMSprop):
        rms = popart.Adaptive({"defaultLearningRate": (lr, False), "defaultAlpha": (float(cfg["rho"]), True),
                               "defaultEps": (float(cfg["epsilon"]), True),
                               "defaultMomentum": (float(cfg.get("momentum", 0.0)), True)},
                              mode=popart.AdaptiveMode.RMSProp, rmsprop_tf_variant=True)
        rms.per_lookup_second_moment = True
        return rms
    raise NotImplementedError(f"the Keras optimizer {type(opt).__name__} on the IPU (supported: SGD, Adam, AdamW, "
                              "RMSprop)")


def _v1_popart_optimizer(opt):
    """PopART's optimizer for a TensorFlow v1 optimizer (``tf.compat.v1.train``), with TF's
    update formulas: ``GradientDescentOptimizer`` → ``popart.SGD``; ``MomentumOptimizer(lr, m,
    use_nesterov)`` (``a = m a + g``, ``w -= lr a``; nesterov ``w -= lr (g + m a)``) →
    ``popart.SGD`` with momentum, no dampening; ``AdamOptimizer`` (``w -= lr sqrt(1 - b2^t) /
    (1 - b1^t) m / (sqrt(v) + eps)``) → ``popart.Adam`` with that epsilon placement. Raises
    ``NotImplementedError`` for other v1 optimizers."""
    import tensorflow as tf
    v1 = tf.compat.v1.train
    lr = _lr(opt)
    if isinstance(opt, v1.MomentumOptimizer):
        m = float(np.asarray(opt._momentum))
        return popart.SGD({"defaultLearningRate": (lr, False), "defaultMomentum": (m, True),
                           "defaultDampening": (0.0, True),
                           "nesterov": (1.0 if opt._use_nesterov and m else 0.0, True)})
    if isinstance(opt, v1.GradientDescentOptimizer):
        return popart.SGD({"defaultLearningRate": (lr, False)})
    if isinstance(opt, v1.AdamOptimizer):
        adam = popart.Adam({"defaultLearningRate": (lr, False), "defaultBeta1": (float(opt._beta1), True),
                            "defaultBeta2": (float(opt._beta2), True), "defaultEps": (float(opt._epsilon), True),
                            "defaultWeightDecay": (0.0, True)}, mode=popart.AdamMode.Adam)
        adam.eps_before_correction = True
        return adam
    raise NotImplementedError(f"the TensorFlow v1 optimizer {type(opt).__name__} on the IPU (supported: "
                              "GradientDescentOptimizer, MomentumOptimizer, AdamOptimizer)")


def _distribution(opts, replicas) -> int:
    """PopART's distributed replicated graphs on ``opts`` when the configured IPU system is one
    instance of several (``experimental.multi_replica_distribution``, set by
    ``popdist.tensorflow.set_ipu_config``): ``globalReplicationFactor`` = ``replicas`` x
    instances, ``globalReplicaOffset`` = ``replicas`` x the instance index. Returns the number of
    instances (1: not distributed)."""
    from . import config as _config
    sysm = _config._system()
    if sysm is None:
        return 1
    mrd = sysm.config.experimental.multi_replica_distribution
    n = int(mrd.process_count)
    if n <= 1:
        return 1
    opts.enableDistributedReplicatedGraphs = True
    opts.globalReplicationFactor = replicas * n
    opts.globalReplicaOffset = replicas * int(mrd.process_index)
    return n


def _broadcast_keras_variables(variables) -> None:
    """Instance 0's values of the Keras ``variables`` on every instance (PopDist's weight
    broadcast before the first run; one ``torch.distributed`` broadcast of their bytes)."""
    import torch

    from openipu.poplibs import gcl_instances
    vals = [torch.from_numpy(np.ascontiguousarray(v.numpy()).copy()) for v in variables]
    gcl_instances.broadcast_tensors_from(vals, 0, "broadcastWeights")
    for v, t in zip(variables, vals):
        v.assign(t.numpy())


# -- the program ---------------------------------------------------------------------------------
class IpuProgram:
    """One compiled PopART session for a Keras model.

    ``mode``: ``"train"`` (forward, loss, backward, optimizer), ``"eval"`` (forward and loss) or
    ``"predict"`` (forward). ``batch``: the micro-batch size per replica; ``steps``: micro-batches
    per replica per run (``steps_per_execution``); ``accumulation`` (training) divides ``steps``;
    ``replicas`` and ``num_ipus`` size the device; ``mean_accumulation`` averages the accumulated
    gradients (Graphcore's ``MEAN`` / ``RUNNING_MEAN``) instead of summing them (``SUM``).
    A staged model is pipelined over ``device_mapping`` (``sequential``: Graphcore's
    ``PipelineSchedule.Sequential``, the stages run one after another: sharding, no overlap).
    """

    def __init__(self, captured, mode, batch, steps, loss=None, optimizer=None, accumulation=1, replicas=1,
                 num_ipus=1, label_shape=None, mean_accumulation=False, device_mapping=None,
                 sequential=False, keras_loss=None):
        from ._capture import node_stages, set_training
        self.captured, self.mode, self.batch, self.steps = captured, mode, batch, steps
        self.accumulation, self.replicas = accumulation, replicas
        self.loss_kind = loss
        train = mode == "train"
        proto = set_training(captured.model, train)
        if mode in ("train", "eval") and loss[0] == "keras":     # the Keras loss's own graph, joined
            from ._capture import Captured
            proto = join_loss(Captured(proto, captured.inputs, captured.outputs, [], 0), keras_loss)
        stages = node_stages(proto)
        pipelined = stages[0] is not None if stages else False
        last_ipu = last_stage = 0
        if pipelined:
            from onnx import helper
            mapping = device_mapping or list(range(max(stages) + 1))
            for node, st in zip(proto.graph.node, stages):
                if node.op_type == "Constant":      # extra attributes would break ONNX's Constant inference
                    continue
                if not sequential:
                    node.attribute.append(helper.make_attribute("__pipeline_stage", int(st)))
                node.attribute.append(helper.make_attribute("__ipu_number", int(mapping[st])))
            last_stage = max(stages)
            last_ipu = mapping[last_stage]
        self.pipelined = pipelined
        builder = popart.Builder(proto.SerializeToString())
        ctx = [builder.virtualGraph(last_ipu)] if pipelined else []
        if pipelined and not sequential:
            ctx.append(builder.pipelineStage(last_stage))
        for c in ctx:
            c.__enter__()
        out = captured.output
        anchors = {}
        self.loss_id, self.labels, self.output_losses = None, [], []
        if mode in ("train", "eval"):
            kind, logits = loss
            if kind == "keras":
                n = getattr(keras_loss, "n_labels", 1)
                self.labels = ["loss/" + i for i in keras_loss.inputs[:n]]
                self.loss_id = builder.aiGraphcore.identityloss(["loss/" + keras_loss.output],
                                                                reduction=popart.ReductionType.Sum)
                self.output_losses = ["loss/" + o for o in keras_loss.outputs[1:]]
                for o in self.output_losses:
                    anchors[o] = popart.AnchorReturnType("ALL")
            elif kind == "sparse_ce":
                label = builder.addInputTensor(popart.TensorInfo("INT32", [batch]), LABEL)
                probs = builder.aiOnnx.softmax([out], axis=-1) if logits else out
                self.loss_id = builder.aiGraphcore.nllloss([probs, label], reduction=popart.ReductionType.Mean)
            else:
                label = builder.addInputTensor(popart.TensorInfo("FLOAT", [batch] + list(label_shape[1:])), LABEL)
                d = builder.aiOnnx.sub([out, label])
                self.loss_id = builder.aiGraphcore.identityloss([builder.aiOnnx.mul([d, d])],
                                                                reduction=popart.ReductionType.Mean)
            if kind != "keras":
                self.labels = [label]
            anchors[self.loss_id] = popart.AnchorReturnType("ALL")
        for c in reversed(ctx):
            c.__exit__(None, None, None)
        for o in captured.outputs:
            anchors[o] = popart.AnchorReturnType("ALL")
        opts = popart.SessionOptions()
        if accumulation > 1:
            opts.enableGradientAccumulation = True
            opts.accumulationFactor = accumulation
            if mean_accumulation:
                opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
        if pipelined:
            opts.enablePipelining = not sequential
            opts.virtualGraphMode = popart.VirtualGraphMode.Manual
        if replicas > 1:
            opts.enableReplicatedGraphs = True
            opts.replicatedGraphCount = replicas
        self.instances = _distribution(opts, replicas)
        self.bps = steps // accumulation if train else steps
        flow = popart.DataFlow(self.bps, anchors)
        device = popart.DeviceManager().acquireAvailableDevice(num_ipus)
        proto = builder.getModelProto()
        if train:
            self.optimizer = optimizer
            self.session = popart.TrainingSession(fnModel=proto, dataFlow=flow, loss=self.loss_id,
                                                  optimizer=optimizer, deviceInfo=device, userOptions=opts,
                                                  name="keras_train")
        else:
            opts.constantWeights = False
            self.session = popart.InferenceSession(fnModel=proto, dataFlow=flow, deviceInfo=device,
                                                   userOptions=opts, name=f"keras_{mode}")
        self.session.prepareDevice()
        from . import config as _config
        seed = getattr(_config, "_SEED", None)
        if seed is not None:            # ipu.utils.reset_ipu_seed: PopART's dropout masks
            self.session.setRandomSeed(int(seed))
        self.clock_hz = float(device.device.getTarget().spec.clock_hz)
        self.cycles = None

    # weights -----------------------------------------------------------------------------------
    def weights_from_keras(self):
        if self.instances > 1 and not getattr(self, "_broadcast", False):
            _broadcast_keras_variables([m.variable for m in self.captured.variables])
            self._broadcast = True
        w = {m.name: m.to_onnx(m.variable.numpy()).astype(np.float32) for m in self.captured.variables}
        self.session.writeWeights(popart.PyWeightsIO(w))
        self.session.weightsFromHost()

    def weights_to_keras(self):
        self.session.weightsToHost()
        bufs = {m.name: np.zeros(m.shape, np.float32) for m in self.captured.variables}
        self.session.readWeights(popart.PyWeightsIO(bufs))
        for m in self.captured.variables:
            m.variable.assign(m.to_keras(bufs[m.name]).astype(m.variable.dtype))

    def set_learning_rate(self, opt):
        """Send the Keras optimizer's current learning rate (schedules are evaluated on the host)."""
        new = popart_optimizer(opt)
        self.session.updateOptimizerFromHost(new)

    # run ---------------------------------------------------------------------------------------
    def _lead(self):
        return [d for d in (self.bps, self.accumulation if self.mode == "train" else 1, self.replicas) if d > 1]

    def run(self, x, y=None):
        """One execution on ``x``: a list with one array per model input (or one array), each of
        shape ``[steps * replicas * batch, ...]`` (the order Keras takes the batches: step-major,
        replicas next), and ``y`` a list of label arrays (or one, or ``None``). Returns
        ``(losses, outputs, output_losses)``: ``losses`` ``[steps * replicas]`` (or ``None``),
        ``outputs`` a list with one ``[steps * replicas * batch, ...]`` array per model output,
        ``output_losses`` a list with one ``[steps * replicas]`` array of unweighted losses per
        output of a multi-output model (empty otherwise); the predicted IPU cycles of the run are
        in ``self.cycles``."""
        lead = self._lead()
        xs = x if isinstance(x, (list, tuple)) else [x]
        ys = [] if y is None else (y if isinstance(y, (list, tuple)) else [y])

        def shaped(a):
            return np.ascontiguousarray(a.reshape(lead + [self.batch] + list(a.shape[1:])))
        feeds = {i: shaped(a) for i, a in zip(self.captured.inputs, xs)}
        if self.loss_id is not None:
            feeds.update({lab: shaped(a) for lab, a in zip(self.labels, ys)})
        anchors = self.session.initAnchorArrays()
        with host_threads():
            self.session.run(popart.PyStepIO(feeds, anchors))
        self.cycles = int(self.session.getCycleCount())
        outs = []
        for o in self.captured.outputs:
            a = anchors[o]
            outs.append(a.reshape((-1,) + a.shape[len(lead) + 1:]) if lead else a)
        losses = anchors[self.loss_id].reshape(-1) if self.loss_id is not None else None
        per = [anchors[o].reshape(-1) for o in self.output_losses] if self.loss_id is not None else []
        return losses, outs, per

    @property
    def seconds(self) -> float:
        """Predicted IPU seconds of the last run (cycles at the tile clock)."""
        return (self.cycles or 0) / self.clock_hz
