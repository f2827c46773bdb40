"""Precise lowerings of reductions (popops.reduce) and Gather (popops.multiSlice): same numbers as
the onnx_ops kernels; the embedding table gets the sliceable layout; declined cases stay generic."""

import numpy as np
import pytest

import popart
from lowering_harness import check, run_node


@pytest.fixture(autouse=True)
def _device_emulation(monkeypatch):
    """These tests check the lowering (views, in-place writes on the device): they run on the
    device-storage emulation, which the IR executor (the default) would bypass."""
    monkeypatch.setenv("OPENIPU_EXECUTION", "device")


RNG = np.random.default_rng(3)
REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL2",
              "ReduceL1", "ReduceLogSum", "ReduceLogSumExp"]


@pytest.mark.parametrize("dt", [np.float32, np.float16])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_axes_attribute(op, dt):
    x = RNG.uniform(0.5, 1.5, (3, 4, 5)).astype(dt)
    tol = {} if dt == np.float16 else {"rtol": 2e-5, "atol": 1e-5}
    for axes, keep in (([1], 1), ([0, 2], 0), ([-1], 1), (None, 0)):
        attrs = {"keepdims": keep} if axes is None else {"axes": axes, "keepdims": keep}
        check(op, {"x": x}, attrs, opset=11, **tol)


def test_reduce_axes_input_and_declines():
    x = RNG.standard_normal((4, 6, 3)).astype(np.float32)
    check("ReduceSum", {"x": x}, consts={"a": np.array([0, 2], np.int64)}, opset=13)
    check("ReduceMax", {"x": x}, {"keepdims": 0}, consts={"a": np.array([1], np.int64)}, opset=18)
    check("ReduceSum", {"x": x}, opset=13)                                    # no axes: all
    check("ReduceSum", {"x": x}, {"noop_with_empty_axes": 1}, opset=13, precise=False)
    check("ReduceSum", {"x": x, "a": np.array([1], np.int64)}, opset=13, precise=False)   # run-time axes
    check("ReduceSum", {"x": x.astype(np.int32)}, {"axes": [1]}, opset=11, precise=False)


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int32])
def test_gather_embedding_runtime_indices(dt):
    table = (RNG.standard_normal((50, 8)) * 10).astype(dt)
    ids = RNG.integers(-50, 50, (3, 7)).astype(np.int64)
    check("Gather", {"i": ids}, consts={"d": table}, attrs={"__order__": ["d", "i"]})
    check("Gather", {"i": ids[0, :1].reshape(())}, consts={"d": table}, attrs={"__order__": ["d", "i"]})


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_axes_constant_indices(axis):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    d = x.shape[axis]
    check("Gather", {"d": x}, {"axis": axis}, consts={"i": np.array([[0, d - 1], [-1, 1]], np.int64)})
    check("Gather", {"d": x, "i": np.array([2, -2, 0], np.int32)}, {"axis": axis})


def test_gather_out_of_range_constant_generic():
    # PopLibs' multiSlice: an offset at or past the sliced dimension's size returns a slice of
    # zeros (the device raises nothing); the generic lowering runs it (constant out of range)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    outs, _, _ = run_node("Gather", {"d": x}, {}, consts={"i": np.array([5, 1], np.int64)},
                          out_values=[np.zeros((2, 4), np.float32)])
    np.testing.assert_array_equal(outs[0][0], np.zeros(4, np.float32))
    np.testing.assert_array_equal(outs[0][1], x[1])


def _multislice_tiles(s):
    groups = [g for cs in s._lowered.graph._state.compute_sets for g in cs.groups if "MultiSlice" in g.type_name]
    assert len(groups) == 1
    return groups[0].tiles.size


def test_gather_weight_gets_sliceable_layout():
    """The table's columns spread over the tiles (createSliceableTensor's layout): the MultiSlice
    vertices run on all 16 tiles, not only on the tile of the table's first row."""
    table = RNG.standard_normal((300, 16)).astype(np.float32)
    ids = RNG.integers(0, 300, (2, 5)).astype(np.int64)
    s, _ = check("Gather", {"i": ids}, consts={"d": table}, attrs={"__order__": ["d", "i"]}, tiles=16)
    assert _multislice_tiles(s) == 16
    # a run-time table keeps its (linear) layout, whose first row sits on one tile; the lookup is
    # planned over the tiles anyway (PopLibs' planned multiSlice), not run on that tile alone
    s, _ = check("Gather", {"d": table, "i": ids}, tiles=16)
    assert _multislice_tiles(s) == 16


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_gather_table_with_fewer_columns_than_tiles_is_split_along_its_rows(dt):
    """As PopLibs' embedding plan does (slicedDimSplit): 8 columns on 16 tiles would leave half the
    tiles empty, so the rows are split too (fp32: 2 ranges of 150 rows x 8 single columns; fp16:
    columns in pairs, 4 x 4 ranges of 75 rows), every tile holds an equal part of the table, and
    the lookup runs in two stages (each range slices where it lives, then the right range's slice
    is picked)."""
    table = RNG.standard_normal((300, 8)).astype(dt)
    ids = RNG.integers(-300, 300, (4, 9)).astype(np.int64)
    s, _ = check("Gather", {"i": ids}, consts={"d": table}, attrs={"__order__": ["d", "i"]}, tiles=16)
    const = s._engine.memory.categories["Constants"]
    assert (const >= table.nbytes / 16).all() and const.max() < table.nbytes / 16 + 64
    stages = [cs.name for cs in s._lowered.graph._state.compute_sets if any("MultiSlice" in g.type_name
                                                                              for g in cs.groups)]
    assert len(stages) == 2 and stages[0].endswith("stage0") and stages[1].endswith("stage1")


@pytest.mark.parametrize("constant", [True, False])
def test_gather_table_is_created_column_major(constant):
    """The session creates a Gather's table in its consumer's layout: stored column by column
    (the sliced axis innermost), so its tile map is one run per tile, and seen through a view of
    the ONNX shape (values, weight streams and results unchanged)."""
    table = RNG.standard_normal((300, 16)).astype(np.float32)
    ids = RNG.integers(0, 300, (2, 5)).astype(np.int64)
    s, _ = check("Gather", {"i": ids}, consts={"d": table}, attrs={"__order__": ["d", "i"]}, tiles=16,
                 options={"constantWeights": constant})
    (var,) = [v for v in s._lowered.graph._state.variables if v.name == "d"]
    assert var.shape == (16, 300)
    assert var.tile_starts.size == 16 and len(set(var.tile_ids.tolist())) == 16
    if not constant:
        w = {"d": np.zeros_like(table)}
        s.weightsToHost()
        s.readWeights(popart.PyWeightsIO(w))
        np.testing.assert_array_equal(w["d"], table)


@pytest.mark.parametrize("axis,dt", [(0, np.float32), (1, np.float32), (0, np.float16)])
def test_gather_grad_multi_update_add_matches_torch_and_updates_on_tile(axis, dt):
    """GatherGrad through ``popops.multiUpdateAdd`` (repeated indices add up, negative ones count
    from the end) into zeros laid out like the sliceable table: the gradient matches torch, and
    the table's SGD update reads it without exchange."""
    import torch
    table = RNG.standard_normal((3, 40, 8) if axis == 1 else (40, 8)).astype(dt)
    ids = np.array([[1, -3, 1], [39, 0, 5]], np.int32)
    b = popart.Builder()
    t = b.addInitializedInputTensor(table, "table")
    i = b.addInputTensor(popart.TensorInfo("INT32", [2, 3]), "idx")
    out = b.aiOnnx.gather([t, i], axis=axis)
    c = RNG.standard_normal([2, 3, 8] if axis == 0 else [3, 2, 3, 8]).astype(dt)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([out, b.aiOnnx.constant(c)])], popart.ReductionType.Sum)
    G = popart.reservedGradientPrefix() + t
    s = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {G: popart.AnchorReturnType("All")}), loss,
                               popart.ConstSGD(0.1), popart.DeviceManager().createIpuModelDevice({"tilesPerIPU": 16}))
    s.prepareDevice()
    s.weightsFromHost()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({i: ids}, a))
    tt = torch.tensor(table.astype(np.float32), requires_grad=True)
    (torch.index_select(tt, axis, torch.tensor(ids % 40).long().reshape(-1)).reshape(c.shape)
     * torch.tensor(c.astype(np.float32))).sum().backward()
    tol = 1e-6 if dt == np.float32 else 1e-2
    np.testing.assert_allclose(a[G].astype(np.float32), tt.grad.numpy(), rtol=tol, atol=tol)
    assert next(op for op in s.ops() if op.op_type == "GatherGrad").lowering == "precise"
    (upd,) = [st for st in s._engine._compiled.compiler.steps if st.name.startswith("SGD0VarUpdate/")]
    assert float(upd.cost.duration["exchange"].max()) == 0.0
