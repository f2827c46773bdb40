"""``poprt.runtime.PackRunner``: a server-side batcher that packs single samples (variable-length
sequences) into the compiled batches of a :class:`~openipu.poprt.runtime.Runner`."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import Future as _CFuture

import numpy as np

from openipu.poprt.runtime._common import (Future, PackAlgorithm, PackRunnerConfig, PopRTRuntimeError,
                                           RuntimeConfig)
from openipu.poprt.runtime._runner import Runner


class PackRunner:
    """``poprt.runtime.PackRunner(executable_or_path, PackRunnerConfig())``: a server-side batcher
    for BERT-like models fed one sample at a time (PopRT's pack runner; Byte MLPerf's pack mode).

    ``executeAsync(inputs, outputs)`` takes ONE sample and returns a :class:`Future`. The model's
    inputs are ``[B, S]`` (B rows of the compiled sequence length S); a sample gives each input as
    ``[L]`` or ``[1, L]`` with ``L <= S`` (or padded to S, with ``enable_padding_remove_mode``).
    A worker thread takes queued samples into a batch and runs it when ``max_valid_num`` samples
    are queued, when the queued tokens fill the batch, or ``timeout_microseconds`` after the
    oldest one arrived.

    Packed mode (``enable_input_single_row_mode(mask)``): samples are packed into rows by
    ``config.algorithm``, several short sequences in one row, each row padded with zeros; the mask
    input of a row holds 1 for the first sequence's tokens, 2 for the second's, ... A request
    needs the dynamic input; inputs it leaves out are filled as PopRT's pack runner does
    (``position_ids``: 0..L-1; others zeros; see :meth:`_fill_missing`; Byte MLPerf's benchmark
    sends only ``input_ids``, ``attention_mask`` and ``token_type_ids``). Outputs ``[B, S, ...]`` are cut back per
    sample (``[L, ...]`` of the row, written into the caller's ``[S, ...]``, ``[1, S, ...]`` or
    ``[L, ...]`` array, the rest zeroed); outputs without a sequence dimension (a pooled output
    ``[B, H]``) mix the sequences of a row and are not returned in this mode. Otherwise each
    sample fills one row (``[B, ...]`` inputs of any shape).

    A model converted with ``pack_args`` (``Converter(pack_args=...)``, ``poprt --pack_args``)
    brings its mask, dynamic input and ``max_valid_num``; a config that sets the single-row mask
    overrides them.

    Figures: :meth:`pack_stats` (samples, batches and rows run, token efficiency) and
    :meth:`report`: predicted IPU samples/s at the packing achieved, beside host samples/s.
    Raises :class:`PopRTRuntimeError` for a model or sample that cannot be packed.
    """

    def __init__(self, executable_or_path, config: PackRunnerConfig | None = None,
                 runtime_config: RuntimeConfig | None = None):
        self.config = cfg = config if config is not None else PackRunnerConfig()
        if int(getattr(cfg, "delimiter_num", 0) or 0):
            raise PopRTRuntimeError("enable_input_single_row_mode with delimiter_num > 0 (zero delimiters between "
                                    "packed sequences, PopRT's deberta mode) is not implemented")
        self.runner = Runner(executable_or_path, runtime_config)
        pack = self.runner.executable.options.get("pack_args")
        if pack and not cfg.single_row_input:      # a model converted with pack_args: its settings
            self.config = cfg = copy.copy(cfg)
            cfg.enable_input_single_row_mode(pack["mask_name"])
            cfg.dynamic_input_name = cfg.dynamic_input_name or pack.get("dynamic_input_name", "")
            cfg.max_valid_num = cfg.max_valid_num or int(pack.get("max_valid_num", 0))
        ins = self.runner._inputs
        self.rows = self.runner.batch_size
        for nm, what in ((cfg.dynamic_input_name, "dynamic_input_name"), (cfg.single_row_input, "the single-row mask"),
                         (cfg.padding_remove_mask, "the padding-remove mask"), *[(n, "a padding-remove input")
                                                                                  for n in cfg.padding_remove_inputs]):
            if nm and nm not in ins:
                raise PopRTRuntimeError(f"{what} '{nm}' is not an input of the model; its inputs are {list(ins)}")
        self.packed = bool(cfg.single_row_input)
        if self.packed:
            dyn = cfg.dynamic_input_name or cfg.single_row_input
            shape = ins[dyn].shape
            if len(shape) != 2:
                raise PopRTRuntimeError(f"Packed mode needs [batch, seq] inputs; '{dyn}' has shape {list(shape)}")
            self.seq = int(shape[1])
            bad = [n for n, d in ins.items() if list(d.shape) != list(shape)]
            if bad:
                raise PopRTRuntimeError(f"Packed mode packs [batch, seq] = {list(shape)} inputs; inputs {bad} have "
                                    f"other shapes")
            self._seq_outputs = [n for n, d in self.runner._outputs.items()
                                 if len(d.shape) >= 2 and list(d.shape[:2]) == list(shape)]
        else:
            self.seq = 0
            self._seq_outputs = list(self.runner._outputs)
        self.max_samples = cfg.max_valid_num or (self.rows * max(self.seq, 1) if self.packed else self.rows)
        if not self.packed and self.max_samples > self.rows:
            raise PopRTRuntimeError(f"max_valid_num {self.max_samples} is larger than the compiled batch {self.rows} "
                                f"(one sample a row without enable_input_single_row_mode)")
        self._queue: list = []
        self._cv = threading.Condition()
        self._stop = False
        self.batches_run = 0
        self._stats = {"samples": 0, "rows": 0, "tokens": 0}
        self._t_first = self._t_last = None
        self._worker = threading.Thread(target=self._loop, name="poprt-pack", daemon=True)
        self._worker.start()

    def get_model_inputs(self):
        return self.runner.get_model_inputs()

    def get_model_outputs(self):
        return self.runner.get_model_outputs()

    get_execute_inputs = get_model_inputs
    get_execute_outputs = get_model_outputs

    # -- one sample in --------------------------------------------------------------------
    def _sample(self, inputs: dict) -> tuple[dict, int]:
        """The sample's arrays (1-D for packed inputs) and its length (tokens; 0 unpacked)."""
        cfg = self.config
        arrs = {}
        for n, d in self.runner._inputs.items():
            if n in inputs and n != cfg.unpack_info_name:
                arrs[n] = np.asarray(inputs[n])
        unknown = [n for n in inputs if n not in self.runner._inputs]
        if unknown:
            raise PopRTRuntimeError(f"Inputs {unknown} are not inputs of the model")
        dyn_name = cfg.dynamic_input_name or cfg.single_row_input
        if len(arrs) < len(self.runner._inputs) and dyn_name not in arrs:
            raise PopRTRuntimeError(f"Input '{dyn_name}' (the dynamic input) is missing; inputs other than it may be "
                                    f"left out; the model's inputs are {list(self.runner._inputs)}")
        if cfg.padding_remove_mask and self.packed and cfg.padding_remove_mask in arrs:
            # unpacked, a padded sample fills its row as it is
            keep = int(np.count_nonzero(arrs[cfg.padding_remove_mask]))
            for n in [cfg.padding_remove_mask, *cfg.padding_remove_inputs]:
                if n in arrs:
                    arrs[n] = arrs[n].reshape(-1)[:keep]
        self._fill_missing(arrs)
        if not self.packed:
            for n, d in self.runner._inputs.items():
                if arrs[n].size != int(np.prod(d.shape[1:])):
                    raise PopRTRuntimeError(f"PackRunner takes one sample: input '{n}' has shape {list(arrs[n].shape)}, "
                                        f"a sample is {list(d.shape[1:])}")
                arrs[n] = arrs[n].reshape(d.shape[1:])
            length = int(np.count_nonzero(arrs[cfg.dynamic_input_name])) if cfg.dynamic_input_name else 0
            return arrs, length
        for n, a in arrs.items():
            if a.ndim == 2 and a.shape[0] == 1:
                a = a[0]
            if a.ndim != 1:
                raise PopRTRuntimeError(f"PackRunner takes one sequence: input '{n}' has shape {list(arrs[n].shape)}; "
                                    f"give [L] or [1, L]")
            arrs[n] = a
        dyn = cfg.dynamic_input_name or cfg.single_row_input
        length = arrs[dyn].shape[0]
        if not 1 <= length <= self.seq:
            raise PopRTRuntimeError(f"A sequence of {length} tokens does not fit the compiled sequence length {self.seq}")
        bad = {n: a.shape[0] for n, a in arrs.items() if a.shape[0] != length}
        if bad:
            raise PopRTRuntimeError(f"Inputs of one sequence must have its length {length} (from '{dyn}'); got {bad}")
        return arrs, length

    def _fill_missing(self, arrs: dict) -> None:
        """Give the inputs a request left out their values, as PopRT's pack runner does: an input
        named like ``position_ids`` (``*position*``) counts 0, 1, ... along the sample's tokens;
        the single-row mode's ``unpack_info`` input and any other input are zeros. The sample's
        length comes from the dynamic input (packed) or the descriptor (unpacked)."""
        ins = self.runner._inputs
        missing = [n for n in ins if n not in arrs]
        if not missing:
            return
        if self.packed:
            dyn = arrs[self.config.dynamic_input_name or self.config.single_row_input]
            length = int(dyn.shape[-1]) if dyn.ndim else 1
            for n in missing:
                dt = ins[n].dtype
                arrs[n] = np.arange(length, dtype=dt) if "position" in n.lower() else np.zeros(length, dt)
            return
        for n in missing:
            shape = ins[n].shape[1:]
            if "position" in n.lower() and shape:
                arrs[n] = np.broadcast_to(np.arange(shape[-1], dtype=ins[n].dtype), shape).copy()
            else:
                arrs[n] = np.zeros(shape, ins[n].dtype)

    def executeAsync(self, inputs: dict, outputs: dict | None = None) -> Future:  # noqa: N802
        """Queue one sample; the :class:`Future`'s ``get()`` gives its outputs (``outputs`` filled)."""
        arrs, length = self._sample(inputs)
        if outputs is not None:
            bad = [n for n in outputs if n not in self._seq_outputs]
            if bad:
                raise PopRTRuntimeError(f"Outputs {bad} cannot be returned per sample: in packed mode only outputs "
                                    f"[batch, seq, ...] are unpacked ({self._seq_outputs})")
        fut = _CFuture()
        now = time.perf_counter()
        dev = self.runner._device
        # predicted time: the sample's arrival on the calling thread's modelled clock (_timing)
        modelled = dev.arrival() if dev is not None else now
        with self._cv:
            if self._stop:
                raise PopRTRuntimeError("The pack runner is closed")
            self._queue.append((arrs, length, outputs, fut, now, modelled))
            self._cv.notify()
        return Future(fut)

    execute_async = executeAsync

    def execute(self, inputs: dict, outputs: dict | None = None) -> dict:
        """Run one sample and wait for it (:meth:`executeAsync`); returns its outputs."""
        fut = self.executeAsync(inputs, outputs)
        out = fut.get()
        if self.runner._device is not None:       # predicted time: this thread's modelled clock
            self.runner._device.returned(fut._f.completes)
        return out

    # -- packing --------------------------------------------------------------------------
    def _plan(self, queue: list) -> tuple[list, list]:
        """Place queued samples into rows: ``(taken [(queue index, row, offset)], row fill)``.
        Unpacked: one sample per row, in arrival order (``next_fit``: longest first)."""
        if not self.packed:
            idx = list(range(min(len(queue), self.max_samples)))
            if self.config.algorithm == PackAlgorithm.next_fit:
                idx.sort(key=lambda i: -queue[i][1])
            return [(i, r, 0) for r, i in enumerate(idx)], [1] * len(idx)
        fill = [0] * self.rows
        taken = []
        cur = 0
        for i, (_a, length, *_r) in enumerate(queue):
            if len(taken) >= self.max_samples:
                break
            if self.config.algorithm == PackAlgorithm.first_fit:
                row = next((r for r in range(self.rows) if fill[r] + length <= self.seq), None)
            else:
                if fill[cur] + length > self.seq and cur + 1 < self.rows:
                    cur += 1
                row = cur if fill[cur] + length <= self.seq else None
            if row is None:
                if self.config.algorithm == PackAlgorithm.next_fit:
                    break
                continue
            taken.append((i, row, fill[row]))
            fill[row] += length
        return taken, [f for f in fill if f]

    def _ready(self) -> bool:
        q = self._queue
        if len(q) >= self.max_samples:
            return True
        if self.packed:
            return sum(x[1] for x in q) >= self.rows * self.seq
        return len(q) >= self.rows

    def _loop(self):
        timeout = self.config.timeout_microseconds / 1e6
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait()
                if self._stop and not self._queue:
                    return
                deadline = self._queue[0][4] + timeout
                while not self._ready() and not self._stop:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                ready = self._ready()
                taken, fill = self._plan(self._queue)
                reqs = [(self._queue[i], row, off) for i, row, off in taken]
                gone = {i for i, _r, _o in taken}
                self._queue = [x for i, x in enumerate(self._queue) if i not in gone]
            # predicted time: the batch is formed, on the modelled clock, when its last sample
            # arrived (a full batch) or when the oldest one's timeout ran out (the flush)
            formed = (max(x[0][5] for x in reqs) if ready else min(x[0][5] for x in reqs) + timeout) if reqs else 0.0
            self._run_batch(reqs, fill, formed)

    def _run_batch(self, reqs, fill, formed: float = 0.0):
        ins = self.runner._inputs
        try:
            feeds = {n: np.zeros(d.shape, d.dtype) for n, d in ins.items()}
            seg = np.zeros(self.rows, np.int64)
            for (arrs, length, *_x), row, off in reqs:
                if self.packed:
                    seg[row] += 1
                    for n, a in arrs.items():
                        feeds[n][row, off:off + length] = seg[row] if n == self.config.single_row_input else a
                else:
                    for n, a in arrs.items():
                        feeds[n][row] = a
            dev = self.runner._device
            if dev is None:
                res = self.runner._run_one(feeds)
            else:       # predicted time: the device takes the batch at `start`, delivers it later
                self.runner._n_exec += 1
                # the batch arrives when it was formed or when this thread (its modelled clock:
                # the last batch's start plus the CPU time since) could hand it over, if later
                fut, start = dev.submit(self.runner._predicted_outputs, max(dev.arrival(), formed))
                fut.add_done_callback(lambda f: self._fail(reqs, f.exception()) if f.exception() is not None
                                      else self._deliver(reqs, fill, f.result(), f.completes))
                time.sleep(max(start - time.perf_counter(), 0.0))
                dev.returned(start)
                return
        except Exception as e:  # noqa: BLE001 - handed to every waiting future
            self._fail(reqs, e)
            return
        self._deliver(reqs, fill, res)

    @staticmethod
    def _fail(reqs, err: BaseException) -> None:
        for (_a, _l, _o, fut, *_t), _r, _f in reqs:
            if not fut.done():
                fut.set_exception(err)

    def _deliver(self, reqs, fill, res: dict, completes: float | None = None) -> None:
        """Count the batch and hand each request its sample's outputs (``res``: the batch's;
        ``completes``: its modelled completion in predicted time, kept on each future)."""
        now = time.perf_counter()
        with self._cv:
            self.batches_run += 1
            self._stats["samples"] += len(reqs)
            self._stats["rows"] += len(fill)
            self._stats["tokens"] += sum(x[0][1] for x in reqs)
            self._t_first = min(self._t_first or reqs[0][0][4], min(x[0][4] for x in reqs))
            self._t_last = now
        for (arrs, length, outs, fut, *_t), row, off in reqs:
            fut.completes = completes if completes is not None else now
            try:
                sample = {}
                for n in self._seq_outputs:
                    v = res[n]
                    if self.packed:
                        sample[n] = v[row, off:off + length].copy()
                    else:
                        sample[n] = v[row:row + 1].copy()
                if outs is None:
                    fut.set_result(sample)
                    continue
                for n, dst in outs.items():
                    src = sample[n]
                    if not isinstance(dst, np.ndarray) or not dst.flags.writeable:
                        raise PopRTRuntimeError(f"Output '{n}' must be a writeable numpy array")
                    if self.packed:
                        flat = dst.reshape(-1, *src.shape[1:]) if dst.size % max(int(np.prod(src.shape[1:])), 1) == 0 \
                            else None
                        if flat is None or flat.shape[0] < length:
                            raise PopRTRuntimeError(f"Output '{n}' has shape {list(dst.shape)}; a sequence of {length} "
                                                f"tokens gives {list(src.shape)}")
                        flat[:length] = src
                        flat[length:] = 0
                    else:
                        np.copyto(dst, src.reshape(dst.shape), casting="unsafe")
                fut.set_result(outs)
            except Exception as e:  # noqa: BLE001
                fut.set_exception(e)

    # -- figures --------------------------------------------------------------------------
    def pack_stats(self) -> dict:
        """Packing so far: ``samples``, ``batches`` run, ``rows`` holding data, ``valid_tokens``,
        ``samples_per_batch``, ``token_efficiency`` (valid tokens / tokens of the batches run;
        packed mode) and ``row_efficiency`` (rows with data / rows run); ``host_samples_per_second``
        (host wall time from the first sample's arrival to the last batch's end)."""
        with self._cv:
            st, b = dict(self._stats), self.batches_run
            span = (self._t_last - self._t_first) if self._t_first is not None else 0.0
        cap = b * self.rows * (self.seq if self.packed else 1)
        return {"samples": st["samples"], "batches": b, "rows": st["rows"], "valid_tokens": st["tokens"],
                "samples_per_batch": st["samples"] / b if b else 0.0,
                "token_efficiency": st["tokens"] / cap if (cap and self.packed) else 0.0,
                "row_efficiency": st["rows"] / (b * self.rows) if b else 0.0,
                "host_samples_per_second": st["samples"] / span if span > 0 else 0.0}

    def predicted_qps(self) -> float:
        """Predicted IPU samples/s at the packing achieved so far: samples per batch times batches
        per second of the compiled executable (its predicted steady-state batch period)."""
        p = self.runner.predicted
        st = self.pack_stats()
        return st["samples_per_batch"] * p.clock_hz / max(p.batch_period_cycles, 1.0)

    def report(self) -> str:
        """Predicted IPU figures (at the packing achieved) beside host figures, labelled."""
        st, p = self.pack_stats(), self.runner.predicted
        shape = f"{self.rows} rows x {self.seq} tokens" if self.packed else f"{self.rows} rows"
        eff = f", {st['token_efficiency']:.1%} of the tokens valid" if self.packed else ""
        return (f"packing: {st['samples']} samples in {st['batches']} batches of {shape} "
                f"({st['samples_per_batch']:.2f} samples a batch{eff}); "
                f"predicted IPU ({self.runner.executable.target['ipu_version']}): {self.predicted_qps():,.0f} samples/s, "
                f"{p.latency_seconds * 1e3:.3f} ms a batch; host simulation: {st['host_samples_per_second']:.2f} samples/s")

    def close(self):
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._worker.join()
        self.runner.close()
