"""poplin convolutions: results against an independent numpy / torch reference, gradients
against torch autograd, and the planner's memory and cost invariants on conv shapes."""

import io

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import poplin, popops
from openipu.poplibs.poplin import InputTransform as IT
from openipu.poplibs.poplin import OutputTransform as OT


# ---------------------------------------------------------------------------------------------
# an independent reference: PopLibs' transform semantics in numpy, then a direct correlation
def _transform(a, tr, first):
    for d in range(len(tr.dilation)):
        ax = first + d
        a = np.take(a, np.arange(tr.truncationLower[d], a.shape[ax] - tr.truncationUpper[d]), axis=ax)
        if tr.dilation[d] > 1:
            shape = list(a.shape)
            shape[ax] = (a.shape[ax] - 1) * tr.dilation[d] + 1
            z = np.zeros(shape, a.dtype)
            idx = [slice(None)] * a.ndim
            idx[ax] = slice(None, None, tr.dilation[d])
            z[tuple(idx)] = a
            a = z
        pad = [(0, 0)] * a.ndim
        pad[ax] = (tr.paddingLower[d], tr.paddingUpper[d])
        a = np.pad(a, pad)
        if tr.flip[d]:
            a = np.flip(a, ax)
    return a


def ref_conv(X, W, p):
    """X [N, G*Ci, *F], W [G, Co, Ci, *K] -> [N, G*Co, *Fo], float64."""
    N, G, Ci, Co = p.batchSize, p.numConvGroups, p.inputChannelsPerConvGroup, p.outputChannelsPerConvGroup
    nd = p.getNumFieldDims()
    x = _transform(X.astype(np.float64).reshape(N, G, Ci, *X.shape[2:]), p.inputTransform, 3)
    w = _transform(W.astype(np.float64), p.kernelTransform, 3)
    win = np.lib.stride_tricks.sliding_window_view(x, w.shape[3:], axis=tuple(range(3, 3 + nd)))
    letters = "xyz"[:nd]
    y = np.einsum(f"ngc{letters.upper()}{letters},goc{letters}->ngo{letters.upper()}", win, w)
    ot = p.outputTransform
    for d in range(nd):
        ax = 3 + d
        y = np.take(y, np.arange(ot.truncationLower[d], y.shape[ax] - ot.truncationUpper[d], ot.stride[d]), axis=ax)
        pad = [(0, 0)] * y.ndim
        pad[ax] = (ot.paddingLower[d], ot.paddingUpper[d])
        y = np.pad(y, pad)
    return y.reshape(N, G * Co, *y.shape[3:])


def run_conv(p, X, W, tiles=16, options=None, mapping="linear", transpose=False):
    h = OpHarness(tiles=tiles)
    dt = poplar.HALF if X.dtype == np.float16 else poplar.FLOAT
    x = h.input("x", X, dt, mapping=mapping)
    w = h.input("w", W, dt, mapping="random")
    y = poplin.convolution(h.graph, x, w, p, transpose, h.prog, "y", options)
    return h.run(out=y)["out"], h


# ---------------------------------------------------------------------------------------------
CASES = [
    # (batch, field, kernel, Ci, Co, G, inputTransform, kernelTransform, outputTransform)
    (2, [11], [3], 5, 7, 1, IT(paddingLower=[1], paddingUpper=[1]), None, OT(stride=[2])),
    (1, [8, 7], [3, 3], 4, 6, 1, IT(paddingLower=[1, 1], paddingUpper=[1, 1]), None, None),
    (2, [9, 8], [3, 2], 3, 5, 2, IT(paddingLower=[1, 0], paddingUpper=[2, 1]), IT(dilation=[2, 1]), OT(stride=[2, 1])),
    (3, [6, 5], [1, 1], 16, 20, 1, None, None, OT(stride=[2, 2])),
    (1, [5, 4, 4], [2, 2, 3], 2, 3, 3, IT(paddingUpper=[0, 1, 2]), None, None),
    (2, [5, 6], [2, 3], 3, 4, 1, IT(truncationLower=[1, 0], dilation=[2, 1], paddingLower=[0, 2], flip=[True, False]),
     IT(paddingUpper=[1, 0], flip=[False, True]), OT(truncationLower=[1, 0], paddingLower=[1, 0], paddingUpper=[0, 2])),
    (4, [7], [7], 6, 2, 1, IT(paddingLower=[3], paddingUpper=[3]), None, None),       # kernel as wide as the field
    (2, [4, 4], [3, 3], 1, 1, 8, IT(paddingLower=[1, 1], paddingUpper=[1, 1]), None, None),  # depthwise
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_convolution_matches_reference(case, dtype):
    N, fld, ker, Ci, Co, G, it, kt, ot = CASES[case]
    ptype = poplar.HALF if dtype == np.float16 else poplar.FLOAT
    p = poplin.ConvParams(ptype, N, fld, ker, Ci, Co, G, inputTransform=it, kernelTransform=kt, outputTransform=ot)
    rng = np.random.default_rng(case)
    X = rng.standard_normal([N, G * Ci, *fld]).astype(dtype)
    W = rng.standard_normal([G, Co, Ci, *ker]).astype(dtype)
    out, h = run_conv(p, X, W)
    ref = ref_conv(X, W, p)
    assert list(out.shape) == p.getOutputShape() == list(ref.shape)
    tol = 2e-2 * max(1.0, np.abs(ref).max()) if dtype == np.float16 else 1e-4
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=tol, rtol=0)
    assert h.cycles() > 0


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_convolution_random_shapes(data):
    nd = data.draw(st.integers(1, 2))
    fld = data.draw(st.lists(st.integers(3, 9), min_size=nd, max_size=nd))
    ker = [data.draw(st.integers(1, min(3, f))) for f in fld]
    stride = data.draw(st.lists(st.integers(1, 3), min_size=nd, max_size=nd))
    pad = data.draw(st.lists(st.integers(0, 2), min_size=nd, max_size=nd))
    N, G = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2))
    Ci, Co = data.draw(st.integers(1, 20)), data.draw(st.integers(1, 20))
    p = poplin.ConvParams(poplar.FLOAT, N, fld, ker, Ci, Co, G, inputTransform=IT(paddingLower=pad, paddingUpper=pad),
                          outputTransform=OT(stride=stride))
    rng = np.random.default_rng(0)
    X = rng.standard_normal([N, G * Ci, *fld]).astype(np.float32)
    W = rng.standard_normal([G, Co, Ci, *ker]).astype(np.float32)
    amp = data.draw(st.sampled_from([0.6, 0.05]))
    out, _ = run_conv(p, X, W, tiles=data.draw(st.sampled_from([1, 16])), options={"availableMemoryProportion": amp},
                      mapping=data.draw(st.sampled_from(["linear", "random", "tile0"])))
    np.testing.assert_allclose(out, ref_conv(X, W, p), atol=1e-4, rtol=0)


def test_half_partials_change_fp16_results():
    """fp16 inputs with fp32 partials equal an fp32 computation cast to half; fp16 partials
    accumulate in half precision and differ."""
    p = poplin.ConvParams(poplar.HALF, 1, [4], [1], 1024, 4, 1)
    rng = np.random.default_rng(1)
    X = (rng.random([1, 1024, 4]) + 1).astype(np.float16)
    W = (rng.random([1, 4, 1024, 1]) + 1).astype(np.float16)
    exact = ref_conv(X, W, p)
    f32, _ = run_conv(p, X, W, options={"partialsType": "float"})
    f16, _ = run_conv(p, X, W, options={"partialsType": "half"})
    np.testing.assert_array_equal(f32, exact.astype(np.float32).astype(np.float16))
    assert np.abs(f16.astype(np.float64) - exact).max() > np.abs(f32.astype(np.float64) - exact).max()


# ---------------------------------------------------------------------------------------------
GRAD_CASES = [
    (2, [9, 8], [3, 2], 3, 4, 2, [1, 0], [2, 1], [2, 1], [2, 1]),
    (3, [10], [3], 4, 5, 1, [1], [1], [2], [1]),
    (1, [6, 6], [1, 1], 8, 3, 1, [0, 0], [0, 0], [2, 2], [1, 1]),
]


@pytest.mark.parametrize("case", range(len(GRAD_CASES)))
def test_gradients_match_torch_autograd(case):
    """Input gradient (getGradientParams + transposeAndFlipWeights) and weight gradient
    (calculateWeightDeltas) equal torch autograd's; convolutionWeightUpdate applies them."""
    N, fld, ker, Ci, Co, G, pl, pu, stride, kdil = GRAD_CASES[case]
    nd = len(fld)
    p = poplin.ConvParams(poplar.FLOAT, N, fld, ker, Ci, Co, G, inputTransform=IT(paddingLower=pl, paddingUpper=pu),
                          kernelTransform=IT(dilation=kdil), outputTransform=OT(stride=stride))
    rng = np.random.default_rng(case)
    X = rng.standard_normal([N, G * Ci, *fld]).astype(np.float32)
    W = rng.standard_normal([G, Co, Ci, *ker]).astype(np.float32)
    xt, wt = torch.tensor(X, requires_grad=True), torch.tensor(W, requires_grad=True)
    padding = []
    for d in reversed(range(nd)):
        padding += [pl[d], pu[d]]
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d}[nd]
    yt = conv(torch.nn.functional.pad(xt, padding), wt.reshape(G * Co, Ci, *ker), stride=stride, dilation=kdil, groups=G)
    assert list(yt.shape) == p.getOutputShape()
    D = rng.standard_normal(yt.shape).astype(np.float32)
    yt.backward(torch.tensor(D))
    h = OpHarness(tiles=16)
    d, w, x = h.input("d", D), h.input("w", W), h.input("x", X)
    gx = poplin.convolution(h.graph, d, w, poplin.getGradientParams(p), True, h.prog, "gx")
    gw = poplin.calculateWeightDeltas(h.graph, d, x, p, h.prog, "gw")
    poplin.convolutionWeightUpdate(h.graph, d, w, x, p, -0.5, h.prog, "wu")
    r = h.run(gx=gx, gw=gw, w=w)
    np.testing.assert_allclose(r["gx"], xt.grad.numpy(), atol=1e-4)
    np.testing.assert_allclose(r["gw"], wt.grad.numpy(), atol=1e-4)
    np.testing.assert_allclose(r["w"], W - 0.5 * wt.grad.numpy(), atol=1e-4)


def test_gradient_params_shapes():
    p = poplin.ConvParams(poplar.FLOAT, 2, [9, 8], [3, 2], 3, 4, 2, inputTransform=IT(paddingLower=[1, 0]),
                          outputTransform=OT(stride=[2, 1]))
    b = poplin.getGradientParams(p)
    assert b.getOutputFieldShape() == p.inputFieldShape
    assert b.inputFieldShape == p.getOutputFieldShape()
    assert (b.inputChannelsPerConvGroup, b.outputChannelsPerConvGroup) == (4, 3)


# ---------------------------------------------------------------------------------------------
def test_create_input_and_weights_reduce_exchange():
    """Tensors from createInput / createWeights are laid out for the plan: the convolution's
    predicted cycles are lower than with both operands on one tile, and results agree."""
    p = poplin.ConvParams(poplar.HALF, 4, [16, 16], [3, 3], 32, 32, 1, inputTransform=IT(paddingLower=[1, 1],
                                                                                          paddingUpper=[1, 1]))
    rng = np.random.default_rng(0)
    X = rng.standard_normal(p.getInputShape()).astype(np.float16)
    W = rng.standard_normal(p.getWeightsShape()).astype(np.float16)
    cycles, outs = {}, {}
    for how in ("created", "tile0"):
        h = OpHarness(tiles=64)
        if how == "created":
            x = poplin.createInput(h.graph, p, "x")
            w = poplin.createWeights(h.graph, p, "w")
        else:
            x = h.graph.addVariable(poplar.HALF, p.getInputShape(), "x")
            w = h.graph.addVariable(poplar.HALF, p.getWeightsShape(), "w")
            h.graph.setTileMapping(x, 0)
            h.graph.setTileMapping(w, 0)
        h.graph.setInitialValue(x, X)
        h.graph.setInitialValue(w, W)
        y = poplin.convolution(h.graph, x, w, p, False, h.prog, "y")
        outs[how] = h.run(out=y)["out"]
        cycles[how] = h.cycles()
    np.testing.assert_array_equal(outs["created"], outs["tile0"])
    assert cycles["created"] < cycles["tile0"]


def test_biases():
    rng = np.random.default_rng(0)
    h = OpHarness(tiles=8)
    A = rng.standard_normal((3, 5, 4, 4)).astype(np.float32)
    Bv = rng.standard_normal(5).astype(np.float32)
    a = h.input("a", A)
    b = poplin.createBiases(h.graph, a, "b")
    assert b.shape() == [5] and (h.graph.tile_of_elements(b) >= 0).all()
    h.graph.setInitialValue(b, Bv)
    poplin.addBias(h.graph, a, b, h.prog, "bias")
    np.testing.assert_allclose(h.run(a=a)["a"], A + Bv[None, :, None, None], atol=1e-6)
    with pytest.raises(poplar.graph_connection_error, match="biases"):
        poplin.addBias(h.graph, a, h.graph.addVariable(poplar.FLOAT, [4], "bad"), h.prog)


# ---------------------------------------------------------------------------------------------
def test_conv_params_sizes_and_errors():
    p = poplin.ConvParams(poplar.FLOAT, 8, [224, 224], [7, 7], 3, 64, 1,
                          inputTransform=IT(paddingLower=[3, 3], paddingUpper=[3, 3]), outputTransform=OT(stride=[2, 2]))
    assert p.getOutputShape() == [8, 64, 112, 112]
    assert p.getWeightsShape() == [1, 64, 3, 7, 7]
    q = poplin.ConvParams(poplar.HALF, poplar.FLOAT, 8, [224, 224], [7, 7], 3, 64, 1,
                          IT(paddingLower=[3, 3], paddingUpper=[3, 3]), IT(), OT(stride=[2, 2]))
    assert q.outputType == poplar.FLOAT and q.getOutputShape() == p.getOutputShape()
    with pytest.raises(poplin.poplibs_error, match="larger than the transformed input"):
        poplin.ConvParams(poplar.FLOAT, 1, [3], [5], 1, 1, 1)
    with pytest.raises(poplin.poplibs_error, match="dimensions"):
        poplin.ConvParams(poplar.FLOAT, 1, [3, 3], [1], 1, 1, 1)
    h = OpHarness(tiles=4)
    x = h.graph.addVariable(poplar.FLOAT, [1, 2, 5], "x")
    w = h.graph.addVariable(poplar.FLOAT, [1, 3, 2, 2], "w")
    with pytest.raises(poplar.graph_connection_error, match="input"):
        poplin.convolution(h.graph, x, w, poplin.ConvParams(poplar.FLOAT, 2, [5], [2], 2, 3, 1), False, h.prog)
    with pytest.raises(poplar.invalid_option, match="partialsType"):
        poplin.convolution(h.graph, x, w, poplin.ConvParams(poplar.FLOAT, 1, [5], [2], 2, 3, 1), False, h.prog,
                           options={"partialsType": "double"})


#: ResNet-50-like layer shapes (batch 16), fp16.
RESNET = [(16, [56, 56], [1, 1], 64, 256, 1), (16, [56, 56], [3, 3], 64, 64, 1), (16, [28, 28], [3, 3], 128, 128, 1),
          (16, [14, 14], [1, 1], 1024, 256, 1), (16, [7, 7], [3, 3], 512, 512, 1), (16, [224, 224], [7, 7], 3, 64, 1)]


def _resnet_params(i):
    N, fld, ker, Ci, Co, G = RESNET[i]
    pad = [k // 2 for k in ker]
    return poplin.ConvParams(poplar.HALF, N, fld, ker, Ci, Co, G, inputTransform=IT(paddingLower=pad, paddingUpper=pad),
                             outputTransform=OT(stride=[2, 2] if ker == [7, 7] else [1, 1]))


@pytest.mark.parametrize("i", range(len(RESNET)))
def test_conv_plan_within_budget_and_monotone(i):
    """For each proportion, the chosen plan fits its budget; a lower proportion never gives a plan
    with more temporary memory (nor fewer cycles)."""
    target = poplar.IPUModel("ipu2").createDevice().getTarget()
    p = _resnet_params(i)
    prev = None
    for amp in (0.6, 0.3, 0.1, 0.05):
        plan = poplin.plan_convolution(p, target, {"availableMemoryProportion": amp}, poplin.PlanningCache())
        if plan.temp_bytes > plan.budget_bytes:     # no plan fits: the least-memory plan
            break
        assert plan.temp_bytes <= amp * target.getBytesPerTile()
        assert plan.tiles <= target.getNumTiles()
        if prev is not None:
            assert plan.temp_bytes <= prev.temp_bytes and plan.cycles >= prev.cycles
        prev = plan


def test_conv_plan_faster_on_more_tiles():
    p = _resnet_params(1)
    few = poplar.IPUModel("ipu2")
    few.tilesPerIPU = 64
    many = poplar.IPUModel("ipu2").createDevice().getTarget()
    c_few = poplin.plan_convolution(p, few.createDevice().getTarget(), {"availableMemoryProportion": 1.0}).cycles
    c_many = poplin.plan_convolution(p, many).cycles
    assert c_many * 10 < c_few


def test_conv_no_plan_fits_takes_least_memory_plan_and_graph_does_not_fit():
    """No plan within the budget: the convolution is still built (least-memory plan, as PopLibs),
    compiling without allowOutOfMemory raises graph_memory_allocation_error, and with it the
    graph compiles and a small convolution beside it still runs."""
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = 4
    m.memoryBytesPerTile = 16 * 1024
    dev = m.createDevice()
    g = poplar.Graph(dev.getTarget())
    p = poplin.ConvParams(poplar.FLOAT, 8, [32, 32], [3, 3], 64, 64, 1)
    x = g.addVariable(poplar.FLOAT, p.getInputShape(), "x")
    w = g.addVariable(poplar.FLOAT, p.getWeightsShape(), "w")
    g.setTileMapping(x, 2)
    g.setTileMapping(w, 3)
    prog = poplar.program.Sequence()
    with poplin.plan.record_over_budget() as over:
        poplin.convolution(g, x, w, p, False, prog, "big")
    assert over and over[0].budget_bytes == 9830 < over[0].temp_bytes
    assert "[32, 32]" in over[0].op
    with pytest.raises(poplar.graph_memory_allocation_error):
        poplar.Engine(g, prog)
    small = poplin.ConvParams(poplar.FLOAT, 1, [4], [1], 2, 2, 1)
    xs = g.addVariable(poplar.FLOAT, small.getInputShape(), "xs")
    ws = g.addVariable(poplar.FLOAT, small.getWeightsShape(), "ws")
    g.setTileMapping(xs, 0)
    g.setTileMapping(ws, 1)
    g.setInitialValue(xs, np.ones(8))
    g.setInitialValue(ws, np.ones(4))
    ys = poplin.convolution(g, xs, ws, small, False, prog, "small")
    g.createHostRead("ys", ys)
    eng = poplar.Engine(g, prog, {"debug.allowOutOfMemory": "true"})
    eng.load(dev)
    eng.run(0)
    np.testing.assert_array_equal(np.asarray(eng.readTensor("ys")), np.full((1, 2, 4), 2.0))


def test_report_plan_info():
    g = poplar.Graph(poplar.IPUModel().createDevice().getTarget())
    buf = io.StringIO()
    poplin.reportPlanInfo(buf, g, _resnet_params(2))
    assert "parallel splits" in buf.getvalue() and "temporary memory" in buf.getvalue()


def test_conv_serial_and_input_channel_splits():
    """Small budgets force serial steps; a wide input forces an input-channel split with a
    reduction; results stay exact."""
    p = poplin.ConvParams(poplar.FLOAT, 6, [10, 10], [3, 3], 40, 24, 1,
                          inputTransform=IT(paddingLower=[1, 1], paddingUpper=[1, 1]))
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = 8
    t = m.createDevice().getTarget()
    plan = poplin.plan_convolution(p, t, {"availableMemoryProportion": 0.03})
    assert plan.out_chan_serial > 1 and plan.in_chan_split > 1
    rng = np.random.default_rng(0)
    X = rng.standard_normal(p.getInputShape()).astype(np.float32)
    W = rng.standard_normal(p.getWeightsShape()).astype(np.float32)
    out, h = run_conv(p, X, W, tiles=8, options={"availableMemoryProportion": 0.03})
    np.testing.assert_allclose(out, ref_conv(X, W, p), atol=1e-4)
    q = poplin.ConvParams(poplar.HALF, 1, [4], [1], 2048, 16, 1)
    plan_q = poplin.plan_convolution(q, poplar.IPUModel("ipu2").createDevice().getTarget())
    assert plan_q.in_chan_split > 1
    Xq = rng.standard_normal(q.getInputShape()).astype(np.float16)
    Wq = rng.standard_normal(q.getWeightsShape()).astype(np.float16)
    out_q, hq = run_conv(q, Xq, Wq, tiles=1472)
    np.testing.assert_allclose(out_q.astype(np.float64), ref_conv(Xq, Wq, q), atol=0.05)
    assert any(cs.name.endswith("/Reduce") for cs in hq.graph.getComputeSets())


@pytest.mark.parametrize("tiles,N,Ci,Co,budget,serial", [
    (8, 8, 16, 32, 0.006, 32),           # out-channel serial split with an input-channel split (reduce)
    (4, 8, 8, 16, 0.008, 4),             # out-channel serial split, weights shared by 4 batch tiles
])
def test_serial_splits_are_one_loop_body(tiles, N, Ci, Co, budget, serial):
    """Serial splits run as a counted loop over one compute-set group (PopLibs'
    ConvProgramTree): however many steps, the conv has one partial-sum compute set, and the
    tensors the plan creates hold every serial slice on the tiles the slice problem uses, so the
    loop's dynamic slices and updates exchange only the loop index. Results are exact."""
    p = poplin.ConvParams(poplar.FLOAT, N, [6, 6], [3, 3], Ci, Co, 1,
                          inputTransform=IT(paddingLower=[1, 1], paddingUpper=[1, 1]))
    h = OpHarness(tiles=tiles)
    opts = {"availableMemoryProportion": budget}
    plan = poplin.plan_convolution(p, h.device.getTarget(), opts)
    assert plan.out_chan_serial == serial
    rng = np.random.default_rng(1)
    X = rng.standard_normal(p.getInputShape()).astype(np.float32)
    W = rng.standard_normal(p.getWeightsShape()).astype(np.float32)
    x = poplin.createInput(h.graph, p, "x", opts)
    w = poplin.createWeights(h.graph, p, "w", opts)
    h.graph.setInitialValue(x, X)
    h.graph.setInitialValue(w, W)
    y = poplin.convolution(h.graph, x, w, p, False, h.prog, "y", opts)
    np.testing.assert_allclose(h.run(out=y)["out"], ref_conv(X, W, p), atol=1e-4)
    names = [cs.name for cs in h.graph.getComputeSets()]
    assert sum(n.endswith("/Conv") for n in names) == 1
    assert sum(n.endswith("serialLoop/increment") for n in names) == 1
    # the loop's copies exchange only the loop index (as a slice of a sliceable tensor does)
    ref = OpHarness(tiles=tiles)
    t = popops.createSliceableTensor(ref.graph, poplar.FLOAT, [4, 64 * tiles], [0], [1], 0, "t")
    ref.graph.setInitialValue(t, np.zeros([4, 64 * tiles], np.float32))
    i = ref.graph.addConstant(poplar.UNSIGNED_INT, [1], 1, "i")
    ref.graph.setTileMapping(i, 0)
    popops.dynamicSlice(ref.graph, t, i, [0], [1], ref.prog, "s")
    ref.run()
    index_only = [float(s.cost.duration["exchange"].sum()) for s in ref.engine._exe.compiled.compiler.steps
                  if s.name == "s"]
    copies = [float(s.cost.duration["exchange"].sum()) for s in h.engine._exe.compiled.compiler.steps
              if s.name.endswith(("serialSlice", "serialUpdate"))]
    assert index_only[0] > 0 and copies and max(copies) <= index_only[0]


@pytest.mark.parametrize("stride,dil", [(1, 1), (2, 1), (1, 2)])
def test_field_split_with_halos(stride, dil):
    """A plan that splits the field over tiles: each tile reads its rows plus the halo the
    kernel needs (exchanged from the neighbouring blocks); the result is exact."""
    p = poplin.ConvParams(poplar.FLOAT, 1, [40, 6], [3, 3], 2, 3, 1,
                          inputTransform=IT(paddingLower=[1, 1], paddingUpper=[1, 1], dilation=[dil, 1]),
                          outputTransform=OT(stride=[stride, 1]))
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = 16
    plan = poplin.plan_convolution(p, m.createDevice().getTarget())
    assert plan.field_split > 1
    rng = np.random.default_rng(0)
    X = rng.standard_normal(p.getInputShape()).astype(np.float32)
    W = rng.standard_normal(p.getWeightsShape()).astype(np.float32)
    out, _ = run_conv(p, X, W, tiles=16)
    np.testing.assert_allclose(out, ref_conv(X, W, p), atol=1e-4)


# ---------------------------------------------------------------------------------------------
EXPAND_CASES = GRAD_CASES + [
    (2, [8, 8], [1, 1], 16, 8, 1, [0, 0], [0, 0], [1, 1], [1, 1]),
    (2, [15, 15], [7, 7], 3, 8, 1, [3, 3], [3, 3], [2, 2], [1, 1]),
    (2, [7, 6], [1, 3], 5, 6, 2, [0, 1], [0, 1], [2, 1], [1, 1]),
]


@pytest.mark.parametrize("force", ["copy", "view", "none"])
@pytest.mark.parametrize("case", range(len(EXPAND_CASES)))
def test_weight_deltas_with_expand_dims_match_torch(case, force, monkeypatch):
    """calculateWeightDeltas gives autograd's weight gradient whichever expandDims candidate the
    planner takes (forced here: the copy of the expanded input, the view, or none)."""
    from openipu.poplibs.poplin import transforms
    if force == "copy":
        monkeypatch.setattr(transforms, "expand_copy_cycles", lambda *a: -1e15)
    elif force == "none":
        monkeypatch.setattr(transforms, "view_expandable_dims", lambda p: [])
        monkeypatch.setattr(transforms, "copy_expandable_dims", lambda p: [])
    else:
        monkeypatch.setattr(transforms, "copy_expandable_dims", lambda p: [])
    N, fld, ker, Ci, Co, G, pl, pu, stride, kdil = EXPAND_CASES[case]
    nd = len(fld)
    p = poplin.ConvParams(poplar.FLOAT, N, fld, ker, Ci, Co, G, inputTransform=IT(paddingLower=pl, paddingUpper=pu),
                          kernelTransform=IT(dilation=kdil), outputTransform=OT(stride=stride))
    rng = np.random.default_rng(case)
    X = rng.standard_normal([N, G * Ci, *fld]).astype(np.float32)
    W = rng.standard_normal([G, Co, Ci, *ker]).astype(np.float32)
    xt, wt = torch.tensor(X, requires_grad=True), torch.tensor(W)
    padding = []
    for d in reversed(range(nd)):
        padding += [pl[d], pu[d]]
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d}[nd]
    wt.requires_grad_(True)
    yt = conv(torch.nn.functional.pad(xt, padding), wt.reshape(G * Co, Ci, *ker), stride=stride, dilation=kdil, groups=G)
    D = rng.standard_normal(yt.shape).astype(np.float32)
    yt.backward(torch.tensor(D))
    h = OpHarness(tiles=16)
    d, x = h.input("d", D), h.input("x", X)
    gw = poplin.calculateWeightDeltas(h.graph, d, x, p, h.prog, "gw")
    np.testing.assert_allclose(h.run(gw=gw)["gw"], wt.grad.numpy(), atol=1e-4)


def test_weight_update_plan_splits_the_batch_and_field_reduction():
    """The weight update of a strided 1x1 convolution (ResNet-50's res3 projection, batch 4, on a
    C600 IPU) is planned with expandDims: the N x H x W reduction split over tiles, with far fewer
    cycles and far less temporary memory per tile than with whole output-gradient rows per tile."""
    from openipu.poplibs.poplin import plan as PL
    from openipu.poplibs.poplin import transforms
    from openipu.poplibs.poplin.params import weight_update_params
    t = poplar.Target.createIPUTarget(1, "ipu21")
    p = poplin.ConvParams(poplar.HALF, 4, [56, 56], [1, 1], 256, 512, 1, outputTransform=OT(stride=[2, 2]))
    wu = weight_update_params(p)
    assert transforms.view_expandable_dims(wu) == [0, 1]
    e = transforms.expand_dims_params(wu, [0, 1])
    assert (e.inputChannelsPerConvGroup, e.inputFieldShape, e.kernelShape) == (4 * 28 * 28, [1, 1], [1, 1])
    a, b = PL.plan_convolution(wu, t, cache=PL.PlanningCache()), PL.plan_convolution(e, t, cache=PL.PlanningCache())
    assert b.in_chan_split > 1
    assert b.cycles * 4 < a.cycles and b.temp_bytes * 4 < a.temp_bytes


# a kernel transform with every part (truncation, dilation, padding, flip), as weight-update and
# input-gradient passes produce them, and a kernel dimension truncated away (all-zero output)
HOST_CASES = CASES + [
    (2, [9, 7], [4, 3], 3, 4, 1, IT(paddingLower=[2, 1], paddingUpper=[1, 1]),
     IT(truncationLower=[1, 0], truncationUpper=[0, 1], dilation=[2, 2], paddingLower=[1, 0], paddingUpper=[0, 2],
        flip=[True, False]), OT(stride=[1, 2])),
    (1, [6], [2], 2, 3, 1, None, IT(truncationLower=[2], paddingLower=[1]), None),
    (2, [6, 5], [3, 2], 60, 8, 1, IT(paddingLower=[1, 1], paddingUpper=[1, 1]),      # input channels split
     IT(dilation=[2, 1], paddingUpper=[1, 0], flip=[True, False]), None),
]


@pytest.mark.parametrize("form", ["direct", "im2col"])
@pytest.mark.parametrize("case", range(len(HOST_CASES)))
def test_host_kernel_formulations_match_reference(case, form, monkeypatch):
    """Both host formulations of the partial sums (a grouped direct convolution, a batched
    matmul of the input's windows) give the reference's results, with the kernel transform
    applied without materialising it, and with the input channels split over several blocks."""
    from openipu.poplibs.poplin import kernels
    other = kernels._im2col_conv if form == "im2col" else kernels._grouped_conv
    monkeypatch.setattr(kernels, "_grouped_conv", other)
    monkeypatch.setattr(kernels, "_im2col_conv", other)
    N, fld, ker, Ci, Co, G, it, kt, ot = HOST_CASES[case]
    p = poplin.ConvParams(poplar.FLOAT, N, fld, ker, Ci, Co, G, inputTransform=it, kernelTransform=kt,
                          outputTransform=ot)
    rng = np.random.default_rng(case)
    X = rng.standard_normal([N, G * Ci, *fld]).astype(np.float32)
    W = rng.standard_normal([G, Co, Ci, *ker]).astype(np.float32)
    out, _ = run_conv(p, X, W)
    np.testing.assert_allclose(out.astype(np.float64), ref_conv(X, W, p), atol=1e-4, rtol=0)


FWD_EXPAND_CASES = [
    # (batch, field, kernel, Ci, Co, padding lower, padding upper, stride): a stem-like 7x7 stride 2,
    # a 3x3 with asymmetric padding, a 3x1 and a 1-D kernel
    (2, [15, 13], [7, 7], 3, 8, [3, 3], [3, 2], [2, 2]),
    (1, [9, 8], [3, 3], 4, 5, [1, 0], [1, 2], [1, 2]),
    (2, [10, 6], [3, 1], 3, 4, [1, 0], [1, 0], [1, 1]),
]


@pytest.mark.parametrize("dims", [(0,), (1,), (0, 1)])
@pytest.mark.parametrize("case", range(len(FWD_EXPAND_CASES)))
def test_forward_expand_dims_subsets_match_reference(case, dims, monkeypatch):
    """The forward convolution is exact whichever subset of its field dimensions the planner folds
    into the input channels with a copy (PopLibs tries the power set: getExpandDimsCandidates);
    each subset is forced here. A subset containing a 1-wide kernel dimension is no candidate,
    and the plan without the transform is built."""
    from openipu.poplibs.poplin import transforms
    monkeypatch.setattr(transforms, "dim_subsets",
                        lambda ds: [dims] if set(dims) <= set(ds) else [])
    monkeypatch.setattr(transforms, "expand_copy_cycles", lambda *a: -1e15)
    N, fld, ker, Ci, Co, pl, pu, stride = FWD_EXPAND_CASES[case]
    p = poplin.ConvParams(poplar.FLOAT, N, fld, ker, Ci, Co, 1, inputTransform=IT(paddingLower=pl, paddingUpper=pu),
                          outputTransform=OT(stride=stride))
    rng = np.random.default_rng(case)
    X = rng.standard_normal(p.getInputShape()).astype(np.float32)
    W = rng.standard_normal(p.getWeightsShape()).astype(np.float32)
    out, _ = run_conv(p, X, W, tiles=16)
    np.testing.assert_allclose(out, ref_conv(X, W, p), atol=1e-4)


def test_expand_dims_candidates_are_the_power_set():
    """A 7x7 stem offers expandDims on {0}, {1} and {0, 1}; a 1-wide kernel dimension none."""
    from openipu.poplibs.poplin import transforms
    stem = poplin.ConvParams(poplar.HALF, 1, [224, 224], [7, 7], 3, 64, 1,
                             inputTransform=IT(paddingLower=[3, 3], paddingUpper=[3, 3]), outputTransform=OT(stride=[2, 2]))
    assert transforms.copy_expandable_dims(stem) == [0, 1]
    assert transforms.dim_subsets([0, 1]) == [(0,), (1,), (0, 1)]
    e = transforms.expand_dims_params(stem, (0,))
    assert e.inputChannelsPerConvGroup == 21 and list(e.kernelShape) == [1, 7]
    assert list(e.getOutputFieldShape()) == [112, 112]
    col = poplin.ConvParams(poplar.HALF, 1, [10, 6], [3, 1], 3, 4, 1)
    assert transforms.copy_expandable_dims(col) == [0]
