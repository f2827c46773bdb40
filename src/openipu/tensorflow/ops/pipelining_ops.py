"""``ipu.pipelining_ops`` / ``ipu.ops.pipelining_ops``: pipeline schedules and options (enums)."""

import enum


class PipelineSchedule(enum.IntEnum):
    """``Grouped`` (default), ``Interleaved``, ``Sequential``."""

    Grouped = 0
    Interleaved = 1
    Sequential = 2


class RecomputationMode(enum.Enum):
    Auto = 0
    RecomputeThenBackpropagate = 1
    RecomputeAndBackpropagateInterleaved = 2


class PipelineStageOptions:
    """Per-stage Poplar options (``convolution_options``, ``matmul_options``, ``slice_options``),
    recorded only."""

    def __init__(self, convolution_options=None, matmul_options=None, slice_options=None):
        self.convolution_options = dict(convolution_options or {})
        self.matmul_options = dict(matmul_options or {})
        self.slice_options = dict(slice_options or {})


class OptimizerFunctionOutput:
    """``OptimizerFunctionOutput(opt, loss, ...)``: what a pipeline's ``optimizer_function``
    returns: the optimizer (a Keras optimizer) and the loss to minimise (a scalar tensor). The
    gradient / apply arguments and ``variables`` are recorded only."""

    def __init__(self, opt, loss, compute_gradients_args=(), compute_gradients_kwargs=None, apply_gradients_args=(),
                 apply_gradients_kwargs=None, variables=None, tape=None, gradient_capture_context=None,
                 captured_gradient_outfeed=None):
        self.opt, self.loss = opt, loss
        self.compute_gradients_args, self.compute_gradients_kwargs = compute_gradients_args, compute_gradients_kwargs
        self.apply_gradients_args, self.apply_gradients_kwargs = apply_gradients_args, apply_gradients_kwargs
        self.variables, self.tape = variables, tape


def _stage_call(stage, outputs):
    """Call ``stage`` with the previous outputs: a dict as keyword arguments, a list / tuple as
    positional arguments, anything else as one argument."""
    if isinstance(outputs, dict):
        return stage(**outputs)
    if isinstance(outputs, (list, tuple)):
        return stage(*outputs)
    return stage(outputs)


def pipeline(computational_stages, gradient_accumulation_count=None, gradient_accumulation_dtype=None,
             gradient_accumulation_for_captured_grads=True, repeat_count=1, batch_serialization_iterations=1,
             inputs=None, infeed_queue=None, outfeed_queue=None, optimizer_function=None, device_mapping=None,
             pipeline_schedule=None, recomputation_mode=None, outfeed_loss=False, accumulate_outfeed=False,
             reduction_method=None, outfeed_mask=None, name=None, **kwargs):
    """``pipelining_ops.pipeline(computational_stages, gradient_accumulation_count, repeat_count=1,
    inputs=None, infeed_queue=None, outfeed_queue=None, optimizer_function=None,
    device_mapping=None, pipeline_schedule=None, ...)`` (Graphcore TF API), inside a step that
    ``IPUStrategy.run`` runs on the simulated IPU.

    Stage 0 takes ``inputs`` then the infeed element (a dict as keyword arguments); each stage's
    outputs feed the next; the last stage's outputs go to ``outfeed_queue`` (one item per
    micro-batch) and, when training, to ``optimizer_function`` (an
    :class:`OptimizerFunctionOutput`: Keras optimizer and loss). One call runs
    ``gradient_accumulation_count * repeat_count`` micro-batches and ``repeat_count`` weight
    updates (gradients summed over the micro-batches: Graphcore's default ``SUM``; ``MEAN`` /
    ``RUNNING_MEAN`` average them, which at the update is the same value). Stage ``i``
    runs on IPU ``device_mapping[i]`` (default ``i``); ``PipelineSchedule.Sequential`` runs the
    stages one after another (sharding), the others overlap them (PopART's pipeline).

    ``outfeed_loss``: the optimizer function's loss is outfed instead of the last stage's
    outputs; ``accumulate_outfeed``: the outfed values are summed over the
    ``gradient_accumulation_count`` micro-batches of each update (one item per update).
    With ``IPUConfig.allow_recompute`` the pipeline recomputes its forward stages in the backward
    pass (PopART's pipeline recomputation: the same values, fewer stashed activations, more
    cycles); ``recomputation_mode`` is recorded (``Auto`` and ``RecomputeThenBackpropagate`` are
    what PopART does).

    Raises ``ValueError`` with Graphcore's texts (no ``gradient_accumulation_count``, fewer than
    two stages, a mapping of the wrong length, ``outfeed_loss`` without an optimizer function)
    and ``NotImplementedError`` outside such a step (the CPU has no pipeline here), for
    ``inputs`` with the infeed's element being a dict and for ``outfeed_mask``."""
    from .._custom_step import active, fake_for
    from ..gradient_accumulation import GradientAccumulationReductionMethod
    if gradient_accumulation_count is None:
        raise ValueError("gradient_accumulation_count must be specified.")
    stages = list(computational_stages)
    if len(stages) < 2:
        raise ValueError("Pipeline requires at least two computational stages.")
    mapping = list(device_mapping) if device_mapping is not None else list(range(len(stages)))
    if len(mapping) != len(stages):
        raise ValueError(f"Each stage must be mapped to an IPU: {len(mapping)} mappings != {len(stages)} stages")
    if outfeed_loss and optimizer_function is None:
        raise ValueError("An optimizer_function must be provided when outfeed_loss is True")
    if outfeed_mask is not None:
        raise NotImplementedError("pipelining_ops.pipeline outfeed_mask on the simulated IPU")
    mean = reduction_method is not None and GradientAccumulationReductionMethod.parse(reduction_method) != \
        GradientAccumulationReductionMethod.SUM
    trace = active()
    if trace is None:
        raise NotImplementedError("pipelining_ops.pipeline outside a step IPUStrategy.run runs on the simulated IPU")
    import tensorflow as tf

    from .._capture import STAGE_SCOPE
    args = list(inputs or [])
    if infeed_queue is not None:
        el = fake_for(infeed_queue).element()
        if isinstance(el, dict):
            if args:
                raise NotImplementedError("pipelining_ops.pipeline inputs with a dict infeed element")
            args = el
        else:
            args += list(el) if isinstance(el, (list, tuple)) else [el]
    out = args
    for i, stage in enumerate(stages):
        with tf.name_scope(f"{STAGE_SCOPE}{i}"):
            out = _stage_call(stage, out)
    ofo = None
    if optimizer_function is not None:
        with tf.name_scope(f"{STAGE_SCOPE}{len(stages) - 1}"):
            ofo = _stage_call(optimizer_function, out)
        trace.loss, trace.optimizer, trace.optimized = ofo.loss, ofo.opt, None     # None: every trainable variable
        trace.gradient_calls += 1
    outfed = ofo.loss if outfeed_loss else out
    if outfeed_queue is not None and outfed is not None:
        outfeed_queue.enqueue(outfed)
        if accumulate_outfeed:
            trace.accumulated_outfeeds = getattr(trace, "accumulated_outfeeds", set()) | {id(outfeed_queue)}
    schedule = PipelineSchedule.Grouped if pipeline_schedule is None else PipelineSchedule(int(pipeline_schedule))
    trace.pipeline = {"ga": int(gradient_accumulation_count), "repeat": int(repeat_count), "mapping": mapping,
                      "sequential": schedule == PipelineSchedule.Sequential, "mean": mean,
                      "recomputation_mode": recomputation_mode}
    trace.iterations = int(gradient_accumulation_count) * int(repeat_count)
    return None
