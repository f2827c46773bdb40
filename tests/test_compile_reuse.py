"""Compile-time reuse (issue 34): work skipped or shared gives what the full work gives.

- ``runner.run_model`` hands a proto it made itself to the session without serialising it
  (``popart.builder.OwnedModelProto``); a caller's proto is left as it was.
- poplin's block order of a blocked constant is memoised on its grid and block order.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper

import popart
from openipu import runner
from openipu.popart.builder import OwnedModelProto
from openipu.poplar import regions as R
from openipu.poplar import structure_cache as SC
from openipu.poplibs.poplin import layout


def _mlp(path, layers=2, width=160):
    """An MLP whose weights (width**2 fp32 values, 100 KiB) are above the IR's WEIGHT_BYTES."""
    nodes, inits, x = [], [], "x"
    rng = np.random.default_rng(0)
    for i in range(layers):
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, [width, width],
                                        rng.standard_normal(width * width).astype(np.float32).tobytes(), raw=True))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16, width])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, 16, width])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def _figures(r):
    return r.step_cycles, r.tile_bytes_max, r.tile_bytes_mean, r.memory_by_category


def test_run_model_leaves_a_callers_proto_and_predicts_as_from_the_file(tmp_path):
    path = str(tmp_path / "mlp.onnx")
    _mlp(path)
    proto = onnx.load(path)
    before = proto.SerializeToString()
    from_proto = runner.run_model(proto, offline=True)
    assert proto.SerializeToString() == before          # not handed over: the caller keeps it
    from_file = runner.run_model(path, offline=True)    # loaded by run_model: handed over
    assert _figures(from_proto) == _figures(from_file)


def test_owned_proto_gives_its_weights_to_the_session(tmp_path):
    path = str(tmp_path / "mlp.onnx")
    _mlp(path)
    ref = onnx.load(path)
    owned = onnx.load(path)
    df = popart.DataFlow(1, {"r1": popart.AnchorReturnType("ALL")})
    dev = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8})
    s = popart.InferenceSession(fnModel=OwnedModelProto(owned), dataFlow=df, deviceInfo=dev)
    assert all(not i.raw_data for i in owned.graph.initializer)     # the weights live once, in the IR
    x = np.random.default_rng(1).standard_normal([4, 16, 160]).astype(np.float32)
    s.prepareDevice()
    anchors = s.initAnchorArrays()
    s.run(popart.PyStepIO({"x": x}, anchors))
    w = [onnx.numpy_helper.to_array(i) for i in ref.graph.initializer]
    want = np.maximum(np.maximum(x @ w[0], 0) @ w[1], 0)
    np.testing.assert_allclose(anchors["r1"], want, rtol=1e-4, atol=1e-4)


def test_block_order_memo_tells_grids_apart():
    """Two grids of one size and block count but other edges (or another block order) get their
    own orders; a repeated grid is a hit with the computed order."""
    SC.MEMO.clear()
    a = [np.array([0, 2, 6]), np.array([0, 3, 4])]
    b = [np.array([0, 4, 6]), np.array([0, 1, 4])]
    got = {}
    for name, edges in (("a", a), ("b", b)):
        lo, sz = R.grid_cells(edges)
        got[name] = np.array(layout._block_order(edges, lo, sz))
        np.testing.assert_array_equal(got[name], layout._compute_block_order(edges, lo, sz))
        rev = np.arange(lo.shape[0])[::-1]
        np.testing.assert_array_equal(layout._block_order(edges, lo[rev], sz[rev]),
                                      layout._compute_block_order(edges, lo[rev], sz[rev]))
    assert not np.array_equal(got["a"], got["b"])
    hits = SC.MEMO.hits
    lo, sz = R.grid_cells(a)
    np.testing.assert_array_equal(layout._block_order(a, lo, sz), got["a"])
    assert SC.MEMO.hits == hits + 1


def test_sets_unique_matches_numpy():
    """The sort-based unique gives np.unique's values and dtype: ints of any range, sorted runs
    (the tile-map bounds case), bools, 2-D input, empty and single arrays; floats fall back."""
    from openipu.poplar import sets

    rng = np.random.default_rng(2)
    cases = [rng.integers(-50, 50, 1000), rng.integers(0, 1 << 40, 5000),
             np.concatenate([np.sort(rng.integers(0, 10**6, 3000)) for _ in range(3)]),
             rng.integers(0, 2, 100).astype(bool), rng.integers(0, 9, (7, 11)).astype(np.int32),
             np.zeros(0, np.int64), np.array([5], np.uint16), np.array([1.5, np.nan, 1.5, np.nan])]
    for a in cases:
        got, want = sets.unique(a), np.unique(a)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_sets_intersects_matches_intersect1d():
    from openipu.poplar import sets

    rng = np.random.default_rng(3)
    for _ in range(200):
        a = rng.integers(0, 30, rng.integers(0, 6))
        b = rng.integers(0, 30, rng.integers(0, 6))
        assert sets.intersects(a, b) == bool(np.intersect1d(a, b).size)


def _ipu_graph(tiles=8):
    from openipu import poplar
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = tiles
    return poplar.Graph(m.createDevice().getTarget())


def _block_by_block(value, lo, sz):
    import math
    ref, a = np.empty(value.size, value.dtype), 0
    for c_lo, c_sz in zip(lo.tolist(), sz.tolist()):
        n = math.prod(c_sz)
        ref[a:a + n] = value[tuple(slice(x, x + y) for x, y in zip(c_lo, c_sz))].reshape(-1)
        a += n
    return ref


def test_blocked_constant_is_placed_when_first_read():
    """A blocked constant's values are placed in storage order only when read (device storage,
    saving), and then equal a block-by-block placement, rounded as addConstant rounds; a value
    wider than the storage (float32 into HALF) is placed at once rather than kept."""
    from openipu import poplar
    from openipu.poplar import graph_codec
    from openipu.poplar.deferred import DeferredValue

    rng = np.random.default_rng(3)
    for ptype, dt, vdt in ((poplar.FLOAT, np.float32, np.float32), (poplar.HALF, np.float16, np.float16),
                           (poplar.FLOAT, np.float32, np.float16), (poplar.HALF, np.float16, np.float32)):
        for _ in range(20):
            shape = rng.integers(1, 9, rng.integers(1, 4))
            edges = [np.r_[0:n:rng.integers(1, n + 1), n] for n in shape]
            value = rng.standard_normal(shape).astype(vdt)
            g = _ipu_graph()
            t = layout.blocked_tensor(g, ptype, edges, "w", value=value)
            var = g._state.variables[int(t.pieces.var[0])]
            deferred = np.dtype(vdt).itemsize <= np.dtype(dt).itemsize
            assert isinstance(var.init, DeferredValue) == deferred
            assert not deferred or not var.init.resolved
            lo, sz = R.grid_cells(edges)
            want = _block_by_block(value, lo, sz).astype(dt)
            doc, arrays = graph_codec.encode(g)           # saving reads it
            assert not deferred or var.init.resolved
            np.testing.assert_array_equal(var.initial().numpy(), want)
            again = graph_codec.decode(doc, arrays.__getitem__, "test")
            np.testing.assert_array_equal(again._state.variables[var.id].initial().numpy(), want)


def test_deferred_constant_checks_its_element_count():
    from openipu import poplar

    g = _ipu_graph()
    t = g.add_deferred_constant(poplar.FLOAT, [2, 3], lambda: np.arange(5.0), "c")
    var = g._state.variables[int(t.pieces.var[0])]
    try:
        var.initial()
    except ValueError as e:
        assert "5 elements, expected 6" in str(e)
    else:
        raise AssertionError("a deferred value of the wrong size was accepted")
    u = g.add_deferred_constant(poplar.HALF, [2, 3], lambda: np.arange(6.0).reshape(3, 2).T, "d")
    np.testing.assert_array_equal(g._state.variables[int(u.pieces.var[0])].initial().numpy(),
                                  np.arange(6.0).reshape(3, 2).T.reshape(-1).astype(np.float16))


def test_offline_compile_leaves_weights_unplaced_and_a_run_places_them(tmp_path, monkeypatch):
    """An offline compile never places the matmul weights' values; the device emulation, which
    reads them, gives the model's outputs."""
    from openipu.poplar.deferred import DeferredValue

    path = str(tmp_path / "mlp.onnx")
    _mlp(path)
    df = popart.DataFlow(1, {"r1": popart.AnchorReturnType("ALL")})
    off = popart.DeviceManager().createOfflineIPUDevice({"numIPUs": 1, "ipuVersion": "ipu2"})
    s = popart.InferenceSession(fnModel=path, dataFlow=df, deviceInfo=off)
    s.prepareDevice()
    g = s._engine.graph
    w = [v for v in g._state.variables if v.constant and v.numel == 160 * 160]
    assert len(w) == 2 and all(isinstance(v.init, DeferredValue) and not v.init.resolved for v in w)
    monkeypatch.setenv("OPENIPU_EXECUTION", "device")
    dev = popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 8})
    s = popart.InferenceSession(fnModel=path, dataFlow=df, deviceInfo=dev)
    s.prepareDevice()
    anchors = s.initAnchorArrays()
    x = np.random.default_rng(1).standard_normal([4, 16, 160]).astype(np.float32)
    s.run(popart.PyStepIO({"x": x}, anchors))
    w = [onnx.numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer]
    np.testing.assert_allclose(anchors["r1"], np.maximum(np.maximum(x @ w[0], 0) @ w[1], 0), rtol=1e-4, atol=1e-4)


def test_weights_read_from_raw_bytes_taken_once_equal_to_array():
    """The IR reads a large initializer's raw bytes once; the array equals onnx's to_array for
    every plain numeric type (and falls back to it for the others)."""
    from openipu.popart import ir_weights as irmod

    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
               np.int64, np.uint64, np.bool_):
        a = (rng.standard_normal((3, 5)) * 50).astype(dt)
        tp = onnx.numpy_helper.from_array(a, "w")
        got = irmod.initializer_array(tp, tp.raw_data)
        want = onnx.numpy_helper.to_array(tp)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    bad = TensorProto(name="b", data_type=TensorProto.FLOAT, dims=[2, 3], raw_data=bytes(20))
    try:
        irmod.initializer_array(bad, bad.raw_data)
    except Exception as e:  # noqa: BLE001
        assert "Initializer 'b'" in str(e)
    else:
        raise AssertionError("a raw initializer of the wrong size was read")


def test_tile_runs_of_small_views_match_the_box_path(monkeypatch):
    """Tile runs of a small view looked up element by element equal those from its tile boxes,
    on random mappings (some elements unmapped) and random views (slices, transposes, reversals,
    sub-samples, concatenations, broadcasts)."""
    from openipu import poplar
    from openipu.poplar import graph_mapping

    rng = np.random.default_rng(7)
    for _ in range(150):
        g = _ipu_graph(16)
        vs = []
        for k in range(int(rng.integers(1, 4))):
            shape = [int(x) for x in rng.integers(1, 7, 3)]
            v = g.addVariable(poplar.FLOAT, shape, f"v{k}")
            n = int(np.prod(shape))
            cuts = np.unique(np.r_[0, rng.integers(0, n, int(rng.integers(0, 6))), n])
            flat = v.flatten()
            for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
                if rng.random() < 0.85:
                    g.setTileMapping(flat.slice(a, b, 0), int(rng.integers(0, 16)))
            vs.append(v)
        t = vs[int(rng.integers(0, len(vs)))]
        for _step in range(int(rng.integers(1, 4))):
            c = rng.random()
            if c < 0.25:
                t = t.dimShuffle([int(i) for i in rng.permutation(t.rank())])
            elif c < 0.45:
                d = int(rng.integers(0, t.rank()))
                if t.dim(d) > 1:
                    a = int(rng.integers(0, t.dim(d) - 1))
                    t = t.slice(a, int(rng.integers(a + 1, t.dim(d) + 1)), d)
            elif c < 0.6:
                t = t.reverse(int(rng.integers(0, t.rank())))
            elif c < 0.75:
                d = int(rng.integers(0, t.rank()))
                t = t.subSample(int(rng.integers(1, 3)), d)
            elif c < 0.9:
                o = vs[int(rng.integers(0, len(vs)))]
                if o.rank() == t.rank() and o.shape()[1:] == t.shape()[1:]:
                    t = poplar.concat([t, o], 0)
            else:
                t = t.expand([0]).broadcast(2, 0)
        fast = g.tile_runs_of(t)
        monkeypatch.setattr(graph_mapping, "SMALL_VIEW_ELEMENTS", -1)
        ref = g.tile_runs_of(t)
        monkeypatch.setattr(graph_mapping, "SMALL_VIEW_ELEMENTS", 2048)
        for a, b in zip(fast, ref):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype


def test_operand_boxes_memo_returns_the_computed_layout(monkeypatch):
    """poplin's input / weight / output boxes are memoised on (problem, plan, layout): a hit
    equals the computation, is read-only, and another plan is computed afresh."""
    from openipu import poplar
    from openipu.poplibs.poplin import plan as planmod
    from openipu.poplibs.poplin.params import ConvParams

    target = _ipu_graph(64).getTarget()
    for m, k, n in ((32, 96, 64), (8, 384, 1536), (40, 768, 768)):
        p = planmod.plan_matmul(1, m, k, n, poplar.FLOAT, target)
        params = ConvParams(poplar.FLOAT, poplar.FLOAT, m, [1], [1], k, n, 1)
        lay = layout.Layout.of(params, p)
        for fn in (layout.input_boxes, layout.weight_boxes, layout.output_boxes):
            with monkeypatch.context() as mp:
                mp.setenv("OPENIPU_STRUCTURE_CACHE", "0")
                ref = fn(params, p, lay)
            first, again = fn(params, p, lay), fn(params, p, lay)
            for a, b, c in zip(ref, first, again):
                np.testing.assert_array_equal(a, b)
                assert c is b and not b.flags.writeable
