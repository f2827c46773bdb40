"""popnn.lstm / popnn.gru: forward vs torch.nn.LSTM / torch.nn.GRU (weights copied in PopLibs' gate
order and bias convention), backward and weight update vs torch.autograd, bad params, cycles."""

import numpy as np
import pytest
import torch

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import popnn, poputil
from openipu.poplibs.popnn import gru, lstm

DT = {"float": (np.float32, poplar.FLOAT), "half": (np.float16, poplar.HALF)}
#: torch.nn.LSTM's block order (i, f, g, o) in PopLibs units; torch.nn.GRU's (r, z, n).
TORCH_LSTM_UNITS = [lstm.BASIC_LSTM_CELL_INPUT_GATE, lstm.BASIC_LSTM_CELL_FORGET_GATE, lstm.BASIC_LSTM_CELL_CANDIDATE,
                    lstm.BASIC_LSTM_CELL_OUTPUT_GATE]
TORCH_GRU_UNITS = [gru.BASIC_GRU_CELL_RESET_GATE, gru.BASIC_GRU_CELL_UPDATE_GATE, gru.BASIC_GRU_CELL_CANDIDATE]


def tol(tname, ref):
    scale = max(1.0, float(np.abs(ref).max()))
    return (2e-6 if tname == "float" else 5e-3) * scale


def check(name, got, ref, tname):
    err = np.abs(got.astype(np.float64) - ref).max()
    assert err <= tol(tname, ref), f"{name}: max error {err} > {tol(tname, ref)}"


def f64(a):
    return torch.tensor(np.asarray(a, np.float64))


def blocks(w, order, units):
    """Torch weight/bias blocks (in torch's unit order) from a PopLibs [U, ...] tensor in ``order``."""
    order = [int(u) for u in order]
    return [w[order.index(int(u))] for u in units]


def lstm_setup(h, tname, T, B, I, O, order=None, full=True, pre_calc=False, activation=None):
    nt, pt = DT[tname]
    p = lstm.LstmParams(pt, B, T, [I, O])
    if order is not None:
        p.cellOrder = order
    p.outputFullSequence = full
    rng = h.rng
    v = {"x": rng.standard_normal((T, B, I)), "wi": rng.standard_normal((4, I, O)) * 0.5,
         "wo": rng.standard_normal((4, O, O)) * 0.5, "b": rng.standard_normal((4, O)) * 0.5,
         "h0": rng.standard_normal((B, O)), "c0": rng.standard_normal((B, O))}
    v = {k: a.astype(nt) for k, a in v.items()}
    X = lstm.createInput(h.graph, p, "x")
    h.graph.setInitialValue(X, v["x"])
    W = lstm.LstmWeights(h.input("wi", v["wi"], mapping="random"), h.input("wo", v["wo"]), h.input("b", v["b"]))
    S = lstm.LstmState(h.input("h0", v["h0"], mapping="blocks"), h.input("c0", v["c0"]))
    return p, v, X, W, S


def torch_lstm(v, order, T, I, O):
    m = torch.nn.LSTM(I, O).double()
    with torch.no_grad():
        m.weight_ih_l0.copy_(torch.cat([f64(w).T for w in blocks(v["wi"], order, TORCH_LSTM_UNITS)], 0))
        m.weight_hh_l0.copy_(torch.cat([f64(w).T for w in blocks(v["wo"], order, TORCH_LSTM_UNITS)], 0))
        m.bias_ih_l0.copy_(torch.cat([f64(b) for b in blocks(v["b"], order, TORCH_LSTM_UNITS)], 0))
        m.bias_hh_l0.zero_()                       # PopLibs has one bias per unit: b_ih + b_hh
    x = f64(v["x"]).requires_grad_()
    h0 = f64(v["h0"])[None].requires_grad_()
    c0 = f64(v["c0"])[None].requires_grad_()
    y, (hn, cn) = m(x, (h0, c0))
    return m, x, h0, c0, y, cn


def torch_to_poplibs(grad_blocks, order, units, transpose):
    """Torch per-unit gradient blocks back to a PopLibs [U, ...] array in ``order``."""
    by_unit = {int(u): (g.T if transpose else g) for u, g in zip(units, grad_blocks)}
    return np.stack([by_unit[int(u)] for u in order])


@pytest.mark.parametrize("tname", ["float", "half"])
@pytest.mark.parametrize("T,B,I,O,order,pre_calc", [
    (3, 2, 5, 4, None, False),
    (4, 3, 3, 6, TORCH_LSTM_UNITS, True),
])
def test_lstm_fwd_bwd_wu_vs_torch(tname, T, B, I, O, order, pre_calc):
    h = OpHarness(tiles=8, seed=T * 10 + O)
    p, v, X, W, S = lstm_setup(h, tname, T, B, I, O, order)
    opts = {"preCalcWeights": "true"} if pre_calc else None
    out, cell, inter = lstm.lstmFwd(h.graph, p, S, X, W, True, h.prog, "fwd", opts)
    g = h.rng.standard_normal((T, B, O)).astype(DT[tname][0])
    gc = h.rng.standard_normal((B, O)).astype(DT[tname][0])
    G, GC = h.input("g", g, mapping="random"), h.input("gc", gc)
    sg, ig, wg = lstm.lstmBwdWithWU(h.graph, p, h.prog, S, inter, W, X, out, G, GC, options=opts)
    r = h.run(out=out, cell=cell, dx=ig, dh0=sg.output, dc0=sg.cellState, dwi=wg.inputWeights,
              dwo=wg.outputWeights, db=wg.biases)
    order = p.cellOrder
    m, x, h0, c0, y, cn = torch_lstm(v, order, T, I, O)
    check("output", r["out"], y.detach().numpy(), tname)
    check("cellState", r["cell"], cn[0].detach().numpy(), tname)
    (y * f64(g)).sum().add((cn[0] * f64(gc)).sum()).backward()
    check("inputGrad", r["dx"], x.grad.numpy(), tname)
    check("initOutputGrad", r["dh0"], h0.grad[0].numpy(), tname)
    check("initCellGrad", r["dc0"], c0.grad[0].numpy(), tname)
    split = lambda t: torch.chunk(t.grad, 4, 0)  # noqa: E731
    check("inputWeightsGrad", r["dwi"], torch_to_poplibs(split(m.weight_ih_l0), order, TORCH_LSTM_UNITS, True), tname)
    check("outputWeightsGrad", r["dwo"], torch_to_poplibs(split(m.weight_hh_l0), order, TORCH_LSTM_UNITS, True), tname)
    check("biasGrad", r["db"], torch_to_poplibs(split(m.bias_ih_l0), order, TORCH_LSTM_UNITS, False), tname)


def test_lstm_last_output_only_and_separate_wu():
    T, B, I, O = 3, 2, 4, 3
    h = OpHarness(tiles=4, seed=5)
    p, v, X, W, S = lstm_setup(h, "float", T, B, I, O, full=False)
    out = lstm.lstmFwd(h.graph, p, h.prog, S, W, X, None)           # the non-deprecated overload
    assert out.shape() == [B, O]
    out2, inter = lstm.lstmFwd(h.graph, p, h.prog, S, W, X, True, "fwd2")
    g = h.rng.standard_normal((B, O)).astype(np.float32)
    G = h.input("g", g)
    sg, ig, bwd = lstm.lstmBwd(h.graph, p, h.prog, S, inter, W, X, out2, G, None, True, True)
    wg = lstm.lstmWU(h.graph, p, h.prog, S, inter, bwd, W, X, out2)
    r = h.run(out=out, out2=out2, dx=ig, dh0=sg.output, dwo=wg.outputWeights)
    m, x, h0, c0, y, cn = torch_lstm(v, p.cellOrder, T, I, O)
    check("output", r["out"], y[-1].detach().numpy(), "float")
    check("output2", r["out2"], y[-1].detach().numpy(), "float")
    (y[-1] * f64(g)).sum().backward()
    check("inputGrad", r["dx"], x.grad.numpy(), "float")
    check("initOutputGrad", r["dh0"], h0.grad[0].numpy(), "float")
    dwo = torch_to_poplibs(torch.chunk(m.weight_hh_l0.grad, 4, 0), p.cellOrder, TORCH_LSTM_UNITS, True)
    check("outputWeightsGrad", r["dwo"], dwo, "float")


def test_lstm_create_and_zero_initial_state():
    h = OpHarness(tiles=4)
    p = lstm.LstmParams(poplar.HALF, 2, 5, [3, 4])
    st = lstm.createInitialState(h.graph, p, "init")
    w = lstm.createWeights(h.graph, p, "w")
    x = lstm.createInput(h.graph, p, "in")
    assert (x.shape(), w.inputWeights.shape(), w.outputWeights.shape(), w.biases.shape()) == \
        ([5, 2, 3], [4, 3, 4], [4, 4, 4], [4, 4])
    assert st.getAsTensor().shape() == [2, 2, 4] and st.output.elementType() == poplar.HALF
    for t in (st.output, st.cellState, x, w.inputWeights, w.biases):
        assert (h.graph.tile_of_elements(t) >= 0).all()
    h.graph.setInitialValue(st.output, np.ones((2, 4), np.float16))
    lstm.zeroInitialState(h.graph, st, h.prog)
    assert not h.run(o=st.output)["o"].any()
    assert lstm.getBasicLstmCellFwdFlops(p) > 0 and lstm.getBasicLstmCellWuFlops(p) > 0
    assert lstm.getDefaultBasicLstmCellOrder()[0] == lstm.BASIC_LSTM_CELL_FORGET_GATE


# -- GRU ---------------------------------------------------------------------------------------------
def gru_setup(h, tname, T, B, I, O, reset_after, order=None, full=True):
    nt, pt = DT[tname]
    p = gru.GruParams(pt, B, T, [I, O])
    p.resetAfter = reset_after
    p.outputFullSequence = full
    if order is not None:
        p.cellOrder = order
    rng = h.rng
    bshape = (3, 2, O) if reset_after else (3, O)
    v = {"x": rng.standard_normal((T, B, I)), "wi": rng.standard_normal((3, I, O)) * 0.5,
         "wo": rng.standard_normal((3, O, O)) * 0.5, "b": rng.standard_normal(bshape) * 0.5,
         "h0": rng.standard_normal((B, O))}
    v = {k: a.astype(nt) for k, a in v.items()}
    X = h.input("x", v["x"], mapping="random")
    W = gru.GruWeights(h.input("wi", v["wi"]), h.input("wo", v["wo"], mapping="random"), h.input("b", v["b"]))
    return p, v, X, W, h.input("h0", v["h0"])


def torch_gru(v, p, T, I, O):
    """Reference in float64: torch.nn.GRU for resetAfter, PopLibs' formula by hand otherwise."""
    order = p.cellOrder
    x = f64(v["x"]).requires_grad_()
    h0 = f64(v["h0"]).requires_grad_()
    wi = [f64(w).requires_grad_() for w in blocks(v["wi"], order, TORCH_GRU_UNITS)]
    wo = [f64(w).requires_grad_() for w in blocks(v["wo"], order, TORCH_GRU_UNITS)]
    b = [f64(w).requires_grad_() for w in blocks(v["b"], order, TORCH_GRU_UNITS)]
    if p.resetAfter:
        m = torch.nn.GRU(I, O).double()
        with torch.no_grad():
            m.weight_ih_l0.copy_(torch.cat([w.T for w in wi], 0))
            m.weight_hh_l0.copy_(torch.cat([w.T for w in wo], 0))
            m.bias_ih_l0.copy_(torch.cat([bb[0] for bb in b], 0))
            m.bias_hh_l0.copy_(torch.cat([bb[1] for bb in b], 0))
        y, _ = m(x, h0[None])
        grads = lambda: [  # noqa: E731
            [g.T for g in torch.chunk(m.weight_ih_l0.grad, 3, 0)], [g.T for g in torch.chunk(m.weight_hh_l0.grad, 3, 0)],
            [torch.stack([a, c]) for a, c in zip(torch.chunk(m.bias_ih_l0.grad, 3, 0),
                                                 torch.chunk(m.bias_hh_l0.grad, 3, 0))]]
        return x, h0, y, grads
    hs, hp = [], h0
    for t in range(x.shape[0]):
        r = torch.sigmoid(x[t] @ wi[0] + hp @ wo[0] + b[0])
        u = torch.sigmoid(x[t] @ wi[1] + hp @ wo[1] + b[1])
        c = torch.tanh(x[t] @ wi[2] + (r * hp) @ wo[2] + b[2])
        hp = u * hp + (1 - u) * c
        hs.append(hp)
    return x, h0, torch.stack(hs), lambda: [[w.grad for w in wi], [w.grad for w in wo], [w.grad for w in b]]


@pytest.mark.parametrize("tname", ["float", "half"])
@pytest.mark.parametrize("T,B,I,O,reset_after,order", [
    (3, 2, 5, 4, True, None),
    (4, 3, 3, 5, False, None),
    (2, 2, 4, 3, False, [gru.BASIC_GRU_CELL_CANDIDATE, gru.BASIC_GRU_CELL_RESET_GATE, gru.BASIC_GRU_CELL_UPDATE_GATE]),
])
def test_gru_fwd_bwd_wu_vs_torch(tname, T, B, I, O, reset_after, order):
    h = OpHarness(tiles=8, seed=T + O)
    p, v, X, W, S = gru_setup(h, tname, T, B, I, O, reset_after, order)
    out, inter = gru.gruFwd(h.graph, p, S, X, W, True, h.prog, "fwd")
    g = h.rng.standard_normal((T, B, O)).astype(DT[tname][0])
    G = h.input("g", g)
    dh0, ig, wg = gru.gruBwdWithWU(h.graph, p, h.prog, S, inter, W, X, out, G)
    r = h.run(out=out, dx=ig, dh0=dh0, dwi=wg.inputWeights, dwo=wg.outputWeights, db=wg.biases)
    x, h0, y, grads = torch_gru(v, p, T, I, O)
    check("output", r["out"], y.detach().numpy(), tname)
    (y * f64(g)).sum().backward()
    check("inputGrad", r["dx"], x.grad.numpy(), tname)
    check("initOutputGrad", r["dh0"], h0.grad.reshape(B, O).numpy(), tname)
    gwi, gwo, gb = grads()
    back = lambda gs: torch_to_poplibs([g.detach().numpy() for g in gs], p.cellOrder, TORCH_GRU_UNITS, False)  # noqa: E731
    check("inputWeightsGrad", r["dwi"], back(gwi), tname)
    check("outputWeightsGrad", r["dwo"], back(gwo), tname)
    check("biasGrad", r["db"], back(gb), tname)


def test_gru_last_output_only_and_separate_wu():
    T, B, I, O = 3, 2, 3, 4
    h = OpHarness(tiles=4, seed=9)
    p, v, X, W, S = gru_setup(h, "float", T, B, I, O, False, full=False)
    out, inter = gru.gruFwd(h.graph, p, S, X, W, True, h.prog)
    assert out.shape() == [B, O] and inter.shape() == [T, 4, B, O]
    g = h.rng.standard_normal((B, O)).astype(np.float32)
    dh0, ig, bwd = gru.gruBwd(h.graph, p, h.prog, S, inter, W, X, out, h.input("g", g), True, True)
    wg = gru.gruWU(h.graph, p, h.prog, S, inter, bwd, W, X, out)
    r = h.run(out=out, dx=ig, dh0=dh0, dwo=wg.outputWeights)
    x, h0, y, grads = torch_gru(v, p, T, I, O)
    check("output", r["out"], y[-1].detach().numpy(), "float")
    (y[-1] * f64(g)).sum().backward()
    check("inputGrad", r["dx"], x.grad.numpy(), "float")
    check("initOutputGrad", r["dh0"], h0.grad.numpy(), "float")
    check("outputWeightsGrad", r["dwo"],
          torch_to_poplibs([w.detach().numpy() for w in grads()[1]], p.cellOrder, TORCH_GRU_UNITS, False), "float")


# -- errors ------------------------------------------------------------------------------------------
def _bad_cases(h):
    good = lstm.LstmParams(poplar.FLOAT, 2, 3, [4, 3])
    W = lstm.createWeights(h.graph, good, "w")
    S = lstm.createInitialState(h.graph, good, "s")
    X = lstm.createInput(h.graph, good, "x")
    Xbad = lstm.createInput(h.graph, lstm.LstmParams(poplar.FLOAT, 2, 3, [5, 3]), "xbad")
    wrong_sizes = lstm.LstmParams(poplar.FLOAT, 2, 3, [4])
    int_type = lstm.LstmParams(poplar.INT, 2, 3, [4, 3])
    zero_batch = lstm.LstmParams(poplar.FLOAT, 0, 3, [4, 3])
    bad_order = lstm.LstmParams(poplar.FLOAT, 2, 3, [4, 3])
    bad_order.cellOrder = [0, 0, 1, 2]
    gelu = lstm.LstmParams(poplar.FLOAT, 2, 3, [4, 3], activation=popnn.NonLinearityType.GELU)
    return good, W, S, X, [
        (popnn.poplibs_error, lambda p: lstm.lstmFwd(h.graph, wrong_sizes, S, X, W, False, p)),
        (popnn.poplibs_error, lambda p: lstm.lstmFwd(h.graph, int_type, S, X, W, False, p)),
        (popnn.poplibs_error, lambda p: lstm.lstmFwd(h.graph, zero_batch, S, X, W, False, p)),
        (popnn.poplibs_error, lambda p: lstm.lstmFwd(h.graph, bad_order, S, X, W, False, p)),
        (popnn.poplibs_error, lambda p: lstm.lstmFwd(h.graph, good, S, Xbad, W, False, p)),
        (popnn.poplibs_error, lambda p: lstm.lstmFwd(h.graph, good, S, X,
                                                     lstm.LstmWeights(W.inputWeights, W.inputWeights, W.biases), False, p)),
        (poplar.invalid_option, lambda p: lstm.lstmFwd(h.graph, good, S, X, W, False, p, "f", {"nope": 1})),
        (poplar.invalid_option, lambda p: lstm.lstmFwd(h.graph, good, S, X, W, False, p, "f",
                                                       {"partialsType": "int"})),
        (popnn.poplibs_error, lambda p: lstm.lstmBwd(h.graph, gelu, p, S, X, W, X, X, X)),
        (popnn.poplibs_error, lambda p: gru.gruFwd(h.graph, gru.GruParams(poplar.HALF, 2, 3, [4, 3]), S.output, X,
                                                   gru.GruWeights(W.inputWeights, W.outputWeights, W.biases), False, p)),
        (popnn.poplibs_error, lambda p: gru.createWeights(h.graph, gru.GruParams(poplar.FLOAT, 2, 3, [4, 3, 2]))),
    ]


def test_bad_params_raise_and_leave_graph_usable():
    h = OpHarness(tiles=4, seed=3)
    good, W, S, X, cases = _bad_cases(h)
    n_vars, n_cs = len(h.graph._state.variables), len(h.graph.getComputeSets())
    for exc, fn in cases:
        prog = poplar.program.Sequence()
        with pytest.raises(exc) as ei:
            fn(prog)
        assert str(ei.value)
        assert prog.programs == []                       # nothing was added ...
    assert len(h.graph._state.variables) == n_vars       # ... to the program or the graph
    assert len(h.graph.getComputeSets()) == n_cs
    # the graph still builds and runs a correct LSTM
    rng = np.random.default_rng(0)
    vals = {t: rng.standard_normal(t.shape()).astype(np.float32) * 0.5
            for t in (W.inputWeights, W.outputWeights, W.biases, S.output, S.cellState, X)}
    for t, a in vals.items():
        h.graph.setInitialValue(t, a)
    out, cell = lstm.lstmFwd(h.graph, good, S, X, W, False, h.prog)
    r = h.run(out=out)
    v = {"x": vals[X], "wi": vals[W.inputWeights], "wo": vals[W.outputWeights], "b": vals[W.biases],
         "h0": vals[S.output], "c0": vals[S.cellState]}
    y = torch_lstm(v, good.cellOrder, 3, 4, 3)[4]
    check("output", r["out"], y.detach().numpy(), "float")


# -- cost ----------------------------------------------------------------------------------------------
def _fwd_bwd_cycles(kind, T, O=16, tname="half"):
    h = OpHarness(tiles=16, seed=1)
    mod = lstm if kind == "lstm" else gru
    P_ = (lstm.LstmParams if kind == "lstm" else gru.GruParams)(DT[tname][1], 4, T, [8, O])
    X = mod.createInput(h.graph, P_, "x")
    W = mod.createWeights(h.graph, P_, "w")
    h.graph.setInitialValue(X, np.zeros((T, 4, 8), DT[tname][0]))
    for t in (W.inputWeights, W.outputWeights, W.biases):
        h.graph.setInitialValue(t, np.zeros(t.shape(), DT[tname][0]))
    if kind == "lstm":
        S = lstm.createInitialState(h.graph, P_, "s")
        lstm.zeroInitialState(h.graph, S, h.prog)
        out, cell, inter = lstm.lstmFwd(h.graph, P_, S, X, W, True, h.prog)
        lstm.lstmBwdWithWU(h.graph, P_, h.prog, S, inter, W, X, out, out)
    else:
        S = gru.createInitialState(h.graph, P_, "s")
        poputil.mapTensorLinearly(h.graph, S)
        h.graph.setInitialValue(S, np.zeros(S.shape(), DT[tname][0]))
        out, inter = gru.gruFwd(h.graph, P_, S, X, W, True, h.prog)
        gru.gruBwdWithWU(h.graph, P_, h.prog, S, inter, W, X, out, out)
    h.run(o=out)
    return h.cycles()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_cycles_grow_linearly_with_timesteps(kind):
    c2, c4, c8 = (_fwd_bwd_cycles(kind, T) for T in (2, 4, 8))
    assert c2 < c4 < c8
    d1, d2 = c4 - c2, c8 - c4
    assert abs(d2 - 2 * d1) <= 0.1 * d2, (c2, c4, c8)
    # the per-step cost is most of the total (the loop dominates; WU adds a little per step too)
    assert d2 / 4 > 0.1 * c2


def test_cycles_grow_with_hidden_size():
    assert _fwd_bwd_cycles("lstm", 3, O=64) > _fwd_bwd_cycles("lstm", 3, O=16)
