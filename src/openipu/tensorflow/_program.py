"""A captured Keras model as a PopART program on the simulated IPU (training or inference).

Training: the forward graph from :mod:`._capture`, the Keras loss as PopART's loss ops, the Keras
optimizer as PopART's optimizer; ``TrainingSession`` grows the backward pass and the weight
updates. One ``run`` is one Keras execution: ``steps_per_execution`` micro-batches per replica
(``steps_per_execution / gradient_accumulation`` weight updates).
"""

import logging

import numpy as np

from openipu import popart

logger = logging.getLogger("tensorflow.python.ipu")

LABEL = "openipu_label"


# -- losses --------------------------------------------------------------------------------------
def loss_kind(loss):
    """``(kind, from_logits)`` of a Keras loss: kind ``"sparse_ce"`` (sparse categorical
    cross-entropy), ``"ce"`` (categorical cross-entropy on one-hot labels) or ``"mse"``.
    Raises ``NotImplementedError`` for other losses."""
    import keras
    name, logits = None, False
    if isinstance(loss, str):
        name = loss
    elif isinstance(loss, keras.losses.Loss):
        cfg = loss.get_config()
        logits = bool(cfg.get("from_logits", False))
        if cfg.get("label_smoothing"):
            raise NotImplementedError("label_smoothing in a loss on the IPU")
        name = type(loss).__name__
    elif callable(loss):
        name = getattr(loss, "__name__", "")
    key = name.lower().replace("_", "") if name else ""
    table = {"sparsecategoricalcrossentropy": "sparse_ce", "categoricalcrossentropy": "ce",
             "meansquarederror": "mse", "mse": "mse"}
    if key not in table:
        raise NotImplementedError(f"the loss {loss!r} on the IPU (supported: sparse_categorical_crossentropy, "
                                  "categorical_crossentropy, mean_squared_error)")
    return table[key], logits


def labels_for(kind: str, y: np.ndarray) -> np.ndarray:
    """Host-side labels as the IPU program takes them: class indices (int32) for the
    cross-entropies (one-hot ``y`` for ``ce``: rows that are not one-hot raise
    ``NotImplementedError``), float32 targets for ``mse``."""
    y = np.asarray(y)
    if kind == "sparse_ce":
        return y.reshape(y.shape[:1] + tuple(d for d in y.shape[1:] if d != 1)).astype(np.int32)
    if kind == "ce":
        idx = y.argmax(-1)
        if not np.array_equal(np.eye(y.shape[-1], dtype=y.dtype)[idx], y):
            raise NotImplementedError("categorical_crossentropy with labels that are not one-hot on the IPU")
        return idx.astype(np.int32)
    return y.astype(np.float32)


# -- optimizers ----------------------------------------------------------------------------------
def _lr(opt) -> float:
    import keras
    lr = opt.learning_rate
    if isinstance(opt._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        return float(opt._learning_rate(opt.iterations))
    return float(np.asarray(lr))


def popart_optimizer(opt):
    """PopART's optimizer for a Keras optimizer: ``SGD`` (momentum, nesterov) → ``popart.SGD``;
    ``Adam`` → ``popart.Adam``; ``RMSprop`` → ``popart.Adaptive`` (RMSProp, TF variant: epsilon
    inside the root). The learning rate is non-const (updated from the host each execution:
    learning-rate schedules work). Raises
    ``NotImplementedError`` for other optimizers and for ``weight_decay``, ``clipnorm``,
    ``clipvalue``, ``global_clipnorm``, ``amsgrad``, ``use_ema``."""
    import keras
    cfg = opt.get_config()
    for k in ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "amsgrad", "use_ema", "centered"):
        if cfg.get(k):
            raise NotImplementedError(f"the Keras optimizer option {k}={cfg[k]!r} on the IPU")
    if (cfg.get("gradient_accumulation_steps") or 0) > 1:
        raise NotImplementedError("Keras's own gradient_accumulation_steps on the IPU: use "
                                  "model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=n)")
    lr = _lr(opt)
    if isinstance(opt, keras.optimizers.SGD):
        m = float(cfg.get("momentum", 0.0))
        if cfg.get("nesterov") and m:
            raise NotImplementedError("SGD(nesterov=True) on the IPU")
        return popart.SGD({"defaultLearningRate": (lr, False), "defaultMomentum": (m, True),
                           "defaultDampening": (0.0, True)})
    if isinstance(opt, keras.optimizers.Adam):
        return popart.Adam({"defaultLearningRate": (lr, False), "defaultBeta1": (float(cfg["beta_1"]), True),
                            "defaultBeta2": (float(cfg["beta_2"]), True), "defaultEps": (float(cfg["epsilon"]), True)},
                           mode=popart.AdamMode.Adam)
    if isinstance(opt, keras.optimizers.RMSprop):
        return popart.Adaptive({"defaultLearningRate": (lr, False), "defaultAlpha": (float(cfg["rho"]), True),
                                "defaultEps": (float(cfg["epsilon"]), True),
                                "defaultMomentum": (float(cfg.get("momentum", 0.0)), True)},
                               mode=popart.AdaptiveMode.RMSProp, rmsprop_tf_variant=True)
    raise NotImplementedError(f"the Keras optimizer {type(opt).__name__} on the IPU (supported: SGD, Adam, RMSprop)")


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
                 sequential=False):
        from ._capture import node_stages, set_training
        self.captured, self.mode, self.batch, self.steps = captured, mode, batch, steps
        self.accumulation, self.replicas = accumulation, replicas
        self.loss_kind = loss
        train = mode == "train"
        proto = set_training(captured.model, train)
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
        self.loss_id = None
        if mode in ("train", "eval"):
            kind, logits = loss
            if kind in ("sparse_ce", "ce"):
                label = builder.addInputTensor(popart.TensorInfo("INT32", [batch]), LABEL)
                probs = builder.aiOnnx.softmax([out], axis=-1) if logits else out
                self.loss_id = builder.aiGraphcore.nllloss([probs, label], reduction=popart.ReductionType.Mean)
            else:
                label = builder.addInputTensor(popart.TensorInfo("FLOAT", [batch] + list(label_shape[1:])), LABEL)
                d = builder.aiOnnx.sub([out, label])
                self.loss_id = builder.aiGraphcore.identityloss([builder.aiOnnx.mul([d, d])],
                                                                reduction=popart.ReductionType.Mean)
            self.label = label
            anchors[self.loss_id] = popart.AnchorReturnType("ALL")
        for c in reversed(ctx):
            c.__exit__(None, None, None)
        anchors[out] = popart.AnchorReturnType("ALL")
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

    def run(self, x: np.ndarray, y: np.ndarray = None):
        """One execution on ``x`` of shape ``[steps * replicas * batch, ...]`` (the order Keras
        takes the batches: step-major, replicas next); returns ``(losses, outputs)`` with
        ``losses`` ``[steps * replicas]`` (or ``None``) and ``outputs`` ``[steps * replicas *
        batch, ...]``; the predicted IPU cycles of the run are in ``self.cycles``."""
        lead = self._lead()
        feeds = {self.captured.input: np.ascontiguousarray(x.reshape(lead + [self.batch] + list(x.shape[1:])))}
        if self.loss_id is not None:
            feeds[self.label] = np.ascontiguousarray(y.reshape(lead + [self.batch] + list(y.shape[1:])))
        anchors = self.session.initAnchorArrays()
        self.session.run(popart.PyStepIO(feeds, anchors))
        self.cycles = int(self.session.getCycleCount())
        out = anchors[self.captured.output]
        out = out.reshape((-1,) + out.shape[len(lead) + 1:]) if lead else out
        losses = anchors[self.loss_id].reshape(-1) if self.loss_id is not None else None
        return losses, out

    @property
    def seconds(self) -> float:
        """Predicted IPU seconds of the last run (cycles at the tile clock)."""
        return (self.cycles or 0) / self.clock_hz
