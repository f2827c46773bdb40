"""The IR executor: a session's IR run op by op with whole-tensor host kernels (the fast path).

A PopART session compiles its IR to a Poplar program, and the program gives the prediction (IPU
cycles, tile memory). The outputs need not come from moving every tensor through the simulated
tile memory: the IR's ops have exact whole-tensor semantics (each op's ``onnx_ops`` host kernel,
the same kernel the generic lowering runs inside its vertex group), so running them in the IR's
order on whole torch tensors gives the IPU's outputs at the host cost of the model's arithmetic,
as PyTorch eager would. The device-storage emulation stays the verifying mode (and the only mode
for Poplar-level programs, user codelets and explicit tile mappings).

Scope of this first version (:func:`unsupported` says why a session is not covered, and the
session then runs on the device-storage emulation): inference sessions, one replica, no gradient
accumulation, no pipelining, no random ops, no control-flow subgraphs, buffers given by
``PyStepIO`` (not callbacks). Numerics: each op computes in its IR dtype, as its host kernel does
(float16 stays float16); a precise PopLibs lowering may round differently (poplin accumulates
matmuls in fp32 partials), within the plan's precision.

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
    if ir.training is not None:
        return "training sessions run on the device emulation (not yet on the IR executor)"
    if session.replicationFactor > 1 or int(o.accumulationFactor) > 1:
        return "replication and gradient accumulation"
    if ir.num_stages:
        return "pipelining"
    if ir.random_seed is not None:
        return "random ops (the IPU's random streams come from the device)"
    for op in ir.ops:
        if op.op_type in _CONTROL_FLOW or "__outer_names__" in op.attrs:
            return f"control flow ({op.op_type})"
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

    def _tensor(self, value, tid) -> torch.Tensor:
        a = np.asarray(value)
        t = torch.from_numpy(np.array(a, copy=True, order="C") if a.dtype != np.uint64 else a.astype(np.int64))
        return t.to(self.dtype[tid]) if t.dtype != self.dtype[tid] else t

    def set_weights(self, weights: dict) -> None:
        """The variables' values from their host copies (``weightsFromHost``): copied, so that
        later changes to the host copies reach the device only through another call."""
        self.weights = {tid: self._tensor(np.array(w), tid) for tid, w in weights.items()}

    def run(self, inputs: dict, outputs: dict, bps: int) -> None:
        """One step: ``bps`` batches from ``inputs`` (id -> array of ``bps`` batches) into the
        anchor arrays ``outputs`` by each anchor's return type."""
        ir = self.ir
        flow = ir.data_flow
        sums: dict = {}
        for b in range(bps):
            env = {**self.consts, **self.weights}
            for tid in ir.stream_inputs:
                arr = inputs.get(tid)
                if arr is None:
                    continue
                shape = ir.tensors[tid].info.shape()
                env[tid] = self._tensor(arr.reshape(bps, -1)[b].reshape(shape), tid)
            with torch.no_grad():
                for kernel, attrs, opset, ins, outs in self.steps:
                    res = call_kernel(kernel, [env[x] if x else None for x in ins], attrs, opset)
                    for o, v in zip(outs, res):
                        if o:
                            if o in self.narrow:
                                v = v.to(self.narrow[o])
                            env[o] = v if v.dtype == self.dtype[o] else v.to(self.dtype[o])
            for tid, arr in outputs.items():
                art = flow.art(tid)
                kind = art.id()
                v = env[getattr(ir, "anchor_alias", {}).get(tid, tid)]
                if kind == AnchorReturnTypeId.All:
                    arr.reshape(bps, -1)[b] = _numpy(v).reshape(-1)
                elif kind == AnchorReturnTypeId.EveryN:
                    if (b + 1) % art.rp() == 0:
                        arr.reshape(bps // art.rp(), -1)[(b + 1) // art.rp() - 1] = _numpy(v).reshape(-1)
                elif kind == AnchorReturnTypeId.Final:
                    if b == bps - 1:
                        arr.reshape(-1)[:] = _numpy(v).reshape(-1)
                else:                                       # Sum
                    sums[tid] = v.clone() if b == 0 else sums[tid] + v
        for tid, v in sums.items():
            outputs[tid].reshape(-1)[:] = _numpy(v).reshape(-1)


def _numpy(v: torch.Tensor) -> np.ndarray:
    if v.dtype == torch.bfloat16:
        return v.float().numpy()
    return v.numpy()
