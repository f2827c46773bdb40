"""Virtual graphs and pipeline stages of the IR's ops (PopART's ``virtualGraphMode``:
Off, Manual from the builder's ``virtualGraph`` / ``pipelineStage`` annotations, Auto)."""

from __future__ import annotations

import numpy as np

from openipu.popart.builder import PIPELINE_ATTR, VGRAPH_ATTR
from openipu.popart.errors import popart_exception
from openipu.popart.log import log
from openipu.popart.options import VirtualGraphMode


def apply(ir) -> None:
    """Set each op's ``pipeline_stage`` and ``vgraph`` from its annotations
    (``VirtualGraphMode.Manual``: all ops annotated or none, ids within the device's virtual
    graphs), or by :func:`_auto` (``VirtualGraphMode.Auto``). Raises ``popart_exception`` as
    PopART does."""
    mode = ir.options.virtualGraphMode
    for op in ir.ops:
        ann = op.annotations
        if PIPELINE_ATTR in ann:
            op.pipeline_stage = int(ann[PIPELINE_ATTR])
        if mode == VirtualGraphMode.Manual and VGRAPH_ATTR in ann:
            op.vgraph = int(ann[VGRAPH_ATTR])
    if mode == VirtualGraphMode.Manual:
        have = [op for op in ir.ops if op.vgraph is not None]
        if not have:
            raise popart_exception("SessionOptions flag virtualGraphMode is Manual, but no Ops have been annotated "
                                   "with virtual graph information. Annotate the ops with builder.virtualGraph, "
                                   "or set virtualGraphMode to VirtualGraphMode.Off")
        if len(have) != len(ir.ops):
            missing = [op.op_type for op in ir.ops if op.vgraph is None][:5]
            raise popart_exception("Either all Ops must have their virtual graph ids set, or none must. "
                                   f"{len(ir.ops) - len(have)} of {len(ir.ops)} ops have none (e.g. "
                                   f"{', '.join(missing)}).")
        for op in have:
            if not 0 <= op.vgraph < ir.num_vgraphs:
                raise popart_exception(
                    f"Op {op.op_type} ('{op.name}') has virtual graph id {op.vgraph}, but the device has only "
                    f"{ir.num_vgraphs} virtual graph(s) (IPUs / replication factor). Acquire more IPUs")
    elif mode == VirtualGraphMode.Auto:
        _auto(ir)
    elif mode not in (VirtualGraphMode.Off,):
        log("ir").warning("virtualGraphMode %s is not supported by openipu inference sessions; running as Off",
                          mode)

def _auto(ir) -> None:
    """``VirtualGraphMode.Auto``: cut the op list (topological order) into ``num_vgraphs``
    contiguous shards of about equal memory (bytes of the weights an op reads plus bytes of
    its outputs), or in ``virtualGraphSplitRatios`` if set. A tensor used on another shard is
    copied over the IPU-Links by the lowering. [A]: PopART's own Auto split is a cost-based
    graph partition; this is a memory-balanced contiguous split."""
    n = ir.num_vgraphs
    ratios = [float(r) for r in (ir.options.virtualGraphSplitRatios or [])]
    if ratios and len(ratios) != n:
        raise popart_exception(f"virtualGraphSplitRatios has {len(ratios)} entries but there are {n} virtual "
                               "graphs. Give one ratio per IPU, or leave it empty")
    ratios = np.asarray(ratios or [1.0] * n, np.float64)
    fwd = [op for op in ir.ops if op.grad_of is None and not op.modifies]
    cost = np.zeros(len(fwd))
    for i, op in enumerate(fwd):
        w = sum(ir.tensors[x].info.nbytes() for x in op.inputs if x and ir.tensors[x].kind in ("Const", "Variable"))
        cost[i] = w + sum(ir.tensors[x].info.nbytes() for x in op.outputs if x in ir.tensors)
    cum = np.cumsum(cost) - cost / 2
    bounds = np.cumsum(ratios / ratios.sum())[:-1] * (cost.sum() or 1.0)
    for op, vg in zip(fwd, np.searchsorted(bounds, cum, side="right")):
        op.vgraph = int(min(vg, n - 1))
    for op in ir.ops:         # gradient and update ops run where their forward op does
        if op.grad_of is not None:
            op.vgraph = op.grad_of.vgraph
