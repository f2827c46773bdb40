"""``openipu sweep``: the sub-command's arguments and its main (exit status: see
:mod:`openipu.sizing`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import product

from openipu import forked_jobs, runner
from openipu.sizing.output import _write_text, document, plot_html, table, write_csv
from openipu.sizing.sweeper import (DEFAULT_BATCH_LIMIT, EXIT_INTERRUPTED, Point, PointSpec, Sweeper, _gb, _groups,
                                    _one_line)


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
