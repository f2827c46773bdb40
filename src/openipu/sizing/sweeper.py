"""The points of a sweep and what they share (:class:`Sweeper`), in this process or in forked
worker processes, and the largest batch that fits (see :mod:`openipu.sizing`)."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field, replace

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
    return "?" if b is None else f"{b / 2**30:,.2f} GB"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
