"""Host storage follows the memory plan: variables whose lifetimes do not overlap share addresses."""

import numpy as np
from hypothesis import given, settings, strategies as st

from openipu import poplar
from openipu.poplar import program
from openipu.poplar.memory import host_offsets
from openipu.poplibs import popops, poputil


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 9), st.integers(0, 4), st.booleans()), min_size=1, max_size=14))
def test_host_offsets_never_overlap_live_variables(vs):
    sizes = np.array([v[0] for v in vs])
    first = np.array([v[1] for v in vs])
    last = first + np.array([v[2] for v in vs])
    shared = np.array([v[3] for v in vs])
    off, size = host_offsets(sizes, first, last, shared)
    for i in range(len(vs)):
        assert 0 <= off[i] and off[i] + sizes[i] <= size
        for j in range(i):
            if not sizes[i] or not sizes[j]:
                continue
            mem = off[i] < off[j] + sizes[j] and off[j] < off[i] + sizes[i]
            li = (first[i], last[i]) if shared[i] else (-1, 99)
            lj = (first[j], last[j]) if shared[j] else (-1, 99)
            assert not (mem and li[0] <= lj[1] and lj[0] <= li[1])


def test_temporaries_share_storage_and_results_are_right():
    """A chain of elementwise ops: each temporary dies after the next op, so the host buffer is
    about two temporaries plus the pinned input and output, not the sum of all."""
    dev = poplar.IPUModel("ipu2").createDevice()
    g = poplar.Graph(dev.getTarget())
    n = 100_000
    x = g.addVariable(poplar.FLOAT, [n], "x")
    poputil.mapTensorLinearly(g, x)
    prog = program.Sequence()
    t = x
    for i in range(10):
        t = popops.add(g, t, float(i), prog, f"add{i}")
    out = g.addVariable(poplar.FLOAT, [n], "out")
    poputil.mapTensorLinearly(g, out)
    prog.add(program.Copy(t, out))
    g.createHostWrite("x", x)
    g.createHostRead("out", out)
    e = poplar.Engine(g, prog)
    e.load(dev)
    e.writeTensor("x", np.arange(n, dtype=np.float32))
    e.run(0)
    np.testing.assert_array_equal(e.readTensor("out"), np.arange(n, dtype=np.float32) + 45)
    held = e._storage.bufs["float"].numel()
    assert held <= 4 * n + 64, held              # x, out and two live temporaries
    assert sum(v.numel for v in g._state.spaces["float"].vars) >= 12 * n


def test_offline_prediction_matches_a_real_run_without_storage():
    """predict_run walks the steps without device memory and predicts the same cycles as a run."""
    def build():
        dev = poplar.IPUModel("ipu2").createDevice()
        g = poplar.Graph(dev.getTarget())
        x = g.addVariable(poplar.FLOAT, [50_000], "x")
        poputil.mapTensorLinearly(g, x)
        prog = program.Sequence()
        y = popops.exp(g, popops.add(g, x, 1.0, prog), prog)
        popops.addInPlace(g, x, y, prog)
        g.createHostWrite("x", x)
        return dev, g, program.Repeat(3, prog)
    dev, g, prog = build()
    e = poplar.Engine(g, prog)
    e.load(dev)
    e.writeTensor("x", np.zeros(50_000, np.float32))
    e.run(0)
    real = e.last_run_cycles
    dev2, g2, prog2 = build()
    off = poplar.Engine(g2, prog2)
    assert off._storage is None
    assert off.predict_run(0) == real > 0
    assert off._storage is None
