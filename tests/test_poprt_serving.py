"""PopRT serving: KServe v2 over HTTP (aiohttp) with dynamic batching, on the MLP of test_poprt_runtime."""

import asyncio

import numpy as np
import pytest

aiohttp = pytest.importorskip("aiohttp")

from openipu.poprt.serving import InferenceServer  # noqa: E402
from poprt.compiler import Compiler, CompilerOptions  # noqa: E402
from test_poprt_runtime import BATCH, D_IN, D_OUT, _mlp, _ref  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    m, w = _mlp()
    path = tmp_path_factory.mktemp("serve") / "mlp.popef"
    Compiler.compile_and_export(m, ["probs"], str(path), CompilerOptions())
    srv = InferenceServer(str(path), "mlp", max_queue_delay_us=200_000)
    port = srv.start_in_thread()
    yield srv, f"http://127.0.0.1:{port}", w
    srv.stop()


def _req(x, rid):
    return {"id": rid, "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}], "outputs": [{"name": "probs"}]}


async def _all(url, xs):
    async with aiohttp.ClientSession() as s:
        async def one(i, x):
            async with s.post(f"{url}/v2/models/mlp/infer", json=_req(x, str(i))) as r:
                return r.status, await r.json()
        return await asyncio.gather(*(one(i, x) for i, x in enumerate(xs)))


def test_metadata_and_health(server):
    srv, url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/v2/health/ready") as r:
                assert r.status == 200
            async with s.get(f"{url}/v2/models/mlp") as r:
                meta = await r.json()
            async with s.get(f"{url}/v2/models/other") as r:
                assert r.status == 404
            return meta
    meta = asyncio.run(go())
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, D_IN]}]
    assert meta["outputs"] == [{"name": "probs", "datatype": "FP32", "shape": [-1, D_OUT]}]
    assert meta["max_batch_size"] == BATCH


def test_concurrent_requests_are_batched_and_answered_right(server):
    srv, url, w = server
    before = dict(srv.stats)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1 + i % 2, D_IN)).astype(np.float32) for i in range(9)]
    res = asyncio.run(_all(url, xs))
    for i, (x, (status, body)) in enumerate(zip(xs, res)):
        assert status == 200, body
        assert body["id"] == str(i)
        (out,) = body["outputs"]
        assert out["shape"] == [x.shape[0], D_OUT] and out["datatype"] == "FP32"
        np.testing.assert_allclose(np.array(out["data"]).reshape(out["shape"]), _ref(x, w), rtol=1e-5, atol=1e-6)
    batches = srv.stats["batches"] - before["batches"]
    assert srv.stats["samples"] - before["samples"] == sum(x.shape[0] for x in xs)
    assert batches < len(xs)                        # dynamic batching grouped requests
    assert batches >= -(-sum(x.shape[0] for x in xs) // BATCH)


def test_bad_requests_get_400(server):
    _, url, _ = server
    bad = [{"inputs": [{"name": "y", "shape": [1, D_IN], "datatype": "FP32", "data": [0.0] * D_IN}]},
           {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0.0] * 3}]},
           {"inputs": [{"name": "x", "shape": [BATCH + 1, D_IN], "datatype": "FP32", "data": [0.0] * (BATCH + 1) * D_IN}]},
           {"inputs": [{"name": "x", "shape": [1, D_IN], "datatype": "FP32", "data": [0.0] * 5}]},
           {"nothing": 1}]

    async def go():
        async with aiohttp.ClientSession() as s:
            out = []
            for b in bad:
                async with s.post(f"{url}/v2/models/mlp/infer", json=b) as r:
                    out.append((r.status, await r.json()))
            return out
    for status, body in asyncio.run(go()):
        assert status == 400 and body["error"]


def test_server_command_refuses_a_corrupt_executable_in_one_line(tmp_path):
    """``python -m openipu.poprt.serving FILE``: a truncated file, a tampered byte (the SHA-256
    check of the executable format) or a missing file: one line on stderr and exit status 1."""
    import subprocess
    import sys
    import zipfile
    m, _ = _mlp()
    good = tmp_path / "mlp.popef"
    Compiler.compile_and_export(m, ["probs"], str(good), CompilerOptions())
    data = good.read_bytes()
    (tmp_path / "short.popef").write_bytes(data[: len(data) // 2])
    with zipfile.ZipFile(good) as z:
        info = z.getinfo("model.onnx")
        off = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size // 2
    b = bytearray(data)
    b[off] ^= 0xFF
    (tmp_path / "flipped.popef").write_bytes(bytes(b))
    for name, msg in [("short.popef", "truncated or corrupt"), ("flipped.popef", "Cannot load the executable"),
                      ("none.popef", "No executable file")]:
        p = subprocess.run([sys.executable, "-m", "openipu.poprt.serving", str(tmp_path / name), "--port", "0"],
                           capture_output=True, text=True)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1, p.stderr
        assert lines[0].startswith("poprt-serve: error:") and msg in lines[0], p.stderr
    p = subprocess.run([sys.executable, "-m", "openipu.poprt.serving", str(good), "--bogus"], capture_output=True,
                       text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
