"""The System Analyser trace reader (``pva.openTrace``) on untrusted files: every bad file is a
``pva.NotATrace`` in one line, and nothing hangs (a FIFO, deep nesting) or allocates unbounded."""

import json
import os
import subprocess
import sys

import pytest

import pva

GOOD = {"traceEvents": [{"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "main"}},
                        {"ph": "X", "pid": 1, "tid": 1, "name": "run", "ts": 1.0, "dur": 2.0}]}


@pytest.mark.parametrize("text", [
    b"", b"not json", b"[" * 100_000 + b"]" * 100_000, b'{"traceEvents": NaN}', b"\xff\xfe",
    json.dumps({"traceEvents": {}}).encode(), json.dumps({"traceEvents": [1]}).encode(),
    json.dumps({"traceEvents": [{"ph": "X", "pid": "1", "tid": 1}]}).encode(),
    json.dumps({"traceEvents": [{"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": []}]}).encode(),
    json.dumps({"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "name": "r", "ts": "1", "dur": 1}]}).encode(),
    json.dumps({"traceEvents": [{"ph": "Z", "pid": 1, "tid": 1}]}).encode(),
])
def test_malformed_traces_are_not_a_trace(tmp_path, text):
    p = tmp_path / "t.pvti.json"
    p.write_bytes(text)
    with pytest.raises(pva.NotATrace) as e:
        pva.openTrace(str(p))
    assert len(str(e.value).splitlines()) == 1


def test_a_good_trace_reads(tmp_path):
    p = tmp_path / "t.pvti.json"
    p.write_text(json.dumps(GOOD))
    t = pva.openTrace(str(tmp_path))
    assert t.threads == {(1, 1): "main"} and len(t.events) == 1


def test_a_fifo_does_not_hang(tmp_path):
    fifo = tmp_path / "t.pvti.json"
    os.mkfifo(fifo)
    code = f"import pva\ntry:\n    pva.openTrace({str(fifo)!r})\nexcept pva.NotATrace as e:\n    print('refused', e)\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "refused" in p.stdout and "not a regular file" in p.stdout
