"""poplin matmuls: results against numpy / torch over shapes, mappings, types and partials
types; the planner's memory and cost invariants; the no-plan-fits error."""

import io

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libharness import OpHarness
from openipu import poplar
from openipu.poplibs import poplin


def _ref(A, B, partials="float"):
    """torch reference: fp16 inputs with fp32 partials are upcast and the result cast back."""
    a, b = torch.tensor(A), torch.tensor(B)
    if a.dtype == torch.float16 and partials == "float":
        return (a.float() @ b.float()).half().numpy()
    return (a @ b).numpy()


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(m=st.integers(1, 70), k=st.integers(1, 90), n=st.integers(1, 40),
       dtype=st.sampled_from([np.float32, np.float16]), partials=st.sampled_from(["float", "half"]),
       mapping=st.sampled_from(["linear", "random", "blocks", "tile0"]), tiles=st.sampled_from([1, 4, 16]),
       amp=st.sampled_from([0.6, 0.02]))
def test_matmul_matches_reference(m, k, n, dtype, partials, mapping, tiles, amp):
    rng = np.random.default_rng(m * 1000 + k)
    A = rng.standard_normal((m, k)).astype(dtype)
    B = rng.standard_normal((k, n)).astype(dtype)
    h = OpHarness(tiles=tiles)
    a, b = h.input("a", A, mapping=mapping), h.input("b", B, mapping=mapping)
    try:
        c = poplin.matMul(h.graph, a, b, h.prog, "c", {"partialsType": partials, "availableMemoryProportion": amp})
    except poplin.poplibs_error:
        assert amp < 0.6        # only the tiny budget may leave no plan
        return
    out = h.run(out=c)["out"]
    assert out.shape == (m, n) and out.dtype == dtype
    if dtype == np.float32:
        np.testing.assert_allclose(out, A.astype(np.float64) @ B.astype(np.float64), atol=1e-4 * max(1, k ** 0.5))
    else:
        np.testing.assert_allclose(out.astype(np.float32), _ref(A, B, partials).astype(np.float32),
                                   atol=0.02 * max(1, k ** 0.5), rtol=0.01)


def test_fp16_with_fp32_partials_is_exactly_upcast_then_cast():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((24, 300)).astype(np.float16)
    B = rng.standard_normal((300, 20)).astype(np.float16)
    h = OpHarness(tiles=8)
    c = poplin.matMul(h.graph, h.input("a", A), h.input("b", B), h.prog, "c", {"partialsType": "float"})
    out = h.run(out=c)["out"]
    np.testing.assert_allclose(out.astype(np.float32), _ref(A, B, "float").astype(np.float32), rtol=2e-3, atol=2e-3)


def test_output_type_and_grouped_and_acc():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((3, 10, 12)).astype(np.float16)
    B = rng.standard_normal((3, 12, 7)).astype(np.float16)
    C0 = rng.standard_normal((3, 10, 7)).astype(np.float32)
    h = OpHarness(tiles=16)
    a, b = h.input("a", A), h.input("b", B, mapping="random")
    g = poplin.matMulGrouped(h.graph, a, b, h.prog, poplar.FLOAT, "g")
    assert g.elementType() == poplar.FLOAT and g.shape() == [3, 10, 7]
    c = h.input("c", C0)
    poplin.matMulGroupedAcc(h.graph, c, 0.5, h.input("af", A.astype(np.float32)), h.input("bf", B.astype(np.float32)),
                            h.prog, "acc")
    d = h.input("d", C0[0])
    poplin.matMulAcc(h.graph, d, -2.0, h.input("a0", A[0].astype(np.float32)), h.input("b0", B[0].astype(np.float32)),
                     h.prog, "acc2")
    r = h.run(g=g, c=c, d=d)
    exact = np.einsum("gmk,gkn->gmn", A.astype(np.float64), B.astype(np.float64))
    np.testing.assert_allclose(r["g"], exact, atol=1e-2)
    np.testing.assert_allclose(r["c"], C0 + 0.5 * exact, atol=1e-4)
    np.testing.assert_allclose(r["d"], C0[0] - 2.0 * exact[0], atol=1e-4)


def test_created_operands_need_less_exchange_and_output_mapping_matches():
    shapes = ([256, 512], [512, 128])
    rng = np.random.default_rng(0)
    A = rng.standard_normal(shapes[0]).astype(np.float16)
    B = rng.standard_normal(shapes[1]).astype(np.float16)
    cycles, outs = {}, {}
    for how in ("created", "tile0"):
        h = OpHarness(tiles=64)
        if how == "created":
            a = poplin.createMatMulInputLHS(h.graph, poplar.HALF, *shapes, "a")
            b = poplin.createMatMulInputRHS(h.graph, poplar.HALF, *shapes, "b")
        else:
            a, b = (h.graph.addVariable(poplar.HALF, s, n) for s, n in zip(shapes, "ab"))
            h.graph.setTileMapping(a, 0)
            h.graph.setTileMapping(b, 0)
        h.graph.setInitialValue(a, A)
        h.graph.setInitialValue(b, B)
        c = poplin.matMul(h.graph, a, b, h.prog, "c")
        if how == "created":
            o = poplin.createMatMulOutput(h.graph, poplar.HALF, poplar.HALF, *shapes, "o")
            np.testing.assert_array_equal(h.graph.tile_of_elements(o), h.graph.tile_of_elements(c))
        outs[how] = h.run(out=c)["out"]
        cycles[how] = h.cycles()
    np.testing.assert_array_equal(outs["created"], outs["tile0"])
    assert cycles["created"] < cycles["tile0"] / 2


def test_bad_arguments():
    h = OpHarness(tiles=4)
    a = h.graph.addVariable(poplar.FLOAT, [3, 4], "a")
    b = h.graph.addVariable(poplar.FLOAT, [5, 2], "b")
    bh = h.graph.addVariable(poplar.HALF, [4, 2], "bh")
    with pytest.raises(poplar.graph_connection_error, match="cannot multiply"):
        poplin.matMul(h.graph, a, b, h.prog)
    with pytest.raises(poplar.graph_connection_error, match="types differ"):
        poplin.matMul(h.graph, a, bh, h.prog)
    with pytest.raises(poplar.graph_connection_error, match="rank"):
        poplin.matMul(h.graph, a.reshape([12]), b, h.prog)
    b2 = h.graph.addVariable(poplar.FLOAT, [4, 2], "b2")
    with pytest.raises(poplar.invalid_option, match="unknown option"):
        poplin.matMul(h.graph, a, b2, h.prog, "c", {"availableMemoryProportions": 0.5})
    with pytest.raises(poplar.invalid_option, match=r"\[0, 1\]"):
        poplin.matMul(h.graph, a, b2, h.prog, "c", {"availableMemoryProportion": 1.5})
    poplin.matMul(h.graph, a, b2, h.prog, "c", {"fullyConnectedPass": "TRAINING_FWD", "enableFastReduce": "true"})


# ---------------------------------------------------------------------------------------------
IPU2 = poplar.IPUModel("ipu2").createDevice().getTarget()
SHAPES = [(1, 512, 512, 512), (1, 4096, 1024, 4096), (1, 6144, 1024, 1024), (12, 384, 64, 384), (1, 9000, 7500, 300),
          (1, 16, 30522, 1024)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [poplar.HALF, poplar.FLOAT])
def test_plan_within_budget_and_monotone_in_proportion(shape, dtype):
    prev = None
    for amp in (1.0, 0.6, 0.3, 0.15, 0.05, 0.01):
        plan = poplin.plan_matmul(*shape, dtype, IPU2, {"availableMemoryProportion": amp}, poplin.PlanningCache())
        if plan.temp_bytes > plan.budget_bytes:     # no plan fits: the least-memory plan, over the budget
            assert prev is None or plan.temp_bytes <= prev.temp_bytes
            break
        assert plan.temp_bytes <= amp * IPU2.getBytesPerTile()
        if prev is not None:
            assert plan.temp_bytes <= prev.temp_bytes
            assert plan.cycles >= prev.cycles
        prev = plan
    assert prev is not None


def test_minimise_memory_with_zero_proportion():
    plans = [poplin.plan_matmul(1, 2048, 2048, 2048, poplar.HALF, IPU2, {"availableMemoryProportion": a})
             for a in (0.0, 0.01, 0.6)]
    assert plans[0].temp_bytes <= min(p.temp_bytes for p in plans[1:] if p is not None)


@pytest.mark.parametrize("shape", [(1, 2048, 2048, 2048), (1, 1024, 4096, 1024), (1, 6144, 1024, 4096)])
def test_large_matmul_not_slower_on_more_tiles(shape):
    few = poplar.IPUModel("ipu2")
    few.tilesPerIPU = 64
    t64 = few.createDevice().getTarget()
    c64 = poplin.plan_matmul(*shape, poplar.HALF, t64, {"availableMemoryProportion": 1.0}).cycles
    c1472 = poplin.plan_matmul(*shape, poplar.HALF, IPU2).cycles
    assert c1472 * 8 < c64


def test_more_tiles_faster_in_the_engine():
    """Predicted cycles from the engine (not only the planner) drop with more tiles."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((256, 256)).astype(np.float16)
    cyc = {}
    for tiles in (16, 256):
        h = OpHarness(tiles=tiles)
        c = poplin.matMul(h.graph, h.input("a", A), h.input("b", A), h.prog, "c")
        h.run(out=c)
        cyc[tiles] = h.cycles()
    assert cyc[256] * 3 < cyc[16]


@pytest.mark.parametrize("partials,peak", [("half", 64), ("float", 32)])
def test_single_tile_fp16_rate_at_most_amp_peak(partials, peak):
    """On a 1-tile ipu2 IPU Model, the predicted cycles of an fp16 matmul imply at most the AMP's
    MACs per cycle (64 with half partials; the target table's 32 with float partials), and are
    not absurdly far from it."""
    m, k, n = 96, 128, 64
    rng = np.random.default_rng(0)
    h = OpHarness(tiles=1)
    c = poplin.matMul(h.graph, h.input("a", rng.standard_normal((m, k)).astype(np.float16), mapping=0),
                      h.input("b", rng.standard_normal((k, n)).astype(np.float16), mapping=0), h.prog, "c",
                      {"partialsType": partials})
    h.run(out=c)
    rate = m * k * n / h.cycles()
    assert IPU2.getAmpMacsPerCycle(poplar.HALF, poplar.types.as_type(partials)) == peak
    assert peak / 4 < rate <= peak


def _tiny_target():
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = 2
    m.memoryBytesPerTile = 8 * 1024
    return m.createDevice().getTarget()


def test_no_plan_fits_warns_and_takes_the_least_memory_plan(tmp_path, monkeypatch):
    """As PopLibs: no plan within the budget is a warning through Poplar's logger (printed at
    POPLAR_LOG_LEVEL=WARN) and the plan with least temporary memory, not an error."""
    log = tmp_path / "poplar.log"
    monkeypatch.setenv("POPLAR_LOG_LEVEL", "WARN")
    monkeypatch.setenv("POPLAR_LOG_DEST", str(log))
    t = _tiny_target()
    with poplin.plan.record_over_budget() as over:
        plan = poplin.plan_matmul(1, 512, 4096, 512, poplar.HALF, t, {"availableMemoryProportion": 0.5},
                                  poplin.PlanningCache())
    least = poplin.plan_matmul(1, 512, 4096, 512, poplar.HALF, t, {"availableMemoryProportion": 0},
                               poplin.PlanningCache())
    assert plan.budget_bytes == 4096 < plan.temp_bytes
    assert plan.temp_bytes == least.temp_bytes
    assert [(o.temp_bytes, o.budget_bytes) for o in over] == [(plan.temp_bytes, 4096)]
    msg = log.read_text()
    for part in ("PO:POPLIN [W]", "matMul [512x4096] x [4096x512]", "half inputs",
                 "unable to meet memory target", f"least temporary memory needs {plan.temp_bytes:,} bytes",
                 "availableMemoryProportion 0.5 of 8,192 bytes per tile allows 4,096 bytes",
                 "Raise availableMemoryProportion", "lower the batch size", "more IPUs"):
        assert part in msg, (part, msg)


def test_no_plan_fits_is_silent_by_default(tmp_path, monkeypatch):
    log = tmp_path / "poplar.log"
    monkeypatch.delenv("POPLAR_LOG_LEVEL", raising=False)
    monkeypatch.delenv("POPLAR_POPLIN_LOG_LEVEL", raising=False)
    monkeypatch.setenv("POPLAR_LOG_DEST", str(log))
    poplin.plan_matmul(1, 512, 4096, 512, poplar.HALF, _tiny_target(), {"availableMemoryProportion": 0.5},
                       poplin.PlanningCache())
    assert not log.exists() or log.read_text() == ""


def test_plan_cache():
    cache = poplin.PlanningCache()
    p1 = poplin.plan_matmul(1, 300, 200, 100, poplar.FLOAT, IPU2, None, cache)
    p2 = poplin.plan_matmul(1, 300, 200, 100, poplar.FLOAT, IPU2, {"availableMemoryProportion": 0.6}, cache)
    assert p1 is p2 and cache.size() == 1
    poplin.plan_matmul(1, 300, 200, 100, poplar.FLOAT, IPU2, {"availableMemoryProportion": 0.5}, cache)
    poplin.plan_matmul(1, 300, 200, 100, poplar.HALF, IPU2, None, cache)
    assert cache.size() == 3
    g = poplar.Graph(IPU2)
    buf = io.StringIO()
    poplin.matMulReportPlan(buf, g, poplar.FLOAT, poplar.FLOAT, [300, 200], [200, 100], None, cache)
    assert cache.size() == 3 and "estimated cycles" in buf.getvalue()


def test_serial_splits_when_memory_is_short():
    """A budget too small for any parallel plan gives a plan with serial steps over the output
    channels (PopLibs' ``outChanSplit.serial``), which computes the same result (a loop over one
    compute-set group) and fits the budget."""
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = 4
    t = m.createDevice().getTarget()
    amp = 0.02                           # 12,779 bytes per tile
    plan = poplin.plan_matmul(1, 24, 256, 160, poplar.FLOAT, t, {"availableMemoryProportion": amp})
    assert plan.serial_steps > 1 and plan.temp_bytes <= amp * t.getBytesPerTile()
    least = poplin.plan_matmul(1, 24, 256, 160, poplar.FLOAT, t, {"availableMemoryProportion": 0.001})
    assert least.temp_bytes > least.budget_bytes and least.temp_bytes <= plan.temp_bytes   # over: least memory
    rng = np.random.default_rng(0)
    A = rng.standard_normal((24, 256)).astype(np.float32)
    B = rng.standard_normal((256, 160)).astype(np.float32)
    h = OpHarness(tiles=4)
    c = poplin.matMul(h.graph, h.input("a", A), h.input("b", B), h.prog, "c", {"availableMemoryProportion": amp})
    out = h.run(out=c)["out"]
    np.testing.assert_allclose(out, A.astype(np.float64) @ B, atol=1e-3)
    names = [cs.name for cs in h.graph.getComputeSets()]
    assert sum(n.endswith("/Conv") for n in names) == 1
    assert sum(n.endswith("/Reduce") for n in names) == (plan.in_chan_split > 1)


def _exchange_cycles(h, suffixes):
    return [float(s.cost.duration["exchange"].sum()) for s in h.engine._exe.compiled.compiler.steps
            if s.name.endswith(suffixes)]


@pytest.mark.parametrize("m,k,n,amp,serial", [(512, 128, 512, 0.04, 16), (512, 64, 512, 0.02, 16)])
def test_serial_loop_over_rearranged_operands(m, k, n, amp, serial):
    """Operands that more than 7 tiles read per block are copied into the plan's layout, which
    stores each serial slice as one interval laid out as the slice problem's operand: the loop
    copies slices of the variable in memory order, on the tiles (the same exchange as the
    output's update, which only receives the loop index); the result is exact."""
    h = OpHarness(tiles=16)
    opts = {"availableMemoryProportion": amp}
    plan = poplin.plan_matmul(1, m, k, n, poplar.HALF, h.device.getTarget(), opts)
    assert plan.out_chan_serial == serial
    rng = np.random.default_rng(2)
    A = rng.standard_normal((m, k)).astype(np.float16)
    B = rng.standard_normal((k, n)).astype(np.float16)
    c = poplin.matMul(h.graph, h.input("a", A), h.input("b", B), h.prog, "c", opts)
    out = h.run(out=c)["out"]
    np.testing.assert_allclose(out.astype(np.float64), A.astype(np.float64) @ B.astype(np.float64), rtol=2e-3, atol=0.1)
    names = [cs.name for cs in h.graph.getComputeSets()]
    assert sum(n_.endswith("/Conv") for n_ in names) == 1
    steps = [s.name for s in h.engine._exe.compiled.compiler.steps]
    assert any(s.endswith("Rearranged") or s == "Copy" for s in steps)
    slices, updates = _exchange_cycles(h, ("serialSlice",)), _exchange_cycles(h, ("serialUpdate",))
    assert slices and updates and max(slices) <= min(updates)
