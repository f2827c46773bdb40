"""memory._tile_peaks in one block (the byte change per half-step and per IPU taken from the
table's sums over tiles) against the blocked path (events summed per block of tiles, the
changes summed from the events), on random allocation chunks."""

import numpy as np

from openipu.poplar import memory as M


def _chunks(rng, T, H, n):
    out = []
    for _ in range(int(rng.integers(1, 5))):
        k = int(rng.integers(1, n))
        tiles = rng.integers(0, T, k)
        alloc = 2 * rng.integers(0, H // 2, k) + 1             # odd half-steps
        free = np.minimum(alloc + 1 + 2 * rng.integers(0, H // 2, k), H - 1)
        free += (free % 2)                                     # even half-steps
        free = np.minimum(free, H - 1 - ((H - 1) % 2))
        out.append((tiles, alloc, free, rng.integers(1, 1 << 20, k).astype(np.float64)))
    return out


def test_one_block_equals_the_blocked_tables(monkeypatch):
    rng = np.random.default_rng(5)
    for _ in range(40):
        ipus, tpi = int(rng.integers(1, 4)), int(rng.integers(1, 40))
        T, H = ipus * tpi, 2 * int(rng.integers(2, 30)) + 3
        chunks = _chunks(rng, T, H, 400)
        one = M._tile_peaks(chunks, T, H, ipus, tpi)
        with monkeypatch.context() as m:
            m.setattr(M, "PEAK_TABLE_CELLS", H * max(1, T // 3))        # three blocks or more
            m.setattr(M, "EVENT_BATCH", 97)
            blocked = M._tile_peaks(chunks, T, H, ipus, tpi)
        for a, b in zip(one, blocked):
            np.testing.assert_array_equal(a, b)
        assert one[0].any() and one[2].shape == (ipus, H)
        plain = M._tile_peaks(chunks, T, H)
        np.testing.assert_array_equal(plain[0], one[0])
        np.testing.assert_array_equal(plain[1], one[1])
