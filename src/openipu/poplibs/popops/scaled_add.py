"""``popops``: scaled add and subtract (PopLibs ``include/popops/ScaledAdd.hpp``).

``A += scaleB * B``, ``A = scaleA * A + scaleB * B``, ``A -= scaleB * B`` and ``A = scaleA * A - scaleB * B``
update ``A`` in place. Work follows ``A``'s tile mapping: one ``ScaledAddSupervisor`` MultiVertex
per tile that owns elements of ``A`` (PopLibs uses ``ScaledAdd2D`` worker vertices when a tile holds
several regions; openipu costs every tile with the supervisor estimator). ``B`` (and a tensor
scale) mapped elsewhere are exchanged in and costed by the engine.

Cycle estimate per vertex, from PopLibs ``getScaledArithmeticSupervisorCycleEstimate``
(``lib/popops/PerformanceEstimation.cpp``), for ``n`` elements of float/half on a tile:
``supervisor + 6 x maxWorker`` with ``supervisor = 21 (+6 ScaledPtr64) + 11 + (7 | 13 if n % vw)
+ 12 (+12 aX+bY with tensor scales, +7 subtract with a tensor scale, +6 tensor scale)`` and
``maxWorker = 15 + [v>0](6 + innerLoop x (v-1)) + 2 + 1 + remainder + 1``, ``v`` the vectors of
the busiest worker and ``innerLoop`` 2 (``optimizeForSpeed``: A and B in different memory
elements), 3 (same types) or 4 (mixed types). Integer types: ``53 + 26 x (n // 3) + 6 + 26 x (n % 3)
+ 8 (+6 tensor scale)``.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._common import read_on_tiles, tile_counts_of

__all__ = ["ScaledAddSpecialisation", "scaledAddTo", "scaledSubtractFrom", "scaled_add_cycles"]


class ScaledAddSpecialisation:
    """``popops::ScaledAddSpecialisation``: ``DEFAULT`` (A = a*A + b*B) or ``X_MINUS_AX_PLUS_BY``
    (A = A - a*A + b*B)."""

    DEFAULT = "DEFAULT"
    X_MINUS_AX_PLUS_BY = "X_MINUS_AX_PLUS_BY"


_OPTIONS = {"optimizeForSpeed", "scaleFloatToHalfTolerance"}


def scaled_add_cycles(n: np.ndarray, a_type, b_type, target, *, operation: str = "ADD",
                      scale_is_tensor: bool = False, mem_constrained: bool = False) -> np.ndarray:
    """Tile cycles of ``popops::ScaledAddSupervisor`` for ``n`` elements per tile (array).

    ``operation`` is ``ADD``, ``SUBTRACT``, ``AXPLUSBY`` or ``AXMINUSBY``. Constants from PopLibs
    ``getScaledArithmeticSupervisorCycleEstimate``; see the module docstring.
    """
    n = np.asarray(n, np.int64)
    if not a_type.is_float:
        cycles = 53 + 26 * (n // 3) + 6 + 26 * (n % 3) + 8
        if operation == "SUBTRACT" and scale_is_tensor:
            cycles = cycles + 1
        return cycles + (6 if scale_is_tensor else 0)
    vw = target.getVectorWidth(a_type)
    workers = target.getNumWorkerContexts()
    vectors, rem = n // vw, n % vw
    per_worker = -(-vectors // workers)
    supervisor = 21 + 6 + 11 + np.where(rem == 0, 7, 13) + 12
    if operation in ("AXPLUSBY", "AXMINUSBY") and scale_is_tensor:
        supervisor = supervisor + 12 + 2 + 2      # + unpack costs of A and B (ScaledPtr64: 2 each)
    if operation == "SUBTRACT" and scale_is_tensor:
        supervisor = supervisor + 7
    if scale_is_tensor:
        supervisor = supervisor + 6
    if a_type == poplar.HALF and b_type == poplar.FLOAT:
        worker = 16 + np.where(per_worker > 0, 8 + 4 * np.maximum(per_worker - 1, 0), 0) + 2 + 1 \
            + np.where(rem > 0, 2 + np.where(rem >= 2, 5, 0) + 2 + np.where(rem % 2 == 1, 7, 0), 0) + 1
    else:
        inner = 2 if mem_constrained else (3 if a_type == b_type else 4)
        if a_type == poplar.FLOAT:
            rem_cycles = np.where(rem > 0, 8, 0)
        else:
            rem_cycles = np.where(rem > 0, 5 + np.where(rem >= 2, 7 + np.where(rem == 3, 6, 0), 0), 0)
        worker = 15 + np.where(per_worker > 0, 6 + inner * np.maximum(per_worker - 1, 0), 0) + 2 + 1 + rem_cycles + 1
    return supervisor + worker * workers


@kernel
def _kernel(A, B, sa_const, sb_const, sa_t, sb_t, sign, mode, ctx):
    a, b = ctx.read(A), ctx.read(B)
    R = a.shape[0]
    if a.is_floating_point():
        # float/half compute in A's type; a half A with a float B uses the mixed-precision vertex (float)
        ct = torch.float32 if b.dtype == torch.float32 else a.dtype
    else:
        ct = torch.int64

    def scale(const, t):
        if t is None:
            return const if a.is_floating_point() else int(const)
        v = ctx.read(t).reshape(R, *([1] * (a.dim() - 1)))
        return v.to(ct) if a.is_floating_point() else v.to(torch.float64).trunc().to(ct)

    af, bf = a.to(ct), b.to(ct)
    sa, sb = scale(sa_const, sa_t), scale(sb_const, sb_t) * sign
    res = af - sa * af + sb * bf if mode == ScaledAddSpecialisation.X_MINUS_AX_PLUS_BY else sa * af + sb * bf
    ctx.write(A, res)


def _check_options(options):
    options = dict(options or {})
    for k in options:
        if k not in _OPTIONS:
            raise poplar.invalid_option(f"scaledAddTo: unknown option '{k}'; valid options are {sorted(_OPTIONS)}")
    ofs = str(options.get("optimizeForSpeed", "false")).lower()
    if ofs not in ("true", "false", "1", "0"):
        raise poplar.invalid_option(f"scaledAddTo: optimizeForSpeed must be true or false, got {ofs!r}")
    return ofs in ("true", "1")


def _scalar_arg(graph, s, what):
    if s is None:
        return None, None
    if isinstance(s, poplar.Tensor):
        if s.numElements() != 1:
            raise poplar.graph_connection_error(
                f"scaledAddTo: {what} must be a scalar tensor (one element), got shape {s.shape()}")
        if not s.elementType().is_float and s.elementType() not in (poplar.INT, poplar.UNSIGNED_INT):
            raise poplar.graph_connection_error(f"scaledAddTo: {what} has unsupported type {s.elementType()}")
        return None, s
    return float(s), None


def _scaled(graph, A, scale_a, B, scale_b, prog, debug_name, options, *, subtract: bool, mode: str):
    if not isinstance(A, poplar.Tensor) or not isinstance(B, poplar.Tensor):
        raise poplar.graph_connection_error("scaledAddTo: A and B must be poplar Tensors")
    if list(A.shape()) != list(B.shape()):
        raise poplar.index_error(f"scaledAddTo: A has shape {A.shape()} but B has shape {B.shape()}; they must match")
    at, bt = A.elementType(), B.elementType()
    if at.is_float != bt.is_float or (not at.is_float and at != bt):
        raise poplar.graph_connection_error(
            f"scaledAddTo: cannot add B of type {bt} to A of type {at}; cast B first (popops::cast)")
    if at not in (poplar.FLOAT, poplar.HALF, poplar.INT, poplar.UNSIGNED_INT):
        raise poplar.graph_connection_error(f"scaledAddTo: unsupported element type {at} (float, half, int, unsigned int)")
    if not A.isParallelWriteable():
        raise poplar.graph_connection_error(
            "scaledAddTo: A contains constants or aliased elements and cannot be updated in place")
    mem_constrained = _check_options(options)
    sa, sa_t = _scalar_arg(graph, scale_a, "scaleA")
    sb, sb_t = _scalar_arg(graph, scale_b, "scaleB")
    four = scale_a is not None and (sa_t is not None or sa != 1.0 or mode != ScaledAddSpecialisation.DEFAULT)
    operation = ("AXMINUSBY" if subtract else "AXPLUSBY") if four else ("SUBTRACT" if subtract else "ADD")
    target = graph.getTarget()
    if not graph.is_mapped(A):
        raise poplar.invalid_tile_mapping(f"scaledAddTo: A ({A.shortString()}) is not completely mapped to tiles")
    used, counts = tile_counts_of(graph, A)
    cycles = scaled_add_cycles(counts, at, bt, target, operation=operation,
                               scale_is_tensor=sa_t is not None or sb_t is not None, mem_constrained=mem_constrained)
    name = debug_name or ("scaledSubtractFrom" if subtract else "scaledAddTo")
    vname = "popops::ScaledAddSupervisor" if operation in ("ADD", "SUBTRACT") else "popops::aXPlusbYSupervisor"
    if subtract:
        vname = vname.replace("ScaledAdd", "ScaledSubtract").replace("aXPlusbY", "aXMinusbY")
    vname = f"{vname}<{at},{bt},{'false' if sb_t is not None else 'true'},{'true' if mem_constrained else 'false'}>"
    reads = [Access(B, A)]                                                 # B is read where A lives
    n = A.numElements()
    for s in (sa_t, sb_t):
        if s is not None:
            reads.append(Access(s.flatten(), read_on_tiles(s.flatten(), used)))   # every tile reads the scale
    kernel = functools.partial(_kernel, A, B, 1.0 if sa is None else sa, sb, sa_t, sb_t, -1 if subtract else 1,
                               mode if four else ScaledAddSpecialisation.DEFAULT)
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        vname, used, cycles, kernel, reads=reads, writes=[Access(A)], multi=True,
        flops=float(2 * n if not four else 3 * n), state_bytes=20 if not four else 24))
    prog.add(poplar.program.Execute(cs, name))


def _parse(args, kwargs):
    """Split ``scaledAddTo``'s overloads: (A, B, scaleB, prog, ...) or (A, scaleA, B, scaleB, prog, ...)."""
    args = list(args)
    if len(args) >= 4 and isinstance(args[1], (poplar.Tensor, int, float)) and isinstance(args[2], poplar.Tensor) \
            and not isinstance(args[3], poplar.program.Program):
        A, scale_a, B, scale_b, *rest = args
        if isinstance(scale_a, poplar.Tensor) and scale_a.numElements() != 1 and list(scale_a.shape()) == list(A.shape()):
            raise poplar.graph_connection_error("scaledAddTo: scaleA must be a scalar")
    else:
        if len(args) < 4:
            raise poplar.graph_connection_error(
                "scaledAddTo expects (graph, A, B, scaleB, prog[, debug_name, options]) or "
                "(graph, A, scaleA, B, scaleB, prog[, speciality, debug_name, options])")
        A, B, scale_b, *rest = args
        scale_a = None
    prog = rest[0] if rest else kwargs.pop("prog")
    if not isinstance(prog, poplar.program.Sequence):
        raise poplar.control_program_error(f"scaledAddTo: prog must be a program.Sequence, got {type(prog).__name__}")
    rest = rest[1:]
    mode = kwargs.pop("speciality", ScaledAddSpecialisation.DEFAULT)
    if rest and rest[0] in (ScaledAddSpecialisation.DEFAULT, ScaledAddSpecialisation.X_MINUS_AX_PLUS_BY):
        mode, rest = rest[0], rest[1:]
    debug_name = rest[0] if rest else kwargs.pop("debug_name", "")
    options = rest[1] if len(rest) > 1 else kwargs.pop("options", None)
    if kwargs:
        raise TypeError(f"scaledAddTo: unexpected keyword arguments {sorted(kwargs)}")
    return A, scale_a, B, scale_b, prog, mode, debug_name or "", options


def scaledAddTo(graph, *args, **kwargs) -> None:  # noqa: N802
    """``A += scaleB * B`` or ``A = scaleA * A + scaleB * B`` in place (``popops::scaledAddTo``).

    Overloads (PopLibs ``ScaledAdd.hpp``)::

        scaledAddTo(graph, A, B, scaleB, prog, debug_name="", options=None)
        scaledAddTo(graph, A, scaleA, B, scaleB, prog[, speciality], debug_name="", options=None)

    ``A`` and ``B`` have the same shape; float/half ``A`` accepts float or half ``B`` (B is cast to
    A's type, as PopLibs does); int types need equal types. ``scaleA``/``scaleB`` are Python
    numbers or one-element tensors (any float/int type). ``speciality`` is
    ``ScaledAddSpecialisation.X_MINUS_AX_PLUS_BY`` for ``A = A - scaleA*A + scaleB*B``. Options:
    ``optimizeForSpeed`` ("true"/"false"), ``scaleFloatToHalfTolerance`` (accepted).

    Appends one compute set (one ``ScaledAddSupervisor`` vertex per tile of ``A``) to ``prog``.

    Raises:
        poplar.index_error: shapes differ.
        poplar.graph_connection_error: bad types, a non-scalar scale, or ``A`` not writeable.
        poplar.invalid_option: an unknown option or a bad value.
        poplar.invalid_tile_mapping: ``A`` is not completely mapped.
    """
    A, sa, B, sb, prog, mode, name, options = _parse(args, kwargs)
    _scaled(graph, A, sa, B, sb, prog, name, options, subtract=False, mode=mode)


def scaledSubtractFrom(graph, *args, **kwargs) -> None:  # noqa: N802
    """``A -= scaleB * B`` or ``A = scaleA * A - scaleB * B`` in place (``popops::scaledSubtractFrom``).

    Same overloads, errors and cost as :func:`scaledAddTo` (a ``ScaledSubtractSupervisor`` /
    ``aXMinusbYSupervisor`` vertex per tile).
    """
    A, sa, B, sb, prog, mode, name, options = _parse(args, kwargs)
    _scaled(graph, A, sa, B, sb, prog, name, options, subtract=True, mode=mode)
