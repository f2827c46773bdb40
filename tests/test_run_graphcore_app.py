"""``examples/popdist/run_graphcore_app.py``: the per-call report of an application's PopTorch
models (host seconds, predicted cycles, the mean of the first output) and
``OPENIPU_APP_MAX_CALLS``, which stops an application that has no step limit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

APP = '''
import torch
import poptorch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x, y):
        out = self.fc(x)
        return out, torch.nn.functional.mse_loss(out, y)


torch.manual_seed(0)
m = Net()
tm = poptorch.trainingModel(m, poptorch.Options(), torch.optim.SGD(m.parameters(), lr=0.1))
x, y = torch.ones(1, 4), torch.zeros(1, 2)
for step in range(100):            # no option to stop early, like FastPitch
    out, loss = tm(x, y)
    print(f"step {step} out-mean {float(out.double().mean()):.6g}", flush=True)
'''


def test_report_and_max_calls(tmp_path):
    script = tmp_path / "app.py"
    script.write_text(APP)
    env = {**os.environ, "OPENIPU_APP_MAX_CALLS": "3",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "popdist" / "run_graphcore_app.py"), str(script)],
                       env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = re.findall(r"step (\d+) out-mean (\S+)", r.stdout)
    # the third call stops the application before it prints its step
    assert [s for s, _ in steps] == ["0", "1"]
    assert "stopping after 3 calls (OPENIPU_APP_MAX_CALLS)" in r.stderr
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("openipu-app: instance 0/1 model 0"))
    assert "(training): calls 3," in line
    cycles = re.search(r"predicted cycles/call (\d+) (\d+) (\d+)", line)
    assert cycles and int(cycles.group(1)) > 0 and len(set(cycles.groups())) == 1
    means = re.search(r"output mean/call (\S+) (\S+) (\S+)", line).groups()
    # the first output of each call is the model's output, whose mean the application printed
    assert [float(m) for m in means[:2]] == [float(v) for _, v in steps]
