"""Recurrent layers: RNN, GRU, LSTM (forward/reverse/bidirectional, layout 0/1, sequence_lens,
initial states, peepholes, clip, custom activations). One step per time index, vectorised over
the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from openipu.popart.onnx_ops import OnnxKernelError, onnx_op
from openipu.popart.onnx_ops._common import opt

# Activations that take (alpha, beta) and their defaults (ONNX RNN activation list).
_ACT_PARAMS = {"affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
               "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None)}


def _activation(name, alpha, beta):
    n = name.lower()
    if n == "sigmoid":
        return torch.sigmoid
    if n == "tanh":
        return torch.tanh
    if n == "relu":
        return torch.relu
    if n == "softsign":
        return F.softsign
    if n == "softplus":
        return lambda t: torch.log1p(torch.exp(t))
    if n == "affine":
        return lambda t: alpha * t + beta
    if n == "leakyrelu":
        return lambda t: F.leaky_relu(t, alpha)
    if n == "thresholdedrelu":
        return lambda t: torch.where(t > alpha, t, torch.zeros_like(t))
    if n == "scaledtanh":
        return lambda t: alpha * torch.tanh(beta * t)
    if n == "hardsigmoid":
        return lambda t: torch.clamp(alpha * t + beta, 0, 1)
    if n == "elu":
        return lambda t: F.elu(t, alpha)
    raise OnnxKernelError(f"unknown recurrent activation {name!r}")


def _activations(attrs, defaults, ndir):
    names = attrs.get("activations") or defaults * ndir
    alphas = list(attrs.get("activation_alpha") or [])
    betas = list(attrs.get("activation_beta") or [])
    fns = []
    for nm in names:
        da, db = _ACT_PARAMS.get(nm.lower(), (None, None))
        a = alphas.pop(0) if da is not None and alphas else da
        b = betas.pop(0) if db is not None and betas else db
        fns.append(_activation(nm, a, b))
    k = len(defaults)
    return [fns[d * k:(d + 1) * k] for d in range(ndir)]


def _rnn_flops(in_shapes, out_shapes, attrs):
    x, w, r = in_shapes[0], in_shapes[1], in_shapes[2]
    seq_batch = x[0] * x[1]
    return 2.0 * seq_batch * w[0] * w[1] * (w[2] + r[2])


def _run(kind, inputs, attrs, opset):
    x, w, r = inputs[0], inputs[1], inputs[2]
    b, lens, h0 = opt(inputs, 3), opt(inputs, 4), opt(inputs, 5)
    layout = attrs.get("layout", 0)
    if layout:
        x = x.transpose(0, 1)
        if h0 is not None:
            h0 = h0.transpose(0, 1)
    c0 = opt(inputs, 6) if kind == "LSTM" else None
    peep = opt(inputs, 7) if kind == "LSTM" else None
    if c0 is not None and layout:
        c0 = c0.transpose(0, 1)
    T, B = x.shape[0], x.shape[1]
    ndir = w.shape[0]
    H = attrs.get("hidden_size") or r.shape[-1]
    direction = attrs.get("direction", "forward")
    if (ndir == 2) != (direction == "bidirectional"):
        raise OnnxKernelError(f"{kind}: W has {ndir} directions but direction={direction!r}")
    G = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
    acts = _activations(attrs, defaults[kind], ndir)
    clip = attrs.get("clip")
    dt = x.dtype
    lens_t = lens.to(x.device, torch.int64) if lens is not None else \
        torch.full((B,), T, dtype=torch.int64, device=x.device)
    ys, hs, cs = [], [], []
    for d in range(ndir):
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        wd, rd = w[d], r[d]
        bd = b[d] if b is not None else torch.zeros(2 * G * H, dtype=dt, device=x.device)
        wb, rb = bd[:G * H], bd[G * H:]
        h = h0[d] if h0 is not None else torch.zeros(B, H, dtype=dt, device=x.device)
        c = c0[d] if c0 is not None else torch.zeros(B, H, dtype=dt, device=x.device)
        pd = peep[d] if peep is not None else torch.zeros(3 * H, dtype=dt, device=x.device)
        f_act = acts[d]
        xd = x
        if reverse:  # reverse each batch entry within its own length
            t = torch.arange(T, device=x.device)[:, None]
            src = torch.where(t < lens_t[None, :], lens_t[None, :] - 1 - t, t)
            xd = torch.gather(x, 0, src[:, :, None].expand(x.shape))
        xw = xd @ wd.T + wb  # [T, B, G*H]
        y = torch.zeros(T, B, H, dtype=dt, device=x.device)
        for t in range(T):
            valid = (t < lens_t)[:, None]
            g = xw[t]
            if kind == "RNN":
                pre = g + h @ rd.T + rb
                if clip is not None:
                    pre = pre.clamp(-clip, clip)
                hn = f_act[0](pre)
            elif kind == "GRU":
                gz, gr, gh = g.split(H, -1)
                rz, rr, rh = rd.split(H, 0)
                bz, br, bh = rb.split(H, 0)
                z = gz + h @ rz.T + bz
                rg = gr + h @ rr.T + br
                if clip is not None:
                    z, rg = z.clamp(-clip, clip), rg.clamp(-clip, clip)
                z, rg = f_act[0](z), f_act[0](rg)
                if attrs.get("linear_before_reset", 0):
                    hh = gh + rg * (h @ rh.T + bh)
                else:
                    hh = gh + (rg * h) @ rh.T + bh
                if clip is not None:
                    hh = hh.clamp(-clip, clip)
                hh = f_act[1](hh)
                hn = (1 - z) * hh + z * h
            else:  # LSTM, gates i, o, f, c
                pre = g + h @ rd.T + rb
                gi, go, gf, gc = pre.split(H, -1)
                pi, po, pf = pd.split(H, 0)
                gi = gi + pi * c
                gf = gf + pf * c
                if clip is not None:
                    gi, gf, gc = gi.clamp(-clip, clip), gf.clamp(-clip, clip), gc.clamp(-clip, clip)
                i_ = f_act[0](gi)
                f_ = f_act[0](gf)
                if attrs.get("input_forget", 0):
                    f_ = 1 - i_
                cn = f_ * c + i_ * f_act[1](gc)
                go = go + po * cn
                if clip is not None:
                    go = go.clamp(-clip, clip)
                hn = f_act[0](go) * f_act[2](cn)
                c = torch.where(valid, cn, c)
            h = torch.where(valid, hn, h)
            y[t] = torch.where(valid, hn, torch.zeros_like(hn))
        if reverse:
            t = torch.arange(T, device=x.device)[:, None]
            src = torch.where(t < lens_t[None, :], lens_t[None, :] - 1 - t, t)
            y = torch.gather(y, 0, src[:, :, None].expand(y.shape))
        ys.append(y)
        hs.append(h)
        cs.append(c)
    Y = torch.stack(ys, 1)  # [T, D, B, H]
    Yh = torch.stack(hs, 0)
    Yc = torch.stack(cs, 0)
    if layout:
        Y = Y.permute(2, 0, 1, 3)
        Yh, Yc = Yh.transpose(0, 1), Yc.transpose(0, 1)
    outs = [Y.contiguous(), Yh.contiguous()]
    if kind == "LSTM":
        outs.append(Yc.contiguous())
    return outs


@onnx_op("RNN", flops=_rnn_flops)
def rnn(inputs, attrs, opset):
    return _run("RNN", inputs, attrs, opset)


@onnx_op("GRU", flops=_rnn_flops)
def gru(inputs, attrs, opset):
    return _run("GRU", inputs, attrs, opset)


@onnx_op("LSTM", flops=_rnn_flops)
def lstm(inputs, attrs, opset):
    return _run("LSTM", inputs, attrs, opset)
