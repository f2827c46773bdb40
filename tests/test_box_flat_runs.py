"""regions.box_flat_runs (the per-element model's runs of flat indices of boxes) against every
box's flat indices listed one by one, on random shapes and boxes (whole trailing dims, single
rows, empty boxes)."""

import numpy as np

from openipu.poplar import regions as R


def _random_boxes(rng, shape, k):
    lo, sz = [], []
    for _ in range(k):
        a, b = [], []
        for n in shape:
            mode = rng.integers(4)
            if mode == 0:
                a.append(0), b.append(n)                          # whole dim
            elif mode == 1:
                x = int(rng.integers(n))
                a.append(x), b.append(1)
            else:
                x = int(rng.integers(n))
                a.append(x), b.append(int(rng.integers(0 if mode == 3 else 1, n - x + 1)))
        lo.append(a), sz.append(b)
    return np.array(lo, np.int64).reshape(k, len(shape)), np.array(sz, np.int64).reshape(k, len(shape))


def test_runs_list_each_boxs_flat_indices_in_order():
    rng = np.random.default_rng(3)
    for _ in range(300):
        shape = [int(x) for x in rng.integers(1, 6, int(rng.integers(1, 5)))]
        lo, sz = _random_boxes(rng, shape, int(rng.integers(1, 8)))
        owner, start, length = R.box_flat_runs(lo, sz, shape)
        got = [[] for _ in range(len(lo))]
        for o, s, n in zip(owner.tolist(), start.tolist(), length.tolist()):
            got[o] += list(range(s, s + n))
        idx = np.arange(int(np.prod(shape))).reshape(shape)
        for b in range(len(lo)):
            want = idx[tuple(slice(a, a + n) for a, n in zip(lo[b], sz[b]))].reshape(-1).tolist()
            assert got[b] == want, (shape, lo[b], sz[b])
        assert (length > 0).all() or (sz == 0).any()
