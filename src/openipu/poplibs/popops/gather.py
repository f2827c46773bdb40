"""``popops``: XLA-style gather and scatter (PopLibs ``include/popops/Gather.hpp``, ``Scatter.hpp``).

Semantics are XLA's (https://www.tensorflow.org/xla/operation_semantics, which PopLibs ports):

- ``gather``: output dims listed in ``offsetDims`` index into a slice of ``operand`` of size
  ``sliceSizes`` (dims in ``collapsedSliceDims`` removed, they must have size 1); the other
  output dims (batch dims) index ``indices`` with ``indexVectorDim`` removed. The start vector
  ``indices[..., :, ...]`` maps component k to operand dim ``startIndexMap[k]``; starts are
  clamped so the slice lies inside ``operand``.
- ``scatter``: for every update element, ``updateWindowDims`` give the window position (dims in
  ``insertWindowDims`` have size 1 in the window), the other dims give the scatter index; the start
  vector maps to operand dims by ``scatterDimsToOperandDims``. Windows that do not fit inside the
  operand are skipped (XLA). Repeated indices: the last update wins (``scatter``), or updates are
  combined by ``updateComputation`` ("add", "mul", "max", "min", or a callable
  ``f(graph, current, update, prog) -> Tensor`` applied to gathered values, for unique indices).

These cover ONNX Gather, GatherND, GatherElements, ScatterND and ScatterElements.

Cost: one vertex group on the tiles that hold ``operand``, in the shape of PopLibs'
``MultiSlice`` / ``MultiUpdateOp`` estimates (every tile scans all start indices and copies the
expected share of the slices it holds, indices uniform) [A]; indices are broadcast to those tiles
and the gathered elements exchanged to the output, which is mapped linearly; the producing tile of
each output element is assigned in proportion to the operand elements each tile holds [A] (the
real source tile depends on run-time indices): consecutive ranges of the output's elements, one
per tile holding the operand, in tile order.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popops._common import flat_boxes, tile_counts_of

__all__ = ["gather", "scatter"]

WORKERS = 6


def _ints(xs, what, name):
    try:
        return [int(x) for x in xs]
    except TypeError:
        raise poplar.index_error(f"{name}: {what} must be a list of integers, got {xs!r}") from None


def _check_indices(indices, name):
    if not isinstance(indices, poplar.Tensor):
        raise poplar.graph_connection_error(f"{name}: indices must be a Tensor, got {type(indices).__name__}")
    if indices.elementType() not in (poplar.UNSIGNED_INT, poplar.INT):
        raise poplar.graph_connection_error(
            f"{name}: indices must be UNSIGNED_INT or INT, got {indices.elementType()}; cast them first")


def _batch_shape(indices, ivd):
    shape = list(indices.shape())
    if ivd == len(shape):
        return shape, 1
    return shape[:ivd] + shape[ivd + 1:], shape[ivd]


def _producer_tiles(graph, operand, n_out):
    """Expected producing tiles of ``n_out`` gathered elements (flat order): tiles in proportion
    to how many operand elements they hold [A]. Returns ``(boxes of the flat output, used tiles,
    operand elements on each)``; the boxes are consecutive ranges, one per used tile."""
    used, counts = tile_counts_of(graph, operand)
    if n_out == 0 or used.size == 0:
        return flat_boxes([], [], []), used, counts
    share = np.floor(counts / counts.sum() * n_out).astype(np.int64)
    share[: n_out - share.sum()] += 1
    ends = np.cumsum(share)
    return flat_boxes(ends - share, ends, used), used, counts


def _scan_cycles(counts, total, n_starts, window, type_, target, update):
    """MultiSlice-shaped tile cycles: every worker scans all starts (8 cycles each out of range,
    PopLibs cyclesOverheadPerOffsetOutOfRange) and copies its expected share of slice elements
    (19 + vectors x 2 per slice in range, cyclesOverheadPerOffsetInRange) [A]."""
    vw = 4 if type_.size == 1 else 2 if type_.size == 2 else max(1, target.getDataPathWidth() // 32)
    frac = counts / max(total, 1)
    copied = np.ceil(n_starts * window * frac / WORKERS)
    in_range = np.minimum(np.ceil(n_starts * np.minimum(1.0, frac * max(1, window)) / WORKERS), n_starts)
    per_worker = (29 if update else 30) + in_range * 19 + np.ceil(copied / vw) * 2 + (n_starts - in_range) * 8
    if update:
        per_worker = per_worker + np.ceil(copied / vw) * 3     # read-modify-write of MultiUpdateOp [A]
    return (WORKERS * per_worker).astype(np.int64)


# ----------------------------------------------------------------------------------------------
# index arithmetic shared by the kernels (torch, vectorised)
# ----------------------------------------------------------------------------------------------
def _start_vectors(idx, ivd, nk):
    """``indices`` [R, *shape] -> start vectors [R, B, nk] (batch positions in row-major order)."""
    R = idx.shape[0]
    if ivd == idx.dim() - 1:
        return idx.reshape(R, -1, 1) if nk == 1 else idx.reshape(R, -1, nk)
    return torch.movedim(idx, ivd + 1, -1).reshape(R, -1, nk)


@kernel
def _gather_kernel(operand, indices, out, ivd, window_dims, slice_sizes, start_map, out_perm, ctx):
    op = ctx.read(operand)
    R = op.shape[0]
    oshape = torch.tensor(list(op.shape[1:]), dtype=torch.int64)
    rank = oshape.numel()
    idx = ctx.read(indices).to(torch.int64)
    S = _start_vectors(idx, ivd, len(start_map))                          # [R, B, nk]
    starts = torch.zeros(R, S.shape[1], rank, dtype=torch.int64)
    if start_map:
        starts[:, :, start_map] = S
    sizes = torch.tensor(slice_sizes, dtype=torch.int64)
    starts = torch.minimum(torch.clamp(starts, min=0), oshape - sizes)   # XLA clamps the starts
    grids = torch.meshgrid(*[torch.arange(s) for s in slice_sizes], indexing="ij") if rank else ()
    win = torch.stack([g.reshape(-1) for g in grids], -1) if rank else torch.zeros(1, 0, dtype=torch.int64)
    full = starts[:, :, None, :] + win[None, None]                        # [R, B, W, rank]
    strides = torch.tensor([int(np.prod(op.shape[2 + d:])) for d in range(rank)], dtype=torch.int64)
    lin = (full * strides).sum(-1).reshape(R, -1)
    vals = torch.gather(op.reshape(R, -1), 1, lin)
    # [R, *batch, *window(kept dims)] -> output dim order
    vals = vals.reshape([R] + list(out_perm[0]) + list(window_dims))
    ctx.write(out, vals.permute([0] + [1 + p for p in out_perm[1]]))


def gather(graph, operand, indices, indexVectorDim, offsetDims, sliceSizes, collapsedSliceDims,  # noqa: N803
           startIndexMap, prog, debug_name: str = ""):
    """``popops::gather(graph, operand, indices, indexVectorDim, offsetDims, sliceSizes,
    collapsedSliceDims, startIndexMap, prog, debugContext)`` with XLA semantics (module doc).

    Returns a new tensor of rank ``batch rank + len(offsetDims)``, mapped linearly.
    Raises ``poplar.index_error`` for inconsistent dimension arguments and
    ``poplar.graph_connection_error`` for non-integer indices."""
    name = debug_name or "gather"
    _check_indices(indices, name)
    if not isinstance(operand, poplar.Tensor):
        raise poplar.graph_connection_error(f"{name}: operand must be a Tensor")
    rank = operand.rank()
    ivd = int(indexVectorDim)
    offset_dims = _ints(offsetDims, "offsetDims", name)
    sizes = _ints(sliceSizes, "sliceSizes", name)
    collapsed = sorted(_ints(collapsedSliceDims, "collapsedSliceDims", name))
    start_map = _ints(startIndexMap, "startIndexMap", name)
    if not 0 <= ivd <= indices.rank():
        raise poplar.index_error(f"{name}: indexVectorDim {ivd} must be in [0, {indices.rank()}] (indices rank)")
    batch, nk = _batch_shape(indices, ivd)
    if len(sizes) != rank:
        raise poplar.index_error(f"{name}: sliceSizes has {len(sizes)} entries; operand rank is {rank}")
    if any(not 0 <= s <= operand.dim(d) for d, s in enumerate(sizes)):
        raise poplar.index_error(f"{name}: sliceSizes {sizes} exceed operand shape {operand.shape()}")
    if len(start_map) != nk or len(set(start_map)) != nk or any(not 0 <= d < rank for d in start_map):
        raise poplar.index_error(
            f"{name}: startIndexMap {start_map} must list {nk} distinct operand dims (the index vector length)")
    if len(set(collapsed)) != len(collapsed) or any(not 0 <= d < rank or sizes[d] != 1 for d in collapsed):
        raise poplar.index_error(f"{name}: collapsedSliceDims {collapsed} must be distinct operand dims of slice size 1")
    window = [sizes[d] for d in range(rank) if d not in collapsed]
    out_rank = len(batch) + len(window)
    if len(offset_dims) != len(window) or sorted(set(offset_dims)) != offset_dims or \
            any(not 0 <= d < out_rank for d in offset_dims):
        raise poplar.index_error(
            f"{name}: offsetDims {offset_dims} must be {len(window)} increasing output dims in [0, {out_rank})")
    out_shape, src_of = [], []
    bi, wi = 0, 0
    for d in range(out_rank):
        if d in offset_dims:
            out_shape.append(window[wi])
            src_of.append(len(batch) + wi)
            wi += 1
        else:
            out_shape.append(batch[bi])
            src_of.append(bi)
            bi += 1
    out = graph.addVariable(operand.elementType(), out_shape, name)
    from openipu.poplibs.poputil import mapTensorLinearly
    mapTensorLinearly(graph, out)
    n_out = out.numElements()
    if n_out == 0:
        return out
    if not graph.is_mapped(operand):
        raise poplar.invalid_tile_mapping(f"{name}: the operand is not completely mapped to tiles")
    # kernel permutation: vals are [batch..., window...]; output dim d takes vals dim src_of[d]
    prod_boxes, used, counts = _producer_tiles(graph, operand, n_out)
    B = int(np.prod(batch, dtype=np.int64))
    W = int(np.prod(window, dtype=np.int64))
    cyc = _scan_cycles(counts, operand.numElements(), B, W, operand.elementType(), graph.getTarget(), False)
    from openipu.poplibs.popops.dynamic_slice import _bcast
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        f"popops::MultiSlice<{operand.elementType()}>", used, cyc,
        functools.partial(_gather_kernel, operand, indices, out, ivd, window, sizes, start_map, (batch, src_of)),
        reads=[Access(operand), _bcast(indices, used)], writes=[Access(out.flatten(), prod_boxes)],
        multi=True, flops=0.0, state_bytes=32))
    prog.add(poplar.program.Execute(cs))
    return out


# ----------------------------------------------------------------------------------------------
# scatter
# ----------------------------------------------------------------------------------------------
_COMBINE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter_positions(op_shape, idx, upd_shape, ivd, window_dims, inserted, dims_map):
    """Linear operand position [R, U] of every update element and its validity (XLA scatter)."""
    rank = len(op_shape)
    R = idx.shape[0]
    scat_dims = [d for d in range(len(upd_shape)) if d not in window_dims]
    S = _start_vectors(idx, ivd, len(dims_map))                         # [R, B, nk]
    starts = torch.zeros(R, S.shape[1], rank, dtype=torch.int64)
    if dims_map:
        starts[:, :, dims_map] = S
    kept = [d for d in range(rank) if d not in inserted]
    wsize = [upd_shape[d] for d in window_dims]
    full_w = [1] * rank
    for k, d in enumerate(kept):
        full_w[d] = wsize[k]
    grids = torch.meshgrid(*[torch.arange(s) for s in full_w], indexing="ij") if rank else ()
    win = torch.stack([g.reshape(-1) for g in grids], -1) if rank else torch.zeros(1, 0, dtype=torch.int64)
    shape_t = torch.tensor(op_shape, dtype=torch.int64)
    ok = ((starts >= 0) & (starts + torch.tensor(full_w) <= shape_t)).all(-1)   # [R, B]
    full = starts[:, :, None, :] + win[None, None]
    strides = torch.tensor([int(np.prod(op_shape[d + 1:])) for d in range(rank)], dtype=torch.int64)
    lin = (full * strides).sum(-1)                                      # [R, B, W]
    W = win.shape[0]
    valid = ok[:, :, None].expand(-1, -1, W)
    # order of update elements: updates permuted to [scatter dims..., window dims...]
    perm = scat_dims + list(window_dims)
    return lin.reshape(R, -1), valid.reshape(R, -1), perm


@kernel
def _scatter_kernel(operand, indices, updates, ivd, window_dims, inserted, dims_map, mode, ctx):
    op = ctx.read(operand)
    R = op.shape[0]
    flat = op.reshape(R, -1).clone()
    upd = ctx.read(updates)
    lin, valid, perm = _scatter_positions(list(op.shape[1:]), ctx.read(indices).to(torch.int64), list(upd.shape[1:]),
                                          ivd, window_dims, inserted, dims_map)
    vals = upd.permute([0] + [1 + p for p in perm]).reshape(R, -1).to(flat.dtype)
    for r in range(R):
        li, v = lin[r][valid[r]], vals[r][valid[r]]
        if mode == "set":
            last = torch.full((flat.shape[1],), -1, dtype=torch.int64).scatter_reduce_(
                0, li, torch.arange(li.numel()), "amax", include_self=True)
            hit = last >= 0
            flat[r][hit] = v[last[hit]]
        else:
            acc = torch.float32 if flat.dtype == torch.float16 else flat.dtype
            flat[r] = flat[r].to(acc).scatter_reduce(0, li, v.to(acc), _COMBINE[mode], include_self=True).to(flat.dtype)
    ctx.write(operand, flat.reshape(op.shape))


def scatter(graph, operand, indices, updates, indexVectorDim, updateWindowDims, insertWindowDims,  # noqa: N803
            scatterDimsToOperandDims, *rest, debug_name: str = ""):
    """``popops::scatter(graph, operand, indices, updates, indexVectorDim, updateWindowDims,
    insertWindowDims, scatterDimsToOperandDims, [updateComputation,] prog, debugContext)``:
    updates ``operand`` in place (XLA semantics, module doc).

    ``updateComputation``: "add", "mul", "max", "min" (repeated indices combine), or a callable
    ``f(graph, current, update, prog) -> Tensor`` (gathered current values and updates; repeated
    indices: the last result wins). Raises ``poplar.index_error`` / ``graph_connection_error``."""
    rest = list(rest)
    update_fn = None
    if rest and not isinstance(rest[0], poplar.program.Program):
        update_fn = rest.pop(0)
    if not rest:
        raise poplar.poplar_error("scatter: missing the program to add to")
    prog = rest[0]
    name = debug_name or (rest[1] if len(rest) > 1 and isinstance(rest[1], str) else "") or "scatter"
    _check_indices(indices, name)
    if not isinstance(operand, poplar.Tensor) or not isinstance(updates, poplar.Tensor):
        raise poplar.graph_connection_error(f"{name}: operand and updates must be Tensors")
    if operand.elementType() != updates.elementType():
        raise poplar.graph_connection_error(
            f"{name}: updates are {updates.elementType()} but the operand is {operand.elementType()}")
    rank = operand.rank()
    ivd = int(indexVectorDim)
    window_dims = _ints(updateWindowDims, "updateWindowDims", name)
    inserted = sorted(_ints(insertWindowDims, "insertWindowDims", name))
    dims_map = _ints(scatterDimsToOperandDims, "scatterDimsToOperandDims", name)
    if not 0 <= ivd <= indices.rank():
        raise poplar.index_error(f"{name}: indexVectorDim {ivd} must be in [0, {indices.rank()}]")
    batch, nk = _batch_shape(indices, ivd)
    urank = updates.rank()
    if sorted(set(window_dims)) != window_dims or any(not 0 <= d < urank for d in window_dims):
        raise poplar.index_error(f"{name}: updateWindowDims {window_dims} must be increasing dims of updates")
    if len(window_dims) + len(inserted) != rank or len(set(inserted)) != len(inserted) or \
            any(not 0 <= d < rank for d in inserted):
        raise poplar.index_error(
            f"{name}: len(updateWindowDims) + len(insertWindowDims) must equal the operand rank {rank}")
    if len(dims_map) != nk or len(set(dims_map)) != nk or any(not 0 <= d < rank for d in dims_map):
        raise poplar.index_error(f"{name}: scatterDimsToOperandDims {dims_map} must list {nk} distinct operand dims")
    scat = [updates.dim(d) for d in range(urank) if d not in window_dims]
    if scat != batch:
        raise poplar.graph_connection_error(
            f"{name}: the scatter dims of updates {scat} must equal the index batch shape {batch}")
    kept = [d for d in range(rank) if d not in inserted]
    if any(updates.dim(w) > operand.dim(k) for w, k in zip(window_dims, kept)):
        raise poplar.index_error(f"{name}: update windows are larger than the operand")
    if not graph.is_mapped(operand):
        raise poplar.invalid_tile_mapping(f"{name}: the operand is not completely mapped to tiles")
    mode = "set"
    if isinstance(update_fn, str):
        if update_fn.lower() not in _COMBINE:
            raise poplar.poplar_error(f"{name}: updateComputation {update_fn!r}: use add, mul, max, min or a callable")
        mode = update_fn.lower()
    elif update_fn is not None:
        # gather the current windows, combine with the graph function, then scatter the results
        cur = gather(graph, operand, indices, ivd, window_dims, [updates.dim(window_dims[kept.index(d)]) if d in kept
                                                                 else 1 for d in range(rank)],
                     inserted, dims_map, prog, f"{name}/current")
        combined = update_fn(graph, cur, updates, prog)
        scatter(graph, operand, indices, combined, ivd, window_dims, inserted, dims_map, prog, debug_name=name)
        return
    if updates.numElements() == 0:
        return
    B = int(np.prod(batch, dtype=np.int64))
    W = updates.numElements() // max(B, 1)
    cons, used, counts = _producer_tiles(graph, operand, updates.numElements())
    cyc = _scan_cycles(counts, operand.numElements(), B, W, operand.elementType(), graph.getTarget(), mode != "set")
    from openipu.poplibs.popops.dynamic_slice import _bcast
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        f"popops::{'MultiUpdate' if mode == 'set' else 'MultiUpdateOp'}<{operand.elementType()}>", used, cyc,
        functools.partial(_scatter_kernel, operand, indices, updates, ivd, window_dims, inserted, dims_map, mode),
        reads=[Access(operand), Access(updates.flatten(), cons), _bcast(indices, used)], writes=[Access(operand)],
        multi=True, flops=float(updates.numElements() if mode != "set" else 0), state_bytes=32))
    prog.add(poplar.program.Execute(cs))
