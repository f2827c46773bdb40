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
    predicted cycles/call 1234 1234 1234, output mean/call 7.63 7.65 7.64

The output mean is the mean (as float64) of the call's first tensor output: for a training
model that returns its loss, the loss of this instance's replicas, whatever the application
prints (some print a placeholder with generated data). The first call of a model includes its
compile when the program did not call ``compile()``.

``OPENIPU_APP_MAX_CALLS=N`` stops the application (``SystemExit(0)``, so the report above is
printed) after the N-th call of a training model, for applications that have no option to
limit their steps; every instance makes the same calls, so they stop at the same step.
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
            rec = self._openipu_app_record = {"training": self._training, "wall": [], "cpu": [], "cycles": [],
                                              "mean": []}
            _RECORDS.append(rec)
        w, c = time.perf_counter(), time.process_time()
        out = plain(self, *args, **kwargs)
        rec["wall"].append(time.perf_counter() - w)
        rec["cpu"].append(time.process_time() - c)
        try:
            rec["cycles"].append(int(self._session.getCycleCount()))
        except Exception:  # noqa: BLE001 - no prediction for this call: report what there is
            rec["cycles"].append(None)
        rec["mean"].append(_first_mean(out))
        limit = int(os.environ.get("OPENIPU_APP_MAX_CALLS", "0") or 0)
        if self._training and limit and len(rec["wall"]) >= limit:
            print(f"openipu-app: stopping after {limit} calls (OPENIPU_APP_MAX_CALLS)", file=sys.stderr, flush=True)
            raise SystemExit(0)
        return out

    PoplarExecutor.__call__ = timed


def _first_mean(out):
    """Mean of the first tensor in ``out`` (a tensor or nested tuple / list / dict), or None."""
    import torch
    stack = [out]
    while stack:
        x = stack.pop(0)
        if isinstance(x, torch.Tensor):
            return float(x.detach().double().mean()) if x.numel() else None
        if isinstance(x, (tuple, list)):
            stack[:0] = list(x)
        elif isinstance(x, dict):
            stack[:0] = list(x.values())
    return None


def _report():
    who = f"instance {os.environ.get('POPDIST_INSTANCE_INDEX', '0')}/{os.environ.get('POPDIST_NUM_INSTANCES', '1')}"
    for i, r in enumerate(_RECORDS):
        fmt = " ".join(f"{v:.2f}" for v in r["wall"])
        cpu = " ".join(f"{v:.2f}" for v in r["cpu"])
        cyc = " ".join(str(v) for v in r["cycles"])
        mean = " ".join("-" if v is None else f"{v:.6g}" for v in r["mean"])
        print(f"openipu-app: {who} model {i} ({'training' if r['training'] else 'inference'}): calls "
              f"{len(r['wall'])}, host s/call {fmt}, host CPU s/call {cpu}, predicted cycles/call {cyc}, "
              f"output mean/call {mean}",
              file=sys.stderr, flush=True)


def main():
    import run_graphcore_program

    # openipu's horovod.torch stand-in, as the wheel's openipu-horovod.pth installs it: an editable
    # install has no .pth, and some applications import horovod.torch before popdist (ViT)
    import openipu_hvd_hook  # noqa: F401
    _instrument()
    atexit.register(_report)
    run_graphcore_program.main()


if __name__ == "__main__":
    main()
