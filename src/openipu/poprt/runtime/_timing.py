"""Predicted-time mode of the runtime: a runner that does not compute outputs but completes each
execute when the simulated IPU would, so that a benchmark harness measuring wall time (Byte
MLPerf's QPS and P99 columns) measures the cost model's prediction.

Selected by ``RuntimeConfig(timing="predicted")`` or, for harnesses that cannot be changed, by the
environment variable ``OPENIPU_TIMING=predicted`` (read when a ``RuntimeConfig`` is made; ``host``,
the default, runs the program on the simulator and every call takes host time).

The device model (:class:`PredictedDevice`): compiled batches queue on one modelled IPU (all its
replicas) in arrival order. A batch starts when it has arrived and the device has finished taking
the previous one, i.e. batch ``i`` starts at ``max(arrival_i, start_{i-1} + period)``, and completes
``latency`` later. ``latency`` is the predicted time of one batch alone (host-to-device I/O,
compute, I/O-tile transfer and device-to-host I/O in sequence: ``Prediction.latency_seconds``);
``period`` is the steady-state time between batches (``Prediction.batch_period_cycles``: with I/O
tiles and overlapped I/O the larger of compute and host I/O, without them the whole latency). A
single caller therefore sees one batch every ``latency`` plus its own host time between calls, as on
an IPU, and enough concurrent callers reach the predicted throughput ``batch / period``. The
host's own path (checking and copying the caller's arrays, the Python around the call) is real
time and adds to each call, as it would on an IPU system. Outputs are not computed: they are zeros.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from concurrent.futures import Future as _CFuture

#: the values of ``RuntimeConfig.timing`` / ``OPENIPU_TIMING``
TIMINGS = ("host", "predicted")


def default_timing() -> str:
    """``OPENIPU_TIMING`` (``host`` or ``predicted``, any case), ``host`` when unset. Raises
    ``ValueError`` naming the accepted values for another value."""
    v = os.environ.get("OPENIPU_TIMING", "").strip().lower() or "host"
    if v not in TIMINGS:
        raise ValueError(f"OPENIPU_TIMING={os.environ['OPENIPU_TIMING']!r}: expected one of {', '.join(TIMINGS)}")
    return v


class _Completer:
    """One thread that completes futures at given ``time.perf_counter()`` instants (earliest first)."""

    def __init__(self):
        self._heap: list = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="poprt-predicted-device", daemon=True)
        self._thread.start()

    def at(self, t: float, fut: _CFuture, result) -> None:
        with self._cv:
            if self._stop:
                fut.set_exception(RuntimeError("The runner is closed"))
                return
            heapq.heappush(self._heap, (t, next(self._seq), fut, result))
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (not self._heap or self._heap[0][0] > time.perf_counter()):
                    self._cv.wait(None if not self._heap else max(self._heap[0][0] - time.perf_counter(), 0.0))
                if self._stop:
                    pending, self._heap = self._heap, []
                    break
                _t, _s, fut, result = heapq.heappop(self._heap)
            if not fut.done():
                fut.set_result(result() if callable(result) else result)
        for _t, _s, fut, _r in pending:
            if not fut.done():
                fut.set_exception(RuntimeError("The runner is closed"))

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()


class PredictedDevice:
    """The modelled IPU of a runner in predicted-time mode (see the module docstring).

    Args:
        latency_s: predicted IPU seconds of one batch alone (``Prediction.latency_seconds``).
        period_s: predicted IPU seconds between batches in steady state
            (``Prediction.batch_period_cycles / clock_hz``).
        time_scale: wall seconds per predicted second (1.0; larger values run in slow motion, for
            measurements on a loaded host).
    """

    def __init__(self, latency_s: float, period_s: float, time_scale: float = 1.0):
        if not (latency_s >= 0 and period_s >= 0 and time_scale > 0):
            raise ValueError(f"latency {latency_s}, period {period_s} and time_scale {time_scale} must be >= 0 (> 0)")
        self.latency_s, self.period_s, self.time_scale = float(latency_s), float(period_s), float(time_scale)
        self._free_at = 0.0           # perf_counter instant the device takes its next batch
        self._lock = threading.Lock()
        self._completer = _Completer()
        self.batches = 0
        self.busy_until = 0.0

    def submit(self, result) -> tuple[_CFuture, float]:
        """Queue one compiled batch now. Returns ``(future, start)``: the future completes (with
        ``result``, or ``result()`` when callable) at the batch's predicted completion, and
        ``start`` is the ``time.perf_counter()`` instant the device takes the batch."""
        with self._lock:
            start = max(time.perf_counter(), self._free_at)
            self._free_at = start + self.period_s * self.time_scale
            done = start + self.latency_s * self.time_scale
            self.batches += 1
            self.busy_until = max(self.busy_until, done)
        fut = _CFuture()
        self._completer.at(done, fut, result)
        return fut, start

    def close(self) -> None:
        self._completer.close()
