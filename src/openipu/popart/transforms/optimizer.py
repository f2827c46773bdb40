"""The weight update ops of a training session (PopART's ``Optimizer::createOp`` per weight and the
``SGD*Combo`` / ``AdamDecompose`` / ``AdaptiveDecompose`` patterns, after ``constructBackwards``),
in ``ai.graphcore``. Every op writes its first input in place (``IrOp.modifies``).

**SGD** (:mod:`openipu.popart.optimizer` for the compound scalars):

- no momentum, no accumulation: ``SGD0VarUpdate(w, g)``: ``w = w * wdsf0 - slr0 * g``;
- otherwise (``SGDAccumulatorAndMomentum.Combined``): ``SGD1Accumulate(v, g)``:
  ``v += dpsf1 * g`` (every micro-batch); ``SGD1VarUpdate(w, v)``: ``w -= slr1 * v``;
  ``SGD1AcclUpdate(v, w)``: ``v = v * smm1 + swd1 * w``. With nesterov the gradients are also
  summed in ``Accl___<w>_nesterovGrad`` (``a``, ``Accumulate`` Add every micro-batch) and
  ``SGD1VarUpdate(w, v, a)``: ``w -= slr1 * (ngsf1 * a + nwd1 * w + mm * v)``, then
  ``AccumulatorUpdate(a)`` (PopART's ``SGD1Nesterov``).
- ``SGDAccumulatorAndMomentum.Separate`` (PopART's ``SGD2Decompose``): ``Accumulate(a, g)`` Add
  into ``Accum___<w>`` (with accumulation), the all-reduce of ``a``, then once per batch
  ``SGD2PartialAcclUpdate(v, w)``: ``v = v * smm1 + swd1 * w``; ``Accumulate(v, a)``
  DampenedAdd ``v += dpsf1 * a``; ``SGD2VarUpdate(w, v)``: ``w -= slr1 * v`` (nesterov
  ``SGD2VarUpdate(w, v, a)`` as SGD1's); ``AccumulatorUpdate(a)``. ``v`` is ``Accl1___<w>``,
  starting at 0.

**Adam** (``adam.hpp``), with ``s = gs * g`` (``gs = 1 / (ls af rf)``), plus ``wd * w`` in
``L2Regularization`` mode: ``Accumulate(m, g)`` MovingAverage ``m = b1 m + (1 - b1) s``;
``Accumulate(v, g)`` MovingAverageSquare ``v = b2 v + (1 - b2) s^2`` (AdaMax: Infinity
``v = max(b2 v, |s|)``); ``AdamUpdater(m, v, t, w) -> x``: ``t += 1``,
``x = mc / (sqrt(vc) + eps)`` (AdaMax ``mc / (v + eps)``) ``+ wd * w`` in Decay mode, with the
bias corrections ``mc = m / (1 - b1^t)``, ``vc = v / (1 - b2^t)`` (none in the NoBias modes,
``vc = v`` for AdaMax); Lamb: ``LambSquare(w) -> r1sq``, ``LambSquare(x) -> r2sq``;
``AdamVarUpdate(w, x[, r1sq, r2sq])``: ``w -= lr * x`` (Lamb: ``* min(r1, mwn) / r2``, 1 when
either norm is 0).

**Adaptive** (``adaptive.hpp``), same ``s``: ``Accumulate(v1, g)`` (AdaGrad DampenedAddSquare
``v1 += s^2``, else MovingAverageSquare with ``alpha``); CenteredRMSProp ``Accumulate(v2, g)``
MovingAverage; ``RMSPropUpdater(g, v1[, v2]) -> x = s / (sqrt(v1 - v2^2) + eps)`` (TF variant:
``eps`` inside the root) or ``AdaDeltaUpdater(g, v1, v2) -> x = s sqrt(v2 + eps) / sqrt(v1 + eps)``
then ``Accumulate(v2, x)`` MovingAverageSquare; momentum ``m > 0``: ``Accumulate(v3, x)`` DecayAdd
``v3 = m v3 + x`` (TF variant: ``+ lr x``); ``ScaledVarUpdate(w, v3)``: ``w -= lr (v3 + wd w)``
(``wd w`` in Decay mode only; TF variant with momentum: no ``lr``).

**Scale-out** (:class:`~openipu.popart.optimizer.Reduction`). Replicas all-reduce (sum) the
gradient (``ReplicatedAllReduce``, PopART's ``GradReduce``) or, with gradient accumulation, the
accumulator or SGD1's velocity in place (``ReplicatedAllReduceInplace``: ``AccumReduce`` /
``AcclReduce``). With gradient accumulation the gradient is summed into ``Accum___<w>`` by
``Accumulate`` Add every micro-batch; the all-reduce, the update ops and ``AccumulatorUpdate``
(zeroing the accumulator) run once per batch, in the ``AccumulateOuterFragment`` execution
context. ``accumulationAndReplicationReductionType`` Mean divides the update by the
accumulation and replication factors (strategy ``Post``, the default), the update by the
accumulation factor and the loss gradient by the replication factor (``PostAndLoss``), or
(``Running``) keeps a running mean in the accumulator (``Accumulate`` Mean, its factor the
micro-batch counter ``Counter___``, one per virtual graph and pipeline stage, incremented after
the accumulators and zeroed once per batch; no ``AccumulatorUpdate``) and all-reduces a mean;
training then does not depend on the number of replicas or micro-batches.

**Replicated tensor sharding** of the optimizer state
(``optimizerStateTensorLocationSettings.location.replicatedTensorSharding`` On, weights of at
least ``minElementsForReplicatedTensorSharding`` elements, more than one replica): each replica
holds ``ceil(n / replicas)`` elements of every state tensor of the weight. The gradient (or the
accumulator) is reduce-scattered instead of all-reduced (``ReplicatedReduceScatter``), the
updates run on this replica's slice of the weight (``ReplicaSlice``), and the slices are
gathered back into the weight (``ReplicatedAllGather``, ``CopyVarUpdate``); Lamb's squared norms
and the squared norms of gradient clipping are all-reduced. The host keeps the whole state
(``ir.sharded_state``; weightsFromHost sends each replica its piece, weightsToHost and
modelToHost gather them). SGD shards with ``SGDAccumulatorAndMomentum.Separate`` only.

A compound scalar is an attribute when const; a non-const one is an optimizer tensor (a scalar
FLOAT device variable written by ``optimizerFromHost``) passed as an extra input, named
``Default<Name>___FLOAT`` (session default) or ``Specific<Name>___<weight>``. State tensors are
Variables (``Accl___``, ``Accl1___``, ``Accl2___``, ``Accl3___``, ``Step___``, ``Accum___`` +
weight id) initialised from the model when it has an initializer of that name (a model written
by ``modelToHost``), else to PopART's initial value.

Weights updated by copy rather than by a gradient (PopART's ``VariableUpdateType::Copy``): the
running mean and variance of a training BatchNormalization, ``CopyVarUpdate(var, running)``
(:func:`copy_var_updates`).
"""

from __future__ import annotations

import numpy as np

from openipu.popart.builder import PIPELINE_ATTR, VGRAPH_ATTR
from openipu.popart.errors import popart_exception, popart_internal_exception
from openipu.popart.log import log
from openipu.popart.grads import GRAPHCORE
from openipu.popart.ir import OUTER_FRAGMENT
from openipu.popart.optimizer import (SGD, Adam, AdamMode, Adaptive, AdaptiveMode, Reduction,
                                      SGDAccumulatorAndMomentum, WeightDecayMode, initial_velocity)
from openipu.popart.tensorinfo import NUMPY_OF, TensorInfo
from openipu.popart.variable_settings import collective_attrs, replica_grouping
from openipu.popart.transforms.autodiff import forward_op

ACCL_PREFIX = "Accl___"
ACCUM_PREFIX = "Accum___"
UPDATED_PREFIX = "UpdatedVar___"
LOSS_SCALING_PREFIX = "lossScaling_"


def _scalar_id(opt, name: str, weight: str, grouped: bool = False) -> str:
    """A non-const compound scalar's tensor: the weight's own with specific values or a replica
    grouping (its scalars count the replicas of its groups), else the shared default."""
    cap = name[0].upper() + name[1:]
    return f"Specific{cap}___{weight}" if opt.hasSpecific(weight) or grouped else f"Default{cap}___FLOAT"


def _grouped(settings) -> bool:
    return settings is not None and not settings.single_group()


def reduction(options, settings=None) -> Reduction:
    """The :class:`Reduction` of a session's options (``accumulationFactor``,
    the global replication factor (``replicatedGraphCount``, or ``globalReplicationFactor`` with
    ``enableDistributedReplicatedGraphs``), ``accumulationAndReplicationReductionType``,
    ``meanAccumulationAndReplicationReductionStrategy``). For a replica-grouped weight
    (``settings``, a :class:`popart.VariableSettings`) the gradient is reduced over the replicas
    of its group (``Reduction.group``)."""
    replicas = options.getGlobalReplicationFactor()
    group = settings.getRealGroupSize(replicas) if _grouped(settings) else 0
    return Reduction(options.accumulation_factor(), replicas,
                     str(options.accumulationAndReplicationReductionType).endswith("Mean"),
                     str(options.meanAccumulationAndReplicationReductionStrategy).split(".")[-1], group)


def loss_seed(opt, options) -> float:
    """The loss gradient's value: the loss scaling, over the replication factor with the
    ``PostAndLoss`` mean strategy (PopART's ``getFinalLossScalingVal``)."""
    return opt.lossScaling().val() / reduction(options).loss_rf


def scalar_values(opt, weights: list[str], options, settings: dict | None = None) -> dict[str, float]:
    """Values of the non-const optimizer tensors: id -> value (for ``optimizerFromHost``).
    ``settings``: weight id -> its :class:`popart.VariableSettings` (replica-grouped weights)."""
    settings = settings or {}
    out = {}
    for w in weights:
        vs = settings.get(w)
        for name, (val, const) in opt.compound_scalars(w, reduction(options, vs)).items():
            if not const:
                out[_scalar_id(opt, name, w, _grouped(vs))] = val
    return out


def loss_scaling_seed(ir, opt, loss: str) -> str | float:
    """The loss gradient: a float (const loss scaling), or the ``lossScaling_<TYPE>`` tensor
    (holding :func:`loss_seed`)."""
    ls = opt.lossScaling()
    if ls.isConst():
        return loss_seed(opt, ir.options)
    dtype = ir.tensors[loss].info.data_type()
    tid = f"{LOSS_SCALING_PREFIX}{dtype}"
    if tid not in ir.tensors:
        ir._add_tensor(tid, dtype, list(ir.tensors[loss].info.shape()), "Variable",
                       np.full(ir.tensors[loss].info.shape(), loss_seed(opt, ir.options), NUMPY_OF[dtype]))
        ir.optimizer_tensors.add(tid)
    return tid


class _Updates:
    """Adds one weight's update ops: compound scalars as attributes or optimizer tensors,
    placement of the weight's forward consumer, the execution context."""

    def __init__(self, ir, opt, w: str, g: str, red: Reduction, shards: int = 1, shard_attrs: dict | None = None):
        self.ir, self.opt, self.w, self.red = ir, opt, w, red
        self.wt = ir.tensors[w]
        self.fwd = forward_op(ir, g)
        self.scal = opt.compound_scalars(w, red)
        self.context = "Normal"
        # replicated tensor sharding: the state holds this replica's 1/shards of the elements
        self.shards = shards
        self.shard_len = -(-self.wt.info.nelms() // shards)
        self.var = w        # what the update reads and writes: the weight, or its shard
        #: the weight's replica grouping (popart.VariableSettings): its gradient is reduced within
        #: its groups, its state is grouped like it
        self.settings = ir.variable_settings.get(w)
        #: the replicas the state is sharded over (the collectives' commGroup attribute): a grouped
        #: weight's groups, else the location's shardingDomain (all replicas by default)
        self.shard_attrs = (collective_attrs(self.settings) if shard_attrs is None else shard_attrs) \
            if shards > 1 else {}

    def shape(self) -> list:
        """The shape of the weight's state: the weight's, or ``[ceil(n / replicas)]`` sharded."""
        return [self.shard_len] if self.shards > 1 else list(self.wt.info.shape())

    def reduce(self, t: str, in_place: bool) -> str:
        """``t`` summed over the replicas: all-reduced, or reduce-scattered to this replica's
        shard (``ReplicatedReduceScatter``, ``[ceil(n / replicas)]``) when the state is sharded."""
        if self.shards > 1:
            piece = self.op("ReplicatedReduceScatter", [t], out=f"{t}__scattered", out_shape=[self.shard_len],
                            modifies=(), **self._collective(), **self.shard_attrs)
            complement = _complement(self.shard_attrs.get("commGroup"), self.ir.options.getGlobalReplicationFactor())
            if complement and not _grouped(self.settings):
                # sharded within a domain smaller than the weight's replicas: the pieces of the
                # domains summed across them (PopART's AllReduceToScatter with a complementary group)
                piece = self.op("ReplicatedAllReduce", [piece], out=f"{piece}__reduced", modifies=(),
                                **self._collective(), commGroup=complement)
            return piece
        return self.all_reduce(t, in_place)

    def _collective(self) -> dict:
        """The all-reduce's operator: a mean with the Running strategy (PopART's
        ``CollectiveOperator::Mean``), else a sum."""
        return {"op": "Mean"} if self.red.running else {}

    def shard_weight(self) -> None:
        """Sharded: the updates work on this replica's slice of the weight (``ReplicaSlice``)."""
        if self.shards > 1:
            self.var = self.op("ReplicaSlice", [self.w], out=f"{self.w}__shard", out_shape=[self.shard_len],
                               modifies=(), **self.shard_attrs)

    def gather_weight(self, updated: str) -> None:
        """Sharded: the updated slices of all replicas gathered into the weight
        (``ReplicatedAllGather``, then ``CopyVarUpdate``)."""
        if self.shards > 1:
            full = self.op("ReplicatedAllGather", [updated], out=f"{self.w}__gathered",
                           out_shape=self.wt.info.shape(), modifies=(), **self.shard_attrs)
            self.op("CopyVarUpdate", [self.w, full], out=f"{UPDATED_PREFIX}{self.w}__copy")

    def scalar(self, name: str):
        """(attribute value or None, tensor id or "") of compound scalar ``name``."""
        val, const = self.scal[name]
        if const:
            return float(val), ""
        tid = _scalar_id(self.opt, name, self.w, _grouped(self.settings))
        if tid not in self.ir.tensors:
            self.ir._add_tensor(tid, "FLOAT", [], "Variable", np.asarray(val, np.float32))
            self.ir.optimizer_tensors.add(tid)
        return None, tid

    def state(self, prefix: str, dtype: str | None, init=None, shape=None, suffix: str = "") -> str:
        """The state Variable ``<prefix><weight>`` of type ``dtype`` (None: the weight's), from
        the model's initializer of that name if it has one, else ``init`` (default zeros).
        ``shape`` None: the weight's state, sharded over the replicas when the state is (its IR
        shape is the shard's; its value, the host copy, has the weight's shape:
        ``ir.sharded_state``). ``suffix``: after the weight id (``Accl___<w>_nesterovGrad``)."""
        tid = f"{prefix}{self.w}{suffix}"
        sharded = shape is None and self.shards > 1
        shape = list(self.wt.info.shape()) if shape is None else list(shape)
        dtype = dtype or self.wt.info.data_type()
        t = self.ir.tensors.get(tid)
        self._ungroup_loaded(t, shape)
        if sharded:
            value = (t.value if t is not None and t.kind == "Variable" and list(t.info.shape()) == shape
                     and t.info.data_type() == dtype else None)
            if t is not None and value is None:
                raise popart_exception(f"The model's initializer {tid} is not the {dtype} {shape} optimizer state "
                                       f"of {self.w} (it is {t.info.data_type()} {list(t.info.shape())}): rename it")
            if value is None:
                value = np.zeros(shape, NUMPY_OF[dtype]) if init is None else np.asarray(init).astype(NUMPY_OF[dtype])
                self.ir._add_tensor(tid, dtype, [self.shard_len], "Variable", value)
            else:
                t.info = TensorInfo(dtype, [self.shard_len])
            self.ir.sharded_state[tid] = (shape, self.shards, self.shard_attrs.get("commGroup"))
            if self.settings is not None:       # grouped: one value per group, each sharded in its group
                self.ir.variable_settings[tid] = self.settings
            return tid
        if self.settings is not None:       # one value per group, like the weight's
            self.ir.variable_settings[tid] = self.settings
        if t is not None:
            if t.kind != "Variable" or list(t.info.shape()) != shape or t.info.data_type() != dtype:
                raise popart_exception(f"The model's initializer {tid} is not the {dtype} {shape} optimizer state "
                                       f"of {self.w} (it is {t.info.data_type()} {list(t.info.shape())}): rename it")
            return tid
        value = np.zeros(shape, NUMPY_OF[dtype]) if init is None else np.asarray(init).astype(NUMPY_OF[dtype])
        self.ir._add_tensor(tid, dtype, shape, "Variable", value)
        return tid

    def _ungroup_loaded(self, t, shape: list) -> None:
        """A replica-grouped weight's state read from a model (``modelToHost`` writes it as
        ``[groups, *shape]``, like the weight): its groups' values kept in ``ir.grouped_values``,
        the IR tensor one replica's (group 0's)."""
        if t is None or self.settings is None or t.kind != "Variable" or t.value is None:
            return
        n = self.settings.getGroupCount(self.ir.options.getGlobalReplicationFactor())
        if n > 1 and list(t.info.shape()) == [n] + list(shape):
            full = np.ascontiguousarray(t.value)
            self.ir.grouped_values[t.id] = full
            t.value = np.ascontiguousarray(full[0])
            t.info = TensorInfo(t.info.data_type(), list(shape))

    def op(self, op_type: str, inputs: list, scalars=(), out: str = "", out_dtype=None, out_shape=None,
           modifies=(0,), tensor_scalars=None, **attrs):
        """An update op: tensor ``inputs``, then its compound scalars ``scalars`` (each a name, or a
        ``(role, name)`` pair when the op reads scalar ``name`` as its ``role``): const ones are
        attributes named by role, non-const ones trailing tensor inputs; ``scalar_names`` lists
        the roles in order. ``tensor_scalars``: role -> id of a scalar tensor computed in the
        graph, read like a non-const compound scalar. Returns its output id."""
        extra = []
        a = dict(attrs)
        roles = []
        for item in list(scalars) + list((tensor_scalars or {}).items()):
            role, name = item if isinstance(item, tuple) else (item, item)
            roles.append(role)
            val, tid = (None, name) if tensor_scalars and role in tensor_scalars else self.scalar(name)
            if tid:
                extra.append(tid)
            else:
                a[role] = val
                extra.append("")
        ins = list(inputs) + extra
        while ins and not ins[-1]:
            ins.pop()
        a["scalar_names"] = roles
        a["n_tensors"] = len(inputs)
        first = self.ir.tensors[inputs[0]].info
        out = out or f"{op_type}___{inputs[0]}"
        dtype = out_dtype or first.data_type()
        shape = first.shape() if out_shape is None else out_shape
        op = self.ir.add_op(op_type, ins, [(out, dtype, shape)], a, domain=GRAPHCORE, opset=1,
                            name=f"{op_type}/{inputs[0]}", like=self.fwd, modifies=tuple(modifies))
        op.grad_of = self.fwd
        op.execution_context = self.context
        return op.outputs[0]

    def all_reduce(self, t: str, in_place: bool, mean_if_running: bool = True, groups: dict | None = None) -> str:
        """``t`` all-reduced over the replicas (in place: ``ReplicatedAllReduceInplace``); a
        mean with the Running strategy unless ``mean_if_running`` is False (SGD1's own
        reductions always sum). ``groups``: the commGroup attribute (default the weight's)."""
        attrs = {**(self._collective() if mean_if_running else {}),
                 **(collective_attrs(self.settings) if groups is None else groups)}
        if in_place:
            return self.op("ReplicatedAllReduceInplace", [t], out=f"{t}__reduced", **attrs)
        return self.op("ReplicatedAllReduce", [t], out=f"{t}__reduced", modifies=(), **attrs)

    def accumulate(self, accum: str, g: str) -> str:
        """``g`` added into the accumulator ``accum`` (``Accumulate`` Add), or averaged into it
        (``Accumulate`` Mean, factor the micro-batch counter) with the Running strategy."""
        if self.red.running:
            counter = running_mean_counter(self.ir, self.fwd)
            return self.op("Accumulate", [accum, g, counter], accumulationType="Mean", out=f"AccumUpdated___{self.w}")
        return self.op("Accumulate", [accum, g], accumulationType="Add", out=f"AccumUpdated___{self.w}")


COUNTER_PREFIX = "Counter___"


def running_mean_counter(ir, fwd) -> str:
    """The micro-batch counter of the running-mean accumulators of the weights used by ``fwd``
    (PopART's ``Counter___``, one per virtual graph and pipeline stage: ``_VGraph<v>``,
    ``_PStage<s>``): a FLOAT scalar Variable starting at 0, incremented and reset by
    :func:`count_micro_batches`."""
    ann = fwd.annotations if fwd is not None else {}
    tid = COUNTER_PREFIX + "".join(f"_{tag}{int(ann[key])}" for tag, key in (("VGraph", VGRAPH_ATTR),
                                                                              ("PStage", PIPELINE_ATTR)) if key in ann)
    if tid not in ir.tensors:
        ir._add_tensor(tid, "FLOAT", [], "Variable", np.zeros((), np.float32))
        ir.running_mean_counters[tid] = fwd
    return tid


def count_micro_batches(ir) -> None:
    """After the micro-batch's accumulators: each running-mean counter ``+= 1``
    (``Accumulate`` Add of 1), and zeroed once per batch (``AccumulatorUpdate``, in the outer
    fragment)."""
    for tid, fwd in ir.running_mean_counters.items():
        one = ir.add_const("one", np.ones((), np.float32))
        for op_type, ins, context, attrs in (("Accumulate", [tid, one], "Normal", {"accumulationType": "Add"}),
                                             ("AccumulatorUpdate", [tid], OUTER_FRAGMENT, {})):
            op = ir.add_op(op_type, ins, [(f"{UPDATED_PREFIX}{tid}", "FLOAT", [])],
                           {**attrs, "scalar_names": [], "n_tensors": len(ins)}, domain=GRAPHCORE, opset=1,
                           name=f"{op_type}/{tid}", like=fwd, modifies=(0,))
            op.grad_of = fwd
            op.execution_context = context


def apply(ir, opt, grads: dict[str, str]) -> None:
    """Append the update ops of every weight in ``grads`` (weight id -> gradient id), in three
    passes: each weight's gradient reduction (all-reduce, accumulation; SGD1: the velocity),
    the clipping of the optimizer's ``ClipNormSettings`` (:func:`clip_by_norm`), the updates.
    Raises ``popart_exception`` for a gradient of another type than its weight and an unknown
    weight in a ``ClipNormSettings``."""
    if not isinstance(opt, (SGD, Adam, Adaptive)):
        raise popart_exception(f"openipu does not support the {type(opt).__name__} optimizer: use popart.SGD, "
                               "popart.ConstSGD, popart.Adam or popart.Adaptive")
    red = reduction(ir.options)
    acc, repl = red.accumulating, red.replicas > 1
    pending = {}
    sharded = ir.sharded_weights = sharded_weights(ir, opt, grads)
    for w, g in grads.items():
        if ir.tensors[g].info.data_type() != ir.tensors[w].info.data_type():
            raise popart_exception(f"The gradient of weight {w} is {ir.tensors[g].info.data_type()} but the weight is "
                                   f"{ir.tensors[w].info.data_type()}")
        # a replica-grouped weight reduces over its group's replicas (none for groups of one)
        red_w = reduction(ir.options, ir.variable_settings.get(w))
        shards, shard_attrs = _sharding(ir, w, red_w) if w in sharded else (1, {})
        u = _Updates(ir, opt, w, g, red_w, shards, shard_attrs)
        ir.shard_attrs[w] = u.shard_attrs
        pending[w] = (_sgd_reduce if isinstance(opt, SGD) else _reduce)(u, g, acc, repl and red_w.reduced > 1)
    count_micro_batches(ir)
    updaters = clip_by_norm(ir, opt, {w: p[0] for w, p in pending.items()}, acc)
    for w, (_, finish) in pending.items():
        finish(updaters[w])


def sharded_weights(ir, opt, weights) -> set:
    """The weights whose optimizer state is sharded over the replicas (PopART's replicated tensor
    sharding: ``optimizerStateTensorLocationSettings.location.replicatedTensorSharding`` On, more
    than one replica, at least ``minElementsForReplicatedTensorSharding`` elements, and some
    state to shard; in a distributed replicated graph the state is sharded over the replicas of
    all instances). Raises ``popart_exception`` for SGD with a combined velocity and accumulator
    (use ``SGDAccumulatorAndMomentum.Separate``)."""
    o = ir.options
    settings = o.optimizerStateTensorLocationSettings
    if o.getGlobalReplicationFactor() < 2 or not str(settings.location.replicatedTensorSharding).endswith("On"):
        return set()
    acc = o.accumulation_factor() > 1
    out = {w for w in weights if ir.tensors[w].info.nelms() >= int(settings.minElementsForReplicatedTensorSharding)
           and (not isinstance(opt, SGD) or opt.uses_velocity(w, acc)) and _shardable(ir, w, settings.location)}
    if out and isinstance(opt, SGD) and opt.accumulator_and_momentum != SGDAccumulatorAndMomentum.Separate:
        raise popart_exception("openipu shards the SGD optimizer state over replicas with "
                               "SGDAccumulatorAndMomentum.Separate only: pass accumulatorAndMomentum="
                               "popart.SGDAccumulatorAndMomentum.Separate to popart.SGD")
    return out


def _sharding(ir, w: str, red_w: Reduction) -> tuple[int, dict]:
    """``(replicas the state of w is sharded over, the collectives' commGroup attribute)``: a
    grouped weight's group; else the location's ``shardingDomain`` (all replicas when None or
    All)."""
    if _grouped(ir.variable_settings.get(w)):
        return red_w.group, collective_attrs(ir.variable_settings.get(w))
    replicas = ir.options.getGlobalReplicationFactor()
    _, _, size = replica_grouping(ir.options.optimizerStateTensorLocationSettings.location.shardingDomain, replicas)
    if size >= replicas:
        return replicas, {}
    cg = ir.options.optimizerStateTensorLocationSettings.location.shardingDomain
    return size, {"commGroup": [1 if str(cg.type).endswith("Consecutive") else 2, size]}


def _complement(attr, replicas: int):
    """The commGroup attribute of the groups complementary to ``attr``'s (PopART's
    ``ReplicaGrouping::getTranspose``: Consecutive k <-> Orthogonal R / k), or None when
    ``attr`` spans all replicas."""
    if not attr:
        return None
    t, k = int(attr[0]), int(attr[1])
    if k >= replicas or t not in (1, 2):
        return None
    return [2 if t == 1 else 1, replicas // k]


def _shardable(ir, w: str, location) -> bool:
    """Whether weight ``w``'s optimizer state may be sharded, by PopART's rules for replica-grouped
    variables (``StreamingMemoryOpInserter``): not for ``CommGroupType.None`` (each replica its
    own value: sharding is turned off, as PopART logs); a weight of several groups is sharded
    within its groups, which needs the location's ``shardingDomain`` to be the weight's
    ``sharedVariableDomain`` (else PopART's ``popart_internal_exception`` "Could not return a
    supported ReplicaGrouping transpose of ... within the super-set: ...")."""
    vs = ir.variable_settings.get(w)
    if vs is None:
        return True
    replicas = ir.options.getGlobalReplicationFactor()
    if vs._kind() == "Ungrouped":
        log("transform").debug("[StreamingMemory] Sharding on tensor %s disabled due to CommGroupType (None)", w)
        return False
    if vs.single_group():
        return True
    domain = replica_grouping(getattr(location, "shardingDomain", None), replicas)
    var = replica_grouping(vs.getSharedVariableDomain(), replicas)
    if domain != var:
        fmt = "ReplicaGrouping(numReplicas={}, stride={}, groupSize={})"
        raise popart_internal_exception("Could not return a supported ReplicaGrouping transpose of "
                                        f"{fmt.format(*domain)} within the super-set: {fmt.format(*var)}")
    return True


def _reduce(u: _Updates, g: str, acc: bool, repl: bool, update=None):
    """The reduced (accumulated, all-reduced or reduce-scattered) gradient, and
    ``finish(updater)`` adding the update ``update(u, updater) -> updated weight`` (default:
    Adam's or Adaptive's) on the weight or its shard, then zeroing the accumulator."""
    update = update or (_adam if isinstance(u.opt, Adam) else _adaptive)
    accum = None
    if acc:     # sum (or average) the micro-batches' gradients
        accum = u.state(ACCUM_PREFIX, u.opt.accum_type, shape=u.wt.info.shape())  # not sharded
        u.accumulate(accum, g)
        u.context = OUTER_FRAGMENT
        g = u.reduce(accum, True) if repl else accum
    elif repl:
        g = u.reduce(g, False)

    def finish(updater):
        u.shard_weight()
        u.gather_weight(update(u, updater))
        if accum is not None and not u.red.running:     # a running mean restarts by itself
            u.op("AccumulatorUpdate", [accum], out=f"{UPDATED_PREFIX}{accum}")
    return g, finish


def _sgd_reduce(u: _Updates, g: str, acc: bool, repl: bool):
    """SGD: the all-reduced gradient (SGD0), the velocity (SGD1) or the reduced accumulator
    (SGD2), and ``finish(updater)``."""
    opt, w = u.opt, u.w
    if not opt.uses_velocity(w, acc):
        if repl:
            g = u.all_reduce(g, False)
        return g, lambda updater: u.op("SGD0VarUpdate", [w, updater],
                                       ["weightDecayScaleFactor0", "scaledLearningRate0"], out=f"{UPDATED_PREFIX}{w}")
    nesterov = "nesterovGradScaleFactor1" in u.scal
    if opt.accumulator_and_momentum == SGDAccumulatorAndMomentum.Separate:
        return _reduce(u, g, acc, repl, _sgd2)
    # SGD1 (PopART's SGD1Decompose): without accumulation the replicas sum the gradient
    # (GradReduce), with it the velocity (AcclReduce); both sums, whatever the mean strategy
    if repl and not acc:
        g = u.all_reduce(g, False, mean_if_running=False)
    v = u.state(ACCL_PREFIX, None, initial_velocity(opt, w, u.wt.value))
    if w in u.ir.grouped_values:        # a replica-grouped weight: each group's initial velocity
        u.ir.grouped_values[v] = np.stack([initial_velocity(opt, w, gv) for gv in u.ir.grouped_values[w]])
    u.op("SGD1Accumulate", [v, g], ["dampeningScaleFactor1"], out=f"AcclUpdated___{w}")
    a = None
    if nesterov:        # the gradients' sum, for the nesterov step
        a = u.state(ACCL_PREFIX, None, shape=u.wt.info.shape(), suffix="_nesterovGrad")
        u.op("Accumulate", [a, g], accumulationType="Add", out=f"AcclUpdated___{w}_nesterovGrad")
    if acc:
        u.context = OUTER_FRAGMENT
        if repl:
            for t in (v, a) if a else (v,):
                u.all_reduce(t, True, mean_if_running=False)

    def finish(updater):
        if nesterov:
            _nesterov_var_update(u, "SGD1VarUpdate", w, updater, a)
            u.op("AccumulatorUpdate", [a], out=f"{UPDATED_PREFIX}{a}")
        else:
            u.op("SGD1VarUpdate", [w, updater], ["scaledLearningRate1"], out=f"{UPDATED_PREFIX}{w}")
        u.op("SGD1AcclUpdate", [v, w], ["scaledMomentum1", "scaledWeightDecay1"], out=f"AcclFinal___{w}")
    return v, finish


def _nesterov_var_update(u: _Updates, op_type: str, w: str, v: str, a: str) -> str:
    """The nesterov weight step ``w -= slr1 * (ngsf1 * a + nwd1 * w + mm * v)`` from the
    gradients' sum ``a`` (PopART's ``SGD1Nesterov`` and var update in one op)."""
    return u.op(op_type, [w, v, a], ["scaledLearningRate1", "nesterovGradScaleFactor1", "nesterovWeightDecay1",
                                     "momentum"], out=f"{UPDATED_PREFIX}{u.w}")


def _sgd2(u: _Updates, a: str) -> str:
    """SGD2's ops on ``u.var`` from the reduced gradient ``a``; returns the updated weight."""
    w = u.w
    v = u.state("Accl1___", u.opt.accl1_type)
    u.op("SGD2PartialAcclUpdate", [v, u.var], ["scaledMomentum1", "scaledWeightDecay1"], out=f"AcclDecayed___{w}")
    u.op("Accumulate", [v, a], [("factor", "dampeningScaleFactor1")], accumulationType="DampenedAdd",
         out=f"AcclUpdated___{w}")
    if "nesterovGradScaleFactor1" in u.scal:
        return _nesterov_var_update(u, "SGD2VarUpdate", u.var, v, a)
    return u.op("SGD2VarUpdate", [u.var, v], ["scaledLearningRate1"], out=f"{UPDATED_PREFIX}{w}")


def clip_by_norm(ir, opt, updaters: dict[str, str], acc: bool) -> dict[str, str]:
    """PopART's ``ClipWeightGradientsByNorm``: per ``ClipNormSettings`` group, the global norm
    ``sqrt(sum_w sum(u_w^2))`` of its weights' updater inputs ``u_w`` (the reduced gradient;
    SGD1's velocity, as PopART; a sharded weight's slice, its squares all-reduced), and
    ``u_w * maxNorm / max(maxNorm, norm)`` in their place (ONNX ReduceSumSquare, Sum, Sqrt, Max,
    Div, Mul; in the outer fragment with accumulation).
    Returns weight -> updater input. Raises ``popart_exception`` ("Could not find a varupdate op
    for tensor ...") for a weight without an update."""
    out = dict(updaters)
    for k, cns in enumerate(opt.clip_norm_settings):
        ids = list(updaters) if cns.clips_all() else list(cns.weightIds)
        for w in ids:
            if w not in updaters:
                raise popart_exception(f"Could not find a varupdate op for tensor {w}")
        if not ids:
            continue

        def add(op_type, ins, out_id, shape, domain="", **attrs):
            src = ir.tensors[ins[0]].producer
            op = ir.add_op(op_type, ins, [(out_id, ir.tensors[ins[0]].info.data_type(), shape)], attrs, domain=domain,
                           opset=1 if domain else None, name=f"{op_type}/clipping{k}", like=src)
            op.grad_of = src.grad_of if src is not None else None
            op.execution_context = OUTER_FRAGMENT if acc else "Normal"
            return op.outputs[0]
        squares = [add("ReduceSumSquare", [updaters[w]], f"{w}_clipping", [], keepdims=0) for w in ids]
        # a sharded weight's updater is this replica's slice: its squares summed over the replicas
        squares = [add("ReplicatedAllReduce", [sq], f"{sq}__reduced", [], domain=GRAPHCORE,
                       **ir.shard_attrs.get(w, {})) if w in ir.sharded_weights
                   else sq for w, sq in zip(ids, squares)]
        total = add("Sum", squares, "normsSum", []) if len(squares) > 1 else squares[0]
        norm = add("Sqrt", [total], f"GlobalNorm_{k}", [])
        dtype = ir.tensors[norm].info.data_type()
        clip = ir.add_const("clipByNorm", np.asarray(cns.maxNorm, NUMPY_OF[dtype]))
        factor = add("Div", [clip, add("Max", [norm, clip], "clipByNorm", [])], "clipFactor", [])
        for w in ids:
            out[w] = add("Mul", [updaters[w], factor], f"{w}_clipped", ir.tensors[updaters[w]].info.shape())
    return out


def _weight_decay_in(u: _Updates, mode: WeightDecayMode) -> bool:
    """Whether the weight decay acts, in ``mode`` (L2Regularization: ``wd * w`` added to the
    gradient; Decay: to the update term): the optimizer's mode, a non-zero or non-const ``wd``."""
    val, const = u.scal["weightDecay"]
    return u.opt.weight_decay_mode == mode and (val != 0.0 or not const)


def _accumulate(u: _Updates, accl: str, g: str, kind: str, factor: str | None, l2: bool,
                scale: str | None = "gradientScaling", ratio: str | None = None) -> str:
    """``Accumulate`` of ``kind`` into ``accl`` of ``s = scale * g (+ wd * w)``: ``factor`` and
    ``scale`` name compound scalars (None: none); ``l2`` adds the L2 term (``w`` then is the
    third tensor input); ``ratio``: the loss scaling's change, rescaling a scaled state first
    (PopART's ``RescaleAccumulate``)."""
    ins = [accl, g] + ([u.var] if l2 else [])
    names = ([("factor", factor)] if factor else []) + ([("gradientScaling", scale)] if scale else []) + \
        (["weightDecay"] if l2 else [])
    return u.op("Accumulate", ins, names, accumulationType=kind, out=f"{accl}__updated",
                tensor_scalars={"rescaleRatio": ratio} if ratio else None)


def _loss_scaling_ratio(u: _Updates) -> str:
    """``lossScaling / previousLossScaling`` (FLOAT scalar), then ``previousLossScaling``
    set to the loss scaling (``CopyVarUpdate``): how much a scaled optimizer state must be
    rescaled when ``updateOptimizerFromHost`` changed a non-const loss scaling (PopART's
    ``AdamDecompose::rescaleRatio``). One pair per session; returns the ratio's id."""
    ir = u.ir
    ls = f"{LOSS_SCALING_PREFIX}{ir.tensors[ir.training['loss']].info.data_type()}"
    ratio = "lossScalingRatio_FLOAT"
    if ratio in ir.tensors:
        return ratio
    prev = "previousLossScaling_FLOAT"
    if prev not in ir.tensors:
        ir._add_tensor(prev, "FLOAT", [], "Variable", np.asarray(ir.tensors[ls].value, np.float32).reshape(()))

    def add(op_type, ins, out, domain="", **attrs):
        op = ir.add_op(op_type, ins, [(out, "FLOAT", [])], attrs, domain=domain, opset=1 if domain else None,
                       name=f"{op_type}/{out}", like=u.fwd, modifies=(0,) if op_type == "CopyVarUpdate" else ())
        op.grad_of, op.execution_context = u.fwd, u.context
        return op.outputs[0]
    if ir.tensors[ls].info.data_type() != "FLOAT":
        ls = add("Cast", [ls], f"{ls}__FLOAT", to=1)
    if ir.tensors[ls].info.rank():
        ls = add("Reshape", [ls, ir.add_const("scalarShape", np.zeros(0, np.int64))], f"{ls}__scalar")
    out = add("Div", [ls, prev], ratio)
    add("CopyVarUpdate", [prev, ls], f"{UPDATED_PREFIX}{prev}", domain=GRAPHCORE)
    return out


def _per_lookup_squares(u: _Updates, g: str) -> str | None:
    """With the optimizer's openipu-only ``per_lookup_second_moment`` flag, for a weight whose
    gradient ``g`` is a Gather's (``GatherGrad``: an embedding table, no gradient accumulation
    or replica reduction in between) and unit gradient scaling: the sum over the lookups of
    each lookup's squared gradient, ``GatherGrad(gy * gy)`` (table-shaped, FLOAT). That is what
    Keras 3's Adam / RMSprop on TensorFlow accumulate into their second moment: TensorFlow
    gives the table's gradient as ``IndexedSlices`` with one slice per lookup, and Keras
    squares the slices before adding the duplicates (``ops.square`` keeps the slices) while the
    first moment adds them first. Returns the tensor id, or None where it does not apply (the
    square of the summed gradient is used then, PopART's)."""
    if not getattr(u.opt, "per_lookup_second_moment", False):
        return None
    src = u.ir.tensors[g].producer
    gs, gs_const = u.scal.get("gradientScaling", (1.0, True))
    if src is None or src.op_type != "GatherGrad" or not gs_const or float(gs) != 1.0:
        return None
    gy, idx = src.inputs[0], src.inputs[1]
    gyt = u.ir.tensors[gy].info

    def add(op_type, ins, out, shape, dtype, domain="", **attrs):
        op = u.ir.add_op(op_type, ins, [(out, dtype, shape)], attrs, domain=domain, opset=1 if domain else None,
                         name=f"{op_type}/{out}", like=src)
        op.grad_of, op.execution_context = src.grad_of, getattr(src, "execution_context", "Normal")
        return op.outputs[0]
    sq = add("Mul", [gy, gy], f"{gy}__lookupSquares", gyt.shape(), gyt.data_type())
    return add("GatherGrad", [sq, idx], f"{g}__lookupSquares", u.ir.tensors[g].info.shape(),
               u.ir.tensors[g].info.data_type(), domain=GRAPHCORE, **{k: v for k, v in src.attrs.items()
                                                                       if not k.startswith("__")})


def _adam(u: _Updates, g: str) -> str:
    """Adam's ops on ``u.var``; returns the updated weight (or shard)."""
    opt, w = u.opt, u.var
    mode = opt.mode
    l2, decay = (_weight_decay_in(u, wdm) for wdm in (WeightDecayMode.L2Regularization, WeightDecayMode.Decay))
    m = u.state("Accl1___", opt.accl1_type)
    v = u.state("Accl2___", opt.accl2_type)
    t = u.state("Step___", "FLOAT", shape=[])
    ratio = _loss_scaling_ratio(u) if opt.scaled_optimizer_state and not opt.lossScaling().isConst() else None
    _accumulate(u, m, g, "MovingAverage", "beta1", l2, ratio=ratio)
    squares = _per_lookup_squares(u, g) if mode == AdamMode.Adam and not l2 and ratio is None else None
    if squares is not None:         # Keras 3's Adam on an IndexedSlices gradient
        _accumulate(u, v, squares, "MovingAverage", "beta2", False, scale=None)
    else:
        _accumulate(u, v, g, "Infinity" if mode == AdamMode.AdaMax else "MovingAverageSquare", "beta2", l2,
                    ratio=ratio)
    x = u.op("AdamUpdater", [m, v, t] + ([w] if decay else []), ["beta1", "beta2", "eps"] +
             (["weightDecay"] if decay else []), out=f"AdamUpdater___{u.w}", out_dtype=u.wt.info.data_type(),
             out_shape=u.shape(), modifies=(2,), mode=mode.name,
             **({"eps_before_correction": 1} if getattr(opt, "eps_before_correction", False) else {}))
    if mode in (AdamMode.Lamb, AdamMode.LambNoBias):
        r1 = u.op("LambSquare", [w], out=f"LambR1Sq___{u.w}", out_dtype="FLOAT", out_shape=[], modifies=())
        r2 = u.op("LambSquare", [x], out=f"LambR2Sq___{u.w}", out_dtype="FLOAT", out_shape=[], modifies=())
        if u.shards > 1:        # the squared norms of the whole weight: summed over the shards
            r1, r2 = (u.all_reduce(r, False, mean_if_running=False, groups=u.shard_attrs) for r in (r1, r2))
        return u.op("AdamVarUpdate", [w, x, r1, r2], ["learningRate", "maxWeightNorm"], out=f"{UPDATED_PREFIX}{u.w}")
    return u.op("AdamVarUpdate", [w, x], ["learningRate"], out=f"{UPDATED_PREFIX}{u.w}")


def _adaptive(u: _Updates, g: str) -> str:
    """Adaptive's ops on ``u.var``; returns the updated weight (or shard)."""
    opt, w = u.opt, u.var
    mode = opt.mode
    l2, decay = (_weight_decay_in(u, wdm) for wdm in (WeightDecayMode.L2Regularization, WeightDecayMode.Decay))
    wl2 = [w] if l2 else []
    sl2 = ["weightDecay"] if l2 else []
    v1 = u.state("Accl1___", opt.accl1_type)
    if mode == AdaptiveMode.AdaGrad:
        _accumulate(u, v1, g, "DampenedAddSquare", None, l2)
    else:
        squares = _per_lookup_squares(u, g) if mode != AdaptiveMode.AdaDelta and not l2 else None
        if squares is not None:     # Keras 3's RMSprop on an IndexedSlices gradient
            _accumulate(u, v1, squares, "MovingAverage", "alpha", False, scale=None)
        else:
            _accumulate(u, v1, g, "MovingAverageSquare", "alpha", l2)
    if mode == AdaptiveMode.AdaDelta:
        v2 = u.state("Accl2___", opt.accl2_type)
        x = u.op("AdaDeltaUpdater", [g, v1, v2] + wl2, ["eps", "gradientScaling"] + sl2,
                 out=f"AdaDeltaUpdater___{u.w}", modifies=())
        _accumulate(u, v2, x, "MovingAverageSquare", "alpha", False, scale=None)
    else:
        state = [v1]
        if mode == AdaptiveMode.CenteredRMSProp:
            v2 = u.state("Accl2___", opt.accl2_type)
            _accumulate(u, v2, g, "MovingAverage", "alpha", l2)
            state.append(v2)
        x = u.op("RMSPropUpdater", [g, *state] + wl2, ["eps", "gradientScaling"] + sl2,
                 out=f"RMSPropUpdater___{u.w}", modifies=(), centered=int(len(state) == 2),
                 tf_variant=int(opt.rmsprop_tf_variant))
    mm_val, mm_const = u.scal["momentum"]
    momentum = mm_val != 0.0 or not mm_const
    tf = opt.rmsprop_tf_variant and momentum and mode in (AdaptiveMode.RMSProp, AdaptiveMode.CenteredRMSProp)
    step = x
    if momentum:    # v3 = m v3 + x (TF variant: + lr x)
        v3 = u.state("Accl3___", opt.accl3_type)
        _accumulate(u, v3, x, "DecayAdd", "momentum", False, scale="learningRate" if tf else None)
        step = v3
    # w -= lr (v3 + wd w); the TF variant with momentum has lr in v3 already
    scal = ([] if tf else ["learningRate"]) + (["weightDecay"] if decay else [])
    return u.op("ScaledVarUpdate", [w, step], scal, out=f"{UPDATED_PREFIX}{u.w}")


def copy_var_updates(ir) -> None:
    """Append ``CopyVarUpdate(var, from)`` for each weight a training BatchNormalization
    replaces: its mean / var inputs, when they are Variables, take the running mean / variance
    outputs (PopART's ``BatchNormOp::setup`` marks them ``VariableUpdateType::Copy``;
    ``Ir::growCopyVarUpdateOp``)."""
    from openipu.popart.onnx_ops.normalization import bn_training
    for op in list(ir.ops):
        # (the ONNX op, and PopART's ai.graphcore variant, aiGraphcore.batchnormalization)
        # (a recomputation clone's running statistics are its forward op's again: no second copy)
        if op.domain not in ("", GRAPHCORE) or op.op_type != "BatchNormalization" or \
                op.recomputes is not None or not bn_training(op.attrs, op.opset):
            continue
        for i, k in ((3, 1), (4, 2)):
            var = op.inputs[i] if i < len(op.inputs) else ""
            src = op.outputs[k] if k < len(op.outputs) else ""
            if not var or not src or ir.tensors[var].kind != "Variable" or var in ir.optimizer_tensors:
                continue
            info = ir.tensors[var].info
            ir.add_op("CopyVarUpdate", [var, src], [(f"{UPDATED_PREFIX}{var}", info.data_type(), info.shape())],
                      domain=GRAPHCORE, opset=1, name=f"CopyVarUpdate/{var}", like=op, modifies=(0,))
