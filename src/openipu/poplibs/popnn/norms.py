"""``popnn``: batch, group, layer and instance normalisation (PopLibs ``BatchNorm.hpp``,
``GroupNorm.hpp``, ``LayerNorm.hpp``, ``InstanceNorm.hpp``; namespaces ``popnn::bn``, ``gn``,
``ln``, ``in``).

Activations are ``[B][C][..F..]`` (batch, channels, any field dims). Statistics are taken over
*statistic groups*: per channel over batch and field for batch norm (``mean`` is ``[C]``); per
(batch element, channel group) for group norm (``mean`` is ``[B * G]``, index ``b * G + g`` [A]),
with layer norm = group norm with ``G = 1`` and instance norm = ``G = C``. ``gamma``/``beta`` are
``[C]``. Group norm's ``groupNormStridedChannelGrouping`` option (default true, as PopLibs) puts
channel ``c`` in group ``c % G``; false gives contiguous groups (``c // (C / G)``, as torch).

Work: statistics are two reductions of each statistic group (sum and sum of squares in one
``popops.reduceMany``, float partials; the stable algorithm subtracts the mean first), then one
elementwise compute set for ``invStdDev = 1 / sqrt(var + eps)``; whitening, normalising and the
gradients are elementwise compute sets over the activations' tile mapping (``NonLinearity1D``-shaped
estimates, see :mod:`openipu.poplibs.popnn._common`) and ``popops`` reductions.

Gradients (PopLibs' formulas): ``gammaDelta[c] = sum(gradsIn * whitened)``, ``betaDelta[c] =
sum(gradsIn)``; ``gradsOut = invStdDev * (g - mean_S(g) - whitened * mean_S(g * whitened))`` with
``g = gradsIn * gamma`` and ``mean_S`` over each statistic group.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import torch

from openipu import poplar
from openipu.poplar.graph_codec import kernel
from openipu.poplibs.popnn._common import (add_elementwise, check_mapped, new_mapped, output_like,
                                           poplibs_error, row_output)
from openipu.poplibs.popops.reduce import Operation, ReduceParams, SingleReduceOp, reduceMany
from openipu.poplibs.poputil import createBroadcastOperand

__all__ = ["bn", "gn", "ln", "in_"]


class _Layout:
    """Which statistic group and channel each activation element belongs to, as views.

    The activations ``[B][C][..F..]`` are viewed with an expanded shape in which a statistic group
    and a channel are products of dims (``F`` = the field dims flattened):

    - batch norm: ``[B, C, F]``; statistic ``c`` (``stat.reshape([1, C, 1])``);
    - group norm, strided channels (``c = k G + g``): ``[B, C/G, G, F]``; statistic ``b G + g``
      (``[B, 1, G, 1]``), channel ``[1, C/G, G, 1]``;
    - group norm, contiguous channels (``c = g C/G + k``; layer norm ``G = 1``, instance norm
      ``G = C``): ``[B, G, C/G, F]``; statistic ``[B, G, 1, 1]``, channel ``[1, G, C/G, 1]``.

    :meth:`rows` gives the ``[S, N]`` view of each group's elements in flattened-index order (a
    dimShuffle and reshape of the activations); :meth:`per_element` / :meth:`per_channel` give a
    ``[S]`` / ``[C]`` tensor broadcast to the expanded shape. All are views: no per-element arrays.
    """

    def __init__(self, acts, kind: str, groups: int, strided: bool, what: str):
        shape = acts.shape()
        if len(shape) < 2:
            raise poplibs_error(f"{what}: activations must be [B][C][..F..] (rank >= 2), got {shape}")
        self.shape = shape
        B, C = shape[0], shape[1]
        F = int(np.prod(shape[2:], dtype=np.int64))
        if kind == "bn":
            self.S = C
            self.expanded = [B, C, F]
            self.stat_shape = [1, C, 1]
            self.chan_shape = [1, C, 1]
            self.rows_perm = [1, 0, 2]
        else:
            if groups < 1 or C % groups:
                raise poplibs_error(f"{what}: {C} channels cannot be split into {groups} groups; numGroups must "
                                    "divide the channel count")
            G, K = groups, C // groups
            self.S = B * G
            if strided:
                self.expanded = [B, K, G, F]
                self.stat_shape = [B, 1, G, 1]
                self.chan_shape = [1, K, G, 1]
                self.rows_perm = [0, 2, 1, 3]
            else:
                self.expanded = [B, G, K, F]
                self.stat_shape = [B, G, 1, 1]
                self.chan_shape = [1, G, K, 1]
                self.rows_perm = None
        self.N = acts.numElements() // max(self.S, 1)

    def x(self, t):
        """``t`` (the activations' shape) viewed with the expanded shape."""
        return t.reshape(self.expanded)

    def rows(self, t):
        """The ``[S, N]`` view of ``t``: row ``s`` holds statistic group ``s``'s elements in
        flattened-index order."""
        v = self.x(t)
        if self.rows_perm is not None:
            v = v.dimShuffle(self.rows_perm)
        return v.reshape([self.S, self.N])

    def row_sums(self, graph, prog, name, ts, ops, out_type, outs=None):
        """``popops.reduceMany`` of each ``[S, N]`` statistic-group view of ``ts`` over its ``N``
        elements with ``ops`` (one compute set per stage for all); returns the ``[S]`` results:
        ``outs`` (mapped ``[S]`` tensors: the final stage reduces on their tiles), else new
        outputs that ``reduceMany`` maps (``row_output``)."""
        views = [self.rows(t) for t in ts]
        if outs is None:
            outs = [row_output(graph, out_type, v, f"{name}/out{i}") for i, v in enumerate(views)]
        reduceMany(graph, [SingleReduceOp(v, [1], ReduceParams(op), out_type, f"{name}/{i}")
                           for i, (v, op) in enumerate(zip(views, ops))], outs, prog, debug_name=name)
        return outs

    def per_element(self, stat_tensor):
        """A ``[S]`` statistic broadcast to the expanded shape (a view)."""
        return stat_tensor.reshape(self.stat_shape).broadcast_to(self.expanded)

    def per_channel(self, chan_tensor):
        """A ``[C]`` per-channel tensor broadcast to the expanded shape (a view)."""
        return chan_tensor.reshape(self.chan_shape).broadcast_to(self.expanded)


# -- kernels -----------------------------------------------------------------------------------
@kernel
def _stats_kernel(s1, s2, n, eps, unbiased, mean, inv, ctx):
    m = ctx.read(s1).to(torch.float32) / n
    var = ctx.read(s2).to(torch.float32) / n - m * m
    if unbiased and n > 1:
        var = var * (n / (n - 1))
    ctx.write(mean, m)
    ctx.write(inv, torch.rsqrt(torch.clamp(var, min=0) + eps))


@kernel
def _stable_stats_kernel(s1, sc, n, eps, unbiased, mean, inv, ctx):
    m = ctx.read(s1).to(torch.float32) / n
    var = ctx.read(sc).to(torch.float32) / (n - 1 if unbiased and n > 1 else n)
    ctx.write(mean, m)
    ctx.write(inv, torch.rsqrt(var + eps))


@kernel
def _center_kernel(x, mean, out, ctx):
    v = ctx.read(x)
    ctx.write(out, v.to(torch.float32) - ctx.read(mean).to(torch.float32) / 1.0)


@kernel
def _mean_kernel(s1, n, mean, ctx):
    ctx.write(mean, ctx.read(s1).to(torch.float32) / n)


@kernel
def _whiten_kernel(x, mean, inv, out, ctx):
    v = ctx.read(x)
    ctx.write(out, (v - ctx.read(mean).to(v.dtype)) * ctx.read(inv).to(v.dtype))


@kernel
def _normalise_kernel(x, mean, inv, gamma, beta, out, white, ctx):
    v = ctx.read(x)
    w = (v - ctx.read(mean).to(v.dtype)) * ctx.read(inv).to(v.dtype)
    ctx.write(white, w)
    ctx.write(out, w * ctx.read(gamma).to(v.dtype) + ctx.read(beta).to(v.dtype))


@kernel
def _affine_kernel(x, mul, add, out, ctx):
    v = ctx.read(x)
    ctx.write(out, v * ctx.read(mul).to(v.dtype) + ctx.read(add).to(v.dtype))


@kernel
def _prod_kernel(a, b, gamma, out, out2, ctx):
    ga = ctx.read(a)
    if gamma is not None:
        ga = ga * ctx.read(gamma).to(ga.dtype)
        ctx.write(out2, ga)
    ctx.write(out, ga * ctx.read(b).to(ga.dtype))


@kernel
def _grad_final_kernel(g, white, s1, s2, inv, n, out, ctx):
    gv = ctx.read(g).to(torch.float32)
    w = ctx.read(white).to(torch.float32)
    r = ctx.read(inv).to(torch.float32) * (gv - ctx.read(s1).to(torch.float32) / n -
                                           w * ctx.read(s2).to(torch.float32) / n)
    ctx.write(out, r)


# -- the generic implementation ----------------------------------------------------------------
class _Norm:
    def __init__(self, kind: str, prefix: str):
        self.kind, self.prefix = kind, prefix

    def _layout(self, acts, groups, options, what):
        strided = str(dict(options or {}).get("groupNormStridedChannelGrouping", "true")).lower() in ("true", "1")
        for k in dict(options or {}):
            if k != "groupNormStridedChannelGrouping":
                raise poplar.invalid_option(f"{what}: unknown option '{k}' (valid: groupNormStridedChannelGrouping)")
        if self.kind == "ln":
            groups, strided = 1, False
        elif self.kind == "in":
            groups, strided = acts.dim(1) if acts.rank() > 1 else 1, False
        return _Layout(acts, "bn" if self.kind == "bn" else "gn", groups, strided, what)

    def _groups_from(self, acts, mean):
        return mean.numElements() // acts.dim(0) if self.kind == "gn" else 0

    @staticmethod
    def _check_acts(acts, what):
        if not isinstance(acts, poplar.Tensor) or acts.elementType() not in (poplar.FLOAT, poplar.HALF):
            raise poplibs_error(f"{what}: activations must be a float or half tensor")

    def statistics(self, graph, acts, eps, prog, groups, unbiased, stable, partials_type, debug_name, options):
        what = debug_name or f"{self.prefix}Statistics"
        self._check_acts(acts, what)
        check_mapped(graph, acts, what)
        lay = self._layout(acts, groups, options, what)
        if lay.N == 0:
            raise poplibs_error(f"{what}: statistics over groups of 0 elements (shape {acts.shape()})")
        et = acts.elementType()
        # batch norm: PopLibs' normReduce maps the mean's reduction output as a broadcast operand of
        # the activations' channel dimension (dithered), the power's as a clone of it: each
        # channel's statistic on a tile holding that channel, not gathered onto the first tiles
        bn_outs = None
        if self.kind == "bn":
            first = createBroadcastOperand(graph, acts, poplar.FLOAT, 1, True, f"{what}/mean/ReduceResult")
            bn_outs = [first, graph.clone(first, f"{what}/power/ReduceResult")]
        if not stable:
            s1, s2 = lay.row_sums(graph, prog, f"{what}/ReduceSums", [acts, acts],
                                  [Operation.ADD, Operation.SQUARE_ADD], poplar.FLOAT, bn_outs)
            mean = new_mapped(graph, et, [lay.S], f"{what}/mean", like=s1)
            inv = new_mapped(graph, et, [lay.S], f"{what}/iStdDev", like=s1)
            add_elementwise(graph, prog, f"{what}/iStdDev", f"popops::Map<INV_STD_DEV,{et}>", inv, [s1, s2],
                            functools.partial(_stats_kernel, s1, s2, lay.N, float(eps), bool(unbiased), mean, inv),
                            "SQRT", 5, also_writes=[mean])
            return mean, inv
        (s1,) = lay.row_sums(graph, prog, f"{what}/ReduceMean", [acts], [Operation.ADD], poplar.FLOAT,
                             bn_outs[:1] if bn_outs else None)
        mean = new_mapped(graph, et, [lay.S], f"{what}/mean", like=s1)
        add_elementwise(graph, prog, f"{what}/mean", f"popops::Map<DIVIDE,{et}>", mean, [s1],
                        functools.partial(_mean_kernel, s1, lay.N, mean), "MUL", 1)
        centered = new_mapped(graph, poplar.FLOAT, acts.shape(), f"{what}/centered", like=acts)
        xa, xc, me = lay.x(acts), lay.x(centered), lay.per_element(mean)
        add_elementwise(graph, prog, f"{what}/center", f"popops::BinaryOp1D<SUBTRACT,{et}>", xc, [xa, me],
                        functools.partial(_center_kernel, xa, me, xc), "ADD", 1)
        (sc,) = lay.row_sums(graph, prog, f"{what}/ReduceVar", [centered], [Operation.SQUARE_ADD], poplar.FLOAT,
                             bn_outs[1:] if bn_outs else None)
        inv = new_mapped(graph, et, [lay.S], f"{what}/iStdDev", like=s1)
        add_elementwise(graph, prog, f"{what}/iStdDev", f"popops::Map<INV_STD_DEV,{et}>", inv, [s1, sc],
                        functools.partial(_stable_stats_kernel, s1, sc, lay.N, float(eps), bool(unbiased), mean, inv),
                        "SQRT", 4, also_writes=[mean])
        return mean, inv

    def _check_stats(self, acts, mean, inv, lay, what):
        if mean.numElements() != lay.S or inv.numElements() != lay.S:
            raise poplibs_error(f"{what}: mean and invStdDev must have {lay.S} elements for activations "
                                f"{acts.shape()}, got {mean.shape()} and {inv.shape()}")

    def whiten(self, graph, acts, mean, inv, prog, debug_name, options):
        what = debug_name or f"{self.prefix}Whiten"
        self._check_acts(acts, what)
        lay = self._layout(acts, self._groups_from(acts, mean), options, what)
        self._check_stats(acts, mean, inv, lay, what)
        out = output_like(graph, acts.elementType(), acts.shape(), (acts,), f"{what}/whitened")
        m, i = lay.per_element(mean.flatten()), lay.per_element(inv.flatten())
        xa, xo = lay.x(acts), lay.x(out)
        add_elementwise(graph, prog, what, f"popops::Map<WHITEN,{acts.elementType()}>", xo, [xa, m, i],
                        functools.partial(_whiten_kernel, xa, m, i, xo), "AXPBY", 2)
        return out

    def normalise(self, graph, acts, gamma, beta, mean, inv, prog, debug_name, options):
        what = debug_name or f"{self.prefix}alise"
        self._check_acts(acts, what)
        lay = self._layout(acts, self._groups_from(acts, mean), options, what)
        self._check_stats(acts, mean, inv, lay, what)
        self._check_params(acts, [gamma, beta], what)
        out = output_like(graph, acts.elementType(), acts.shape(), (acts,), f"{what}/out")
        white = output_like(graph, acts.elementType(), acts.shape(), (acts,), f"{what}/whitened")
        m, i = lay.per_element(mean.flatten()), lay.per_element(inv.flatten())
        g, b = lay.per_channel(gamma.flatten()), lay.per_channel(beta.flatten())
        xa, xo, xw = lay.x(acts), lay.x(out), lay.x(white)
        add_elementwise(graph, prog, what, f"popops::Map<NORMALISE,{acts.elementType()}>", xo, [xa, m, i, g, b],
                        functools.partial(_normalise_kernel, xa, m, i, g, b, xo, xw), "AXPBY", 4,
                        also_writes=[xw])
        return out, white

    @staticmethod
    def _check_params(acts, params, what):
        C = acts.dim(1)
        for p in params:
            if not isinstance(p, poplar.Tensor) or p.numElements() != C:
                raise poplibs_error(f"{what}: gamma/beta/deltas must have {C} elements (one per channel), got "
                                    f"{p.shape() if isinstance(p, poplar.Tensor) else p!r}")

    def param_gradients(self, graph, a, grads, rest, prog_default, what, options):
        what = what or f"{self.prefix}ParamGradients"
        if len(rest) >= 3 and isinstance(rest[0], poplar.Tensor):      # (acts, gradsIn, mean, iStdDev, prog, ...)
            mean, inv, prog = rest[0], rest[1], rest[2]
            white = self.whiten(graph, a, mean, inv, prog, f"{what}/whiten", options)
        else:
            prog, white = rest[0], a
        self._check_acts(white, what)
        if list(grads.shape()) != list(white.shape()):
            raise poplibs_error(f"{what}: gradsIn {grads.shape()} must match the activations {white.shape()}")
        lay = _Layout(white, "bn", 0, False, what)                   # per-channel rows
        prod = output_like(graph, white.elementType(), white.shape(), (grads, white), f"{what}/gradsXwhitened")
        add_elementwise(graph, prog, f"{what}/mul", f"popops::BinaryOp1D<MULTIPLY,{white.elementType()}>", prod,
                        [grads, white], functools.partial(_prod_kernel, grads, white, None, prod, None), "MUL")
        # PopLibs' normParamGradients reduces the two into one "JointGammaDelta" output mapped as a
        # broadcast operand of their concatenation's channel dimension (dithered)
        C = white.dim(1)
        joint = createBroadcastOperand(graph, poplar.concat([prod, grads], 1), white.elementType(), 1, True,
                                       f"{what}/JointGammaDelta")
        gd, bd = lay.row_sums(graph, prog, f"{what}/reduce", [prod, grads], [Operation.ADD, Operation.ADD],
                               white.elementType(), [joint.slice(0, C), joint.slice(C, 2 * C)])
        return gd, bd

    def gradients(self, graph, a, grads, rest, what, options):
        what = what or f"{self.prefix}Gradients"
        if len(rest) >= 4 and isinstance(rest[2], poplar.Tensor):       # (acts, gradsIn, mean, invStdDev, gamma, prog)
            mean, inv, gamma, prog = rest[0], rest[1], rest[2], rest[3]
            white = self.whiten(graph, a, mean, inv, prog, f"{what}/whiten", options)
        else:                                                            # (actsWhitened, gradsIn, invStdDev, gamma, prog)
            inv, gamma, prog = rest[0], rest[1], rest[2]
            white, mean = a, inv
        self._check_acts(white, what)
        if list(grads.shape()) != list(white.shape()):
            raise poplibs_error(f"{what}: gradsIn {grads.shape()} must match the activations {white.shape()}")
        self._check_params(white, [gamma], what)
        lay = self._layout(white, self._groups_from(white, inv), options, what)
        self._check_stats(white, mean, inv, lay, what)
        et = white.elementType()
        g = output_like(graph, et, white.shape(), (grads,), f"{what}/gXgamma")
        gw = output_like(graph, et, white.shape(), (grads,), f"{what}/gXgammaXwhitened")
        gam = lay.per_channel(gamma.flatten())
        xg, xw, xgw, xgg = lay.x(grads), lay.x(white), lay.x(gw), lay.x(g)
        add_elementwise(graph, prog, f"{what}/mul", f"popops::Map<GAMMA_MUL,{et}>", xgw, [xg, xw, gam],
                        functools.partial(_prod_kernel, xg, xw, gam, xgw, xgg), "MUL", 2, also_writes=[xgg])
        # PopLibs' normGradients maps both reductions' outputs as clones of invStdDev
        inv_flat = inv.flatten()
        s1, s2 = lay.row_sums(graph, prog, f"{what}/reduce", [g, gw], [Operation.ADD, Operation.ADD], poplar.FLOAT,
                              [graph.clone(poplar.FLOAT, inv_flat, f"{what}/meanDelta"),
                               graph.clone(poplar.FLOAT, inv_flat, f"{what}/varDelta")])
        out = output_like(graph, et, white.shape(), (grads, white), f"{what}/gradsOut")
        i_e, s1_e, s2_e = lay.per_element(inv.flatten()), lay.per_element(s1), lay.per_element(s2)
        xo = lay.x(out)
        add_elementwise(graph, prog, f"{what}/final", f"popops::Map<NORM_GRAD,{et}>", xo, [xgg, xw, s1_e, s2_e, i_e],
                        functools.partial(_grad_final_kernel, xgg, xw, s1_e, s2_e, i_e, lay.N, xo), "AXPBY", 5)
        return out

    def param_update(self, graph, gamma_delta, beta_delta, scale, gamma, beta, prog, what):
        from openipu.poplibs.popops.scaled_add import scaledAddTo
        what = what or f"{self.prefix}ParamUpdate"
        scaledAddTo(graph, gamma, gamma_delta, scale, prog, f"{what}/gamma")
        scaledAddTo(graph, beta, beta_delta, scale, prog, f"{what}/beta")


def _namespace(kind: str, prefix: str, has_groups: bool):
    impl = _Norm(kind, prefix)

    def statistics(graph, acts, eps, prog, *args, debug_name: str = "", options=None):
        args = list(args)
        groups = args.pop(0) if has_groups else 0
        unbiased = args.pop(0) if args else False
        stable = args.pop(0) if args else False
        ptype = args.pop(0) if args else poplar.FLOAT
        name = args.pop(0) if args else debug_name
        opts = args.pop(0) if args else options
        return impl.statistics(graph, acts, eps, prog, int(groups), unbiased, stable, ptype, name, opts)

    def whiten(graph, acts, mean, invStdDev, prog, debug_name: str = "", options=None):  # noqa: N803
        return impl.whiten(graph, acts, mean, invStdDev, prog, debug_name, options)

    def normalise(graph, acts, *args, debug_name: str = "", options=None):
        if kind == "bn" and len(args) >= 3 and not isinstance(args[3] if len(args) > 3 else None, poplar.Tensor):
            mul, add, prog = args[0], args[1], args[2]
            name = args[3] if len(args) > 3 else debug_name
            impl._check_params(acts, [mul, add], "batchNormalise")
            out = output_like(graph, acts.elementType(), acts.shape(), (acts,), "batchNormalise/out")
            lay = _Layout(acts, "bn", 0, False, "batchNormalise")
            m, a = lay.per_channel(mul.flatten()), lay.per_channel(add.flatten())
            xa, xo = lay.x(acts), lay.x(out)
            add_elementwise(graph, prog, name or "batchNormalise", f"popops::Map<AFFINE,{acts.elementType()}>", xo,
                            [xa, m, a], functools.partial(_affine_kernel, xa, m, a, xo), "AXPBY", 2)
            return out
        gamma, beta, mean, inv, prog, *rest = args
        return impl.normalise(graph, acts, gamma, beta, mean, inv, prog, rest[0] if rest else debug_name,
                              rest[1] if len(rest) > 1 else options)

    def param_gradients(graph, a, gradsIn, *args, debug_name: str = "", options=None):  # noqa: N803
        rest = list(args)
        return impl.param_gradients(graph, a, gradsIn, rest, None, debug_name, options)

    def gradients(graph, a, gradsIn, *args, debug_name: str = "", options=None):  # noqa: N803
        return impl.gradients(graph, a, gradsIn, list(args), debug_name, options)

    def param_update(graph, gammaDelta, betaDelta, scale, gamma, beta, prog, debug_name: str = "",  # noqa: N803
                     options=None):
        impl.param_update(graph, gammaDelta, betaDelta, scale, gamma, beta, prog, debug_name)

    ns = {
        f"{prefix}Statistics": statistics, f"{prefix}Whiten": whiten, f"{prefix}alise": normalise,
        f"{prefix}ParamGradients": param_gradients, f"{prefix}Gradients": gradients,
        f"{prefix}ParamUpdate": param_update,
    }
    sig = ("(graph, acts, eps, prog, numGroups, unbiasedVarEstimate, stableAlgo=False, partialsType=FLOAT, "
           "debug_name='', options=None)" if has_groups else
           "(graph, acts, eps, prog, unbiasedVarEstimate, stableAlgo=False, partialsType=FLOAT, debug_name='')")
    statistics.__doc__ = (f"``{prefix}Statistics{sig}`` -> ``(mean, invStdDev)`` (``popnn::{kind}::{prefix}Statistics``).\n\n"
                          "Statistic tensors have the activations' type; see the module docstring for their layout.\n\n"
                          "Raises:\n    poplibs_error: bad rank, type or group count.")
    whiten.__doc__ = f"``{prefix}Whiten(graph, acts, mean, invStdDev, prog)``: ``(acts - mean) * invStdDev``."
    normalise.__doc__ = (f"``{prefix}alise(graph, acts, gamma, beta, mean, invStdDev, prog)`` -> ``(out, whitened)``"
                         f" with ``out = whitened * gamma + beta``" +
                         (" ; or ``batchNormalise(graph, acts, combinedMultiplicand, addend, prog)`` -> "
                          "``acts * combinedMultiplicand + addend`` (per channel)." if kind == "bn" else "."))
    param_gradients.__doc__ = (f"``{prefix}ParamGradients(graph, actsWhitened, gradsIn, prog[, partialsType])`` or "
                               f"``(graph, acts, gradsIn, mean, iStdDev, prog[, partialsType])`` -> "
                               "``(gammaDelta, betaDelta)`` ``[C]``.")
    gradients.__doc__ = (f"``{prefix}Gradients(graph, actsWhitened, gradsIn, invStdDev, gamma, prog)`` or "
                         "``(graph, acts, gradsIn, mean, invStdDev, gamma, prog)`` -> gradient w.r.t. the input "
                         "activations (through the statistics).")
    param_update.__doc__ = (f"``{prefix}ParamUpdate(graph, gammaDelta, betaDelta, scale, gamma, beta, prog)``: "
                            "``gamma += scale * gammaDelta``, ``beta += scale * betaDelta`` (``scale`` a float or a "
                            "one-element tensor).")
    return SimpleNamespace(**ns)


bn = _namespace("bn", "batchNorm", False)
gn = _namespace("gn", "groupNorm", True)
ln = _namespace("ln", "layerNorm", False)
in_ = _namespace("in", "instanceNorm", False)
