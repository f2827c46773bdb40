"""Cross-instance transport of ``gcl``'s cross-replica collectives (PopDist / ``poprun`` runs).

Under ``poprun`` each program instance (a process) simulates only its *local* replicas; the
replicas of all instances form the *global* replicated graph (PopART's
``enableDistributedReplicatedGraphs`` / ``globalReplicationFactor`` / ``globalReplicaOffset``).
Instance ``i`` holds the global replicas ``[offset, offset + local)``, ``offset = i * local``.

This module is the one place where a collective leaves the process. It runs on
``torch.distributed`` (the gloo backend on CPU), not on a transport of its own:

- :func:`scope` marks a graph construction as part of a distributed replicated graph (the
  PopART session enters it while lowering); :func:`current_scope` is what ``gcl`` reads to build
  its replica groups over the global replicas;
- :func:`reduce_groups` is the hook of the cross-replica *reductions* (all-reduce,
  reduce-scatter): a chain reduce over the instances followed by a broadcast. Instance 0 folds
  its replicas of every group into a partial result and sends it on; instance ``k`` receives the
  partial result of instances ``0..k-1``, folds in its own replicas in ring order and sends it on;
  the last instance broadcasts the finished ``[groups, ...]`` result. Each instance sends and
  receives one tensor of the groups' size (two with the broadcast) however many replicas it holds,
  and the arithmetic is the one-process ring order element for element, so the result is
  bit-identical to one process holding every replica. Groups whose ring order goes back to an
  earlier instance (possible with hand-made replica orders only) use :func:`gather_replicas`;
- :func:`gather_replicas` is the hook of the all-gathers (and the fall-back above): the local
  ``[local, ...]`` values of every instance concatenated into the global ``[global, ...]`` stack,
  the instance keeps its own rows;
- :func:`all_reduce_replicas` is the whole all-reduce on host tensors for executors that do not
  run Poplar kernels: ``[local, ...]`` in, ``[local, ...]`` out;
- :func:`broadcast_tensors_from` overwrites tensors with one instance's values (the weights at
  the start of a distributed run: PopTorch's compile, PopART's ``broadcastWeights``).

The process group is created on first use from PopDist's environment (``poprun`` sets it):
``POPDIST_NUM_INSTANCES``, ``POPDIST_INSTANCE_INDEX``, ``MASTER_ADDR``, ``MASTER_PORT``. A
collective that waits longer than ``POPDIST_COLLECTIVE_TIMEOUT`` seconds (default 300) for the
other instances raises :class:`openipu.poplar.errors.poplar_error` naming the collective and the
instance, so that a dead or hung instance stops the others with a clear message.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import threading
from dataclasses import dataclass

import torch

__all__ = ["Scope", "scope", "current_scope", "num_instances", "instance_index", "timeout_seconds",
           "init_process_group", "gather_replicas", "reduce_groups", "all_reduce_replicas", "broadcast_from_instance0",
           "broadcast_tensors_from"]

#: Default seconds a collective waits for the other instances.
DEFAULT_TIMEOUT_S = 300.0

_local = threading.local()
_lock = threading.Lock()


@dataclass(frozen=True)
class Scope:
    """A distributed replicated graph under construction: ``global_replicas`` replicas in all,
    this instance holding ``[offset, offset + local_replicas)``."""

    global_replicas: int
    offset: int
    local_replicas: int


def num_instances() -> int:
    """``POPDIST_NUM_INSTANCES``, else ``OMPI_COMM_WORLD_SIZE`` (1 outside ``poprun`` / ``mpirun``)."""
    return int(os.environ.get("POPDIST_NUM_INSTANCES") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)


def instance_index() -> int:
    """``POPDIST_INSTANCE_INDEX``, else ``OMPI_COMM_WORLD_RANK`` (0 outside ``poprun`` / ``mpirun``)."""
    return int(os.environ.get("POPDIST_INSTANCE_INDEX") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)


def timeout_seconds() -> float:
    """``POPDIST_COLLECTIVE_TIMEOUT`` in seconds (default :data:`DEFAULT_TIMEOUT_S`)."""
    return float(os.environ.get("POPDIST_COLLECTIVE_TIMEOUT", DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S)


@contextlib.contextmanager
def scope(global_replicas: int, offset: int, local_replicas: int):
    """Graph construction inside this block builds cross-replica collectives over
    ``global_replicas`` replicas, this process holding ``local_replicas`` of them from ``offset``.

    Raises ``poplar_error`` if the numbers do not fit (the local replicas outside the global
    range, or a global count that is not ``local_replicas`` times the number of instances)."""
    from openipu.poplar import errors
    g, o, n = int(global_replicas), int(offset), int(local_replicas)
    if n < 1 or o < 0 or o + n > g:
        raise errors.poplar_error(f"Replicas [{o}, {o + n}) of this instance are outside the {g} global replicas")
    if g != n and g != n * num_instances():
        raise errors.poplar_error(
            f"The global replication factor ({g}) must be the local replication factor ({n}) times the number of "
            f"instances ({num_instances()}); start the program with poprun --num-instances {g // n} --num-replicas {g}")
    prev = getattr(_local, "scope", None)
    _local.scope = Scope(g, o, n) if g > n else None
    try:
        yield _local.scope
    finally:
        _local.scope = prev


def current_scope() -> Scope | None:
    """The :class:`Scope` of the graph being built, or None (all replicas in this process)."""
    return getattr(_local, "scope", None)


def init_process_group() -> None:
    """Join the instances' ``torch.distributed`` gloo group (once per process) from PopDist's
    environment; ``MASTER_ADDR`` / ``MASTER_PORT`` name instance 0's rendezvous. Raises
    ``poplar_error`` when the environment does not describe several instances or the rendezvous
    times out."""
    import torch.distributed as dist
    from openipu.poplar import errors
    with _lock:
        if dist.is_available() and dist.is_initialized():
            return
        n, i = num_instances(), instance_index()
        if n < 2:
            raise errors.poplar_error("A cross-instance collective needs several instances: start the program with "
                                      "poprun --num-instances N (POPDIST_NUM_INSTANCES is not set above 1)")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            raise errors.poplar_error("MASTER_PORT is not set: start the instances with poprun")
        try:
            dist.init_process_group("gloo", rank=i, world_size=n,
                                    timeout=datetime.timedelta(seconds=timeout_seconds()))
        except Exception as e:  # noqa: BLE001 - torch raises RuntimeError / DistStoreError / TimeoutError
            raise errors.poplar_error(f"Instance {i} of {n} could not join the other instances at "
                                      f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}: {e}") from None
        atexit.register(_leave_process_group)


def _leave_process_group() -> None:
    """Leave the gloo group at interpreter exit, before its threads are torn down with the process
    (left running, one can end the instance with "terminate called without an active exception")."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - leaving at exit: nothing to report to
            pass


def _failed(what: str, e: Exception):
    from openipu.poplar import errors
    return errors.poplar_error(
        f"Instance {instance_index()} of {num_instances()}: the cross-instance collective '{what}' failed waiting for "
        f"the other instances (timeout {timeout_seconds():g} s, POPDIST_COLLECTIVE_TIMEOUT); an instance has "
        f"stopped or hangs: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def gather_replicas(local: torch.Tensor, what: str = "collective") -> torch.Tensor:
    """The ``[global, ...]`` stack of every instance's ``[local, ...]`` replica values, in global
    replica order (instances hold equal, consecutive blocks). ``local`` is returned when this
    process runs alone. Raises ``poplar_error`` on a timeout or a lost instance."""
    import torch.distributed as dist
    if num_instances() < 2:
        return local
    init_process_group()
    x = local.contiguous()
    wire = x.view(torch.uint8) if x.dtype == torch.bool else x     # gloo has no bool
    parts = [torch.empty_like(wire) for _ in range(dist.get_world_size())]
    try:
        dist.all_gather(parts, wire)
    except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError / DistBackendError
        raise _failed(what, e) from None
    out = torch.cat(parts, 0)
    return out.view(torch.bool) if x.dtype == torch.bool else out


def _wire(x: torch.Tensor) -> torch.Tensor:
    """``x`` (contiguous) as bytes for gloo's point-to-point calls, which know no bool or half."""
    return x.contiguous().view(torch.uint8) if x.dim() else x.reshape(1).view(torch.uint8)


def reduce_groups(local: torch.Tensor, groups, offset: int, combine, prep=None,
                  what: str = "collective") -> torch.Tensor:
    """The reduction of every replica group over all instances, as ``[G, *shape]``.

    ``local``: ``[local_replicas, *shape]``, this instance's replicas (global ids ``offset ...``).
    ``groups``: ``[G, p]`` global replica ids (numpy or nested lists), each row in ring order.
    ``combine(acc, x)``: one step of the fold (``acc`` from earlier replicas of the group).
    ``prep(x)``: applied to each replica's value before it enters the fold (a cast, or the
    square of ``SQUARE_ADD``; default: none). The fold of group ``g`` is
    ``combine(...combine(prep(v[g0]), prep(v[g1]))..., prep(v[g(p-1)]))`` exactly as a
    one-process fold in ring order computes it; a mean's division is the caller's.

    Runs as a chain over the instances (see the module docstring); when a group's ring order
    returns to an earlier instance the values are all-gathered instead (same result, more
    traffic). Alone (one instance) the fold runs locally. Raises ``poplar_error`` on a timeout
    or a lost instance."""
    import numpy as np
    import torch.distributed as dist
    prep = prep or (lambda x: x)
    g = np.asarray(groups, dtype=np.int64).reshape(len(groups), -1)
    n_local = local.shape[0]
    n = num_instances()
    owner = g // n_local if n > 1 else np.zeros_like(g)
    if n > 1 and (np.diff(owner, axis=1) < 0).any():
        return _fold_rows(gather_replicas(local, what), g, 0, combine, prep)
    if n < 2:
        return _fold_rows(local, g, offset, combine, prep)
    init_process_group()
    k = instance_index()
    first = prep(local[0])
    acc = first.new_zeros((g.shape[0], *first.shape))
    started = torch.zeros(g.shape[0], dtype=torch.bool)
    try:
        if k > 0:
            dist.recv(_wire(acc), k - 1)
            dist.recv(_wire(started), k - 1)
        for j in range(g.shape[1]):
            rows = np.nonzero(owner[:, j] == k)[0]
            if rows.size == 0:
                continue
            x = prep(local[torch.from_numpy(g[rows, j] - offset)])
            r = torch.from_numpy(rows)
            was = started[r]
            if bool(was.all()):
                acc[r] = combine(acc[r], x)
            elif not bool(was.any()):
                acc[r] = x
            else:
                for q, row in enumerate(rows.tolist()):
                    acc[row] = combine(acc[row], x[q]) if bool(started[row]) else x[q]
            started[r] = True
        if k < n - 1:
            dist.send(_wire(acc), k + 1)
            dist.send(_wire(started), k + 1)
        dist.broadcast(_wire(acc), n - 1)
    except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError / DistBackendError
        raise _failed(what, e) from None
    return acc


def _fold_rows(every: torch.Tensor, g, offset: int, combine, prep) -> torch.Tensor:
    """The one-process fold of ``reduce_groups`` over ``every`` (rows: replicas from ``offset``)."""
    import numpy as np
    x = prep(every[torch.from_numpy(np.asarray(g) - offset)])          # [G, p, *shape]
    acc = x[:, 0]
    for j in range(1, x.shape[1]):
        acc = combine(acc, x[:, j])
    return acc


def all_reduce_replicas(local: torch.Tensor, op: str = "ADD", what: str = "allReduce",
                        across_instances: bool = True) -> torch.Tensor:
    """All-reduce over all global replicas, for executors that keep replica values as host
    tensors (the PopART IR executor's ``ReplicatedAllReduce`` / ``ReplicatedAllReduceInplace``):
    ``local`` is ``[local_replicas, *shape]`` (this instance's replicas), the result the same
    shape, every row the reduction over all instances' replicas in ring order in the tensor's
    type (exactly what ``gcl.allReduceCrossReplica`` computes). ``op``: a
    ``gcl.CollectiveOperator`` name. ``across_instances``: the session is a distributed replicated
    graph (PopART ``enableDistributedReplicatedGraphs``); False reduces the local replicas only.
    Raises ``poplar_error`` on a timeout or a lost instance."""
    from openipu.poplibs.gcl import _combine
    op = str(getattr(op, "name", op)).upper()
    if op == "LOCAL":
        return local.clone()
    if not across_instances:
        from openipu.poplibs.gcl import _reduce
        return _reduce(local, op, 0).unsqueeze(0).expand_as(local).contiguous()
    n_local = local.shape[0]
    offset = instance_index() * n_local if num_instances() > 1 else 0
    total = n_local * max(1, num_instances())
    red = reduce_groups(local, [list(range(total))], offset, lambda a, b: _combine(op, a, b),
                        (lambda x: x * x) if op == "SQUARE_ADD" else None, what)[0]
    if op == "MEAN":
        red = red / total if red.is_floating_point() else torch.div(red, total, rounding_mode="trunc")
    return red.unsqueeze(0).expand_as(local).contiguous()


def broadcast_from_instance0(t: torch.Tensor, what: str = "broadcast") -> torch.Tensor:
    """Instance 0's value of ``t`` on every instance (a weight broadcast); ``t`` itself when
    running alone. Raises ``poplar_error`` on a timeout or a lost instance."""
    import torch.distributed as dist
    if num_instances() < 2:
        return t
    init_process_group()
    x = t.detach().clone().contiguous()
    try:
        dist.broadcast(x, 0)
    except Exception as e:  # noqa: BLE001
        raise _failed(what, e) from None
    return x


def broadcast_tensors_from(tensors: list, root: int = 0, what: str = "broadcastWeights") -> None:
    """Overwrite ``tensors`` (torch tensors, any dtypes and shapes, written in place) with
    instance ``root``'s values, in one ``torch.distributed.broadcast`` of their bytes (PopDist's
    weight broadcast at the start of a run, PopART's ``Session.broadcastWeights(rootRank)``). A
    no-op when running alone. Raises ``poplar_error`` for a ``root`` outside the instances, on a
    timeout or a lost instance."""
    import torch.distributed as dist
    from openipu.poplar import errors
    n = num_instances()
    if not 0 <= int(root) < n:
        raise errors.poplar_error(f"The broadcast root instance {root} is not one of the {n} instances")
    if n < 2 or not tensors:
        return
    init_process_group()
    with torch.no_grad():
        parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
        buf = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        try:
            dist.broadcast(buf, int(root))
        except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError / DistBackendError
            raise _failed(what, e) from None
        at = 0
        for t, p in zip(tensors, parts):
            t.copy_(buf[at: at + p.numel()].view(t.dtype).reshape(t.shape))
            at += p.numel()
