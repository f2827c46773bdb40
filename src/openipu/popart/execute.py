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
weight updates: the update ops' kernels are :mod:`openipu.popart.onnx_ops.varupdate`), one
replica, no gradient accumulation, no pipelining, no random ops, no automatic loss scaling, no
control-flow subgraphs; buffers from ``PyStepIO`` or ``PyStepIOCallback``. Numerics: each op
computes in its IR dtype, as its host kernel does (float16 stays float16); a precise PopLibs
lowering may round differently (poplin accumulates matmuls in fp32 partials), within the plan's
precision. The variables (weights, optimizer state and scalars) live in the executor between runs:
the session's ``weightsFromHost``, ``optimizerFromHost`` and ``weightsToHost`` move them.

Selected with ``OPENIPU_EXECUTION=ir`` (default: ``device``, the emulation); the prediction
comes from the compiled program either way (``Engine.predict_run``).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from openipu.popart.dataflow import AnchorReturnTypeId
from openipu.popart.graphcore_ops import find_kernel
from openipu.popart.shapes import KERNEL_TORCH_OF, call_kernel

#: Control-flow ops (their subgraphs run data-dependently; the prediction's dry run does not follow).
_CONTROL_FLOW = {"If", "Loop", "Scan", "Call", "call"}
#: Ops that act on the host or the program (print, abort) in their lowering, and gradient ops whose
#: host kernel takes another form of inputs than their precise lowering: the device emulation runs
#: sessions holding them.
_DEVICE_ONLY = {"PrintTensor": "PrintTensor (prints from the device program)",
                "Abort": "Abort (stops the device program)",
                "GroupNormalizationGrad": "GroupNormalizationGrad (its host kernel takes the statistics)"}


def mode() -> str:
    """``OPENIPU_EXECUTION``: ``"ir"`` (this executor where it covers a session) or ``"device"``
    (the device-storage emulation; the default). Raises ``ValueError`` for another value."""
    m = os.environ.get("OPENIPU_EXECUTION", "device").strip().lower() or "device"
    if m not in ("ir", "device"):
        raise ValueError(f"OPENIPU_EXECUTION must be 'ir' or 'device', not {m!r}")
    return m


def unsupported(session) -> str | None:
    """Why ``session`` cannot run on the IR executor (``None`` when it can)."""
    ir, o = session._ir, session.options
    if o.enableDistributedReplicatedGraphs and o.getGlobalReplicationFactor() > o.replication_factor():
        return ("replicas in several instances (PopDist): the executor does not call "
                "gcl_instances.all_reduce_replicas yet")
    if session.replicationFactor > 1 or int(o.accumulationFactor) > 1:
        return "replication and gradient accumulation"
    if ir.num_stages:
        return "pipelining"
    if ir.random_seed is not None:
        return "random ops (the IPU's random streams come from the device)"
    if ir.auto_loss_scale or ir.sharded_state:
        return "automatic loss scaling and replicated tensor sharding"
    for op in ir.ops:
        if op.op_type in _CONTROL_FLOW or "__outer_names__" in op.attrs:
            return f"control flow ({op.op_type})"
        if op.op_type in _DEVICE_ONLY:
            return _DEVICE_ONLY[op.op_type]
        if find_kernel(op.domain, op.op_type) is None:
            return f"{op.domain or 'ai.onnx'}.{op.op_type} has no host kernel"
    return None


class IrExecutor:
    """Runs an inference IR's ops in order on whole tensors.

    Args:
        ir: the session's :class:`openipu.popart.ir.Ir`.
        weights: variable id -> host array (the values the device holds).
    """

    def __init__(self, ir, weights: dict):
        self.ir = ir
        self.dtype = {tid: KERNEL_TORCH_OF.get(t.info.data_type(), torch.float32) for tid, t in ir.tensors.items()}
        self.consts = {tid: self._tensor(t.value, tid) for tid, t in ir.tensors.items()
                       if t.kind == "Const" and t.value is not None}
        self.steps = [(find_kernel(op.domain, op.op_type), op.attrs, op.opset, list(op.inputs), list(op.outputs))
                      for op in ir.ops]
        # 64-bit integers live as 32-bit on the device (enableSupportedDataTypeCasting): an op's
        # output wraps as the device's copy would
        cast = bool(getattr(ir.options, "enableSupportedDataTypeCasting", True))
        self.narrow = {tid: torch.int32 for tid, t in ir.tensors.items()
                       if cast and t.info.data_type() in ("INT64", "UINT64")}
        self.weights: dict = {}
        self.set_weights(weights)
        # the optimizer scalars are variables too (optimizerFromHost writes them)
        for tid in ir.optimizer_tensors:
            t = ir.tensors[tid]
            if t.value is not None:
                self.weights[tid] = self._tensor(t.value, tid)

    def _tensor(self, value, tid) -> torch.Tensor:
        a = np.asarray(value)
        t = torch.from_numpy(np.array(a, copy=True, order="C") if a.dtype != np.uint64 else a.astype(np.int64))
        return t.to(self.dtype[tid]) if t.dtype != self.dtype[tid] else t

    def set_weights(self, weights: dict) -> None:
        """The variables' values from their host copies (``weightsFromHost``, ``optimizerFromHost``):
        copied, so that later changes to the host copies reach the device only through another
        call."""
        self.weights.update({tid: self._tensor(np.array(w), tid) for tid, w in weights.items()})

    def get_weight(self, tid: str) -> np.ndarray:
        """A variable's value as the device holds it (``weightsToHost``)."""
        return _numpy(self.weights[tid])

    def run(self, inputs: dict, outputs: dict, bps: int) -> None:
        """One step from ``PyStepIO`` buffers: ``bps`` batches from ``inputs`` (id -> array of
        ``bps`` batches) into the anchor arrays ``outputs`` by each anchor's return type."""
        def take(tid, b):
            arr = inputs.get(tid)
            return None if arr is None else arr.reshape(bps, -1)[b]

        def put(tid, index, count, value):
            outputs[tid].reshape(count, -1)[index] = value.reshape(-1)
        self._step(take, put, list(outputs), bps)

    def run_callbacks(self, cb, anchors: list, bps: int) -> None:
        """One step from a ``PyStepIOCallback``: each batch's inputs from ``input_callback``, each
        anchor's value into the array ``output_callback`` gives, when the anchor returns it."""
        def take(tid, b):
            data = cb.input_callback(tid, False)
            cb.input_complete_callback(tid)
            return None if data is None else np.asarray(data).reshape(-1)

        def put(tid, index, count, value):
            np.asarray(cb.output_callback(tid)).reshape(-1)[:value.size] = value.reshape(-1)
            cb.output_complete_callback(tid)
        self._step(take, put, anchors, bps)

    def _step(self, take, put, anchors: list, bps: int) -> None:
        ir = self.ir
        flow = ir.data_flow
        alias = getattr(ir, "anchor_alias", {})
        sums: dict = {}
        for b in range(bps):
            env = {**self.consts, **self.weights}
            for tid in ir.stream_inputs:
                if tid not in ir.tensors:
                    continue
                flat = take(tid, b)
                if flat is None:
                    continue
                env[tid] = self._tensor(np.asarray(flat).reshape(ir.tensors[tid].info.shape()), tid)
            with torch.no_grad():
                for kernel, attrs, opset, ins, outs in self.steps:
                    res = call_kernel(kernel, [env[x] if x else None for x in ins], attrs, opset)
                    for o, v in zip(outs, res):
                        if o:
                            if o in self.narrow:
                                v = v.to(self.narrow[o])
                            env[o] = v if v.dtype == self.dtype[o] else v.to(self.dtype[o])
            for tid in anchors:
                art = flow.art(tid)
                kind = art.id()
                v = env[alias.get(tid, tid)]
                if kind == AnchorReturnTypeId.All:
                    put(tid, b, bps, _numpy(v))
                elif kind == AnchorReturnTypeId.EveryN:
                    if (b + 1) % art.rp() == 0:
                        put(tid, (b + 1) // art.rp() - 1, bps // art.rp(), _numpy(v))
                elif kind == AnchorReturnTypeId.Final:
                    if b == bps - 1:
                        put(tid, 0, 1, _numpy(v))
                else:                                       # Sum
                    sums[tid] = v.clone() if b == 0 else sums[tid] + v
        for tid, v in sums.items():
            put(tid, 0, 1, _numpy(v))


def _numpy(v: torch.Tensor) -> np.ndarray:
    if v.dtype == torch.bfloat16:
        return v.float().numpy()
    return v.numpy()
