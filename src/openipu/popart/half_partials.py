"""Half partial sums of matmuls on the IR executor (:mod:`openipu.popart.execute`).

With ``partialsType`` half (``SessionOptions.partialsTypeMatMuls``, ``matmulOptions``,
``builder.setPartialsType``; PopTorch's ``Precision.setPartialsType(torch.half)``; PopRT's
default), poplin's plan splits a matmul's contraction (``k``, the planned convolution's input
channels) over ``in_chan_split`` tiles: each tile's AMP vertices sum its block of
``ceil(k / in_chan_split)`` products and store the partial sum as half, and the reduction adds
the half partial sums and rounds the result to half. The device emulation
(``OPENIPU_EXECUTION=device``, :mod:`openipu.poplibs.poplin.kernels`) computes exactly that, each
block's dot products accumulated in float32 (as torch's CPU half GEMM does) and rounded to half.

The executor reproduces it with float32 kernels (torch's CPU half GEMM is two orders of magnitude
slower): the block products of ``[..., m, k] x [..., k, n]`` as float32 matmuls (the same
multiply-accumulates as the whole product), each rounded to half, summed in float32 (groups of
blocks holding :data:`CHUNK_BYTES` of products) and rounded to half once. Large problems go a
cache-sized tile of outputs at a time, the tiles shared among the host threads (:func:`_tiled`:
bit-identical; 1.3x the host CPU time of one float32 matmul at BERT-base sizes instead of
2.1-2.7x). A plan without an input-channel split
(one block) is the float path's single rounding. The block size comes from poplin's planner
(:func:`openipu.poplibs.poplin.plan.plan_matmul`) for the problem the PopART lowering plans
(:mod:`openipu.popart.lowering.matmul`), on the op's virtual graph's target; plans are cached,
so after the session's compile this is a lookup.

Not covered yet: convolutions (Conv, ConvTranspose and their gradients keep the float path's
single rounding with half partials: more precise than the IPU, within the half plan's precision).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from openipu.popart.lowering._util import poplibs_options

#: Bytes of float32 block products one batched matmul holds (larger problems take their blocks
#: in groups: host memory only, the result is the same)
CHUNK_BYTES = 256 << 20

#: Ops whose half partial sums the executor models (see the module doc)
MATMULS = {("", "MatMul"), ("", "Gemm")}


def partials_type(op, options) -> str:
    """The partials type ("float" or "half") of a MatMul / Gemm as the PopART lowering passes it
    to poplin: the op's ``setPartialsType`` annotation, else ``partialsTypeMatMuls``, else
    ``matmulOptions["partialsType"]``, else PopLibs' default "float"."""
    opts = poplibs_options(op, getattr(options, "matmulOptions", {}) or {},
                           getattr(options, "partialsTypeMatMuls", "") or None)
    return str(opts.get("partialsType", "float")).lower()


def matmul_problem(ir, op) -> tuple[int, int, int, int]:
    """``(groups, m, k, n)`` of the poplin matmul the PopART lowering plans for a MatMul or Gemm
    (1-D operands promoted; a 2-D right operand takes the left one's batch dims into its rows,
    else one grouped matmul over the broadcast batch dims)."""
    a = list(ir.tensors[op.inputs[0]].info.shape())
    b = list(ir.tensors[op.inputs[1]].info.shape())
    if op.op_type == "Gemm":
        if int(op.attrs.get("transA", 0)):
            a = a[::-1]
        if int(op.attrs.get("transB", 0)):
            b = b[::-1]
        return 1, int(a[0]), int(a[1]), int(b[1])
    if len(a) == 1:
        a = [1, a[0]]
    if len(b) == 1:
        b = [b[0], 1]
    k, n = int(a[-1]), int(b[-1])
    if len(b) == 2:
        return 1, math.prod(a[:-1]), k, n
    batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return math.prod(batch), int(a[-2]), k, n


def block_size(ir, op, target) -> int:
    """The contraction block of one tile's half partial sum (``ceil(k / in_chan_split)`` of the
    plan poplin makes for the op on ``target``), in elements of ``k``."""
    from openipu import poplar
    from openipu.poplibs.poplin.plan import plan_matmul
    g, m, k, n = matmul_problem(ir, op)
    opts = poplibs_options(op, getattr(ir.options, "matmulOptions", {}) or {},
                           getattr(ir.options, "partialsTypeMatMuls", "") or None)
    plan = plan_matmul(g, m, k, n, poplar.HALF, target, opts, op="matMulGrouped" if g > 1 else "matMul")
    return -(-k // max(1, int(plan.in_chan_split)))


def matmul(a: torch.Tensor, b: torch.Tensor, block: int) -> torch.Tensor:
    """``a @ b`` (numpy ``matmul`` broadcasting; float32 or float16 operands) with half partial
    sums over contraction blocks of ``block`` elements: each block's product in float32 rounded
    to half, the blocks summed in float32 and rounded to half. Returns float16, shape of
    ``a @ b``.

    The blocks go in groups of up to ``CHUNK_BYTES / (4 * outputs)``: each group's rounded
    products summed over the group (``torch.sum``), the group sums added in order. Large
    products (a 2-D ``b``, or ``a`` and ``b`` with the same batch dims) are computed a tile of
    about :data:`TILE_ELEMENTS` outputs at a time (:func:`_tiled`), so that the block products,
    their rounding and their sums stay in the CPU's cache; the result is bit-identical to the
    whole-problem formulation (:func:`_whole`)."""
    b = b.float()           # a becomes float32 a tile at a time in _tiled (a copy of it less)
    va, vb = a.dim() == 1, b.dim() == 1
    if va:
        a = a.unsqueeze(0)
    if vb:
        b = b.unsqueeze(1)
    k = a.shape[-1]
    if block >= k:
        y = (a.float() @ b).half()
    else:
        nb = -(-k // block)
        if nb * block > k:              # the last block padded with zero products
            a = torch.nn.functional.pad(a, (0, nb * block - k))
            b = torch.nn.functional.pad(b, (0, 0, 0, nb * block - k))
        out = torch.broadcast_shapes(a.shape[:-1], b.shape[:-2] + (1,)).numel() * b.shape[-1]
        step = max(1, CHUNK_BYTES // (4 * max(1, out)))         # blocks per group
        n = b.shape[-1]
        same_batch = b.dim() == 2 or (a.dim() == b.dim() and a.shape[:-2] == b.shape[:-2])
        if out >= 2 * TILE_ELEMENTS and n % 16 == 0 and same_batch:
            y = _tiled(a, b, block, nb, step)
        else:
            y = _whole(a.float(), b, block, nb, step)
    if vb:
        y = y.squeeze(-1)
    if va:
        y = y.squeeze(-2)
    return y


#: Output elements of one tile of :func:`_tiled` (512 KiB of float32: the block products of a
#: tile, their half roundings and the tile's sum stay in a core's 1-2 MiB L2 cache)
TILE_ELEMENTS = 1 << 17
#: Fewest rows of a tile of a 2-D problem (a ``[15360, 768] x [768, 3072]`` product in tiles of
#: 42 rows took 1.58 CPU s, of 170 rows 1.28 s, float32 in one matmul 1.0 s; measured 2026-11-29)
TILE_ROWS = 192


def _whole(a: torch.Tensor, b: torch.Tensor, block: int, nb: int, step: int) -> torch.Tensor:
    """:func:`matmul`'s blocked sum on the whole problem: ``a [..., m, nb * block]`` and
    ``b [..., nb * block, n]`` float32 (padded); each group of ``step`` blocks as one batched
    matmul. Returns float16."""
    ab = a.unflatten(-1, (nb, block)).movedim(-2, -3)        # [..., nb, m, block]
    bb = b.unflatten(-2, (nb, block))                        # [..., nb, block, n]
    y = None
    for i in range(0, nb, step):
        if step == 1:               # one block at a time: plain matmuls of the slices
            p = torch.matmul(a[..., i * block:(i + 1) * block], b[..., i * block:(i + 1) * block, :]).half()
            p = p.float()
        else:
            p = torch.matmul(ab[..., i:i + step, :, :], bb[..., i:i + step, :, :]).half()
            p = p.sum(dim=-3, dtype=torch.float32)
        y = p if y is None else y.add_(p)
    return y.half()


def _tiled(a: torch.Tensor, b: torch.Tensor, block: int, nb: int, step: int) -> torch.Tensor:
    """:func:`_whole` a tile of outputs at a time: rows of ``a`` (flattened over its batch dims)
    when ``b`` is 2-D, else matrices of the common batch. Per tile and block: the block product
    into a float32 buffer (``matmul(out=)``), rounded into the tile's half buffer; per group the
    half products summed in float32 with the whole problem's layout (``[s, rows, n]`` or
    ``[batch, s, m, n]``, so ``torch.sum`` adds in the same order) and added to the tile's
    float32 sum, rounded to half once at the end. ``a`` (float16 or float32) is converted to
    float32 a tile at a time; ``b`` is float32.

    The tiles are shared out among ``torch.get_num_threads()`` host threads, each running its
    tiles' kernels on one torch thread with its own buffers (many small kernels on torch's
    thread team wait at its barriers: 15x slower on a loaded 2-core host, measured
    2026-11-29); the results do not depend on which thread computes a tile."""
    n = b.shape[-1]
    s_max = min(step, nb)
    batched = b.dim() > 2
    if batched:
        out_shape = (*a.shape[:-1], n)
        m = a.shape[-2]
        a_t, b_t = a.reshape(-1, m, a.shape[-1]), b.reshape(-1, b.shape[-2], n)
        inner = (m, n)
    else:
        out_shape = (*a.shape[:-1], n)
        a_t, b_t = a.reshape(-1, a.shape[-1]), b
        inner = (n,)
    count = a_t.shape[0]
    size = math.prod(inner)
    # at least TILE_ROWS rows of a 2-D problem: the block GEMMs of a wide ``b`` stay efficient
    per = max(1, TILE_ELEMENTS // size) if batched else max(TILE_ROWS, TILE_ELEMENTS // size)
    y = torch.empty(count, *inner, dtype=torch.float16)
    tiles = list(range(0, count, per))

    def work(first: int, stride: int) -> None:
        pbuf, acc, gbuf = (torch.empty(per, *inner) for _ in range(3))
        hbuf = torch.empty(s_max * per * size, dtype=torch.float16)
        for r in tiles[first::stride]:
            e = min(count, r + per)
            t = e - r
            p, sums, g = pbuf[:t], acc[:t], gbuf[:t]
            at = a_t[r:e].float()       # the tile's rows (matrices) of a, float32
            for i in range(0, nb, step):
                s = min(step, nb - i)
                h = hbuf[:s * t * size].view(t, s, *inner) if batched else hbuf[:s * t * size].view(s, t, *inner)
                for j in range(s):
                    c = (i + j) * block
                    if batched:
                        torch.matmul(at[:, :, c:c + block], b_t[r:e, c:c + block, :], out=p)
                        h[:, j].copy_(p)
                    else:
                        torch.matmul(at[:, c:c + block], b_t[c:c + block], out=p)
                        h[j].copy_(p)
                if step == 1:
                    part = h[:, 0] if batched else h[0]
                else:
                    part = torch.sum(h, dim=1 if batched else 0, dtype=torch.float32, out=sums if i == 0 else g)
                if i == 0:
                    if step == 1:
                        sums.copy_(part)
                else:
                    sums.add_(part)
            y[r:e].copy_(sums)

    workers = min(torch.get_num_threads(), len(tiles))
    if workers <= 1:
        work(0, 1)
    else:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            list(_pool(workers).map(work, range(workers), [workers] * workers))
        finally:
            torch.set_num_threads(threads)
    return y.reshape(out_shape)


_POOL: ThreadPoolExecutor | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    """The host threads of :func:`_tiled` (created on first use, at least ``workers``)."""
    global _POOL
    if _POOL is None or _POOL._max_workers < workers:
        _POOL = ThreadPoolExecutor(workers, thread_name_prefix="openipu-half-partials")
    return _POOL


def _forget_pool() -> None:
    """A forked child has none of the parent's pool threads: it makes its own."""
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)


def gemm(args: list, attrs: dict, block: int) -> torch.Tensor:
    """ONNX Gemm with half partials as the PopART lowering builds it: ``y = op(A) @ op(B)``
    (:func:`matmul`, half), then ``alpha * y``, ``beta * C`` and their sum, each rounded to
    half (popops on half tensors). Returns float16."""
    a, b = args[0], args[1]
    c = args[2] if len(args) > 2 else None
    if int(attrs.get("transA", 0)):
        a = a.t()
    if int(attrs.get("transB", 0)):
        b = b.t()
    y = matmul(a, b, block)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = (y.float() * alpha).half()
    if c is not None and beta != 0.0:
        c = c.half()
        if beta != 1.0:
            c = (c.float() * beta).half()
        y = (y.float() + c.float()).half()
    return y


def vgraph_targets(ir, target) -> list:
    """The target of each virtual graph as the PopART lowering creates them
    (:func:`openipu.popart.lowering.program.build`): the replica graph's target, split into
    ``ir.num_vgraphs`` IPU-sized virtual graphs when the model is sharded."""
    from openipu import poplar
    repl = int(ir.options.replication_factor()) if hasattr(ir.options, "replication_factor") else 1
    graph = poplar.Graph(target, replication_factor=repl) if repl > 1 else poplar.Graph(target)
    nvg = int(getattr(ir, "num_vgraphs", 0) or 0)
    if nvg > 1:
        tpi = graph.getTarget().getTilesPerIPU()
        return [graph.createVirtualGraph(i * tpi, (i + 1) * tpi).getTarget() for i in range(nvg)]
    return [graph.getTarget()]


def op_target(targets: list, op):
    """The target of ``op``'s virtual graph (as ``LoweringContext.graph_of``)."""
    vg = op.vgraph if op.vgraph is not None else 0
    return targets[vg if vg < len(targets) else 0]
