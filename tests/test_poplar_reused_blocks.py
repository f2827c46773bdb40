"""A program met again in a program tree (a ``Sequence`` added to several parents, a function
called again) is compiled once: its steps are laid out the first time and the control tree runs
them again. Each occurrence runs, is counted and traced; the memory plan stays safe: a variable
of the block never shares storage with one that is live during any of its occurrences."""

import numpy as np

from openipu import poplar
from openipu.poplar import program as P
from openipu.poplibs import popops, poputil
from openipu.poplibs.popops import expr as pe

N = 64


def _engine(order):
    """``out = 0``, then the programs named in ``order`` ('B': tmp = 3 a, out += tmp; 'W': w = a
    + 1; 'R': out += w) in sequence, with one Sequence object ``B`` met as often as it is named.
    Returns the engine and the steps of B."""
    dev = poplar.IPUModel().createDevice()
    g = poplar.Graph(dev.getTarget())
    a, out, tmp, w = (g.addVariable(poplar.FLOAT, [N], n) for n in ("a", "out", "tmp", "w"))
    for t in (a, out, tmp, w):
        poputil.mapTensorLinearly(g, t, 1, 1)
    g.createHostWrite("a", a)
    g.createHostRead("out", out)
    blk = P.Sequence(name="B")
    blk.add(P.Copy(a, tmp))
    popops.mapInPlace(g, pe.Mul(pe._1, pe.Const(3.0)), [tmp], blk, "triple")
    popops.mapInPlace(g, pe.Add(pe._1, pe._2), [out, tmp], blk, "accumulate")
    defw = P.Sequence(P.Copy(a, w))
    popops.mapInPlace(g, pe.Add(pe._1, pe.Const(1.0)), [w], defw, "w")
    readw = P.Sequence()
    popops.mapInPlace(g, pe.Add(pe._1, pe._2), [out, w], readw, "readw")
    prog = P.Sequence()
    popops.zero(g, out, prog, "zero")
    for c in order:
        prog.add({"B": blk, "W": defw, "R": readw}[c])
    e = poplar.Engine(g, prog)
    e.load(dev)
    return e


def _run(e):
    x = np.arange(N, dtype=np.float32) / 7
    e.writeTensor("a", x)
    e.run(0)
    return x, e.readTensor("out")


def test_a_sequence_met_again_is_laid_out_once_and_runs_each_time():
    once, thrice = _engine("B"), _engine("BBB")
    n1, n3 = (len(e._compiled.compiler.steps) for e in (once, thrice))
    assert n3 == n1
    x, out = _run(thrice)
    np.testing.assert_allclose(out, 9 * x, rtol=1e-6)
    # each occurrence is counted and traced
    steps = thrice._compiled.compiler.steps
    block = np.flatnonzero(thrice._counts == 3)
    assert {steps[i].name for i in block} >= {"triple", "accumulate"}, [steps[i].name for i in block]
    traced = [i for i, _ in thrice._runs[-1]["trace"]]
    assert all(traced.count(i) == 3 for i in block)
    # and predicted: two more occurrences cost two more of the block's steps (one IPU)
    _run(once)
    per_block = sum(float(steps[i].total.max()) for i in block)
    assert thrice.last_run_cycles - once.last_run_cycles == round(2 * per_block)


def test_a_variable_of_a_reused_block_never_shares_storage_with_one_live_over_a_later_occurrence():
    """``tmp`` belongs to B; ``w`` is made after B's first occurrence and read after its second:
    sharing their storage (right for B's first occurrence alone) would make B's second occurrence
    overwrite ``w``."""
    e = _engine("BWBR")
    x, out = _run(e)
    np.testing.assert_allclose(out, 3 * x + 3 * x + x + 1, rtol=1e-6)
    space_name, space = next((k, s) for k, s in e.graph._state.spaces.items() if any(v.name == "tmp" for v in s.vars))
    off = e._compiled.memory.host_layout[space_name][0]
    idx = {v.name: i for i, v in enumerate(space.vars)}
    t0, w0 = int(off[idx["tmp"]]), int(off[idx["w"]])
    assert t0 + N <= w0 or w0 + N <= t0, (t0, w0)


def _shared_engine(calls: int, shared: int = 24, tiles: int = 4):
    """``shared`` variables ``x_i`` (spread over ``tiles`` tiles) written once, then a Sequence
    ``B`` (``out += x_i`` for each i) met ``calls`` times: every ``x_i`` is live over all of B's
    occurrences, shared between B and the rest of the program."""
    dev = poplar.IPUModel().createDevice()
    g = poplar.Graph(dev.getTarget())
    n = 16 * tiles
    a, out = g.addVariable(poplar.FLOAT, [n], "a"), g.addVariable(poplar.FLOAT, [n], "out")
    xs = [g.addVariable(poplar.FLOAT, [n], f"x{i}") for i in range(shared)]
    for t in [a, out, *xs]:
        poputil.mapTensorLinearly(g, t, 16, 16)
    g.createHostWrite("a", a)
    g.createHostRead("out", out)
    prog = P.Sequence()
    popops.zero(g, out, prog, "zero")
    for i, x in enumerate(xs):
        prog.add(P.Copy(a, x))
        popops.mapInPlace(g, pe.Add(pe._1, pe.Const(float(i))), [x], prog, f"def{i}")
    blk = P.Sequence(name="B")
    for x in xs:
        popops.mapInPlace(g, pe.Add(pe._1, pe._2), [out, x], blk, "acc")
    for _ in range(calls):
        prog.add(blk)
    e = poplar.Engine(g, prog)
    e.load(dev)
    return e


def test_memory_plan_events_grow_with_tiles_per_occurrence_not_with_the_blocks_variables():
    """A re-occurrence of a block takes the variables it shares with the rest of the program out of
    the timeline per tile, and holds the block's peak per tile: at most two allocations per tile it
    uses, however many variables (and runs of them) the block touches."""
    tiles, shared = 4, 24
    e2, e6 = _shared_engine(2, shared, tiles), _shared_engine(6, shared, tiles)
    m2, m6 = e2._compiled.memory, e6._compiled.memory
    assert len(e2._compiled.compiler.steps) == len(e6._compiled.compiler.steps)
    per_occurrence = (m6.num_events - m2.num_events) / 4
    assert 0 < per_occurrence <= 2 * tiles, per_occurrence      # was one per run: shared * tiles + tiles
    # and the variables' plan is the same (control code is not: a Sequence met again is code
    # again): every x_i is live through all the occurrences, on each of its tiles
    for m in (m2, m6):
        assert np.array_equal(m.categories["Variables"], m2.categories["Variables"])
        np.testing.assert_array_equal(m.not_always_live_peak[:tiles], shared * 16 * 4)
    x = np.arange(16 * tiles, dtype=np.float32)
    e6.writeTensor("a", x)
    e6.run(0)
    np.testing.assert_allclose(e6.readTensor("out"), 6 * (shared * x + sum(range(shared))), rtol=1e-6)
