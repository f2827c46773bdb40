"""Serve a compiled PopRT executable over HTTP with the KServe v2 inference protocol and dynamic
batching, the way the Poplar Triton backend serves PopEF files.

    python -m openipu.poprt.serving model.popef --name bert --port 8000 [--max-queue-delay-us 5000]
        [--max-body-bytes B] [--header-timeout S] [--body-timeout S] [--max-queue N] [--auth-token T]

Endpoints (KServe / Triton "v2" REST protocol, JSON): ``GET /v2/health/live``,
``GET /v2/health/ready``, ``GET /v2`` (server metadata), ``GET /v2/models/{name}`` (model metadata:
inputs and outputs with ``datatype`` and ``shape``, ``-1`` for the batch dimension),
``GET /v2/models/{name}/ready``, ``POST /v2/models/{name}/infer`` with
``{"id": ..., "inputs": [{"name", "shape", "datatype", "data"}], "outputs": [{"name"}]}`` (``data``
row-major, flat or nested; ``shape[0]`` is the request's batch, at most the compiled batch;
``datatype`` must be the model input's own, e.g. ``FP32``: it is checked, never cast). Errors are
``{"error": text}`` (the protocol's error object) with a 4xx status for anything the client sent
wrong; 5xx only for a failure of the server itself.

Dynamic batching: requests are queued; a batcher takes queued requests in arrival order while
their samples fit in the compiled batch, waits at most ``max_queue_delay_us`` after the first one
for more (Triton's ``max_queue_delay_microseconds``), pads the rest of the batch with zeros, runs
the :class:`~openipu.poprt.runtime.Runner` in a worker thread, and answers each request with its
rows. ``server.stats`` counts requests, batches and samples (host figures) and refusals.

Limits (the server stays up and bounded whatever a client sends):

* body size: at most :func:`max_request_bytes` of the model (the compiled batch of every input as
  JSON text, :data:`JSON_BYTES_PER_ELEMENT` bytes per element, plus :data:`BODY_MARGIN_BYTES`);
  ``--max-body-bytes`` / ``max_body_bytes`` overrides it. A larger ``Content-Length`` is answered
  413 before any of the body is read; a chunked body is cut off at the limit.
* header time: a connection must deliver a request's headers within ``header_timeout_s``
  (:data:`HEADER_TIMEOUT_S`) of opening or of its previous answer, else it is closed (this is
  also the idle keep-alive time).
* body time: the whole body must arrive within ``body_timeout_s`` (:data:`BODY_TIMEOUT_S`) of the
  headers, else 408 and the connection is closed; the answer must be taken within the same time.
* queue: at most ``max_queue`` (:data:`MAX_QUEUE`) inference requests are admitted at once (being
  read, decoded or waiting for the device); more are answered 503 with ``Retry-After`` at once.
  Worst-case request memory is about ``max_queue`` bodies plus the one being decoded.
* JSON: UTF-8, nested at most :data:`MAX_JSON_DEPTH` levels (checked before parsing), no
  ``NaN`` / ``Infinity`` tokens, no number that overflows (``1e400``) or leaves the input's type's
  range (``1e39`` for FP32, ``300`` for UINT8).
* non-finite outputs: KServe v2 JSON carries numbers, and JSON (RFC 8259) has no NaN or infinity;
  Triton writes the non-standard tokens ``NaN`` / ``Infinity`` (rapidjson's
  ``kWriteNanAndInfFlag`` in triton-inference-server/common's ``TritonJson::Write``, since
  server#3870). This server writes the strings
  ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` instead, as the proto3 JSON mapping of the
  protocol's gRPC form does for ``float`` / ``double`` (protobuf.dev, "JSON Mapping"; its
  conformance suite also refuses floats out of range); responses are always valid JSON,
  ``np.array(data, np.float32)`` reads the strings back as NaN and infinities, and the same three
  strings are accepted in FP16/FP32/FP64 input data.
* authentication: with ``auth_token`` (``--auth-token`` or the environment variable
  ``OPENIPU_SERVING_TOKEN``) every endpoint except ``/v2/health/live`` and ``/v2/health/ready``
  needs ``Authorization: Bearer <token>`` (401 otherwise). Without one the server is for a trusted
  network only, and says so when bound to an address other than loopback.
* logging: a client that disconnects mid-request costs one log line, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import ipaddress
import json
import logging
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import chain

import numpy as np
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_urldispatcher import _default_expect_handler

from openipu.poprt.runtime import Runner, RuntimeConfig

log = logging.getLogger(__name__)

#: KServe v2 datatype names of numpy dtypes.
DATATYPES = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "int64": "INT64", "int32": "INT32",
             "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
             "uint64": "UINT64", "bool": "BOOL"}
NUMPY_OF = {v: k for k, v in DATATYPES.items()}

#: Bytes of JSON text allowed per tensor element in the body limit. Python's ``repr`` of a float is
#: at most 24 characters (``-2.2250738585072014e-308``), ``", "`` adds 2; nesting and indentation
#: take the rest.
JSON_BYTES_PER_ELEMENT = 32
#: Bytes added to the body limit for the request's envelope (names, shapes, ``id``, ``parameters``).
BODY_MARGIN_BYTES = 64 * 1024
#: Deepest JSON nesting accepted (a request needs 4 plus the rank of its nested ``data``).
MAX_JSON_DEPTH = 64
#: Default seconds a connection has to deliver a request's headers (also the idle keep-alive time).
HEADER_TIMEOUT_S = 30.0
#: Default seconds a request's body has to arrive in (and its answer to be taken in).
BODY_TIMEOUT_S = 60.0
#: Default number of inference requests admitted at once; more get 503.
MAX_QUEUE = 64
#: Seconds a client is told to wait after a 503 (``Retry-After``).
RETRY_AFTER_S = 1
#: Seconds the server goes on discarding the body of a refused request (so that the client can
#: read the refusal before the connection closes); aiohttp's default is 10.
LINGER_S = 1.0
#: Environment variable read for the bearer token when none is given.
TOKEN_ENV = "OPENIPU_SERVING_TOKEN"

_NONFINITE_IN = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_SCAN_STEP = 1 << 18
_SCAN_KIND = np.zeros(256, np.int8)      # bytes that matter to nesting: open 1, close -1, " 2, \\ 3
_SCAN_KIND[[0x5B, 0x7B]], _SCAN_KIND[[0x5D, 0x7D]], _SCAN_KIND[0x22], _SCAN_KIND[0x5C] = 1, -1, 2, 3
_HEALTH_ROUTES = {"v2-health-live", "v2-health-ready"}


class BadRequest(ValueError):
    """A request the protocol or the model cannot take (answered with status 400)."""


class _Pending:
    __slots__ = ("inputs", "n", "future", "t0", "gone")

    def __init__(self, inputs, n, future, gone=lambda: False):
        self.inputs, self.n, self.future, self.t0, self.gone = inputs, n, future, time.perf_counter(), gone


def max_request_bytes(inputs) -> int:
    """The largest JSON inference request a model can need, in bytes: the elements of every input
    at the compiled batch (``TensorDesc.shape``, the batch included) times
    :data:`JSON_BYTES_PER_ELEMENT`, plus :data:`BODY_MARGIN_BYTES`. Compact or flat JSON of a full
    batch fits; pretty-printed, deeply nested JSON may not (raise the limit for such clients)."""
    elements = sum(math.prod(int(s) for s in d.shape) for d in inputs)
    return elements * JSON_BYTES_PER_ELEMENT + BODY_MARGIN_BYTES


def _dumps(obj) -> bytes:
    # allow_nan=False: a non-finite float that slipped through raises instead of writing bare NaN
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()


def _json(obj, status: int = 200, headers=None) -> web.Response:
    return web.Response(status=status, body=_dumps(obj), content_type="application/json", headers=headers)


def _error(status: int, text: str, headers=None) -> web.Response:
    """A response in the KServe v2 error shape, ``{"error": text}``."""
    return _json({"error": text}, status, headers)


def _refuse_constant(name):
    raise ValueError(f"'{name}' is not JSON (RFC 8259 has no NaN or Infinity; send the strings \"NaN\", "
                     "\"Infinity\", \"-Infinity\" in floating-point data)")


def json_depth_within(raw, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``raw`` (UTF-8 bytes) nests arrays and objects at most ``limit`` levels
    deep, found without parsing it (so without the parser's recursion, whose bound is the
    process-wide recursion limit): brackets inside strings do not count, a quote after an odd run
    of backslashes does not end a string. Vectorised over the brackets, quotes and backslashes, in
    chunks of :data:`_SCAN_STEP` bytes (scratch memory about 100 bytes per byte of one chunk, 25 MiB
    at most); text that is not JSON may get either answer, the parser refuses it anyway."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return True
    text = np.frombuffer(raw, np.uint8)
    depth, in_string, bs_run, last_pos = 0, 0, 0, -2
    for start in range(0, text.size, _SCAN_STEP):
        kind = _SCAN_KIND[text[start:start + _SCAN_STEP]]
        pos = np.flatnonzero(kind)
        if pos.size == 0:
            continue
        k = kind[pos]
        pos += start
        i = np.arange(pos.size)
        bs = k == 3
        # joined: the byte just before is a backslash (of this chunk, or ending the previous one)
        prev_pos = np.concatenate(([last_pos], pos[:-1]))
        prev_bs = np.concatenate(([bs_run > 0], bs[:-1]))
        joined = prev_bs & (prev_pos == pos - 1)
        run_start = np.maximum.accumulate(np.where(bs & ~joined, i, -1))
        run_len = np.where(bs, np.where(run_start >= 0, i - run_start + 1, i + 1 + bs_run), 0)
        before = np.where(joined, np.concatenate(([bs_run], run_len[:-1])), 0)
        quotes = np.cumsum((k == 2) & (before % 2 == 0)) + in_string
        delta = np.where((quotes % 2 == 0) & (np.abs(k) == 1), k, 0)
        run = np.cumsum(delta) + depth
        if int(run.max()) > limit:
            return False
        depth, in_string = int(run[-1]), int(quotes[-1] % 2)
        last_pos, bs_run = int(pos[-1]), int(run_len[-1])
    return True


def decode_json(raw, max_depth: int = MAX_JSON_DEPTH):
    """Parse a request body (bytes) as strict JSON. Raises :class:`BadRequest` for text that is not
    UTF-8, nests deeper than ``max_depth``, holds ``NaN`` / ``Infinity`` tokens, or is not JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"The request body is not UTF-8 ({e.reason} at byte {e.start})") from None
    if not json_depth_within(raw, max_depth):
        raise BadRequest(f"The request body nests JSON deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise BadRequest(f"The request body nests JSON deeper than {max_depth} levels") from None
    except ValueError as e:
        raise BadRequest(f"The request body is not JSON ({e})") from None


def _flatten(data, rank: int, name: str):
    """``data`` flat or nested up to ``rank`` levels, as a flat list and the set of its element types."""
    if not isinstance(data, list):
        raise BadRequest(f"Input '{name}': 'data' must be a JSON array, not {type(data).__name__}")
    flat = data
    for _ in range(rank):
        kinds = set(map(type, flat))
        if list not in kinds:
            return flat, kinds
        if kinds != {list}:
            raise BadRequest(f"Input '{name}': 'data' mixes arrays and values at one level")
        flat = list(chain.from_iterable(flat))
    kinds = set(map(type, flat))
    if list in kinds:
        raise BadRequest(f"Input '{name}': 'data' nests deeper than the shape's {rank} dimensions")
    return flat, kinds


def _to_array(flat: list, kinds: set, dtype, name: str, datatype: str) -> np.ndarray:
    """JSON values of one input as a numpy array of ``dtype``; every value is checked, none cast
    from another JSON type (a string, a boolean in numbers, a fraction in integers)."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        if not kinds <= {int, float, str}:
            raise BadRequest(f"Input '{name}': {datatype} data must be JSON numbers; got "
                             f"{sorted(k.__name__ for k in kinds - {int, float, str})}")
        special = None
        if str in kinds:
            special = np.fromiter((type(v) is str for v in flat), bool, len(flat))
            try:
                flat = [_NONFINITE_IN[v] if type(v) is str else v for v in flat]
            except KeyError as e:
                raise BadRequest(f"Input '{name}': {datatype} data holds the string {str(e)[:40]}; only numbers and "
                                 "\"NaN\", \"Infinity\", \"-Infinity\" are numbers here") from None
        try:
            wide = np.array(flat, np.float64)
        except OverflowError:
            raise BadRequest(f"Input '{name}': an integer in the data is out of range for {datatype}") from None
        with np.errstate(over="ignore"):
            arr = wide.astype(dt)
        bad = ~np.isfinite(arr)
        if special is not None:
            bad &= ~special
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise BadRequest(f"Input '{name}': value {wide[i]!r} at element {i} is out of range for {datatype}")
        return arr
    if dt.kind in "iu":
        if not kinds <= {int}:
            raise BadRequest(f"Input '{name}': {datatype} data must be JSON integers; got "
                             f"{sorted(k.__name__ for k in kinds - {int})}")
        info = np.iinfo(dt)
        if flat and (min(flat) < info.min or max(flat) > info.max):
            raise BadRequest(f"Input '{name}': a value is out of the range [{info.min}, {info.max}] of {datatype}")
        return np.array(flat, dt)
    if dt.kind == "b":
        if not kinds <= {bool}:
            raise BadRequest(f"Input '{name}': BOOL data must be JSON true / false; got "
                             f"{sorted(k.__name__ for k in kinds - {bool})}")
        return np.array(flat, bool)
    raise BadRequest(f"Input '{name}': the model's {dt.name} input cannot be sent as JSON")


def _json_values(a: np.ndarray) -> list:
    """Row-major values of ``a`` for JSON: non-finite floats as "NaN", "Infinity", "-Infinity"."""
    flat = a.reshape(-1)
    data = flat.tolist()
    if flat.dtype.kind == "f":
        for i in np.flatnonzero(~np.isfinite(flat)).tolist():
            v = data[i]
            data[i] = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return data


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address to bind) only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _OneLine(logging.Filter):
    """Turns aiohttp's per-connection error records (bad HTTP from a client) into one warning
    line without a traceback."""

    def filter(self, record):
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            record.args = None
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _install_one_line_filter():
    lg = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _OneLine) for f in lg.filters):
        lg.addFilter(_OneLine())


class _Refused(Exception):
    def __init__(self, response):
        super().__init__(response.status)
        self.response = response


class InferenceServer:
    """An aiohttp application serving one executable under ``model_name``.

    Args:
        executable_or_runner: path of an executable (``Compiler.compile_and_export``), an
            ``Executable`` or a :class:`Runner`.
        model_name: the name in the URLs.
        max_queue_delay_us: how long the first queued request waits for others to fill the batch
            (microseconds).
        max_body_bytes: largest request body (bytes); default :func:`max_request_bytes` of the model.
        header_timeout_s: seconds for a connection to deliver a request's headers (and idle
            keep-alive time); default :data:`HEADER_TIMEOUT_S`.
        body_timeout_s: seconds for a request's body to arrive and for its answer to be taken;
            default :data:`BODY_TIMEOUT_S`.
        max_queue: inference requests admitted at once (being read, decoded or waiting for the
            device); more are answered 503. Default :data:`MAX_QUEUE`.
        auth_token: bearer token every non-health endpoint requires; ``None`` reads the
            environment variable ``OPENIPU_SERVING_TOKEN``; ``""`` means no token.
    Raises:
        ValueError: a limit that is not positive, or a token that is not visible ASCII.
        PopRTRuntimeError: the executable cannot be loaded (from :class:`Runner`).
    """

    def __init__(self, executable_or_runner, model_name: str = "model", max_queue_delay_us: int = 5000, *,
                 max_body_bytes: int | None = None, header_timeout_s: float = HEADER_TIMEOUT_S,
                 body_timeout_s: float = BODY_TIMEOUT_S, max_queue: int = MAX_QUEUE, auth_token: str | None = None):
        self.runner = executable_or_runner if isinstance(executable_or_runner, Runner) else \
            Runner(executable_or_runner, RuntimeConfig())
        self.model_name = model_name
        self.max_delay = max_queue_delay_us / 1e6
        self.batch = self.runner.batch_size
        self.max_body_bytes = int(max_body_bytes) if max_body_bytes is not None else \
            max_request_bytes(self.runner.get_model_inputs())
        self.header_timeout_s = float(header_timeout_s)
        self.body_timeout_s = float(body_timeout_s)
        self.max_queue = int(max_queue)
        for what, v in (("max_body_bytes", self.max_body_bytes), ("header_timeout_s", self.header_timeout_s),
                        ("body_timeout_s", self.body_timeout_s), ("max_queue", self.max_queue)):
            if not v > 0:
                raise ValueError(f"{what} must be positive, not {v}")
        token = os.environ.get(TOKEN_ENV, "") if auth_token is None else auth_token
        if token and not (token.isascii() and token.isprintable() and " " not in token):
            raise ValueError("The auth token must be visible ASCII characters without spaces")
        self._token = token.encode() if token else None
        self.stats = {"requests": 0, "batches": 0, "samples": 0, "errors": 0, "busy": 0, "too_large": 0,
                      "timeouts": 0, "aborted": 0, "unauthorized": 0}
        self._queue: asyncio.Queue | None = None
        self._task = None
        self._inflight = 0
        self._decoder: ThreadPoolExecutor | None = None
        _install_one_line_filter()
        self.app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._guard])
        self.app.add_routes([
            web.get("/v2/health/live", self._live, name="v2-health-live"),
            web.get("/v2/health/ready", self._live, name="v2-health-ready"),
            web.get("/v2", self._server_meta), web.get("/v2/models/{name}", self._model_meta),
            web.get("/v2/models/{name}/ready", self._model_ready),
            web.post("/v2/models/{name}/infer", self._infer, expect_handler=self._expect)])
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)

    # -- lifecycle ------------------------------------------------------------------------
    async def _start(self, app):
        self._queue = asyncio.Queue()
        # one decoding thread: JSON bodies become Python objects one at a time (bounded memory),
        # off the event loop so timeouts and small requests keep running meanwhile
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="poprt-serve-decode")
        self._task = asyncio.get_running_loop().create_task(self._batcher())

    async def _stop(self, app):
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._decoder:
            self._decoder.shutdown(wait=False)

    def _app_runner(self) -> web.AppRunner:
        # keepalive_timeout doubles as the header timeout: aiohttp starts it when a connection
        # opens and after each answer, and closes the connection if no complete request has
        # arrived by then (aiohttp 3.14 RequestHandler._process_keepalive). lingering_time: how
        # long the unread body of a refused request is read and discarded before closing.
        return web.AppRunner(self.app, keepalive_timeout=self.header_timeout_s, lingering_time=LINGER_S,
                             access_log=None)

    # -- guards ---------------------------------------------------------------------------
    def _auth_error(self, request):
        if self._token is None or request.match_info.route.name in _HEALTH_ROUTES:
            return None
        scheme, _, cred = request.headers.get("Authorization", "").strip().partition(" ")
        try:
            ok = scheme.lower() == "bearer" and hmac.compare_digest(
                cred.strip().encode("utf-8", "surrogateescape"), self._token)
        except UnicodeError:
            ok = False
        if ok:
            return None
        self.stats["unauthorized"] += 1
        return _error(401, "This server needs 'Authorization: Bearer <token>' with its token",
                      headers={"WWW-Authenticate": 'Bearer realm="openipu-poprt"'})

    def _unknown_model(self, request):
        name = request.match_info.get("name")
        if name == self.model_name:
            return None
        return _error(404, f"Request for unknown model: '{name[:200]}' is not found")

    def _size_error(self, request):
        if request.headers.get("Inference-Header-Content-Length") is not None:
            return _error(400, "The binary tensor data extension is not supported: send JSON 'data'")
        n = request.content_length
        if n is not None and n > self.max_body_bytes:
            self.stats["too_large"] += 1
            return self._too_large(n)

    def _too_large(self, n=None):
        claim = f"{n} bytes" if n is not None else "more"
        return _error(413, f"The request body ({claim}) exceeds the limit of {self.max_body_bytes} bytes for "
                           "this model (--max-body-bytes)")

    async def _expect(self, request):
        # 'Expect: 100-continue': refuse before the client sends the body
        refused = self._auth_error(request) or self._unknown_model(request) or self._size_error(request)
        if refused is not None:
            refused.force_close()
            return refused
        return await _default_expect_handler(request)

    @web.middleware
    async def _guard(self, request, handler):
        resp = self._auth_error(request)
        if resp is None:
            try:
                resp = await handler(request)
            except web.HTTPException as e:
                if e.status < 400:
                    raise
                what = f"{request.method} {request.path[:200]}"
                text = {404: f"No endpoint {what}", 405: f"Method not allowed: {what}"}.get(e.status, e.reason)
                resp = _error(e.status, text, headers={"Allow": e.headers["Allow"]} if "Allow" in e.headers else None)
            except Exception:  # noqa: BLE001 - a bug of this server: logged with its traceback, 500
                log.exception("Internal error answering %s %s", request.method, request.path[:200])
                resp = _error(500, "Internal server error")
        if resp.status >= 400 and request.can_read_body:
            resp.force_close()          # the unread body is not waited for: close the connection
        return resp

    # -- metadata -------------------------------------------------------------------------
    def _tensor_meta(self, d):
        return {"name": d.name, "datatype": DATATYPES[np.dtype(d.dtype).name], "shape": [-1] + list(d.shape[1:])}

    async def _live(self, request):
        return _json({"live": True})

    async def _server_meta(self, request):
        from openipu import __version__
        return _json({"name": "openipu-poprt", "version": __version__, "extensions": []})

    async def _model_meta(self, request):
        return self._unknown_model(request) or _json({
            "name": self.model_name, "versions": ["1"], "platform": "openipu_poprt",
            "max_batch_size": self.batch,
            "inputs": [self._tensor_meta(d) for d in self.runner.get_model_inputs()],
            "outputs": [self._tensor_meta(d) for d in self.runner.get_model_outputs()]})

    async def _model_ready(self, request):
        return self._unknown_model(request) or _json({"name": self.model_name, "ready": True})

    # -- inference ------------------------------------------------------------------------
    def _parse(self, body) -> tuple[dict, int, list | None, str | None]:
        """A decoded request as (inputs by name, batch, wanted outputs or None, id or None).
        Raises :class:`BadRequest` for anything the protocol or the model cannot take."""
        if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
            raise BadRequest("The request body must be a JSON object with an 'inputs' list")
        rid = body.get("id")
        if rid is not None and not isinstance(rid, str):
            raise BadRequest("'id' must be a string")
        descs = {d.name: d for d in self.runner.get_model_inputs()}
        inputs, n = {}, None
        for t in body["inputs"]:
            if not isinstance(t, dict) or not {"name", "shape", "datatype", "data"} <= set(t):
                raise BadRequest("Each input needs 'name', 'shape', 'datatype' and 'data'")
            name = t["name"]
            if not isinstance(name, str) or name not in descs:
                raise BadRequest(f"Unexpected inference input {str(name)[:100]!r} for model '{self.model_name}'; its "
                                 f"inputs are {list(descs)}")
            if name in inputs:
                raise BadRequest(f"Input '{name}' is given twice")
            d = descs[name]
            want = DATATYPES.get(np.dtype(d.dtype).name)
            if t["datatype"] != want:
                raise BadRequest(f"Input '{name}': datatype {str(t['datatype'])[:40]!r} does not match the model's "
                                 f"{want}; send {want} data (nothing is cast)")
            shape = t["shape"]
            if not isinstance(shape, list) or not all(type(s) is int for s in shape) or \
                    len(shape) != len(d.shape) or shape[1:] != list(d.shape[1:]):
                raise BadRequest(f"Input '{name}': unexpected shape {str(shape)[:100]}; the model takes "
                                 f"{[-1] + list(d.shape[1:])}")
            if not 1 <= shape[0] <= self.batch:
                raise BadRequest(f"Input '{name}': batch size {shape[0]} is outside 1 to the maximum batch size "
                                 f"{self.batch} of the model")
            flat, kinds = _flatten(t["data"], len(shape), name)
            if len(flat) != math.prod(shape):
                raise BadRequest(f"Input '{name}': {len(flat)} values for shape {shape}")
            if n is not None and shape[0] != n:
                raise BadRequest("All inputs must have the same batch size")
            n = shape[0]
            inputs[name] = _to_array(flat, kinds, d.dtype, name, want).reshape(shape)
        missing = [k for k in descs if k not in inputs]
        if missing:
            raise BadRequest(f"Expected inputs {missing} are missing")
        wanted = None
        if body.get("outputs") is not None:
            outs = [d.name for d in self.runner.get_model_outputs()]
            if not isinstance(body["outputs"], list) or \
                    not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in body["outputs"]):
                raise BadRequest("'outputs' must be a list of objects with a 'name'")
            wanted = [o["name"] for o in body["outputs"]]
            bad = [o[:100] for o in wanted if o not in outs]
            if bad:
                raise BadRequest(f"Unexpected inference outputs {bad}; the model's outputs are {outs}")
        return inputs, n, wanted, rid

    def _decode_request(self, raw):
        return self._parse(decode_json(raw))

    def _encode_response(self, outs: dict, wanted, rid) -> bytes:
        resp = {"model_name": self.model_name, "model_version": "1", "outputs": [
            {"name": k, "datatype": DATATYPES[v.dtype.name], "shape": list(v.shape), "data": _json_values(v)}
            for k, v in outs.items() if wanted is None or k in wanted]}
        if rid is not None:
            resp["id"] = rid
        return _dumps(resp)

    async def _read_body(self, request) -> bytearray:
        """The body, at most ``max_body_bytes`` within ``body_timeout_s``; raises :class:`_Refused`
        (413, 408, 400) or ``ConnectionError`` (the client went away)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        buf = bytearray()
        while True:
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                chunk = await asyncio.wait_for(request.content.readany(), left)
            except asyncio.TimeoutError:
                self.stats["timeouts"] += 1
                log.warning("client %s: request body not received within %g s (%d of %s bytes); connection closed",
                            request.remote, self.body_timeout_s, len(buf), request.content_length or "?")
                raise _Refused(_error(408, f"The request body did not arrive within {self.body_timeout_s:g} s "
                                           "(--body-timeout)")) from None
            except HttpProcessingError as e:
                raise _Refused(_error(400, f"Bad request body framing or encoding ({e.message})")) from None
            if not chunk:
                return buf
            if len(buf) + len(chunk) > self.max_body_bytes:
                self.stats["too_large"] += 1
                raise _Refused(self._too_large(request.content_length))
            buf += chunk

    async def _send(self, request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.content_length = len(body)

        async def write():
            await resp.prepare(request)
            await resp.write(body)
            await resp.write_eof()
        try:
            await asyncio.wait_for(write(), self.body_timeout_s)
        except asyncio.TimeoutError:
            self.stats["aborted"] += 1
            log.warning("client %s: answer not taken within %g s; connection closed", request.remote,
                        self.body_timeout_s)
            if request.transport is not None:
                request.transport.abort()       # close() would wait for the buffer to drain
        except ConnectionError:
            self._aborted(request, "while its answer was sent")
        return resp

    def _aborted(self, request, when: str) -> web.Response:
        self.stats["aborted"] += 1
        log.info("client %s closed the connection %s (%s %s)", request.remote, when, request.method,
                 request.path[:200])
        return web.Response(status=499)         # nobody reads it: the connection is gone

    async def _infer(self, request):
        self.stats["requests"] += 1
        refused = self._unknown_model(request) or self._size_error(request)
        if refused is not None:
            return refused
        if self._inflight >= self.max_queue:
            self.stats["busy"] += 1
            return _error(503, f"The server already has {self.max_queue} requests waiting for the device "
                               "(--max-queue); retry later", headers={"Retry-After": str(RETRY_AFTER_S)})
        self._inflight += 1
        try:
            return await self._infer_admitted(request)
        finally:
            self._inflight -= 1

    async def _infer_admitted(self, request):
        loop = asyncio.get_running_loop()
        try:
            raw = await self._read_body(request)
        except _Refused as r:
            return r.response
        except ConnectionError:
            return self._aborted(request, "before its request body was complete")
        try:
            inputs, n, wanted, rid = await loop.run_in_executor(self._decoder, self._decode_request, raw)
        except BadRequest as e:
            self.stats["errors"] += 1
            return _error(400, str(e))
        del raw
        fut = loop.create_future()
        self._queue.put_nowait(_Pending(inputs, n, fut, gone=lambda: request.transport is None))
        try:
            outs = await fut
        except Exception as e:  # noqa: BLE001 - a failed execute answers every request in its batch
            self.stats["errors"] += 1
            log.error("inference failed: %s", str(e).splitlines()[0] if str(e) else type(e).__name__)
            return _error(500, f"Inference failed: {e}")
        if outs is None or request.transport is None:
            return self._aborted(request, "before its answer")
        body = await loop.run_in_executor(self._decoder, self._encode_response, outs, wanted, rid)
        return await self._send(request, body)

    def _alive(self, p: _Pending) -> bool:
        """Whether a queued request still has a client; a gone one is answered None and skipped."""
        if p.future.done():
            return False
        if p.gone():
            p.future.set_result(None)
            return False
        return True

    async def _batcher(self):
        loop = asyncio.get_running_loop()
        carry = None
        while True:
            first = carry or await self._queue.get()
            carry = None
            if not self._alive(first):
                continue
            group, used = [first], first.n
            deadline = first.t0 + self.max_delay
            while used < self.batch:
                left = deadline - time.perf_counter()
                try:
                    nxt = self._queue.get_nowait() if left <= 0 else await asyncio.wait_for(self._queue.get(), left)
                except (asyncio.TimeoutError, asyncio.QueueEmpty):
                    break
                if not self._alive(nxt):
                    continue
                if used + nxt.n > self.batch:
                    carry = nxt            # first in the next batch (arrival order is kept)
                    break
                group.append(nxt)
                used += nxt.n
            group = [p for p in group if self._alive(p)]      # clients that left while it filled
            if not group:
                continue
            used = sum(p.n for p in group)
            feeds = {}
            for d in self.runner.get_model_inputs():
                buf = np.zeros(d.shape, d.dtype)
                r = 0
                for p in group:
                    buf[r:r + p.n] = p.inputs[d.name]
                    r += p.n
                feeds[d.name] = buf
            try:
                res = await loop.run_in_executor(None, self.runner._run_one, feeds)
            except Exception as e:  # noqa: BLE001
                for p in group:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            self.stats["batches"] += 1
            self.stats["samples"] += used
            r = 0
            for p in group:
                if not p.future.done():
                    p.future.set_result({k: v[r:r + p.n] for k, v in res.items()})
                r += p.n

    # -- running --------------------------------------------------------------------------
    def _warn_if_exposed(self, host: str) -> bool:
        if self._token is not None or is_loopback(host):
            return False
        log.warning("serving on %s without an auth token (--auth-token or %s): anyone who can reach this address "
                    "can use the model; run it this way on a trusted network only", host or "all addresses", TOKEN_ENV)
        return True

    def run(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        """Serve until interrupted (blocking); prints the address once listening."""
        self._warn_if_exposed(host)

        async def serve():
            runner = self._app_runner()
            await runner.setup()
            try:
                site = web.TCPSite(runner, host, port)
                await site.start()
                shown = f"[{host}]" if ":" in host else host or "0.0.0.0"
                print(f"poprt-serve: serving model '{self.model_name}' on http://{shown}:{runner.addresses[0][1]}",
                      flush=True)
                await asyncio.Event().wait()
            finally:
                await runner.cleanup()
        try:
            asyncio.run(serve())
        except KeyboardInterrupt:
            pass

    def start_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve from a background thread (tests, benchmarks); returns the port. Stop with :meth:`stop`."""
        self._warn_if_exposed(host)
        ready = threading.Event()
        box = {}

        def main():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            runner = self._app_runner()
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host, port)
            loop.run_until_complete(site.start())
            box["port"] = runner.addresses[0][1]
            box["loop"], box["runner"] = loop, runner
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            pending = asyncio.all_tasks(loop)      # connection tasks woken by the shutdown, as asyncio.run
            for t in pending:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()
        self._thread = threading.Thread(target=main, name="poprt-serving", daemon=True)
        self._thread.start()
        ready.wait()
        self._box = box
        return box["port"]

    def stop(self) -> None:
        box = getattr(self, "_box", None)
        if box:
            box["loop"].call_soon_threadsafe(box["loop"].stop)
            self._thread.join()
            self._box = None


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit status 2, as the poprt CLI
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _positive(kind):
    def conv(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be positive: {s!r}")
        return v
    return conv


def main(argv=None) -> int:
    """``python -m openipu.poprt.serving EXECUTABLE [--port P] ...``: serve until interrupted. A
    bad flag exits 2; an executable that cannot be loaded (missing, truncated, tampered: the
    format's hash check) exits 1; each with one line on standard error."""
    p = _Parser(prog="poprt-serve", description="Serve a PopRT executable over HTTP (KServe v2 protocol) with "
                                                "dynamic batching")
    p.add_argument("executable", help="a file written by poprt.compiler.Compiler.compile_and_export")
    p.add_argument("--name", default="model", help="the model name in the URLs")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-queue-delay-us", type=int, default=5000)
    p.add_argument("--max-body-bytes", type=_positive(int), default=None,
                   help="largest request body in bytes (default: the model's full batch as JSON, "
                        f"{JSON_BYTES_PER_ELEMENT} bytes per element, plus {BODY_MARGIN_BYTES})")
    p.add_argument("--header-timeout", type=_positive(float), default=HEADER_TIMEOUT_S, metavar="SECONDS",
                   help=f"seconds to deliver a request's headers, also the idle keep-alive time (default "
                        f"{HEADER_TIMEOUT_S:g})")
    p.add_argument("--body-timeout", type=_positive(float), default=BODY_TIMEOUT_S, metavar="SECONDS",
                   help=f"seconds for a request body to arrive and its answer to be taken (default {BODY_TIMEOUT_S:g})")
    p.add_argument("--max-queue", type=_positive(int), default=MAX_QUEUE,
                   help=f"inference requests admitted at once; more get 503 (default {MAX_QUEUE})")
    p.add_argument("--auth-token", default=None,
                   help=f"bearer token required on every endpoint but health (default: ${TOKEN_ENV}; prefer the "
                        "variable, a flag is visible to other users in the process list)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s poprt-serve %(levelname)s: %(message)s")
    try:
        srv = InferenceServer(a.executable, a.name, a.max_queue_delay_us, max_body_bytes=a.max_body_bytes,
                              header_timeout_s=a.header_timeout, body_timeout_s=a.body_timeout,
                              max_queue=a.max_queue, auth_token=a.auth_token)
    except Exception as e:  # noqa: BLE001 - a file that does not load: one line, non-zero exit
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        sys.stderr.write(f"poprt-serve: error: {msg}\n")
        return 1
    print(srv.runner.report())
    srv.run(a.host, a.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
