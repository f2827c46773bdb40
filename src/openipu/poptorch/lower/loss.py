"""Losses (their outputs are the training loss, PopTorch's rule): ``cross_entropy_loss`` ->
LogSoftmax + PopART ``nllloss`` (log-probabilities in, ``ignore_index``, PyTorch's Mean over the
rows kept), ``nll_loss*`` -> ``nllloss``, ``mse_loss`` -> (x - y)^2 reduced, ``l1_loss`` ->
``l1loss`` of x - y, ``binary_cross_entropy(_with_logits)``, ``poptorch.identity_loss`` ->
``identityloss``; ``kl_div``, ``soft_margin``, ``margin_ranking``, ``hinge_embedding``,
``cosine_embedding``, ``triplet_margin``, ``poisson_nll``, ``multilabel_margin`` and
``multi_margin`` losses (and cross-entropy with class weights, label smoothing or probability
targets) through their decomposition (:func:`openipu.poptorch.lower.lower_decomposed`), still
marked as the loss. Reductions: PyTorch's enum (0 none, 1 mean, 2 sum)."""

from __future__ import annotations

from openipu.poptorch.lower import aten, lower_decomposed

_REDUCTION = {0: "NoReduction", 1: "Mean", 2: "Sum"}


def _arg(n, i, name, default):
    return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)


def _classes_last(lw, x):
    """``x [N, C, d...]`` as ``[N, d..., C]`` (PopART's nllloss takes the classes last)."""
    rank = len(lw.shape(x))
    tid = lw.t(x) if not isinstance(x, str) else x
    if rank <= 2:
        return tid
    return lw.onnx.transpose([tid], [0] + list(range(2, rank)) + [1], lw._name("classes_last"))


def _nll(lw, n, logp, target, reduction, ignore_index, weight):
    ignore = None if ignore_index is None else int(ignore_index)
    label = lw.t(target)
    if lw.dtype(target) != "INT32":
        label = lw.cast(label, "INT32")
    return lw.gc.nllloss([logp, label], _REDUCTION[int(reduction)], ignoreIndex=ignore, inputIsLogProbability=True,
                         debugContext=lw._name())


@aten("aten.cross_entropy_loss.default", loss=True)
def cross_entropy(lw, n):
    x, target = n.args[0], n.args[1]
    weight = _arg(n, 2, "weight", None)
    reduction = _arg(n, 3, "reduction", 1)
    ignore_index = _arg(n, 4, "ignore_index", -100)
    smoothing = float(_arg(n, 5, "label_smoothing", 0.0))
    if smoothing or weight is not None or (lw.shape(target) == lw.shape(x) and lw.dtype(target) in ("FLOAT", "FLOAT16")):
        return lower_decomposed(lw, n)      # class weights, label smoothing, probability targets
    rank = len(lw.shape(x))
    logp = lw.onnx.logsoftmax([_classes_last(lw, x)], axis=max(rank - 1, 0), debugContext=lw._name("logsoftmax"))
    return _nll(lw, n, logp, target, reduction, ignore_index, weight)


@aten("aten.nll_loss_nd.default", "aten.nll_loss.default", "aten.nll_loss2d.default", loss=True)
def nll_loss(lw, n):
    x, target = n.args[0], n.args[1]
    if _arg(n, 2, "weight", None) is not None:
        return lower_decomposed(lw, n)      # class weights: the weighted mean of PyTorch's decomposition
    return _nll(lw, n, _classes_last(lw, x), target, _arg(n, 3, "reduction", 1), _arg(n, 4, "ignore_index", -100),
                None)


@aten("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default", loss=True)
def nll_loss_forward(lw, n):
    if _arg(n, 2, "weight", None) is not None:
        return lower_decomposed(lw, n)      # (loss, total_weight)
    return (nll_loss(lw, n), None)


def _reduce(lw, tid, reduction):
    if int(reduction) == 0:
        return tid
    fn = lw.onnx.reducemean if int(reduction) == 1 else lw.onnx.reducesum
    return fn([tid], keepdims=0, debugContext=lw._name())


@aten("aten.mse_loss.default", loss=True)
def mse_loss(lw, n):
    d = lw.onnx.sub([lw.t(n.args[0]), lw.like(n.args[1], n.args[0])], lw._name("diff"))
    return _reduce(lw, lw.onnx.mul([d, d], lw._name("square")), _arg(n, 2, "reduction", 1))


@aten("aten.l1_loss.default", loss=True)
def l1_loss(lw, n):
    d = lw.onnx.sub([lw.t(n.args[0]), lw.like(n.args[1], n.args[0])], lw._name("diff"))
    return lw.gc.l1loss([d], 1.0, _REDUCTION[int(_arg(n, 2, "reduction", 1))], lw._name())


@aten("aten.smooth_l1_loss.default", "aten.huber_loss.default", loss=True)
def smooth_l1(lw, n):
    huber = str(n.target).startswith("aten.huber")
    beta = float(_arg(n, 3, "delta" if huber else "beta", 1.0))
    dt = lw.dtype(n.args[0])
    d = lw.onnx.abs([lw.onnx.sub([lw.t(n.args[0]), lw.like(n.args[1], n.args[0])])])
    quad = lw.onnx.div([lw.onnx.mul([lw.onnx.mul([d, d]), lw.const(0.5, dt)]), lw.const(beta, dt)])
    lin = lw.onnx.sub([d, lw.const(0.5 * beta, dt)])
    y = lw.onnx.where([lw.onnx.less([d, lw.const(beta, dt)]), quad, lin], lw._name())
    if huber:
        y = lw.onnx.mul([y, lw.const(beta, dt)])
    return _reduce(lw, y, _arg(n, 2, "reduction", 1))


@aten("aten.binary_cross_entropy.default", loss=True)
def bce(lw, n):
    if _arg(n, 2, "weight", None) is not None:
        return lower_decomposed(lw, n)
    p, y = lw.t(n.args[0]), lw.like(n.args[1], n.args[0])
    dt = lw.dtype(n.args[0])
    one = lw.const(1.0, dt)
    lo = lw.const(-100.0, dt)     # PyTorch clamps the logs at -100
    logp = lw.onnx.max([lw.onnx.log([p]), lo])
    log1mp = lw.onnx.max([lw.onnx.log([lw.onnx.sub([one, p])]), lo])
    loss = lw.onnx.neg([lw.onnx.add([lw.onnx.mul([y, logp]), lw.onnx.mul([lw.onnx.sub([one, y]), log1mp])])])
    return _reduce(lw, loss, _arg(n, 3, "reduction", 1))


@aten("aten.binary_cross_entropy_with_logits.default", loss=True)
def bce_logits(lw, n):
    if _arg(n, 2, "weight", None) is not None or _arg(n, 3, "pos_weight", None) is not None:
        return lower_decomposed(lw, n)
    x, y = lw.t(n.args[0]), lw.like(n.args[1], n.args[0])
    dt = lw.dtype(n.args[0])
    # max(x, 0) - x y + log(1 + exp(-|x|))
    zero = lw.const(0.0, dt)
    loss = lw.onnx.add([lw.onnx.sub([lw.onnx.max([x, zero]), lw.onnx.mul([x, y])]),
                        lw.gc.log1p([lw.onnx.exp([lw.onnx.neg([lw.onnx.abs([x])])])])])
    return _reduce(lw, loss, _arg(n, 4, "reduction", 1))


@aten("poptorch.identity_loss.default", loss=True)
def identity_loss(lw, n):
    return lw.gc.identityloss([lw.t(n.args[0])], _REDUCTION[int(n.args[1])], lw._name())


@aten("aten.kl_div.default", "aten.soft_margin_loss.default", "aten.margin_ranking_loss.default",
      "aten.hinge_embedding_loss.default", "aten.cosine_embedding_loss.default", "aten.triplet_margin_loss.default",
      "aten.poisson_nll_loss.default", "aten.multilabel_margin_loss.default", "aten.multi_margin_loss.default",
      loss=True)
def decomposed_loss(lw, n):
    """A loss with no PopART op of its own: its decomposition, marked as the loss."""
    return lower_decomposed(lw, n)


@aten("poptorch.ctc_loss.default", loss=True)
def ctc_loss(lw, n):
    """``F.ctc_loss(log_probs [T, N, C], targets [N, S], input_lengths [N], target_lengths [N],
    blank, reduction, zero_infinity)`` -> PopART's ``ctcloss`` (PopTorch's lowering; Mean divides
    each loss by its target length, then averages the batch, as PyTorch). Targets must be the
    padded ``[N, S]`` form. Raises :class:`Error` for concatenated 1-D targets."""
    import numpy as np
    import torch

    from openipu.poptorch.errors import Error
    lp, tgt, il, tl = n.args[:4]
    blank = int(_arg(n, 4, "blank", 0))
    reduction = int(_arg(n, 5, "reduction", 1))
    zero_inf = bool(_arg(n, 6, "zero_infinity", False))
    if len(lw.shape(tgt)) != 2:
        raise Error("CTCLoss: targets must be a padded [batch, max target length] tensor (PopTorch's restriction)")

    def lengths(v):
        if not isinstance(v, torch.fx.Node):
            return lw.const(np.asarray(v, np.int32), "INT32")
        return lw.t(v) if lw.dtype(v) == "INT32" else lw.cast(lw.t(v), "INT32")
    t = lw.t(tgt) if lw.dtype(tgt) == "INT32" else lw.cast(lw.t(tgt), "INT32")
    return lw.gc.ctcloss([lw.t(lp), t, lengths(il), lengths(tl)], _REDUCTION[reduction], blank, "UNDEFINED",
                         zero_inf, lw._name())
