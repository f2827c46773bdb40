"""Control flow (If, Loop, Scan) on the host: subgraphs run through the reference executor.

The kernels read ``attrs["__opsets__"]`` (the model's opsets, default ``{"": opset}``) and
``attrs["__outer__"]`` (values of enclosing scopes that the subgraph may reference). The
subgraphs run on the device of the op's tensors (inputs, then enclosing-scope values; the CPU
when there are none): their initializers and the values their nodes make are moved there."""

from __future__ import annotations

import torch

from openipu.popart.onnx_ops import onnx_op
from openipu.popart.onnx_ops._common import norm_axis, scalar


def _ctx(attrs, opset):
    return attrs.get("__opsets__") or {"": opset}, attrs.get("__outer__") or {}


def _device(inputs, outer) -> torch.device:
    """The device of the first tensor of ``inputs``, else of the enclosing-scope values, else the CPU."""
    for v in [*inputs, *outer.values()]:
        if isinstance(v, torch.Tensor):
            return v.device
    return torch.device("cpu")


def _run_body(graph, values, opsets, outer, device=None):
    from openipu.popart.onnx_ops._reference import run_graph
    env = {vi.name: v for vi, v in zip(graph.input, values)}
    return run_graph(graph, env, opsets, outer, device=device)


@onnx_op("If")
def if_(inputs, attrs, opset):
    opsets, outer = _ctx(attrs, opset)
    branch = attrs["then_branch"] if bool(scalar(inputs[0])) else attrs["else_branch"]
    return _run_body(branch, [], opsets, outer, _device(inputs, outer))


@onnx_op("Loop")
def loop(inputs, attrs, opset):
    opsets, outer = _ctx(attrs, opset)
    body = attrs["body"]
    m = inputs[0] if inputs else None
    cond = inputs[1] if len(inputs) > 1 else None
    carried = list(inputs[2:])
    n_carried = len(carried)
    max_trip = int(scalar(m)) if m is not None else None
    keep_going = bool(scalar(cond)) if cond is not None else True
    dev = _device(inputs, outer)
    scans: list[list] = []
    i = 0
    while keep_going and (max_trip is None or i < max_trip):
        outs = _run_body(body, [torch.tensor(i, dtype=torch.int64, device=dev),
                                torch.tensor(keep_going, device=dev)] + carried, opsets, outer, dev)
        keep_going = bool(scalar(outs[0])) if cond is not None or outs[0] is not None else True
        carried = list(outs[1:1 + n_carried])
        for j, s in enumerate(outs[1 + n_carried:]):
            if len(scans) <= j:
                scans.append([])
            scans[j].append(s)
        i += 1
    n_scan = len(body.output) - 1 - n_carried
    stacked = []
    for j in range(n_scan):
        if j < len(scans) and scans[j]:
            stacked.append(torch.stack(scans[j]) if isinstance(scans[j][0], torch.Tensor)
                           else scans[j])
        else:
            stacked.append(torch.zeros((0,), dtype=torch.float32, device=dev))
    return carried + stacked


@onnx_op("Scan")
def scan(inputs, attrs, opset):
    if opset < 9:
        return _scan8(inputs, attrs, opset)
    opsets, outer = _ctx(attrs, opset)
    body = attrs["body"]
    m = attrs["num_scan_inputs"]
    n = len(inputs) - m
    states, xs = list(inputs[:n]), list(inputs[n:])
    in_axes = list(attrs.get("scan_input_axes") or [0] * m)
    in_dirs = list(attrs.get("scan_input_directions") or [0] * m)
    n_out = len(body.output) - n
    out_axes = list(attrs.get("scan_output_axes") or [0] * n_out)
    out_dirs = list(attrs.get("scan_output_directions") or [0] * n_out)
    xs = [x.movedim(norm_axis(a, x.dim(), "Scan"), 0) for x, a in zip(xs, in_axes)]
    xs = [x.flip(0) if d else x for x, d in zip(xs, in_dirs)]
    T = xs[0].shape[0] if xs else 0
    dev = _device(inputs, outer)
    ys: list[list] = [[] for _ in range(n_out)]
    for t in range(T):
        outs = _run_body(body, states + [x[t] for x in xs], opsets, outer, dev)
        states = list(outs[:n])
        for j, y in enumerate(outs[n:]):
            ys[j].append(y)
    results = []
    for j in range(n_out):
        y = torch.stack(ys[j]) if ys[j] else torch.zeros((0,), device=dev)
        if out_dirs[j]:
            y = y.flip(0)
        results.append(y.movedim(0, norm_axis(out_axes[j], y.dim(), "Scan")).contiguous())
    return states + results


def _scan8(inputs, attrs, opset):
    """Scan-8: leading optional sequence_lens, batch axis 0 on states and scan inputs."""
    lens, rest = inputs[0], list(inputs[1:])
    m = attrs["num_scan_inputs"]
    n = len(rest) - m
    dirs = list(attrs.get("directions") or [0] * m)
    a9 = dict(attrs, scan_input_directions=dirs)
    a9.pop("directions", None)
    batch = rest[0].shape[0]
    per = []
    for b in range(batch):
        xs = [x[b] for x in rest[n:]]
        if lens is not None:
            xs = [x[:int(lens[b])] for x in xs]
        per.append(scan([s[b] for s in rest[:n]] + xs, a9, 9))
    return [torch.stack([p[j] for p in per]) for j in range(len(per[0]))]
