"""Sequence and optional values on the host: a sequence is a Python list of tensors, an absent
optional is ``None``."""

from __future__ import annotations

import torch

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import norm_axis, opt, scalar


def _pos(p, n, insert=False):
    if p is None:
        return n if insert else n - 1
    i = int(scalar(p))
    i = i + n if i < 0 else i
    if not 0 <= i <= (n if insert else n - 1):
        raise OnnxKernelError(f"sequence position {int(scalar(p))} out of range for length {n}")
    return i


@onnx_op("SequenceEmpty")
def sequence_empty(inputs, attrs, opset):
    return [[]]


@onnx_op("SequenceConstruct")
def sequence_construct(inputs, attrs, opset):
    return [list(inputs)]


@onnx_op("SequenceAt")
def sequence_at(inputs, attrs, opset):
    s = inputs[0]
    return [s[_pos(inputs[1], len(s))]]


@onnx_op("SequenceInsert")
def sequence_insert(inputs, attrs, opset):
    s = list(inputs[0])
    s.insert(_pos(opt(inputs, 2), len(s), insert=True), inputs[1])
    return [s]


@onnx_op("SequenceErase")
def sequence_erase(inputs, attrs, opset):
    s = list(inputs[0])
    del s[_pos(opt(inputs, 1), len(s))]
    return [s]


@onnx_op("SequenceLength")
def sequence_length(inputs, attrs, opset):
    # a sequence holds no device of its own: its first tensor's, else the CPU
    dev = inputs[0][0].device if len(inputs[0]) and isinstance(inputs[0][0], torch.Tensor) else None
    return [torch.tensor(len(inputs[0]), dtype=torch.int64, device=dev)]


@onnx_op("SplitToSequence")
def split_to_sequence(inputs, attrs, opset):
    x, split = inputs[0], opt(inputs, 1)
    axis = norm_axis(attrs.get("axis", 0), x.dim(), "SplitToSequence")
    if split is None:
        parts = list(torch.split(x, 1, axis))
        if not attrs.get("keepdims", 1):
            parts = [p.squeeze(axis) for p in parts]
        return [[p.clone() for p in parts]]
    if split.dim() == 0:
        parts = torch.split(x, int(split), axis)
    else:
        parts = torch.split(x, [int(v) for v in split.tolist()], axis)
    return [[p.clone() for p in parts]]


@onnx_op("ConcatFromSequence")
def concat_from_sequence(inputs, attrs, opset):
    s = inputs[0]
    if attrs.get("new_axis", 0):
        axis = norm_axis(attrs["axis"], s[0].dim() + 1, "ConcatFromSequence")
        return [torch.stack(s, axis)]
    return [torch.cat(s, norm_axis(attrs["axis"], s[0].dim(), "ConcatFromSequence"))]


@onnx_op("Optional")
def optional(inputs, attrs, opset):
    return [inputs[0] if inputs else None]


@onnx_op("OptionalHasElement")
def optional_has_element(inputs, attrs, opset):
    # no device to follow (an empty optional): a CPU tensor, which the IR executor moves
    return [torch.tensor(bool(inputs) and inputs[0] is not None, device="cpu")]


@onnx_op("OptionalGetElement")
def optional_get_element(inputs, attrs, opset):
    if inputs[0] is None:
        raise OnnxKernelError("OptionalGetElement: the optional is empty")
    return [inputs[0]]


@onnx_op("SequenceMap")
def sequence_map(inputs, attrs, opset):
    from openipu.popart.onnx_ops._reference import run_graph
    body = attrs["body"]
    opsets = attrs.get("__opsets__") or {"": opset}
    outer = attrs.get("__outer__") or {}
    seqs = [i for i in inputs if isinstance(i, list)]
    n = len(seqs[0])
    outs = [[] for _ in body.output]
    for k in range(n):
        vals = [i[k] if isinstance(i, list) else i for i in inputs]
        env = {vi.name: v for vi, v in zip(body.input, vals)}
        for j, o in enumerate(run_graph(body, env, opsets, outer)):
            outs[j].append(o)
    return outs
