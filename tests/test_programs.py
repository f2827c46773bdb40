"""Programs, codelets, streams, replication and the predicted clock."""

import io
import json

import numpy as np
import pytest

import codelets_for_tests as C
from openipu import poplar
from openipu.poplar import program as P


def _graph(version="ipu2", **model_fields):
    m = poplar.IPUModel(version)
    for k, v in model_fields.items():
        setattr(m, k, v)
    dev = m.createDevice()
    g = poplar.Graph(dev.getTarget())
    g.addCodelets(C)
    return dev, g


def _counter(g, name="n", tile=0):
    n = g.addVariable(poplar.INT, [], name)
    g.setTileMapping(n, tile)
    g.createHostRead(name, n)
    g.createHostWrite(name + "-w", n)
    return n


def _incr_program(g, n):
    cs = g.addComputeSet("incr")
    v = g.addVertex(cs, "Incr", {"x": n}, tile=0)
    g.setPerfEstimate(v, 10)
    return P.Execute(cs)


def test_repeat_if_switch_while_call():
    dev, g = _graph(tilesPerIPU=4)
    n = _counter(g)
    inc = _incr_program(g, n)
    zero = g.addConstant(poplar.INT, [], 0); g.setTileMapping(zero, 0)
    limit = g.addConstant(poplar.INT, [], 7); g.setTileMapping(limit, 0)
    pred = g.addVariable(poplar.BOOL, [], "pred"); g.setTileMapping(pred, 1)
    g.createHostWrite("pred", pred)
    f = g.addFunction(P.Repeat(2, inc))
    progs = [
        P.Sequence(P.Copy(zero, n), P.Repeat(5, inc)),                       # 5
        P.Sequence(P.Copy(zero, n), P.If(pred, P.Call(f), inc)),             # 2 if pred else 1
        P.Sequence(P.Copy(zero, n), P.Switch(n, [(0, P.Repeat(3, inc)), (1, inc)], P.Sequence())),  # 3
    ]
    e = poplar.Engine(g, progs)
    e.load(dev)
    e.run(0); assert e.readTensor("n") == 5
    e.writeTensor("pred", np.array(True)); e.run(1); assert e.readTensor("n") == 2
    e.writeTensor("pred", np.array(False)); e.run(1); assert e.readTensor("n") == 1
    e.run(2); assert e.readTensor("n") == 3
    with pytest.raises(poplar.index_error):
        e.run(3)


def test_repeat_while_true_with_counted_condition():
    dev, g = _graph(tilesPerIPU=4)
    n = _counter(g)
    inc = _incr_program(g, n)
    # keep going while n != 6: cond copies (n == 6) into a bool via a tiny codelet-free trick:
    # run Incr, then stop when the predicate variable (set by the host between runs) is false.
    pred = g.addVariable(poplar.BOOL, [], "pred"); g.setTileMapping(pred, 0)
    zero = g.addConstant(poplar.INT, [], 0); g.setTileMapping(zero, 0)
    falsec = g.addConstant(poplar.BOOL, [], False); g.setTileMapping(falsec, 0)
    truec = g.addConstant(poplar.BOOL, [], True); g.setTileMapping(truec, 0)
    # body sets pred false after one iteration: loop runs exactly once after the first check
    body = P.Sequence(inc, P.Copy(falsec, pred))
    e = poplar.Engine(g, P.Sequence(P.Copy(zero, n), P.Copy(truec, pred), P.RepeatWhileTrue(P.Sequence(), pred, body)))
    e.load(dev); e.run()
    assert e.readTensor("n") == 1


def test_vmap_and_fallback_codelets_and_vertex_values():
    dev, g = _graph(tilesPerIPU=8)
    x = g.addVariable(poplar.FLOAT, [8, 3], "x")
    g.setTileMapping(x, np.repeat(np.arange(8), 3))
    out = g.addVariable(poplar.FLOAT, [8], "out"); g.setTileMapping(out, np.arange(8))
    lst = g.addVariable(poplar.FLOAT, [2], "lst"); g.setTileMapping(lst, 0)
    h = g.addVariable(poplar.HALF, [12], "h"); g.setTileMapping(h, 5)
    for t, name in ((x, "x"), (out, "out"), (lst, "lst"), (h, "h")):
        g.createHostWrite(name + "-w", t); g.createHostRead(name, t)
    cs = g.addComputeSet("cs")
    cs2 = g.addComputeSet("cs2")
    for i in range(8):
        v = g.addVertex(cs, "Scale", {"x": x[i]}, tile=i)
        g.setInitialValue(v["k"], float(i))
        g.setPerfEstimate(v, 5)
        w = g.addVertex(cs2, "DataDependent", {"in": x[i], "out": out[i]}, tile=i)
        g.setPerfEstimate(w, 7)
    v = g.addVertex(cs2, "ListSum", {"in": [x[0], x[1].slice(0, 2)], "out": lst}, tile=0)
    g.setPerfEstimate(v, 9)
    m = g.addVertex(cs2, "Halver", {"x": h}, tile=5)
    g.setPerfEstimate(m, 60)
    e = poplar.Engine(g, P.Sequence(P.Execute(cs), P.Execute(cs2)))
    e.load(dev)
    xs = np.arange(-12, 12, dtype=np.float32).reshape(8, 3)
    e.writeTensor("x-w", xs)
    e.writeTensor("h-w", np.arange(12, dtype=np.float16))
    e.run()
    scaled = xs * np.arange(8, dtype=np.float32)[:, None]
    np.testing.assert_allclose(e.readTensor("x"), scaled)
    np.testing.assert_allclose(e.readTensor("out"), np.where(scaled > 0, scaled, 0).sum(1))
    np.testing.assert_allclose(e.readTensor("lst"), [scaled[0].sum(), scaled[1, :2].sum()])
    np.testing.assert_allclose(e.readTensor("h"), np.arange(12) / 2)


def test_stream_circular_buffer_callbacks_and_device_to_host():
    dev, g = _graph(tilesPerIPU=2)
    v = g.addVariable(poplar.FLOAT, [3], "v"); g.setTileMapping(v, 1)
    s_in = g.addHostToDeviceFIFO("in", poplar.FLOAT, 3)
    s_out = g.addDeviceToHostFIFO("out", poplar.FLOAT, 3)
    e = poplar.Engine(g, P.Repeat(4, P.Sequence(P.Copy(s_in, v), P.Copy(v, s_out))))
    e.load(dev)
    src = np.arange(6, dtype=np.float32)
    got = []
    e.connectStream("in", src)
    e.connectStreamToCallback("out", lambda a: got.append(a.copy()))
    e.run()
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate([src, src]))
    assert e.listStreams() == ["in", "out"]


def test_predicted_clock_per_ipu_and_profile_summary():
    m = poplar.IPUModel("ipu2"); m.numIPUs = 2; m.tilesPerIPU = 8
    dev = m.createDevice()
    g = poplar.Graph(dev.getTarget())
    g.addCodelets(C)
    a = g.addVariable(poplar.FLOAT, [16], "a"); g.setTileMapping(a, np.arange(16))
    cs0, cs1 = g.addComputeSet("ipu0"), g.addComputeSet("ipu1")
    for t in range(8):
        g.setPerfEstimate(g.addVertex(cs0, "Scale", {"x": a.slice(t, t + 1)}, tile=t), 100)
        g.setPerfEstimate(g.addVertex(cs1, "Scale", {"x": a.slice(8 + t, 9 + t)}, tile=8 + t), 300)
    b = g.addVariable(poplar.FLOAT, [8], "b"); g.setTileMapping(b, np.arange(8, 16))
    e = poplar.Engine(g, [P.Sequence(P.Execute(cs0), P.Execute(cs1)), P.Copy(a.slice(0, 8), b)])
    e.load(dev)
    e.run(0)
    clock = e._runs[-1]["cycles_per_ipu"]
    # each compute set runs on its own IPU: the clocks advance independently
    assert clock[0] == 6 * 100 + 8 + 162 and clock[1] == 6 * 300 + 8 + 162
    e.run(1)
    assert e._runs[-1]["cycles_per_ipu"].min() > 0          # the copy crosses IPUs
    prof = e.getProfile()
    assert prof["execution"]["tileAverage"]["global_exchange"] > 0
    buf = io.StringIO()
    e.printProfileSummary(buf)
    assert "Number of IPUs:         2" in buf.getvalue() and "Tile average global exchange cycles:" in buf.getvalue()


def test_replicated_graph_runs_each_replica():
    m = poplar.IPUModel(); m.numIPUs = 2; m.tilesPerIPU = 4
    dev = m.createDevice()
    top = poplar.Graph(dev.getTarget(), replication_factor=2)
    assert top.getTarget().getNumTiles() == 4 and top.getReplicationFactor() == 2
    idx = top.addReplicationIndexConstant(); top.setTileMapping(idx, 0)
    v = top.addVariable(poplar.UNSIGNED_INT, [], "v"); top.setTileMapping(v, 1)
    out = top.addDeviceToHostFIFO("out", poplar.UNSIGNED_INT, 1)
    e = poplar.Engine(top, P.Sequence(P.Copy(idx, v), P.Copy(v, out)))
    e.load(dev)
    buf = np.zeros(2, np.uint32)
    e.connectStream("out", buf)
    e.run()
    np.testing.assert_array_equal(buf, [0, 1])


def test_virtual_graph_maps_to_parent_tiles():
    dev, g = _graph(tilesPerIPU=8)
    vg = g.createVirtualGraph(4, 8)
    assert vg.getTarget().getNumTiles() == 4
    t = vg.addVariable(poplar.FLOAT, [2], "t")
    vg.setTileMapping(t, 1)
    assert g.getTileMapping(t)[5][0].size() == 2
    with pytest.raises(poplar.invalid_tile_mapping):
        vg.setTileMapping(t, 4)


def test_abort_and_abort_on_condition():
    dev, g = _graph(tilesPerIPU=2)
    p = g.addVariable(poplar.BOOL, [], "p"); g.setTileMapping(p, 0); g.createHostWrite("p", p)
    e = poplar.Engine(g, [P.AbortOnCondition(p, "stop"), P.Abort("always")])
    e.load(dev)
    e.writeTensor("p", np.array(False)); e.run(0)
    e.writeTensor("p", np.array(True))
    with pytest.raises(poplar.application_runtime_error, match="stop"):
        e.run(0)
    with pytest.raises(poplar.application_runtime_error, match="always"):
        e.run(1)


def test_executable_serialise_roundtrip(tmp_path):
    dev, g = _graph(tilesPerIPU=2)
    n = _counter(g)
    exe = poplar.compileGraph(g, [P.Repeat(3, _incr_program(g, n))])
    exe.serialize(str(tmp_path / "exe.bin"))
    e = poplar.Engine(poplar.Executable.deserialize(str(tmp_path / "exe.bin")))
    e.load(dev)
    e.run()
    assert e.readTensor("n") == 3


def test_engine_options_from_environment(monkeypatch, tmp_path):
    dev, g = _graph(tilesPerIPU=2)
    n = _counter(g)
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps({"autoReport.all": "true", "autoReport.directory": str(tmp_path)}))
    e = poplar.Engine(g, _incr_program(g, n), {"autoReport.all": "false"})
    assert e.getEngineOptions()["autoReport.all"] == "true"          # the environment wins
    e.load(dev); e.run()
    import pva
    assert pva.openReport(str(tmp_path / "profile.pop")).execution.totalCycles.total > 0
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", "{not json")
    with pytest.raises(poplar.parse_error):
        poplar.Engine(g, _incr_program(g, n))
    monkeypatch.delenv("POPLAR_ENGINE_OPTIONS")
    with pytest.raises(poplar.invalid_option, match="Unrecognised option 'bogus'"):
        poplar.Engine(g, _incr_program(g, n), {"bogus": "1"})


def test_logging_honours_poplar_log_level(monkeypatch, tmp_path):
    log = tmp_path / "log.txt"
    monkeypatch.setenv("POPLAR_LOG_LEVEL", "INFO")
    monkeypatch.setenv("POPLAR_LOG_DEST", str(log))
    from openipu.poplar import engine as eng, options
    eng._log = options.get_logger("engine")
    dev, g = _graph(tilesPerIPU=2)
    poplar.Engine(g, _incr_program(g, _counter(g)))
    eng._log = options.get_logger("engine")
    text = log.read_text()
    assert "PO:ENGINE [I] Compiled 1 programs" in text


def _copies_through_tile_1(program):
    """Run ``program(g, a, b, on_tile_1)`` on 4 tiles: ``a`` (host-written 0..999, tile 0) must
    reach ``b`` (host-read, tile 2); ``on_tile_1(name)`` makes a [1000] float temporary on tile 1.
    Returns the engine's memory plan."""
    dev, g = _graph(tilesPerIPU=4)
    a = g.addVariable(poplar.FLOAT, [1000], "a"); g.setTileMapping(a, 0)
    b = g.addVariable(poplar.FLOAT, [1000], "b"); g.setTileMapping(b, 2)
    g.createHostWrite("a", a); g.createHostRead("b", b)

    def on_tile_1(name):
        t = g.addVariable(poplar.FLOAT, [1000], name)
        g.setTileMapping(t, 1)
        return t

    e = poplar.Engine(g, program(g, a, b, on_tile_1))
    e.load(dev)
    e.writeTensor("a", np.arange(1000, dtype=np.float32))
    e.run(0)
    np.testing.assert_array_equal(e.readTensor("b"), np.arange(1000, dtype=np.float32))
    return e.memory


def test_a_functions_own_variables_live_per_call_and_its_code_is_counted_once():
    # Function body: a -> tmp -> b (tmp is the function's own); between calls the caller uses
    # its own temporary `mid` on the same tile. tmp lives during each call only, so the peak on
    # tile 1 is one of the two temporaries, not both; the body's exchange code is counted once.
    def build(calls):
        def program(g, a, b, on_tile_1):
            tmp = on_tile_1("tmp")
            f = g.addFunction(P.Sequence(P.Copy(a, tmp), P.Copy(tmp, b)))
            seq = P.Sequence(P.Call(f))
            for i in range(calls - 1):
                mid = on_tile_1(f"mid{i}")
                seq.add(P.Sequence(P.Copy(a, mid), P.Copy(mid, b), P.Call(f)))
            return seq
        return _copies_through_tile_1(program)

    one, three = build(1), build(3)
    assert three.not_always_live_peak[1] == 4000            # tmp or mid, never both
    code_one = one.categories["Internal Exchange Code"]
    code_three = three.categories["Internal Exchange Code"]
    # three calls add only the caller's own copies (a -> mid -> b, twice): the body's once
    assert code_one[1] > 0
    np.testing.assert_array_equal(code_three - code_one, 2 * code_one)
    # control code likewise: the body's two steps once, the caller's four copies
    from openipu.poplar import calibration as cal
    control = three.categories["Control Code"] - one.categories["Control Code"]
    np.testing.assert_array_equal(control, np.full(4, 4.0 * cal.CONTROL_CODE_BYTES_PER_STEP))


def test_a_variable_is_dead_between_its_last_read_and_a_write_of_all_of_it():
    # buf is written whole, read, then written whole again and read: between the first read and
    # the second write it holds nothing needed, so `other` (alive only then, on the same tile)
    # shares the tile's memory with it. A partial rewrite keeps it live (part of it is still needed).
    def build(partial):
        def program(g, a, b, on_tile_1):
            buf, other = on_tile_1("buf"), on_tile_1("other")
            second = P.Copy(a.slice(0, 500), buf.slice(0, 500)) if partial else P.Copy(a, buf)
            return P.Sequence(P.Copy(a, buf), P.Copy(buf, b), P.Copy(a, other), P.Copy(other, b),
                              second, P.Copy(buf, b))
        return _copies_through_tile_1(program)

    assert build(False).not_always_live_peak[1] == 4000     # buf or other, never both
    assert build(True).not_always_live_peak[1] == 8000


def test_a_value_carried_into_a_loop_lives_for_the_loop_then_is_dead_until_rewritten():
    # buf is written, read in a loop (whose body then makes `inner`), dead, then written whole
    # again. It must outlive the loop's last step (every iteration reads it), so it never shares
    # memory with `inner`; after the loop it holds nothing until rewritten, so `x` and `y` (alive
    # together only then) may share memory with it.
    def program(g, a, b, on_tile_1):
        buf, inner, x, y = (on_tile_1(n) for n in ("buf", "inner", "x", "y"))
        loop = P.Repeat(2, P.Sequence(P.Copy(buf, b), P.Copy(a, inner), P.Copy(inner, b)))
        return P.Sequence(P.Copy(a, buf), loop, P.Copy(a, x), P.Copy(a, y), P.Copy(x, b), P.Copy(y, b),
                          P.Copy(a, buf), P.Copy(buf, b))

    assert _copies_through_tile_1(program).not_always_live_peak[1] == 8000     # buf + inner, or x + y


def test_a_functions_own_value_carried_into_its_loop_lives_for_the_loop():
    # As above inside a called function: `tmp` is made before the body's loop and read at the
    # loop's first step; `inner`, made later in the loop, must not take its memory (the next
    # iteration reads tmp again).
    def program(g, a, b, on_tile_1):
        tmp, inner = on_tile_1("tmp"), on_tile_1("inner")
        loop = P.Repeat(2, P.Sequence(P.Copy(tmp, b), P.Copy(a, inner), P.Copy(inner, b)))
        f = g.addFunction(P.Sequence(P.Copy(a, tmp), loop))
        return P.Sequence(P.Call(f), P.Call(f))

    assert _copies_through_tile_1(program).not_always_live_peak[1] == 8000     # tmp + inner


def test_a_copy_into_a_clone_is_on_tile_and_costs_what_the_exchange_path_does(monkeypatch):
    # v (one run per tile, unevenly) copied into its clone: compared on run lists, not per
    # element; the cost and exchange code are those the general exchange costing gives
    from openipu.poplar import copy_cost as CC

    def run():
        dev, g = _graph(tilesPerIPU=4)
        v = g.addVariable(poplar.FLOAT, [10, 100], "v")
        for t, (a, b) in enumerate(((0, 1), (1, 4), (4, 5), (5, 10))):
            g.setTileMapping(v.slice(a, b, 0), t)
        c = g.clone(v, "c")
        g.createHostWrite("v", v); g.createHostRead("c", c)
        e = poplar.Engine(g, P.Copy(v, c))
        e.load(dev)
        e.writeTensor("v", np.arange(1000, dtype=np.float32).reshape(10, 100))
        e.run(0)
        np.testing.assert_array_equal(e.readTensor("c").reshape(-1), np.arange(1000, dtype=np.float32))
        return e._runs[-1]["cycles_per_ipu"].copy(), e.memory.categories["Internal Exchange Code"].copy()

    seen = []
    alike = CC._alike_layout
    monkeypatch.setattr(CC, "_alike_layout", lambda s, d: seen.append(alike(s, d)) or seen[-1])
    cycles, code = run()
    assert seen and seen[0] is not None and not code.any()
    monkeypatch.setattr(CC, "_alike_layout", lambda s, d: None)
    monkeypatch.setattr(CC, "_same_tiles", lambda s, d, max_elements=0: (False, None))   # the general path
    cycles2, code2 = run()
    np.testing.assert_array_equal(cycles, cycles2)
    np.testing.assert_array_equal(code, code2)


def test_copies_between_alike_layouts_are_costed_once_and_cost_the_same(monkeypatch):
    # per layer: a transposed view of the layer's weight (same per-tile layout for every layer)
    # copied into a fixed buffer, then the buffer into the layer's output (each mapped alike
    # to another tile). Layer 1's copies reuse layer 0's costs, layer 2's weight (mapped otherwise)
    # is costed anew; the result, cycles and exchange code equal those of costing every copy.
    from openipu.poplar import graph_compiler as GC

    def run():
        dev, g = _graph(tilesPerIPU=4)
        buf = g.addVariable(poplar.FLOAT, [8, 6], "buf")
        g.setTileMapping(buf.slice(0, 4, 0), 2)
        g.setTileMapping(buf.slice(4, 8, 0), 3)
        progs = []
        for i in range(3):
            w = g.addVariable(poplar.FLOAT, [6, 8], f"w{i}")
            g.setTileMapping(w.slice(0, 3, 0), 0 if i < 2 else 1)      # the last layer's weight
            g.setTileMapping(w.slice(3, 6, 0), 1 if i < 2 else 0)      # is laid out otherwise
            g.createHostWrite(f"w{i}", w)
            out = g.addVariable(poplar.FLOAT, [8, 6], f"out{i}")
            g.setTileMapping(out, 0)
            g.createHostRead(f"out{i}", out)
            progs += [P.Copy(w.transpose(), buf), P.Copy(buf, out)]
        e = poplar.Engine(g, P.Sequence(*progs))
        e.load(dev)
        ws = [np.arange(48, dtype=np.float32).reshape(6, 8) + 100 * i for i in range(3)]
        for i in range(3):
            e.writeTensor(f"w{i}", ws[i])
        e.run(0)
        for i in range(3):
            np.testing.assert_array_equal(e.readTensor(f"out{i}"), ws[i].T)
        return e._runs[-1]["cycles_per_ipu"].copy(), e.memory.categories["Internal Exchange Code"].copy()

    costed = []
    real = GC._Compiler.tensor_copy_cost
    monkeypatch.setattr(GC._Compiler, "tensor_copy_cost", lambda self, s, d: costed.append(1) or real(self, s, d))
    cycles, code = run()
    assert len(costed) == 3                      # one per pair of layouts, not six
    monkeypatch.setattr(GC._Compiler, "layout_copy_cost", GC._Compiler.tensor_copy_cost)
    cycles2, code2 = run()
    assert len(costed) == 3 + 6
    np.testing.assert_array_equal(cycles, cycles2)
    np.testing.assert_array_equal(code, code2)
    assert code.any()
