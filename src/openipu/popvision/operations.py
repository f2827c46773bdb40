"""The Operations view of a report: predicted cycles and memory per ONNX op (PopART op) and
per PopLibs call inside it, as PopVision's Operations Summary shows them.

PopART (openipu's lowering) names what it makes for an op after the op: compute sets, program
steps and variables are called ``<op type>/<first output>`` or ``<op type>/<first output>/<part>``
(``MatMul/h/Conv``: the convolution PopLibs plans for the MatMul ``h``; ``MatMul/h`` its output).
An op's name is found as the longest such prefix that is itself the name of a variable or
compute set; ``<part>`` (its first path component) is the PopLibs call. Steps with no op in their
name are grouped as "(copies)" (tensor copies, on tile or over exchange), "(host I/O)" and
"(other steps)". Cycles are predicted
IPU cycles of the report's first run: each step's cycles on its busiest IPU times the number of
times it ran; memory is the bytes of the op's variables over all tiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_NO_OP = {"StreamCopyMid": "(host I/O)", "DoExchange": "(copies)"}
#: The row of the variables no op's name claims: weights, inputs, buffers of the framework.
_OTHER_VARIABLES = "(weights, inputs and other variables)"


@dataclass
class Operation:
    """One op of the report. ``name`` (``MatMul/h``), ``type`` (``MatMul``); predicted IPU
    cycles of the first run: ``cycles`` (all categories), ``compute_cycles``,
    ``exchange_cycles`` (on-IPU, IPU-Link and host exchange); ``steps`` (program steps it owns),
    ``executions`` (times they ran), ``variable_bytes`` (bytes over all tiles of its variables),
    ``flops`` (per run) and ``calls``: {PopLibs call: {"cycles": c, "steps": n}}."""

    name: str
    type: str
    cycles: float = 0.0
    compute_cycles: float = 0.0
    exchange_cycles: float = 0.0
    steps: int = 0
    executions: int = 0
    variable_bytes: int = 0
    flops: float = 0.0
    calls: dict = field(default_factory=dict)


def _op_of(name: str, known: set) -> tuple[str, str] | None:
    """``(op name, PopLibs call)`` of a step, compute set or variable name, or None for a name
    that is not ``<op type>/...``: its longest proper prefix of two or more components that is
    itself a known name (``MatMul/h`` of ``MatMul/h/Conv``), else the whole name (``Relu/r``)."""
    if "/" not in name or name.startswith("/"):
        return None
    parts = name.split("/")
    for k in range(len(parts) - 1, 1, -1):
        prefix = "/".join(parts[:k])
        if prefix in known:
            return prefix, parts[k]
    return name, ""


def operations(report) -> list[Operation]:
    """The ops of ``report`` (a :class:`~openipu.popvision.report.Report`), most predicted
    cycles first. Without a run, cycles count each step once (a compile-only profile)."""
    c = report.compilation
    known = {v.name for v in c.variables} | {cs.name for cs in c.computeSets}
    steps = report._data["steps"]
    cyc = c.stepCycles()
    n = len(steps)
    total = sum(cyc.values())
    busiest = total.max(axis=1) if total.size else np.zeros(n)
    comp = cyc["compute"].max(axis=1) if n else np.zeros(n)
    exch = (cyc["exchange"] + cyc["global_exchange"] + cyc["host_exchange"]).max(axis=1) if n else np.zeros(n)
    runs = report.execution.runs
    counts = runs[0].programCounts if runs else np.ones(n, np.int64)
    ops: dict = {}
    for idx, ty, name, _, flops, _ in steps:
        hit = None if ty == "StreamCopyMid" else _op_of(name or "", known)     # host I/O names a stream
        if hit is None:
            key = _NO_OP.get(ty, "(copies)" if name == "Copy" else "(other steps)")
            call, op_type = ty, ""
        else:
            key, call = hit
            op_type = key.split("/")[0]
        op = ops.get(key)
        if op is None:
            op = ops[key] = Operation(key, op_type)
        k = int(counts[idx]) if idx < len(counts) else 0
        op.steps += 1
        op.executions += k
        op.cycles += k * float(busiest[idx])
        op.compute_cycles += k * float(comp[idx])
        op.exchange_cycles += k * float(exch[idx])
        op.flops += k * float(flops or 0.0)
        entry = op.calls.setdefault(call or "(op)", {"cycles": 0.0, "steps": 0})
        entry["cycles"] += k * float(busiest[idx])
        entry["steps"] += 1
    for v in c.variables:
        hit = _op_of(v.name, known)
        key = hit[0] if hit is not None and hit[0] in ops else _OTHER_VARIABLES
        if key not in ops:
            ops[key] = Operation(key, "")
        ops[key].variable_bytes += v.size
    return sorted(ops.values(), key=lambda o: (-o.cycles, o.name))
