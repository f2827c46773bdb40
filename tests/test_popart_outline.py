"""Outlining (PopART's SubgraphOutline): repeated layers are lowered once, as a Poplar function
called per layer, with the same outputs as the layers lowered one by one and their code once."""

from __future__ import annotations

import numpy as np

import popart
from openipu.poplar import program as P
from openipu.popart import outline


def _layers(n_layers=6, width=64, batch=8, seed=0):
    """``n_layers`` identical blocks (MatMul, Add bias, Relu, residual Add) with their own weights."""
    rng = np.random.default_rng(seed)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [batch, width]), "x")
    h = x
    for i in range(n_layers):
        w = b.addInitializedInputTensor((rng.standard_normal((width, width)) / 8).astype(np.float32), f"w{i}")
        c = b.addInitializedInputTensor(rng.standard_normal(width).astype(np.float32), f"b{i}")
        y = b.aiOnnx.relu([b.aiOnnx.add([b.aiOnnx.matmul([h, w]), c])])
        h = b.aiOnnx.add([y, h])
    b.addOutputTensor(h)
    return b.getModelProto(), x, h


def _run(proto, x, out, enable, tiles=32):
    opts = popart.SessionOptions()
    opts.enableOutlining = enable
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": tiles})
    s = popart.InferenceSession(fnModel=proto, dataFlow=popart.DataFlow(1, {out: popart.AnchorReturnType("ALL")}),
                                deviceInfo=dev, userOptions=opts)
    s.prepareDevice()
    anchors = s.initAnchorArrays()
    xv = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    s.run(popart.PyStepIO({x: xv}, anchors))
    return s, anchors[out]


def _calls(prog):
    found = []
    stack = [prog]
    while stack:
        p = stack.pop()
        if isinstance(p, P.Call):
            found.append(p)
        stack.extend(getattr(p, "programs", []) or [])
        for attr in ("body",):
            if hasattr(p, attr):
                stack.append(getattr(p, attr))
    return found


def test_repeated_layers_are_called_as_one_subgraph_with_the_same_outputs():
    proto, x, out = _layers()
    s_on, y_on = _run(proto, x, out, True)
    s_off, y_off = _run(proto, x, out, False)
    np.testing.assert_array_equal(y_on, y_off)

    plan = outline.plan(s_on._ir, s_on._ir.options)
    assert len(plan.subgraphs) == 1
    sg = plan.subgraphs[0]
    assert sg.length == 4 and len(sg.starts) == 6           # one layer, six calls
    assert len(_calls(s_on._lowered.programs[0])) == 6
    assert not _calls(s_off._lowered.programs[0])
    # the layer's code and vertex state are on the tiles once, not six times
    m_on, m_off = s_on._engine.memory.categories, s_off._engine.memory.categories
    assert m_on["Vertex Instances"].sum() < m_off["Vertex Instances"].sum() / 3
    assert m_on["Internal Exchange Code"].sum() < m_off["Internal Exchange Code"].sum()
    # every op still reports its lowering
    assert all(op.lowering for op in s_on._ir.ops)


def test_layers_wired_differently_are_not_outlined_together():
    # the second block reads the model input instead of the previous block: not the same wiring
    rng = np.random.default_rng(0)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 16]), "x")
    h = x
    for i in range(2):
        w = b.addInitializedInputTensor(rng.standard_normal((16, 16)).astype(np.float32), f"w{i}")
        src = h if i == 0 else x
        h = b.aiOnnx.add([b.aiOnnx.matmul([src, w]), h])
    b.addOutputTensor(h)
    opts = popart.SessionOptions()
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": 16})
    s = popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {h: popart.AnchorReturnType("ALL")}),
                                deviceInfo=dev, userOptions=opts)
    plan = outline.plan(s._ir, opts)
    for sg in plan.subgraphs:
        assert sg.length == 1        # only single matmuls can be shared; the two-op blocks differ


def test_outline_threshold_keeps_cheap_sequences_inline():
    proto, x, out = _layers(n_layers=3)
    s, _ = _run(proto, x, out, True)
    opts = popart.SessionOptions()
    opts.outlineThreshold = 5000.0           # above one layer's value (a matmul is 1000)
    assert not outline.plan(s._ir, opts).subgraphs
