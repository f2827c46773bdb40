"""The step I/O of a PopART session: the checks of ``PyStepIO`` buffers and ``PyStepIOCallback``
callbacks against the IR (PopART's ``StepIO`` size and type errors, word for word), the connection
of host buffers to the engine's streams, and ``initAnchorArrays``. A mixin of
:class:`openipu.popart.session._SessionBase` (it reads the session's ``_ir``, ``options``,
``_dataflow`` and ``_engine``)."""

from __future__ import annotations

import numpy as np

from openipu.popart.dataflow import AnchorReturnTypeId, anchor_elements, anchor_shape
from openipu.popart.errors import popart_exception, popart_runtime_error
from openipu.popart.log import log
from openipu.popart.stepio import PyStepIO, PyStepIOCallback
from openipu.popart.tensorinfo import dtype_name


class StepIoMixin:
    """``Session`` methods for step I/O (PopART's ``StepIO`` checks and ``initAnchorArrays``)."""

    def _expected_in(self, tid):
        o = self.options
        return self._ir.tensors[tid].info.nelms() * int(o.accumulationFactor) * self._dataflow.batchesPerStep() * \
            int(o.replicatedGraphCount)

    def _size_message(self, tid, what, expected, got, art=None):
        o = self.options
        msg = (f"Unexpected number of {what} elements for Tensor {tid}. Expected {expected}, but received {got}.\n"
               "To disable this check at your own risk, use IStepIO::enableRuntimeAsserts.\nThis with, "
               f"\n   replication  factor = {int(o.replicatedGraphCount)}"
               f"\n   accumulation factor = {int(o.accumulationFactor)}"
               f"\n   batches per step    = {self._dataflow.batchesPerStep()}"
               f"\n   Tensor nelms        = {self._ir.tensors[tid].info.nelms()}")
        if art is not None:
            msg += f"\nThe anchor return type is  {art.str()}"
            if art.id() == AnchorReturnTypeId.EveryN:
                msg += f"\nThe return period is {art.rp()}"
        return msg

    def _check_array(self, tid, arr, what):
        info = self._ir.tensors[tid].info
        if not isinstance(arr, np.ndarray):
            raise popart_exception(f"PyStepIO {what} for tensor '{tid}' must be a numpy array, got "
                                   f"{type(arr).__name__}")
        if not arr.flags["C_CONTIGUOUS"]:
            raise popart_exception(
                f"PyStepIO is unable to use the numpy {what} array for tensor '{tid}' as it is not c-contiguous (a "
                "data conversion here could have a significant impact on performance and hence is not allowed)")
        try:
            user = dtype_name(arr.dtype)
        except popart_exception:
            user = str(arr.dtype).upper()
        if user != info.data_type():
            raise popart_exception(f"Type discrepancy for tensor {tid}. User provided : {user} and expected : "
                                   f"{info.data_type()}. Consider a custom copy here (as memcpy cannot be used)")
        if user in ("INT64", "UINT64") and self.options.enableSupportedDataTypeCasting and not self._warned_int64:
            log("devicex").warning("Tensor %s: %s host data is narrowed to %s32 on the device "
                                   "(enableSupportedDataTypeCasting)", tid, user, user[:-2])
            self._warned_int64 = True

    def _connect_buffers(self, stepio: PyStepIO):
        ir, low, eng = self._ir, self._lowered, self._engine
        for tid in stepio.inputs:
            if tid not in ir.tensors and tid not in ir.onnx_tensor_ids:
                raise popart_runtime_error(
                    f"Testing that the buffer provided by user for input Tensor {tid} has the correct number of "
                    f"elements, But there is no Tensor named {tid} in the Ir's main Graph, and it does not exist in "
                    "the original ONNX Model.")
            if tid not in ir.model_input_ids:
                raise popart_exception(
                    f"The tensor '{tid}' has been provided as one of the inputs to the stepIO, but it is not "
                    "registered as one of the inputs to the model. Please check this tensor and your stepIO.")
        plan = []
        for tid in ir.stream_inputs:
            if tid not in low.inputs:
                if tid in stepio.inputs:
                    log("session").warning(
                        "The input Tensor %s to the ONNX Model does not appear in the optimized PopART Ir, possibly "
                        "due to constant folding. Therefore, the input buffer provided will not be used. ", tid)
                continue
            if tid not in stepio.inputs:
                raise popart_runtime_error(f"No tensor {tid} provided in PyStepIO's inputs")
            arr = stepio.inputs[tid]
            if low.inputs[tid] is not None or not isinstance(arr, np.ndarray):
                # with syntheticDataMode (no host stream) PopART never reads the buffer, so
                # only its element count is checked, not its type or layout
                self._check_array(tid, arr, "input")
            exp = self._expected_in(tid)
            if stepio._runtime_asserts and arr.size != exp:
                raise popart_runtime_error(self._size_message(tid, "input", exp, arr.size))
            if arr.size % max(ir.tensors[tid].info.nelms(), 1) or arr.size == 0 and exp:
                raise popart_runtime_error(self._size_message(tid, "input", exp, arr.size))
            if low.inputs[tid] is not None:
                plan.append((low.inputs[tid], arr))
        bps, repl, accl = self._dataflow.batchesPerStep(), int(self.options.replicatedGraphCount), \
            int(self.options.accumulationFactor)
        for tid in stepio.outputs:
            if tid not in ir.tensors:
                raise popart_runtime_error(
                    f"Testing that the buffer provided by user for output Tensor {tid} has the correct number of "
                    f"elements, But there is no Tensor named {tid} in the Ir's tensors. ")
        for tid, h in low.anchors.items():
            if tid not in stepio.outputs:
                raise popart_runtime_error(f"No tensor {tid} provided in PyStepIO's outputs")
            arr = stepio.outputs[tid]
            self._check_array(tid, arr, "output")
            art = self._dataflow.art(tid)
            exp = anchor_elements(art, ir.tensors[tid].info.nelms(), bps, accl, repl)
            if arr.size != exp:
                raise popart_runtime_error(self._size_message(tid, "output", exp, arr.size, art))
            if not arr.flags["WRITEABLE"]:
                raise popart_exception(f"The output array for anchor '{tid}' is read-only")
            if h is not None:
                plan.append((h, arr))
        for h, arr in plan:
            eng.connectStream(h, arr.reshape(-1))

    def _connect_callbacks(self, cb: PyStepIOCallback):
        eng, low = self._engine, self._lowered

        def make_in(tid):
            def fill(arr):
                data = cb.input_callback(tid, False)
                if data is None:
                    raise popart_runtime_error(f"The input callback for tensor {tid} returned no data")
                arr.reshape(-1)[:] = np.asarray(data).reshape(-1)[:arr.size]
                cb.input_complete_callback(tid)
            return fill

        def make_out(tid):
            def take(arr):
                dst = cb.output_callback(tid)
                np.asarray(dst).reshape(-1)[:arr.size] = arr.reshape(-1)
                cb.output_complete_callback(tid)
            return take

        for tid, h in low.inputs.items():
            if h is not None:
                eng.connectStreamToCallback(h, make_in(tid))
        for tid, h in low.anchors.items():
            if h is not None:
                eng.connectStreamToCallback(h, make_out(tid))

    # -- anchors and info -----------------------------------------------------------------
    def initAnchorArrays(self) -> dict:  # noqa: N802
        """Zeroed numpy arrays for every anchor, shaped by PopART's rule
        (:func:`openipu.popart.dataflow.anchor_shape`)."""
        out = {}
        bps = self._dataflow.batchesPerStep()
        for a in self._dataflow.anchors():
            info = self.getInfo(a)
            shape = anchor_shape(self._dataflow.art(a), info.shape(), bps, self.accumulationFactor,
                                 self.replicationFactor)
            out[a] = np.zeros(shape, dtype=info.numpy_dtype())
        return out
