"""Tensor views against numpy: every view reads and writes the same storage as its source."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from openipu import poplar
from openipu.poplar import program


def _setup(shape, type_=poplar.FLOAT):
    dev = poplar.IPUModel().createDevice()
    g = poplar.Graph(dev.getTarget())
    v = g.addVariable(type_, shape, "v")
    g.setTileMapping(v, np.arange(int(np.prod(shape))) % 7)
    return dev, g, v


def _read_view(shape, make_view):
    """Values of ``make_view(v)`` after v = arange, read through a copy program and a host handle."""
    dev, g, v = _setup(shape)
    view = make_view(v)
    out = g.addVariable(poplar.FLOAT, view.shape(), "out")
    g.setTileMapping(out, 3)
    g.createHostWrite("v", v)
    g.createHostRead("out", out)
    e = poplar.Engine(g, program.Copy(view, out))
    e.load(dev)
    e.writeTensor("v", np.arange(int(np.prod(shape)), dtype=np.float32))
    e.run()
    return e.readTensor("out")


REF = np.arange(60, dtype=np.float32).reshape(3, 4, 5)


@pytest.mark.parametrize("view,ref", [
    (lambda t: t.slice(1, 3, 1), REF[:, 1:3]),
    (lambda t: t.slice([0, 1, 2], [2, 3, 5]), REF[0:2, 1:3, 2:5]),
    (lambda t: t[2], REF[2]),
    (lambda t: t.index([1, 2]), REF[1, 2]),
    (lambda t: t.dimShuffle([2, 0, 1]), REF.transpose(2, 0, 1)),
    (lambda t: t.reshape([12, 5]), REF.reshape(12, 5)),
    (lambda t: t.flatten(), REF.reshape(-1)),
    (lambda t: t.flatten(1, 3), REF.reshape(3, 20)),
    (lambda t: t.reverse(1), REF[:, ::-1]),
    (lambda t: t.subSample(2, 2), REF[:, :, ::2]),
    (lambda t: t.slice(0, 1, 0).broadcast(3, 0), np.broadcast_to(REF[0:1], (3, 4, 5))),
    (lambda t: t.broadcast(2, 1), np.tile(REF, (1, 2, 1))),
    (lambda t: t.expand([0, 2]), REF.reshape(1, 3, 4, 1, 5)),
    (lambda t: t.slice(0, 1, 0).squeeze([0]), REF[0]),
    (lambda t: t.dimRoll(2, 0), np.moveaxis(REF, 2, 0)),
    (lambda t: poplar.concat([t[0], t[2]], 1), np.concatenate([REF[0], REF[2]], 1)),
    (lambda t: poplar.append(t[0], t[1][0], 0), np.concatenate([REF[0], REF[1][0:1]], 0)),
    (lambda t: t.upsample(2, 0), np.repeat(REF, 2, 0)),
])
def test_views_match_numpy(view, ref):
    np.testing.assert_array_equal(_read_view([3, 4, 5], view).reshape(ref.shape), ref)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_random_view_chains(shape, data):
    ref = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    ops = []
    for _ in range(data.draw(st.integers(1, 3))):
        d = data.draw(st.integers(0, len(ref.shape) - 1))
        kind = data.draw(st.sampled_from(["reverse", "slice", "perm", "sub"]))
        n = ref.shape[d]
        if kind == "reverse":
            ops.append(lambda t, d=d: t.reverse(d)); ref = np.flip(ref, d)
        elif kind == "slice":
            b = data.draw(st.integers(0, n - 1)); e = data.draw(st.integers(b + 1, n))
            ops.append(lambda t, d=d, b=b, e=e: t.slice(b, e, d)); ref = np.take(ref, range(b, e), d)
        elif kind == "perm":
            perm = data.draw(st.permutations(range(ref.ndim)))
            ops.append(lambda t, p=perm: t.dimShuffle(p)); ref = ref.transpose(perm)
        else:
            s = data.draw(st.integers(1, 3))
            ops.append(lambda t, d=d, s=s: t.subSample(s, d)); ref = np.take(ref, range(0, n, s), d)

    def chain(t):
        for op in ops:
            t = op(t)
        return t
    np.testing.assert_array_equal(_read_view(shape, chain).reshape(ref.shape), ref)


def test_views_alias_storage_and_queries():
    dev, g, v = _setup([4, 4])
    t = v.transpose()
    assert not t.isContiguous() and v.isContiguous()
    assert v.slice(0, 2).intersectsWith(v.slice(1, 3)) and not v.slice(0, 2).intersectsWith(v.slice(2, 4))
    assert v.slice(0, 1).broadcast(3, 0).containsAliases()
    regions = v.slice(1, 3, 1).getContiguousRegions()
    assert [(r.begin(), r.end()) for r in regions] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    var, iv = v[2].getVarRegions()[0]
    assert var.name == "v" and (iv.begin(), iv.end()) == (8, 12)
    mapping = g.getTileMapping(v[0])
    assert [(i.begin(), i.end()) for i in mapping[0]] == [(0, 1)] and mapping[3][0].begin() == 3


def test_reinterpret_reads_bits():
    dev, g, v = _setup([2])
    g.createHostWrite("v", v)
    i = g.addVariable(poplar.INT, [2], "i")
    g.setTileMapping(i, 0)
    g.createHostRead("i", i)
    e = poplar.Engine(g, program.Copy(v.reinterpret(poplar.INT), i))
    e.load(dev)
    e.writeTensor("v", np.array([1.0, -2.0], np.float32))
    e.run()
    np.testing.assert_array_equal(e.readTensor("i"), np.array([1.0, -2.0], np.float32).view(np.int32))


def test_bad_views_raise():
    _, g, v = _setup([3, 4])
    with pytest.raises(poplar.index_error):
        v.slice(2, 5, 1)
    with pytest.raises(poplar.tensor_creation_error):
        v.reshape([5, 2])
    with pytest.raises(poplar.tensor_creation_error):
        v.dimShuffle([0, 0])
    with pytest.raises(poplar.tensor_creation_error):
        v.reinterpret(poplar.HALF)
    with pytest.raises(poplar.tensor_creation_error):
        poplar.concat([v, v.reshape([4, 3])], 0)


def test_same_view():
    """``same_view``: the same elements in the same order, by structure (pieces), not by element."""
    _, g, v = _setup([4, 6])
    w = g.addVariable(poplar.FLOAT, [4, 6], "w")
    g.setTileMapping(w, 0)
    assert v.slice(1, 3).same_view(v.slice(1, 3)) and v.same_view(v)
    assert v.dimShuffle([1, 0]).same_view(v.transpose())
    cat = poplar.concat([v.slice(0, 2), w.slice(2, 4)])
    assert cat.same_view(poplar.concat([v.slice(0, 2), w.slice(2, 4)]))        # many pieces
    assert not cat.same_view(poplar.concat([v.slice(0, 2), v.slice(2, 4)]))
    assert not v.slice(1, 3).same_view(v.slice(2, 4))                          # other elements
    assert not v.same_view(w)                                                  # other variable
    assert not v.slice(0, 2).same_view(v.slice(0, 2).reverse(0))               # other order
    assert not v.flatten().same_view(v)                                        # other shape
    assert not v.same_view(v.reinterpret(poplar.INT))                          # other type
    _, g2, v2 = _setup([4, 6])
    assert not v.same_view(v2)                                                 # other graph
