"""Connectionist temporal classification: the ``Ctc`` loss (``popart.builder.aiGraphcore.ctcloss``)
and ``CtcBeamSearchDecoder`` (prefix beam search over log-probabilities ``[T, N, C]``).
``*_setup`` checks raise ``ValueError`` with PopART's message; the builder turns it into
``popart.popart_exception``.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops.losses import reduce_loss
from openipu.popart.graphcore_ops._registry import _gc, pshape


def _ctc_flops(i, o, a):
    """The alpha / beta recursions: ~10 operations per (time, batch, extended-label) cell, twice."""
    t, n = (i[0][0], i[0][1]) if len(i[0]) >= 2 else (1, 1)
    s = i[1][-1] if i[1] else 1
    return 20.0 * t * n * (2 * s + 1) + 4.0 * math.prod(i[0])


def check_ctc_inputs(lp: torch.Tensor, tgt: torch.Tensor, il: torch.Tensor, tl: torch.Tensor, blank: int) -> None:
    """Refuse CTC inputs that torch's ``ctc_loss`` does not check itself before reading memory.

    ``lp`` [T, N, C] log-probabilities, ``tgt`` [N, S] labels, ``il`` / ``tl`` [N] input and
    target lengths. torch reads ``lp`` at each label of the first ``tl[n]`` of row ``n`` without
    a bounds check: a label outside [0, C) makes it read (or write, in the backward pass) outside
    the tensor, which crashes the process (SIGSEGV) or gives garbage. Also refused here, with
    one line naming the rule: ranks other than 3 / 2 / 1 / 1, an empty ``lp``, a batch that
    differs between the inputs, ``blank`` outside [0, C), lengths outside [0, T] / [0, S].
    A target longer than its input (``tl > il``) is valid: its loss is infinite (zero with
    ``zeroInfinity``). Raises ``ValueError`` (a ``popart_exception`` naming the op, through
    ``shapes.call_kernel``)."""
    if lp.dim() != 3 or tgt.dim() != 2 or il.dim() != 1 or tl.dim() != 1:
        raise ValueError(f"Ctc: expected log_probs [T, N, C], targets [N, S], input_lengths [N] and target_lengths "
                         f"[N], got shapes {list(lp.shape)}, {list(tgt.shape)}, {list(il.shape)}, {list(tl.shape)}")
    t, n, c = lp.shape
    if lp.numel() == 0:
        raise ValueError(f"Ctc: log_probs of shape {list(lp.shape)} is empty")
    if tgt.shape[0] != n or il.shape[0] != n or tl.shape[0] != n:
        raise ValueError(f"Ctc: the batch size N={n} of log_probs differs from targets {list(tgt.shape)}, "
                         f"input_lengths {list(il.shape)} or target_lengths {list(tl.shape)}")
    if not 0 <= blank < c:
        raise ValueError(f"Ctc: blank {blank} is outside the classes [0, {c})")
    s = tgt.shape[1]
    il64, tl64 = il.to(torch.int64), tl.to(torch.int64)
    if bool(((il64 < 0) | (il64 > t)).any()):
        raise ValueError(f"Ctc: input_lengths {il64.tolist()[:8]} must be in [0, {t}] (the time steps of log_probs)")
    if bool(((tl64 < 0) | (tl64 > s)).any()):
        raise ValueError(f"Ctc: target_lengths {tl64.tolist()[:8]} must be in [0, {s}] (the columns of targets)")
    used = torch.arange(s, device=tl64.device).unsqueeze(0) < tl64.unsqueeze(1)
    labels = tgt.to(torch.int64)[used]
    if labels.numel() and bool(((labels < 0) | (labels >= c)).any()):
        bad = labels[(labels < 0) | (labels >= c)][0].item()
        raise ValueError(f"Ctc: target label {bad} is outside the classes [0, {c}) of log_probs")


@_gc("Ctc", flops=_ctc_flops)
def ctc(inputs, attrs, opset):
    """PopART's ``Ctc`` (``aiGraphcore.ctcloss``): ``[log_probs [T, N, C], targets [N, S],
    input_lengths [N], target_lengths [N]] -> [loss, d(sum of per-sample losses)/d(log_probs)]``.

    The loss is ``torch.nn.functional.ctc_loss``'s (blank ``blank``, ``zeroInfinity``), reduced
    as PopART's ReductionType (Mean: each loss over its target length, then the batch mean), in
    ``outDataType`` (UNDEFINED: the log_probs' type). The second output ``[T, N, C]`` (log_probs'
    type) is what ``CtcGrad`` scales by the loss gradient (PopART computes both in one pass)."""
    lp, tgt, il, tl = inputs
    check_ctc_inputs(lp, tgt, il, tl, int(attrs.get("blank", 0)))
    with torch.enable_grad():
        x = lp.detach().float().requires_grad_(True)
        per = torch.nn.functional.ctc_loss(x, tgt.long(), il.long(), tl.long(), blank=int(attrs.get("blank", 0)),
                                           reduction="none", zero_infinity=bool(attrs.get("zeroInfinity", 0)))
        (g,) = torch.autograd.grad(per.sum(), x)
    out = str(attrs.get("outDataType", "UNDEFINED"))
    dt = lp.dtype if out == "UNDEFINED" else (torch.float16 if out == "FLOAT16" else torch.float32)
    loss = reduce_loss(per.detach(), int(attrs.get("reduction", 1)), tl)
    return [loss.to(dt), g.to(lp.dtype)]


def ctc_beam_search_setup(lp_shape, lp_type: str, len_shape, len_type: str, name: str) -> None:
    """PopART's ``CtcBeamSearchDecoderOp::setup`` checks (``name``: the op as PopART prints it)."""
    if len(lp_shape) != 3:
        raise ValueError(f"Unsupported shape for input 0 of Op {name} (expected a 'logarithmized probabilities' "
                         f"tensor of rank 3, got a tensor with shape {pshape(lp_shape)}).")
    if lp_type not in ("FLOAT", "FLOAT16"):
        raise ValueError(f"Unsupported data type for input 0 of Op {name} (expected a 'logarithmized probabilities' "
                         f"tensor comprised of floating point data, got {lp_type}).")
    if list(len_shape) != [lp_shape[1]]:
        raise ValueError(f"Unsupported shape for input 1 of Op {name} (expected a 'data lengths' tensor of shape "
                         f"{pshape([lp_shape[1]])}, got {pshape(len_shape)}).")
    if len_type != "UINT32":
        raise ValueError(f"Unsupported data type for input 1 of Op {name} (expected a 'input lengths' tensor of "
                         f"type UINT32, got {len_type}).")


def _lse(a, b):
    """``log(exp(a) + exp(b))`` elementwise, ``-inf`` where both are."""
    m = torch.maximum(a, b)
    ms = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    return ms + torch.log(torch.exp(a - ms) + torch.exp(b - ms))


def _scatter_lse(vals, group, n_groups):
    """Per row, ``logsumexp`` of ``vals`` over the entries of each ``group`` id (``[B, K]``)."""
    b = vals.shape[0]
    m = torch.full((b, n_groups), -math.inf, dtype=vals.dtype, device=vals.device).scatter_reduce(
        1, group, vals, "amax")
    ms = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    s = torch.zeros((b, n_groups), dtype=vals.dtype, device=vals.device).scatter_add(
        1, group, torch.exp(vals - ms.gather(1, group)))
    return ms + torch.log(s)


_HASH_P = (1_000_003, 998_244_353)


_HASH_M = 2_147_483_647


def ctc_prefix_beam_search(lp, lengths, blank: int, beam_width: int, top_paths: int):
    """CTC prefix beam search (popnn's ``beamSearchDecoderLogProbabilities``; the algorithm of
    Hannun et al., "distill.pub/2017/ctc"), vectorised over the batch and the beams.

    ``lp`` ``[T, B, C]`` log-probabilities, ``lengths`` ``[B]`` (steps used per batch entry).
    Each step, every beam either stays (a blank, or its last label repeated) or is extended by a
    non-blank class; candidates with equal prefixes merge (``logsumexp`` of their blank / non-blank
    probabilities; prefixes are compared by two 31-bit polynomial hashes of their labels), and
    the ``beam_width`` most probable survive. Returns ``(log probs [B, P], lengths [B, P],
    labels [B, P, T])`` for the ``top_paths`` best prefixes, labels zero-padded."""
    t_max, b, c = lp.shape
    w = beam_width
    lp = lp.float()
    ninf = -math.inf
    dev = lp.device
    labels = torch.zeros(b, w, t_max, dtype=torch.int64, device=dev)
    plen = torch.zeros(b, w, dtype=torch.int64, device=dev)
    pb = torch.full((b, w), ninf, device=dev)
    pb[:, 0] = 0.0
    pnb = torch.full((b, w), ninf, device=dev)
    keys = torch.zeros(b, w, 2, dtype=torch.int64, device=dev)
    lengths = lengths.reshape(-1).to(dev, torch.int64)
    classes = torch.arange(c, device=dev)
    p = torch.tensor(_HASH_P, dtype=torch.int64, device=dev)
    for t in range(t_max):
        step = lp[t]                                                   # [B, C]
        last = labels.gather(2, (plen - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)   # [B, W]
        has_last = plen > 0
        tot = _lse(pb, pnb)
        # stay: the prefix unchanged
        stay_pb = tot + step[:, blank].unsqueeze(1)
        stay_pnb = torch.where(has_last, pnb + step.gather(1, last), torch.full_like(pnb, ninf))
        # extend by class k (not blank)
        same = has_last.unsqueeze(-1) & (last.unsqueeze(-1) == classes)           # [B, W, C]
        ext_pnb = torch.where(same, pb.unsqueeze(-1), tot.unsqueeze(-1)) + step.unsqueeze(1)
        ext_pnb[:, :, blank] = ninf
        ext_keys = (keys.unsqueeze(2) * p + classes.reshape(1, 1, c, 1) + 1) % _HASH_M   # [B, W, C, 2]
        # candidates: [B, W, 1 + C], slot 0 stays, slot 1 + k extends by k
        cand_pb = torch.cat([stay_pb.unsqueeze(-1), torch.full((b, w, c), ninf, device=dev)], -1).reshape(b, -1)
        cand_pnb = torch.cat([stay_pnb.unsqueeze(-1), ext_pnb], -1).reshape(b, -1)
        cand_keys = torch.cat([keys.unsqueeze(2), ext_keys], 2).reshape(b, -1, 2)
        key1 = cand_keys[..., 0] * _HASH_M + cand_keys[..., 1]            # < 2^62: exact in int64
        order = torch.argsort(key1, dim=1, stable=True)
        sk = key1.gather(1, order)
        new_group = torch.ones_like(sk, dtype=torch.bool)
        new_group[:, 1:] = sk[:, 1:] != sk[:, :-1]
        gid_sorted = torch.cumsum(new_group.to(torch.int64), 1) - 1
        group = torch.empty_like(gid_sorted).scatter_(1, order, gid_sorted)
        k = key1.shape[1]
        g_pb = _scatter_lse(cand_pb, group, k)
        g_pnb = _scatter_lse(cand_pnb, group, k)
        n_groups = new_group.sum(1, keepdim=True)
        score = _lse(g_pb, g_pnb)
        score = torch.where(torch.arange(k, device=dev) < n_groups, score, torch.full_like(score, ninf))
        # each group's first candidate (in candidate order) represents it
        rep = torch.full((b, k), k, dtype=torch.int64, device=dev).scatter_reduce(
            1, group, torch.arange(k, device=dev).expand(b, k), "amin")
        top = torch.topk(score, w, dim=1)
        sel = top.indices                                               # [B, W] group ids
        cand = rep.gather(1, sel).clamp(max=k - 1)
        parent, slot = cand // (c + 1), cand % (c + 1)
        valid = torch.isfinite(top.values)
        n_pb = torch.where(valid, g_pb.gather(1, sel), torch.full_like(top.values, ninf))
        n_pnb = torch.where(valid, g_pnb.gather(1, sel), torch.full_like(top.values, ninf))
        n_labels = labels.gather(1, parent.unsqueeze(-1).expand(b, w, t_max)).clone()
        n_len = plen.gather(1, parent)
        extend = slot > 0
        pos = n_len.clamp(max=t_max - 1)
        n_labels.scatter_(2, pos.unsqueeze(-1), torch.where(extend, slot - 1, n_labels.gather(2, pos.unsqueeze(-1))
                                                            .squeeze(-1)).unsqueeze(-1))
        n_len = n_len + extend.to(torch.int64)
        n_keys = cand_keys.gather(1, cand.unsqueeze(-1).expand(b, w, 2))
        active = (t < lengths).reshape(b, 1)
        pb = torch.where(active, n_pb, pb)
        pnb = torch.where(active, n_pnb, pnb)
        labels = torch.where(active.unsqueeze(-1), n_labels, labels)
        plen = torch.where(active, n_len, plen)
        keys = torch.where(active.unsqueeze(-1), n_keys, keys)
    score = _lse(pb, pnb)
    order = torch.argsort(score, dim=1, descending=True, stable=True)[:, :top_paths]
    out_len = plen.gather(1, order)
    out_labels = labels.gather(1, order.unsqueeze(-1).expand(b, top_paths, t_max))
    out_labels = torch.where(torch.arange(t_max, device=dev) < out_len.unsqueeze(-1), out_labels,
                             torch.zeros_like(out_labels))
    return score.gather(1, order), out_len, out_labels


def _ctc_beam_flops(i, o, a):
    t, n, c = i[0] if len(i[0]) == 3 else (1, 1, 1)
    return 12.0 * t * n * c * int(a.get("beam_width", 100))


@_gc("CtcBeamSearchDecoder", flops=_ctc_beam_flops)
def ctc_beam_search_decoder(inputs, attrs, opset):
    """PopART's ``CtcBeamSearchDecoder`` (``aiGraphcore.ctcbeamsearchdecoder``): ``[logProbs [T,
    N, C] float, dataLengths [N] UINT32] -> [labelProbs [N, P] (logProbs' type), labelLengths
    [N, P] UINT32, decodedLabels [N, P, T] UINT32]``, the ``top_paths`` (P) best label sequences
    of a prefix beam search of ``beam_width`` beams (:func:`ctc_prefix_beam_search`) over each
    entry's first ``dataLengths[n]`` steps, most probable first; labels past a path's length
    are 0."""
    lp, lengths = inputs
    if lp.dim() != 3:
        raise ValueError(f"CtcBeamSearchDecoder: logProbs must be [maxTime, batchSize, numClasses], got "
                         f"{pshape(lp.shape)}")
    blank, width, paths = int(attrs.get("blank", 0)), int(attrs.get("beam_width", 100)), int(attrs.get("top_paths", 1))
    probs, lens, labels = ctc_prefix_beam_search(lp, lengths.to(torch.int64), blank, width, paths)
    return [probs.to(lp.dtype), lens.to(torch.uint32), labels.to(torch.uint32)]
