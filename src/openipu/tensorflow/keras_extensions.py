"""Keras 3 models built in an ``IPUStrategy`` scope: ``fit`` / ``evaluate`` / ``predict`` as PopART
programs on the simulated IPU, and Graphcore's IPU model methods (``set_gradient_accumulation_options``,
``set_pipelining_options``, ``set_replication_options`` ...).

Mirrors Graphcore's Keras extensions (SDK 2.6-3.4): the dataset rules and their error texts
(whole batches, fully defined shapes, ``steps_per_execution`` dividing the batches per replica),
implicit replication over the configured IPUs, one callback per execution. The forward pass is
captured once per input shape (:mod:`._capture`), the training step compiled once per
``steps_per_execution`` (:mod:`._program`); after every execution the weights flow back into the
Keras variables. ``model.ipu_predicted_seconds`` holds the **predicted** IPU seconds of the last
execution and per step (cost model at the tile clock; not host time).
"""

import logging

import numpy as np

from . import config as _config
from .gradient_accumulation import GradientAccumulationReductionMethod
from .ops.pipelining_ops import PipelineSchedule

logger = logging.getLogger("tensorflow.python.ipu")

_ORIG = {}


def _strategy(model):
    from .ipu_strategy import IPUStrategyV1
    s = getattr(model, "_distribute_strategy", None)
    if isinstance(s, IPUStrategyV1) and s._enable_keras_extensions:
        return s
    return None


def _state(model) -> dict:
    st = model.__dict__.get("_openipu_state")
    if st is None:
        st = {"ga": 1, "ga_reduction": GradientAccumulationReductionMethod.SUM, "pipelining": None,
              "programs": {}, "captured": {}, "stage_assignment": None, "replication_reduction": "NONE",
              "async_callbacks": False, "infeed": {}, "outfeed": {}}
        object.__setattr__(model, "_openipu_state", st)
    return st


def _invalidate(model):
    st = _state(model)
    st["programs"].clear()


# -- IPU model methods -----------------------------------------------------------------------------
def set_gradient_accumulation_options(self, gradient_accumulation_steps_per_replica=None,
                                      gradient_accumulation_reduction_method="sum", use_v2_gradient_accumulation=None,
                                      **gradient_accumulation_optimizer_kwargs):
    """Accumulate gradients over ``gradient_accumulation_steps_per_replica`` micro-batches per
    weight update (Graphcore's default reduction ``SUM``). Raises ``ValueError`` unless a
    positive int."""
    st = _state(self)
    n = gradient_accumulation_steps_per_replica
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError("Expected `gradient_accumulation_steps_per_replica` to be a positive integer, but got "
                         f"{n} instead.")
    st["ga"] = n or 1
    st["ga_reduction"] = GradientAccumulationReductionMethod.parse(gradient_accumulation_reduction_method)
    _invalidate(self)


_PIPELINE_KW_ALT = {"gradient_accumulation_count": "gradient_accumulation_steps_per_replica",
                    "device_mapping": "device_mapping", "accumulate_outfeed": "accumulate_outfeed"}
_PIPELINE_KW_AUTO = ("computational_stages", "repeat_count", "inputs", "infeed_queue", "outfeed_queue",
                     "optimizer_function")
_PIPELINE_KW_BAD = ("outfeed_loss", "outfeed_mask", "batch_serialization_iterations")


def set_pipelining_options(self, gradient_accumulation_steps_per_replica=None, device_mapping=None,
                           accumulate_outfeed=None, gradient_accumulation_reduction_method="sum",
                           **pipelining_kwargs):
    """Graphcore's pipelining options (checked as Graphcore checks them). Pipelined execution is
    not implemented yet on this route: ``fit`` on a pipelined model raises ``NotImplementedError``."""
    for k in pipelining_kwargs:
        if k in _PIPELINE_KW_ALT:
            raise ValueError(f"Found `{k}` key in `pipelining_kwargs`. Set the `{_PIPELINE_KW_ALT[k]}` argument to "
                             "`set_pipelining_options` instead.")
        if k in _PIPELINE_KW_AUTO:
            raise ValueError(f"Found `{k}` key in `pipelining_kwargs`. This argument is automatically set by Keras.")
        if k in _PIPELINE_KW_BAD:
            raise ValueError(f"Found `{k}` key in `pipelining_kwargs`. This argument is not compatible with Keras.")
    n = gradient_accumulation_steps_per_replica
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError("Expected `gradient_accumulation_steps_per_replica` to be a positive integer, but got "
                         f"{n} instead.")
    _state(self)["pipelining"] = {"ga": n, "device_mapping": device_mapping, "accumulate_outfeed": accumulate_outfeed,
                                  "reduction": GradientAccumulationReductionMethod.parse(
                                      gradient_accumulation_reduction_method), "kwargs": dict(pipelining_kwargs)}
    _invalidate(self)


def set_pipeline_stage_assignment(self, pipeline_stage_assignment):
    """The stage of every layer (not the input layers), in ``model.layers`` order: ints or
    objects with a ``pipeline_stage``. Raises ``ValueError`` when the length differs."""
    layers = _staged_layers(self)
    stages = [int(getattr(a, "pipeline_stage", a)) for a in pipeline_stage_assignment]
    if len(stages) != len(layers):
        raise ValueError(f"The size of the provided `pipeline_stage_assignment` ({len(stages)}) does not match the "
                         f"number of layers in the model (currently {len(layers)}). Each layer in a model must be "
                         "assigned to a pipeline stage.")
    for lay, st in zip(layers, stages):
        object.__setattr__(lay, "_openipu_stage", st)
    _state(self)["stage_assignment"] = stages
    _invalidate(self)


def get_pipeline_stage_assignment(self):
    """The stage of every layer (``model.layers`` order, input layers left out) or ``None``s."""
    return [getattr(lay, "_openipu_stage", None) for lay in _staged_layers(self)]


def reset_pipeline_stage_assignment(self):
    for lay in _staged_layers(self):
        object.__setattr__(lay, "_openipu_stage", None)
    _state(self)["stage_assignment"] = None
    _invalidate(self)


def set_infeed_queue_options(self, **kwargs):
    _state(self)["infeed"] = dict(kwargs)


def set_outfeed_queue_options(self, **kwargs):
    _state(self)["outfeed"] = dict(kwargs)


def set_asynchronous_callbacks(self, asynchronous=False):
    _state(self)["async_callbacks"] = bool(asynchronous)


def set_replication_options(self, replicated_metric_reduction_method="NONE"):
    _state(self)["replication_reduction"] = str(getattr(replicated_metric_reduction_method, "name",
                                                        replicated_metric_reduction_method)).upper()


_METHODS = {f.__name__: f for f in (set_gradient_accumulation_options, set_pipelining_options,
                                      set_pipeline_stage_assignment, get_pipeline_stage_assignment,
                                      reset_pipeline_stage_assignment, set_infeed_queue_options,
                                      set_outfeed_queue_options, set_asynchronous_callbacks, set_replication_options)}


# -- data ----------------------------------------------------------------------------------------
class _Data:
    """Batches of one pass. ``x`` / ``y``: arrays, or lists / tuples / dicts of arrays for models
    with several inputs / outputs (as Keras takes them), or a ``tf.data.Dataset`` of ``(x, y)``
    elements of those structures. ``take(k)`` gives ``k`` batches concatenated as two flat lists
    of arrays (``tf.nest.flatten`` order: dict keys sorted); ``x_structure`` / ``y_structure``
    pack them back (``None``: a single array)."""

    def __init__(self, x, y, batch_size, steps, shuffle, what):
        import tensorflow as tf
        self.dataset = None
        self.x_structure = self.y_structure = None
        if isinstance(x, tf.data.Dataset):
            spec = x.element_spec
            for s in tf.nest.flatten(spec):
                if not s.shape.is_fully_defined():
                    raise ValueError(f"The provided set of data contains a shape {s.shape} which is not fully defined. "
                                     "Executing on IPU requires all dataset elements to have fully defined shapes. If "
                                     "using batch() make sure to set `drop_remainder=True`.")
            card = int(x.cardinality())
            if card < 0 and steps is None:
                raise ValueError("Could not infer the size of the data. You must specify the number of steps to run.")
            self.dataset = x
            self.size = card if card >= 0 else None
            self.batch_size = int(tf.nest.flatten(spec)[0].shape[0])
            xs, ys = (spec[0], spec[1] if len(spec) > 1 else None) if isinstance(spec, tuple) else (spec, None)
            self.x_structure = _structure(xs)
            self.y_structure = _structure(ys)
            self.x = self.y = None
        elif hasattr(x, "__next__") or (hasattr(x, "__iter__") and not hasattr(x, "__len__") and
                                        not isinstance(x, dict)):
            raise ValueError(f"The provided set of data is of type `{type(x)}` which is not compatible with the IPU's "
                             "requirement to know the data shape ahead of time. Please use "
                             "`tf.data.Dataset.from_generator()` to convert your generator into a dataset.")
        else:
            self.x_structure, self.y_structure = _structure(x), _structure(y)
            self.x = [_f32(np.asarray(a)) for a in tf.nest.flatten(x)]
            self.y = None if y is None else [np.asarray(a) for a in tf.nest.flatten(y)]
            bs = batch_size or 32
            n = len(self.x[0])
            if n % bs:
                raise ValueError("The provided set of data has a partial batch, which could result in data being "
                                 "dropped. Either adjust the `batch_size` of your model (currently set to "
                                 f"{bs}) or pad your dataset to ensure there are no partial batches.")
            self.batch_size = bs
            self.size = n // bs
        self.shuffle = shuffle
        self._it = None
        self._order = None

    def start_epoch(self):
        if self.dataset is not None:
            if self._it is None or self.size is not None:
                self._it = iter(self.dataset)
        else:
            n = len(self.x[0])
            self._order = np.random.permutation(n) if self.shuffle else None
            self._pos = 0

    @staticmethod
    def _split(el):
        import tensorflow as tf
        if isinstance(el, tuple):
            xs, ys = el[0], (el[1] if len(el) > 1 else None)
        else:
            xs, ys = el, None
        return ([np.asarray(a) for a in tf.nest.flatten(xs)],
                None if ys is None else [np.asarray(a) for a in tf.nest.flatten(ys)])

    def take(self, k: int):
        if self.dataset is not None:
            parts = [self._split(next(self._it)) for _ in range(k)]
            xs = [_f32(np.concatenate(c)) for c in zip(*[p[0] for p in parts])]
            ys = None if parts[0][1] is None else [np.concatenate(c) for c in zip(*[p[1] for p in parts])]
            return xs, ys
        n = k * self.batch_size
        idx = slice(self._pos, self._pos + n) if self._order is None else self._order[self._pos:self._pos + n]
        self._pos += n
        return [a[idx] for a in self.x], (None if self.y is None else [a[idx] for a in self.y])

    def take_sample(self):
        """One batch (flat lists, as :meth:`take`) without consuming the pass."""
        if self.dataset is not None:
            return self._split(next(iter(self.dataset)))
        bs = self.batch_size
        return [a[:bs] for a in self.x], (None if self.y is None else [a[:bs] for a in self.y])


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype == np.float64 else a


def _structure(v):
    """``v``'s nesting with ``None`` leaves (``None`` for a single array or no value)."""
    import tensorflow as tf
    if v is None or not tf.nest.is_nested(v):
        return None
    return tf.nest.map_structure(lambda _: None, v)


def _pack(structure, flat):
    """Flat arrays back into Keras's structure (one array when ``structure`` is ``None``)."""
    import tensorflow as tf
    if flat is None:
        return None
    return flat[0] if structure is None else tf.nest.pack_sequence_as(structure, list(flat))


def _plan(model, data, steps, spe, replicas, what):
    """Steps per replica per epoch and the ``steps_per_execution`` to use (Graphcore's rules)."""
    total = data.size
    if steps is not None:
        if total is not None and steps > total:
            raise ValueError(f"Your input does not have enough data. Make sure that your dataset or generator can "
                             f"generate at least {steps} batches (currently it can only generate {total} batches). "
                             "You may need to use the repeat() function when building your dataset.")
        total = steps
    per = total // replicas
    if per < 1:
        raise ValueError(f"The provided dataset contains {total} items, but all {replicas} replicas are requested to "
                         f"run 1 steps each. Make sure the dataset contains at least {replicas} items.")
    if total % replicas:
        k = total % replicas
        logger.warning("Dataset of length %d is being evenly distributed between %d replicas. The remaining %d "
                       "batch%s will be dropped.", total, replicas, k, "es" if k > 1 else "")
    rep = " to this replica" if replicas > 1 else ""
    if spe > per:
        logger.warning("The model `%s` `steps_per_execution` has been set to %d but the dataset provided%s only "
                       "contains %d batches. Using %d as `steps_per_execution`.", model.name, spe, rep, per, per)
        spe = per
    if per % spe:
        raise ValueError(f"{what}: `steps_per_execution` ({spe}) must be a divisor of the number of batches ({per}) in "
                         f"the dataset provided{rep}.")
    return per, spe


def _shards(model) -> int:
    """IPUs per replica: the pipeline's ``max(device_mapping) + 1`` (or stage count), else 1."""
    st = _state(model)
    stages = _layer_stages(model)
    if not stages:
        return 1
    mapping = (st["pipelining"] or {}).get("device_mapping")
    return (max(mapping) if mapping else max(stages)) + 1


def _layer_stages(model) -> list:
    return [s for s in (getattr(lay, "_openipu_stage", None) for lay in _staged_layers(model)) if s is not None]


def _staged_layers(model):
    import keras
    return [lay for lay in getattr(model, "layers", []) if not isinstance(lay, keras.layers.InputLayer)]


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _replicas(model) -> int:
    sysm = _config._system()
    n = sysm.num_ipus if sysm is not None else 1
    shards = _shards(model)
    if n % _next_pow2(shards) or n < shards:
        raise ValueError(f"Current device has {n} IPUs attached, however the current model requires a multiple of "
                         f"{_next_pow2(shards)} IPUs.")
    return max(1, n // _next_pow2(shards))


def _check_model(model):
    if model.run_eagerly:
        raise RuntimeError("Keras models cannot run eagerly when using `IPUStrategy`. Set `run_eagerly=False` when "
                           "calling `compile`.")
    layers = _staged_layers(model)
    staged = [getattr(lay, "_openipu_stage", None) is not None for lay in layers]
    if any(staged) and not all(staged):
        lay = layers[staged.index(False)]
        raise ValueError(f"All layers of a pipelined model must have an associated pipeline stage. However, {lay.name} "
                         "has not been assigned to one. Pipeline stages can be assigned when a layer is constructed, "
                         "or each time a layer is called. Different pipeline stages can assigned to each call.")


def _pipeline_ga(model, training: bool):
    """The gradient accumulation of a pipelined model (``None`` when not pipelined)."""
    if not _layer_stages(model):
        return None
    ga = (_state(model)["pipelining"] or {}).get("ga")
    if ga is None and training:
        raise ValueError("The model which you are attempting to train is pipelined, however "
                         "`gradient_accumulation_steps_per_replica` has not been set through "
                         "`set_pipelining_options()`. You need to set this value as pipelined models will perform "
                         "gradient accumulation when training.")
    return ga


def _program(model, mode, data, spe, replicas, ga):
    from ._capture import capture
    from ._program import IpuProgram, capture_loss, labels_for, loss_kind, popart_optimizer
    st = _state(model)
    bs = data.batch_size
    x0, y0 = data.take_sample()
    key = (mode, bs, spe, replicas, ga, tuple(a.shape[1:] for a in x0))
    if key in st["programs"]:
        return st["programs"][key]
    ckey = (bs,) + tuple((a.shape[1:], str(a.dtype)) for a in x0)
    if ckey not in st["captured"]:
        if not model.built:
            if data.x_structure is None:
                model.build((None,) + tuple(x0[0].shape[1:]))
            else:
                model.build(_pack(data.x_structure, [(None,) + tuple(a.shape[1:]) for a in x0]))
        if data.x_structure is None:
            st["captured"][ckey] = capture(model, (bs,) + tuple(x0[0].shape[1:]), str(x0[0].dtype))
        else:
            st["captured"][ckey] = capture(model, [(bs,) + tuple(a.shape[1:]) for a in x0], [str(a.dtype) for a in x0],
                                           x_structure=data.x_structure)
    cap = st["captured"][ckey]
    multi = len(cap.outputs) > 1 or (y0 is not None and len(y0) > 1)
    loss = None
    if mode != "predict":       # several outputs: Keras's own loss graph (per-output losses, loss_weights)
        loss = ("keras", False) if multi else loss_kind(model.loss)
    opt = popart_optimizer(model.optimizer) if mode == "train" else None
    sysm = _config._system()
    n_ipus = sysm.num_ipus if sysm is not None else 1
    mean = mode == "train" and ga > 1 and st["ga_reduction"] != GradientAccumulationReductionMethod.SUM
    if mean and replicas > 1:
        raise NotImplementedError("gradient_accumulation_reduction_method MEAN / RUNNING_MEAN with replication on the "
                                  "IPU (PopART's mean reduction would also average over the replicas)")
    keras_loss = None
    if loss is not None and loss[0] == "keras":
        labels = [labels_for("keras", a) for a in y0]
        lkey = ("loss", ckey, tuple((a.shape, a.dtype.str) for a in labels))
        if lkey not in st["captured"]:
            pred_shapes = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in cap.model.graph.output]
            if multi:
                y_structure = data.y_structure or [None] * len(labels)
                st["captured"][lkey] = capture_loss(model, pred_shapes, labels, y_structure, cap.out_structure)
            else:
                st["captured"][lkey] = capture_loss(model, pred_shapes[0], labels[0])
        keras_loss = st["captured"][lkey]
    prog = IpuProgram(cap, mode, bs, spe, loss=loss, optimizer=opt, accumulation=ga, replicas=replicas,
                      num_ipus=max(n_ipus, replicas * _shards(model)), label_shape=None if y0 is None else y0[0].shape,
                      mean_accumulation=mean, device_mapping=(st["pipelining"] or {}).get("device_mapping"),
                      sequential=_schedule(model) == PipelineSchedule.Sequential, keras_loss=keras_loss)
    st["programs"][key] = prog
    return prog


def _schedule(model):
    kw = (_state(model)["pipelining"] or {}).get("kwargs", {})
    return PipelineSchedule(int(kw.get("pipeline_schedule", PipelineSchedule.Grouped)))


def _labels(model, prog, y):
    """The flat label arrays as the program takes them (see :func:`._program.labels_for`)."""
    from ._program import labels_for
    if y is None:
        return None
    return [labels_for(prog.loss_kind[0], a) for a in y]


def _record_output_losses(model, per, batch):
    """Apply the IPU's per-step, per-output unweighted losses to Keras's ``<output>_loss``
    trackers, as Keras's ``CompileLoss`` does each step (weight: the batch size)."""
    for tracker, values in zip(model._compile_loss.metrics if per else [], per):
        for v in values:
            tracker.update_state(float(v), sample_weight=batch)


def _record_time(model, prog, spe):
    secs = prog.seconds
    model.ipu_predicted_seconds = {"execution": secs, "step": secs / spe, "cycles": prog.cycles}


# -- fit / evaluate / predict ----------------------------------------------------------------------
def _verbose(v):
    return 1 if v == "auto" else v


def ipu_fit(model, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0,
            steps_per_epoch=None, validation_steps=None, validation_batch_size=None, validation_freq=1):
    """``Model.fit`` on the simulated IPU (Graphcore's semantics; see the module docstring)."""
    from keras import callbacks as callbacks_module
    model._assert_compile_called("fit")
    _check_model(model)
    if validation_split or class_weight is not None or sample_weight is not None:
        raise NotImplementedError("validation_split, class_weight and sample_weight in fit on the IPU")
    st = _state(model)
    replicas = _replicas(model)
    pga = _pipeline_ga(model, True)
    ga = pga if pga is not None else st["ga"]
    data = _Data(x, y, batch_size, steps_per_epoch, shuffle, "fit")
    spe_req = int(model.steps_per_execution)
    if spe_req == 1:
        logger.info("The model `%s` has been configured with only 1 steps per execution. Consider increasing the value "
                    "for the `steps_per_execution` argument passed to the `compile()` method to improve performance.",
                    model.name)
    per, spe = _plan(model, data, steps_per_epoch, spe_req, replicas, "fit")
    if spe % ga:
        raise RuntimeError(f"The {'pipelined ' if pga is not None else ''}model has been configured to use gradient "
                           "accumulation for training, however the "
                           f"current `steps_per_execution` value (set to {spe}) is not divisible by "
                           f"`gradient_accumulation_steps_per_replica` ({ga}). You need to adjust either "
                           "`steps_per_execution` or`gradient_accumulation_steps_per_replica` to make sure that "
                           "`steps_per_execution` is divisible by `gradient_accumulation_steps_per_replica`.")
    bs = data.batch_size
    dist = " distributed" if replicas > 1 else " not distributed"
    acc = f" and accumulating {ga} batches per optimizer step" if ga > 1 else ""
    across = f" across {replicas} replicas" if replicas > 1 else ""
    logger.info("Training is%s%s%s, your effective batch size is %d.", dist, acc, across, bs * ga * replicas)
    logger.info("Doing %d weight update%s per execution per replica, which is %d per epoch per replica.",
                spe // ga, "s" if spe // ga != 1 else "", per // ga)
    prog = _program(model, "train", data, spe, replicas, ga)
    prog.weights_from_keras()
    import keras
    sched = isinstance(model.optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule)
    verbose = _verbose(verbose)
    if not isinstance(callbacks, callbacks_module.CallbackList):
        callbacks = callbacks_module.CallbackList(callbacks, add_history=True, add_progbar=verbose != 0,
                                                  verbose=verbose, epochs=epochs, steps=per, model=model)
    model.stop_training = False
    callbacks.on_train_begin()
    logs, training_logs = {}, None
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        data.start_epoch()
        for begin in range(0, per, spe):
            callbacks.on_train_batch_begin(begin)
            if sched:
                prog.set_learning_rate(model.optimizer)
            xb, yb = data.take(spe * replicas)
            losses, out, per_output = prog.run(xb, _labels(model, prog, yb))
            prog.weights_to_keras()
            model.optimizer.iterations.assign_add(spe // ga)
            _record_time(model, prog, spe)
            for lv in losses:
                model._loss_tracker.update_state(float(lv), sample_weight=bs)
            _record_output_losses(model, per_output, bs)
            logs = model.compute_metrics(_pack(data.x_structure, xb), _pack(data.y_structure, yb),
                                         _pack(prog.captured.out_structure, out), None)
            logs = {k: float(v) for k, v in logs.items()}
            callbacks.on_train_batch_end(begin + spe - 1, logs)
            if model.stop_training:
                break
        epoch_logs = {k: float(v) for k, v in model.get_metrics_result().items()}
        if validation_data is not None and (epoch + 1) % validation_freq == 0:
            vx, vy = validation_data[0], validation_data[1]
            val = ipu_evaluate(model, vx, vy, batch_size=validation_batch_size or batch_size, verbose=0,
                               steps=validation_steps, return_dict=True)
            epoch_logs.update({f"val_{k}": v for k, v in val.items()})
        callbacks.on_epoch_end(epoch, epoch_logs)
        training_logs = epoch_logs
        if model.stop_training:
            break
    callbacks.on_train_end(logs=training_logs)
    return model.history


def _inference_setup(model, what, x, y, batch_size, steps, verbose, callbacks):
    """The common start of ``evaluate`` / ``predict`` (``what``): the replicas, the data, the
    steps per replica and per execution, the compiled program (weights sent) and the callbacks.
    Returns ``(replicas, data, per, spe, prog, callbacks)``."""
    from keras import callbacks as callbacks_module
    replicas = _replicas(model)
    data = _Data(x, y, batch_size, steps, False, what)
    per, spe = _plan(model, data, steps, int(model.steps_per_execution), replicas, what)
    prog = _program(model, "eval" if what == "evaluate" else "predict", data, spe, replicas, 1)
    prog.weights_from_keras()
    verbose = _verbose(verbose)
    if not isinstance(callbacks, callbacks_module.CallbackList):
        callbacks = callbacks_module.CallbackList(callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1,
                                                  steps=per, model=model)
    return replicas, data, per, spe, prog, callbacks


def ipu_evaluate(model, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None, steps=None,
                 callbacks=None, return_dict=False, **kwargs):
    """``Model.evaluate`` on the simulated IPU: forward and loss as a PopART inference program."""
    model._assert_compile_called("evaluate")
    _check_model(model)
    if sample_weight is not None:
        raise NotImplementedError("sample_weight in evaluate on the IPU")
    replicas, data, per, spe, prog, callbacks = _inference_setup(model, "evaluate", x, y, batch_size, steps, verbose,
                                                                 callbacks)
    callbacks.on_test_begin()
    model.reset_metrics()
    data.start_epoch()
    logs = {}
    for begin in range(0, per, spe):
        callbacks.on_test_batch_begin(begin)
        xb, yb = data.take(spe * replicas)
        losses, out, per_output = prog.run(xb, _labels(model, prog, yb))
        _record_time(model, prog, spe)
        for lv in losses:
            model._loss_tracker.update_state(float(lv), sample_weight=data.batch_size)
        _record_output_losses(model, per_output, data.batch_size)
        logs = model.compute_metrics(_pack(data.x_structure, xb), _pack(data.y_structure, yb),
                                     _pack(prog.captured.out_structure, out), None)
        logs = {k: float(v) for k, v in logs.items()}
        callbacks.on_test_batch_end(begin + spe - 1, logs)
    logs = {k: float(v) for k, v in model.get_metrics_result().items()}
    callbacks.on_test_end(logs)
    return logs if return_dict else model._flatten_metrics_in_order(logs)


def ipu_predict(model, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
    """``Model.predict`` on the simulated IPU: all outputs, in input order (``[n, ...]``; a
    model with several outputs: their structure (list / dict) of such arrays, as Keras)."""
    replicas, data, per, spe, prog, callbacks = _inference_setup(model, "predict", x, None, batch_size, steps,
                                                                 verbose, callbacks)
    callbacks.on_predict_begin()
    data.start_epoch()
    outs = []
    for begin in range(0, per, spe):
        callbacks.on_predict_batch_begin(begin)
        xb, _ = data.take(spe * replicas)
        _, out, _ = prog.run(xb)
        _record_time(model, prog, spe)
        outs.append(out)
        callbacks.on_predict_batch_end(begin + spe - 1, {"outputs": _pack(prog.captured.out_structure, out)})
    callbacks.on_predict_end()
    return _pack(prog.captured.out_structure, [np.concatenate(c) for c in zip(*outs)])


# -- installation on keras.Model ---------------------------------------------------------------------
def _wrap(name, ipu_fn):
    orig = _ORIG[name]

    def method(self, *args, **kwargs):
        if _strategy(self) is None:
            return orig(self, *args, **kwargs)
        for k in ("max_queue_size", "workers", "use_multiprocessing"):
            kwargs.pop(k, None)         # Keras 2 arguments Graphcore's Keras keeps; no meaning here
        return ipu_fn(self, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = orig.__doc__
    return method


def _compile(self, *args, **kwargs):
    if "_openipu_state" in self.__dict__:     # a new loss / optimizer / spe: recompile the programs
        _invalidate(self)
    return _ORIG["compile"](self, *args, **kwargs)


def install():
    """Add the IPU methods to ``keras.Model`` and route ``fit``/``evaluate``/``predict`` of models
    built in an ``IPUStrategy`` scope to the simulated IPU (idempotent)."""
    import keras
    if _ORIG:
        return
    for name in ("fit", "evaluate", "predict", "compile"):
        _ORIG[name] = getattr(keras.Model, name)
    keras.Model.fit = _wrap("fit", ipu_fit)
    keras.Model.evaluate = _wrap("evaluate", ipu_evaluate)
    keras.Model.predict = _wrap("predict", ipu_predict)
    keras.Model.compile = _compile
    for name, f in _METHODS.items():
        setattr(keras.Model, name, f)
    _ORIG["layer_call"] = keras.layers.Layer.__call__

    def layer_call(layer, *args, **kwargs):
        # keras.ipu.PipelineStage: a layer called inside gets the stage (the call site wins)
        import tensorflow as tf
        from .ipu_strategy import IPUStrategyV1
        if tf.distribute.has_strategy():
            s = tf.distribute.get_strategy()
            if isinstance(s, IPUStrategyV1) and s._pipeline_stage is not None:
                object.__setattr__(layer, "_openipu_stage", s._pipeline_stage)
        return _ORIG["layer_call"](layer, *args, **kwargs)
    keras.Layer.__call__ = layer_call
