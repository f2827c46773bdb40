"""The IR executor: a session's IR run op by op with whole-tensor host kernels (the fast path).

A PopART session compiles its IR to a Poplar program, and the program gives the prediction (IPU
cycles, tile memory). The outputs need not come from moving every tensor through the simulated
tile memory: the IR's ops have exact whole-tensor semantics (each op's ``onnx_ops`` host kernel,
the same kernel the generic lowering runs inside its vertex group), so running them in the IR's
order on whole torch tensors gives the IPU's outputs at the host cost of the model's arithmetic,
as PyTorch eager would. The device-storage emulation stays the verifying mode (and the only mode
for Poplar-level programs, user codelets and explicit tile mappings).

Scope of this version (:func:`unsupported` says why a session is not covered, and the session
then runs on the device-storage emulation): inference and training sessions (forward, backward and
weight updates: the update ops' kernels are :mod:`openipu.popart.onnx_ops.varupdate`); replication
(the replicas in lockstep, collectives reduced across them); gradient accumulation (micro-batches,
then the accumulate outer fragment); pipelining of inference and of training with gradient
accumulation (functionally accumulation); random ops (the device's seed and streams:
``GetRandomSeed`` advances the seed variable, each op draws poprand's stream); PrintTensor (replica
0 prints Poplar's text at the op's place in the step); Abort (Poplar's error when it fires);
control flow (If, Loop, Scan, call: their host kernels run the subgraphs, as the generic
lowering's vertex does); replicated tensor sharding of the optimizer state (each replica holds
its piece; over the replicas of every instance in a distributed replicated graph). Not yet:
pipelined training without accumulation (stale weights), automatic loss scaling, synthetic data,
optimizer state sharded within replica groups.
Buffers come from ``PyStepIO`` or ``PyStepIOCallback``. Numerics: each op
computes in its IR dtype, as its host kernel does (float16 stays float16), except matmuls and
convolutions, which compute half inputs in float32 and round once (``FLOAT_PARTIALS``), and
MatMul / Gemm with half partials, which round each planned partial sum to half
(:mod:`openipu.popart.half_partials`, given the session's ``target``); a precise PopLibs lowering
may round differently, within the plan's precision. Each intermediate tensor is
dropped after its last reader; a Transpose read only by matmuls is left as a view when nothing
writes the data it aliases while it is read (:func:`transpose_views`). The variables (weights,
optimizer state, scalars and the random seed) live in the executor between runs: the session's
``weightsFromHost``, ``optimizerFromHost``, ``setRandomSeed`` and ``weightsToHost`` move them.

Torch device (``OPENIPU_TORCH_DEVICE``, :mod:`openipu.popart.torch_device`: ``cpu``, the default,
``cuda``, ``cuda:N`` or ``auto``): the constants, the variables and every intermediate tensor
live on that device and the kernels run there; the host boundaries (``PyStepIO`` /
``PyStepIOCallback`` buffers, anchors, ``weightsToHost``, PrintTensor's text) convert once. Random
ops draw their streams on the CPU and move the result, so every device draws the same numbers;
stochastic rounding (numpy) and the collectives of a distributed replicated graph (gloo) also go
through the CPU.

The default for every PopART session (and so for PopTorch and PopRT, which run PopART sessions);
``OPENIPU_EXECUTION=device`` selects the emulation for every session; the prediction
comes from the compiled program either way (``Engine.predict_run``).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from openipu import poplar
from openipu.popart import fp_behaviour, half_partials, torch_device
from openipu.popart.dataflow import AnchorReturnTypeId
from openipu.popart.errors import popart_exception
from openipu.popart.graphcore_ops import find_kernel
from openipu.popart.execute_plan import (FLOAT_PARTIALS, conv_grad_pairs, host_busy, last_uses, load_adaptive,
                                         runs_serially, transpose_views, with_releases)
from openipu.popart.ir import shard_rows
from openipu.popart.lowering.graphcore import _COLLECTIVE as _COLLECTIVE_OP
from openipu.popart.model_check import ALLOCATION_CHECKED
from openipu.popart.onnx_ops.shape import transpose_view
from openipu.popart.shapes import KERNEL_TORCH_OF, call_kernel, kernel_failure
from openipu.popart.variable_settings import comm_groups
from openipu.poplar import pvti
from openipu.poplibs import gcl, gcl_instances

def mode() -> str:
    """``OPENIPU_EXECUTION``: ``"ir"`` (this executor where it covers a session; the default) or
    ``"device"`` (the device-storage emulation, the verifying mode). Raises ``ValueError`` for
    another value."""
    m = os.environ.get("OPENIPU_EXECUTION", "ir").strip().lower() or "ir"
    if m not in ("ir", "device"):
        raise ValueError(f"OPENIPU_EXECUTION must be 'ir' or 'device', not {m!r}")
    return m


def unsupported(session) -> str | None:
    """Why ``session`` cannot run on the IR executor (``None`` when it can)."""
    ir, o = session._ir, session.options
    if ir.training is None and session.accumulationFactor > 1:
        return "gradient accumulation in an inference session"
    if ir.num_stages and ir.training is not None and session.accumulationFactor <= 1:
        return "pipelined training without gradient accumulation (each stage updates stale weights)"
    if str(o.syntheticDataMode).split(".")[-1] != "Off":
        return "synthetic data (the inputs are filled on the device)"
    if ir.auto_loss_scale:
        return "automatic loss scaling"
    within = sorted(tid for tid, v in getattr(ir, "sharded_state", {}).items()
                    if int(v[1]) != o.getGlobalReplicationFactor())
    if within:
        return f"optimizer state sharded within replica groups ({', '.join(within)})"
    for op in ir.ops:
        if op.op_type in _COLLECTIVES and op.op_type not in ("ReplicatedAllGather", "ReplicaSlice") and \
                not _reducible(str(op.attrs.get("op", "Add"))):
            return f"the collective {op.op_type} with operation {op.attrs.get('op')}"
        if find_kernel(op.domain, op.op_type) is None and op.op_type != "Abort":
            return f"{op.domain or 'ai.onnx'}.{op.op_type} has no host kernel"
    return None


def host_bytes(session, batches_per_step: int = 1) -> int:
    """Bytes of host memory a run of ``session`` on this executor needs, roughly (``bytes``):
    the constants and variables twice (the session's host copy and the executor's, one per
    replica), the peak of the intermediate tensors live at once (each op's inputs and outputs
    and what later ops still read, as :func:`with_releases` frees them), and the stream inputs
    and anchors of ``batches_per_step`` batches twice (the step's buffers and the anchor arrays).
    ``session``: a PopART session whose IR is built (before ``prepareDevice``)."""
    ir = session._ir
    size = {t: v.info.nbytes() for t, v in ir.tensors.items()}
    held = {t for t, v in ir.tensors.items() if v.kind in ("Const", "Variable")}
    last = last_uses([(op.inputs, op.outputs) for op in ir.ops], held)
    live = peak = 0
    for i, op in enumerate(ir.ops):
        live += sum(size.get(x, 0) for x in op.outputs if x not in held)
        peak = max(peak, live)
        live -= sum(size.get(x, 0) for x in set(op.inputs) | set(op.outputs)
                    if last.get(x) == i and x in ir.tensors and ir.tensors[x].producer is not None)
    io = sum(size[t] for t in set(ir.stream_inputs) | set(session.dataFlow.anchors()) if t in size)
    fixed = sum(size[t] for t in held)
    return int(fixed * (1 + max(1, int(session.replicationFactor))) + peak + 2 * io * batches_per_step)


def _reducible(op: str) -> bool:
    return op in _COLLECTIVE_OP and _COLLECTIVE_OP[op] != "LOCAL"


#: the process's answers of :meth:`IrExecutor._probe_threads`: (op type, attributes, input
#: shapes and dtypes, torch threads) -> the results are the same on one thread and on those
_THREAD_INVARIANT: dict = {}

_COLLECTIVES = {"ReplicatedAllReduce", "ReplicatedAllReduceInplace", "ReplicatedReduceScatter",
                "ReplicatedAllGather", "ReplicaSlice"}


class IrExecutor:
    """Runs a session's IR ops in order on whole tensors.

    A step runs ``batchesPerStep`` batches; a training batch runs ``accumulationFactor``
    micro-batches of the model's ops, then the ops of the accumulate outer fragment (the weight
    update under gradient accumulation), as the device program's ``Repeat(accumulationFactor)``.
    A pipelined IR runs the same way (its stages in the IR's order, one micro-batch at a time:
    functionally the pipeline is gradient accumulation). ``replicas`` copies of the variables
    step in lockstep, op by op, so that a collective (``ReplicatedAllReduce[Inplace]``) reduces
    over the replicas' tensors as ``gcl`` does; each replica reads its own slice of the input
    buffers (``[batchesPerStep, accumulationFactor, replicas, *shape]``).

    A sharded optimizer state (``ir.sharded_state``: id -> (full shape, shards)) is held as each
    replica's piece, ``[ceil(n / shards)]`` (row ``globalReplica`` of :func:`shard_rows` of the
    host value); in a distributed replicated graph the shards are the replicas of every instance
    and this instance's replicas hold the pieces ``[offset, offset + replicas)``.

    Args:
        ir: the session's :class:`openipu.popart.ir.Ir`.
        weights: variable id -> host array (the values the device holds).
        replicas: the local replication factor (1: no replication).
        accumulation: micro-batches per batch (training with gradient accumulation; else 1).
        distributed: the replicas are a block of a distributed replicated graph: the collectives
            run over every instance's replicas (:mod:`openipu.poplibs.gcl_instances`).
        groups: replica-grouped variables, id -> the group of each replica.
        device: the torch device (``None``: ``OPENIPU_TORCH_DEVICE``, :mod:`.torch_device`).
    """

    def __init__(self, ir, weights: dict, replicas: int = 1, accumulation: int = 1, out=None,
                 distributed: bool = False, groups: dict | None = None, sr_seed: int = 0, target=None,
                 device=None):
        self.ir = ir
        #: the torch device of the kernels and of every tensor the executor holds
        #: (``device``: a ``torch.device`` or its name; default ``OPENIPU_TORCH_DEVICE``, see
        #: :func:`openipu.popart.torch_device.resolve`, which raises ``popart_exception``)
        self.device = device if isinstance(device, torch.device) else torch_device.resolve(device)
        self._move = self.device.type != "cpu"
        #: the hardware-only floating-point behaviour (:mod:`openipu.popart.fp_behaviour`):
        #: stochastic rounding of float16 results, floating-point exceptions
        self.sr = bool(getattr(ir.options, "enableStochasticRounding", False))
        self.fp_checks = bool(getattr(ir.options, "enableFloatingPointChecks", False))
        self.sr_gen = torch.Generator().manual_seed(int(sr_seed) & 0xFFFFFFFFFFFFFFFF)
        #: replica-grouped variables: id -> the group of each replica (their host values are
        #: ``[groups, *shape]``, replica ``r`` holds row ``groups[id][r]``)
        self.groups = dict(groups or {})
        #: the replicas are a block of a distributed replicated graph (PopDist instances): the
        #: all-reduces fold over every instance's replicas (gcl_instances.reduce_groups)
        self.distributed = bool(distributed)
        self.out = out          # PrintTensor's stream (None: sys.stdout when printing)
        self.replicas, self.accumulation = int(replicas), int(accumulation)
        #: instances, this instance's first global replica, global replicas
        n = max(1, gcl_instances.num_instances()) if self.distributed else 1
        self.instances, self.offset = n, (gcl_instances.instance_index() * self.replicas if n > 1 else 0)
        self.global_replicas = self.replicas * n
        #: the sharded optimizer state: id -> shards (the global replicas)
        self.sharded = {tid: int(v[1]) for tid, v in getattr(ir, "sharded_state", {}).items()}
        bad = {tid: k for tid, k in self.sharded.items() if k != self.global_replicas}
        if bad:
            raise poplar.poplar_error(f"The sharded state {sorted(bad)} is sharded over {sorted(set(bad.values()))} "
                                      f"replicas, but {self.global_replicas} replicas run")
        self.dtype = {tid: KERNEL_TORCH_OF.get(t.info.data_type(), torch.float32) for tid, t in ir.tensors.items()}
        self.consts = {tid: self._tensor(t.value, tid) for tid, t in ir.tensors.items()
                       if t.kind == "Const" and t.value is not None}
        from openipu.popart.ir import OUTER_FRAGMENT
        anchors = set(ir.data_flow.anchors())
        views = transpose_views(ir, anchors | {getattr(ir, "anchor_alias", {}).get(t, t) for t in anchors})
        main, outer = [], []
        half = self._half_partials(target)
        #: the convolution gradients computed in pairs (:func:`conv_grad_pairs`): the first of
        #: two computes both, the second is done by then
        pairs = {} if self.fp_checks else conv_grad_pairs(ir)
        fused = {j: i for i, j in pairs.items()}
        #: host threads may follow the load for these ops (CPU kernels only: None as the step's
        #: ``serial``, see :meth:`_ops`)
        adaptive = self.device.type == "cpu" and not self.fp_checks and torch.get_num_threads() > 1
        for i, op in enumerate(ir.ops):
            serial = None if adaptive and i not in fused and load_adaptive(ir, op) else runs_serially(ir, op)
            step = (serial, find_kernel(op.domain, op.op_type), op.attrs, op.opset, list(op.inputs), list(op.outputs),
                    "view" if i in views else
                    ("conv_grads", op, ir.ops[pairs[i]]) if i in pairs else
                    "fused" if i in fused else
                    "collective" if op.op_type in _COLLECTIVES and (self.replicas > 1 or self.distributed) else
                    "in_place" if (op.domain, op.op_type) == ("ai.graphcore", "GetRandomSeed") else
                    "abort" if (op.domain, op.op_type) == ("ai.graphcore", "Abort") else
                    self._printer(op) if (op.domain, op.op_type) == ("ai.graphcore", "PrintTensor") else
                    ("half", half[i]) if i in half else
                    "float" if (op.domain, op.op_type) in FLOAT_PARTIALS and any(
                        ir.tensors[x].info.data_type() == "FLOAT16" for x in op.inputs if x) else
                    # stochastic rounding: an ONNX op's float16 results computed in float32, then rounded
                    "sr" if self.sr and op.domain in ("", "ai.onnx") and any(
                        x and x in ir.tensors and ir.tensors[x].info.data_type() == "FLOAT16" for x in op.outputs)
                    else None)
            (outer if self.accumulation > 1 and op.execution_context == OUTER_FRAGMENT else main).append(step)
        keep = set(self.consts) | {t for t, v in ir.tensors.items() if v.kind == "Variable"}
        keep |= anchors | {getattr(ir, "anchor_alias", {}).get(t, t) for t in anchors}
        keep |= {x for st in outer for x in st[4] if x}     # read after the micro-batch loop
        self.steps, self.outer_steps = with_releases(main, keep), with_releases(outer, keep)
        # 64-bit integers live as 32-bit on the device (enableSupportedDataTypeCasting): an op's
        # output wraps as the device's copy would
        cast = bool(getattr(ir.options, "enableSupportedDataTypeCasting", True))
        self.narrow = {tid: torch.int32 for tid, t in ir.tensors.items()
                       if cast and t.info.data_type() in ("INT64", "UINT64")}
        self._main, self._outer = self._prepare(self.steps), self._prepare(self.outer_steps)
        #: (geometry, torch threads) -> whether a load-adaptive step's results are the same on one
        #: thread and on torch's threads (:meth:`_probe_threads`; shared by the process's executors)
        self._invariant: dict = _THREAD_INVARIANT
        #: per replica: variable id -> tensor (the replica's copy on the device)
        self.reps: list[dict] = [{} for _ in range(self.replicas)]
        self.set_weights(weights)
        # the optimizer scalars are variables too (optimizerFromHost writes them), and so is the
        # random seed (randomSeedFromHost: broadcast, every replica draws the same numbers)
        for tid in [*ir.optimizer_tensors, *([ir.random_seed] if ir.random_seed else [])]:
            t = ir.tensors[tid]
            if t.value is not None:
                self.set_weights({tid: t.value})

    def _half_partials(self, target) -> dict:
        """Index in ``ir.ops`` -> contraction block of the float16 MatMul / Gemm ops whose plan
        uses half partials (:mod:`openipu.popart.half_partials`; needs the session's
        ``target``, else none). Not with stochastic rounding (those ops keep the float path)."""
        ir = self.ir
        if target is None or self.sr:
            return {}
        found, targets = {}, None
        for i, op in enumerate(ir.ops):
            if (op.domain, op.op_type) not in half_partials.MATMULS or len(op.inputs) < 2 or not all(
                    x and ir.tensors[x].info.data_type() == "FLOAT16" for x in op.inputs[:2]):
                continue
            if half_partials.partials_type(op, ir.options) != "half":
                continue
            targets = targets or half_partials.vgraph_targets(ir, target)
            found[i] = half_partials.block_size(ir, op, half_partials.op_target(targets, op))
        return found

    def _printer(self, op):
        """PrintTensor's print of a value (Poplar's ``PrintTensor`` text under PopART's title),
        as the device program prints at that point of the step."""
        import sys

        from openipu.popart.lowering.graphcore import print_title
        from openipu.popart.tensorinfo import poplar_type
        from openipu.poplar import format_tensor
        title = print_title(op, self.ir)
        ptype = poplar_type(self.ir.tensors[op.inputs[0]].info.data_type(),
                            bool(getattr(self.ir.options, "enableSupportedDataTypeCasting", True)))

        def show(value):
            out = self.out or sys.stdout
            out.write(format_tensor(title, torch_device.to_host(value), ptype) + "\n")
            out.flush()
        return show

    @property
    def weights(self) -> dict:
        """Replica 0's variables (id -> tensor)."""
        return self.reps[0]

    def _tensor(self, value, tid) -> torch.Tensor:
        """A host value (array-like) as the executor's own tensor of ``tid``'s dtype on its
        device (a copy: later changes to ``value`` do not reach it)."""
        a = np.asarray(value)
        if self.device.type != "cpu":     # the copy is the move to the device
            a = np.ascontiguousarray(a) if a.dtype != np.uint64 else a.astype(np.int64)
            t = torch.from_numpy(a if a.flags.writeable else a.copy())     # (torch warns on read-only arrays)
            return t.to(self.device, self.dtype[tid])
        t = torch.from_numpy(np.array(a, copy=True, order="C") if a.dtype != np.uint64 else a.astype(np.int64))
        return t.to(self.dtype[tid]) if t.dtype != self.dtype[tid] else t

    def held(self):
        """``(name, tensor)`` of every tensor the executor holds between runs: the constants,
        each replica's variables."""
        yield from ((f"const {tid}", t) for tid, t in self.consts.items())
        for r, rep in enumerate(self.reps):
            yield from ((f"replica {r} {tid}", t) for tid, t in rep.items())

    def off_device(self) -> list[str]:
        """The names of the held tensors (:meth:`held`) that are not on the executor's device
        (empty when all are): the check the device tests make after a step."""
        return torch_device.misplaced(self.held(), self.device)

    def set_weights(self, weights: dict) -> None:
        """The variables' values from their host copies (``weightsFromHost``, ``optimizerFromHost``),
        broadcast to every replica: copied, so that later changes to the host copies reach the
        device only through another call."""
        for tid, w in weights.items():
            if tid in self.sharded:         # each replica its piece (its global replica's)
                rows = shard_rows(w, self.sharded[tid])
                for r, rep in enumerate(self.reps):
                    rep[tid] = self._tensor(rows[self.offset + r], tid)
                continue
            if tid in self.groups:          # each replica its group's value
                rows = np.asarray(w)
                for r, rep in enumerate(self.reps):
                    rep[tid] = self._tensor(rows[self.groups[tid][r]], tid)
                continue
            t = self._tensor(np.array(w), tid)
            for r, rep in enumerate(self.reps):
                rep[tid] = t if r == 0 else t.clone()

    def get_weight(self, tid: str) -> np.ndarray:
        """A variable's value as the device holds it (``weightsToHost``: replica 0's copy; a
        sharded state: its pieces on every replica, gathered and trimmed to its full shape, a
        collective in a distributed replicated graph: every instance must call it)."""
        if tid in self.sharded:
            shape = self.ir.sharded_state[tid][0]
            every = gcl_instances.gather_replicas(torch.from_numpy(self.local_pieces(tid)), f"weightsToHost {tid}") \
                if self.instances > 1 else torch.from_numpy(self.local_pieces(tid))
            return _numpy(every.reshape(-1)[:int(np.prod(shape))].reshape(shape))
        return _numpy(self.reps[0][tid])

    def local_pieces(self, tid: str) -> np.ndarray:
        """This instance's replicas' pieces of the sharded state ``tid``: ``[replicas, k]``."""
        return np.stack([_numpy(rep[tid]) for rep in self.reps])

    def get_replica_weights(self, tid: str) -> np.ndarray:
        """Every replica's value of a variable, ``[replicas, *shape]``."""
        return np.stack([_numpy(rep[tid]) for rep in self.reps])

    def run(self, inputs: dict, outputs: dict, bps: int) -> None:
        """One step from ``PyStepIO`` buffers: ``bps`` batches from ``inputs`` (id -> array of
        ``[bps, accumulation, replicas]`` micro-batch slices) into the anchor arrays ``outputs``
        by each anchor's return type."""
        per = bps * self.accumulation * self.replicas

        def take(tid, i):
            arr = inputs.get(tid)
            return None if arr is None else arr.reshape(per, -1)[i]

        def put(tid, index, count, value):
            outputs[tid].reshape(count, -1)[index] = value.reshape(-1)
        self._step(take, put, list(outputs), bps)

    def run_callbacks(self, cb, anchors: list, bps: int) -> None:
        """One step from a ``PyStepIOCallback``: each micro-batch's inputs from
        ``input_callback`` (replica by replica), each anchor's value into the array
        ``output_callback`` gives, when the anchor returns it."""
        def take(tid, i):
            data = cb.input_callback(tid, False)
            cb.input_complete_callback(tid)
            return None if data is None else np.asarray(data).reshape(-1)

        def put(tid, index, count, value):
            np.asarray(cb.output_callback(tid)).reshape(-1)[:value.size] = value.reshape(-1)
            cb.output_complete_callback(tid)
        self._step(take, put, anchors, bps)

    def _prepare(self, steps) -> list:
        """``steps`` (``(serial, kernel, attrs, opset, inputs, outputs, special, dead)`` each) as the
        loop of :meth:`_ops` runs them, once per executable: ``(serial, run, dead, step)``,
        ``run(envs)`` the op on every replica's environment (``serial`` None: its host threads
        follow the load, :meth:`_ops`; ``step``: ``(kernel, attrs, inputs, special)``). An op
        without special handling (no collective, float32 compute of half inputs, stochastic
        rounding, printing, 64-bit outputs narrowed, floating-point checks, subgraph inputs or
        allocation check) runs as a closure over its
        resolved kernel function, attributes, input and output ids and output dtypes: nothing of
        it is looked up again per run; the others through :meth:`_one`."""
        prepared = []
        for serial, kernel, attrs, opset, ins, outs, special, dead in steps:
            if type(special) is tuple and special[0] == "conv_grads":
                run = self._conv_grads(kernel, *special[1:])
            elif special == "fused":        # computed with its pair's (conv_grad_pairs)
                def run(envs):
                    pass
            elif special is None and not self.fp_checks and "__outer_names__" not in attrs and \
                    kernel.op_type not in ALLOCATION_CHECKED and not any(o in self.narrow for o in outs):
                run = self._plain(kernel, attrs, opset, ins, outs)
            else:
                def run(envs, k=(kernel, attrs, opset, ins, outs, special)):
                    self._one(*k, envs)
            prepared.append((serial, run, tuple(dead), (kernel, attrs, ins, special)))
        return prepared

    def _plain(self, kernel, attrs, opset, ins, outs):
        """``run(envs)`` of an op without special handling (:meth:`_prepare`): its kernel on each
        environment's inputs, the outputs cast to their IR dtypes; a kernel's failure is the
        ``popart_exception`` naming the op (as :func:`openipu.popart.shapes.call_kernel`'s)."""
        fn, node = kernel.fn, attrs.get("__node__")
        ins, outs = tuple(ins), tuple(outs)
        dts = tuple(self.dtype.get(o) if o else None for o in outs)

        def run(envs):
            for env in envs:
                args = [env[x] if x else None for x in ins]
                try:
                    res = fn(args, attrs, opset)
                except popart_exception:
                    raise
                except Exception as e:
                    if node is None:
                        raise
                    raise kernel_failure(kernel, node, args, e) from e
                for o, v, dt in zip(outs, res, dts):
                    if o:
                        env[o] = v if v.dtype == dt else v.to(dt)
        return run

    def _conv_grads(self, kernel, first, second):
        """``run(envs)`` of a pair of convolution gradients (:func:`conv_grad_pairs`, ``first``
        and ``second`` their IR ops): both from one ``convolution_backward`` call
        (:func:`openipu.popart.onnx_ops.grad.conv_grads`), float32."""
        from openipu.popart.onnx_ops.grad import conv_grads
        data, weights = (first, second) if first.op_type == "ConvDataGrad" else (second, first)
        gy, w, x = data.inputs[0], data.inputs[1], weights.inputs[1]
        dx, dw = data.outputs[0], weights.outputs[0]
        x_shape, w_shape = list(data.attrs["input_shape"]), list(weights.attrs["weights_shape"])
        attrs, node = data.attrs, first.attrs.get("__node__")

        def run(envs):
            for env in envs:
                try:
                    env[dx], env[dw] = conv_grads(env[gy], env[x], env[w], x_shape, w_shape, attrs)
                except Exception as e:
                    if node is None:
                        raise
                    raise kernel_failure(kernel, node, [env[gy], env[first.inputs[1]]], e) from e
        return run

    def _ops(self, prepared, envs) -> None:
        """Run the prepared steps (:meth:`_prepare`) on every replica's environment, each then
        dropping its dead tensors; a ``serial`` step on one host thread (:func:`runs_serially`).
        A load-adaptive step (``serial`` None, :func:`load_adaptive`) runs on torch's threads
        while the host has a core to spare (:func:`host_busy`, read once per call) and its
        results are the same on one thread and on torch's threads (:meth:`_probe_threads`), else
        on one thread: the outputs do not depend on the load."""
        threads = torch.get_num_threads()
        now = threads
        busy = None
        try:
            with torch.no_grad():
                for serial, run, dead, step in prepared:
                    if serial is None:
                        if busy is None:
                            busy = threads == 1 or host_busy()
                        serial = busy or not self._probe_threads(run, step, threads)
                        if now != threads:      # (the probe runs at torch's threads)
                            now = torch.get_num_threads()
                    want = 1 if serial else threads
                    if want != now:
                        torch.set_num_threads(want)
                        now = want
                    run(envs)
                    if dead:
                        for env in envs:
                            for t in dead:
                                env.pop(t, None)
        finally:
            if now != threads:
                torch.set_num_threads(threads)

    def _probe_threads(self, run, step, threads: int) -> bool:
        """Whether the prepared step ``run`` (``step``: its ``(kernel, attrs, inputs, special)``,
        :meth:`_prepare`) gives the same bits on one host thread as on ``threads``: run once on
        each on random inputs of its shapes (a fixed seed), once per geometry and thread count
        (the first time the step may run on torch's threads). The kernels' reduction order is a
        function of the shapes and the thread count, not of the values, so random inputs tell
        whether it changes (oneDNN's weights gradient splits the batch over its threads at some
        shapes: 8 x 64 x 32 x 32, 3 x 3 on 2 threads, 2026-11-30)."""
        kernel, attrs, ins, special = step
        if type(special) is tuple and special[0] == "conv_grads":
            ins = [*special[1].inputs, *special[2].inputs]
            attrs = {**special[2].attrs, **special[1].attrs, "__pair__": special[2].op_type}
        ins = [x for x in dict.fromkeys(ins) if x]
        shapes = [(x, tuple(int(d) for d in self.ir.tensors[x].info.shape()), self.dtype[x]) for x in ins]
        key = (kernel.op_type, repr(sorted((k, repr(v)) for k, v in attrs.items() if k != "__node__")),
               tuple((s, d) for _, s, d in shapes), threads)
        if key not in self._invariant:
            g = torch.Generator().manual_seed(0x5EED)
            env = {x: torch.randn(s, generator=g).to(d) for x, s, d in shapes}
            results = []
            try:
                for n in (1, threads):
                    torch.set_num_threads(n)
                    e = dict(env)
                    run([e])
                    results.append({k: v for k, v in e.items() if k not in env})
            except Exception:       # (the step's own run reports a real failure)
                results = [{}, {None: None}]
            finally:
                torch.set_num_threads(threads)
            a, b = results
            self._invariant[key] = a.keys() == b.keys() and all(_same_bits(a[k], b[k]) for k in a)
        return self._invariant[key]

    def _one(self, kernel, attrs, opset, ins, outs, special, envs) -> None:
        """One step with special handling on every replica's environment."""
        if special == "collective":
            self._collective(kernel.op_type, attrs, ins, outs, envs)
        elif special == "abort":      # Poplar's Abort / AbortOnCondition (any replica)
            if not (ins and ins[0]) or any(bool(env[ins[0]].any()) for env in envs):
                raise poplar.application_runtime_error("Abort op")
        else:
            self._op(kernel, attrs, opset, ins, outs, special, envs)

    def _op(self, kernel, attrs, opset, ins, outs, special, envs) -> None:
        """One op on every replica's environment."""
        for env in envs:
            args = [env[x] if x else None for x in ins]
            if special in ("float", "sr"):  # float32 compute, rounded once below
                args = [a.float() if a is not None and a.dtype == torch.float16 else a for a in args]
            if special == "view":           # a Transpose read only by matmuls (transpose_views)
                res = [transpose_view(args[0], attrs)]
            elif type(special) is tuple:      # ("half", block): half partial sums (half_partials)
                res = [half_partials.gemm(args, attrs, special[1]) if kernel.op_type == "Gemm" else
                       half_partials.matmul(args[0], args[1], special[1])]
            elif special == "sr" and kernel.op_type == "Cast" and args[0].is_floating_point():
                res = [args[0].float()]     # the cast to float16 is the stochastic rounding below
            else:
                res = call_kernel(kernel, args, attrs, opset)
            if special == "in_place":       # GetRandomSeed: the seed variable advances
                res = [env[ins[0]].copy_(res[0])]
            elif callable(special) and env is envs[0]:     # PrintTensor: replica 0 prints
                special(res[0])
            for o, v in zip(outs, res):
                if o:
                    if self._move and v.device != self.device:  # a kernel without inputs made a CPU tensor
                        v = v.to(self.device)
                    if o in self.narrow:
                        v = v.to(self.narrow[o])
                    if self.sr and self.dtype[o] == torch.float16 and v.dtype == torch.float32 and \
                            special in ("float", "sr"):
                        v = fp_behaviour.stochastic_round_half(v, self.sr_gen)    # (on v's device)
                    env[o] = v if v.dtype == self.dtype[o] else v.to(self.dtype[o])
            if self.fp_checks:
                fp_behaviour.check_finite(kernel.op_type, outs[0] if outs else "", args, [env[o] for o in outs if o])

    def _collective(self, op_type, attrs, ins, outs, envs) -> None:
        """A cross-replica op (``gcl``): an all-reduce in place into every replica's input
        (``ReplicatedAllReduceInplace``) or as each replica's output; a reduce-scatter (the
        flattened inputs of a group of ``p`` replicas reduced in gcl's ring order, zero-padded to
        ``p`` pieces of ``ceil(n / p)``, piece ``q`` to the group's ``q``-th replica); an all-gather
        (the group's pieces in order, trimmed and shaped as the output); ``ReplicaSlice`` (the
        replica's piece of its own input, by its place in its group). The groups are those of the
        op's ``commGroup`` attribute (all replicas when absent). In a distributed replicated graph
        the replicas are global: the reductions fold over every instance's replicas (a chain over
        the instances, bit-identical to one process's fold) and the all-gather gathers every
        instance's pieces; groups smaller than all replicas are not supported there (raises
        ``poplar_error``)."""
        rf = len(envs)
        out = outs[0]
        n, offset, total = self.instances, self.offset, self.global_replicas
        span = (offset, rf) if n > 1 else None
        # across instances the values travel through gloo, which takes CPU tensors: a non-CPU
        # device's values go through the host there (within one process they stay on the device)
        xs = [env[ins[0]] if span is None else torch_device.to_host(env[ins[0]]) for env in envs]
        if op_type in ("ReplicatedAllGather", "ReplicatedReduceScatter", "ReplicaSlice"):
            self._piece_collective(op_type, attrs, out, envs, xs, span)
            return
        rop = str(attrs.get("op", "Add"))
        # the replica groups (attribute commGroup: a grouped weight's gradient reduces in its
        # groups), over every instance's replicas: gcl's fold, a chain over the instances
        groups = np.asarray(comm_groups(attrs.get("commGroup"), total), np.int64)
        group_of = np.empty(rf * n, np.int64)
        for g, members in enumerate(groups):
            group_of[members] = g
        red = gcl._reduce_groups(torch.stack(xs), groups, _COLLECTIVE_OP[rop], span, f"{op_type} {out}")
        for r, env in enumerate(envs):
            value = red[int(group_of[offset + r])]
            if op_type == "ReplicatedAllReduceInplace":
                env[out] = env[ins[0]].copy_(value)
            else:
                env[out] = value.to(self.device, self.dtype[out])

    def _piece_collective(self, op_type, attrs, out, envs, xs, span) -> None:
        """A reduce-scatter, all-gather or ``ReplicaSlice`` of this instance's replicas (``envs``,
        their inputs ``xs``) within the groups of the op's ``commGroup`` (see :meth:`_collective`)."""
        offset, total = self.offset, self.global_replicas
        what = f"{op_type} {out}"
        groups = np.asarray(comm_groups(attrs.get("commGroup"), total), np.int64)
        p = groups.shape[1]
        if span is not None and p != total:
            raise poplar.poplar_error(f"{what}: replica groups of {p} in a distributed replicated graph of {total} "
                                      "replicas are not supported")
        group_of, place = np.empty(total, np.int64), np.empty(total, np.int64)
        for g, members in enumerate(groups):
            group_of[members], place[members] = g, np.arange(p)
        if op_type == "ReplicatedAllGather":
            local = torch.stack([x.reshape(-1) for x in xs])
            rows = (gcl_instances.gather_replicas(local, what) if span is not None else local).reshape(total, -1)
            shape = self.ir.tensors[out].info.shape()
            for r, env in enumerate(envs):
                full = rows[torch.from_numpy(groups[group_of[offset + r]]).to(rows.device)].reshape(-1)
                env[out] = full[:int(np.prod(shape))].reshape(shape).to(self.device, self.dtype[out])
            return
        size = xs[0].numel()
        k = -(-size // p)
        red = None
        if op_type == "ReplicatedReduceScatter":     # within each group, in gcl's ring order
            red = gcl._reduce_groups(torch.stack(xs), groups, _COLLECTIVE_OP[str(attrs.get("op", "Add"))], span, what)
        for r, (env, x) in enumerate(zip(envs, xs)):
            src = x if red is None else red[int(group_of[offset + r])]
            flat = torch.cat([src.reshape(-1), src.new_zeros(p * k - size)])
            q = int(place[offset + r])
            env[out] = flat[q * k:(q + 1) * k].to(self.device, self.dtype[out]).clone()

    def _step(self, take, put, anchors: list, bps: int) -> None:
        if pvti.enabled():      # the host copies as the System Analyser shows Poplar's stream copies
            take, put = _traced(take, "StreamCopy host->IPU"), _traced(put, "StreamCopy IPU->host")
        ir = self.ir
        flow = ir.data_flow
        alias = getattr(ir, "anchor_alias", {})
        af, rf = self.accumulation, self.replicas
        sums: dict = {}
        envs: list = []
        for b in range(bps):
            for m in range(af):
                envs = [{**self.consts, **rep} for rep in self.reps]
                for r, env in enumerate(envs):
                    for tid in ir.stream_inputs:
                        if tid not in ir.tensors:
                            continue
                        flat = take(tid, (b * af + m) * rf + r)
                        if flat is None:
                            continue
                        env[tid] = self._tensor(np.asarray(flat).reshape(ir.tensors[tid].info.shape()), tid)
                self._ops(self._main, envs)
                for tid in anchors:
                    art = flow.art(tid)
                    kind = art.id()
                    for r, env in enumerate(envs):
                        v = env[alias.get(tid, tid)]
                        if kind == AnchorReturnTypeId.All:
                            put(tid, (b * af + m) * rf + r, bps * af * rf, _numpy(v))
                        elif kind == AnchorReturnTypeId.EveryN:
                            if (b + 1) % art.rp() == 0:
                                put(tid, ((b + 1) // art.rp() - 1) * af * rf + m * rf + r,
                                    bps // art.rp() * af * rf, _numpy(v))
                        elif kind == AnchorReturnTypeId.Sum:
                            key = (tid, r)
                            sums[key] = v.clone() if key not in sums else sums[key] + v
            if self.outer_steps:
                self._ops(self._outer, envs)
        for tid in anchors:
            if flow.art(tid).id() == AnchorReturnTypeId.Final:
                for r, env in enumerate(envs):
                    put(tid, r, rf, _numpy(env[alias.get(tid, tid)]))
        for (tid, r), v in sums.items():
            put(tid, r, rf, _numpy(v))


def _traced(fn, what: str):
    """``fn(tid, ...)`` inside a PopVision trace span named ``<what> <tid>`` (category ``stream``)."""
    def traced(tid, *args):
        with pvti.span(f"{what} {tid}", "stream"):
            return fn(tid, *args)
    return traced


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (NaN payloads and signed zeros included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point() and a.element_size() in (2, 4, 8):
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return torch.equal(a, b)


def _numpy(v: torch.Tensor) -> np.ndarray:
    """A tensor of the executor as a numpy array on the host (the host boundary's one copy off
    a non-CPU device; bfloat16 as float32)."""
    v = torch_device.to_host(v)
    if v.dtype == torch.bfloat16:
        return v.float().numpy()
    return v.numpy()
