"""Serve a compiled PopRT executable over HTTP with the KServe v2 inference protocol and dynamic
batching, the way the Poplar Triton backend serves PopEF files.

    python -m openipu.poprt.serving model.popef --name bert --port 8000 [--max-queue-delay-us 5000]

Endpoints (KServe / Triton "v2" REST protocol, JSON): ``GET /v2/health/live``,
``GET /v2/health/ready``, ``GET /v2`` (server metadata), ``GET /v2/models/{name}`` (model metadata:
inputs and outputs with ``datatype`` and ``shape``, ``-1`` for the batch dimension),
``GET /v2/models/{name}/ready``, ``POST /v2/models/{name}/infer`` with
``{"id": ..., "inputs": [{"name", "shape", "datatype", "data"}], "outputs": [{"name"}]}`` (``data``
flat, row-major; ``shape[0]`` is the request's batch, at most the compiled batch). Errors are
``{"error": text}`` with status 400 (bad request) or 404 (unknown model).

Dynamic batching: requests are queued; a batcher takes queued requests in arrival order while
their samples fit in the compiled batch, waits at most ``max_queue_delay_us`` after the first one
for more (Triton's ``max_queue_delay_microseconds``), pads the rest of the batch with zeros, runs
the :class:`~openipu.poprt.runtime.Runner` in a worker thread, and answers each request with its
rows. ``server.stats`` counts requests, batches and samples (host figures).
"""

from __future__ import annotations

import argparse
import sys
import asyncio
import threading
import time

import numpy as np
from aiohttp import web

from openipu.poprt.runtime import Runner, RuntimeConfig

#: KServe v2 datatype names of numpy dtypes.
DATATYPES = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "int64": "INT64", "int32": "INT32",
             "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
             "uint64": "UINT64", "bool": "BOOL"}
NUMPY_OF = {v: k for k, v in DATATYPES.items()}


class BadRequest(ValueError):
    """A request the protocol or the model cannot take (answered with status 400)."""


class _Pending:
    __slots__ = ("inputs", "n", "future", "t0")

    def __init__(self, inputs, n, future):
        self.inputs, self.n, self.future, self.t0 = inputs, n, future, time.perf_counter()


class InferenceServer:
    """An aiohttp application serving one executable under ``model_name``.

    Args:
        executable_or_runner: path of an executable (``Compiler.compile_and_export``), an
            ``Executable`` or a :class:`Runner`.
        model_name: the name in the URLs.
        max_queue_delay_us: how long the first queued request waits for others to fill the batch.
    """

    def __init__(self, executable_or_runner, model_name: str = "model", max_queue_delay_us: int = 5000):
        self.runner = executable_or_runner if isinstance(executable_or_runner, Runner) else \
            Runner(executable_or_runner, RuntimeConfig())
        self.model_name = model_name
        self.max_delay = max_queue_delay_us / 1e6
        self.batch = self.runner.batch_size
        self.stats = {"requests": 0, "batches": 0, "samples": 0, "errors": 0}
        self._queue: asyncio.Queue | None = None
        self._task = None
        self.app = web.Application(client_max_size=256 * 1024 * 1024)
        self.app.add_routes([
            web.get("/v2/health/live", self._live), web.get("/v2/health/ready", self._live),
            web.get("/v2", self._server_meta), web.get("/v2/models/{name}", self._model_meta),
            web.get("/v2/models/{name}/ready", self._model_ready), web.post("/v2/models/{name}/infer", self._infer)])
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)

    # -- lifecycle ------------------------------------------------------------------------
    async def _start(self, app):
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._batcher())

    async def _stop(self, app):
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    # -- metadata -------------------------------------------------------------------------
    def _tensor_meta(self, d):
        return {"name": d.name, "datatype": DATATYPES[np.dtype(d.dtype).name], "shape": [-1] + list(d.shape[1:])}

    async def _live(self, request):
        return web.json_response({"live": True})

    async def _server_meta(self, request):
        from openipu import __version__
        return web.json_response({"name": "openipu-poprt", "version": __version__, "extensions": []})

    def _check_name(self, request):
        if request.match_info["name"] != self.model_name:
            raise web.HTTPNotFound(text=f'{{"error": "Request for unknown model: \'{request.match_info["name"]}\' is '
                                        'not found"}', content_type="application/json")

    async def _model_meta(self, request):
        self._check_name(request)
        return web.json_response({
            "name": self.model_name, "versions": ["1"], "platform": "openipu_poprt",
            "max_batch_size": self.batch,
            "inputs": [self._tensor_meta(d) for d in self.runner.get_model_inputs()],
            "outputs": [self._tensor_meta(d) for d in self.runner.get_model_outputs()]})

    async def _model_ready(self, request):
        self._check_name(request)
        return web.json_response({"name": self.model_name, "ready": True})

    # -- inference ------------------------------------------------------------------------
    def _parse(self, body) -> tuple[dict, int, list | None]:
        if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
            raise BadRequest("The request body must be a JSON object with an 'inputs' list")
        descs = {d.name: d for d in self.runner.get_model_inputs()}
        inputs, n = {}, None
        for t in body["inputs"]:
            if not isinstance(t, dict) or not {"name", "shape", "datatype", "data"} <= set(t):
                raise BadRequest("Each input needs 'name', 'shape', 'datatype' and 'data'")
            name = t["name"]
            if name not in descs:
                raise BadRequest(f"Unexpected inference input '{name}' for model '{self.model_name}'; its inputs are "
                                 f"{list(descs)}")
            d = descs[name]
            if t["datatype"] not in NUMPY_OF:
                raise BadRequest(f"Input '{name}': unknown datatype '{t['datatype']}'")
            shape = t["shape"]
            if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape) or \
                    list(shape[1:]) != list(d.shape[1:]):
                raise BadRequest(f"Input '{name}': unexpected shape {shape}; the model takes "
                                 f"{[-1] + list(d.shape[1:])}")
            if not 1 <= shape[0] <= self.batch:
                raise BadRequest(f"Input '{name}': batch size {shape[0]} exceeds the maximum batch size "
                                 f"{self.batch} of the model")
            try:
                arr = np.asarray(t["data"], dtype=NUMPY_OF[t["datatype"]])
            except (TypeError, ValueError) as e:
                raise BadRequest(f"Input '{name}': data is not {t['datatype']} ({e})") from None
            if arr.size != int(np.prod(shape)):
                raise BadRequest(f"Input '{name}': {arr.size} values for shape {shape}")
            if n is not None and shape[0] != n:
                raise BadRequest("All inputs must have the same batch size")
            n = shape[0]
            inputs[name] = arr.reshape(shape).astype(d.dtype, copy=False)
        missing = [k for k in descs if k not in inputs]
        if missing:
            raise BadRequest(f"Expected inputs {missing} are missing")
        wanted = None
        if body.get("outputs") is not None:
            outs = {d.name for d in self.runner.get_model_outputs()}
            wanted = [o.get("name") for o in body["outputs"] if isinstance(o, dict)]
            bad = [o for o in wanted if o not in outs]
            if bad:
                raise BadRequest(f"Unexpected inference outputs {bad}; the model's outputs are {sorted(outs)}")
        return inputs, n, wanted

    async def _infer(self, request):
        self._check_name(request)
        self.stats["requests"] += 1
        try:
            body = await request.json()
        except ValueError as e:
            self.stats["errors"] += 1
            return web.json_response({"error": f"The request body is not JSON ({e})"}, status=400)
        try:
            inputs, n, wanted = self._parse(body)
        except BadRequest as e:
            self.stats["errors"] += 1
            return web.json_response({"error": str(e)}, status=400)
        fut = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(inputs, n, fut))
        try:
            outs = await fut
        except Exception as e:  # noqa: BLE001 - a failed execute answers every request in its batch
            self.stats["errors"] += 1
            return web.json_response({"error": f"Inference failed: {e}"}, status=500)
        resp = {"model_name": self.model_name, "model_version": "1", "outputs": [
            {"name": k, "datatype": DATATYPES[v.dtype.name], "shape": list(v.shape), "data": v.reshape(-1).tolist()}
            for k, v in outs.items() if wanted is None or k in wanted]}
        if "id" in body:
            resp["id"] = body["id"]
        return web.json_response(resp)

    async def _batcher(self):
        loop = asyncio.get_running_loop()
        carry = None
        while True:
            first = carry or await self._queue.get()
            carry = None
            group, used = [first], first.n
            deadline = first.t0 + self.max_delay
            while used < self.batch:
                left = deadline - time.perf_counter()
                try:
                    nxt = self._queue.get_nowait() if left <= 0 else await asyncio.wait_for(self._queue.get(), left)
                except (asyncio.TimeoutError, asyncio.QueueEmpty):
                    break
                if used + nxt.n > self.batch:
                    carry = nxt            # first in the next batch (arrival order is kept)
                    break
                group.append(nxt)
                used += nxt.n
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
    def run(self, host: str = "127.0.0.1", port: int = 8000) -> None:
        """Serve until interrupted (blocking)."""
        web.run_app(self.app, host=host, port=port, print=None)

    def start_in_thread(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve from a background thread (tests, benchmarks); returns the port. Stop with :meth:`stop`."""
        ready = threading.Event()
        box = {}

        def main():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            runner = web.AppRunner(self.app)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host, port)
            loop.run_until_complete(site.start())
            box["port"] = site._server.sockets[0].getsockname()[1]
            box["loop"], box["runner"] = loop, runner
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
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


def main(argv=None) -> int:
    """``python -m openipu.poprt.serving EXECUTABLE [--port P]``: serve until interrupted. A bad
    flag exits 2; an executable that cannot be loaded (missing, truncated, tampered: the format's
    hash check) exits 1; each with one line on standard error."""
    p = _Parser(prog="poprt-serve", description="Serve a PopRT executable over HTTP (KServe v2 protocol) with "
                                                "dynamic batching")
    p.add_argument("executable", help="a file written by poprt.compiler.Compiler.compile_and_export")
    p.add_argument("--name", default="model", help="the model name in the URLs")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-queue-delay-us", type=int, default=5000)
    a = p.parse_args(argv)
    try:
        srv = InferenceServer(a.executable, a.name, a.max_queue_delay_us)
    except Exception as e:  # noqa: BLE001 - a file that does not load: one line, non-zero exit
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        sys.stderr.write(f"poprt-serve: error: {msg}\n")
        return 1
    print(srv.runner.report())
    srv.run(a.host, a.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
