"""Collective ops on one replica's data: ReplicatedReduceScatter (the local shard of a flattened,
padded tensor), ReplicaSlice (a replica's piece of it without the reduction) and
ReplicatedAllGather (the pieces gathered). The replicated executors run them as collectives over
the replicas (``gcl``; the IR executor's ``IrExecutor._collective``); these kernels are the view
of one replica.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops._registry import _gc


@_gc("ReplicatedReduceScatter", flops=lambda i, o, a: float(math.prod(i[0])))
def replicated_reduce_scatter(inputs, attrs, opset):
    """PopART's ``ReplicatedReduceScatter``: the input flattened, reduced over the replicas
    (``op``: Add, Mean, Mul, Min, Max, LogicalAnd, LogicalOr, SquareAdd, Local) and cut into
    ``ceil(n / replicas)``-element pieces, zero-padded, one per replica: ``[ceil(n / replicas)]``.
    ``attrs["__replicas__"]`` is the replication factor (the IR's; 1 by default). One replica:
    the flattened input. On several replicas the session lowers it to ``gcl``'s
    reduce-scatter; this host kernel, which sees one replica's input, gives replica 0's piece
    as if every replica held that input (it serves shape inference)."""
    x = inputs[0].reshape(-1)
    r = max(int(attrs.get("__replicas__", 1)), 1)
    op = str(attrs.get("op", "Add"))
    k = -(-x.numel() // r)
    xw = x if x.is_floating_point() else x.to(torch.int64)
    red = {"Add": xw * r, "Mul": xw ** r, "SquareAdd": xw * xw * r}.get(op, xw) if r > 1 else \
        (xw * xw if op == "SquareAdd" else xw)
    out = torch.zeros(r * k, dtype=red.dtype, device=red.device)
    out[:x.numel()] = red
    return [out[:k].to(x.dtype)]


@_gc("ReplicaSlice")
def replica_slice(inputs, attrs, opset):
    """PopART's ``ReplicaSlice``: replica ``r``'s piece of its flattened input, zero-padded to
    ``replicas`` pieces of ``ceil(n / replicas)`` elements: ``[ceil(n / replicas)]``.
    ``attrs["__replicas__"]``: the (global) replication factor, 1 by default. The replicated
    executors slice at each replica's (global) index; this host kernel, which sees one replica,
    gives replica 0's piece."""
    x = inputs[0].reshape(-1)
    r = max(int(attrs.get("__replicas__", 1)), 1)
    k = -(-x.numel() // r)
    return [x[:k].clone() if x.numel() >= k else torch.cat([x, x.new_zeros(k - x.numel())])]


@_gc("ReplicatedAllGather")
def replicated_all_gather(inputs, attrs, opset):
    """PopART's ``ReplicatedAllGather``: every replica's piece, in replica order, flattened
    (``[replicas * k]``; the op's output is that trimmed and shaped as its output tensor).
    ``attrs["__replicas__"]``: the (global) replication factor, 1 by default. The replicated
    executors gather the replicas' own pieces; this host kernel, which sees one replica, gives
    the gather of ``replicas`` copies of its piece."""
    x = inputs[0].reshape(-1)
    return [x.repeat(max(int(attrs.get("__replicas__", 1)), 1))]
