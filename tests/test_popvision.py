"""PopVision: profile.pop, the ``pva`` reader and its errors, on a small PopART model."""

import os
import shutil
import sqlite3

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import pva
from openipu import runner


def _mlp(path):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((256, 128)).astype(np.float32)
    w2 = rng.standard_normal((128, 10)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "W2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [8, 256])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 10])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("pv")
    _mlp(d / "mlp.onnx")
    res = runner.run_model(str(d / "mlp.onnx"), report_dir=str(d / "rep"))
    return res, d / "rep"


def test_report_matches_the_run(profiled):
    res, rep = profiled
    r = pva.openReport(str(rep / "profile.pop"))
    c = r.compilation
    assert r.poplarVersion.major == 3 and "openipu" in r.poplarVersion.string
    assert c.target.numTiles == 1472 and c.target.numIPUs == 1 and c.target.bytesPerTile == res.bytes_per_tile
    assert len(c.tiles) == 1472
    total = sum(t.memory.total.includingGaps for t in c.tiles)
    assert total == res.tile_bytes_total == sum(t.memory.total.excludingGaps for t in c.tiles)
    assert c.worstTile() == res.worst_tiles[0]
    # the categories add up to the total on every tile
    cats = ("variable", "constant", "stack", "vertexInstanceState", "controlCode", "vertexCode", "internalExchangeCode")
    t0 = c.tiles[res.worst_tiles[0][0]]
    assert abs(sum(getattr(t0.memory.category, k).total for k in cats) - t0.memory.total.includingGaps) <= len(cats)
    assert c.graph.numComputeSets == len(c.computeSets) > 0
    assert any(v.size > 0 for v in c.variables)
    assert r.execution.totalCycles.total == round(res.step_cycles)
    [run] = r.execution.runs
    assert run.cycles == round(res.step_cycles)
    assert run.steps[-1].cyclesTo == pytest.approx(res.step_cycles)
    assert sum(s.ipus[0].cycles for s in run.steps) == pytest.approx(res.step_cycles, rel=1e-6, abs=len(run.steps))
    s = max(run.steps, key=lambda s: s.cycles)
    assert s.cyclesByTile.shape == (1472,) and s.cyclesByTile.max() == pytest.approx(s.cycles, rel=1e-5)
    peak_step, peak = c.livenessPeak()
    assert peak == max(x.notAlwaysLiveMemory.bytes for x in c.livenessProgramSteps) > 0


def test_visitors(profiled):
    _, rep = profiled
    r = pva.openReport(str(rep))           # a profile directory works too

    class V(pva.ProgramVisitor):
        def __init__(self):
            super().__init__()
            self.names = []

        def visitOnTileExecute(self, p):  # noqa: N802
            self.names.append((p.name, len(p.computeset.vertices) if p.computeset else 0))

    v = V()
    for s in r.execution.steps:
        s.program.accept(v)
    assert v.names and any(n > 0 for _, n in v.names)

    class Steps(pva.ExecutionStepVisitor):
        n = 0

        def visitStep(self, step):  # noqa: N802
            Steps.n += 1
    r.execution.accept(Steps())
    assert Steps.n == len(r.execution.steps)
    roots = r.compilation.controlPrograms
    assert roots and roots[0].type == pva.Program.Type.Sequence and roots[0].children


def test_not_a_report(tmp_path):
    p = tmp_path / "profile.pop"
    p.write_text('{"not": "a profile"}')
    with pytest.raises(pva.NotAReport, match="not a profile"):
        pva.openReport(str(p))
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(pva.NotAReport):
        pva.openReport(str(tmp_path / "other.db"))
    with pytest.raises(FileNotFoundError):
        pva.openReport(str(tmp_path / "missing.pop"))
    assert issubclass(pva.NotAReport, pva.Error)


def test_older_format_version(profiled, tmp_path):
    _, rep = profiled
    p = tmp_path / "old.pop"
    shutil.copy(rep / "profile.pop", p)
    con = sqlite3.connect(p)
    con.execute("UPDATE meta SET value='0' WHERE key='format_version'")
    con.commit()
    con.close()
    with pytest.raises(pva.UnsupportedFormat, match="older format version 0"):
        pva.openReport(str(p))


def test_truncated_and_damaged(profiled, tmp_path):
    _, rep = profiled
    data = (rep / "profile.pop").read_bytes()
    for n in (50, 4096, len(data) // 2, len(data) - 1):
        p = tmp_path / f"cut{n}.pop"
        p.write_bytes(data[:n])
        with pytest.raises(pva.CorruptReport):
            pva.openReport(str(p))
    # a damaged array: bytes that np.load rejects (and a pickle is never loaded)
    p = tmp_path / "bad.pop"
    shutil.copy(rep / "profile.pop", p)
    con = sqlite3.connect(p)
    import pickle
    con.execute("UPDATE arrays SET data=? WHERE name='memory/total'", (pickle.dumps(os.getcwd()),))
    con.commit()
    con.close()
    with pytest.raises(pva.CorruptReport, match="memory/total"):
        pva.openReport(str(p))


def test_object_arrays_are_refused(profiled, tmp_path):
    """An .npy of Python objects needs a pickle to load: the reader refuses it."""
    import io
    _, rep = profiled
    p = tmp_path / "obj.pop"
    shutil.copy(rep / "profile.pop", p)
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    con = sqlite3.connect(p)
    con.execute("UPDATE arrays SET data=? WHERE name='memory/total'", (buf.getvalue(),))
    con.commit()
    con.close()
    with pytest.raises(pva.CorruptReport):
        pva.openReport(str(p))


def test_popart_get_report(profiled):
    import popart
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]), "x")
    o = builder.aiOnnx.relu([x])
    builder.addOutputTensor(o)
    s = popart.InferenceSession(fnModel=builder.getModelProto(), dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}),
                                deviceInfo=popart.DeviceManager().createIpuModelDevice({}))
    s.prepareDevice()
    a = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: np.ones((4, 8), np.float32)}, a))
    r = s.getReport()
    assert isinstance(r, pva.Report)
    assert r.execution.totalCycles.total == s.getCycleCount()
    assert sum(t.memory.total.excludingGaps for t in r.compilation.tiles) > 0


def test_out_of_memory_profile_is_readable(tmp_path):
    """An engine that does not fit still leaves a profile (Poplar's "Profile saved to: ...")."""
    from openipu import poplar
    from openipu.poplar import program as P
    dev = poplar.IPUModel("ipu2").createDevice()
    g = poplar.Graph(dev.getTarget())
    v = g.addVariable(poplar.FLOAT, [200_000], "too_big")       # 800 kB on one 624 kB tile
    g.setTileMapping(v, 0)
    opts = {"autoReport.all": "true", "autoReport.directory": str(tmp_path), "debug.allowOutOfMemory": "false"}
    with pytest.raises(poplar.graph_memory_allocation_error, match="Profile saved to"):
        poplar.Engine(g, P.Sequence([P.WriteUndef(v)]), opts)
    r = pva.openReport(str(tmp_path / "profile.pop"))
    assert r.compilation.outOfMemoryTiles.tolist() == [0]
    assert r.compilation.worstTile()[0] == 0 and r.compilation.worstTile()[1] >= 800_000
    assert r.execution.runs == []
    assert r.compilation.tiles[0].memory.category.variable.overflowed.nonOverlapped > 0
    from openipu.popvision.html import write_report
    out = write_report(str(tmp_path), str(tmp_path / "oom.html"))
    text = open(out).read()
    assert "No execution recorded" in text and "id='oom-tiles'>1<" in text


def test_two_ipus(tmp_path):
    _mlp(tmp_path / "mlp.onnx")
    res = runner.run_model(str(tmp_path / "mlp.onnx"), num_ipus=2, report_dir=str(tmp_path / "rep"))
    r = pva.openReport(str(tmp_path / "rep"))
    c = r.compilation
    assert c.target.numIPUs == 2 and len(c.ipus) == 2 and len(c.ipus[1].tiles) == c.target.tilesPerIpu
    assert c.ipus[1].tiles[0].number == c.target.tilesPerIpu
    for s in c.livenessProgramSteps:
        assert s.notAlwaysLiveMemoryForIpu(0).bytes + s.notAlwaysLiveMemoryForIpu(1).bytes == s.notAlwaysLiveMemory.bytes
    assert max(s.notAlwaysLiveMemoryForIpu(1).bytes for s in c.livenessProgramSteps) > 0
    [run] = r.execution.runs
    assert run.cycles == round(res.step_cycles) and len(run.cyclesByIpu) == 2
    assert all(len(s.ipus) == 2 for s in run.steps)
    assert any(s.ipus[1].cycles > 0 and s.ipus[0].cycles == 0 for s in run.steps) or \
        any(s.ipus[0].cycles != s.ipus[1].cycles for s in run.steps)
    from openipu.popvision.html import write_report
    text = open(write_report(r, str(tmp_path / "two.html"))).read()
    assert "IPU 1" in text and "2 IPU(s)" in text


def test_memory_categories_by_libpva_name(profiled):
    _, rep = profiled
    t = pva.openReport(str(rep)).compilation.tiles[0]
    assert t.memory.category.copyDescriptor.total == 0          # a libpva category openipu does not model
    assert t.memory.category.vertexCode.total > 0
    with pytest.raises(AttributeError, match="No memory category 'vertexcode'"):
        t.memory.category.vertexcode


def test_poptorch_enable_profiling(tmp_path):
    import torch

    import poptorch
    opts = poptorch.Options()
    opts.enableProfiling(str(tmp_path / "prof"))
    model = poptorch.inferenceModel(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()), opts)
    model(torch.ones(4, 16))
    r = pva.openReport(str(tmp_path / "prof" / "inference" / "profile.pop"))    # PopART's <dir>/<session name>
    assert r.execution.totalCycles.total > 0 and r.compilation.graph.numComputeSets > 0


def test_peak_variables_operations_and_names(profiled):
    """The variables live at the liveness peak, the ops' cycles and memory, the named program
    tree and the run's options (run.json) as the report reads them."""
    from openipu.popvision.operations import operations
    res, rep = profiled
    r = pva.openReport(str(rep))
    c = r.compilation
    peak_step, peak = c.livenessPeak()
    live = c.livenessPeakVariables()
    names = {v.name for v in live}
    # the step at the peak is the first MatMul: its rearranged input and its output are live
    assert c.programOfStep(peak_step).name == "MatMul/h/Conv"
    assert {"MatMul/h/actsRearranged", "MatMul/h"} <= names
    assert "MatMul/y" not in names             # made later
    assert all(v.alwaysLive is False for v in live)
    assert [v.size for v in live] == sorted((v.size for v in live), reverse=True)
    assert sum(v.size for v in live) <= peak
    ops = {o.name: o for o in operations(r)}
    assert {"MatMul/h", "Relu/r", "MatMul/y"} <= set(ops)
    assert ops["MatMul/h"].type == "MatMul" and "Conv" in ops["MatMul/h"].calls
    assert ops["MatMul/h"].variable_bytes == sum(v.size for v in c.variables if v.name.startswith("MatMul/h"))
    [run] = r.execution.runs
    # every executed step's cycles are counted once, in one op: they add up to the run
    assert sum(o.cycles for o in ops.values()) == pytest.approx(run.cycles, rel=1e-6)
    assert ops["MatMul/h"].flops == 2 * 8 * 256 * 128
    tree = {p.name: p for p in c.programs if p.name}
    assert {"program 0", "program 1: weightsFromHost", "batchesPerStep", "model"} <= set(tree)
    assert tree["batchesPerStep"].type == "Repeat"
    assert r.runOptions == {"model": str(rep.parent / "mlp.onnx"), "ipu": "ipu2", "num_ipus": 1, "batch_size": 8,
                            "batches_per_step": 1, "precision": "fp32", "offline": False,
                            "available_memory_proportion": 0.6}   # as applied (PopRT's default)


def test_run_options_are_untrusted(tmp_path):
    from openipu.popvision.report import read_run_options
    (tmp_path / "run.json").write_text('{"batch_size": "8; rm -rf", "precision": "fp16", "offline": 1, '
                                       '"batches_per_step": -3, "num_ipus": true, "extra": 1}')
    assert read_run_options(str(tmp_path)) == {"precision": "fp16"}
    (tmp_path / "run.json").write_text("[" * 100_000)
    assert read_run_options(str(tmp_path)) == {}
    (tmp_path / "run.json").write_text("not json")
    assert read_run_options(str(tmp_path)) == {}


def test_op_of_a_name():
    """The op of a step, compute set or variable name: its longest known proper prefix."""
    from openipu.popvision.operations import _op_of
    known = {"MatMul/h", "Conv/r0"}
    assert _op_of("MatMul/h/Conv", known) == ("MatMul/h", "Conv")
    assert _op_of("Relu/r", known) == ("Relu/r", "")
    assert _op_of("Conv/r0/Conv/partials", known) == ("Conv/r0", "Conv")
    assert _op_of("Copy", known) is None and _op_of("/abs/name", known) is None


def test_summary_of_a_session_profile_names_the_variable_types(profiled, tmp_path):
    """A profile without run.json (a PopART / PopTorch session's): batch not recorded, the
    precision read off the variables' types, no samples/s claimed."""
    import shutil

    from openipu.popvision.html import _summary
    _, rep = profiled
    shutil.copy(rep / "profile.pop", tmp_path / "profile.pop")
    r = pva.openReport(str(tmp_path))
    assert r.runOptions == {}
    page = _summary(r)
    assert "not recorded; variable bytes by type: float 100%" in page
    assert "runs/s (samples per run not recorded)" in page and "samples/s" not in page
