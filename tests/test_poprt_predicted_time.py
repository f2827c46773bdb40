"""PopRT runtime in predicted-time mode (``RuntimeConfig(timing="predicted")`` /
``OPENIPU_TIMING=predicted``): calls take the predicted IPU time instead of computing outputs, so a
harness that measures wall time (Byte MLPerf's benchmark loop) measures the prediction.

The device model's schedule is checked exactly (start times on the modelled device, the callers'
modelled clocks); the wall-clock checks run in slow motion (``time_scale``) so that a loaded host's
scheduling delays stay small against the modelled times, and bound the measurement from the side
the model guarantees."""

import threading
import time

import numpy as np
import pytest
from test_poprt_runtime import BATCH, D_IN, D_OUT, _mlp

from poprt import runtime
from poprt.compiler import Compiler, CompilerOptions

from openipu.poprt.runtime._timing import PredictedDevice


@pytest.fixture(scope="module")
def exe():
    m, _w = _mlp()
    opts = CompilerOptions()
    opts.ipu_version = "ipu21"
    return Compiler.compile(m.SerializeToString(), ["probs"], opts)


@pytest.fixture(scope="module")
def exe_io_tiles():
    """The same model with 32 I/O tiles and 8 batches per step: overlapped I/O, so the batch period
    is shorter than the latency."""
    m, _w = _mlp()
    opts = CompilerOptions()
    opts.ipu_version = "ipu21"
    opts.num_io_tiles = 32
    opts.batches_per_step = 8
    return Compiler.compile(m.SerializeToString(), ["probs"], opts)


def test_device_model_schedule_is_the_predicted_pipeline():
    """Batches queued together start one period apart and complete one latency after their start;
    a batch that arrives when the device is idle starts at once."""
    dev = PredictedDevice(latency_s=0.25, period_s=0.1, time_scale=1.0)
    try:
        subs = [dev.submit({"i": i}) for i in range(4)]
        starts = [s for _f, s in subs]
        gaps = np.diff(starts)
        np.testing.assert_allclose(gaps, 0.1, rtol=0, atol=1e-9)   # virtual schedule, not wall time
        assert dev.busy_until == pytest.approx(starts[-1] + 0.25)
        outs = [f.result(timeout=30) for f, _s in subs]
        assert [o["i"] for o in outs] == [0, 1, 2, 3]
        # the last completion cannot come before its predicted instant
        assert time.perf_counter() >= starts[-1] + 0.25
        time.sleep(0.2)                           # the device is idle again: no queueing
        t = time.perf_counter()
        _f, s = dev.submit(None)
        assert s >= t and s - t < 0.05
    finally:
        dev.close()
    with pytest.raises(ValueError):
        PredictedDevice(1.0, 1.0, time_scale=0)


def test_device_model_fills_the_gaps_of_batches_submitted_late():
    """A batch that arrived earlier on the modelled clock than one already queued (its thread
    was late on this machine) takes the idle period that one left, not a place after it."""
    dev = PredictedDevice(latency_s=0.2, period_s=0.1)
    try:
        t0 = time.perf_counter()
        _f, sx = dev.submit(None, arrival=t0 - 0.5)
        _f, sy = dev.submit(None, arrival=t0)            # leaves the device idle from t0 - 0.4 to t0
        fz, sz = dev.submit(None, arrival=t0 - 0.3)
        _f, sw = dev.submit(None, arrival=t0 - 0.35)     # [t0 - 0.4, t0 - 0.3) is too short from t0 - 0.35
        assert (sx, sy, sz, sw) == pytest.approx((t0 - 0.5, t0, t0 - 0.3, t0 - 0.2), abs=1e-9)
        assert fz.done() and fz.completes == pytest.approx(t0 - 0.1, abs=1e-9)   # completed when modelled: at once
        _f, sv = dev.submit(None, arrival=t0 - 0.05)     # no gap left: after the last batch
        assert sv == pytest.approx(t0 + 0.1, abs=1e-9)
    finally:
        dev.close()


def test_a_threads_modelled_clock_counts_its_cpu_time_not_its_waits():
    """A caller's next call arrives at its previous modelled completion plus the CPU time it used
    since: a return the simulator delivered late does not idle the modelled device."""
    dev = PredictedDevice(latency_s=0.2, period_s=0.1)
    try:
        assert dev.arrival() == pytest.approx(time.perf_counter(), abs=0.05)   # no call yet: now
        t0 = time.perf_counter()
        dev.returned(t0 - 0.3)             # its last call completed 0.3 s ago on the modelled clock
        time.sleep(0.2)                    # a wait (the simulator's late wake-up): not the host's work
        c0 = time.thread_time()
        while time.thread_time() - c0 < 0.02:
            pass                           # 20 ms of CPU: the caller's own work
        a = dev.arrival()
        assert t0 - 0.3 + 0.02 <= a < t0 - 0.3 + 0.1
        f, s = dev.submit(None, a)
        assert s == pytest.approx(a) and f.done()          # its completion (a + 0.2) has passed
    finally:
        dev.close()


def test_runner_in_predicted_time_mode_computes_nothing(exe):
    r = runtime.Runner(exe, runtime.RuntimeConfig(timing="predicted"))
    try:
        assert r.timing == "predicted" and not hasattr(r, "_engine")
        x = np.ones((BATCH, D_IN), np.float32)
        out = np.full((BATCH, D_OUT), 7.0, np.float32)
        ret = r.execute({"x": x}, {"probs": out})
        assert ret["probs"] is out and not out.any()          # zeros: outputs are not computed
        fresh = r.execute({"x": x})
        assert fresh["probs"].shape == (BATCH, D_OUT) and fresh["probs"].dtype == np.float32
        assert r.execute_async({"x": x}).get(timeout=30)["probs"].shape == (BATCH, D_OUT)
        # the call contract is checked as in host mode
        with pytest.raises(runtime.PopRTRuntimeError, match="missing"):
            r.execute({"y": x})
        text = r.report()
        assert "predicted-time mode" in text and "ipu21, batch 4" in text and "3 executes" in text
        assert r.host_stats()["executes"] == 3
    finally:
        r.close()


def test_timing_from_the_environment(monkeypatch, exe):
    monkeypatch.setenv("OPENIPU_TIMING", "predicted")
    assert runtime.RuntimeConfig().timing == "predicted"
    r = runtime.Runner(exe)                     # no config: the environment's default
    assert r.timing == "predicted"
    r.close()
    monkeypatch.setenv("OPENIPU_TIMING", "Host")
    assert runtime.RuntimeConfig().timing == "host"
    monkeypatch.setenv("OPENIPU_TIMING", "fast")
    with pytest.raises(ValueError, match="OPENIPU_TIMING='fast': expected one of host, predicted"):
        runtime.RuntimeConfig()
    monkeypatch.delenv("OPENIPU_TIMING")
    with pytest.raises(runtime.PopRTRuntimeError, match="RuntimeConfig.timing is 'sometimes'"):
        runtime.Runner(exe, runtime.RuntimeConfig(timing="sometimes"))


def _bench(runner, clients: int, iterations: int):
    """Byte MLPerf's benchmark loop (engine_poprt.benchmark): client threads each timing their
    executes; QPS over the span of all of them."""
    x = {d.name: np.zeros(d.shape, d.numpy_data_type()) for d in runner.get_model_inputs()}
    spans = []
    lock = threading.Lock()

    def client():
        mine = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            runner.execute(x)
            mine.append((t0, time.perf_counter()))
        with lock:
            spans.extend(mine)
    th = [threading.Thread(target=client) for _ in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    span = max(e for _s, e in spans) - min(s for s, _e in spans)
    lat = [e - s for s, e in spans]
    return clients * iterations * runner.batch_size / span, lat


@pytest.mark.parametrize("which", ["serial", "io_tiles"])
def test_concurrent_clients_reach_the_predicted_throughput(which, exe, exe_io_tiles):
    """With enough concurrent callers the measured QPS is the predicted steady-state QPS (the
    harness measures wall time; the device model sets it); one caller alone sees the latency."""
    e = exe if which == "serial" else exe_io_tiles
    p = e.prediction
    scale = 0.05 / (p.batch_period_cycles / p.clock_hz)      # slow motion: one batch every 50 ms of wall time
    r = runtime.Runner(e, runtime.RuntimeConfig(timing="predicted", time_scale=scale))
    try:
        if which == "io_tiles":
            assert p.num_io_tiles == 32 and p.batch_period_cycles < p.latency_cycles
        qps, lat = _bench(r, clients=4, iterations=6)
        predicted_qps_scaled = p.qps / scale
        assert qps <= predicted_qps_scaled * 1.001          # the device model never runs faster
        assert qps >= predicted_qps_scaled * 0.95
        # four callers queue for the device: by Little's law a call takes clients / throughput
        assert np.mean(lat) >= p.latency_seconds * scale * 0.95
        _q1, lat1 = _bench(r, clients=1, iterations=3)
        # a new thread's first call takes the latency; a call returned late is made up by the
        # next one, so the sum stays (less the caller's waits between its calls)
        assert lat1[0] >= p.latency_seconds * scale * 0.999
        assert sum(lat1) >= 3 * p.latency_seconds * scale * 0.9
    finally:
        r.close()


def test_pack_runner_in_predicted_time_mode(exe):
    """PackRunner batches single samples and hands them to the modelled device without waiting for
    the previous batch to complete (the device takes the next one when it is free)."""
    cfg = runtime.PackRunnerConfig(timeout_microseconds=2000)
    pr = runtime.PackRunner(exe, cfg, runtime_config=runtime.RuntimeConfig(timing="predicted"))
    try:
        futs = [pr.executeAsync({"x": np.ones(D_IN, np.float32)}) for _ in range(2 * BATCH + 1)]
        outs = [f.get(timeout=60) for f in futs]
        assert all(o["probs"].shape == (1, D_OUT) and not o["probs"].any() for o in outs)
        st = pr.pack_stats()
        assert st["samples"] == 2 * BATCH + 1 and st["batches"] >= 3
        assert pr.runner.host_stats()["executes"] == st["batches"]
    finally:
        pr.close()


def test_pack_runner_flush_counts_on_the_modelled_clock(exe):
    """A lone caller of a predicted-time PackRunner waits for the flush (the oldest sample's
    timeout) and then the batch's latency: on the modelled clock its sample arrives when it calls,
    the batch is formed one timeout later; the next call of the thread continues its clock."""
    p = exe.prediction
    scale = 0.05 / p.latency_seconds                 # slow motion: a batch takes 50 ms of wall time
    cfg = runtime.PackRunnerConfig(timeout_microseconds=20000)
    pr = runtime.PackRunner(exe, cfg, runtime_config=runtime.RuntimeConfig(timing="predicted", time_scale=scale))
    try:
        lat = []
        for _ in range(3):
            t0 = time.perf_counter()
            out = pr.execute({"x": np.ones(D_IN, np.float32)})
            lat.append(time.perf_counter() - t0)
            assert out["probs"].shape == (1, D_OUT)
        assert lat[0] >= 0.02 + 0.05 * 0.999         # the flush, then the batch
        assert sum(lat) >= 3 * 0.07 * 0.9
        assert pr.pack_stats()["batches"] == 3
    finally:
        pr.close()
