"""The System Analyser trace (PVTI_OPTIONS): host phases, stream copies, runs and the predicted
IPU timeline, in the Chrome trace event format (checked with a JSON schema), read by pva.openTrace.

Perfetto's trace processor is not used: it downloads a binary on first use (offline here)."""

import json
import os
import subprocess
import sys

import jsonschema
import pytest

import pva
from openipu.popvision.trace import CHROME_TRACE_SCHEMA

SCRIPT = """
import numpy as np, popart, libpvti as pvti
ch = pvti.createTraceChannel("user")
with pvti.Tracepoint(ch, "build the model"):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [16, 32]), "x")
    w = b.addInitializedInputTensor(np.ones((32, 8), np.float32))
    o = b.aiOnnx.matmul([x, w])
    b.addOutputTensor(o)
s = popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("ALL")}),
                            deviceInfo=popart.DeviceManager().createIpuModelDevice({}))
s.prepareDevice()
a = s.initAnchorArrays()
for _ in range(2):
    s.run(popart.PyStepIO({x: np.ones((16, 32), np.float32)}, a))
loss = pvti.Graph("Loss", "")
train = loss.addSeries("Training Loss")
for v in (0.5, 0.25):
    train.add(v)
print(s.getCycleCount())
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    d = tmp_path_factory.mktemp("pvti")
    env = dict(os.environ, PVTI_OPTIONS=json.dumps({"enable": "true", "directory": str(d)}))
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return d, int(p.stdout.split()[-1])


def test_trace_is_chrome_trace_format(traced):
    d, _ = traced
    [f] = [x for x in os.listdir(d) if x.endswith(".pvti.json")]
    doc = json.load(open(d / f))
    jsonschema.validate(doc, CHROME_TRACE_SCHEMA)
    # the schema is not vacuous: an event without a timestamp fails it
    bad = {"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "name": "x", "dur": 1}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, CHROME_TRACE_SCHEMA)


def test_trace_contents(traced):
    d, cycles = traced
    t = pva.openTrace(str(d))
    names = [e["name"] for e in t.hostEvents]
    assert "build the model" in names
    assert t.spans("PopART: graph construction")
    for phase in ("compile: check tile mapping", "compile: lower programs", "compile: plan tile memory"):
        assert t.spans(phase), phase
    assert t.spans("Engine: load")
    runs = t.spans("Engine: run program")
    assert len(runs) == 2
    assert t.spans("StreamCopy host->IPU") and t.spans("StreamCopy IPU->host")
    # host phases nest in time: the compile phases end before the first run starts
    assert max(e["ts"] + e["dur"] for e in t.spans("compile:")) <= min(e["ts"] for e in runs)
    # the predicted IPU timeline: its own track, one run's steps add up to the predicted cycles
    assert any(n == "IPU 0 (predicted)" for n in t.threads.values())
    ipu = sorted(t.ipuEvents, key=lambda e: e["ts"])
    assert ipu and all(e["args"]["predicted"] for e in ipu)
    first_run = [e for e in ipu if e["ts"] < runs[1]["ts"]]
    total = max(e["args"]["fromCycle"] + e["args"]["cycles"] for e in first_run)
    assert total == pytest.approx(cycles, rel=1e-6, abs=1)


def test_not_a_trace(tmp_path):
    p = tmp_path / "x.pvti.json"
    p.write_text("{]")
    with pytest.raises(pva.NotATrace):
        pva.openTrace(str(p))
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "pid": 1, "tid": 1}]}))
    with pytest.raises(pva.NotATrace):
        pva.openTrace(str(p))


def test_libpvti_graph_series_are_counter_events(traced):
    """``libpvti.Graph(name, unit).addSeries(name).add(value)``: one counter event (``ph: "C"``)
    per value, named by the graph, the value under the series' name."""
    d, _ = traced
    [f] = [x for x in os.listdir(d) if x.endswith(".pvti.json")]
    counters = [e for e in json.load(open(d / f))["traceEvents"] if e.get("ph") == "C"]
    assert [(e["name"], e["args"]) for e in counters] == [("Loss", {"Training Loss": 0.5}),
                                                           ("Loss", {"Training Loss": 0.25})]
    assert counters[0]["ts"] <= counters[1]["ts"]
