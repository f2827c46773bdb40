"""ArgMax / ArgMin through popnn (PopART's ArgExtremaOpx): same indices as the onnx_ops kernel
(INT32, PopART's type), first index on ties, and the reduction stays where the input lives; the
generic lowering (select_last_index) read the whole input on the few tiles of its small output."""

import numpy as np
import pytest

from lowering_harness import reference, run_node


@pytest.fixture(autouse=True)
def _device_emulation(monkeypatch):
    monkeypatch.setenv("OPENIPU_EXECUTION", "device")


RNG = np.random.default_rng(11)


def _check(op, x, attrs, precise=True, tiles=16):
    want = reference(op, {"x": x}, attrs)          # INT64 as ONNX declares it
    got, s, node = run_node(op, {"x": x}, attrs, out_values=want, tiles=tiles)
    assert node.lowering == ("precise" if precise else "generic")
    np.testing.assert_array_equal(np.asarray(got[0]).reshape(want[0].shape), want[0])
    return s


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int32])
def test_arg_extrema_axes_keepdims(op, dt):
    x = (RNG.standard_normal((3, 5, 7)) * 50).astype(dt)
    x[1, :, 2] = x[1, 0, 2]                  # ties along axis 1: the first index
    for axis in (0, 1, 2, -1):
        for keep in (0, 1):
            _check(op, x, {"axis": axis, "keepdims": keep})
    _check(op, x[0, 0], {})                  # rank 1, default axis 0, keepdims 1


def test_select_last_index_stays_generic():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], np.float32)
    _check("ArgMax", x, {"axis": 1, "select_last_index": 1}, precise=False)


def test_argmax_of_logits_does_not_gather_them_on_few_tiles():
    """GPT-2's accuracy takes the argmax of [128, vocab] half logits. PopLibs reduces each row
    where it lives; the generic lowering's linearly mapped [128] output sits on a few tiles,
    which received all the logits (1.3 MB a tile for GPT-2's vocabulary of 20256)."""
    x = RNG.standard_normal((128, 2048)).astype(np.float16)
    tiles = 64
    per_tile_input = x.nbytes / tiles          # 8 KiB: the input spread over the tiles
    s = _check("ArgMax", x, {"axis": 1, "keepdims": 0}, tiles=tiles)
    worst = s._engine.memory.worst_tiles(1)[0][1]
    assert worst < 4 * per_tile_input, worst
    s = _check("ArgMax", x, {"axis": 1, "keepdims": 0, "select_last_index": 1}, precise=False, tiles=tiles)
    assert s._engine.memory.worst_tiles(1)[0][1] > 16 * per_tile_input     # the generic layout
