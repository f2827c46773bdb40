"""Convolutions (PopLibs ``include/poplin/Convolution.hpp``).

Tensors as PopLibs: input ``[N, G*Ci, *field]``, weights ``[G, Co, Ci, *kernel]`` (per conv group:
output channels, then input channels), output ``[N, G*Co, *outField]``, biases ``[G*Co]``.
Forward, input-gradient (``convolution`` with ``getGradientParams`` and
``transposeAndFlipWeights=True``) and weight-update (``calculateWeightDeltas``) passes all go
through the planner in :mod:`openipu.poplibs.poplin.plan`.
"""

from __future__ import annotations

import functools

import numpy as np

from openipu import poplar
from openipu.poplar.exchange import tile_boxes
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.poplin import core, layout, transforms
from openipu.poplibs.poplin.matmul import _scaled_add_to
from openipu.poplibs.poplin.params import ConvParams, getGradientParams, poplibs_error, weight_update_params
from openipu.poplibs.poplin.plan import parse_options, plan_convolution
from openipu.poplibs.popops._common import tile_counts_of

__all__ = ["convolution", "createInput", "createWeights", "create_weights", "map_weights", "createBiases", "addBias", "calculateWeightDeltas",
           "convolutionWeightUpdate", "getGradientParams", "reportPlanInfo", "getFwdFlops", "preplanConvolution"]


def _canon_input(t, params: ConvParams):
    n = params.getNumFieldDims()
    return t.reshape([params.batchSize, params.numConvGroups, params.inputChannelsPerConvGroup,
                      *params.inputFieldShape]).dimShuffle([1, 0, 2, *range(3, 3 + n)])


def _user_output(out, params: ConvParams):
    n = params.getNumFieldDims()
    return out.dimShuffle([1, 0, 2, *range(3, 3 + n)]).reshape(params.getOutputShape())


def _check_shape(op, what, t, shape):
    if list(t.shape()) != list(shape):
        raise poplar.graph_connection_error(f"{op}: {what} has shape {t.shape()} but the ConvParams need {list(shape)}")


def convolution(graph, in_, weights, params: ConvParams, transposeAndFlipWeights: bool, prog,  # noqa: N803
                name: str = "", options=None, cache=None):
    """Convolve ``in_`` ``[N, G*Ci, *field]`` with ``weights`` (``poplin::convolution``).

    ``weights`` is ``[G, Co, Ci, *kernel]``; with ``transposeAndFlipWeights`` it is
    ``[G, Ci, Co, *kernel]`` (the forward weights, for the input-gradient pass with
    :func:`getGradientParams`): its channel dimensions are swapped and its kernel flipped.
    Returns a new ``[N, G*Co, *outField]`` tensor of ``params.outputType``. Options:
    ``availableMemoryProportion`` (0.6), ``partialsType`` ("float" / "half"), ``pass``.

    The forward pass (no ``transposeAndFlipWeights``) is planned with and without PopLibs'
    ``expandDims`` transform (:func:`_expand_transform`: kernel dimensions folded into the input
    channels, the expanded input copied in ``prog``) and the cheaper is built, copy included, as
    PopLibs' planner does (``ConvPlan.cpp getExpandDimsCandidates``): a layer with few input
    channels (ResNet's 7x7 stem, 3 channels) then fills the AMP's input channels.

    Raises ``poplar.graph_connection_error`` (shapes or types) and ``poplar.invalid_option``. No
    plan within the memory budget is a warning and the least-memory plan
    (:mod:`openipu.poplibs.poplin.plan`), not an error.
    """
    op = "convolution"
    _check_shape(op, "the input", in_, params.getInputShape())
    n = params.getNumFieldDims()
    G, Ci, Co = params.numConvGroups, params.inputChannelsPerConvGroup, params.outputChannelsPerConvGroup
    if transposeAndFlipWeights:
        _check_shape(op, "the weights (transposeAndFlipWeights)", weights, [G, Ci, Co, *params.kernelShape])
        w = weights.dimShuffle([0, 2, 1, *range(3, 3 + n)])
        for d in range(n):
            w = w.reverse(3 + d)
    else:
        _check_shape(op, "the weights", weights, params.getWeightsShape())
        w = weights
    for t, what in ((in_, "input"), (weights, "weights")):
        if t.elementType() != params.inputType:
            raise poplar.graph_connection_error(
                f"{op}: the {what} is {t.elementType()} but the ConvParams input type is {params.inputType}")
    x = _canon_input(in_, params)
    cp, metas = params, None
    if not transposeAndFlipWeights:
        # the forward pass tries PopLibs' expandDims as the weight update does (below); a copied
        # fp8 input keeps the scale of the input it came from
        if in_.hasMetadata() or weights.hasMetadata():
            metas = (in_.getMetadata() if in_.hasMetadata() else None,
                     weights.getMetadata() if weights.hasMetadata() else None)
        cp, x, w = _expand_transform(graph, params, x, w, options, cache, op, prog, name or op)
    out = _conv(graph, x, w, cp, prog, name or op, options, cache, op, metas=metas)
    return _user_output(out, params)


def _conv(graph, x, w, params, prog, name, options, cache, op, out=None, metas=None):
    plan = plan_convolution(params, graph.getTarget(), options, cache, op=op)
    opts = parse_options(options, op)
    return core.build(graph, x, w, params, plan, opts.partials_type, params.outputType, prog, name, out=out,
                      metas=metas)


def createInput(graph, params: ConvParams, name: str = "", options=None, cache=None):  # noqa: N802
    """A new input tensor ``[N, G*Ci, *field]`` laid out the way the plan wants it
    (``poplin::createInput``): each work block stored contiguously, each tile holding an interval
    of a block it convolves (:func:`core.create_input`)."""
    plan = plan_convolution(params, graph.getTarget(), options, cache, op="createInput")
    x = layout.create_input(graph, params.inputType, params, plan, name or "input")
    n = params.getNumFieldDims()
    return x.dimShuffle([1, 0, 2, *range(3, 3 + n)]).reshape(params.getInputShape())


def createWeights(graph, params: ConvParams, name: str = "", options=None, cache=None):  # noqa: N802
    """A new weights tensor ``[G, Co, Ci, *kernel]`` laid out for the plan (``poplin::createWeights``)."""
    return create_weights(graph, params, name, options, cache)


def create_weights(graph, params: ConvParams, name: str = "", options=None, cache=None, value=None, type_=None):
    """``createWeights`` with an optional constant ``value`` (``[G, Co, Ci, *kernel]``): each work
    block's weights stored contiguously (:func:`core.create_weights`). ``type_``: the element type
    stored, when not ``params.inputType`` (a QUARTER storage variant, e.g. E5M2 weights). openipu
    extension for PopART, which creates a weight from its consumer."""
    plan = plan_convolution(params, graph.getTarget(), options, cache, op="createWeights")
    shape = params.getWeightsShape()
    if value is not None:
        value = np.asarray(value).reshape(shape[:3] + [-1])
    w = layout.create_weights(graph, type_ or params.inputType, params, plan, name or "weights", value)
    return w.reshape(shape)


def map_weights(graph, weights, params: ConvParams, options=None, cache=None) -> None:
    """Re-map existing ``weights`` ``[G, Co, Ci, *kernel]`` as :func:`createWeights` lays them out
    for ``params`` (PopART creates weights from their consumer). openipu extension."""
    plan = plan_convolution(params, graph.getTarget(), options, cache, op="createWeights")
    layout.map_weights(graph, weights, params, plan)


def createBiases(graph, acts, name: str = "biases"):  # noqa: N802
    """A new ``[C]`` bias tensor for activations ``acts`` ``[N, C, *field]``, each channel's bias
    on the tile that holds most of that channel's activations (``poplin::createBiases``)."""
    if acts.rank() < 2:
        raise poplar.graph_connection_error(f"createBiases: activations must be [N, C, ...], got {acts.shape()}")
    C = acts.dim(1)
    b = graph.addVariable(acts.elementType(), [C], name)
    # elements per (channel, tile), from the tile boxes of the activations [C, N, *field]: one
    # entry per channel of each box, never one per element
    boxes = tile_boxes(acts.dimShuffle([1, 0, *range(2, acts.rank())]))
    if (boxes.tile < 0).any():
        raise poplar.invalid_tile_mapping("createBiases: the activations are not completely mapped to tiles")
    span = boxes.sz[:, 0]
    ch = np.repeat(boxes.lo[:, 0], span) + (np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span))
    tl = np.repeat(graph._local_tiles(boxes.tile), span)
    cnt = np.repeat(np.prod(boxes.sz[:, 1:], axis=1, dtype=np.int64), span)
    key, inv = np.unique(np.stack([ch, tl], axis=1), axis=0, return_inverse=True)
    tot = np.bincount(inv.reshape(-1), weights=cnt)
    # per channel, the tile holding most of its activations (ties: the lowest tile)
    order = np.lexsort((key[:, 1], -tot, key[:, 0]))
    best = key[order][np.r_[True, key[order, 0][1:] != key[order, 0][:-1]]]
    if best.shape[0] != C:
        raise poplar.invalid_tile_mapping(f"createBiases: activations {acts.shape()} hold no element of some channel")
    tile, b0, b1 = layout._runs(best[:, 1])
    graph.set_tile_runs(b, b0, b1, graph._global_tiles(tile))
    return b


@kernel
def _add_bias_kernel(acts, biases, ctx):
    A, B = ctx.read(acts), ctx.read(biases)          # [R, N, C, rest], [R, C]
    ctx.write(acts, (A.float() + B.float()[:, None, :, None]).to(A.dtype))


#: AddToChannel tile cycles (``poplin::AddToChannel`` supervisor). [A] the shape of popops'
#: broadcast add: supervisor 20, per worker 26 + 1 cycle per vector of its share.
ADD_TO_CHANNEL_SUPERVISOR = 20
ADD_TO_CHANNEL_WORKER_OVERHEAD = 26


def addBias(graph, acts, biases, prog, name: str = ""):  # noqa: N802
    """``acts[n, c, ...] += biases[c]`` in place (``poplin::addBias``), on the tiles holding ``acts``.
    Raises ``poplar.graph_connection_error`` when ``biases`` is not ``[acts.dim(1)]`` or the types differ."""
    if biases.rank() != 1 or acts.rank() < 2 or biases.dim(0) != acts.dim(1):
        raise poplar.graph_connection_error(
            f"addBias: biases {biases.shape()} must be [C] for activations {acts.shape()} ([N, C, ...])")
    if biases.elementType() != acts.elementType():
        raise poplar.graph_connection_error(
            f"addBias: biases are {biases.elementType()} but activations are {acts.elementType()}")
    target = graph.getTarget()
    used, counts = tile_counts_of(graph, acts)
    vw, W = target.getVectorWidth(acts.elementType()), target.getNumWorkerContexts()
    cyc = ADD_TO_CHANNEL_SUPERVISOR + W * (ADD_TO_CHANNEL_WORKER_OVERHEAD + -(-counts // (vw * W)))
    rest = acts.numElements() // max(1, acts.dim(0) * acts.dim(1))
    # the biases as seen by each activation: a broadcast view, read where the activations live
    b_full = biases.reshape([1, biases.dim(0)] + [1] * (acts.rank() - 2)).broadcast_to(acts.shape())
    cs = graph.addComputeSet(f"{name or 'addBias'}/AddToChannel")
    graph.add_vertex_group(cs, VertexGroup(
        f"poplin::AddToChannel<{acts.elementType()}>", used, cyc,
        functools.partial(_add_bias_kernel, acts.reshape([acts.dim(0), acts.dim(1), rest]), biases),
        reads=[Access(acts), Access(b_full, acts)], writes=[Access(acts)], multi=True,
        flops=float(acts.numElements()), state_bytes=24))
    prog.add(poplar.program.Execute(cs))


def calculateWeightDeltas(graph, zDeltas, activations, params: ConvParams, prog, name: str = "",  # noqa: N802,N803
                          options=None, cache=None):
    """Weight gradients ``[G, Co, Ci, *kernel]`` from output gradients ``zDeltas``
    ``[N, G*Co, *outField]`` and forward ``activations`` ``[N, G*Ci, *field]``
    (``poplin::calculateWeightDeltas``): a convolution over the batch and output field
    (:func:`~openipu.poplibs.poplin.params.weight_update_params`, PopLibs
    ``getWeightUpdateParams``), planned with or without ``expandDims`` (:func:`_expand_transform`).

    The result is laid out as the weight-update convolution's output (its plan's output
    layout), not as :func:`createWeights` lays out the weights: PopLibs' ``calculateWeightDeltas``
    returns the output of ``convolution(..., wuPlan, wuParams, ...)`` reshaped, and
    ``convolutionWeightUpdate`` regroups it (``popops::rearrange::regroupIfBeneficial``) before
    ``scaledAddTo`` into the weights (``lib/poplin/Convolution.cpp``)."""
    op = "calculateWeightDeltas"
    _check_shape(op, "zDeltas", zDeltas, params.getOutputShape())
    _check_shape(op, "activations", activations, params.getInputShape())
    wu = weight_update_params(params)
    n = params.getNumFieldDims()
    G, N = params.numConvGroups, params.batchSize
    # input [G, Ci (batch), N (channels), *field]; kernel [G, Co, N, *outField]
    x = activations.reshape([N, G, params.inputChannelsPerConvGroup, *params.inputFieldShape]) \
        .dimShuffle([1, 2, 0, *range(3, 3 + n)])
    w = zDeltas.reshape([N, G, params.outputChannelsPerConvGroup, *params.getOutputFieldShape()]) \
        .dimShuffle([1, 2, 0, *range(3, 3 + n)])
    wu, x, w = _expand_transform(graph, wu, x, w, options, cache, op, prog, name or op)
    out = _conv(graph, x, w, wu, prog, name or op, options, cache, op)       # [G, Ci, Co, *kernel]
    return out.dimShuffle([0, 2, 1, *range(3, 3 + n)])


def _expand_transform(graph, wu: ConvParams, x, w, options, cache, op, prog, name):
    """A convolution as planned: ``(params, x, w)``, either as given or with field
    dimensions folded into the input channels (PopLibs' ``expandDims``,
    :mod:`~openipu.poplibs.poplin.transforms`): as a view of the operands where the forward kernel
    is 1 wide, or with a copy of the expanded input (added to ``prog``) for wider kernels. The
    planner tries each candidate and keeps the one predicted fastest, the copy's estimate included
    (PopLibs' planner tries every ``expandDims`` candidate and keeps the cheapest plan, transform
    costs included: ``ConvPlan.cpp getExpandDimsCandidates``). A candidate with no plan within the
    memory budget loses to one within it; if none has one, the candidate with the least temporary
    memory wins (the planner has warned)."""
    target = graph.getTarget()
    cands = []                      # (over budget, cycles or temp bytes, order, kind, dims, params, plan)

    def rank(p):
        over = p.temp_bytes > p.budget_bytes
        return (over, p.temp_bytes if over else p.cycles)

    try:
        p0 = plan_convolution(wu, target, options, cache, op=op)
        cands.append((*rank(p0), 0, "none", (), wu, p0))
    except poplibs_error:
        pass
    view = transforms.view_expandable_dims(wu)
    copy = transforms.copy_expandable_dims(wu)
    for dims in transforms.dim_subsets(sorted(set(view) | set(copy))):
        kind = "view" if set(dims) <= set(view) else "copy"
        try:
            e = transforms.expand_dims_params(wu, dims)      # raises for a kernel truncated to nothing
            pe = plan_convolution(e, target, options, cache, op=op)
        except poplibs_error:
            continue
        extra = transforms.expand_copy_cycles(wu, dims, target) if kind == "copy" else 0.0
        over, score = rank(pe)
        cands.append((over, score if over else score + extra, len(cands), kind, dims, e, pe))
    if not cands:
        return wu, x, w
    _, _, _, kind, dims, e, pe = min(cands)
    if kind == "none":
        return wu, x, w
    if kind == "view":
        x, w = transforms.expand_dims_views(x, w, wu, dims)
        return e, x, w
    xe = layout.create_input(graph, wu.inputType, e, pe, f"{name}/expandDims")
    x, w = transforms.expand_dims_copy(graph, x, w, wu, dims, xe, prog, name)
    return e, x, w


def convolutionWeightUpdate(graph, zDeltas, weights, activations, params: ConvParams, scale, prog,  # noqa: N802,N803
                            name: str = "", options=None, cache=None):
    """``weights += scale * calculateWeightDeltas(...)`` in place (``poplin::convolutionWeightUpdate``);
    ``scale`` is a Python number (e.g. ``-learningRate``)."""
    if isinstance(scale, poplar.Tensor):
        raise poplibs_error("convolutionWeightUpdate: a tensor scale is not supported here; pass a number")
    _check_shape("convolutionWeightUpdate", "the weights", weights, params.getWeightsShape())
    d = calculateWeightDeltas(graph, zDeltas, activations, params, prog, name, options, cache)
    _scaled_add_to(graph, weights, d, float(scale), prog, name or "convolutionWeightUpdate")


def reportPlanInfo(out, graph, params: ConvParams, options=None, cache=None):  # noqa: N802
    """Write the plan for ``params`` to the text stream ``out`` (``poplin::reportPlanInfo``)."""
    out.write(plan_convolution(params, graph.getTarget(), options, cache, op="reportPlanInfo").report() + "\n")


def preplanConvolution(graph, params: ConvParams, options=None, cache=None):  # noqa: N802
    """Plan ``params`` into ``cache`` ahead of building (``poplin::preplanConvolution``)."""
    return plan_convolution(params, graph.getTarget(), options, cache, op="preplanConvolution")


def getFwdFlops(params: ConvParams) -> int:  # noqa: N802
    """Floating-point operations of the forward convolution, 2 per multiply-accumulate that meets
    real (not padding) input (``poplin::getFwdFlops``, counting only non-zero taps of a dilated input)."""
    from openipu.poplibs.poplin.plan import Problem
    return int(round(2 * Problem.from_params(params).macs()))
