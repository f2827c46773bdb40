"""Lowerings of ``ai.graphcore`` ops with a Poplar / PopLibs form (PopART's Opx of each):

- Gelu, GeluErf, Swish: ``popnn.nonLinearity`` (in place where PopART's inplacing allows);
  SwishGrad: ``popnn.nonLinearityInputGradient`` (from the forward input);
- Detach, Nop, TensorRemap, ShapedDropout at inference, ReplicatedAllReduce with one replica:
  the input itself (a view; PopART's in-place variants);
- ReplicatedAllReduce across replicas: ``gcl.allReduceCrossReplica`` (``ReplicatedAllReduceOpx``);
  ReplicatedReduceScatter, ReplicaSlice, ReplicatedAllGather: the collectives of replicated tensor
  sharding (``gcl.reduceScatterCrossReplica``, a slice at the replication index,
  ``gcl.allGatherCrossReplica``);
- PrintTensor: Poplar's ``PrintTensor`` program (stdout, ``title: [values]``) and the input as the
  output (``PrintTensorOpx``); the title is the ``title`` attribute or the input's id, and for the
  gradient op ``<title>_gradient`` or the gradient's id (PopART's ``getTitle``);
- CopyVarUpdate: a copy of the updater into the variable, the variable as the output;
- Abort: ``Abort`` / ``AbortOnCondition`` on the scalar input (``AbortOpx``);
- Dropout / DropoutGrad / ShapedDropout in training: ``poprand.dropout`` / ``shapedDropout`` with
  the step's seed and the op's ``seedModifier`` (``DropoutOpx``), so a gradient regenerates its
  forward mask; a requested ``mask`` output uses the generic lowering (the same host stream);
- RandomUniform(Like) / RandomNormal(Like) after RandomSetup (the seed as the last input):
  ``poprand.uniform`` / ``normal`` with the step's seed and the op's ``seedModifier``, shaped
  and mapped like the ``Like`` input, or a linearly mapped tensor of ``shape``; the same stream as
  the host kernels of :mod:`openipu.popart.graphcore_ops`;
- DynamicSlice / DynamicUpdate: ``popops.dynamicSlice`` / ``dynamicUpdate`` (the update on a
  copy, or in place where PopART's inplacing allows); DynamicZero / DynamicAdd and the gradient
  ops use the generic lowering;
- GetRandomSeed: one vertex on the seed's tile incrementing its first word in place;
- BatchNormalization (PopART's variant, ``spatial=1``): the ONNX op's ``popnn.bn`` lowerings,
  the saved / running variance unbiased (``BatchNormOpx`` with ``unbiased_variance``);
- GroupNormalization and GroupNormalizationGrad (float): ``popnn.gn`` statistics, normalise,
  gradients and parameter gradients (``GroupNormOpx`` / ``GroupNormGradOpx``), channel groups
  contiguous unless the session option ``groupNormStridedChannelGrouping``.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplar import sets as _sets
from openipu.poplar.graph import Access, VertexGroup
from openipu.poplibs import gcl, popnn, popops, poprand
from openipu.popart.lowering import lowering, unary
from openipu.popart.lowering._util import FLOATS, comm_group, dtype, graph, live_outputs, name, shape
from openipu.popart.variable_settings import comm_size

GC = "ai.graphcore"
#: Tile cycles of the GetRandomSeed vertex. [A] a load, an add and a store of one word, plus a
#: supervisor vertex's fixed cost (PopLibs' SetSeedSupervisor is 14 + 27 x 6).
GET_RANDOM_SEED_CYCLES = 40


def _view_ok(op, ir):
    return bool(op.inputs) and bool(op.inputs[0]) and live_outputs(op) == 1 and \
        dtype(ir, op.inputs[0]) == dtype(ir, op.outputs[0]) and shape(ir, op.inputs[0]) == shape(ir, op.outputs[0])


@lowering("Detach", "Nop", "TensorRemap", domain=GC, accepts=_view_ok)
def identity(ctx, op):
    return [ctx.input(op, 0)]


def _accepts_shaped_inference(op, ir):
    return _view_ok(op, ir) and (len(op.inputs) < 2 or not op.inputs[1])


@lowering("ShapedDropout", domain=GC, accepts=_accepts_shaped_inference)
def shaped_dropout_inference(ctx, op):
    return [ctx.input(op, 0)]


_COLLECTIVE = {"Add": "ADD", "Mean": "MEAN", "Mul": "MUL", "Min": "MIN", "Max": "MAX", "LogicalAnd": "LOGICAL_AND",
               "LogicalOr": "LOGICAL_OR", "SquareAdd": "SQUARE_ADD", "Local": "LOCAL"}


@lowering("ReplicatedAllReduce", domain=GC, accepts=_view_ok)
def replicated_all_reduce(ctx, op):
    x = ctx.input(op, 0)
    if ctx.options.getGlobalReplicationFactor() <= 1:
        return [x]
    return [gcl.allReduceCrossReplica(graph(ctx, op), x, _COLLECTIVE.get(str(op.attrs.get("op", "Add")), "ADD"),
                                      ctx.prog, comm_group(op), debug_name=name(op))]



@lowering("ReplicatedReduceScatter", domain=GC)
def replicated_reduce_scatter(ctx, op):
    """The input flattened, reduced over the replicas of each group of the op's ``commGroup``
    (all replicas by default), and cut into one ``ceil(n / p)`` piece per replica of the group
    of ``p`` (zero-padded): ``gcl.reduceScatterCrossReplica`` (PopART's
    ``ReplicatedReduceScatterOpx``)."""
    x = ctx.input(op, 0).flatten()
    if comm_size(op.attrs.get("commGroup"), ctx.options.getGlobalReplicationFactor()) <= 1:
        return [x]       # groups of one: each replica keeps its flattened input
    return [gcl.reduceScatterCrossReplica(graph(ctx, op), x, _COLLECTIVE.get(str(op.attrs.get("op", "Add")), "ADD"),
                                          ctx.prog, comm_group(op), debug_name=name(op))]


def _position_in_group(ctx, op, g, index):
    """This replica's place in its group of the op's ``commGroup`` (a UNSIGNED_INT scalar
    tensor): the replication index ``r`` itself for all replicas, ``r % k`` in Consecutive
    groups of ``k``, ``r // (R / k)`` in Orthogonal ones."""
    attr = op.attrs.get("commGroup")
    R = ctx.options.getGlobalReplicationFactor()
    k = comm_size(attr, R)
    if k == R:
        return index
    kind = int(attr[0])
    value = k if kind == 1 else R // k
    c = g.addConstant(index.elementType(), [], value, f"{name(op)}/groupPlace")
    g.setTileMapping(c, 0)
    return (popops.rem if kind == 1 else popops.div)(g, index, c, ctx.prog, f"{name(op)}/placeInGroup")


@lowering("ReplicaSlice", domain=GC)
def replica_slice(ctx, op):
    """This replica's piece of the flattened input, ``[ceil(n / p)]`` (zero-padded), ``p``
    replicas in its group of the op's ``commGroup`` (all replicas by default): a
    ``popops.dynamicSlice`` at its place in the group (the weight slice a sharded optimizer
    state updates). In a distributed replicated graph the replicas are all instances' and the
    index the global one (``globalReplicaOffset`` plus the local index)."""
    g = graph(ctx, op)
    x = ctx.input(op, 0).flatten()
    rf = comm_size(op.attrs.get("commGroup"), ctx.options.getGlobalReplicationFactor())
    if rf <= 1:
        return [x]
    k = -(-x.numElements() // rf)
    if rf * k > x.numElements():
        pad = g.addConstant(x.elementType(), [rf * k - x.numElements()], 0, f"{name(op)}/padding")
        g.setTileMapping(pad, 0)        # fewer than `replicas` zeros
        x = poplar.concat([x, pad], 0)
    index = g.addReplicationIndexConstant(f"{name(op)}/replica")
    g.setTileMapping(index, 0)
    global_rf = ctx.options.getGlobalReplicationFactor()
    offset = int(ctx.options.globalReplicaOffset) if global_rf > ctx.options.replication_factor() else 0
    if offset:      # a distributed replicated graph: this instance's replicas start at globalReplicaOffset
        off = g.addConstant(index.elementType(), [], offset, f"{name(op)}/replicaOffset")
        g.setTileMapping(off, 0)
        index = popops.add(g, index, off, ctx.prog, f"{name(op)}/globalReplica")
    index = _position_in_group(ctx, op, g, index)
    out = g.addVariable(x.elementType(), [1, k], name(op))
    ctx.prog.add(P.WriteUndef(out))     # written whole by the slice: live from here only
    popops.dynamicSliceWithOutput(g, out, x.reshape([rf, k]), index.reshape([1]), [0], [1], ctx.prog, name(op))
    return [out.reshape([k])]


@lowering("ReplicatedAllGather", domain=GC)
def replicated_all_gather(ctx, op):
    """The pieces of every replica of each group of the op's ``commGroup`` (all replicas by
    default) gathered in group order (``gcl.allGatherCrossReplica``), flattened, trimmed to the
    output's elements and shaped like it (PopART's ``ReplicatedAllGatherOpx``)."""
    x = ctx.input(op, 0)
    out = gcl.allGatherCrossReplica(graph(ctx, op), x, ctx.prog, comm_group(op), debug_name=name(op)).flatten()
    return [out.slice(0, ctx.ir.tensors[op.outputs[0]].info.nelms(), 0).reshape(shape(ctx.ir, op.outputs[0]))]


def _accepts_gc_batch_norm(op, ir):
    from openipu.popart.lowering import norm
    return bool(int(op.attrs.get("spatial", 1))) and len(shape(ir, op.inputs[0])) >= 3 and \
        (norm._accepts_bn(op, ir) or norm._accepts_bn_training(op, ir))


@lowering("BatchNormalization", domain=GC, accepts=_accepts_gc_batch_norm)
def gc_batch_norm(ctx, op):
    """PopART's ai.graphcore BatchNormalization (``BatchNormOpx`` with ``unbiased_variance``),
    ``spatial=1``: the ONNX op's ``popnn.bn`` lowerings; in training the batch variance comes from
    the inverse standard deviation scaled by ``sqrt((n - 1) / n)``."""
    from openipu.popart.lowering import norm
    if norm._bn_training(op):
        return norm.batch_norm_training(ctx, op, unbiased=True)
    return norm.batch_norm(ctx, op)


def print_title(op, ir) -> str:
    """PopART's ``PrintTensorOpx::getTitle``: forward op ``title`` or the input id; gradient op
    ``<title>_gradient`` or its output id."""
    title = op.attrs.get("title") or ""
    if isinstance(title, bytes):
        title = title.decode()
    if op.grad_of is None:
        return title or op.inputs[0]
    return f"{title}_gradient" if title else op.outputs[0]


@lowering("PrintTensor", domain=GC, accepts=_view_ok)
def print_tensor(ctx, op):
    x = ctx.input(op, 0)
    ctx.prog.add(P.PrintTensor(print_title(op, ctx.ir), x, debugContext=name(op)))
    return [x]


@lowering("CopyVarUpdate", domain=GC)
def copy_var_update(ctx, op):
    var = ctx.input(op, 0)
    ctx.prog.add(P.Copy(ctx.input(op, 1), var, debugContext=name(op)))
    return [var]


@lowering("Abort", domain=GC)
def abort(ctx, op):
    if op.inputs and op.inputs[0]:
        ctx.prog.add(P.AbortOnCondition(ctx.input(op, 0), "Abort op", debugContext=f"Abort/{op.name}"))
    else:
        ctx.prog.add(P.Abort("Abort op", debugContext=f"Abort/{op.name}"))
    return []


# -- non-linearities -------------------------------------------------------------------------------
_NL = {"Gelu": "GELU", "GeluErf": "GELU_ERF", "Swish": "SWISH"}


def _accepts_nl(op, ir):
    return _view_ok(op, ir) and dtype(ir, op.inputs[0]) in FLOATS


@lowering(*_NL, domain=GC, accepts=_accepts_nl)
def non_linearity(ctx, op):
    return unary._non_linearity(ctx, op, _NL[op.op_type])


def _accepts_swish_grad(op, ir):
    return len(op.inputs) == 2 and all(op.inputs) and _same_float(ir, op.inputs + op.outputs[:1]) and \
        shape(ir, op.inputs[0]) == shape(ir, op.inputs[1])


@lowering("SwishGrad", domain=GC, accepts=_accepts_swish_grad)
def swish_grad(ctx, op):
    x, gy = ctx.input(op, 0), ctx.input(op, 1)
    return [popnn.nonLinearityInputGradient(graph(ctx, op), "SWISH", x, gy, ctx.prog, name(op))]


# -- random ops ---------------------------------------------------------------------------------
def _accepts_dropout(op, ir):
    return len(op.inputs) == 2 and all(op.inputs) and live_outputs(op) == 1 and \
        dtype(ir, op.inputs[0]) in FLOATS and dtype(ir, op.inputs[0]) == dtype(ir, op.outputs[0])


def _keep(op):
    return 1.0 - float(op.attrs.get("ratio", 0.5))


@lowering("Dropout", "DropoutGrad", domain=GC, accepts=_accepts_dropout)
def dropout(ctx, op):
    x, seed = ctx.input(op, 0), ctx.input(op, 1)
    keep = _keep(op)
    return [poprand.dropout(graph(ctx, op), seed, int(op.attrs.get("seedModifier", 0)), x, x, keep, 1.0 / keep,
                            ctx.prog, name(op))]


def _accepts_shaped(op, ir):
    if not _accepts_dropout(op, ir):
        return False
    try:
        np.broadcast_shapes(tuple(int(s) for s in op.attrs.get("shape", [])), tuple(shape(ir, op.inputs[0])))
    except ValueError:
        return False
    return True


def _mask_reference(x, mask_shape):
    """A view of ``x`` with the mask's shape (poprand reads only the reference's shape)."""
    xs = x.shape()
    lead = len(xs) - len(mask_shape)
    v = x
    for d, n in enumerate(mask_shape):
        if n == 1 and xs[lead + d] != 1:
            v = v.slice(0, 1, lead + d)
    for d in range(lead):
        v = v.slice(0, 1, d)
    return v.reshape(list(mask_shape))


@lowering("ShapedDropout", domain=GC, accepts=_accepts_shaped)
def shaped_dropout(ctx, op):
    x, seed = ctx.input(op, 0), ctx.input(op, 1)
    keep = _keep(op)
    ref = _mask_reference(x, [int(s) for s in op.attrs["shape"]])
    return [poprand.shapedDropout(graph(ctx, op), seed, int(op.attrs.get("seedModifier", 0)), x, ref, keep,
                                  1.0 / keep, ctx.prog, name(op))]


def _next_seed_kernel(seed, ctx):
    s = ctx.read(seed).to(torch.int64).reshape(ctx.replicas, 2).clone()
    s[:, 0] = (s[:, 0] + 1) & 0xFFFFFFFF
    ctx.write(seed, s)


@lowering("GetRandomSeed", domain=GC)
def get_random_seed(ctx, op):
    g = graph(ctx, op)
    seed = ctx.input(op, 0)
    tiles = _sets.unique(g.tile_runs_of(seed)[2]).astype(np.int64) if g.is_mapped(seed) else np.zeros(1, np.int64)
    tiles = tiles[:1]
    cs = g.addComputeSet(name(op))
    g.add_vertex_group(cs, VertexGroup(
        "popart::GetRandomSeed", tiles, np.full(len(tiles), GET_RANDOM_SEED_CYCLES),
        functools.partial(_next_seed_kernel, seed), reads=[Access(seed)], writes=[Access(seed)], multi=True,
        flops=0.0, state_bytes=8))
    ctx.prog.add(P.Execute(cs, debugContext=name(op)))
    return [seed]


# -- dynamic slices -------------------------------------------------------------------------------
def _dyn_dims(op, ir):
    """``(axes, sizes)`` of a DynamicSlice / DynamicUpdate that ``popops`` takes, else None."""
    xs = shape(ir, op.inputs[0])
    try:
        axes = [int(a) % len(xs) for a in op.attrs.get("axes", [])]
    except ZeroDivisionError:
        return None
    sizes = [int(v) for v in op.attrs.get("sizes", [])]
    if not axes or len(axes) != len(sizes) or len(set(axes)) != len(axes) or \
            any(not 1 <= v <= xs[a] for a, v in zip(axes, sizes)):
        return None
    off = op.inputs[1]
    if dtype(ir, off) not in ("INT32", "UINT32", "INT64") or int(np.prod(shape(ir, off))) != len(axes):
        return None
    return axes, sizes


def _accepts_dyn(op, ir):
    n = 3 if op.op_type == "DynamicUpdate" else 2
    return len(op.inputs) == n and all(op.inputs) and live_outputs(op) == 1 and _dyn_dims(op, ir) is not None and \
        int(np.prod(shape(ir, op.inputs[0]))) > 0


@lowering("DynamicSlice", domain=GC, accepts=_accepts_dyn)
def dynamic_slice(ctx, op):
    axes, sizes = _dyn_dims(op, ctx.ir)
    return [popops.dynamicSlice(graph(ctx, op), ctx.input(op, 0), ctx.input(op, 1).flatten(), axes, sizes, ctx.prog,
                                name(op))]


@lowering("DynamicUpdate", domain=GC, accepts=_accepts_dyn)
def dynamic_update(ctx, op):
    g = graph(ctx, op)
    axes, sizes = _dyn_dims(op, ctx.ir)
    t = ctx.input(op, 0)
    if ctx.in_place_input(op) is None:          # PopART's DynamicUpdateOpx: a copy, updated
        out = g.clone(t, f"{name(op)}/out")
        ctx.prog.add(P.Copy(t, out, debugContext=f"{name(op)}/copy"))
        t = out
    popops.dynamicUpdate(g, t, ctx.input(op, 2), ctx.input(op, 1).flatten(), axes, sizes, ctx.prog, name(op))
    return [t]


# -- group normalisation --------------------------------------------------------------------------
def _gn_options(ctx):
    strided = bool(getattr(ctx.options, "groupNormStridedChannelGrouping", False))
    return {"groupNormStridedChannelGrouping": "true" if strided else "false"}


def _same_float(ir, ids):
    types = {dtype(ir, x) for x in ids if x}
    return len(types) == 1 and next(iter(types)) in FLOATS


def _accepts_gn(op, ir):
    if len(op.inputs) != 3 or not all(op.inputs) or not _same_float(ir, op.inputs + [o for o in op.outputs if o]):
        return False
    xs = shape(ir, op.inputs[0])
    groups = int(op.attrs.get("num_groups", 0))
    return len(xs) >= 2 and int(np.prod(xs)) > 0 and groups >= 1 and xs[1] % groups == 0 and \
        all(int(np.prod(shape(ir, x))) == xs[1] for x in op.inputs[1:])


@lowering("GroupNormalization", domain=GC, accepts=_accepts_gn)
def group_norm(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    x, gamma, beta = (ctx.input(op, i) for i in range(3))
    eps = float(op.attrs.get("epsilon", 1e-5))
    opts = _gn_options(ctx)
    stable = bool(getattr(ctx.options, "enableStableNorm", False))
    mean, inv = popnn.gn.groupNormStatistics(g, x, eps, ctx.prog, int(op.attrs["num_groups"]), False, stable,
                                             poplar.FLOAT, f"{nm}/stats", opts)
    y, _ = popnn.gn.groupNormalise(g, x, gamma.flatten(), beta.flatten(), mean, inv, ctx.prog, nm, opts)
    return [y, mean, inv]


def _accepts_gn_grad(op, ir):
    # inputs: gy, x, scale, mean, invStdDev; outputs: dx, dscale, dbias
    return len(op.inputs) == 5 and all(op.inputs) and _same_float(ir, op.inputs + [o for o in op.outputs if o])


@lowering("GroupNormalizationGrad", domain=GC, accepts=_accepts_gn_grad)
def group_norm_grad(ctx, op):
    g = graph(ctx, op)
    nm = name(op)
    gy, x, gamma, mean, inv = (ctx.input(op, i) for i in range(5))
    opts = _gn_options(ctx)
    white = popnn.gn.groupNormWhiten(g, x, mean, inv, ctx.prog, f"{nm}/whiten", opts)
    dx = popnn.gn.groupNormGradients(g, white, gy, inv, gamma.flatten(), ctx.prog, debug_name=f"{nm}/dx",
                                     options=opts)
    dgamma, dbeta = popnn.gn.groupNormParamGradients(g, white, gy, ctx.prog, debug_name=f"{nm}/dparams")
    outs = [dx, dgamma.reshape(shape(ctx.ir, op.outputs[1])) if len(op.outputs) > 1 and op.outputs[1] else None,
            dbeta.reshape(shape(ctx.ir, op.outputs[2])) if len(op.outputs) > 2 and op.outputs[2] else None]
    return outs



# -- seeded random generators (RandomSetup) ----------------------------------------------------
def _accepts_random(op, ir):
    like = op.op_type.endswith("Like")
    return len(op.inputs) == (2 if like else 1) and all(op.inputs) and live_outputs(op) == 1 and \
        dtype(ir, op.outputs[0]) in FLOATS


@lowering("RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", domain=GC,
          accepts=_accepts_random)
def seeded_random(ctx, op):
    from openipu.poplibs import poputil
    g = graph(ctx, op)
    seed = ctx.input(op, len(op.inputs) - 1)
    if op.op_type.endswith("Like"):
        ref = ctx.input(op, 0)
    else:
        ref = g.addVariable(ctx.ptype(op.outputs[0]), [int(d) for d in op.attrs["shape"]], f"{name(op)}/ref")
        poputil.mapTensorLinearly(g, ref)
    out_type = ctx.ptype(op.outputs[0])
    mod = int(op.attrs.get("seedModifier", 0))
    if op.op_type.startswith("RandomUniform"):
        return [poprand.uniform(g, seed, mod, ref, out_type, float(op.attrs.get("low", 0.0)),
                                float(op.attrs.get("high", 1.0)), ctx.prog, name(op))]
    return [poprand.normal(g, seed, mod, ref, out_type, float(op.attrs.get("mean", 0.0)),
                           float(op.attrs.get("scale", 1.0)), ctx.prog, name(op))]
