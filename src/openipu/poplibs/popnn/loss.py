"""``popnn``: losses, accuracy and arg max/min (PopLibs ``include/popnn/Loss.hpp``).

``calcLoss`` builds and *returns* a program (PopLibs returns a ``poplar::program::Program``; add it
to your sequence): a ``LossSumSquaredTransform`` / ``LossCrossEntropyTransform`` vertex group over
the tiles of ``modelOutputs`` that writes the deltas and a per-element loss term, then an add-reduce
of each row into ``loss``. With ``numCorrect`` it also appends :func:`calcAccuracy`.

Per-element terms (PopLibs codelets ``LossSumSquaredTransform.cpp``, ``LossCrossEntropyTransform.cpp``):

- SUM_SQUARED_LOSS: ``delta = p - e``; ``term = 0.5 * delta^2``.
- CROSS_ENTROPY_LOSS: ``delta = (deltasScale / modelOutputScaling) * (p - e * modelOutputScaling)``;
  ``term = -e * (log(p + eps) - log(modelOutputScaling))`` with ``eps`` = 1.17549435e-38 (float)
  or 5.9605e-8 (half) (PopLibs ``EncodingConstants.hpp``). Rows whose label is
  ``MASKED_LABEL_CODE`` have zero deltas and loss.

``expected`` is a ``[batch]`` tensor of class labels (``UNSIGNED_INT`` or ``INT``; ``0xFFFFFFFF``
/ -1 masks a row) as in PopLibs; openipu also accepts a ``[batch, classes]`` float tensor of the
model outputs' type (one-hot or soft targets).

Cycle estimates: ``getLossTransformCycles`` (PopLibs ``lib/popnn/PerformanceEstimation.hpp``)
``5 + (6|5) + 5 + [half] + 2 + 1 + (9|4) x n (/2 for half) + 1`` per tile, single worker; the
loss sum is ``popops.reduceWithOutput`` (costed there); ``CalcAccuracy`` ``5 + 8 + 4 x batch + 1``.
"""

from __future__ import annotations

import enum
import functools

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popnn._common import (check_mapped, compress_runs, multicast, new_mapped, poplibs_error,
                                           row_arg_reduce, row_boxes, row_first_tiles, tile_counts_of)
from openipu.poplibs.popops.reduce import Operation, reduceWithOutput

__all__ = ["LossType", "SUM_SQUARED_LOSS", "CROSS_ENTROPY_LOSS", "MASKED_LABEL_CODE", "calcLoss", "calcAccuracy",
           "argMax", "argMin", "maxAndArgMax", "minAndArgMin", "topK"]

#: Label value of a masked row (PopLibs ``popops/EncodingConstants.hpp``).
MASKED_LABEL_CODE = 0xFFFFFFFF
EPS_LOG_N_FLOAT = 1.17549435e-38
EPS_LOG_N_HALF = 0.000000059605


class LossType(enum.Enum):
    """``popnn::LossType``."""

    SUM_SQUARED_LOSS = 0
    CROSS_ENTROPY_LOSS = 1

    def __str__(self):
        return self.name


SUM_SQUARED_LOSS = LossType.SUM_SQUARED_LOSS
CROSS_ENTROPY_LOSS = LossType.CROSS_ENTROPY_LOSS


def loss_transform_cycles(n: np.ndarray, is_float: bool, is_softmax: bool) -> np.ndarray:
    """Worker cycles of a loss-transform vertex over ``n`` elements (PopLibs ``getLossTransformCycles``)."""
    n = np.asarray(n, np.int64)
    return (5 + (6 if is_softmax else 5) + 5 + (0 if is_float else 1) + 2 + 1
            + (9 if is_softmax else 4) * (n if is_float else n // 2)
            + (0 if is_float else 2 + np.where(n & 1, 11 if is_softmax else 6, 0)) + 1)


def _expected_rows(e: torch.Tensor, classes: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(one-hot [R, B, C] in ``dtype``, mask [R, B] of unmasked rows) from labels or targets."""
    if e.dim() == 3:
        return e.to(dtype), torch.ones(e.shape[:2], dtype=torch.bool)
    lab = e.to(torch.int64)
    masked = (lab == MASKED_LABEL_CODE) | (lab == -1)
    valid = ~masked & (lab >= 0) & (lab < classes)
    onehot = torch.nn.functional.one_hot(torch.where(valid, lab, 0), classes).to(dtype) * valid.unsqueeze(-1).to(dtype)
    return onehot, ~masked


@kernel
def _transform_kernel(lt, probs, expected, deltas, terms, ds, mos, ctx):
    p = ctx.read(probs)
    R, B, C = p.shape
    onehot, keep = _expected_rows(ctx.read(expected), C, p.dtype)
    if lt == "SUM_SQUARED_LOSS":
        d = p - onehot
        t = 0.5 * d * d
    else:
        eps = EPS_LOG_N_FLOAT if p.dtype == torch.float32 else EPS_LOG_N_HALF
        s = ctx.read(ds).reshape(R, 1, 1).to(torch.float32) if ds is not None else torch.ones(R, 1, 1)
        m = ctx.read(mos).reshape(R, 1, 1).to(torch.float32) if mos is not None else torch.ones(R, 1, 1)
        pf, ef = p.to(torch.float32), onehot.to(torch.float32)
        d = ((s / m) * (pf - ef * m)).to(p.dtype)
        t = (-ef * (torch.log(pf + eps) - torch.log(m))).to(p.dtype)
    k = keep.unsqueeze(-1).to(p.dtype)
    ctx.write(deltas, d * k)
    ctx.write(terms, t * k)


def _split_args(args):
    """PopLibs' four calcLoss overloads, told apart by where the LossType is."""
    args = list(args)
    pos = next((i for i, a in enumerate(args) if isinstance(a, (LossType, str)) and
                (not isinstance(a, str) or a.split(".")[-1] in LossType.__members__)), None)
    if pos is None:
        raise poplibs_error("calcLoss: no LossType given (popnn.SUM_SQUARED_LOSS or popnn.CROSS_ENTROPY_LOSS)")
    tensors, rest = args[:pos], args[pos + 1:]
    lt = args[pos] if isinstance(args[pos], LossType) else LossType[args[pos].split(".")[-1]]
    ds = mos = nc = None
    if len(tensors) == 1:
        (nc,) = tensors
    elif len(tensors) == 2:
        ds, mos = tensors
    elif len(tensors) == 3:
        ds, mos, nc = tensors
    elif tensors:
        raise poplibs_error(f"calcLoss: {len(tensors)} extra tensors before the LossType; expected "
                            "[deltasScale, modelOutputScaling] and/or [numCorrect]")
    return ds, mos, nc, lt, (rest[0] if rest else "")


def calcLoss(graph, modelOutputs, expected, loss, deltas, *args):  # noqa: N802,N803
    """Loss and its gradient per batch element (``popnn::calcLoss``); returns a ``Sequence``.

    Overloads (PopLibs ``Loss.hpp``)::

        calcLoss(graph, modelOutputs, expected, loss, deltas, lossType, debug_name="")
        calcLoss(graph, modelOutputs, expected, loss, deltas, numCorrect, lossType, debug_name="")
        calcLoss(graph, modelOutputs, expected, loss, deltas, deltasScale, modelOutputScaling, lossType, name="")
        calcLoss(graph, modelOutputs, expected, loss, deltas, deltasScale, modelOutputScaling, numCorrect,
                 lossType, name="")

    ``modelOutputs``: ``[batch, classes]`` float/half (probabilities for cross entropy);
    ``expected``: ``[batch]`` labels (UNSIGNED_INT/INT) or ``[batch, classes]`` targets; ``loss``:
    ``[batch]``; ``deltas``: ``[batch, classes]``, both of the outputs' type and mapped;
    ``deltasScale``/``modelOutputScaling``: one-element tensors (cross entropy only);
    ``numCorrect``: one-element UNSIGNED_INT, *incremented* by the number of rows whose arg max
    equals the label (see :func:`calcAccuracy`).

    Raises:
        poplibs_error: shapes or types that do not fit the description above.
    """
    ds, mos, nc, lt, name = _split_args(args)
    name = name or "Loss"
    ot = modelOutputs.elementType()
    if ot not in (poplar.FLOAT, poplar.HALF):
        raise poplibs_error(f"{name}: modelOutputs must be float or half, got {ot}")
    if modelOutputs.rank() != 2:
        raise poplibs_error(f"{name}: modelOutputs must be 2-D [batch, classes], got shape {modelOutputs.shape()}")
    B, C = modelOutputs.shape()
    _check_expected(expected, B, C, ot, name)
    if list(deltas.shape()) != [B, C] or deltas.elementType() != ot:
        raise poplibs_error(f"{name}: deltas must be {ot} [{B}, {C}], got {deltas.elementType()} {deltas.shape()}")
    if loss.numElements() != B or loss.elementType() != ot:
        raise poplibs_error(f"{name}: loss must be {ot} with {B} elements, got {loss.elementType()} {loss.shape()}")
    for t, w in ((ds, "deltasScale"), (mos, "modelOutputScaling")):
        if t is not None and t.numElements() != 1:
            raise poplibs_error(f"{name}: {w} must have one element, got shape {t.shape()}")
    check_mapped(graph, deltas, name)
    check_mapped(graph, loss, name)
    check_mapped(graph, modelOutputs, name)
    prog = poplar.program.Sequence()
    terms = graph.addVariable(ot, [B, C], f"{name}/transformed")
    graph.copy_tile_mapping(terms, modelOutputs)
    is_ce = lt == LossType.CROSS_ENTROPY_LOSS
    vname = f"popnn::{'LossCrossEntropyTransform' if is_ce else 'LossSumSquaredTransform'}<{ot}>"
    used, counts = tile_counts_of(graph, modelOutputs)
    cycles = loss_transform_cycles(counts, ot == poplar.FLOAT, is_ce)
    e_view = expected if expected.rank() == 2 else expected.reshape([B, 1])
    from openipu.poplibs.popops._common import broadcast_view
    reads = [Access(modelOutputs), Access(broadcast_view(e_view, [B, C]), modelOutputs)]
    for t in (ds, mos):
        if t is not None:
            reads.append(multicast(t.flatten(), used))
    cs = graph.addComputeSet(f"{name}/LossTransform")
    graph.add_vertex_group(cs, VertexGroup(
        vname, used, cycles,
        functools.partial(_transform_kernel, lt.name, modelOutputs, expected, deltas, terms, ds, mos),
        reads=reads, writes=[Access(deltas), Access(terms)], multi=False,
        flops=float(B * C * (6 if is_ce else 3)), state_bytes=24))
    prog.add(poplar.program.Execute(cs, f"{name}/LossTransform"))
    reduceWithOutput(graph, terms, loss.flatten(), [1], Operation.ADD, prog, f"{name}/ReduceLoss")
    if nc is not None:
        prog.add(calcAccuracy(graph, modelOutputs, expected, nc, f"{name}/Accuracy"))
    return prog


def _check_expected(expected, B, C, ot, name):
    et = expected.elementType()
    if expected.rank() == 1:
        if et not in (poplar.UNSIGNED_INT, poplar.INT):
            raise poplibs_error(f"{name}: expected labels must be UNSIGNED_INT or INT, got {et}")
        if expected.dim(0) != B:
            raise poplibs_error(f"{name}: expected has {expected.dim(0)} labels but modelOutputs has {B} rows")
    elif expected.rank() == 2:
        if list(expected.shape()) != [B, C] or et != ot:
            raise poplibs_error(f"{name}: 2-D expected must be {ot} [{B}, {C}] (one-hot targets), got {et} "
                                f"{expected.shape()}")
    else:
        raise poplibs_error(f"{name}: expected must be [batch] labels or [batch, classes] targets, got "
                            f"{expected.shape()}")


@kernel
def _accuracy_kernel(idx, expected, nc, ctx):
    i = ctx.read(idx).to(torch.int64)
    e = ctx.read(expected)
    if e.dim() == 3:
        lab = e.argmax(dim=-1)
        keep = torch.ones_like(lab, dtype=torch.bool)
    else:
        lab = e.to(torch.int64)
        keep = (lab != MASKED_LABEL_CODE) & (lab != -1)
    correct = ((i == lab) & keep).sum(dim=1)
    cur = ctx.read(nc).reshape(i.shape[0]).to(torch.int64)
    ctx.write(nc, cur + correct)


def calcAccuracy(graph, modelOutputs, expected, numCorrect, debug_name: str = ""):  # noqa: N802,N803
    """Count rows whose arg max equals the label into ``numCorrect`` (``popnn::calcAccuracy``);
    returns a ``Sequence``.

    ``numCorrect`` (one-element ``UNSIGNED_INT``) is *incremented*: the ``CalcAccuracy`` vertex
    loads and adds to its value, so zero it first to count one batch (as the SDK 2 tutorial 5
    does before its ``Repeat``). Masked labels are not counted. Ties pick the first index.

    Raises:
        poplibs_error: bad shapes or types.
    """
    name = debug_name or "CalcAccuracy"
    if modelOutputs.rank() != 2:
        raise poplibs_error(f"{name}: modelOutputs must be 2-D [batch, classes], got {modelOutputs.shape()}")
    B, C = modelOutputs.shape()
    _check_expected(expected, B, C, modelOutputs.elementType(), name)
    if numCorrect.numElements() != 1 or numCorrect.elementType() != poplar.UNSIGNED_INT:
        raise poplibs_error(f"{name}: numCorrect must be a one-element UNSIGNED_INT tensor, got "
                            f"{numCorrect.elementType()} {numCorrect.shape()}")
    check_mapped(graph, numCorrect, name)
    nt = graph.tile_runs_of(numCorrect)[2][:1].astype(np.int64)
    prog = poplar.program.Sequence()
    _, idx = row_arg_reduce(graph, prog, f"{name}/argMax", modelOutputs, "max", False)
    cs = graph.addComputeSet(f"{name}/CalcAccuracy")
    graph.add_vertex_group(cs, VertexGroup(
        f"popnn::CalcAccuracy<{expected.elementType()}>", nt[:1], np.array([5 + 4 + 2 + 1 + 1 + 4 * B + 1]),
        functools.partial(_accuracy_kernel, idx, expected, numCorrect),
        reads=[Access(idx, int(nt[0])), Access(expected, int(nt[0])), Access(numCorrect)],
        writes=[Access(numCorrect)], multi=False, flops=0.0, state_bytes=16))
    prog.add(poplar.program.Execute(cs, f"{name}/CalcAccuracy"))
    return prog


def _check_2d(t, what):
    if not isinstance(t, poplar.Tensor) or t.rank() != 2:
        raise poplibs_error(f"{what}: input must be a 2-D tensor [batch, values], got "
                            f"{t.shape() if isinstance(t, poplar.Tensor) else type(t).__name__}")


def argMax(graph, input, prog, debug_name: str = ""):  # noqa: N802,A002
    """Index of the max of each row of 2-D ``input`` (``popnn::argMax``): ``UNSIGNED_INT [rows]``,
    first index on ties. Appends two compute sets to ``prog``."""
    _check_2d(input, "argMax")
    return row_arg_reduce(graph, prog, debug_name or "argMax", input, "max", False)[1]


def argMin(graph, input, prog, debug_name: str = ""):  # noqa: N802,A002
    """Index of the min of each row of 2-D ``input`` (``popnn::argMin``)."""
    _check_2d(input, "argMin")
    return row_arg_reduce(graph, prog, debug_name or "argMin", input, "min", False)[1]


def maxAndArgMax(graph, input, prog, debug_name: str = ""):  # noqa: N802,A002
    """``(max [rows], argmax [rows] UNSIGNED_INT)`` of each row (``popnn::maxAndArgMax``)."""
    _check_2d(input, "maxAndArgMax")
    return row_arg_reduce(graph, prog, debug_name or "maxAndArgMax", input, "max", True)


def minAndArgMin(graph, input, prog, debug_name: str = ""):  # noqa: N802,A002
    """``(min [rows], argmin [rows] UNSIGNED_INT)`` of each row (``popnn::minAndArgMin``)."""
    _check_2d(input, "minAndArgMin")
    return row_arg_reduce(graph, prog, debug_name or "minAndArgMin", input, "min", True)


@kernel
def _topk_kernel(src, vals, idx, k, sort, ctx):
    v = ctx.read(src)
    top, ind = torch.topk(v.to(torch.float32) if v.is_floating_point() else v, k, dim=-1, largest=True, sorted=True)
    if not sort:
        # PopLibs' unsorted result is in heap order; openipu returns the top K in index order
        ind, order = torch.sort(ind, dim=-1)
        top = torch.gather(top, -1, order)
    ctx.write(vals, top)
    ctx.write(idx, ind)


def topK(graph, input, K, sort, prog, debug_name: str = ""):  # noqa: N802,N803,A002
    """The ``K`` largest values of each row of 2-D ``input`` and their indices (``popnn::topK``).

    Returns ``(values [rows, K] of input's type, indices [rows, K] UNSIGNED_INT)`` (PopLibs returns
    the values and writes the indices through a reference argument). ``sort``: values in
    descending order; otherwise in increasing index order. One ``ReduceMaxNClassSparse`` vertex per
    row on the row's first tile, costed with PopLibs' estimator shape
    ``35 + sum_{i<K}(13 + 20 ln i) + (n-K)(13 + 20 ln K) + 8K (+ sum_i (10 + 20 ln i) if sort)``.

    Raises:
        poplibs_error: ``K`` outside ``[1, row length]`` or ``input`` not 2-D.
    """
    _check_2d(input, "topK")
    rows, n = input.shape()
    K = int(K)
    if not 1 <= K <= n:
        raise poplibs_error(f"topK: K={K} must be between 1 and the row length {n}")
    name = debug_name or "topK"
    check_mapped(graph, input, name)
    first = row_first_tiles(graph, input)                 # each row's vertex sits on its first tile
    rb, re, rt = compress_runs(first)
    vals = new_mapped(graph, input.elementType(), [rows, K], f"{name}/values", runs=(rb * K, re * K, rt))
    idx = new_mapped(graph, poplar.UNSIGNED_INT, [rows, K], f"{name}/indices", runs=(rb * K, re * K, rt))
    ln = np.log(np.arange(1, K + 1))
    c = 12 + 23 + float(np.sum(13 + 20 * ln[:-1])) + (n - K) * (13 + 20 * np.log(K)) + 8 * K
    if sort:
        c += float(np.sum(10 + 20 * ln))
    cs = graph.addComputeSet(name)
    graph.add_vertex_group(cs, VertexGroup(
        f"popnn::ReduceMaxNClassSparse<{input.elementType()},{'true' if sort else 'false'}>", first,
        np.full(rows, int(c)), functools.partial(_topk_kernel, input, vals, idx, K, bool(sort)),
        reads=[Access(input, row_boxes(rb, re, n, rt))], writes=[Access(vals), Access(idx)], multi=False,
        flops=float(rows * n), state_bytes=24))
    prog.add(poplar.program.Execute(cs, name))
    return vals, idx


def _register_records():
    from openipu.poplar.graph_codec import data_enum
    data_enum(LossType)


_register_records()
