"""``containsAliases`` of views made of several row-major dense pieces (the closed form
``regions._dense_pieces_alias``: overlapping address intervals, issue 34) against the general
path and against a count of the view's addresses, on random concatenations of slices."""

import numpy as np
import pytest

from openipu import poplar
from openipu.poplar import regions as R
from openipu.poplar.tensor import concat


def _graph():
    m = poplar.IPUModel("ipu2")
    m.tilesPerIPU = 4
    return poplar.Graph(m.createDevice().getTarget())


def _general(p):
    saved = R._dense_pieces_alias
    R._dense_pieces_alias = lambda p: None
    try:
        return R.pieces_alias(p)
    finally:
        R._dense_pieces_alias = saved


@pytest.mark.parametrize("seed", range(3))
def test_dense_pieces_alias_equals_the_general_path_and_the_addresses(seed):
    rng = np.random.default_rng(seed)
    answers = []
    for _ in range(60):
        g = _graph()
        vs = [g.addVariable(poplar.FLOAT, [int(rng.integers(1, 6)), 4], f"v{i}") for i in range(2)]
        parts = []
        for _ in range(int(rng.integers(2, 6))):
            v = vs[int(rng.integers(0, 2))]
            a = int(rng.integers(0, v.dim(0)))
            b = int(rng.integers(a, v.dim(0) + 1))          # some empty slices
            parts.append(v.slice(a, b, 0))
        if rng.random() < 0.2:
            parts.append(vs[0].slice(0, 1, 0).dimShuffle([1, 0]).reshape([1, 4]))    # a strided piece
        t = concat(parts, 0)
        p = t.pieces
        if len(p) < 2:
            continue
        fast = R._dense_pieces_alias(p)
        addr = t.flat_addresses()
        truth = np.unique(addr).size < addr.size
        assert R.pieces_alias(p) == truth == _general(p)
        if fast is not None:
            answers.append(fast)
    assert True in answers and False in answers


def test_pieces_out_of_form_take_the_general_path():
    g = _graph()
    v = g.addVariable(poplar.FLOAT, [4, 6], "v")
    t = concat([v.slice(0, 2, 0), v.slice(2, 4, 0)], 0).dimShuffle([1, 0])
    assert R._dense_pieces_alias(t.pieces) is None
    assert not t.containsAliases()
    assert concat([v, v], 0).containsAliases()
