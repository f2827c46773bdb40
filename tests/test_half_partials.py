"""Half partial sums of fp16 matmuls on the IR executor (openipu.popart.half_partials) against
the device emulation (OPENIPU_EXECUTION=device) and a numpy reference of poplin's blocked sum.

The inputs make the tile partial sums large and of opposite signs (the first half of the
contraction adds about +1 per product, the second half about -1), so that rounding each partial
sum to half loses many ulps of the small final result: float partials and half partials differ
on most elements."""

import numpy as np
import pytest
import torch

import popart
from openipu.popart import half_partials

M, K, N = 8, 2048, 8


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    a = (1 + rng.random((M, K)) / 8).astype(np.float16)
    sign = np.where(np.arange(K) < K // 2, 1.0, -1.0)[:, None]
    b = (sign + rng.random((K, N)) / 64).astype(np.float16)
    return a, b


def _half_reference(a, b, block):
    """poplin's half partials: each block of ``block`` products summed exactly and rounded to
    half, the half partial sums added and rounded to half."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    parts = [(a[:, i:i + block] @ b[i:i + block]).astype(np.float16) for i in range(0, a.shape[1], block)]
    return np.sum(np.stack(parts).astype(np.float64), axis=0).astype(np.float16)


def _session(monkeypatch, mode, how, gemm=False):
    monkeypatch.setenv("OPENIPU_EXECUTION", mode)
    a, b = _inputs()
    bld = popart.Builder()
    x = bld.addInputTensor(popart.TensorInfo("FLOAT16", [M, K]))
    w = bld.addInitializedInputTensor(b)
    if gemm:
        c = bld.addInitializedInputTensor(np.full((N,), 0.5, np.float16))
        y = bld.aiOnnx.gemm([x, w, c], alpha=0.5, beta=2.0)
    else:
        y = bld.aiOnnx.matmul([x, w])
    opts = popart.SessionOptions()
    if how == "session":
        opts.partialsTypeMatMuls = "half"
    elif how == "annotation":
        bld.setPartialsType(y, "HALF")
    elif how == "matmulOptions":
        opts.matmulOptions = {"partialsType": "half"}
    dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 1, "tilesPerIPU": 64})
    s = popart.InferenceSession(bld.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}), dev,
                                userOptions=opts)
    s.prepareDevice()
    anchors = s.initAnchorArrays()
    s.run(popart.PyStepIO({x: a}, anchors))
    return anchors[y], _block(dev.getTarget())


def _block(target):
    """The contraction block of poplin's plan for the test's [M, K] x [K, N] half matmul."""
    from openipu import poplar
    from openipu.poplibs.poplin.plan import plan_matmul
    plan = plan_matmul(1, M, K, N, poplar.HALF, target, {"partialsType": "half"})
    return -(-K // plan.in_chan_split)


@pytest.mark.parametrize("how", ["session", "annotation", "matmulOptions"])
def test_half_partials_matmul_follows_the_plan(monkeypatch, how):
    ir, block = _session(monkeypatch, "ir", how)
    dev, _ = _session(monkeypatch, "device", how)
    assert block is not None and block < K        # the plan splits the contraction over tiles
    a, b = _inputs()
    ref = _half_reference(a, b, block)
    exact = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    assert np.mean(ref != exact) > 0.5            # the inputs discriminate half from float partials
    assert np.mean(dev == ref) > 0.95             # the device emulation is the blocked half sum
    # the executor matches both (ties of float32 vs float64 block sums aside)
    assert np.mean(ir == dev) > 0.95
    assert np.abs(ir.astype(np.float64) - dev).max() <= 2 * np.abs(np.spacing(dev)).max()


def test_float_partials_keep_one_rounding(monkeypatch):
    ir, _ = _session(monkeypatch, "ir", "none")
    a, b = _inputs()
    exact = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    assert np.mean(ir == exact) > 0.95


def test_half_partials_gemm(monkeypatch):
    ir, block = _session(monkeypatch, "ir", "session", gemm=True)
    dev, _ = _session(monkeypatch, "device", "session", gemm=True)
    a, b = _inputs()
    mm = _half_reference(a, b, block).astype(np.float64)
    ref = ((mm * 0.5).astype(np.float16).astype(np.float64) + np.float16(1.0)).astype(np.float16)
    assert np.mean(dev == ref) > 0.95
    assert np.mean(ir == dev) > 0.95


def test_blocked_matmul_broadcasts_and_promotes():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 1, 5, 40, generator=g).half()
    b = torch.randn(2, 40, 6, generator=g).half()
    y = half_partials.matmul(a, b, 16)            # 40 = 16 + 16 + 8 (the last block padded)
    assert y.dtype == torch.float16 and y.shape == (3, 2, 5, 6)
    blocks = [(a.double()[..., i:i + 16] @ b.double()[..., i:i + 16, :]).half() for i in (0, 16, 32)]
    ref = sum(p.double() for p in blocks).half()
    assert (y == ref).float().mean() > 0.95
    v = torch.randn(40, generator=g).half()
    assert half_partials.matmul(v, b[0], 16).shape == (6,)
    assert half_partials.matmul(a[0, 0], v, 16).shape == (5,)
    assert torch.equal(half_partials.matmul(a[0, 0], b[0], 64), (a[0, 0].float() @ b[0].float()).half())


def test_poptorch_set_partials_type_half(monkeypatch):
    """PopTorch's ``Precision.setPartialsType(torch.half)`` reaches the executor's matmuls."""
    import poptorch
    a, b = _inputs()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor(b))

        def forward(self, x):
            return x @ self.w

    out = {}
    for mode in ("ir", "device"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        opts = poptorch.Options()
        opts.Precision.setPartialsType(torch.half)
        out[mode] = poptorch.inferenceModel(Model().half(), opts)(torch.tensor(a)).numpy()
    exact = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    assert np.mean(out["device"] != exact) > 0.5
    assert np.mean(out["ir"] == out["device"]) > 0.95


def test_half_partials_replicated(monkeypatch):
    """Each replica's plan is for the replica's tiles (the replicated graph's target)."""
    a, b = _inputs()
    out = {}
    for mode in ("ir", "device"):
        monkeypatch.setenv("OPENIPU_EXECUTION", mode)
        bld = popart.Builder()
        x = bld.addInputTensor(popart.TensorInfo("FLOAT16", [M, K]))
        y = bld.aiOnnx.matmul([x, bld.addInitializedInputTensor(b)])
        opts = popart.SessionOptions()
        opts.partialsTypeMatMuls = "half"
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = 2
        dev = popart.DeviceManager().createIpuModelDevice({"numIPUs": 2, "tilesPerIPU": 64})
        s = popart.InferenceSession(bld.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}), dev,
                                    userOptions=opts)
        s.prepareDevice()
        anchors = s.initAnchorArrays()
        s.run(popart.PyStepIO({x: np.stack([a, a])}, anchors))
        out[mode] = anchors[y]
    ref = _half_reference(a, b, _block(popart.DeviceManager().createIpuModelDevice(
        {"numIPUs": 1, "tilesPerIPU": 64}).getTarget()))
    assert np.mean(out["ir"][0] == ref) > 0.95
    assert np.mean(out["ir"] == out["device"]) > 0.95


def _whole_problem_reference(a, b, block, chunk_bytes):
    """The blocked half sum as the executor computed it before the tiled version (2026-11-29):
    the whole problem at once, groups of ``chunk_bytes / (4 * outputs)`` blocks as batched
    matmuls, each group's half products summed by ``torch.sum``, the group sums added."""
    a, b = a.float(), b.float()
    k = a.shape[-1]
    nb = -(-k // block)
    if nb * block > k:
        a = torch.nn.functional.pad(a, (0, nb * block - k))
        b = torch.nn.functional.pad(b, (0, 0, 0, nb * block - k))
    ab = a.unflatten(-1, (nb, block)).movedim(-2, -3)
    bb = b.unflatten(-2, (nb, block))
    out = torch.broadcast_shapes(a.shape[:-1], b.shape[:-2] + (1,)).numel() * b.shape[-1]
    step = max(1, chunk_bytes // (4 * out))
    y = None
    for i in range(0, nb, step):
        if step == 1:
            p = torch.matmul(a[..., i * block:(i + 1) * block], b[..., i * block:(i + 1) * block, :]).half().float()
        else:
            p = torch.matmul(ab[..., i:i + step, :, :], bb[..., i:i + step, :, :]).half()
            p = p.sum(dim=-3, dtype=torch.float32)
        y = p if y is None else y.add_(p)
    return y.half()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chunk_blocks", [1, 2, 64])     # blocks per group: one, groups of 2, all
def test_tiled_blocked_matmul_is_bit_identical(monkeypatch, threads, chunk_blocks):
    """The tiled half-partials matmul (tiles of outputs in cache, shared among host threads)
    gives the same bits as the whole-problem formulation, on inputs whose partial sums span a
    wide exponent range and both signs (so that the order of the sums matters)."""
    g = torch.Generator().manual_seed(chunk_blocks)

    def wide(*shape):
        return (torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 6, shape, generator=g).float())).half()
    monkeypatch.setattr(half_partials, "TILE_ELEMENTS", 1 << 12)
    monkeypatch.setattr(half_partials, "TILE_ROWS", 24)
    tiled = []
    real = half_partials._tiled
    monkeypatch.setattr(half_partials, "_tiled", lambda *args: tiled.append(1) or real(*args))
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cases = [(wide(3, 130, 200), wide(200, 64), 48),                          # 2-D b, padded last block
                 (wide(260, 96), wide(96, 80), 16),                               # 2-D a and b
                 (wide(2, 3, 70, 96), wide(2, 3, 96, 48), 32),                    # batched
                 (wide(2, 3, 70, 96), wide(2, 96, 3, 48).permute(0, 2, 1, 3), 40)]   # b a permuted view, padded
        # planted rows whose four block sums (2048, 1, 2**-13, 2**-13) round differently by the order
        # of the float32 sums: sequential 2048, in groups of two 2050 (the test discriminates)
        a, b = wide(300, 64), wide(64, 32)
        a[::7] = 0
        a[::7, 0:64:16] = torch.tensor([2048, 1, 2 ** -13, 2 ** -13], dtype=torch.float16)
        b[0:64:16, 0] = 1
        cases.append((a, b, 16))
        first = {1: 2048.0, 2: 2050.0, 64: 2048.0}[chunk_blocks]
        for a, b, block in cases:
            out = torch.broadcast_shapes(a.shape[:-1], b.shape[:-2] + (1,)).numel() * b.shape[-1]
            chunk = 4 * out * chunk_blocks
            monkeypatch.setattr(half_partials, "CHUNK_BYTES", chunk)
            got = half_partials.matmul(a, b, block)
            ref = _whole_problem_reference(a, b, block, chunk)
            assert got.shape == ref.shape and got.dtype == torch.float16
            assert torch.equal(got.view(torch.int16), ref.view(torch.int16)), (a.shape, b.shape, block)
        assert float(got[0, 0]) == first and bool((got[::7, 0] == first).all())
        assert len(tiled) == len(cases)           # every case took the tiled path
    finally:
        torch.set_num_threads(old)
