"""``popops``: cast, fill, zero, iota, pad and one-hot encoding (PopLibs ``Cast.hpp``,
``Fill.hpp``, ``Zero.hpp``, ``Encoding.hpp``, ``Pad.hpp``).

Work follows the tile mapping of the tensor written. Cycle estimates (PopLibs
``lib/popops/PerformanceEstimation.cpp`` and ``popopsCycleEstimators.cpp``):

- ``Cast1D`` (MultiVertex): ``19 + 6 x (23 + castWorkerCycles(ceil(n/6)))`` with
  ``castWorkerCycles(n) = 19 + cyclesPerVector x (n // opVW) + remainder``, ``opVW`` =
  ``min(2 x 8/fromSize, 8/toSize)`` for float<->half conversions (aux pipeline), else 1 with
  ``cyclesPerVector = max(load, store) + 1``; remainder: per bit of ``opVW`` one check cycle
  plus 2 if that bit of ``n % opVW`` is set. PopLibs' special int8 paths are not modelled [A].
- ``Fill`` (single-worker vertices, PopLibs ``_fillCycleEstimate``): float/int
  ``16 + n/vw + 6 + (n % vw == 1) + 1``, half ``15`` (n=1), ``21`` (n=2), else ``26 + n/vw``,
  8-bit ``28 + n/4`` (under 64) or ``39 + n/8``, 64-bit ``5 + n``. A tile's elements are split
  over up to 6 workers in grains of ``2 x vw`` (``splitRegionsBetweenWorkers``).
- ``Iota`` (one vertex per tile): ``10 + sum over contiguous regions (4 + 3 x ceil(len/vw))``.
- ``EncodeOneHot``: unsigned int indices into half: ``11 + 74 x rows`` (a supervisor vertex);
  other types (C++ vertex, and ``EncodeOneHotCustomValues``) ``100 x rows``, per tile, after
  the output is zeroed (filled with ``off``).
- ``pad``: a view (no compute): constant padding concatenates new constant tensors.
"""

from __future__ import annotations

import enum
import functools

import numpy as np
import torch

from openipu import poplar
from openipu.poplar import quarter, tilemap
from openipu.poplar.graph import Access, ComputeSet, VertexGroup
from openipu.poplar.tensor import Interval, Tensor, concat
from openipu.poplar.types import Type, as_type
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._common import (flat_boxes, output_like, read_on_tiles, require_mapped,
                                            row_intervals_per_tile, tile_counts_of)
from openipu.poplibs.popops._common import rows_per_tile as rows_per_tile_of
from openipu.poplibs.popops.elementwise import _cast as _cast_values

#: Index value whose one-hot row is left all ``off`` (PopLibs ``MASKED_LABEL_CODE``).
MASKED_LABEL_CODE = 0xFFFFFFFF

_FP = ("float", "half")


# ----------------------------------------------------------------------------------------------
# cycle estimates
# ----------------------------------------------------------------------------------------------
def cast_worker_cycles(n, from_type: Type, to_type: Type, target) -> np.ndarray:
    """PopLibs ``castWorkerCycles`` (generic branch) for ``n`` elements (array)."""
    n = np.asarray(n, np.int64)
    dpw = target.getDataPathWidth() // 8
    load_w = max(1, dpw // from_type.size)
    store_w = max(1, dpw // to_type.size)
    aux = from_type.name in _FP and to_type.name in _FP
    op_vw = min(load_w * 2, store_w) if aux else 1
    load_c = op_vw // min(op_vw, load_w)
    store_c = op_vw // min(op_vw, store_w)
    cpv = max(load_c, store_c) + (0 if aux else 1)
    cycles = 19 + cpv * (n // op_vw)
    rem = n % op_vw
    for i in range(int(np.ceil(np.log2(op_vw))) if op_vw > 1 else 0):
        cycles = cycles + 1 + 2 * ((rem >> i) & 1)
    return cycles


def cast_cycles(n_per_tile, from_type: Type, to_type: Type, target) -> np.ndarray:
    """Tile cycles of ``popops::Cast1D`` (MultiVertex) for ``n`` elements per tile."""
    W = target.getNumWorkerContexts()
    return 19 + W * (23 + cast_worker_cycles(-(-np.asarray(n_per_tile, np.int64) // W), from_type, to_type, target))


def fill_cycles(n, type_: Type, target) -> np.ndarray:
    """Worker cycles of one ``popops::Fill`` vertex of ``n`` elements (PopLibs ``_fillCycleEstimate``)."""
    n = np.asarray(n, np.int64)
    if type_.size == 8:
        return 5 + n
    if type_.size == 1:
        return np.where(n < 64, 28 + n // 4, 39 + n // 8)
    width = target.getDataPathWidth() // (16 if type_ == poplar.HALF else 32)
    if type_ == poplar.HALF:
        return np.where(n == 1, 15, np.where(n == 2, 21, 26 + n // width))
    return 16 + n // width + 6 + (n % width == 1) + 1


def _worker_split(graph, used: np.ndarray, counts: np.ndarray, type_: Type):
    """Fill-style vertices: per tile (``used``, holding ``counts`` elements), up to 6 workers over
    grains of 2 x vw. Returns (vertex tiles, elements per vertex)."""
    target = graph.getTarget()
    grain = 2 * max(target.getVectorWidth(type_), 1)
    k = np.clip(-(-counts // grain), 1, target.getNumWorkerContexts())
    return np.repeat(used, k), np.repeat(-(-counts // k), k)


def _require_mapped(graph, t, what):
    require_mapped(graph, t, f"{what}: the tensor is not completely mapped to tiles; map it first")


def _require_writeable(t, what):
    if not t.isParallelWriteable():
        raise poplar.graph_connection_error(
            f"{what}: the tensor written contains constants or aliased elements; write to a plain variable")


# ----------------------------------------------------------------------------------------------
# cast
# ----------------------------------------------------------------------------------------------
@kernel
def _cast_kernel(src, dst, from_t, to_t, ctx, src_md=None, dst_md=None):
    v = ctx.read(src)
    if src_md is not None:                               # QUARTER source: its values are fp8 x 2**scale
        v = quarter.scale_by(v.float(), quarter.metadata_scale(ctx, src_md))
    if to_t.name == "quarter":
        # fp8(x * 2**-scale) in the destination's format, saturated [A]
        s = quarter.metadata_scale(ctx, dst_md)
        ctx.write(dst, quarter.quantize_values(v, quarter.format_of_type(to_t), -s if s is not None else 0))
        return
    if from_t.name == "quarter" and not to_t.is_float:
        v = v.float()
    ctx.write(dst, _cast_values(v, from_t, to_t))


def _check_cast(graph, src, dst):
    if list(src.shape()) != list(dst.shape()) and src.numElements() != dst.numElements():
        raise poplar.index_error(f"cast: source shape {src.shape()} and destination shape {dst.shape()} differ")
    _require_writeable(dst, "cast")
    _require_mapped(graph, dst, "cast")


def _add_cast(graph, src, dst, cs):
    _check_cast(graph, src, dst)
    tiles, counts = tile_counts_of(graph, dst)
    ft, tt = src.elementType(), dst.elementType()
    s = src.reshape(dst.shape()) if list(src.shape()) != list(dst.shape()) else src
    flops = float(dst.numElements()) if (ft.is_float or tt.is_float) else 0.0
    src_md = src.getMetadata() if src.hasMetadata() else None
    dst_md = dst.getMetadata() if dst.hasMetadata() else None
    reads = [Access(s, dst)]
    reads += [quarter.metadata_access(m, tiles) for m in (src_md, dst_md) if m is not None]
    kernel = functools.partial(_cast_kernel, s, dst, ft, tt)
    if src_md is not None or dst_md is not None:
        kernel = functools.partial(_cast_kernel, s, dst, ft, tt, src_md=src_md, dst_md=dst_md)
    graph.add_vertex_group(cs, VertexGroup(
        f"popops::Cast1D<{ft},{tt}>", tiles, cast_cycles(counts, ft, tt, graph.getTarget()),
        kernel, reads=reads, writes=[Access(dst)], multi=True, flops=flops, state_bytes=12))



def cast(graph, src, dst_type, prog, *args):
    """``popops::cast``: elementwise conversion of ``src`` to ``dst_type``.

    Forms: ``cast(graph, src, dstType, prog, debug_name)`` -> new tensor mapped like ``src``;
    ``cast(graph, src, QUARTER, metadata, prog, debug_name)`` -> a new QUARTER tensor with the
    ``QUARTER_METADATA`` tensor ``metadata`` (its format and scale bias ``s``: the elements are
    ``fp8(src * 2**-s)``); ``cast(graph, src, dstType, cs)`` adds the vertices to compute set
    ``cs`` and returns the new tensor; ``cast(graph, src, dst, cs)`` (a Tensor ``dst``) writes
    ``dst`` in ``cs``.

    Conversions: float<->half round to nearest; float to integer truncates toward zero and wraps
    to the integer's width [A] (PopLibs' int8 casts clamp); to BOOL is ``!= 0``. From QUARTER:
    the fp8 values times ``2**scale`` of the source's metadata. To QUARTER: scaled by
    ``2**-scale``, rounded to nearest even in the metadata's format and saturated at its largest
    value [A] (:mod:`openipu.poplar.quarter`); QUARTER without metadata is F143, scale 0. Cycles
    are those of a 1-byte type either way.

    Raises:
        poplar.index_error: ``dst`` of another size. poplar.invalid_tile_mapping: unmapped ``dst``.
        poplar.graph_connection_error: a metadata tensor with a non-QUARTER destination, or not
        of type QUARTER_METADATA.
    """
    md = None
    if isinstance(prog, Tensor):                      # cast(graph, src, QUARTER, metadata, prog, name)
        md, prog, args = prog, (args[0] if args else None), args[1:]
        if not as_type(dst_type).requiresMetadata():
            raise poplar.graph_connection_error(f"cast: only a cast to QUARTER takes metadata, not to {dst_type}")
        quarter.check_metadata_tensor(md, "cast")
    debug_name = args[0] if args else ""
    if md is not None:
        out = output_like(graph, quarter.storage_type(graph._metadata_format(md)), src.shape(), [src],
                          debug_name or "cast")
        graph.set_quarter_metadata(out, md)
        return _cast_to(graph, src, out, prog, debug_name)
    if isinstance(dst_type, Tensor):
        if not isinstance(prog, ComputeSet):
            raise TypeError("cast(graph, src, dst, cs) needs a ComputeSet; use castWithOutput for a program")
        _add_cast(graph, src, dst_type, prog)
        return None
    t = as_type(dst_type)
    if src.elementType() == t and not isinstance(prog, ComputeSet):
        out = graph.clone(src, debug_name or "cast")   # QUARTER: the clone shares the metadata
        prog.add(poplar.program.Copy(src, out))
        return out
    out = output_like(graph, t, src.shape(), [src], debug_name or "cast")
    return _cast_to(graph, src, out, prog, debug_name)


def _cast_to(graph, src, out, prog, debug_name: str):
    """Add the cast ``src`` -> ``out`` to compute set ``prog``, or to a new compute set executed by
    sequence ``prog``; returns ``out``."""
    if isinstance(prog, ComputeSet):
        _add_cast(graph, src, out, prog)
        return out
    cs = graph.addComputeSet(debug_name or "cast")
    _add_cast(graph, src, out, cs)
    prog.add(poplar.program.Execute(cs))
    return out


def castWithOutput(graph, src, dst, prog, debug_name: str = "") -> None:  # noqa: N802
    """``popops::castWithOutput``: write ``cast(src)`` to the mapped tensor ``dst`` (same shape).

    Raises:
        poplar.index_error: shapes differ. poplar.invalid_tile_mapping: ``dst`` unmapped.
        poplar.graph_connection_error: ``dst`` not writeable.
    """
    if list(src.shape()) != list(dst.shape()):
        raise poplar.index_error(f"castWithOutput: source shape {src.shape()} differs from destination {dst.shape()}")
    if src.elementType() == dst.elementType():
        _require_writeable(dst, "castWithOutput")
        prog.add(poplar.program.Copy(src, dst))
        return
    _check_cast(graph, src, dst)
    cs = graph.addComputeSet(debug_name or "cast")
    _add_cast(graph, src, dst, cs)
    prog.add(poplar.program.Execute(cs))


# ----------------------------------------------------------------------------------------------
# fill, zero
# ----------------------------------------------------------------------------------------------
@kernel
def _fill_kernel(t, value, ctx):
    ctx.write(t, torch.broadcast_to(value, (ctx.replicas, *t.shape())))


def _fill_value(t: Tensor, value):
    ty = t.elementType()
    if isinstance(value, Tensor):
        raise TypeError("fill needs a scalar fill value")
    if ty == poplar.BOOL:
        return torch.tensor(bool(value))
    if ty.is_float:
        return torch.tensor(float(value), dtype=ty.torch_dtype)
    if isinstance(value, float) and not float(value).is_integer():
        raise poplar.graph_connection_error(f"fill: value {value} does not fit a {ty} tensor (not an integer)")
    return ty.wrap(torch.tensor(int(value)))


def _add_fill(graph, t, cs, value, runs=None):
    """Fill vertices for all of ``t`` (on its own tiles), or for the flat ranges ``runs = (begins,
    ends, global tiles)`` of ``t``, each filled by a vertex on its tile (written to the owner)."""
    _require_writeable(t, "fill")
    v = _fill_value(t, value)
    T = graph._top._target.getNumTiles()
    if runs is None:
        target_t, write = t, Access(t)
        used, counts = tile_counts_of(graph, t)
    else:
        b, e, tl = runs
        flat = t.flatten()
        target_t = concat([flat.slice(int(x), int(y)) for x, y in zip(b.tolist(), e.tolist())]) if b.size \
            else flat.slice(0, 0)
        off = np.r_[0, np.cumsum(e - b)]
        write = Access(target_t, flat_boxes(off[:-1], off[1:], tl))
        c = np.bincount(tl.astype(np.int64), weights=e - b, minlength=T).astype(np.int64)
        used = np.flatnonzero(c)
        counts = c[used]
    vt, vn = _worker_split(graph, used, counts, t.elementType())
    graph.add_vertex_group(cs, VertexGroup(
        f"popops::Fill<{t.elementType()}>", vt, fill_cycles(vn, t.elementType(), graph.getTarget()),
        functools.partial(_fill_kernel, target_t, v), writes=[write], multi=False,
        state_bytes=12))


def fill(graph, t, prog_or_mapping, fill_value_or_cs=None, fill_value=None, debug_name: str = ""):
    """``popops::fill``: set every element of ``t`` to a scalar.

    Forms: ``fill(graph, t, prog, fillValue, debug_name="")`` (appends one compute set) and
    ``fill(graph, t, tile | mapping, cs, fillValue)`` (adds vertices for the elements of ``t`` on
    ``tile``, or in ``mapping`` = per-tile lists of :class:`Interval`, to ``cs``).

    Raises:
        poplar.invalid_tile_mapping: ``t`` not fully mapped. poplar.graph_connection_error: ``t``
        contains constants or aliases, or an integer tensor gets a non-integer value.
    """
    if isinstance(fill_value_or_cs, ComputeSet):
        cs, value = fill_value_or_cs, fill_value
        mapping = prog_or_mapping
        if isinstance(mapping, (int, np.integer)):
            g = graph._global_tile(int(mapping))
            b, e, tl = graph.tile_runs_of(t)
            on = tl == g
            _add_fill(graph, t, cs, value, (b[on], e[on], tl[on].astype(np.int64)))
            return
        bs, es, ts = [], [], []
        for tile, ivs in enumerate(mapping):
            for iv in ivs:
                b, e = (iv.begin(), iv.end()) if isinstance(iv, Interval) else iv
                bs.append(b)
                es.append(e)
                ts.append(graph._global_tile(tile))
        n = t.numElements()
        # later intervals win where they overlap (as assignment over the elements would)
        starts, tiles = tilemap.assign(*tilemap.unmapped(), n, np.clip(np.array(bs, np.int64), 0, n),
                                       np.clip(np.array(es, np.int64), 0, n), np.array(ts, np.int64))
        ends = tilemap.ends(starts, n)
        on = tiles >= 0
        _add_fill(graph, t, cs, value, (starts[on], ends[on], tiles[on].astype(np.int64)))
        return
    prog, value = prog_or_mapping, fill_value_or_cs
    if isinstance(fill_value, str) and not debug_name:
        debug_name = fill_value
    _require_mapped(graph, t, "fill")
    _fill_value(t, value)                       # validate before adding anything
    _require_writeable(t, "fill")
    cs = graph.addComputeSet(debug_name or "fill")
    _add_fill(graph, t, cs, value)
    prog.add(poplar.program.Execute(cs))


def zero(graph, t, prog_or_mapping, cs_or_name=None, debug_name: str = ""):
    """``popops::zero``: ``zero(graph, t, prog, debug_name="")`` or ``zero(graph, t, tile | mapping,
    cs)``; a :func:`fill` with 0."""
    if isinstance(cs_or_name, ComputeSet):
        fill(graph, t, prog_or_mapping, cs_or_name, 0)
    else:
        fill(graph, t, prog_or_mapping, 0, debug_name=cs_or_name or debug_name or "zero")


# ----------------------------------------------------------------------------------------------
# iota
# ----------------------------------------------------------------------------------------------
@kernel
def _iota_kernel(t, start, ctx):
    n = t.numElements()
    v = torch.arange(start, start + n, dtype=torch.int64)
    ctx.write(t, t.elementType().wrap(v).expand(ctx.replicas, n))


def iota(graph, t, startInteger, prog, debug_name: str = "") -> None:  # noqa: N803
    """``popops::iota``: ``t[i] = startInteger + i`` for a mapped 1-D INT or UNSIGNED_INT tensor.

    Raises:
        poplar.graph_connection_error: ``t`` not 1-D, or not INT / UNSIGNED_INT.
        poplar.invalid_tile_mapping: ``t`` not fully mapped.
    """
    if t.rank() != 1:
        raise poplar.graph_connection_error(f"iota: the output must be 1-D, got shape {t.shape()}")
    if t.elementType() not in (poplar.INT, poplar.UNSIGNED_INT):
        raise poplar.graph_connection_error(f"iota: the output must be int or unsigned int, got {t.elementType()}")
    if t.elementType() == poplar.UNSIGNED_INT and int(startInteger) < 0:
        raise poplar.graph_connection_error("iota: a negative start for an unsigned int output")
    _require_writeable(t, "iota")
    _require_mapped(graph, t, "iota")
    b, e, tl = graph.tile_runs_of(t)                 # runs of equal tile in element order
    run_tile, run_len = tl.astype(np.int64), e - b
    vw = graph.getTarget().getVectorWidth(t.elementType())
    T = graph.getTarget().getNumTiles()
    per_tile = np.bincount(run_tile, weights=4 + 3 * (-(-run_len // vw)), minlength=T)
    used = np.flatnonzero(np.bincount(run_tile, minlength=T))
    cs = graph.addComputeSet(debug_name or "iota")
    graph.add_vertex_group(cs, VertexGroup(
        f"popops::Iota<{t.elementType()}>", used, (10 + per_tile[used]).astype(np.int64),
        functools.partial(_iota_kernel, t, int(startInteger)), writes=[Access(t)], multi=False))
    prog.add(poplar.program.Execute(cs))


# ----------------------------------------------------------------------------------------------
# pad
# ----------------------------------------------------------------------------------------------
class padding:  # noqa: N801 - PopLibs namespace popops::padding
    """``popops::padding``: ``Type`` (EDGE, REFLECT) and ``MappingMethod`` (NONE, ZERO, EDGE)."""

    class Type(enum.Enum):
        EDGE = "edge"
        REFLECT = "reflect"

    class MappingMethod(enum.Enum):
        NONE = 0
        ZERO = 1
        EDGE = 2


def _pad_lists(t, lower, upper, dim):
    if dim is not None:
        if not 0 <= int(dim) < t.rank():
            raise poplar.index_error(f"pad: dimension {dim} out of range for a tensor of rank {t.rank()}")
        lo, up = [0] * t.rank(), [0] * t.rank()
        lo[int(dim)], up[int(dim)] = int(lower), int(upper)
        return lo, up
    lo, up = [int(x) for x in lower], [int(x) for x in upper]
    if len(lo) != t.rank() or len(up) != t.rank():
        raise poplar.index_error(
            f"pad: paddingLower and paddingUpper need {t.rank()} entries (one per dimension), "
            f"got {len(lo)} and {len(up)}")
    return lo, up


def _truncate(t, lo, up):
    """Apply negative padding (truncation); returns the tensor and the non-negative paddings."""
    for d in range(t.rank()):
        b, e = max(0, -lo[d]), t.dim(d) - max(0, -up[d])
        if b > e:
            raise poplar.index_error(f"pad: negative padding removes more than the {t.dim(d)} elements of dim {d}")
        if b or e != t.dim(d):
            t = t.slice(b, e, d)
    return t, [max(0, x) for x in lo], [max(0, x) for x in up]


def _pad_view(t, lower, upper, dim, type_):
    lo, up = _pad_lists(t, lower, upper, dim)
    t, lo, up = _truncate(t, lo, up)
    mode = padding.Type(type_).value if not isinstance(type_, padding.Type) else type_.value
    for d in range(t.rank()):
        if (lo[d] or up[d]) and t.dim(d) == 0:
            raise poplar.index_error(f"pad: cannot {mode}-pad the empty dimension {d}")
        if mode == "reflect" and max(lo[d], up[d]) >= t.dim(d) and (lo[d] or up[d]):
            raise poplar.index_error(
                f"pad: reflect padding of {max(lo[d], up[d])} needs dimension {d} longer than that (size {t.dim(d)})")
    # numpy's pad, axis by axis, from views: edge repeats the end slices, reflect mirrors the
    # slices next to them (padding narrower than the dimension, checked above)
    for d in range(t.rank()):
        n = t.dim(d)
        parts = []
        if lo[d]:
            parts.append(t.slice(0, 1, d).broadcast(lo[d], d) if mode == "edge" else t.slice(1, lo[d] + 1, d).reverse(d))
        parts.append(t)
        if up[d]:
            parts.append(t.slice(n - 1, n, d).broadcast(up[d], d) if mode == "edge"
                         else t.slice(n - 1 - up[d], n - 1, d).reverse(d))
        if len(parts) > 1:
            t = concat(parts, d)
    return t


def pad(graph_or_t, *args, **kwargs):
    """``popops::pad``: a padded view of a tensor (no data is copied; padding is concatenated).

    Forms (PopLibs ``Pad.hpp``):

    - ``pad(graph, t, paddingLower, paddingUpper, val=0.0, mappingMethod=padding.MappingMethod.ZERO)``
      and ``pad(graph, t, lower, upper, dim, val=0.0, mappingMethod=ZERO)``: constant padding.
      ``val`` is a number (new constants of ``t``'s type) or a scalar Tensor (padding aliases it).
      ``ZERO`` maps the new constants to tile 0, ``EDGE`` like their nearest edge element of
      ``t``, ``NONE`` leaves them unmapped.
    - ``pad(t, paddingLower, paddingUpper, padding.Type.EDGE | REFLECT)`` and
      ``pad(t, lower, upper, dim, type)``: numpy-style padding built from views of ``t``.

    Negative padding truncates. Returns the padded tensor.

    Raises:
        poplar.index_error: wrong number of paddings, a bad dim, or truncation past the size.
    """
    if isinstance(graph_or_t, Tensor):
        t = graph_or_t
        lower, upper, *rest = args
        dim = rest.pop(0) if isinstance(lower, (int, np.integer)) else None
        type_ = rest[0] if rest else kwargs.get("type", padding.Type.EDGE)
        return _pad_view(t, lower, upper, dim, type_)
    graph = graph_or_t
    t, lower, upper, *rest = args
    dim = rest.pop(0) if isinstance(lower, (int, np.integer)) else None
    val = rest.pop(0) if rest else kwargs.get("val", 0.0)
    method = rest.pop(0) if rest else kwargs.get("mappingMethod", padding.MappingMethod.ZERO)
    lo, up = _pad_lists(t, lower, upper, dim)
    if isinstance(val, Tensor):
        if val.numElements() != 1 or val.elementType() != t.elementType():
            raise poplar.graph_connection_error(
                f"pad: the pad value tensor must be a scalar of type {t.elementType()}, got {val.shortString()}")
    t, lo, up = _truncate(t, lo, up)
    for d in range(t.rank()):
        parts = []
        for amount, edge_at in ((lo[d], 0), (up[d], -1)):
            if amount == 0:
                parts.append(None)
                continue
            shape = t.shape()
            shape[d] = amount
            if isinstance(val, Tensor):
                p = val.flatten().slice(0, 1).reshape([1] * len(shape)).broadcast_to(shape)
            else:
                p = graph.addConstant(t.elementType(), shape, val, "padding")
                if method == padding.MappingMethod.ZERO:
                    graph.setTileMapping(p, 0)
                elif method == padding.MappingMethod.EDGE:
                    if t.dim(d) == 0:
                        raise poplar.index_error("pad: EDGE mapping needs a non-empty tensor to pad")
                    require_mapped(graph, t, "pad: EDGE mapping needs a completely mapped tensor")
                    k = 0 if edge_at == 0 else t.dim(d) - 1
                    graph.copy_tile_mapping(p, t.slice(k, k + 1, d).broadcast(amount, d))
            parts.append(p)
        if parts[0] is not None or parts[1] is not None:
            t = concat([x for x in (parts[0], t, parts[1]) if x is not None], d)
    return t


# ----------------------------------------------------------------------------------------------
# encodeOneHot
# ----------------------------------------------------------------------------------------------
@kernel
def _one_hot_kernel(indices, encoded, on, off, on_v, off_v, ctx):
    idx = ctx.read(indices).to(torch.int64)              # [R, N]
    R = idx.shape[0]
    N, C = encoded.shape()
    onv = ctx.read(on).reshape(R, 1, 1) if on is not None else on_v
    offv = ctx.read(off).reshape(R, 1, 1) if off is not None else off_v
    hot = (idx.unsqueeze(-1) == torch.arange(C, dtype=torch.int64)) & (idx.unsqueeze(-1) >= 0)
    out = torch.where(hot, onv, offv)
    ctx.write(encoded, torch.broadcast_to(out, (R, N, C)))


def encodeOneHot(graph, indices, encoded, prog, *args, **kwargs) -> None:  # noqa: N802
    """``popops::encodeOneHot(graph, indices, encoded, prog[, on, off], debug_name="")``.

    ``encoded[i, j] = on if indices[i] == j else off`` (``on``/``off`` default 1 and 0, or scalar
    tensors of ``encoded``'s type). ``indices`` is 1-D of length N (an integer type); ``encoded``
    is a mapped [N, C] tensor. An index outside [0, C), including ``MASKED_LABEL_CODE``, leaves its
    row all ``off``.

    Raises:
        poplar.index_error: shapes that do not match. poplar.graph_connection_error: non-integer
        indices, or on/off of the wrong type or size. poplar.invalid_tile_mapping: unmapped output.
    """
    on = off = None
    rest = list(args)
    if rest and isinstance(rest[0], Tensor):
        on, off = rest[0], rest[1]
        rest = rest[2:]
    name = kwargs.get("debug_name", rest[0] if rest else "")
    if indices.rank() != 1 or encoded.rank() != 2 or encoded.dim(0) != indices.dim(0):
        raise poplar.index_error(
            f"encodeOneHot: indices must be 1-D [N] and encoded 2-D [N, C]; "
            f"got {indices.shape()} and {encoded.shape()}")
    if indices.elementType().is_float or indices.elementType() == poplar.BOOL:
        raise poplar.graph_connection_error(
            f"encodeOneHot: indices must be an integer type, got {indices.elementType()}")
    et = encoded.elementType()
    for x, nm in ((on, "on"), (off, "off")):
        if x is not None and (x.numElements() != 1 or x.elementType() != et):
            raise poplar.graph_connection_error(
                f"encodeOneHot: '{nm}' must be a scalar {et} tensor, got {x.shortString()}")
    _require_writeable(encoded, "encodeOneHot")
    _require_mapped(graph, encoded, "encodeOneHot")
    N, C = encoded.shape()
    # the output is first set to 'off' (zero) by Fill vertices
    if off is None:
        cs0 = graph.addComputeSet((name or "encodeOneHot") + "/zero")
        _add_fill(graph, encoded, cs0, 0)
        prog.add(poplar.program.Execute(cs0))
    # then per tile one EncodeOneHot vertex over the rows with elements there
    rows_per_tile = rows_per_tile_of(graph, encoded)
    used = np.flatnonzero(rows_per_tile)
    custom = on is not None
    multi = (not custom) and indices.elementType() == poplar.UNSIGNED_INT and et == poplar.HALF
    cycles = 11 + 74 * rows_per_tile[used] if multi else 100 * rows_per_tile[used]
    on_v = None if custom else _cast_values(torch.tensor(1), poplar.INT, et)
    off_v = None if custom else _cast_values(torch.tensor(0), poplar.INT, et)
    # each tile reads the indices of the rows it holds, and the on/off values
    rt, ra, rz = row_intervals_per_tile(graph, encoded)
    reads = [Access(indices, flat_boxes(ra, rz, rt))]
    if custom:
        for x in (on, off):
            reads.append(Access(x.flatten(), read_on_tiles(x.flatten(), used)))
    cs = graph.addComputeSet(name or "encodeOneHot")
    vname = f"popops::EncodeOneHot{'CustomValues' if custom else ''}<{indices.elementType()},{et}>"
    graph.add_vertex_group(cs, VertexGroup(
        vname, used, cycles.astype(np.int64),
        functools.partial(_one_hot_kernel, indices, encoded, on, off, on_v, off_v),
        reads=reads, writes=[Access(encoded)], multi=multi))
    prog.add(poplar.program.Execute(cs))


__all__ = ["cast", "castWithOutput", "fill", "zero", "iota", "pad", "padding", "encodeOneHot", "MASKED_LABEL_CODE",
           "cast_cycles", "fill_cycles"]
