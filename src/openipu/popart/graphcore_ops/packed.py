"""PackedDataBlock: runs a callback subgraph on packed sequences unpacked to fixed lengths."""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops._registry import _gc, _ints


def _packed_flops(i, o, a):
    return 4.0 * sum(math.prod(s) for s in i)


@_gc("PackedDataBlock", flops=_packed_flops)
def packed_data_block(inputs, attrs, opset):
    """PopART's ``PackedDataBlock`` (``aiGraphcore.packedDataBlock``): ``[data_0, offsets_0,
    lengths_0, ..., data_N, offsets_N, lengths_N, resultOffsets, resultLengths]``. Sequence ``j``
    of data input ``i`` is ``data_i[offsets_i[j] : + lengths_i[j]]``, zero-padded to
    ``maxSequenceLengths[i]``; the ``callback`` graph runs on ``callbackBatchSize`` sequences of
    each input at a time (inputs ``[callbackBatchSize, maxSequenceLengths[i], ...]``), and row
    ``k < resultLengths[j]`` of its output for sequence ``j`` goes to row ``resultOffsets[j] +
    k`` of the result, ``[resultSize, *out.shape[2:]]``, zeros elsewhere."""
    from openipu.popart.onnx_ops.control_flow import _ctx, _run_body
    opsets, outer = _ctx(attrs, opset)
    callback = attrs["callback"]
    max_lens = _ints(attrs.get("maxSequenceLengths"))
    size, cbs = int(attrs["resultSize"]), int(attrs.get("callbackBatchSize", 1))
    n_data = (len(inputs) - 2) // 3
    if len(inputs) < 5 or (len(inputs) - 2) % 3 or len(max_lens) != n_data:
        raise ValueError(f"PackedDataBlock: {len(inputs)} inputs and {len(max_lens)} maxSequenceLengths; it takes "
                         "3 inputs (data, offsets, lengths) per maxSequenceLength, then resultOffsets and "
                         "resultLengths")
    unpacked = []
    for i in range(n_data):
        data, off, ln = inputs[3 * i], inputs[3 * i + 1].to(torch.int64), inputs[3 * i + 2].to(torch.int64)
        steps = torch.arange(max_lens[i], device=off.device)
        rows = off.reshape(-1, 1) + steps
        keep = (steps < ln.reshape(-1, 1)) & (rows < data.shape[0])
        seq = data[torch.where(keep, rows, torch.zeros_like(rows))]
        mask = keep.reshape(list(keep.shape) + [1] * (data.dim() - 1))
        unpacked.append(torch.where(mask, seq, torch.zeros((), dtype=data.dtype, device=data.device)))
    n_seq = unpacked[0].shape[0]
    results = [_run_body(callback, [u[k * cbs:(k + 1) * cbs] for u in unpacked], opsets, outer)[0]
               for k in range(n_seq // cbs)]
    r = torch.cat(results) if results else torch.zeros([0, 0], device=inputs[0].device)
    out = torch.zeros([size] + list(r.shape[2:]), dtype=r.dtype, device=r.device)
    r_off, r_len = inputs[-2].to(torch.int64).reshape(-1)[:r.shape[0]], inputs[-1].to(torch.int64).reshape(-1)
    steps = torch.arange(r.shape[1] if r.dim() > 1 else 0, device=r.device)
    dst = r_off.reshape(-1, 1) + steps
    keep = (steps < r_len[:r.shape[0]].reshape(-1, 1)) & (dst < size)
    out[dst[keep]] = r[keep]
    return [out]
