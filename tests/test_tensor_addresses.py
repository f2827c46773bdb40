"""Tensor.addresses of many-piece views (the digits of only the dims some piece spans, scalar
sizes and strides where the pieces share them) against the element-by-element reference it
replaced, on random views: slices, transposes, reversals, sub-samples, broadcasts, reshapes and
concatenations of variables laid out in several pieces."""

import numpy as np

from openipu import poplar
from openipu.poplar import regions as R


def _reference(t):
    """Every dim's digit of every element, as the general path computed them before."""
    p, shape = t.pieces, t.shape()
    out = np.empty(shape, np.int64)
    if len(p) == 0:
        return out
    rep, local = R.group_ranks(p.numel())
    addr = p.addr[rep].copy()
    pos = np.zeros(local.size, np.int64)
    W = 1
    st = np.broadcast_to(p.st, p.sz.shape)
    sz, st, lo = p.sz[rep], st[rep], p.lo[rep]
    for i in range(len(shape) - 1, -1, -1):
        dig = local % sz[:, i]
        local //= sz[:, i]
        addr += dig * st[:, i]
        pos += (lo[:, i] + dig) * W
        W *= shape[i]
    out.reshape(-1)[pos] = addr
    return out


def _random_view(rng, g, vs):
    t = vs[int(rng.integers(len(vs)))]
    for _ in range(int(rng.integers(1, 5))):
        shape = t.shape()
        op = int(rng.integers(7))
        dim = int(rng.integers(len(shape))) if shape else 0
        if op == 0 and shape and shape[dim] > 1:
            b = int(rng.integers(shape[dim] - 1))
            t = t.slice(b, int(rng.integers(b + 1, shape[dim] + 1)), dim)
        elif op == 1 and len(shape) > 1:
            t = t.dimShuffle(list(rng.permutation(len(shape))))
        elif op == 2 and shape:
            t = t.reverse(dim)
        elif op == 3 and shape and shape[dim] > 1:
            t = t.subSample(int(rng.integers(1, 3)), dim)
        elif op == 4:
            t = poplar.concat([t, t.reverse(dim) if shape else t], dim) if shape else t
        elif op == 5 and shape:
            t = t.expand([dim]).broadcast(int(rng.integers(1, 4)), dim)
        elif op == 6:
            t = t.flatten()
    return t


def test_addresses_of_random_views_match_the_reference():
    rng = np.random.default_rng(11)
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = 8
    g = poplar.Graph(m.createDevice().getTarget())
    vs = [g.addVariable(poplar.FLOAT, list(s), f"v{i}") for i, s in enumerate([(4, 6), (3, 5, 2), (7,), (2, 3, 4, 2)])]
    for v in vs:
        g.setTileMapping(v, 0)
    vs.append(poplar.concat([vs[0].transpose(), vs[0][:, ::-1].transpose()], 1))   # many pieces
    vs.append(poplar.concat([vs[1][:, i:i + 1] for i in range(5)][::-1], 1))
    many = 0
    for _ in range(300):
        t = _random_view(rng, g, vs)
        many += len(t.pieces) > 1
        np.testing.assert_array_equal(t.addresses(), _reference(t))
    assert many > 100
