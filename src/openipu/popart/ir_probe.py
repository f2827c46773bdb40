"""Output shapes of an op found by running its host kernel on zeros or on shape-only (``meta``)
tensors: the IR's check of each generically lowered op (step 8 of :mod:`openipu.popart.ir`) and
its probe of ops ONNX shape inference gives no shape for."""

from __future__ import annotations

import torch

from openipu.popart.shapes import KERNEL_TORCH_OF, call_kernel, probe, zeros

#: ops whose inputs have up to this many elements are checked on real zeros (which torch checks
#: more strictly); larger ones on shape-only (``meta``) tensors
PROBE_ELEMENTS_LIMIT = 1 << 20


def kernel_output_shapes(kernel, op, ins, device_value) -> list | None:
    """Output shapes of ``kernel`` for ``op``'s inputs (IR tensors or None), constants given as
    ``device_value(t)``: run on zeros when the inputs are small, else (or if that fails) on
    ``meta`` tensors (constants as values, then as meta tensors too). ``None`` when the kernel
    cannot be run this way."""
    attrs = {k: v for k, v in op.attrs.items() if k != "__node__"}   # plain kernel errors here

    def run(const_as_values: bool, device: str, fill: str = "zeros"):
        vals = []
        for t in ins:
            if t is None:
                vals.append(None)
            elif t.kind == "Const" and const_as_values:
                vals.append(device_value(t))
            elif device == "meta":
                dt = KERNEL_TORCH_OF.get(t.info.data_type(), torch.float32)
                vals.append(torch.empty(t.info.shape(), dtype=dt, device="meta"))
            else:
                vals.append(zeros(t.info.data_type(), t.info.shape(), fill))
        with torch.no_grad():
            outs = call_kernel(kernel, vals, attrs, op.opset)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise TypeError("sequence outputs")
        return [list(o.shape) for o in outs]

    if sum(t.info.nelms() for t in ins if t is not None and t.kind != "Const") <= PROBE_ELEMENTS_LIMIT:
        try:
            first = run(True, "cpu")
            # an output shape that follows the values of non-constant inputs (a Reshape by a
            # computed shape ...) is the run's to check, not this one's
            if any(t is not None and t.kind != "Const" for t in ins) and run(True, "cpu", "arange") != first:
                return None
            return first
        except Exception:  # noqa: BLE001 - zeros may be refused (as indices, shapes ...): try meta
            pass
    for const_as_values in (True, False):
        try:
            return run(const_as_values, "meta")
        except Exception:  # noqa: BLE001 - kernels that read values cannot run shape-only
            pass
    return None


def meta_probe(kernel, ins, in_infos, attrs, opset, const_values) -> list | None:
    """:func:`openipu.popart.shapes.probe` on shape-only (``meta``) tensors when the non-constant
    inputs hold more than :data:`PROBE_ELEMENTS_LIMIT` elements (constants as values, then as meta
    tensors too), so that no kernel computes on real-size zeros to learn a shape; ``None`` for
    small inputs or when the kernel cannot run shape-only (it reads values: the caller probes on
    values)."""
    if sum(t.info.nelms() for t, c in zip(ins, const_values) if t is not None and c is None) <= PROBE_ELEMENTS_LIMIT:
        return None
    for consts in (const_values, None):
        try:
            return probe(kernel, in_infos, attrs, opset, consts, fill="meta")
        except Exception:  # noqa: BLE001 - kernels that read values cannot run shape-only
            pass
    return None
