"""``IPUStrategy.run`` of a custom ``tf.function`` step as a PopART program on the simulated IPU.

Graphcore's TF2 low-level route: ``strategy.run(loop, args=[iterator, outfeed_queue, model,
optimizer, n])`` where ``loop`` is a ``tf.function`` running ``for _ in tf.range(n)`` (or
``ipu.loops.repeat(n, body, infeed_queue=...)``) over steps that take ``next(iterator)``, run the
model under a ``tf.GradientTape``, call ``optimizer.apply_gradients`` and ``outfeed_queue.enqueue``.
On the IPU the whole function is one Poplar program; here it becomes one PopART session:

1. *Trace.* The step's Python function is traced by TensorFlow once with the iterators, infeed
   queues and tensor arguments replaced by placeholders, with ``tf.range(n)`` in the function's
   own loop header and ``ipu.loops.repeat`` running the body once (``n`` is recorded: the
   ``batchesPerStep``), ``GradientTape.gradient`` recording its target (the loss) and returning
   zeros, ``Optimizer.apply_gradients`` recording the optimizer and its variables, and
   ``IPUOutfeedQueue.enqueue`` recording what is enqueued. tf2onnx converts the traced forward
   (inputs → loss, outfeed values, returned values) with the variables identified
   (:mod:`._capture`).
2. *Program.* The loss becomes PopART's ``identityloss``, the Keras optimizer PopART's optimizer
   (:func:`._program.popart_optimizer`); ``TrainingSession`` grows the backward pass and the
   updates (``InferenceSession`` when the step takes no gradient).
3. *Run.* Each ``strategy.run`` takes ``n`` elements per replica from every iterator / infeed
   (step-major: step 0 of replicas 0, 1, ..., then step 1; tensor arguments are repeated),
   runs the session once, writes the weights back into the Keras variables, advances
   ``optimizer.iterations`` by ``n``, fills the outfeed queues (one item per step; with ``R``
   replicas (one per configured IPU, as Graphcore's replicated program) each item has a leading
   ``[R]`` dimension) and returns the last step's returned values (replica 0's). Replicas'
   gradients are summed before the update (PopART's replicated reduction: the all-reduce of
   Graphcore's Keras optimizers). The **predicted** IPU time of the run is in
   ``strategy.ipu_predicted_seconds``.

A step this cannot express (two gradient calls, an optimizer per variable subset, variables the
optimizer does not update, variables assigned in the step (metrics, batch-norm statistics),
ops tf2onnx cannot convert...)
raises :class:`Unsupported`; ``IPUStrategy.run`` then runs it with TensorFlow on the host CPU and
logs a warning naming the reason.
"""

import contextlib
import logging
import sys

import numpy as np

logger = logging.getLogger("tensorflow.python.ipu")


class Unsupported(NotImplementedError):
    """The step cannot run as a PopART program (the message says why)."""


class _Trace:
    """What one trace of the step saw."""

    def __init__(self, sources=None):
        self.sources = sources            # None: discovery pass; else {id(source): [placeholder tensors]}
        self.found = []                   # discovery: the iterators / queues / tensor args read, in order
        self.loss = None
        self.gradient_calls = 0
        self.optimizer = None
        self.optimized = []               # the variables apply_gradients updates
        self.outfeeds = []                # (queue, structure, [tensors])
        self.iterations = None            # the loop count (tf.range in the function, loops.repeat)
        self.pipeline = None              # pipelining_ops.pipeline: {"ga", "repeat", "mapping", "sequential"}
        self.global_step = None           # a v1 optimizer's apply_gradients(global_step=...)
        self.replicas = 1                 # replicas of the program being built (ipu.replication_ops)
        self.code = None


_ACTIVE = None


def active():
    """The trace in progress (``None`` outside :func:`_tracing`)."""
    return _ACTIVE


class _FakeIterator:
    """Stands for an iterator / infeed queue during a trace: ``next`` gives the placeholders."""

    def __init__(self, source, spec):
        self.source, self.spec, self.calls = source, spec, 0

    def element(self):
        tr = active()
        self.calls += 1
        if self.calls > 1:
            raise Unsupported("an iterator read more than once per step")
        if tr.sources is None:
            if not any(s is self.source for s in tr.found):
                tr.found.append(self.source)
            import tensorflow as tf
            return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), self.spec)
        return tr.sources[id(self.source)]

    def __next__(self):
        return self.element()

    def get_next(self):
        return self.element()

    def __iter__(self):
        return self


def element_spec(source):
    """The ``tf.TypeSpec`` structure of one element of an iterator or infeed queue."""
    from .ipu_infeed_queue import IPUInfeedQueue
    if isinstance(source, IPUInfeedQueue):
        return source._dataset.element_spec
    return source.element_spec


def fake_for(source):
    """The placeholder iterator for ``source`` in the trace in progress (one per source)."""
    tr = active()
    fakes = tr.__dict__.setdefault("fakes", {})
    if id(source) not in fakes:
        fakes[id(source)] = _FakeIterator(source, element_spec(source))
    return fakes[id(source)]


def _is_iterator(a) -> bool:
    import tensorflow as tf
    from .ipu_infeed_queue import IPUInfeedQueue
    return isinstance(a, (tf.data.Iterator, IPUInfeedQueue))


def _is_tensor(a) -> bool:
    import tensorflow as tf
    return isinstance(a, (tf.Tensor, np.ndarray, tf.Variable)) and not isinstance(a, tf.Variable)


@contextlib.contextmanager
def _tracing(trace, code):
    """Patch TensorFlow / Keras for the duration of a trace (see the module docstring)."""
    global _ACTIVE
    import keras
    import tensorflow as tf
    orig_range, orig_grad = tf.range, tf.GradientTape.gradient
    orig_apply_grads = keras.optimizers.Optimizer.apply_gradients
    orig_apply = keras.optimizers.Optimizer.apply
    v1 = tf.compat.v1.train.Optimizer
    orig_v1_apply, orig_v1_compute = v1.apply_gradients, v1.compute_gradients

    def loop_range(*args, **kwargs):
        if sys._getframe(1).f_code is code and len(args) == 1 and not kwargs:
            trace.iterations = _static_int(args[0])
            return range(1)
        return orig_range(*args, **kwargs)

    def gradient(tape, target, sources, output_gradients=None, unconnected_gradients=None):
        trace.gradient_calls += 1
        if trace.gradient_calls > 1:
            raise Unsupported("more than one GradientTape.gradient call per step")
        if output_gradients is not None:
            raise Unsupported("GradientTape.gradient with output_gradients")
        trace.loss = target
        return tf.nest.map_structure(tf.zeros_like, sources)

    def apply(opt, grads, trainable_variables=None):
        if trace.optimizer is not None:
            raise Unsupported("more than one optimizer update per step")
        if trainable_variables is None:
            raise Unsupported("Optimizer.apply without its variables")
        trace.optimizer = opt
        trace.optimized = list(trainable_variables)

    def apply_gradients(opt, grads_and_vars):
        grads, variables = zip(*list(grads_and_vars))
        return apply(opt, grads, variables)

    _ACTIVE = trace
    tf.range = loop_range
    tf.GradientTape.gradient = gradient
    keras.optimizers.Optimizer.apply_gradients = apply_gradients
    keras.optimizers.Optimizer.apply = apply
    v1.apply_gradients = lambda opt, gvs, global_step=None, name=None: record_v1_apply(opt, gvs, global_step)
    v1.compute_gradients = lambda opt, loss, var_list=None, **kw: record_v1_gradients(opt, loss, var_list)
    try:
        yield trace
    finally:
        _ACTIVE = None
        tf.range = orig_range
        tf.GradientTape.gradient = orig_grad
        keras.optimizers.Optimizer.apply_gradients = orig_apply_grads
        keras.optimizers.Optimizer.apply = orig_apply
        v1.apply_gradients, v1.compute_gradients = orig_v1_apply, orig_v1_compute


def record_v1_gradients(opt, loss, var_list):
    """A v1 optimizer's ``compute_gradients`` (or ``minimize``) during a trace: records ``loss``
    (called if callable) and returns zero gradients for ``var_list``."""
    import tensorflow as tf
    trace = active()
    trace.gradient_calls += 1
    if trace.gradient_calls > 1:
        raise Unsupported("more than one gradient computation per step")
    if var_list is None:
        raise Unsupported("compute_gradients / minimize without var_list (TensorFlow 2 keeps no variable collections)")
    trace.loss = loss() if callable(loss) else loss
    return [(tf.zeros_like(v), v) for v in var_list]


def record_v1_apply(opt, grads_and_vars, global_step=None):
    """A v1 optimizer's (or an ``ipu.optimizers`` wrapper's) ``apply_gradients`` during a trace:
    records the optimizer, the variables with a gradient and ``global_step``."""
    import tensorflow as tf
    trace = active()
    if trace.optimizer is not None:
        raise Unsupported("more than one optimizer update per step")
    trace.optimizer = opt
    trace.optimized = [v for g, v in grads_and_vars if g is not None]
    trace.global_step = global_step
    return tf.no_op()


def _static_int(n) -> int:
    try:
        return int(np.asarray(n))
    except Exception as e:          # a symbolic count: not known when the program is built
        raise Unsupported(f"a loop count that is not known when the program is built ({n!r})") from e


def _python_function(fn):
    f = getattr(fn, "python_function", None)
    if f is None:
        raise Unsupported("a ConcreteFunction (no Python function to trace)")
    return f


# -- one trace ---------------------------------------------------------------------------------
def _substitute(args, kwargs, make):
    """``args`` / ``kwargs`` with iterators, infeed queues and tensors replaced by ``make(a)``."""
    def sub(a):
        if _is_iterator(a) or _is_tensor(a):
            return make(a)
        return a
    return [sub(a) for a in args], {k: sub(v) for k, v in kwargs.items()}


def _run_traced(pyfn, args, kwargs, trace):
    """Call ``pyfn`` under ``trace`` (iterator arguments → placeholder iterators, tensor
    arguments → their placeholders) and return the flat list of tensors the program computes:
    ``[loss?] + outfeed values + returned values``."""
    import tensorflow as tf

    def make(a):
        if _is_iterator(a):
            return fake_for(a)
        if trace.sources is None:
            if not any(s is a for s in trace.found):
                trace.found.append(a)
            return tf.convert_to_tensor(a)
        return trace.sources[id(a)]
    a2, k2 = _substitute(args, kwargs, make)
    trace.outfeeds.clear()
    trace.loss, trace.gradient_calls, trace.optimizer, trace.optimized = None, 0, None, []
    trace.pipeline, trace.global_step = None, None
    trace.__dict__.pop("fakes", None)
    ret = pyfn(*a2, **k2)
    trace.returned = ret
    flat = [] if trace.loss is None else [trace.loss]
    for _, _, ts in trace.outfeeds:
        flat += ts
    flat += [t for t in tf.nest.flatten(ret) if isinstance(t, tf.Tensor)]
    return [tf.identity(t) for t in flat]


def _source_specs(source):
    import tensorflow as tf
    if _is_iterator(source):
        return tf.nest.flatten(element_spec(source))
    t = tf.convert_to_tensor(source)
    return [tf.TensorSpec(t.shape, t.dtype)]


_STATEFUL_OPS = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceScatterUpdate",
                 "ResourceScatterAdd", "ResourceScatterSub", "StatefulPartitionedCall", "PyFunc", "EagerPyFunc"}


class _TFVariable:
    """A ``tf.Variable`` the step reads, as :mod:`._capture` handles variables (``path``, string
    ``dtype``, ``numpy``, ``assign``); ``trainable`` is whether the step's optimizer updates it."""

    def __init__(self, variable, trainable):
        self.tf_variable, self.trainable = variable, trainable
        self.path, self.shape = variable.name, tuple(variable.shape)
        self.dtype = variable.dtype.name

    def numpy(self):
        return self.tf_variable.numpy()

    def assign(self, value):
        self.tf_variable.assign(np.asarray(value).astype(self.tf_variable.dtype.as_numpy_dtype))


def _step_variables(cf, optimized):
    """The floating-point variables the traced function ``cf`` reads (``_TFVariable``), marked
    trainable when among the optimizer's ``optimized`` (Keras) variables (``None``: every
    trainable variable, as a pipeline's optimizer function updates)."""
    if optimized is None:
        return [_TFVariable(v, bool(v.trainable)) for v in cf.variables if v.dtype.is_floating]
    updated = {id(getattr(kv, "_value", kv)) for kv in optimized}
    return [_TFVariable(v, id(v) in updated) for v in cf.variables if v.dtype.is_floating]


def _annotate_stages(model, pipe):
    """A copy of the captured ``model`` with PopART's ``__ipu_number`` (and, unless the schedule
    is ``Sequential``, ``__pipeline_stage``) on every node (stages from the name scopes
    ``pipelining_ops.pipeline`` opened, :func:`._capture.node_stages`). Returns ``(model, last
    stage, its IPU)``."""
    import onnx
    from onnx import helper

    from ._capture import node_stages
    m = onnx.ModelProto()
    m.CopyFrom(model)
    stages = node_stages(m)
    if stages and stages[0] is None:
        raise Unsupported("a pipeline whose stages left no ops in the converted graph")
    mapping = pipe["mapping"]
    for node, st in zip(m.graph.node, stages):
        if node.op_type == "Constant":      # extra attributes would break ONNX's Constant inference
            continue
        if not pipe["sequential"]:
            node.attribute.append(helper.make_attribute("__pipeline_stage", int(st)))
        node.attribute.append(helper.make_attribute("__ipu_number", int(mapping[st])))
    last = len(mapping) - 1
    return m, last, mapping[last]


# -- the compiled step -------------------------------------------------------------------------
class CustomStep:
    """One step function compiled for the simulated IPU (see the module docstring).

    ``fn``: the ``tf.function``; ``args`` / ``kwargs``: the ``strategy.run`` arguments of the
    first call (Python objects in them are fixed into the program; iterators, infeed queues and
    tensors are its inputs). Raises :class:`Unsupported`."""

    v1 = False                          # the optimizer is a TensorFlow v1 one (ipu.optimizers wrappers)

    def __init__(self, fn, args, kwargs, num_ipus=1):
        import tensorflow as tf
        from openipu import popart

        from . import config as _config
        from ._capture import capture_function
        from ._program import _lr, popart_optimizer
        self.replicas = int(num_ipus)    # Graphcore: one replica per configured IPU (num_replicas_in_sync is 1)
        sysm = _config._system()
        if sysm is not None and sysm.config.experimental.multi_replica_distribution.process_count > 1:
            raise NotImplementedError("IPUStrategy.run of a custom step in a poprun instance (the replicas of "
                                      "the other instances would not take part): use Keras fit / evaluate / "
                                      "predict with PopDistStrategy")
        pyfn = _python_function(fn)
        code = pyfn.__code__
        # 1. discovery: which iterators / tensors the step reads, the loop count, the variables
        disc = _Trace()
        disc.replicas = self.replicas
        with _tracing(disc, code):
            cf = tf.function(lambda: _run_traced(pyfn, args, kwargs, disc), autograph=False).get_concrete_function()
        self.sources = list(disc.found)
        flat_args = list(args) + list(kwargs.values())
        # tensor arguments are fed from the same position on later calls
        self.positions = [None if _is_iterator(s) else next(i for i, a in enumerate(flat_args) if a is s)
                          for s in self.sources]
        self.iterations = disc.iterations or 1
        self.pipeline = disc.pipeline
        self.ga = self.pipeline["ga"] if self.pipeline else 1
        if self.pipeline:               # IPUs per replica: the pipeline's; replicas as Graphcore computes them
            shards = max(self.pipeline["mapping"]) + 1
            p2 = 1 << (shards - 1).bit_length()
            if num_ipus % p2 or num_ipus < shards:
                raise ValueError(f"Current device has {num_ipus} IPUs attached, however the current model requires a "
                                 f"multiple of {p2} IPUs.")
            self.replicas, self.shards = num_ipus // p2, shards
        else:
            self.shards = 1
        self.training = disc.loss is not None
        if self.training and disc.optimizer is None:
            raise Unsupported("a gradient without an optimizer update")
        if disc.optimizer is not None and disc.loss is None:
            raise Unsupported("an optimizer update without a GradientTape gradient")
        assigns = sorted({op.type for op in cf.graph.get_operations() if op.type in _STATEFUL_OPS})
        if assigns:     # tf2onnx would drop them: metric updates, batch-norm statistics, counters
            raise Unsupported(f"a step that changes variables other than through the optimizer ({', '.join(assigns)})")
        variables = _step_variables(cf, disc.optimized)
        if self.training:
            frozen = [v.path for v in variables if not v.trainable]
            if frozen:
                raise Unsupported(f"variables the optimizer does not update ({frozen})")
        self.optimizer, self.global_step, self.loss_scale = disc.optimizer, disc.global_step, 1.0
        if isinstance(disc.optimizer, tf.compat.v1.train.Optimizer):
            self._v1_wrappers(disc.optimizer)
        if self.pipeline and self.pipeline.get("mean"):     # MEAN / RUNNING_MEAN: the average at the update
            self.loss_scale /= self.ga
        self.accumulated = set(getattr(disc, "accumulated_outfeeds", ()))     # summed over each update's steps
        self.outfeeds = [(q, s, len(ts)) for q, s, ts in disc.outfeeds]
        self.returned = disc.returned
        specs, self.source_slices = [], []
        for s in self.sources:
            sp = _source_specs(s)
            self.source_slices.append((len(specs), len(specs) + len(sp)))
            specs += sp
        if any(sp.dtype == tf.float64 for sp in specs):
            raise TypeError("Unsupported data type for input: float64")
        # 2. the conversion trace: the sources are the function's inputs
        conv = _Trace()
        conv.replicas = self.replicas

        def traced(*inputs):
            conv.sources = {}
            for s, (a, b) in zip(self.sources, self.source_slices):
                part = list(inputs[a:b])
                if _is_iterator(s):
                    conv.sources[id(s)] = tf.nest.pack_sequence_as(element_spec(s), part)
                else:
                    conv.sources[id(s)] = part[0]
            return _run_traced(pyfn, args, kwargs, conv)
        specs = [tf.TensorSpec(sp.shape, sp.dtype, name=f"in{i}") for i, sp in enumerate(specs)]
        with _tracing(conv, code):
            try:
                self.captured = capture_function(traced, specs, variables)
            except Unsupported:
                raise
            except Exception as e:      # tf2onnx could not convert an op
                raise Unsupported(f"the step could not be converted to ONNX ({type(e).__name__}: {e})") from e
        cap = self.captured
        proto = cap.model
        last = []
        if self.pipeline:               # every node on its stage's IPU (PopART's annotations)
            proto, last_stage, last_ipu = _annotate_stages(proto, self.pipeline)
        builder = popart.Builder(proto.SerializeToString())
        outs = list(cap.outputs)
        anchors = {o: popart.AnchorReturnType("ALL") for o in outs}
        self.loss_id = None
        if self.pipeline:
            last = [builder.virtualGraph(last_ipu)] + ([] if self.pipeline["sequential"] else
                                                       [builder.pipelineStage(last_stage)])
        for c in last:
            c.__enter__()
        if self.training:
            loss = outs[0]
            if self.loss_scale != 1.0:      # the wrappers' averages: the gradient is linear in the loss
                scale = builder.aiOnnx.constant(np.array(self.loss_scale, np.float32))
                loss = builder.aiOnnx.mul([loss, scale])
            self.loss_id = builder.aiGraphcore.identityloss([loss], reduction=popart.ReductionType.Sum)
        for c in reversed(last):
            c.__exit__(None, None, None)
        self.outputs = outs[1:] if self.training else outs
        if self.training:
            self.outputs = [outs[0]] + self.outputs     # the loss value is an output too (anchored)
        opts = popart.SessionOptions()
        flow = popart.DataFlow(self.iterations // self.ga, anchors)
        if self.pipeline:
            opts.enablePipelining = not self.pipeline["sequential"]
            opts.virtualGraphMode = popart.VirtualGraphMode.Manual
            sysm = _config._system()
            if sysm is not None and sysm.config.allow_recompute and opts.enablePipelining:
                opts.autoRecomputation = popart.RecomputationType.Pipeline
        if self.ga > 1:
            opts.enableGradientAccumulation = True
            opts.accumulationFactor = self.ga
        if self.replicas > 1:           # gradients summed over the replicas (the Keras optimizer's all-reduce)
            opts.enableReplicatedGraphs = True
            opts.replicatedGraphCount = self.replicas
        device = popart.DeviceManager().acquireAvailableDevice(self.replicas * self.shards)
        proto = builder.getModelProto()
        if self.training:
            self.session = popart.TrainingSession(fnModel=proto, dataFlow=flow, loss=self.loss_id,
                                                  optimizer=popart_optimizer(self.optimizer), deviceInfo=device,
                                                  userOptions=opts, name="tf_custom_step")
        else:
            opts.constantWeights = False
            self.session = popart.InferenceSession(fnModel=proto, dataFlow=flow, deviceInfo=device,
                                                   userOptions=opts, name="tf_custom_step")
        self.session.prepareDevice()
        seed = getattr(_config, "_SEED", None)
        if seed is not None:
            self.session.setRandomSeed(int(seed))
        self.clock_hz = float(device.device.getTarget().spec.clock_hz)
        self.cycles = None
        self.reported = False
        self.in_dtypes = [sp.dtype.as_numpy_dtype for sp in specs]
        self._weights = None            # the Keras-side values the program holds (None: not sent yet)
        self._lr = _lr(self.optimizer) if self.training else None     # the learning rate the program has

    def _v1_wrappers(self, opt):
        """A TensorFlow v1 optimizer, maybe in ``ipu.optimizers`` wrappers: PopART's gradient
        accumulation for a ``GradientAccumulationOptimizerV2`` (the loop count must be a
        multiple of ``num_mini_batches``), loss scales for the ``MEAN`` reduction and the
        ``CrossReplicaOptimizer`` average; ``self.optimizer`` becomes the wrapped optimizer.
        Raises ``ValueError`` for a loop count that is not a multiple and ``NotImplementedError``
        for replicas without a ``CrossReplicaOptimizer`` (each would update its own weights:
        PopART's replicas always reduce their gradients)."""
        from .optimizers.gradient_accumulation_optimizer import unwrap
        from .optimizers.map_gradient_optimizer import MapGradientOptimizer
        self.v1 = True
        base, ga, mean, cross = unwrap(opt)
        if isinstance(base, MapGradientOptimizer):
            base = base._opt
        if ga > 1:
            if self.pipeline:
                raise Unsupported("a gradient accumulation optimizer inside a pipeline")
            if self.iterations % ga:
                raise ValueError(f"The step runs {self.iterations} iterations per execution, which is not a multiple "
                                 f"of the gradient accumulation optimizer's num_mini_batches ({ga}).")
            self.ga = ga
            if mean:
                self.loss_scale /= ga
        if self.replicas > 1:
            if not cross:
                raise NotImplementedError(
                    f"A TensorFlow v1 optimizer ({type(opt).__name__}) on {self.replicas} replicas without a "
                    "CrossReplicaOptimizer: each replica would update its own weights, which the simulated IPU's "
                    "replicated programs do not do; wrap the optimizer in ipu.optimizers.CrossReplicaOptimizer.")
            self.loss_scale /= self.replicas
        self.optimizer = base

    # ------------------------------------------------------------------------------------------
    def _feeds(self, args, kwargs):
        import tensorflow as tf
        n, r = self.iterations, self.replicas
        flat_args = list(args) + list(kwargs.values())
        feeds = {}
        for s, pos, (a, b) in zip(self.sources, self.positions, self.source_slices):
            if pos is None:             # an iterator or infeed queue: n elements per replica (step-major)
                from .ipu_infeed_queue import IPUInfeedQueue
                it = s._iterator if isinstance(s, IPUInfeedQueue) else s
                steps = [[np.asarray(t) for t in tf.nest.flatten(next(it))] for _ in range(n * r)]
                cols = [np.stack(c).reshape((n, r) + c[0].shape) for c in zip(*steps)]
            else:                       # a tensor argument: the same value every step
                v = np.asarray(flat_args[pos])
                cols = [np.broadcast_to(v, (n, r) + v.shape)]
            for i, c in zip(range(a, b), cols):
                c = c.astype(self.in_dtypes[i], copy=False)
                lead = tuple(d for d in (n // self.ga, self.ga, r) if d > 1)
                feeds[self.captured.inputs[i]] = np.ascontiguousarray(c.reshape(lead + c.shape[2:]))
        return feeds

    def run(self, args, kwargs):
        """One execution: ``n`` steps. Returns the last step's returned values (the structure
        the function returns, as ``tf.Tensor``)."""
        from ._program import host_threads
        with host_threads():
            return self._run(args, kwargs)

    def _run(self, args, kwargs):
        import tensorflow as tf
        from openipu import popart

        from ._program import _lr, popart_optimizer
        feeds = self._feeds(args, kwargs)
        # the Keras weights go in only when they differ from the program's (set by the user
        # between calls); otherwise the program's are the ones the last call read back
        keras_w = [m.variable.numpy() for m in self.captured.variables]
        if self._weights is None or any(not np.array_equal(a, b) for a, b in zip(keras_w, self._weights)):
            w = {m.name: m.to_onnx(v).astype(np.float32) for m, v in zip(self.captured.variables, keras_w)}
            self.session.writeWeights(popart.PyWeightsIO(w))
            self.session.weightsFromHost()
            self._weights = keras_w
        if self.training:               # the learning rate (schedules are evaluated on the host)
            lr = _lr(self.optimizer)
            if lr != self._lr:
                self.session.updateOptimizerFromHost(popart_optimizer(self.optimizer))
                self._lr = lr
        anchors = self.session.initAnchorArrays()
        self.session.run(popart.PyStepIO(feeds, anchors))
        self.cycles = int(self.session.getCycleCount())
        if self.training:
            self.session.weightsToHost()
            bufs = {m.name: np.zeros(m.shape, np.float32) for m in self.captured.variables}
            self.session.readWeights(popart.PyWeightsIO(bufs))
            self._weights = []
            for m in self.captured.variables:
                v = m.to_keras(bufs[m.name]).astype(m.variable.dtype)
                m.variable.assign(v)
                self._weights.append(v)
            it = self.global_step if self.v1 else self.optimizer.iterations
            if it is not None:      # the backing tf.Variable (Keras assign_add: ms per call)
                getattr(it, "_value", it).assign_add(self.iterations // self.ga)
        n = self.iterations
        r = self.replicas               # every output as [steps, replicas, ...]
        skip = sum(d > 1 for d in (n // self.ga, self.ga, r))
        vals = [anchors[o].reshape((n, r) + anchors[o].shape[skip:]) for o in self.captured.outputs]
        if r == 1:
            vals = [v[:, 0] for v in vals]
        k = 1 if self.training else 0
        for q, structure, count in self.outfeeds:
            part = vals[k:k + count]
            k += count
            q._structure = structure
            q._enqueued = True
            if id(q) in self.accumulated:   # pipeline accumulate_outfeed: one item per update, summed
                g = self.ga
                for i in range(0, n, g):
                    q._items.append([np.asarray(p[i:i + g]).sum(axis=0) for p in part])
                continue
            for i in range(n):
                q._items.append([np.asarray(p[i]) for p in part])
        ret_flat = vals[k:]
        if self.returned is None:
            return None
        it = iter(ret_flat)
        last = (lambda v: v[-1]) if r == 1 else (lambda v: v[-1, 0])      # the last step of replica 0
        return tf.nest.map_structure(lambda t: tf.convert_to_tensor(last(next(it))) if isinstance(t, tf.Tensor) else t,
                                     self.returned)

    @property
    def seconds(self) -> float:
        """Predicted IPU seconds of the last run (cycles at the tile clock)."""
        return (self.cycles or 0) / self.clock_hz
