"""Sizing a model: ``openipu sweep MODEL`` predicts it over batch sizes, targets and inference
options, and finds the largest batch that fits (``--max-batch``).

Every point is an offline prediction of :func:`openipu.runner.run_model` (``--offline``: compiled
for an offline IPU, predicted, nothing run), with the options of
:class:`openipu.runner.InferenceOptions`. Points share what does not change between them, in one
process:

- the model is read once (``onnx.load``), converted to half once per precision, and set to each
  batch size once (PopRT's batch-size pass);
- points that differ only in what is read when the IR is lowered (available memory proportion,
  partials type, IPU generation, I/O tiles) share the PopART IR (the model's import, shape
  inference, constant folding) and only compile again;
- the convolution / matmul planner keeps its plans in one module-wide cache, so an op whose
  problem and options did not change between points is not planned again;
- a point whose available memory proportion is lower than that of a point already predicted
  (all else equal) takes that point's prediction when every plan of it needs no more temporary
  memory than the lower budget allows: the planner keeps the fastest plan within the budget, so
  it would choose the same plans, and nothing else in the compile reads the proportion (points
  are predicted from the highest proportion down);
- Python, torch and the libraries are imported once.

Host memory: a point's compiled graph is freed (and its reference cycles collected) as soon as
the point is predicted, so a sweep's peak is that of its largest point plus the models it keeps
(the half model, the batched model of the current batch) and the exchange-geometry memo
(:mod:`openipu.poplar.structure_cache`, bounded).

Figures: the prediction (latency, throughput, cycles, tile memory) is predicted IPU figures of
the cost model, never host time; ``host_seconds`` of a point and of the sweep is this machine's
wall time.

Exit status of ``openipu sweep``: 0 when at least one point fits, 3 when none does, 1 error,
2 usage (as ``openipu run``), 130 when interrupted (Ctrl-C / SIGINT): the table, CSV, JSON and
plot are still written, of the points predicted before the interrupt.
"""

from __future__ import annotations

import argparse
import csv
import gc
import io
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from itertools import product

import onnx

from openipu import forked_jobs, runner

#: exit status of a sweep stopped by Ctrl-C (SIGINT), as a shell reports it
EXIT_INTERRUPTED = 130

#: Largest batch ``--max-batch`` tries unless ``--batch-limit`` says otherwise.
DEFAULT_BATCH_LIMIT = 4096

#: columns of the table and the CSV, in order
COLUMNS = ("batch", "ipu", "num_ipus", "precision", "partials_type", "available_memory_proportion", "num_io_tiles",
           "fits", "latency_ms", "throughput", "worst_tile_bytes", "tile_use", "shortfall_bytes",
           "over_budget_plans", "host_seconds")


@dataclass(frozen=True)
class PointSpec:
    """One sweep point: the batch size, the target and the inference options that vary."""

    batch: int
    ipu: str = "ipu2"
    num_ipus: int = 1
    precision: str = "fp32"
    partials_type: str = "half"
    available_memory_proportion: float = 0.6
    num_io_tiles: int = 0

    def others(self) -> tuple:
        """Everything but the batch: the series a point belongs to (one line of the plot)."""
        return (self.ipu, self.num_ipus, self.precision, self.partials_type, self.available_memory_proportion,
                self.num_io_tiles)

    def series_label(self) -> str:
        partials = "float" if self.precision == "fp32" else self.partials_type     # as used
        return (f"{self.ipu} x{self.num_ipus} {self.precision} {partials} partials, "
                f"AMP {self.available_memory_proportion:g}" + (f", {self.num_io_tiles} I/O tiles"
                                                               if self.num_io_tiles else ""))


@dataclass
class Point:
    """A predicted point: its spec, the :class:`openipu.runner.ModelRun` (``None`` with an
    error) and the host seconds it took (this machine)."""

    spec: PointSpec
    run: "runner.ModelRun | None"
    host_seconds: float
    error: str | None = None
    same_plans_as: "PointSpec | None" = None    # the point whose prediction this one took

    @property
    def fits(self) -> bool:
        return self.run is not None and self.run.fits

    def row(self) -> dict:
        """The point as a table / CSV row (predicted IPU figures and the host seconds)."""
        s, r = self.spec, self.run
        row = {"batch": s.batch, "ipu": s.ipu, "num_ipus": s.num_ipus, "precision": s.precision,
               "partials_type": s.partials_type if s.precision != "fp32" else "float",     # as used
               "available_memory_proportion": s.available_memory_proportion,
               "num_io_tiles": s.num_io_tiles, "host_seconds": round(self.host_seconds, 3)}
        if r is None:
            row.update({"fits": "error", "latency_ms": "", "throughput": "", "worst_tile_bytes": "", "tile_use": "",
                        "shortfall_bytes": "", "over_budget_plans": ""})
            return row
        row.update({"fits": r.fits, "latency_ms": r.latency * 1e3, "throughput": r.throughput,
                    "worst_tile_bytes": r.tile_bytes_max, "tile_use": r.tile_bytes_max / r.bytes_per_tile,
                    "shortfall_bytes": r.shortfall_bytes, "over_budget_plans": len(r.over_budget_plans)})
        return row


@dataclass
class Sweeper:
    """Predicts points of one model, sharing the work points have in common (module doc).

    Args:
        model: a path, a bundled model name or an ``onnx.ModelProto``.
        tiles_per_ipu: tiles of each IPU (default: the generation's).
        batches_per_step: PopART batches per step, for every point.
        overlap_io: as :class:`openipu.runner.InferenceOptions` (None: with I/O tiles).
    Raises ``FileNotFoundError`` / ``ValueError`` for a model that cannot be read.
    """

    model: "str | onnx.ModelProto"
    tiles_per_ipu: int | None = None
    batches_per_step: int = 1
    overlap_io: bool | None = None
    points: list = field(default_factory=list)

    def __post_init__(self):
        self._read = None                   # the model as read (see _proto)
        if isinstance(self.model, onnx.ModelProto):
            self.path, self._read = f"<ModelProto {self.model.graph.name}>", self.model
        else:
            self.path = str(runner.resolve_model(self.model))
            try:
                self._read = onnx.load(self.path)
            except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
                raise ValueError(f"'{self.path}' is not a readable ONNX model ({type(e).__name__}: {e})") from None
        self._by_precision: dict = {}       # precision -> the model converted (not yet batched)
        self._batched: tuple | None = None  # ((batch, precision), proto): the last one only
        self._given = False                 # _batched's proto was handed to a session (weights gone)
        self._sessions: dict = {}           # the last PopART session (its IR), see runner.run_model
        self._done: dict = {}               # PointSpec -> Point
        #: the most worker processes a sweep ran at once (1: all in this process)
        self.jobs = 1
        #: host bytes the first point added to the shared state (the worker estimate), or None
        self.point_rss_estimate: int | None = None
        #: peak resident set of this process and the largest of the workers' (bytes; None: unknown)
        self.parent_peak_rss: int | None = None
        self.worker_peak_rss: int | None = None

    @property
    def _proto(self) -> onnx.ModelProto:
        """The model as read. A model read from a file is dropped once it has been converted to
        half (an fp16 sweep then holds the half model, not the float one beside it: for
        BERT-base 440 MB of host memory less) and read again if a float point needs it."""
        if self._read is None:
            self._read = onnx.load(self.path)
        return self._read

    def _base(self, precision: str) -> onnx.ModelProto:
        """The model converted to ``precision``, not yet batched (kept for the sweep)."""
        base = self._by_precision.get(precision)
        if base is None:
            base = runner.prepare_model(self._proto, None, precision) if precision == "fp16" else self._proto
            self._by_precision[precision] = base
            if precision == "fp16" and not isinstance(self.model, onnx.ModelProto):
                self._read = None
        return base

    def _prepared(self, spec: PointSpec) -> onnx.ModelProto:
        """The model at ``spec``'s batch and precision. The batched model is handed to the
        session that compiles it (its weights move into the IR rather than being copied), so it
        is returned again only while that session, which the next point of the same batch
        compiles again, is kept; otherwise it is batched anew from the kept converted model."""
        key = (spec.batch, spec.precision)
        if self._batched is not None and self._batched[0] == key:
            proto = self._batched[1]
            if not self._given or runner.session_key(proto, self.batches_per_step, spec.num_ipus,
                                                     spec.ipu) in self._sessions:
                return proto
        base = self._base(spec.precision)
        self._drop_prepared()           # the last IR: it holds the weights of another batch size
        proto = runner.prepare_model(base, spec.batch, "fp32")       # batch only: already converted
        self._batched, self._given = (key, proto), False
        return proto

    def _drop_prepared(self) -> None:
        """Drop the batched model and the kept IR (collected now)."""
        if self._sessions or self._batched is not None:
            self._sessions.clear()
            self._batched = None
            gc.collect()

    def predict(self, spec: PointSpec) -> Point:
        """Predict one point (at most once per spec). Option values out of range raise
        :class:`openipu.runner.UsageError`; a model that cannot be compiled gives a point with
        ``error`` set (PopART's, Poplar's or PopLibs' message), not an exception."""
        if spec in self._done:
            return self._done[spec]
        runner.check_options(ipu=spec.ipu, num_ipus=spec.num_ipus, batch_size=spec.batch,
                             batches_per_step=self.batches_per_step, precision=spec.precision,
                             available_memory_proportion=spec.available_memory_proportion,
                             tiles_per_ipu=self.tiles_per_ipu, num_io_tiles=spec.num_io_tiles,
                             overlap_io=self.overlap_io, partials_type=spec.partials_type)
        t0 = time.perf_counter()
        same = self._same_plans(spec)
        if same is not None:
            q = self._done[same]
            run = replace(q.run, options=replace(q.run.options,
                                                 available_memory_proportion=spec.available_memory_proportion),
                          host_compile_seconds=0.0, host_run_seconds=0.0)
            point = Point(spec, run, time.perf_counter() - t0, same_plans_as=same)
            self._done[spec] = point
            self.points.append(point)
            return point
        try:
            proto = self._prepared(spec)
            self._given = True          # the session takes its weights (if it is made now)
            run = runner.run_model(self.path, ipu=spec.ipu, num_ipus=spec.num_ipus, batch_size=spec.batch,
                                   batches_per_step=self.batches_per_step, precision=spec.precision,
                                   available_memory_proportion=spec.available_memory_proportion,
                                   tiles_per_ipu=self.tiles_per_ipu, offline=True, num_io_tiles=spec.num_io_tiles,
                                   overlap_io=self.overlap_io, partials_type=spec.partials_type,
                                   _prepared=proto, _sessions=self._sessions, _give_prepared=True)
            point = Point(spec, run, time.perf_counter() - t0)
        except runner.UsageError:
            raise
        except (ValueError, MemoryError) as e:
            point = Point(spec, None, time.perf_counter() - t0, f"{type(e).__name__}: {_one_line(e)}")
        except Exception as e:  # noqa: BLE001 - PopART / Poplar / PopLibs refusals: the point's error
            if not type(e).__module__.startswith(("openipu.popart", "openipu.poplar", "openipu.poplibs")):
                raise
            point = Point(spec, None, time.perf_counter() - t0, f"{type(e).__name__}: {_one_line(e)}")
        finally:
            self._release()
        self._done[spec] = point
        self.points.append(point)
        return point

    def _release(self) -> None:
        """Free the compiled graph of the point just predicted before the next one is built: the
        kept session holds only its IR (which the next point may compile again), and the
        graph's reference cycles are collected now rather than whenever the collector's
        thresholds next fire, which could be in the middle of the next compile (a sweep
        would then hold two graphs at its peak)."""
        for session in self._sessions.values():
            session._engine = session._lowered = None
        gc.collect()

    def _same_plans(self, spec: PointSpec) -> "PointSpec | None":
        """A predicted point equal to ``spec`` but for a higher available memory proportion, all
        of whose plans fit ``spec``'s budget (so the planner would choose them again), if any."""
        for q, p in self._done.items():
            if (p.run is not None and p.same_plans_as is None and q.available_memory_proportion >
                    spec.available_memory_proportion and replace(q, available_memory_proportion=0.0) ==
                    replace(spec, available_memory_proportion=0.0) and not p.run.over_budget_plans
                    and p.run.plan_temp_bytes_max <= spec.available_memory_proportion * p.run.bytes_per_tile):
                return q
        return None

    def sweep(self, specs, progress=None, jobs: int | None = 1, log=None) -> list:
        """Predict ``specs`` in the order that shares most (precision, batch, IPUs outermost);
        returns the points in the order given. ``progress(point)`` is called after each.

        ``jobs``: worker processes (1: all in this process; None: :meth:`choose_jobs`). With
        more than one, the points of the first batch size are predicted here (warming the plan
        cache and the exchange-geometry memo), and each other batch size's points, in the same
        order as in one process, in a worker forked from this one (:mod:`openipu.forked_jobs`):
        the points, and so the table, CSV, JSON and plot, are those of ``jobs=1``; only the host
        seconds differ. ``log(text)`` receives the choice of ``jobs``."""
        specs = list(specs)
        order = sorted(specs, key=lambda s: (s.precision, s.batch, s.num_ipus, s.ipu if s.num_ipus > 1 else "",
                                             s.ipu, s.num_io_tiles, s.partials_type, -s.available_memory_proportion))
        groups = _groups(order)
        if jobs == 1 or not forked_jobs.fork_available():
            for s in order:
                p = self.predict(s)
                if progress:
                    progress(p)
        else:
            self._measured(groups[0], progress)
            self._predict_groups(groups[1:], jobs, progress, log)
        return [self._done[s] for s in specs]

    def _measured(self, group, progress) -> None:
        """Predict ``group`` here and measure what it added to this process's memory: the
        estimate of a worker's own memory (:meth:`choose_jobs`)."""
        self._base(group[0].precision)              # shared by the workers, not theirs
        gc.collect()
        before, peak0 = forked_jobs.rss_bytes(), forked_jobs.peak_rss_bytes()
        reset = forked_jobs.reset_peak_rss()
        for s in group:
            p = self.predict(s)
            if progress:
                progress(p)
        peak = forked_jobs.peak_rss_bytes()
        if reset and before is not None and peak is not None:
            self.point_rss_estimate = max(peak - before, 1 << 20)
        self.parent_peak_rss = max(x for x in (peak0, peak, self.parent_peak_rss, 0) if x is not None) or None

    def choose_jobs(self, requested: int | None, tasks: int, log=None) -> int:
        """Worker processes for ``tasks`` batch sizes: ``requested``, or (None) the usable cores
        (``os.sched_getaffinity``) capped by host memory: as many workers as 80 % of
        ``MemAvailable`` holds at 1.5 x what the first point added to this process's memory
        (:attr:`point_rss_estimate`; larger batches need more); never more than ``tasks``.
        ``log(text)`` receives the choice and its reasons."""
        cores = forked_jobs.usable_cores()
        avail = runner.host_memory_available()
        est = self.point_rss_estimate
        if requested is None:
            by_memory = max(1, int(0.8 * avail // (1.5 * est))) if est else cores
            jobs = max(1, min(cores, by_memory, tasks))
            why = f"{cores} usable core(s)" + (f", memory for {by_memory}" if est else "")
        else:
            jobs, why = max(1, min(requested, tasks)), f"--jobs {requested}"
        if log:
            first = f"the first point added {_gb(est)} to this process" if est else "no point measured yet"
            log(f"openipu sweep: {jobs} worker process(es) for {tasks} batch size(s) ({why}; {first}, "
                f"{_gb(avail)} of host memory available)")
        return jobs

    def _predict_groups(self, groups, jobs, progress, log=None) -> None:
        """Predict each group of points (one batch size and precision) in a forked worker, at
        most ``jobs`` at once (None: :meth:`choose_jobs`), recording the points as they come."""
        if not groups:
            return
        jobs = self.choose_jobs(jobs, len(groups), log)
        if jobs == 1 or len(groups) == 1:
            for g in groups:
                for s in g:
                    p = self.predict(s)
                    if progress:
                        progress(p)
            return
        self.jobs = max(self.jobs, jobs)
        first = len(self.points)
        where = {s: i for i, s in enumerate(s for g in groups for s in g)}
        self._drop_prepared()           # each worker batches its own; the converted model is shared

        def work(group, send):
            for s in group:
                send(self.predict(s))

        def on_result(p: Point) -> None:
            self._done[p.spec] = p
            self.points.append(p)
            if progress:
                progress(p)

        def on_lost(group, received, reason) -> None:
            for s in group[received:]:
                on_result(Point(s, None, 0.0, f"not predicted: {reason} while predicting batch {group[received].batch} "
                                              f"({group[received].series_label()})"))
        peaks = forked_jobs.run_tasks(groups, work, jobs, on_result, on_lost)
        self.points[first:] = sorted(self.points[first:], key=lambda p: where.get(p.spec, -1))
        known = [x for x in peaks + [self.worker_peak_rss] if x is not None]
        self.worker_peak_rss = max(known) if known else None
        peak = forked_jobs.peak_rss_bytes()
        if peak is not None:
            self.parent_peak_rss = max(peak, self.parent_peak_rss or 0)

    def predict_many(self, specs, jobs: int = 1, progress=None) -> list:
        """Predict ``specs`` (each batch size in a worker when ``jobs`` > 1; points already
        predicted, or that take a higher proportion's plans, here); returns them in order."""
        specs = list(specs)
        todo = []
        for s in specs:
            if s in self._done or self._same_plans(s) is not None or jobs == 1:
                p = self.predict(s)
                if progress:
                    progress(p)
            elif s not in todo:
                todo.append(s)
        self._predict_groups(_groups(todo), jobs, progress)
        return [self._done[s] for s in specs]

    def max_batches(self, templates, start: int = 1, limit: int = DEFAULT_BATCH_LIMIT, progress=None,
                    jobs: int = 1) -> list:
        """:meth:`max_batch` of each template, returned in the order given as ``[(template,
        batch or None)]``, searched from the highest available memory proportion down, so that
        a lower proportion's points can take the plans of a higher one's (the same-plans rule of
        the module docstring) instead of compiling again."""
        found = {}
        for t in sorted(templates, key=lambda t: -t.available_memory_proportion):
            found[t] = self.max_batch(t, start=start, limit=limit, progress=progress, jobs=jobs)[0]
        return [(t, found[t]) for t in templates]

    def max_batch(self, template: PointSpec, start: int = 1, limit: int = DEFAULT_BATCH_LIMIT, progress=None,
                  jobs: int = 1):
        """The largest batch in [1, ``limit``] that fits with ``template``'s other settings, by
        doubling from ``start`` until a batch does not fit and then bisecting (assumes memory
        grows with the batch). Returns ``(batch or None, the points tried)``; None when even
        batch 1 does not fit. With ``jobs`` > 1, each round predicts ``jobs`` batches at once in
        worker processes (:meth:`_max_batch_rounds`): the same answer when memory grows with the
        batch, in fewer rounds."""
        if jobs > 1 and forked_jobs.fork_available():
            return self._max_batch_rounds(template, start, limit, progress, jobs)
        tried = []

        def fits(b: int) -> bool:
            p = self.predict(PointSpec(b, *template.others()))
            tried.append(p)
            if progress:
                progress(p)
            return p.fits
        lo, hi = 0, None            # lo fits (0: none known), hi does not
        b = max(1, min(start, limit))
        while True:
            if fits(b):
                lo = b
                if b >= limit:
                    return lo, tried
                b = min(b * 2, limit)
            else:
                hi = b
                break
        if lo == 0:                 # the start did not fit: bisect below it
            if hi == 1:
                return None, tried
            lo_try = 1
            if not fits(lo_try):
                return None, tried
            lo = 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo, tried


    def _max_batch_rounds(self, template: PointSpec, start: int, limit: int, progress, jobs: int):
        """:meth:`max_batch` as a k-ary search: while growing, a round tries ``start`` and the
        next ``jobs - 1`` doublings; then each round splits the interval between the largest
        batch known to fit and the smallest known not to into ``jobs + 1`` parts and tries the
        ``jobs`` batches between them (when ``start`` does not fit, batch 1 is among the first
        round's, as the bisection tries it first). A round's batches are predicted at once, one
        worker process each. With memory growing with the batch the answer is the bisection's."""
        tried = []

        def round_(batches):
            pts = self.predict_many([PointSpec(b, *template.others()) for b in batches], jobs, progress)
            tried.extend(pts)
            return [p.fits for p in pts]

        def narrow(batches, fits, lo, hi):
            for b, ok in zip(batches, fits):        # ascending: the last that fits before the first that does not
                if not ok:
                    return lo, b
                lo = b
            return lo, hi

        lo, hi, b = 0, None, max(1, min(start, limit))      # lo fits (0: none known), hi does not
        while hi is None:
            batches = [b]
            while len(batches) < jobs and batches[-1] < limit:
                batches.append(min(batches[-1] * 2, limit))
            lo, hi = narrow(batches, round_(batches), lo, hi)
            if hi is None:
                if lo >= limit:
                    return lo, tried
                b = min(lo * 2, limit)
        while hi - lo > 1:
            if lo == 0:         # the start does not fit: batch 1 first, as the bisection tries it first
                k = min(jobs - 1, hi - 2)
                batches = sorted({1} | {1 + (hi - 1) * i // (k + 1) for i in range(1, k + 1)} - {hi})
            else:
                k = min(jobs, hi - lo - 1)
                batches = sorted({lo + (hi - lo) * i // (k + 1) for i in range(1, k + 1)} - {lo, hi})
            lo, hi = narrow(batches, round_(batches), lo, hi)
        return (lo or None), tried


def _groups(order) -> list:
    """``order`` split into runs of points of one precision and batch size (a worker's task)."""
    groups = []
    for s in order:
        if groups and (groups[-1][0].precision, groups[-1][0].batch) == (s.precision, s.batch):
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


def _gb(b) -> str:
    return "?" if b is None else f"{b / 1e9:,.2f} GB"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


# ------------------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------------------

def table(points) -> str:
    """The points as a text table (predicted IPU figures; host seconds last)."""
    head = ("batch", "ipu", "ipus", "prec", "partials", "AMP", "io", "fits", "latency ms", "samples/s",
            "worst tile", "of tile", "shortfall B", "host s")
    rows = []
    for p in points:
        r = p.row()
        if p.run is None:
            rows.append((r["batch"], r["ipu"], r["num_ipus"], r["precision"], r["partials_type"],
                         f"{r['available_memory_proportion']:g}", r["num_io_tiles"], "error", "", "", "", "", "",
                         f"{r['host_seconds']:.1f}"))
            continue
        rows.append((r["batch"], r["ipu"], r["num_ipus"], r["precision"], r["partials_type"],
                     f"{r['available_memory_proportion']:g}", r["num_io_tiles"], "yes" if r["fits"] else "NO",
                     f"{r['latency_ms']:,.3f}", f"{r['throughput']:,.1f}",
                     f"{r['worst_tile_bytes'] / 1024:,.1f} KiB", f"{r['tile_use']:.0%}",
                     f"{r['shortfall_bytes']:,}" if r["shortfall_bytes"] else "", f"{r['host_seconds']:.1f}"))
    width = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda row: "  ".join(str(x).rjust(w) for x, w in zip(row, width))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in width])] + [fmt(r) for r in rows])


def write_csv(points, path: str) -> None:
    """One row per point, :data:`COLUMNS` (raw numbers: seconds as ms, bytes, samples/s)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for p in points:
        w.writerow(p.row())
    _write_text(path, buf.getvalue())


def document(sweeper: Sweeper, points, max_batches, host_seconds: float, interrupted: bool = False) -> dict:
    """The sweep as one JSON document: every point's ``openipu run --json`` document (or its
    error), the largest batches found and the sweep's host seconds (schema
    ``docs/sweep.schema.json``); ``interrupted``: stopped by Ctrl-C before every point was
    predicted (the points are those done)."""
    pts = []
    for p in points:
        d = {"spec": p.spec.__dict__, "host_seconds": p.host_seconds}
        if p.same_plans_as is not None:
            d["same_plans_as"] = p.same_plans_as.__dict__
        if p.run is not None:
            d["run"] = p.run.to_dict()
        else:
            d["error"] = p.error
        pts.append(d)
    return {"schema": "openipu.sweep/1", "model": sweeper.path,
            "batches_per_step": sweeper.batches_per_step, "tiles_per_ipu": sweeper.tiles_per_ipu,
            "points": pts, "interrupted": interrupted,
            "max_batch": [{"series": s.__dict__ | {"batch": None}, "batch": b} for s, b in max_batches],
            "host": {"label": "this machine running the simulation; not an IPU figure",
                     "sweep_seconds": host_seconds, "jobs": sweeper.jobs,
                     "parent_peak_rss_bytes": sweeper.parent_peak_rss,
                     "worker_peak_rss_bytes": sweeper.worker_peak_rss}}


def plot_html(sweeper: Sweeper, points, title: str | None = None) -> str:
    """A self-contained HTML page (plotly.js inlined): predicted throughput and predicted
    worst-tile memory against the batch size, one line per series, with the tile's memory as the
    fits line."""
    import html

    import plotly
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("Predicted throughput (samples/s, IPU)",
                                        "Predicted worst-tile memory (KiB, IPU)"))
    series: dict = {}
    for p in points:
        if p.run is not None:
            series.setdefault(p.spec.others(), []).append(p)
    per_tile = None
    for i, (key, pts) in enumerate(sorted(series.items(), key=lambda kv: str(kv[0]))):
        pts = sorted(pts, key=lambda p: p.spec.batch)
        label = pts[0].spec.series_label()
        colour = plotly.colors.qualitative.Plotly[i % len(plotly.colors.qualitative.Plotly)]
        x = [p.spec.batch for p in pts]
        symbols = ["circle" if p.fits else "x" for p in pts]
        text = [f"batch {p.spec.batch}: {'fits' if p.fits else 'does not fit'}" for p in pts]
        fig.add_trace(go.Scatter(x=x, y=[p.run.throughput for p in pts], mode="lines+markers", name=label,
                                 legendgroup=label, line=dict(color=colour), marker=dict(symbol=symbols, size=9),
                                 text=text, hovertemplate="%{text}<br>%{y:,.1f} samples/s<extra>%{fullData.name}"
                                 "</extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[p.run.tile_bytes_max / 1024 for p in pts], mode="lines+markers",
                                 name=label, legendgroup=label, showlegend=False, line=dict(color=colour),
                                 marker=dict(symbol=symbols, size=9), text=text,
                                 hovertemplate="%{text}<br>%{y:,.1f} KiB<extra>%{fullData.name}</extra>"), row=2, col=1)
        per_tile = pts[0].run.bytes_per_tile
    if per_tile:
        fig.add_hline(y=per_tile / 1024, line=dict(color="#c62828", dash="dash"), row=2, col=1,
                      annotation_text=f"tile memory {per_tile / 1024:,.0f} KiB (fits below)",
                      annotation_position="top left")
    # ticks at the batch sizes swept (a log axis labels 2, 3, ... 9 between decades otherwise);
    # at most 16 of them, spread evenly, so a long --max-batch bisection stays readable
    batches = sorted({p.spec.batch for pts in series.values() for p in pts})
    ticks = batches if len(batches) <= 16 else batches[::-(-len(batches) // 16)]
    axis = dict(type="log", tickmode="array", tickvals=ticks, ticktext=[f"{b:,}" for b in ticks])
    fig.update_xaxes(title_text="batch size", row=2, col=1, **axis)
    fig.update_xaxes(row=1, col=1, **axis)
    fig.update_layout(height=760, template="plotly_white", margin=dict(l=70, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.12))
    body = fig.to_html(full_html=False, include_plotlyjs=False, div_id="sweep",
                       config={"displaylogo": False, "responsive": True})
    title = title or f"openipu sweep: {os.path.basename(sweeper.path)}"
    css = ("body{font-family:system-ui,sans-serif;margin:0;color:#222}header{background:#263238;color:#fff;"
           "padding:10px 20px}section{padding:10px 20px}p.note{color:#555;font-size:13px}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<link rel='icon' href='data:,'><style>{css}</style><script>{plotly.offline.get_plotlyjs()}</script>"
            f"</head><body><header><b>{html.escape(title)}</b></header><section><p class='note'>Predicted IPU "
            "figures of the cost model (not host time). Crosses: points that do not fit in tile memory; the "
            "dashed line is a tile's memory.</p>" + body + "</section></body></html>")


def _write_text(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------

def _list_of(kind, what: str):
    def parse(text: str):
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{what}: give a comma-separated list")
        try:
            return [kind(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: '{text}' is not a comma-separated list of "
                                             f"{kind.__name__} values") from None
    return parse


def _batches(text: str):
    """``8,16,32`` or a range ``8-64`` (powers of two from 8 to 64) or ``8-64:8`` (step 8)."""
    text = text.strip()
    if "-" in text and "," not in text:
        a, _, rest = text.partition("-")
        b, _, step = rest.partition(":")
        try:
            lo, hi = int(a), int(b)
            st = int(step) if step else 0
        except ValueError:
            raise argparse.ArgumentTypeError(f"--batch-sizes: '{text}' is not a range like 8-64 or 8-64:8") from None
        if lo < 1 or hi < lo or st < 0:
            raise argparse.ArgumentTypeError(f"--batch-sizes: '{text}' is not a range of batch sizes from 1 up")
        if st:
            return list(range(lo, hi + 1, st))
        out, b = [], lo
        while b <= hi:
            out.append(b)
            b *= 2
        if out[-1] != hi:
            out.append(hi)
        return out
    return _list_of(int, "--batch-sizes")(text)


_EXIT_TEXT = """exit status:
  0  some point fits in tile memory
  1  error: unreadable model, every point refused, an output that cannot be written
  2  usage: an unknown flag or an option value outside its range
  3  no point fits in tile memory (the table is printed)
  130  interrupted (Ctrl-C): the table, CSV, JSON and plot hold the points predicted before
Errors are one line on stderr; set OPENIPU_DEBUG=1 to see the traceback of an unexpected one."""


def add_sweep_parser(sub) -> None:
    """The ``openipu sweep`` sub-command (called by :mod:`openipu.cli`)."""
    s = sub.add_parser(
        "sweep", help="predict a model over batch sizes, targets and options; find the largest batch that fits",
        description="Predict MODEL (offline: compiled and predicted, not run) at every combination of the lists "
                    "given, print a table, and optionally write CSV, JSON and an HTML plot. Points share the "
                    "model's import and conversion, the IR of points that differ only in planner options and "
                    "target, and the planner's plans. Defaults: PopRT's production inference options.",
        epilog=_EXIT_TEXT, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("model", help="path of an .onnx file, or a bundled model name")
    s.add_argument("--batch-sizes", type=_batches, default=None, metavar="LIST",
                   help="batch sizes: 8,16,32 or a range 8-64 (doubling) or 8-64:8 (default: the model's)")
    s.add_argument("--ipu", type=_list_of(str, "--ipu"), default=["ipu2"], metavar="LIST",
                   help="IPU generations, of ipu1, ipu2, bow, ipu21 (default ipu2, as openipu run)")
    s.add_argument("--num-ipus", type=_list_of(int, "--num-ipus"), default=[1], metavar="LIST",
                   help="IPU counts the model is sharded over (default 1)")
    s.add_argument("--precision", type=_list_of(str, "--precision"), default=["fp32"], metavar="LIST",
                   help="fp32, fp16 (default fp32, as openipu run and PopRT's converter)")
    s.add_argument("--partials-type", type=_list_of(str, "--partials-type"), default=["half"], metavar="LIST",
                   help="half, float (default half, as PopRT)")
    s.add_argument("--available-memory-proportion", "--amp", type=_list_of(float, "--available-memory-proportion"),
                   default=[0.6], metavar="LIST", help="planner temporary-memory budgets (default 0.6)")
    s.add_argument("--num-io-tiles", type=_list_of(int, "--num-io-tiles"), default=[0], metavar="LIST",
                   help="I/O tiles per IPU (default 0)")
    s.add_argument("--overlap-io", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap host I/O with compute on the I/O tiles (default: when there are I/O tiles)")
    s.add_argument("--batches-per-step", type=int, default=1, help="PopART batches per step (default 1)")
    s.add_argument("--tiles-per-ipu", type=int, default=None, help="use this many tiles of each IPU")
    s.add_argument("--max-batch", action="store_true",
                   help="also find, for each combination of the other lists, the largest batch that fits (doubling "
                        "from the smallest batch size given, then bisection)")
    s.add_argument("--batch-limit", type=int, default=DEFAULT_BATCH_LIMIT,
                   help=f"largest batch --max-batch tries (default {DEFAULT_BATCH_LIMIT})")
    s.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="worker processes predicting batch sizes at once (default: the usable cores, fewer if host "
                        "memory would not hold them, as estimated from the first point; 1: all in one process). "
                        "The results are those of --jobs 1")
    s.add_argument("--csv", metavar="FILE", help="write the points as CSV")
    s.add_argument("--json", metavar="FILE", help="write the sweep as JSON ('-' for stdout, instead of the table)")
    s.add_argument("--plot", metavar="FILE.html", help="write the HTML plot (throughput and worst-tile memory "
                                                     "against batch, with the fits line)")


def sweep_main(args) -> int:
    """Run ``openipu sweep`` from parsed ``args``; returns the exit status."""
    from openipu.cli import EXIT_DOES_NOT_FIT, EXIT_ERROR, EXIT_OK, EXIT_USAGE

    to_stdout = args.json == "-"
    out = sys.stderr if to_stdout else sys.stdout

    def fail(msg: str, code: int = EXIT_ERROR) -> int:
        print(f"openipu sweep: {msg}", file=sys.stderr)
        return code
    for v in args.precision:
        if v not in ("fp32", "fp16"):
            return fail(f"error: --precision must be fp32 or fp16, not '{v}' (see openipu sweep --help)", EXIT_USAGE)
    if args.batch_limit < 1:
        return fail("error: --batch-limit must be at least 1 (see openipu sweep --help)", EXIT_USAGE)
    if args.jobs is not None and args.jobs < 1:
        return fail("error: --jobs must be at least 1 (see openipu sweep --help)", EXIT_USAGE)
    t_start = time.perf_counter()
    try:
        sw = Sweeper(args.model, tiles_per_ipu=args.tiles_per_ipu, batches_per_step=args.batches_per_step,
                     overlap_io=args.overlap_io)
    except (FileNotFoundError, ValueError) as e:
        return fail(_one_line(e))
    batches = args.batch_sizes or [runner._batch_of(runner.fix_input_shapes(sw._proto))
                                   if _static_batch(sw._proto) else 1]
    combos = [PointSpec(1, ipu, n, prec, part, amp, io_) for ipu, n, prec, part, amp, io_ in product(
        args.ipu, args.num_ipus, args.precision, args.partials_type, args.available_memory_proportion,
        args.num_io_tiles)]
    specs = [PointSpec(b, *c.others()) for c in combos for b in batches]
    bar = _bar(len(specs))

    done, reported = [0], set()

    def progress(p: Point) -> None:
        done[0] += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"batch {p.spec.batch} {'fits' if p.fits else 'does not fit'}")
        else:       # not a terminal: one line a point on stderr, so a long sweep shows where it is
            what = (p.error or ("fits" if p.fits else "does not fit")
                    + (f", {p.run.throughput:,.1f} samples/s (predicted)" if p.run else ""))
            again = id(p) in reported          # --max-batch looks again at a point of the grid
            reported.add(id(p))
            print(f"openipu sweep: point {done[0]}: batch {p.spec.batch}, {p.spec.series_label()}: {what} "
                  + ("(predicted above)" if again else f"(host {p.host_seconds:,.1f} s)"), file=sys.stderr, flush=True)
    interrupted, max_batches = False, []
    try:
        for s in (specs[0],) if specs else ():      # option ranges before any compile
            runner.check_options(ipu=s.ipu, num_ipus=s.num_ipus, batch_size=s.batch, precision=s.precision,
                                 available_memory_proportion=s.available_memory_proportion,
                                 tiles_per_ipu=args.tiles_per_ipu, num_io_tiles=s.num_io_tiles,
                                 overlap_io=args.overlap_io, partials_type=s.partials_type,
                                 batches_per_step=args.batches_per_step)
        for c in combos:
            runner.check_options(ipu=c.ipu, num_ipus=c.num_ipus, precision=c.precision,
                                 available_memory_proportion=c.available_memory_proportion,
                                 tiles_per_ipu=args.tiles_per_ipu, num_io_tiles=c.num_io_tiles,
                                 overlap_io=args.overlap_io, partials_type=c.partials_type)
        for b in batches:
            runner.check_options(batch_size=b)
        def log(text: str) -> None:
            (bar.write if bar is not None else lambda t: print(t, file=sys.stderr, flush=True))(text)
        points = sw.sweep(specs, progress, jobs=args.jobs, log=log)
        if args.max_batch:
            if bar is not None:
                bar.set_description("Largest batch")
            jobs = args.jobs if args.jobs is not None else (sw.jobs if len(_groups(specs)) > 1 else
                                                            sw.choose_jobs(None, 1 << 30, log))
            max_batches = sw.max_batches(combos, start=min(batches), limit=args.batch_limit, progress=progress,
                                         jobs=jobs)
    except runner.UsageError as e:
        return fail(f"error: {e} (see openipu sweep --help)", EXIT_USAGE)
    except KeyboardInterrupt:       # Ctrl-C: what was predicted is still written
        interrupted = True
        points = [sw._done[s] for s in specs if s in sw._done]
    finally:
        if bar is not None:
            bar.close()
    host = time.perf_counter() - t_start
    if interrupted:
        print(f"openipu sweep: interrupted after {len(sw.points)} point(s); writing those predicted",
              file=sys.stderr, flush=True)
    print(f"Model     {sw.path}", file=out)
    overlap = {None: "overlapped where there are I/O tiles", True: "overlapped", False: "not overlapped"}
    print(f"Options   batches per step {args.batches_per_step}; host I/O {overlap[args.overlap_io]}; prefetch; "
          "the rest per point below (defaults: PopRT's production inference)", file=out)
    print("Prediction for the IPU (cost model of the simulated target; not host time), offline", file=out)
    print(table(points), file=out)
    for p in points:
        if p.error:
            print(f"  batch {p.spec.batch} ({p.spec.series_label()}): {p.error}", file=out)
    for c, b in max_batches:
        found = f"{b}" if b else "none (batch 1 does not fit)"
        limit = " (the --batch-limit)" if b == args.batch_limit else ""
        print(f"Largest batch that fits, {c.series_label()}: {found}{limit}", file=out)
    n = len(sw.points)
    same = sum(p.same_plans_as is not None for p in sw.points)
    print(f"Host (this machine; not an IPU figure): {n} point(s) predicted in {host:,.1f} s "
          f"({host / max(n, 1):,.1f} s per point, model import and shared work included"
          + (f"; {same} took the plans, and so the prediction, of a point with a higher available memory "
             "proportion" if same else "") + ")", file=out)
    parent_rss = forked_jobs.peak_rss_bytes() if sw.parent_peak_rss is None else \
        max(sw.parent_peak_rss, forked_jobs.peak_rss_bytes() or 0)
    sw.parent_peak_rss = parent_rss
    print("          " + (f"{sw.jobs} worker processes at once" if sw.jobs > 1 else "every point in this process")
          + f"; peak resident set: this process {_gb(parent_rss)}"
          + (f", the largest worker {_gb(sw.worker_peak_rss)} (counting the pages it shares with this process)"
             if sw.worker_peak_rss else ""), file=out)
    try:
        if args.csv:
            write_csv(points, args.csv)
            print(f"CSV written to {args.csv}", file=out)
        if args.plot:
            _write_text(args.plot, plot_html(sw, sw.points))
            print(f"Plot written to {args.plot}", file=out)
        if args.json:
            text = json.dumps(document(sw, points, max_batches, host, interrupted), indent=1)
            if to_stdout:
                print(text)
            else:
                _write_text(args.json, text)
                print(f"JSON written to {args.json}", file=out)
    except OSError as e:
        return fail(f"cannot write {getattr(e, 'filename', '') or 'the output'}: {e.strerror or e}")
    if interrupted:
        return EXIT_INTERRUPTED
    if any(p.error for p in points) and not any(p.run for p in points):
        return EXIT_ERROR
    return EXIT_OK if any(p.fits for p in points) else EXIT_DOES_NOT_FIT


def _static_batch(proto) -> bool:
    try:
        runner.fix_input_shapes(proto)
        return True
    except ValueError:
        return False


def _bar(total: int):
    """A tqdm bar of sweep points on stderr, only when stderr is a terminal."""
    if not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Sweep", file=sys.stderr, unit="point", leave=False)
