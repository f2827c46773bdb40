"""Bad input gets Poplar's exception classes with clear text, and leaves state usable."""

import numpy as np
import pytest

import codelets_for_tests as C
from openipu import poplar
from openipu.poplar import program as P


def _g(tiles=4):
    m = poplar.IPUModel(); m.tilesPerIPU = tiles
    dev = m.createDevice()
    g = poplar.Graph(dev.getTarget())
    return dev, g


def test_unknown_vertex_type_and_field():
    dev, g = _g()
    cs = g.addComputeSet("cs")
    with pytest.raises(poplar.unknown_vertex_type, match="Unknown vertex type 'Nope'.*addCodelets"):
        g.addVertex(cs, "Nope")
    g.addCodelets(C)
    v = g.addVertex(cs, "Incr")
    with pytest.raises(poplar.unknown_field, match="has no field named 'y'; its fields are x"):
        v["y"]


def test_connect_wrong_type_and_size():
    dev, g = _g()
    g.addCodelets(C)
    cs = g.addComputeSet("cs")
    v = g.addVertex(cs, "Incr")
    f = g.addVariable(poplar.FLOAT, [], "f")
    with pytest.raises(poplar.graph_connection_error, match="the field has type int but the tensor has type float"):
        g.connect(v["x"], f)
    i2 = g.addVariable(poplar.INT, [2], "i2")
    with pytest.raises(poplar.graph_connection_error, match="holds one int but the tensor has 2 elements"):
        g.connect(v["x"], i2)


def test_copy_mismatch():
    dev, g = _g()
    a, b = g.addVariable(poplar.FLOAT, [3]), g.addVariable(poplar.FLOAT, [4])
    with pytest.raises(poplar.graph_connection_error, match="source has 3 elements but destination has 4"):
        P.Copy(a, b)
    with pytest.raises(poplar.graph_connection_error, match="source type float does not match destination type int"):
        P.Copy(a, g.addVariable(poplar.INT, [3]))


def test_unmapped_variable_at_compile_then_fixed():
    dev, g = _g()
    a = g.addVariable(poplar.FLOAT, [3], "lonely")
    with pytest.raises(poplar.invalid_tile_mapping, match="not completely mapped to tiles: 'lonely'"):
        poplar.Engine(g, P.Sequence())
    g.setTileMapping(a, 0)
    poplar.Engine(g, P.Sequence())          # the graph is still usable


def test_unmapped_vertex_unconnected_field_missing_estimate():
    dev, g = _g()
    g.addCodelets(C)
    x = g.addVariable(poplar.INT, [], "x"); g.setTileMapping(x, 0)
    cs = g.addComputeSet("cs")
    v = g.addVertex(cs, "Incr", {"x": x})
    with pytest.raises(poplar.invalid_tile_mapping, match="is not mapped to a tile"):
        poplar.Engine(g, P.Execute(cs))
    g.setTileMapping(v, 0)
    with pytest.raises(poplar.missing_cycle_estimate, match="setPerfEstimate"):
        poplar.Engine(g, P.Execute(cs))
    g.registerPerfEstimator("Incr", lambda vtx, target: poplar.VertexPerfEstimate(4 + vtx.getFieldInfo("x").size()))
    e = poplar.Engine(g, P.Execute(cs))
    assert e._compiled.compiler.steps[0].cost.by_vertex_type["Incr"][1] == 6 * 5
    cs2 = g.addComputeSet("cs2")
    g.addVertex(cs2, "Incr", tile=0)
    with pytest.raises(poplar.graph_connection_error, match="Field 'x' of vertex .* is not connected"):
        poplar.Engine(g, P.Execute(cs2))


def test_unconnected_stream_at_run_and_unknown_handles():
    dev, g = _g()
    v = g.addVariable(poplar.FLOAT, [2], "v"); g.setTileMapping(v, 0)
    g.createHostRead("v", v)
    s = g.addHostToDeviceFIFO("in", poplar.FLOAT, 2)
    e = poplar.Engine(g, P.Copy(s, v))
    with pytest.raises(poplar.runtime_error, match="not loaded"):
        e.run()
    e.load(dev)
    with pytest.raises(poplar.stream_connection_error, match="Stream 'in' is not connected"):
        e.run()
    with pytest.raises(poplar.stream_connection_error, match="Unknown stream handle 'nope'"):
        e.connectStream("nope", np.zeros(2, np.float32))
    with pytest.raises(poplar.poplar_error, match="Unrecognised host read handle 'w'"):
        e.readTensor("w")
    with pytest.raises(poplar.stream_connection_error, match="whole number"):
        e.connectStream("in", np.zeros(3, np.float32))
    e.connectStream("in", np.array([1, 2], np.float32))
    e.run()
    np.testing.assert_array_equal(e.readTensor("v"), [1, 2])


def test_out_of_memory_and_allow_out_of_memory():
    dev, g = _g(tiles=2)
    big = g.addVariable(poplar.FLOAT, [200_000], "big")        # 800 kB on one tile of 624 KiB
    g.setTileMapping(big, 1)
    with pytest.raises(poplar.graph_memory_allocation_error,
                       match=r"^Out of memory: Cannot fit all variable data onto one or more tiles\..*tile 1 needs"):
        poplar.Engine(g, P.Sequence())
    e = poplar.Engine(g, P.Sequence(), {"debug.allowOutOfMemory": "true"})
    assert e.memory.out_of_memory_tiles.tolist() == [1]
    assert e.memory.worst_tiles(1)[0][0] == 1


def test_codelet_files():
    dev, g = _g()
    with pytest.raises(poplar.graph_object_load_error, match="not found"):
        g.addCodelets("/nonexistent/codelets.py")
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cpp") as f:
        with pytest.raises(poplar.graph_object_load_error, match="codelets written in Python"):
            g.addCodelets(f.name)
