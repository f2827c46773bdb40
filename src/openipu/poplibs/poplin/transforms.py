"""Convolution transforms the planner may apply before planning (PopLibs ``ConvTransform``).

Modelled: ``expandDims`` as a pure view of the operands (no copy), which covers the weight-update
pass of every convolution with a 1-wide kernel dimension (ResNet's 1x1 convolutions, strided or
not), and with a copy of the expanded input (:func:`expand_dims_copy`) for any subset of the field
dimensions, as the planner tries the power set of the candidate dimensions.

PopLibs' ``expandDims`` (``lib/poplin/ConvUtil.cpp expandDim``; candidates in
``lib/poplin/ConvPlan.cpp getExpandDimsCandidates``) folds a field dimension of the kernel into the
input channels: an input channel ``c`` and kernel position ``k`` become the input channel
``c * K + k`` of a convolution whose kernel is 1 wide in that dimension, the input being the
field positions each kernel position meets (im2col along that dimension). The planner tries every
subset of the field dimensions where the input is at least as wide as the kernel (``inputFieldShape[d]
>= kernelShape[d]``, "Don't expand this dimension if the number of non zero kernel entries is
larger than the number of non zero input entries") and keeps the cheapest plan.

For the weight-update convolution (``getWeightUpdateParams``: batch = forward input channels,
input channels = forward batch, kernel = the forward *output gradient field*, output field = the
forward kernel) expanding a dimension makes the forward output field part of the reduction (input
channel) dimension: with every dimension expanded, the weight update of a 1x1 convolution is the
matmul ``dW[Co][Ci] = sum over (n, h, w) of dY[n][Co][h][w] x X[n][Ci][h][w]``, whose ``N x H x W``
reduction the planner splits over tiles with a partials reduction (``inChanSplit``), instead of
handing each tile whole kernel rows of the output gradient.

When the output of the convolution is 1 wide in dimension ``d`` (the forward kernel is 1 wide),
each kernel position meets exactly one input position, so the expanded input is a strided slice of
the input (a view): no element is copied and the host kernel computes the same sums (regrouped).
Expansions that duplicate input elements (wider forward kernels) copy the expanded input, as
PopLibs does in its transform step.
"""

from __future__ import annotations


from openipu.poplibs.poplin.params import ConvParams, InputTransform, OutputTransform


def view_expandable_dims(p: ConvParams) -> list[int]:
    """Field dimensions ``d`` of ``p`` that ``expandDims`` can fold into the input channels as a
    view: the output is 1 wide there without output padding, no input dilation or flips, the
    kernel is wider than 1 (else expanding changes nothing: PopLibs ``expandingDimChangesParams``),
    the input at least as wide as the kernel (PopLibs' heuristic) and every kernel tap meets a real
    (not padding) input element."""
    dims = []
    it, kt, ot = p.inputTransform, p.kernelTransform, p.outputTransform
    for d in range(p.getNumFieldDims()):
        kt_size = p.getTruncatedKernelSize(d)
        if p._strided_size(d) != 1 or ot.paddingLower[d] or ot.paddingUpper[d]:
            continue
        if it.dilation[d] != 1 or it.flip[d] or kt.flip[d] or kt_size <= 1:
            continue
        if p.inputFieldShape[d] < p.kernelShape[d]:
            continue
        first, last = _tap_inputs(p, d)
        if first < it.truncationLower[d] or last >= p.inputFieldShape[d] - it.truncationUpper[d]:
            continue
        dims.append(d)
    return dims


def copy_expandable_dims(p: ConvParams) -> list[int]:
    """Field dimensions ``d`` of ``p`` that ``expandDims`` can fold into the input channels with a
    copy of the input (:func:`expand_dims_copy`): the kernel is wider than 1 there (else expanding
    changes nothing: PopLibs ``expandingDimChangesParams``), no input dilation, flips or output
    padding there, and PopLibs' heuristic holds (input at least as wide as the kernel). PopLibs'
    planner tries every subset of these (``getExpandDimsCandidates``: the power set)."""
    it, kt, ot = p.inputTransform, p.kernelTransform, p.outputTransform
    dims = []
    for d in range(p.getNumFieldDims()):
        if p.getTruncatedKernelSize(d) <= 1:
            continue
        if it.dilation[d] != 1 or it.flip[d] or kt.flip[d] or ot.paddingLower[d] or ot.paddingUpper[d]:
            continue
        if p.inputFieldShape[d] < p.kernelShape[d]:
            continue
        dims.append(d)
    return dims


def dim_subsets(dims) -> list[tuple[int, ...]]:
    """The non-empty subsets of ``dims`` (PopLibs ``getPowerSet`` less the empty set), smallest
    first."""
    from itertools import combinations
    dims = list(dims)
    return [c for r in range(1, len(dims) + 1) for c in combinations(dims, r)]


def _tap_base(p: ConvParams, d: int) -> int:
    """Input index (untransformed) that output position ``o`` and truncated kernel tap ``k`` meet
    in dimension ``d`` is ``base + o x stride + k x kernel dilation`` (no input dilation): tap ``k``
    sits at transformed kernel position ``paddingLower + k x dilation``, output ``o`` at transformed
    input position ``truncationLower(output) + o x stride`` plus that; the input element is
    ``truncationLower(input) - paddingLower(input) +`` that, real if inside the truncated input."""
    it, kt, ot = p.inputTransform, p.kernelTransform, p.outputTransform
    return ot.truncationLower[d] + kt.paddingLower[d] - it.paddingLower[d] + it.truncationLower[d]


def _tap_inputs(p: ConvParams, d: int) -> tuple[int, int]:
    """Input indices (untransformed) that the first and the last truncated kernel tap meet in
    dimension ``d`` (output 1 wide, no input dilation): tap ``k`` sits at transformed kernel position
    ``paddingLower + k x dilation`` and meets transformed input position ``truncationLower(output) +``
    that, i.e. input ``truncationLower(input) - paddingLower(input) +`` that."""
    it, kt, ot = p.inputTransform, p.kernelTransform, p.outputTransform
    base = ot.truncationLower[d] + kt.paddingLower[d] - it.paddingLower[d] + it.truncationLower[d]
    return base, base + (p.getTruncatedKernelSize(d) - 1) * kt.dilation[d]


def expand_dims_params(p: ConvParams, dims) -> ConvParams:
    """``p`` with the field dimensions ``dims`` (from :func:`view_expandable_dims` or
    :func:`copy_expandable_dims`) folded into the input channels: ``Ci x K_d`` input channels
    (``K_d`` the truncated kernel width), a kernel 1 wide in ``d``, the input as wide as the output
    and identity transforms there (PopLibs ``expandDim``)."""
    it, kt, ot = p.inputTransform, p.kernelTransform, p.outputTransform
    in_f, k_f = list(p.inputFieldShape), list(p.kernelShape)
    itr = {k: list(getattr(it, k)) for k in ("truncationLower", "truncationUpper", "dilation", "paddingLower",
                                             "paddingUpper", "flip")}
    ktr = {k: list(getattr(kt, k)) for k in itr}
    otr = {k: list(getattr(ot, k)) for k in ("truncationLower", "truncationUpper", "stride", "paddingLower",
                                             "paddingUpper")}
    ci = p.inputChannelsPerConvGroup
    for d in dims:
        ci *= p.getTruncatedKernelSize(d)
        in_f[d], k_f[d] = p._strided_size(d), 1
        for tr in (itr, ktr):
            tr["truncationLower"][d] = tr["truncationUpper"][d] = tr["paddingLower"][d] = tr["paddingUpper"][d] = 0
            tr["dilation"][d] = 1
            tr["flip"][d] = False
        for k in otr:
            otr[k][d] = 1 if k == "stride" else 0
    return p._with(inputFieldShape=in_f, kernelShape=k_f, inputChannelsPerConvGroup=ci,
                   inputTransform=InputTransform(**itr), kernelTransform=InputTransform(**ktr),
                   outputTransform=OutputTransform(**otr))


def expand_dims_views(x, w, p: ConvParams, dims):
    """The canonical operands of :func:`expand_dims_params` as views of ``x`` ``[G, N, Ci, *F]``
    and ``w`` ``[G, Co, Ci, *K]``: along each expanded dimension the input positions the kernel
    taps meet (a strided slice) and the truncated kernel, moved next to the input channels and
    merged into them (channel-major, tap-minor), leaving a 1-wide dimension."""
    kt = p.kernelTransform
    n = p.getNumFieldDims()
    for d in dims:
        ax = 3 + d
        kd = kt.dilation[d]
        first, last = _tap_inputs(p, d)
        xs = x.slice(first, last + 1, ax)
        if kd > 1:
            xs = xs.subSample(kd, ax)
        ws = w.slice(kt.truncationLower[d], p.kernelShape[d] - kt.truncationUpper[d], ax)
        x, w = (_fold(t, ax, n) for t in (xs, ws))
    return x, w


def _fold(t, ax: int, n: int):
    """Merge dimension ``ax`` of ``t`` ``[G, A, C, *field]`` into ``C`` (as its minor part) and
    leave a 1-wide dimension at ``ax``."""
    perm = [0, 1, 2, ax] + [i for i in range(3, 3 + n) if i != ax]
    s = t.dimShuffle(perm)
    sh = list(s.shape())
    s = s.reshape(sh[:2] + [sh[2] * sh[3]] + sh[4:])
    sh = list(s.shape())
    s = s.reshape(sh[:3 + (ax - 3)] + [1] + sh[3 + (ax - 3):])
    return s


def expand_copy_cycles(p: ConvParams, dims, target) -> float:
    """Predicted cycles of copying the expanded input (:func:`expand_dims_copy`), as PopLibs'
    planner estimates the ``expandDims`` transform: the expanded bytes per tile over the exchange
    bandwidth plus over a reorder rate of one element per cycle, times its "experimentally
    determined fudge factor" 1.5 (``ConvPlan.cpp``, the expandDims transform cost estimate)."""
    e = expand_dims_params(p, dims)
    elems = e.numConvGroups * e.batchSize * e.inputChannelsPerConvGroup
    for s_ in e.inputFieldShape:
        elems *= s_
    size = p.inputType.size
    per_tile = -(-elems * size // target.getNumTiles())
    epc = target.getExchangeBytesPerCycle()
    return 1.5 * (-(-per_tile // epc) + -(-per_tile // size))


def expand_dims_copy(graph, x, w, p: ConvParams, dims, xe, prog, name: str):
    """Fold ``dims`` (a subset of :func:`copy_expandable_dims`) of ``p`` into the input channels by
    copying: ``xe`` (canonical ``[G, N, Ci x prod K_dims, *F']`` input of
    :func:`expand_dims_params`, laid out for its plan) receives, for each output position ``o`` of
    an expanded dimension, the input elements the kernel taps meet (``xe[g, n, (c, k), o] = x[g, n,
    c, base + o x stride + k x dilation]``, zero where that is padding); the other dimensions are
    copied whole. Built per kernel tap ``k`` of the expanded dimensions: the output positions whose
    input is real form one box per dimension, whose input is a strided slice of ``x`` (one ``Copy``
    of ``prod K_dims`` boxes); the others are zeroed (one ``popops::zero``). PopLibs copies the
    expanded input in the convolution's transform step. Returns ``(xe, w')``, ``w'`` the weights
    folded as a view."""
    from itertools import product

    from openipu import poplar
    from openipu.poplibs import popops

    kt, ot = p.kernelTransform, p.outputTransform
    n = p.getNumFieldDims()
    dims = sorted(dims)
    G, N, Ci = p.numConvGroups, p.batchSize, p.inputChannelsPerConvGroup
    K = [p.getTruncatedKernelSize(d) if d in dims else 1 for d in range(n)]
    O = [p._strided_size(d) if d in dims else p.inputFieldShape[d] for d in range(n)]
    lim = [(p.inputTransform.truncationLower[d], p.inputFieldShape[d] - p.inputTransform.truncationUpper[d])
           if d in dims else (0, p.inputFieldShape[d]) for d in range(n)]
    xe7 = xe.reshape([G, N, Ci, *K, *O])
    srcs, dsts, zeros = [], [], []
    for k in product(*[range(v) for v in K]):
        dst = xe7
        for d in range(n):
            dst = dst.slice(k[d], k[d] + 1, 3 + d)
        ranges = []             # per dim: the output positions [olo, ohi) whose input is real, first input
        for d in range(n):
            if d in dims:
                first = _tap_base(p, d) + k[d] * kt.dilation[d]
                st = ot.stride[d]
            else:
                first, st = 0, 1
            olo = max(0, -(-(lim[d][0] - first) // st))
            ohi = min(O[d], -(-(lim[d][1] - first) // st))
            ranges.append((olo, max(olo, ohi), first, st))
        for j in range(n):      # padding: dims before j real, dim j outside its real range
            for a, z in ((0, ranges[j][0]), (ranges[j][1], O[j])):
                if z <= a:
                    continue
                t = dst
                for d in range(j):
                    t = t.slice(ranges[d][0], ranges[d][1], 3 + n + d)
                t = t.slice(a, z, 3 + n + j)
                if t.numElements():
                    zeros.append(t.flatten())
        if any(hi <= lo for lo, hi, _, _ in ranges):
            continue
        src, d_ = x, dst
        for d, (olo, ohi, first, st) in enumerate(ranges):
            i0 = first + olo * st
            s_ = src.slice(i0, i0 + (ohi - olo - 1) * st + 1, 3 + d)
            src = s_.subSample(st, 3 + d) if st > 1 else s_
            d_ = d_.slice(olo, ohi, 3 + n + d)
        srcs.append(src.flatten())
        dsts.append(d_.flatten())
    if srcs:
        prog.add(poplar.program.Copy(poplar.concat(srcs), poplar.concat(dsts)))
    if zeros:
        popops.zero(graph, poplar.concat(zeros), prog, f"{name}/expandDimsPadding")
    ws = w
    for d in dims:
        ax = 3 + d
        ws = _fold(ws.slice(kt.truncationLower[d], p.kernelShape[d] - kt.truncationUpper[d], ax), ax, n)
    return xe, ws
