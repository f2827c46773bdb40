"""PopRT serving under hostile traffic: a real server on 127.0.0.1 (ephemeral port) with a small
model, then oversized and stalled bodies, slow-loris headers, bad JSON (``1e400``, deep nesting,
garbage bytes), protocol errors, non-finite outputs, a full queue, aborted connections and bearer
tokens. Every refusal is a 4xx (or 503 when busy) in the KServe v2 error shape; afterwards a valid
request is still answered exactly as the runner answers it directly. Timeouts are shortened
through the constructor so the suite stays fast; nothing here asserts a wall-clock speed."""

import concurrent.futures
import contextlib
import gzip
import json
import logging
import os
import random
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

pytest.importorskip("aiohttp")

from openipu.poprt import serving  # noqa: E402
from openipu.poprt.serving import InferenceServer, is_loopback, max_request_bytes  # noqa: E402
from poprt import runtime  # noqa: E402
from poprt.compiler import Compiler, CompilerOptions  # noqa: E402
from test_poprt_runtime import BATCH, D_IN, D_OUT, _mlp, _ref  # noqa: E402

TIMEOUT = 1.0           # header and body timeouts of the test servers (seconds)
GUARD = 20.0            # socket timeout: a hung server fails the test instead of hanging it


def _nan_model():
    """y = log(x) (FP32: -inf, NaN, inf for 0, -1, inf) and m = n * n (INT32), batch 2 of 3."""
    nodes = [helper.make_node("Log", ["x"], ["y"]), helper.make_node("Mul", ["n", "n"], ["m"])]
    g = helper.make_graph(nodes, "nanmodel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                              helper.make_tensor_value_info("n", TensorProto.INT32, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("m", TensorProto.INT32, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    m, w = _mlp()
    Compiler.compile_and_export(m, ["probs"], str(d / "mlp.popef"), CompilerOptions())
    Compiler.compile_and_export(_nan_model(), ["y", "m"], str(d / "nan.popef"), CompilerOptions())
    return d, w


@pytest.fixture(scope="module")
def mlp_runner(files):
    return runtime.Runner(str(files[0] / "mlp.popef"), runtime.RuntimeConfig())


@contextlib.contextmanager
def _serving(runner, name="mlp", **kw):
    kw = {"max_queue_delay_us": 20_000, "header_timeout_s": TIMEOUT, "body_timeout_s": TIMEOUT,
          "auth_token": "", **kw}
    srv = InferenceServer(runner, name, **kw)
    port = srv.start_in_thread()
    try:
        yield srv, port
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(mlp_runner):
    with _serving(mlp_runner) as s:
        yield s


# -- raw HTTP ---------------------------------------------------------------------------------
def _request(method, path, body=b"", headers=None):
    h = {"Host": "127.0.0.1", "Connection": "close", "Content-Length": str(len(body)), **(headers or {})}
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None)
    return head.encode("latin-1") + b"\r\n" + body


def _read_response(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    n = int(hdrs.get("content-length", -1))
    while n < 0 or len(rest) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, hdrs, rest


def _send(port, raw):
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as s:
        s.sendall(raw)
        return _read_response(s)


def _strict_json(body):
    def refuse(name):
        raise AssertionError(f"bare {name} in a response")
    return json.loads(body, parse_constant=refuse)


def _post(port, obj=None, *, body=None, model="mlp", headers=None):
    if body is None:
        body = json.dumps(obj).encode()
    return _send(port, _request("POST", f"/v2/models/{model}/infer", body, headers))


def _infer_req(x, rid="r"):
    return {"id": rid, "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}]}


def _check_error(status, hdrs, body, want):
    assert status == want, (status, body[:300])
    assert hdrs.get("content-type", "").startswith("application/json"), hdrs
    err = _strict_json(body)
    assert isinstance(err, dict) and set(err) == {"error"} and isinstance(err["error"], str) and err["error"]
    return err["error"]


def _closed_by_peer(s, wait=GUARD):
    """True once the server has closed ``s`` (EOF or reset), reading and discarding any answer."""
    s.settimeout(wait)
    try:
        while s.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    return True


# -- body size --------------------------------------------------------------------------------
def test_body_limit_is_derived_from_the_model(server, mlp_runner):
    srv, _ = server
    assert srv.max_body_bytes == max_request_bytes(mlp_runner.get_model_inputs()) == \
        BATCH * D_IN * serving.JSON_BYTES_PER_ELEMENT + serving.BODY_MARGIN_BYTES
    # a full batch as Python's json writes it fits with room to spare
    full = json.dumps(_infer_req(np.full((BATCH, D_IN), -1.2345678901234567e-38))).encode()
    assert len(full) < srv.max_body_bytes / 2
    with _serving(mlp_runner, max_body_bytes=1000) as (small, port):
        assert small.max_body_bytes == 1000
        _check_error(*_post(port, _infer_req(np.full((BATCH, D_IN), 0.1, np.float32))), 413)
    with pytest.raises(ValueError):
        InferenceServer(mlp_runner, max_body_bytes=0)


def test_oversized_body_is_refused_before_it_is_read(server):
    srv, port = server
    before = srv.stats["too_large"]
    for claim in (srv.max_body_bytes + 1, 300 * 1024 * 1024):
        # headers only: the answer comes although none of the claimed body was sent
        raw = _request("POST", "/v2/models/mlp/infer", headers={"Content-Length": str(claim)})
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as s:
            s.sendall(raw)
            status, hdrs, body = _read_response(s)
            msg = _check_error(status, hdrs, body, 413)
            assert str(srv.max_body_bytes) in msg
            assert _closed_by_peer(s)
    # Expect: 100-continue is refused without a "100 Continue"
    raw = _request("POST", "/v2/models/mlp/infer",
                   headers={"Content-Length": str(10**9), "Expect": "100-continue", "Connection": None})
    status, hdrs, body = _send(port, raw)
    _check_error(status, hdrs, body, 413)
    # chunked (no Content-Length): cut off at the limit
    piece = b"[" + b"0," * 4000 + b"0]"
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(srv.max_body_bytes // len(piece) + 2))
    raw = _request("POST", "/v2/models/mlp/infer", headers={"Content-Length": None, "Transfer-Encoding": "chunked"})
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as s:
        s.sendall(raw)
        try:
            s.sendall(chunks + b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        _check_error(*_read_response(s), 413)
    assert srv.stats["too_large"] - before == 4


def test_gzip_body_is_limited_after_decompression(server):
    srv, port = server
    bomb = gzip.compress(b" " * (64 * 1024 * 1024), 9)         # 64 MiB of spaces in ~64 KiB
    assert len(bomb) < srv.max_body_bytes
    status, hdrs, body = _post(port, body=bomb, headers={"Content-Encoding": "gzip"})
    _check_error(status, hdrs, body, 413)
    # a valid gzip request is still fine
    x = np.ones((1, D_IN), np.float32)
    status, _, body = _post(port, body=gzip.compress(json.dumps(_infer_req(x)).encode()),
                            headers={"Content-Encoding": "gzip"})
    assert status == 200, body


# -- time -------------------------------------------------------------------------------------
def test_stalled_body_is_dropped_while_valid_requests_are_answered(server, files):
    srv, port = server
    _, w = files
    before = srv.stats["timeouts"]
    stalled = []
    for claim in (1000, srv.max_body_bytes):
        s = socket.create_connection(("127.0.0.1", port), timeout=GUARD)
        s.sendall(_request("POST", "/v2/models/mlp/infer", headers={"Content-Length": str(claim)}) + b'{"inp')
        stalled.append(s)
    x = np.random.default_rng(1).standard_normal((2, D_IN)).astype(np.float32)
    status, _, body = _post(port, _infer_req(x))
    assert status == 200, body
    (out,) = _strict_json(body)["outputs"]
    np.testing.assert_allclose(np.array(out["data"]).reshape(out["shape"]), _ref(x, w), rtol=1e-5, atol=1e-6)
    for s in stalled:
        with s:
            msg = _check_error(*_read_response(s), 408)
            assert "--body-timeout" in msg
            assert _closed_by_peer(s)
    assert srv.stats["timeouts"] - before == 2


def test_slow_loris_headers_are_dropped(server):
    _, port = server
    socks = [socket.create_connection(("127.0.0.1", port), timeout=GUARD) for _ in range(8)]
    for s in socks:
        s.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n")
        s.setblocking(False)
    closed = set()
    for _ in range(100):                      # a header byte every 0.1 s, for up to 10 s
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                if s.recv(1024) == b"":
                    closed.add(i)
                    continue
            except BlockingIOError:
                pass
            except OSError:
                closed.add(i)
                continue
            try:
                s.send(b"X")
            except OSError:
                closed.add(i)
        if len(closed) == len(socks):
            break
        time.sleep(0.1)
    # a fresh connection that never sends anything is dropped too
    idle = socket.create_connection(("127.0.0.1", port), timeout=GUARD)
    status, _, body = _post(port, _infer_req(np.zeros((1, D_IN), np.float32)))
    for s in socks:
        s.close()
    assert len(closed) == len(socks), f"{len(socks) - len(closed)} slow connections still open"
    assert status == 200, body
    with idle:
        assert idle.recv(1024) == b""


# -- malformed requests -----------------------------------------------------------------------
def _good(**change):
    t = {"name": "x", "shape": [1, D_IN], "datatype": "FP32", "data": [0.5] * D_IN}
    t.update(change)
    return {"inputs": [t]}


def test_malformed_json_gets_400(server):
    srv, port = server
    good = json.dumps(_good())
    bodies = {
        "garbage": b"\x00\xff\xfe\x80garbage",
        "empty": b"",
        "text": b"not json at all",
        "invalid utf-8": good.encode()[:-3] + b'\xc3\x28"]}',
        "utf-16": good.encode("utf-16"),
        "truncated": good.encode()[:-7],
        "1e400": good.replace("0.5", "1e400", 1).encode(),
        "-1e400": good.replace("0.5", "-1e400", 1).encode(),
        "NaN token": good.replace("0.5", "NaN", 1).encode(),
        "Infinity token": good.replace("0.5", "Infinity", 1).encode(),
        "60000 [": b"[" * 60_000,
        "12000 {": b'{"a":' * 12_000,
        "deep data": json.dumps(_good(data=[0.5])).replace("[0.5]", "[" * 70 + "0.5" + "]" * 70).encode(),
        "huge integer": good.replace("0.5", "9" * 5000, 1).encode(),
        "trailing data": good.encode() + b" {}",
    }
    assert all(len(b) < srv.max_body_bytes for b in bodies.values())
    for what, body in bodies.items():
        status, hdrs, resp = _post(port, body=body)
        msg = _check_error(status, hdrs, resp, 400)
        if "deep" in what or "000 " in what:
            assert "deeper than" in msg, (what, msg)
    # brackets inside strings do not count as nesting
    status, _, resp = _post(port, {**_good(), "id": "[" * 5000})
    assert status == 200 and _strict_json(resp)["id"] == "[" * 5000


def _depth_reference(raw, limit):
    depth = top = 0
    inside = escaped = False
    for ch in raw.decode("latin-1"):
        was, escaped = escaped, ch == "\\" and not escaped
        if ch == '"' and not was:
            inside = not inside
        elif not inside and ch in "[{":
            depth += 1
            top = max(top, depth)
        elif not inside and ch in "]}":
            depth -= 1
    return top <= limit


def test_nesting_scan_agrees_with_a_reference(monkeypatch):
    rng = random.Random(0)
    for step in (1, 3, 64, serving._SCAN_STEP):
        monkeypatch.setattr(serving, "_SCAN_STEP", step)
        for _ in range(400):
            raw = "".join(rng.choice('[]{}"\\a,') for _ in range(rng.randint(0, 60))).encode()
            limit = rng.randint(0, 5)
            assert serving.json_depth_within(raw, limit) == _depth_reference(raw, limit), (raw, limit, step)
    assert serving.json_depth_within(json.dumps([["[[[[", "\\", '\\"[['], {"[": [1]}]).encode(), 3)
    assert not serving.json_depth_within(json.dumps([["[[[[", "\\", '\\"[['], {"[": [[1]]}]).encode(), 3)


def test_protocol_errors_get_4xx(server):
    _, port = server
    row = [0.5] * D_IN
    cases = [
        ({"inputs": []}, "missing"),
        ({"inputs": {"x": row}}, "'inputs' list"),
        ([], "'inputs' list"), (1, "'inputs' list"), (None, "'inputs' list"), ("x", "'inputs' list"),
        ({"inputs": [1]}, "needs"),
        ({"inputs": [{"name": "x"}]}, "needs"),
        (_good(name="y"), "Unexpected inference input"),
        (_good(name=["x"]), "Unexpected inference input"),
        ({"inputs": _good()["inputs"] * 2}, "twice"),
        (_good(datatype="INT32"), "does not match"), (_good(datatype="FP16"), "does not match"),
        (_good(datatype="fp32"), "does not match"), (_good(datatype=7), "does not match"),
        (_good(datatype=["FP32"]), "does not match"), (_good(datatype="BYTES"), "does not match"),
        (_good(shape=[1, 3], data=[0.5] * 3), "shape"), (_good(shape=[D_IN]), "shape"), (_good(shape=[]), "shape"),
        (_good(shape=[1, D_IN, 1]), "shape"), (_good(shape=[1.0, D_IN]), "shape"), (_good(shape=[True, D_IN]), "shape"),
        (_good(shape="1,32"), "shape"), (_good(shape=[-1, D_IN]), "batch size"),
        (_good(shape=[0, D_IN], data=[]), "batch"),
        (_good(shape=[BATCH + 1, D_IN], data=row * (BATCH + 1)), "batch size"),
        (_good(data=row[:-1]), "values for shape"), (_good(data=row + [1.0]), "values for shape"),
        (_good(data=[str(v) for v in row]), "only numbers"), (_good(data=[None] * D_IN), "JSON numbers"),
        (_good(data=[True] * D_IN), "JSON numbers"), (_good(data=[{}] * D_IN), "JSON numbers"),
        (_good(data=["nan"] + row[1:]), "only numbers"), (_good(data="0.5"), "JSON array"),
        (_good(data=[row[:16], 0.5]), "mixes"), (_good(data=[[[[0.5]]]] * D_IN), "nests deeper"),
        (_good(data=[1e39] + row[1:]), "out of range for FP32"), (_good(data=[10**400] + row[1:]), "out of range"),
        ({**_good(), "id": 5}, "'id'"),
        ({**_good(), "outputs": [{"name": "nope"}]}, "Unexpected inference outputs"),
        ({**_good(), "outputs": "probs"}, "'outputs'"), ({**_good(), "outputs": [{"name": 1}]}, "'outputs'"),
    ]
    for obj, text in cases:
        status, hdrs, body = _post(port, body=json.dumps(obj).encode())
        msg = _check_error(status, hdrs, body, 400)
        assert text in msg, (obj if len(str(obj)) < 200 else str(obj)[:200], msg)
    # nested data in the shape's layout is fine
    status, _, body = _post(port, _good(shape=[2, D_IN], data=[row, row]))
    assert status == 200, body
    # unknown model, unknown path, wrong method: KServe-shaped 404 / 405
    _check_error(*_post(port, _good(), model="other"), 404)
    _check_error(*_send(port, _request("GET", "/v2/models/other")), 404)
    _check_error(*_send(port, _request("GET", "/v2/nothing/here")), 404)
    status, hdrs, body = _send(port, _request("GET", "/v2/models/mlp/infer"))
    _check_error(status, hdrs, body, 405)
    assert "POST" in hdrs.get("allow", "")


def test_malformed_http_gets_400_without_a_traceback(server, caplog):
    _, port = server
    caplog.set_level(logging.DEBUG)
    for raw in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n",
                b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                b"GET /v2/health/live HTTP/1.1\r\n" + b"X-A: " + b"a" * 20000 + b"\r\n\r\n",
                b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as s:
            s.sendall(raw)
            try:
                status = _read_response(s)[0]
            except ConnectionError:
                status = None               # closed without an answer is fine too; a 5xx is not
            assert status is None or 400 <= status < 500, (raw[:40], status)
    time.sleep(0.2)
    assert not [r for r in caplog.records if r.exc_info or r.exc_text], [r.getMessage() for r in caplog.records]


# -- non-finite values ------------------------------------------------------------------------
def test_nonfinite_outputs_are_valid_json(files):
    d, _ = files
    r = runtime.Runner(str(d / "nan.popef"), runtime.RuntimeConfig())
    with _serving(r, "nan") as (_, port):
        req = {"id": "n", "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[0, -1, "Infinity"], [1, 2, "NaN"]]},
            {"name": "n", "shape": [2, 3], "datatype": "INT32", "data": [1, 2, 3, -4, 5, 2**31 - 1]}]}
        status, _, body = _post(port, req, model="nan")
        assert status == 200, body
        outs = {o["name"]: o for o in _strict_json(body)["outputs"]}
        assert outs["y"]["data"][:3] == ["-Infinity", "NaN", "Infinity"]
        assert outs["y"]["data"][5] == "NaN"
        y = np.array(outs["y"]["data"], np.float32)          # numpy reads the strings back
        assert np.isneginf(y[0]) and np.isnan(y[1]) and np.isposinf(y[2]) and np.isnan(y[5])
        np.testing.assert_allclose(outs["y"]["data"][3:5], np.log([1, 2]).astype(np.float32), rtol=1e-6)
        assert outs["m"]["datatype"] == "INT32" and outs["m"]["data"][:5] == [1, 4, 9, 16, 25]
        x = req["inputs"][0]
        bad = [({"data": [0, 1, "-inf", 1, 1, 1]}, "only numbers"), ({"data": [0, 1, 3.5e38 * 2, 1, 1, 1]}, "range"),
               ({"datatype": "FP64"}, "does not match")]
        n = req["inputs"][1]
        bad_n = [({"data": [1, 2, 3, 4, 5, 2**31]}, "range"), ({"data": [1, 2, 3, 4, 5, 6.0]}, "JSON integers"),
                 ({"data": [1, 2, 3, 4, 5, True]}, "JSON integers"), ({"datatype": "INT64"}, "does not match")]
        for change, text in bad:
            status, hdrs, body = _post(port, {"inputs": [{**x, **change}, n]}, model="nan")
            assert text in _check_error(status, hdrs, body, 400)
        for change, text in bad_n:
            status, hdrs, body = _post(port, {"inputs": [x, {**n, **change}]}, model="nan")
            assert text in _check_error(status, hdrs, body, 400)


# -- queue ------------------------------------------------------------------------------------
def test_requests_beyond_the_queue_get_503(mlp_runner, files):
    _, w = files
    with _serving(mlp_runner, max_queue=2, max_queue_delay_us=300_000) as (srv, port):
        rng = np.random.default_rng(2)
        xs = [rng.standard_normal((1, D_IN)).astype(np.float32) for _ in range(24)]
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            res = list(pool.map(lambda i: _post(port, _infer_req(xs[i], str(i))), range(len(xs))))
        statuses = [r[0] for r in res]
        assert set(statuses) <= {200, 503}, statuses
        assert statuses.count(503) >= 1 and statuses.count(200) >= 1, statuses
        for i, (status, hdrs, body) in enumerate(res):
            if status == 503:
                assert "--max-queue" in _check_error(status, hdrs, body, 503)
                assert hdrs["retry-after"] == str(serving.RETRY_AFTER_S)
            else:
                out = _strict_json(body)
                assert out["id"] == str(i)
                np.testing.assert_allclose(np.array(out["outputs"][0]["data"]).reshape(1, D_OUT), _ref(xs[i], w),
                                           rtol=1e-5, atol=1e-6)
        assert srv.stats["busy"] == statuses.count(503)
        # once the queue drains, requests are admitted again
        status, _, body = _post(port, _infer_req(xs[0]))
        assert status == 200, body


# -- aborted connections ----------------------------------------------------------------------
def _wait_for(cond, what):
    end = time.monotonic() + GUARD
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.02)


def test_aborted_connections_log_one_line_each(mlp_runner, caplog):
    caplog.set_level(logging.DEBUG)
    with _serving(mlp_runner, max_queue_delay_us=300_000) as (srv, port):
        body = json.dumps(_infer_req(np.zeros((1, D_IN), np.float32))).encode()
        # 1. mid-body
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as s:
            s.sendall(_request("POST", "/v2/models/mlp/infer", body)[:-len(body) // 2])
            time.sleep(0.1)
        _wait_for(lambda: srv.stats["aborted"] == 1, "abort mid-body not seen")
        # 2. a whole request, then gone while it waits for the device (reset, not a half-close)
        s = socket.create_connection(("127.0.0.1", port), timeout=GUARD)
        s.sendall(_request("POST", "/v2/models/mlp/infer", body))
        _wait_for(lambda: srv._inflight == 1, "request not admitted")
        time.sleep(0.05)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
        _wait_for(lambda: srv.stats["aborted"] == 2, "abort while queued not seen")
        status, _, resp = _post(port, _infer_req(np.zeros((1, D_IN), np.float32)))
        assert status == 200, resp
    lines = [r for r in caplog.records if r.name == serving.__name__ and "closed the connection" in r.getMessage()]
    assert len(lines) == 2, [r.getMessage() for r in caplog.records]
    assert "before its request body was complete" in lines[0].getMessage()
    assert "before its answer" in lines[1].getMessage()
    assert not [r for r in caplog.records if r.exc_info or r.exc_text], [r.getMessage() for r in caplog.records]


# -- authentication ---------------------------------------------------------------------------
def test_bearer_token(mlp_runner, monkeypatch, caplog):
    token = "s3cret-Token_1"
    with _serving(mlp_runner, auth_token=token) as (srv, port):
        get = lambda path, auth=None: _send(port, _request("GET", path, headers={"Authorization": auth}))  # noqa
        assert get("/v2/health/live")[0] == 200 and get("/v2/health/ready")[0] == 200
        for auth in (None, "", "Bearer", "Bearer wrong", f"Basic {token}", f"Bearer {token}x", f"Bearer {token[:-1]}",
                     token):
            for path in ("/v2", "/v2/models/mlp", "/v2/models/mlp/ready", "/v2/models/other", "/v2/nothing"):
                status, hdrs, body = get(path, auth)
                _check_error(status, hdrs, body, 401)
                assert hdrs["www-authenticate"].startswith("Bearer")
        # non-ASCII bytes in the header: 401, not a 500
        raw = _request("GET", "/v2/models/mlp").replace(b"\r\n\r\n", b"\r\nAuthorization: Bearer \xff\xfe\r\n\r\n")
        _check_error(*_send(port, raw), 401)
        # an unauthenticated client claiming a huge body is refused before it is read
        _check_error(*_send(port, _request("POST", "/v2/models/mlp/infer",
                                           headers={"Content-Length": str(10**9)})), 401)
        _check_error(*_send(port, _request("POST", "/v2/models/mlp/infer",
                                           headers={"Content-Length": str(10**9), "Expect": "100-continue"})), 401)
        ok = {"Authorization": f"Bearer {token}"}
        assert _send(port, _request("GET", "/v2/models/mlp", headers=ok))[0] == 200
        assert _send(port, _request("GET", "/v2/models/mlp", headers={"Authorization": f"bearer  {token} "}))[0] == 200
        status, _, body = _post(port, _infer_req(np.zeros((1, D_IN), np.float32)), headers=ok)
        assert status == 200, body
        assert srv.stats["unauthorized"] == 8 * 5 + 3
    # the environment variable, and "" to switch it off
    monkeypatch.setenv(serving.TOKEN_ENV, "from-env")
    assert InferenceServer(mlp_runner)._token == b"from-env"
    assert InferenceServer(mlp_runner, auth_token="")._token is None
    for bad in ("with space", "tab\t", "caf\u00e9"):
        with pytest.raises(ValueError):
            InferenceServer(mlp_runner, auth_token=bad)
    # without a token, binding beyond loopback warns that the server is for a trusted network
    monkeypatch.delenv(serving.TOKEN_ENV)
    srv = InferenceServer(mlp_runner)
    caplog.set_level(logging.WARNING)
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "127.8.9.10"):
        assert is_loopback(host) and not srv._warn_if_exposed(host)
    for host in ("0.0.0.0", "::", "", "192.168.1.4", "example.org"):
        assert not is_loopback(host) and srv._warn_if_exposed(host)
    assert sum("trusted network" in r.getMessage() for r in caplog.records) == 5
    assert not InferenceServer(mlp_runner, auth_token="t")._warn_if_exposed("0.0.0.0")


# -- the command, as a separate process -------------------------------------------------------
def _vm(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_server_command_stays_small_under_an_oversized_body(files):
    d, w = files
    env = {**os.environ, serving.TOKEN_ENV: "cli-token"}
    p = subprocess.Popen([sys.executable, "-m", "openipu.poprt.serving", str(d / "mlp.popef"), "--name", "mlp",
                          "--port", "0", "--body-timeout", "2", "--header-timeout", "2", "--max-queue", "8"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        port = None
        for _ in range(50):
            line = p.stdout.readline()
            m = re.search(r"serving model 'mlp' on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
            assert line, p.stderr.read()
        assert port
        auth = {"Authorization": "Bearer cli-token"}
        x = np.random.default_rng(3).standard_normal((3, D_IN)).astype(np.float32)
        status, _, body = _post(port, _infer_req(x), headers=auth)
        assert status == 200, body
        peak = _vm(p.pid, "VmHWM")
        # claim 300 MB and push 64 MB at it: refused, the server's peak memory barely moves
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as s:
            s.sendall(_request("POST", "/v2/models/mlp/infer", headers={"Content-Length": str(300 * 2**20), **auth}))
            try:
                for _ in range(64):
                    s.sendall(b"0" * 2**20)
            except OSError:
                pass
        status, hdrs, body = _send(port, _request("POST", "/v2/models/mlp/infer",
                                                  headers={"Content-Length": str(300 * 2**20), **auth}))
        _check_error(status, hdrs, body, 413)
        assert _vm(p.pid, "VmHWM") - peak < 16 * 2**20
        _check_error(*_post(port, _infer_req(x)), 401)
        status, _, body = _post(port, _infer_req(x), headers=auth)
        assert status == 200, body
        out = _strict_json(body)["outputs"][0]
        np.testing.assert_allclose(np.array(out["data"]).reshape(out["shape"]), _ref(x, w), rtol=1e-5, atol=1e-6)
    finally:
        p.terminate()
        _, err = p.communicate(timeout=GUARD)
    assert "Traceback" not in err, err


def test_server_command_rejects_bad_limits(files, capsys):
    d, _ = files
    for flag in (["--max-body-bytes", "0"], ["--body-timeout", "-1"], ["--header-timeout", "nan"],
                 ["--max-queue", "x"]):
        with pytest.raises(SystemExit) as e:
            serving.main([str(d / "mlp.popef"), *flag])
        assert e.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


# -- after all of it --------------------------------------------------------------------------
def test_valid_request_after_hostile_traffic_matches_the_runner(server, mlp_runner):
    srv, port = server
    x = np.random.default_rng(4).standard_normal((BATCH, D_IN)).astype(np.float32)
    status, _, body = _post(port, _infer_req(x, "last"))
    assert status == 200, body
    out = _strict_json(body)
    assert out["id"] == "last"
    (o,) = out["outputs"]
    direct = mlp_runner.execute({"x": x})["probs"]
    np.testing.assert_allclose(np.array(o["data"], np.float32).reshape(o["shape"]), direct, rtol=1e-6, atol=1e-7)
    assert srv._inflight == 0
