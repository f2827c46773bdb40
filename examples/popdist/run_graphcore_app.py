"""Run one of Graphcore's PopTorch applications (graphcore/examples) unmodified, usually under
``poprun``, and report each instance's host time and the predicted IPU time of every call of its
PopTorch models.

Usage: ``[poprun --num-instances 2 --num-replicas 2 ...] python examples/popdist/run_graphcore_app.py
SCRIPT.py [ARGS...]``. The script runs as in ``examples/poptorch/run_graphcore_program.py`` (from
its own folder, as ``__main__``, with the stand-ins that file describes: a torchvision stand-in for
programs that name torchvision, Hugging Face offline). Before it runs, every PopTorch model's
``__call__`` is wrapped to record, per call: the **host** wall seconds (``time.perf_counter``), the
**host** CPU seconds of this process (``time.process_time``), and the **predicted** IPU cycles
of the step (the cost model's ``getCycleCount()``, what ``cycleCount()`` returns with
``logCycleCount``). At exit each instance prints one line per model to stderr::

    openipu-app: instance 0/2 model 0 (training): calls 3, host s/call 9.1 2.4 2.2, host CPU s/call ...,
    predicted cycles/call 1234 1234 1234

The first call of a model includes its compile when the program did not call ``compile()``.
The application itself is not modified.
"""

import atexit
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "poptorch"))

_RECORDS = []


def _instrument():
    from openipu.poptorch.executor import PoplarExecutor
    plain = PoplarExecutor.__call__

    def timed(self, *args, **kwargs):
        rec = getattr(self, "_openipu_app_record", None)
        if rec is None:
            rec = self._openipu_app_record = {"training": self._training, "wall": [], "cpu": [], "cycles": []}
            _RECORDS.append(rec)
        w, c = time.perf_counter(), time.process_time()
        out = plain(self, *args, **kwargs)
        rec["wall"].append(time.perf_counter() - w)
        rec["cpu"].append(time.process_time() - c)
        try:
            rec["cycles"].append(int(self._session.getCycleCount()))
        except Exception:  # noqa: BLE001 - no prediction for this call: report what there is
            rec["cycles"].append(None)
        return out

    PoplarExecutor.__call__ = timed


def _report():
    who = f"instance {os.environ.get('POPDIST_INSTANCE_INDEX', '0')}/{os.environ.get('POPDIST_NUM_INSTANCES', '1')}"
    for i, r in enumerate(_RECORDS):
        fmt = " ".join(f"{v:.2f}" for v in r["wall"])
        cpu = " ".join(f"{v:.2f}" for v in r["cpu"])
        cyc = " ".join(str(v) for v in r["cycles"])
        print(f"openipu-app: {who} model {i} ({'training' if r['training'] else 'inference'}): calls "
              f"{len(r['wall'])}, host s/call {fmt}, host CPU s/call {cpu}, predicted cycles/call {cyc}",
              file=sys.stderr, flush=True)


def main():
    import run_graphcore_program
    _instrument()
    atexit.register(_report)
    run_graphcore_program.main()


if __name__ == "__main__":
    main()
