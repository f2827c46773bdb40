"""A minimal ``horovod.torch`` for programs started by ``poprun``, on ``torch.distributed``.

Graphcore's PopTorch applications (graphcore/examples: ``vision/cnns/pytorch``, ``nlp/bert/pytorch``,
``nlp/gpt2/pytorch``, ...) reduce their *host-side* metrics over the instances and broadcast the
initial weights with Horovod (``import horovod.torch as hvd``); Graphcore's SDK shipped a Horovod
build for its ``poprun``. Horovod 0.28.1 (the last release) does not build against the torch
openipu pins (see docs/scaleout.md), so when no real Horovod is importable, ``import
horovod.torch`` gives this module (:mod:`openipu_hvd_hook`). It is **openipu's stand-in, not
Horovod**: it covers the calls those applications make, with Horovod's signatures and results,
on the instances' gloo group that openipu's cross-instance collectives already use
(:mod:`openipu.poplibs.gcl_instances`). The *ranks* are the ``poprun`` instances.

Covered: :func:`init`, :func:`shutdown`, :func:`is_initialized`, :func:`size`, :func:`rank`,
:func:`local_size`, :func:`local_rank`, :func:`cross_size`, :func:`cross_rank`;
:func:`allreduce` / :func:`allreduce_`, :func:`grouped_allreduce` / :func:`grouped_allreduce_`
(ops :data:`Average` (default), :data:`Sum`, :data:`Min`, :data:`Max`, :data:`Product`;
``prescale_factor`` / ``postscale_factor``; ``average=`` as Horovod's deprecated spelling;
``Compression.none`` / ``Compression.fp16``), :func:`allgather` (first dimensions may differ),
:func:`broadcast` / :func:`broadcast_`, :func:`broadcast_parameters`, :func:`barrier`, and the
build queries (``gloo_built()`` True, MPI / NCCL / CUDA False). Not covered (raise or absent):
``Adasum``, process sets other than the global one, asynchronous handles, ``DistributedOptimizer``
(PopTorch reduces gradients on the IPUs), ``broadcast_optimizer_state``, ``alltoall``,
``reducescatter``; the results are not differentiable (Horovod's are).

Shapes and dtypes: any CPU tensor gloo reduces (float16/32/64, bfloat16, int8/16/32/64, uint8);
results have the input's shape and dtype. ``Average`` divides the sum by :func:`size` (floor
division for integer tensors, as Horovod does). Errors: ``ValueError("Horovod has not been
initialized; use hvd.init().")`` before :func:`init`, ``ValueError`` for a bad ``root_rank`` or
both ``op`` and ``average``, ``NotImplementedError`` for what is not covered, and
``poplar_error`` (from :mod:`gcl_instances`) when another instance does not join a collective
within ``POPDIST_COLLECTIVE_TIMEOUT``.

Ranks: ``rank()`` / ``size()`` are PopDist's instance index / number of instances
(``POPDIST_INSTANCE_INDEX`` / ``POPDIST_NUM_INSTANCES``); ``local_rank()`` / ``local_size()`` /
``cross_rank()`` / ``cross_size()`` read ``HOROVOD_LOCAL_RANK`` etc., which ``poprun`` sets per
host (as ``horovodrun`` does). Outside ``poprun`` the program is one rank of one.
"""

from __future__ import annotations

import os
import warnings

import torch

from openipu.poplibs import gcl_instances

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
           "cross_rank", "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather",
           "broadcast", "broadcast_", "broadcast_parameters", "barrier", "Average", "Sum", "Adasum", "Min", "Max",
           "Product", "Compression", "mpi_built", "gloo_built", "nccl_built", "cuda_built", "rocm_built",
           "mpi_enabled", "gloo_enabled", "mpi_threads_supported", "is_openipu_stand_in"]

#: Horovod's reduction ops (``hvd.Average`` ...), with Horovod's values.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}

#: True: this is openipu's stand-in, not Horovod (a program can tell them apart).
is_openipu_stand_in = True

_state = {"initialized": False}


def _env_int(names, default: int) -> int:
    for name in names:
        v = os.environ.get(name, "").strip()
        if v:
            return int(v)
    return default


def init(comm=None, process_sets=None) -> None:
    """``hvd.init()``: join the other ``poprun`` instances (the gloo group of
    :func:`gcl_instances.init_process_group`; nothing to join for a single instance). ``comm``
    (an MPI communicator) is ignored: there is no MPI. Raises ``NotImplementedError`` for
    ``process_sets`` and ``poplar_error`` when the rendezvous fails."""
    if process_sets not in (None, [], ()):
        raise NotImplementedError("horovod.torch (openipu's stand-in): process sets are not supported")
    if gcl_instances.num_instances() > 1:
        gcl_instances.init_process_group()
    _state["initialized"] = True


def shutdown() -> None:
    """``hvd.shutdown()``: mark Horovod as not initialized (the instances' gloo group stays up:
    openipu's own collectives use it)."""
    _state["initialized"] = False


def is_initialized() -> bool:
    """True after :func:`init` (and before :func:`shutdown`)."""
    return _state["initialized"]


def _check() -> None:
    if not _state["initialized"]:
        raise ValueError("Horovod has not been initialized; use hvd.init().")


def size() -> int:
    """Number of ranks: the ``poprun`` instances (1 outside ``poprun``)."""
    _check()
    return gcl_instances.num_instances()


def rank() -> int:
    """This rank: the instance index in ``[0, size())``."""
    _check()
    return gcl_instances.instance_index()


def local_size() -> int:
    """Ranks on this host (``HOROVOD_LOCAL_SIZE``, set by ``poprun``; else :func:`size`)."""
    _check()
    return _env_int(("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"), gcl_instances.num_instances())


def local_rank() -> int:
    """This rank's index among the ranks of its host (``HOROVOD_LOCAL_RANK``; else :func:`rank`)."""
    _check()
    return _env_int(("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"), gcl_instances.instance_index())


def cross_size() -> int:
    """Hosts holding a rank with this local rank (``HOROVOD_CROSS_SIZE``; else 1)."""
    _check()
    return _env_int(("HOROVOD_CROSS_SIZE",), 1)


def cross_rank() -> int:
    """This host's index among them (``HOROVOD_CROSS_RANK``; else 0)."""
    _check()
    return _env_int(("HOROVOD_CROSS_RANK",), 0)


def mpi_built() -> bool:
    return False


def gloo_built() -> bool:
    return True


def nccl_built() -> int:
    return 0


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def gloo_enabled() -> bool:
    return True


def mpi_threads_supported() -> bool:
    """Horovod raises this without MPI; so does the stand-in."""
    raise ValueError("Horovod MPI is not enabled; Please make sure it's installed and enabled.")


class _NoneCompressor:
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _FP16Compressor:
    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """Horovod's ``Compression.none`` (default) and ``Compression.fp16`` (floating-point tensors
    travel and are reduced as float16, then cast back)."""

    none = _NoneCompressor
    fp16 = _FP16Compressor


def _resolve_op(op, average):
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise NotImplementedError("horovod.torch (openipu's stand-in): the Adasum reduction is not supported")
    if op not in _OP_NAMES:
        raise ValueError(f"Unknown reduction op {op!r}: use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product")
    return op


def _check_process_set(process_set) -> None:
    if process_set is not None and getattr(process_set, "process_set_id", 0) != 0:
        raise NotImplementedError("horovod.torch (openipu's stand-in): only the global process set is supported")


def _reduce(tensor: torch.Tensor, op: int, prescale: float, postscale: float, name) -> torch.Tensor:
    """The reduction over the ranks of a copy of ``tensor``, scaled and averaged as Horovod does."""
    import torch.distributed as dist
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"hvd.allreduce: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype == torch.bool:
        raise TypeError("hvd.allreduce: bool tensors are not supported (Horovod's reductions need a numeric type)")
    x = tensor.detach().clone().contiguous()
    if prescale != 1.0:
        x.mul_(prescale)
    n = gcl_instances.num_instances()
    if n > 1:
        rop = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
               Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}[op]
        try:
            dist.all_reduce(x, op=rop)
        except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError / DistBackendError
            raise gcl_instances._failed(f"hvd.allreduce {name or ''}".strip(), e) from None
    if postscale != 1.0:
        x.mul_(postscale)
    if op == Average and n > 1:
        if x.dtype.is_floating_point or x.dtype.is_complex:
            x.div_(n)
        else:
            x.floor_divide_(n)
    return x


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None) -> torch.Tensor:
    """``hvd.allreduce``: a new tensor (``tensor``'s shape and dtype) holding the reduction of
    ``tensor`` over all ranks (``op``, default :data:`Average`); ``tensor`` is not modified."""
    _check()
    _check_process_set(process_set)
    op = _resolve_op(op, average)
    wire, ctx = compression.compress(tensor)
    return compression.decompress(_reduce(wire, op, prescale_factor, postscale_factor, name), ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None) -> torch.Tensor:
    """``hvd.allreduce_``: :func:`allreduce` written into ``tensor``; returns ``tensor``."""
    _check()
    _check_process_set(process_set)
    op = _resolve_op(op, average)
    with torch.no_grad():
        tensor.copy_(_reduce(tensor, op, prescale_factor, postscale_factor, name))
    return tensor


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None) -> list:
    """``hvd.grouped_allreduce``: :func:`allreduce` of each tensor of the list ``tensors``
    (a list of new tensors, in order)."""
    _check()
    _check_process_set(process_set)
    op = _resolve_op(op, average)
    out = []
    for t in tensors:
        wire, ctx = compression.compress(t)
        out.append(compression.decompress(_reduce(wire, op, prescale_factor, postscale_factor, name), ctx))
    return out


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None) -> list:
    """``hvd.grouped_allreduce_``: :func:`grouped_allreduce` written into the tensors."""
    _check()
    _check_process_set(process_set)
    op = _resolve_op(op, average)
    with torch.no_grad():
        for t in tensors:
            t.copy_(_reduce(t, op, prescale_factor, postscale_factor, name))
    return list(tensors)


def allgather(tensor, name=None, process_set=None) -> torch.Tensor:
    """``hvd.allgather``: the ranks' tensors concatenated on the first dimension, in rank order.
    The first dimensions may differ; the other dimensions and the dtype must agree (``ValueError``
    otherwise, on every rank). A 0-dimensional tensor raises ``ValueError``."""
    import torch.distributed as dist
    _check()
    _check_process_set(process_set)
    if tensor.dim() == 0:
        raise ValueError("hvd.allgather: the tensor must have at least one dimension (it is gathered on the first)")
    x = tensor.detach().contiguous()
    n = gcl_instances.num_instances()
    if n < 2:
        return x.clone()
    what = f"hvd.allgather {name or ''}".strip()
    wire = x.view(torch.uint8) if x.dtype == torch.bool else x
    shape = torch.tensor([x.dim(), *x.shape] + [0] * (8 - x.dim()), dtype=torch.int64) if x.dim() <= 7 else None
    if shape is None:
        raise ValueError("hvd.allgather: tensors of more than 7 dimensions are not supported")
    shapes = [torch.empty_like(shape) for _ in range(n)]
    try:
        dist.all_gather(shapes, shape)
        rows = [int(s[1]) for s in shapes]
        for r, s in enumerate(shapes):
            if int(s[0]) != x.dim() or any(int(a) != b for a, b in zip(s[2:1 + x.dim()], x.shape[1:])):
                raise ValueError(f"hvd.allgather: mismatched tensor shapes: rank {r} has "
                                 f"{[int(v) for v in s[1:1 + int(s[0])]]}, rank {rank()} has {list(x.shape)} "
                                 "(only the first dimension may differ)")
        pad = max(rows)
        buf = torch.zeros((pad, *wire.shape[1:]), dtype=wire.dtype)
        buf[: wire.shape[0]] = wire
        parts = [torch.empty_like(buf) for _ in range(n)]
        dist.all_gather(parts, buf)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError / DistBackendError
        raise gcl_instances._failed(what, e) from None
    out = torch.cat([p[:k] for p, k in zip(parts, rows)], 0)
    return out.view(torch.bool) if x.dtype == torch.bool else out


def _check_root(root_rank) -> int:
    n = gcl_instances.num_instances()
    if not isinstance(root_rank, int) or not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank!r} is not a rank of this job (size {n})")
    return root_rank


def broadcast_(tensor, root_rank, name=None, process_set=None) -> torch.Tensor:
    """``hvd.broadcast_``: overwrite ``tensor`` with rank ``root_rank``'s value; returns it."""
    _check()
    _check_process_set(process_set)
    root = _check_root(root_rank)
    with torch.no_grad():
        gcl_instances.broadcast_tensors_from([tensor], root, f"hvd.broadcast {name or ''}".strip())
    return tensor


def broadcast(tensor, root_rank, name=None, process_set=None) -> torch.Tensor:
    """``hvd.broadcast``: a new tensor holding rank ``root_rank``'s value of ``tensor`` (same
    shape and dtype on every rank); ``tensor`` is not modified."""
    return broadcast_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast_parameters(params, root_rank) -> None:
    """``hvd.broadcast_parameters``: overwrite, in place, every tensor of ``params`` (a
    ``state_dict()``, ``named_parameters()`` pairs or a list of tensors) with rank
    ``root_rank``'s values (a dict is taken in sorted key order, as Horovod does). ``None``
    entries are skipped; anything else that is not a tensor raises ``ValueError``."""
    _check()
    root = _check_root(root_rank)
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and isinstance(items[0], tuple):
            if not all(isinstance(p, tuple) and len(p) == 2 for p in items):
                raise ValueError("invalid params of type: " + str(type(params)))
        else:
            items = [(None, p) for p in items]
    tensors = []
    for key, p in items:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError(  # noqa: TRY004 - Horovod raises ValueError for invalid params
                f"hvd.broadcast_parameters: {key or 'an entry'} is a {type(p).__name__}, not a tensor")
        tensors.append(p.data if isinstance(p, torch.nn.Parameter) else p)
    with torch.no_grad():
        gcl_instances.broadcast_tensors_from(tensors, root, "hvd.broadcast_parameters")


def barrier(process_set=None) -> None:
    """``hvd.barrier()``: wait until every rank has reached it."""
    import torch.distributed as dist
    _check()
    _check_process_set(process_set)
    if gcl_instances.num_instances() > 1:
        try:
            dist.barrier()
        except Exception as e:  # noqa: BLE001
            raise gcl_instances._failed("hvd.barrier", e) from None
