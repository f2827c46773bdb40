"""``PoplarExecutor``'s timings: the compile's host time and PopTorch's performance counters
and latencies of the last call."""

from __future__ import annotations

from openipu.poptorch.enums import OutputMode
from openipu.poptorch.errors import Error


class Timings:
    """``PoplarExecutor``'s timing methods (mixed into it)."""

    def compilationTime(self) -> float:  # noqa: N802
        """Host wall-clock seconds the last compile took (capture, lowering to PopART, the
        simulated IPU's compile): a measurement of this simulator, not of an IPU system."""
        if self._compile_seconds is None:
            raise Error("Model has not been compiled (or was loaded from a file): no compilation time")
        return float(self._compile_seconds)

    def getPerfCounters(self) -> dict:  # noqa: N802
        """PopTorch's performance counters of the last call, in seconds: ``input`` /
        ``input_complete`` (the IPU asks for an input tensor / has received it) and ``output`` /
        ``output_complete`` (it sends an output / the host has it), each ``[tensor][step]``, one
        step per device iteration (outputs: per iteration returned by the output mode). Before
        compilation every list is ``[[]]``.

        The timestamps are **predicted** for the simulated IPU (an IPU records them on the
        device): the predicted cycles of the call (the cost model's, as ``cycleCount()``) at the
        tile clock, split evenly over the device iterations, each input / output stream taking
        its bytes over the target's host link in turn, from the host time the run started (the
        reference point is arbitrary, as on an IPU; differences are predicted seconds)."""
        empty = {"input": [[]], "input_complete": [[]], "output": [[]], "output_complete": [[]]}
        if self._session is None or self._perf is None:
            return empty
        s, b, o = self._session, self._built, self._options
        di, af, rf = self._factor()
        spec = s.deviceInfo.device.getTarget().spec
        clock, link = float(spec.clock_hz), float(spec.host_bytes_per_s or 16e9)
        cycles = float(getattr(s, "_last_cycles", 0) or 0)
        step = cycles / clock / di
        n_out = di if o.output_mode == OutputMode.All else di // o.output_return_period \
            if o.output_mode == OutputMode.EveryN else 1
        t0 = self._perf[1]

        def seconds(info, per_step: int) -> float:
            return info.nbytes() * per_step / link
        ins = [seconds(i, af * rf) for i in b.input_info] or [0.0]
        outs = []
        for tid in b.outputs:
            info = s._ir.tensors[tid].info if tid in s._ir.tensors else None
            outs.append(seconds(info, (af if o.output_mode in (OutputMode.All, OutputMode.EveryN) else 1) * rf)
                        if info is not None else 0.0)
        outs = outs or [0.0]
        res = {k: [] for k in empty}
        for i in range(len(ins)):
            start = [t0 + k * step + sum(ins[:i]) for k in range(di)]
            res["input"].append(start)
            res["input_complete"].append([t + ins[i] for t in start])
        every = max(di // max(n_out, 1), 1)
        for j in range(len(outs)):
            last = [t0 + ((m + 1) * every - 1) * step + sum(ins) for m in range(n_out)]   # inputs of the step in
            ends = [max(t0 + ((m + 1) * every) * step - sum(outs[j + 1:]), last[m] + outs[j]) for m in range(n_out)]
            res["output"].append([e - outs[j] for e in ends])
            res["output_complete"].append(ends)
        return res

    def _latency(self, from_event, from_reduce, to_event, to_reduce) -> tuple:
        pc = self.getPerfCounters()
        starts = [from_reduce(col) for col in zip(*pc[from_event])]
        ends = [to_reduce(col) for col in zip(*pc[to_event])]
        if not ends:
            return (0.0, 0.0, 0.0)
        f = len(starts) // len(ends)
        groups = [min(starts[i:i + f]) for i in range(0, len(starts), f)]
        d = [e - s for s, e in zip(groups, ends)]
        return (min(d), max(d), sum(d) / len(d))

    def getHostIpuLatency(self) -> tuple:  # noqa: N802
        """(min, max, mean) seconds from the first input requested to the last input sent, per
        step of the last call: host-measured (see :meth:`getPerfCounters`)."""
        return self._latency("input", min, "input_complete", max)

    def getComputeLatency(self) -> tuple:  # noqa: N802
        """(min, max, mean) seconds from the last input sent to the last output ready:
        host-measured simulation time (see :meth:`getPerfCounters`), not the IPU's."""
        return self._latency("input_complete", max, "output", max)

    def getIpuHostLatency(self) -> tuple:  # noqa: N802
        """(min, max, mean) seconds from the first output ready to the last output copied:
        host-measured (see :meth:`getPerfCounters`)."""
        return self._latency("output", min, "output_complete", max)

    def getLatency(self) -> tuple:  # noqa: N802
        """(min, max, mean) round-trip seconds of the steps of the last call: host-measured (see
        :meth:`getPerfCounters`)."""
        return self._latency("input", min, "output_complete", max)
