"""PopART's own LSTM (``PopartLSTMOp``): gate order (forget, input, candidate, output), weights
``[4, in+hidden, hidden]`` as ``builder.aiGraphcore.lstm`` takes them.
"""

from __future__ import annotations

import math

import torch

from openipu.popart.graphcore_ops._registry import _gc, pshape


#: PopART's gate order of the packed LSTM weights (``[forget, input, candidate, output]``,
#: popnn's default ``BasicLstmCellUnit`` order) as indices of ONNX's ``[i, o, f, c]`` order
_POPART_GATE_OF_ONNX = (1, 3, 0, 2)


def lstm_setup(xs, ws, bs=None, init=None) -> None:
    """PopART's ``PopartLSTMOp::setup`` checks (its message, which prints the input index)."""
    if len(xs) != 3:
        raise ValueError(f"Bad input shape 0, should be [seq_length batch_size input_size], got {pshape(xs)}")
    if len(ws) != 3:
        raise ValueError(f"Bad weights shape 1, should be [4 input_size+hidden_size hidden_size], got {pshape(ws)}")
    t, n, i = xs
    h = ws[2]
    for name, idx, got, want in (("weights", 1, ws, [4, i + h, h]), ("bias", 2, bs, [4, h]),
                                 ("initialState", 3, init, [2, n, h])):
        if got is not None and list(got) != want:
            raise ValueError(f"Bad {name} shape {idx}, should be {pshape(want)}")


def _popart_lstm_flops(i, o, a):
    t, n, _ = i[0]
    return 2.0 * t * n * math.prod(i[1]) + 10.0 * t * n * i[1][2] * 4


@_gc("LSTM", flops=_popart_lstm_flops)
def popart_lstm(inputs, attrs, opset):
    """PopART's own LSTM (``PopartLSTMOp``, ``aiGraphcore.lstm``): ``[X [T, N, I], weights
    [4, I + H, H], (biases [4, H]), (initialState [2, N, H]: h then c), (seq_lens [N] INT32)] ->
    [Y, cell state [N, H]]``, ``Y`` ``[T, N, H]`` (``output_full_sequence``, default) or the last
    output ``[N, H]``. Gates in popnn's order forget, input, candidate, output; ``X_t @
    weights[g, :I] + h @ weights[g, I:] + biases[g]``; sigmoid gates, tanh candidate and cell
    output. Steps past a sequence length keep the state and output zeros (ONNX's rule). Runs as
    ONNX LSTM (:mod:`openipu.popart.onnx_ops.recurrent`) on the weights rearranged."""
    from openipu.popart.onnx_ops.recurrent import _run
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    init = inputs[3] if len(inputs) > 3 else None
    lens = inputs[4] if len(inputs) > 4 else None
    lstm_setup(list(x.shape), list(w.shape), None if b is None else list(b.shape),
               None if init is None else list(init.shape))
    n_in, h = x.shape[2], w.shape[2]
    wi, wr = w[:, :n_in, :], w[:, n_in:, :]                      # [4, I, H], [4, H, H]
    order = list(_POPART_GATE_OF_ONNX)
    w_onnx = wi[order].transpose(1, 2).reshape(1, 4 * h, n_in)
    r_onnx = wr[order].transpose(1, 2).reshape(1, 4 * h, h)
    bias = b[order].reshape(4 * h) if b is not None else torch.zeros(4 * h, dtype=x.dtype, device=x.device)
    b_onnx = torch.cat([bias, torch.zeros(4 * h, dtype=bias.dtype, device=bias.device)]).reshape(1, 8 * h)
    h0 = init[0:1] if init is not None else None
    c0 = init[1:2] if init is not None else None
    y, yh, yc = _run("LSTM", [x, w_onnx, r_onnx, b_onnx, lens, h0, c0], {"hidden_size": h}, 7)
    out = y[:, 0] if int(attrs.get("output_full_sequence", 1)) else yh[0]
    return [out.contiguous(), yc[0].contiguous()]
