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

The clock of the modelled system, per calling thread: a blocking call (``execute``) arrives on
the modelled device at the modelled instant the thread's previous blocking call returned plus the
CPU time the thread has used since (the host's own work for that caller, at this machine's
speed); its first call arrives now, and no call arrives later than now. The simulator's own delays
(its threads woken late on a loaded host, other processes holding the CPUs, other threads holding
the GIL) therefore do not leave the modelled device idle. Batches take the earliest free period of
the device from their arrival on, so one that arrived earlier on the modelled clock but was
submitted later on this machine fills the idle gap it left. A call completes at its modelled
completion, at once if that has passed: a call the simulator returned late is made up by the
thread's next call returning early, so single calls scatter around the modelled times while their
sums do not (the throughput a harness measures over many calls, and by Little's law the mean
latency of its concurrent callers, are the modelled ones). What cannot be made up is a host that
is too slow on average: the harness's own Python must keep up with the modelled device (one batch
every ``period``) on the CPU share this process gets. Not modelled: waits a caller makes between
its blocking calls (a client that paces its requests with sleeps sees them as no time; pace with
``execute_async``, whose calls arrive when they are made).
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
#: idle gaps of the modelled device kept for batches submitted late (the most recent ones)
MAX_GAPS = 64


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
        self._gaps: list[tuple[float, float]] = []    # idle intervals before _free_at (the last MAX_GAPS)
        self._lock = threading.Lock()
        self._completer = _Completer()
        self._clients = threading.local()     # per calling thread: (modelled instant, CPU time) at its last return
        self.batches = 0
        self.busy_until = 0.0

    def _take_slot(self, arrival: float, now: float) -> float:
        """The start of the earliest period of the device free from ``arrival`` on: an idle gap
        left between earlier batches (a batch that arrived earlier on the modelled clock but was
        submitted later on this machine's), else after the last batch. Holds ``_lock``."""
        period = self.period_s * self.time_scale
        horizon = now - max(1.0, 100 * period)
        self._gaps = [g for g in self._gaps if g[1] > horizon]
        for i, (g0, g1) in enumerate(self._gaps):
            start = max(g0, arrival)
            if start + period <= g1:
                self._gaps[i:i + 1] = [g for g in ((g0, start), (start + period, g1)) if g[1] - g[0] > 1e-12]
                return start
        start = max(arrival, self._free_at)
        if start > self._free_at:
            self._gaps.append((self._free_at, start))
            del self._gaps[:-MAX_GAPS]
        self._free_at = start + period
        return start

    def arrival(self) -> float:
        """The modelled instant (``time.perf_counter()`` base) of a call the calling thread makes
        now: its last :meth:`returned` instant plus the CPU time it has used since (see the
        module docstring), never later than now; now for a thread without one."""
        now = time.perf_counter()
        mark = getattr(self._clients, "mark", None)
        if mark is None:
            return now
        modelled, cpu = mark
        host = time.thread_time() - cpu
        return min(now, modelled + max(host, 0.0))

    def returned(self, modelled: float) -> None:
        """The calling thread's blocking call returns now; ``modelled`` is its completion on the
        modelled device (the ``completes`` of its last batch's future)."""
        self._clients.mark = (modelled, time.thread_time())

    def submit(self, result, arrival: float | None = None) -> tuple[_CFuture, float]:
        """Queue one compiled batch arriving at ``arrival`` (a modelled instant, default now).
        Returns ``(future, start)``: ``start`` is the instant the device takes the batch; the
        future completes (with ``result``, or ``result()`` when callable) at the batch's modelled
        completion (at once if that has passed) and holds it as ``future.completes``."""
        now = time.perf_counter()
        with self._lock:
            start = self._take_slot(now if arrival is None else min(arrival, now), now)
            done = start + self.latency_s * self.time_scale
            self.batches += 1
            self.busy_until = max(self.busy_until, done)
        fut = _CFuture()
        fut.completes = done
        if done <= time.perf_counter():
            fut.set_result(result() if callable(result) else result)
        else:
            self._completer.at(done, fut, result)
        return fut, start

    def close(self) -> None:
        self._completer.close()
