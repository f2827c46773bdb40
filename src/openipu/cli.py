"""``openipu`` command line. ``openipu run MODEL.onnx`` is the main job (see :mod:`openipu.runner`);
``openipu sweep MODEL.onnx`` sizes it over batch sizes, targets and options (:mod:`openipu.sizing`);
``openipu report`` writes the HTML report of a profile. ``openipu --version`` prints the version.

``openipu run --json`` prints one JSON document (schema ``docs/run.schema.json``): the target and
the inference options as applied, the prediction (predicted IPU figures) and the host figures,
apart. Every prediction is made with :class:`openipu.runner.InferenceOptions`, whose defaults are
PopRT's production inference options, and the assumptions are printed with it.

Exit status (``openipu run`` and ``openipu sweep``): 0 success; 1 error (unreadable model or ``--input``, a model the
checks refuse, an unwritable ``--output`` / ``--report``, not enough host memory for a functional
run, any unexpected failure); 2 usage (an unknown flag or an option value outside its range);
3 the model does not fit in tile memory (the prediction, latency included, is still printed).
Errors are one line on stderr, never a traceback; ``OPENIPU_DEBUG=1`` adds the traceback of an
unexpected one.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

#: exit statuses of ``openipu run``
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DOES_NOT_FIT = 0, 1, 2, 3

_EXIT_TEXT = """exit status:
  0  the model ran (or, with --offline, was predicted)
  1  error: unreadable model or --input file, a model the checks refuse, an output path that
     cannot be written, not enough host memory for a functional run (try --offline)
  2  usage: an unknown flag or an option value outside its range
  3  the model does not fit in tile memory (the prediction, latency included, is printed with the
     shortfall: bytes over on the worst tile); for sweep, no point fits
Errors are one line on stderr; set OPENIPU_DEBUG=1 to see the traceback of an unexpected one."""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (status 2) instead of the usage block."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

_CATEGORY_LABELS = {"compute": "compute", "exchange": "exchange", "global_exchange": "IPU-Link",
                    "host_exchange": "host I/O", "sync": "sync"}


def _kib(b: float) -> str:
    return f"{b / 1024:,.1f} KiB"


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:,.2f} {prefix}{unit}"
    return f"{x:,.2f} {unit}"


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:,.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:,.3f} ms"
    return f"{s * 1e6:,.1f} us"


def _add_inference_options(r) -> None:
    """The flags of :class:`openipu.runner.InferenceOptions` (defaults: PopRT's production inference)."""
    g = r.add_argument_group("inference options (defaults: PopRT's production inference; printed with every "
                             "prediction)")
    g.add_argument("--precision", default="fp32", choices=["fp32", "fp16"], help="model precision (default fp32, as "
                   "PopRT's converter)")
    g.add_argument("--partials-type", default="half", choices=["half", "float"],
                   help="matmul / convolution partials (default half, as PopRT; fp32 models accumulate in float)")
    g.add_argument("--available-memory-proportion", type=float, default=None, metavar="AMP",
                   help="temporary-memory budget of matmuls and convolutions, a proportion of a tile (default 0.6)")
    g.add_argument("--num-io-tiles", type=int, default=0, metavar="N",
                   help="tiles of each IPU set aside for host I/O; the model is compiled on the rest (default 0)")
    g.add_argument("--overlap-io", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap the host I/O of the next batch with compute on the I/O tiles (default: on when "
                        "there are I/O tiles, as PopRT)")
    g.add_argument("--batches-per-step", type=int, default=1, help="PopART batches per step (default 1)")


def _version() -> str:
    from openipu import __version__
    return f"openipu {__version__}"


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="openipu", description="Graphcore IPU software stack on a simulated IPU.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="compile and run an ONNX model on a simulated IPU and predict its IPU performance",
                       description="Compile MODEL for a simulated IPU, run one step, print the outputs and "
                                   "the predicted IPU latency, throughput and tile memory.",
                       epilog=_EXIT_TEXT, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("model", help="path of an .onnx file, a bundled model name (e.g. light_resnet50), or a PopRT "
                                 "executable (.popef, from poprt --export_popef: run, or --offline predict, with its own options)")
    r.add_argument("--ipu", default="ipu2", choices=["ipu1", "ipu2", "bow", "ipu21"], help="IPU generation (default ipu2)")
    r.add_argument("--num-ipus", type=int, default=1, help="IPUs to shard the model over (default 1)")
    r.add_argument("--tiles-per-ipu", type=int, default=None, help="use this many tiles of each IPU (1 to the generation's 1,216 / 1,472)")
    r.add_argument("--batch-size", type=int, default=None, help="override the model's batch dimension")
    r.add_argument("--input", metavar="FILE", help=".npz of input arrays keyed by input name, one for each input "
                                                 "(default: random inputs)")
    r.add_argument("--output", metavar="FILE", help="write the outputs to this .npz (missing folders are created)")
    r.add_argument("--report", metavar="DIR", help="write the profile (profile.pop, summary.txt; read it with pva or `openipu report`) to DIR")
    r.add_argument("--json", action="store_true",
                   help="print one JSON document (schema docs/run.schema.json) instead of the text")
    r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    r.add_argument("--offline", action="store_true",
                   help="predict only: compile for an offline IPU and predict cycles and memory without "
                        "running the model (no device memory, no kernels)")
    _add_inference_options(r)
    from openipu.sizing import add_sweep_parser
    add_sweep_parser(sub)
    rp = sub.add_parser("report", help="write the Graph Analyser HTML report of a profile",
                        description="Write a self-contained HTML page (memory per tile, liveness, program tree, "
                                    "execution trace, largest variables and vertices) of PROFILE_DIR's profile.pop.")
    rp.add_argument("profile", metavar="PROFILE_DIR", help="a directory holding profile.pop, or the file")
    rp.add_argument("-o", "--output", metavar="FILE.html", help="where to write the page (default PROFILE_DIR/report.html)")
    rp.add_argument("--compare", metavar="OTHER_DIR", help="a second profile to compare with")
    return p


def _report(args) -> int:
    import os

    from openipu import popvision
    from openipu.popvision.html import summary_figures, write_report
    out = args.output or os.path.join(args.profile if os.path.isdir(args.profile) else os.path.dirname(args.profile) or ".",
                                      "report.html")
    try:  # a bad profile or an unwritable output: one line, exit 1, no page (write_report is atomic)
        r = popvision.openReport(args.profile)
        other = popvision.openReport(args.compare) if args.compare else None
        write_report(r, out, other)
        f = summary_figures(r)
    except (OSError, popvision.Error) as e:
        print(f"openipu report: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"Report of {r.path} written to {out}")
    print(f"  total memory {f['total_memory']:,} B; worst tile {f['worst_tile']} ({f['worst_tile_bytes']:,} B); "
          f"liveness peak {f['liveness_peak']:,} B at step {f['liveness_peak_step']}")
    if f["cycles_per_run"] is not None:
        print(f"  cycles per run {f['cycles_per_run']:,} (predicted)")
    return 0


def _print_run(res, out) -> None:
    w = lambda s="": print(s, file=out)  # noqa: E731
    w(f"Model     {res.model_path}  ({res.num_nodes} nodes)")
    from openipu.runner import PLACEHOLDER_NOTE, is_placeholder
    if is_placeholder(res.model_path):
        w(f"          ({PLACEHOLDER_NOTE})")
    io = (f" ({res.compute_tiles_per_ipu:,} compute + {res.options.num_io_tiles:,} I/O)"
          if res.options.num_io_tiles else "")
    w(f"Target    {res.target}: {res.num_ipus} IPU(s) x {res.tiles_per_ipu:,} tiles{io}, {_kib(res.bytes_per_tile)} "
      f"per tile, {res.clock_hz / 1e9:.2f} GHz; batch {res.batch_size}")
    w(f"Options   {res.options.describe()}")
    w()
    if res.outputs:
        w("Outputs (computed on this host by the simulated IPU)")
        for k, v in res.outputs.items():
            a = np.asarray(v, dtype=np.float64) if v.dtype != np.bool_ else v.astype(np.float64)
            w(f"  {k:<28} {str(v.dtype):<8} {list(v.shape)}  mean {a.mean():.6g}  std {a.std():.6g}  "
              f"min {a.min():.6g}  max {a.max():.6g}")
        w()
    w("Prediction for the IPU (cost model of the simulated target; not host time)")
    fit = "yes" if res.fits else f"NO ({res.out_of_memory_tiles:,} tiles over)"
    w(f"  tile memory         max {_kib(res.tile_bytes_max)} ({res.tile_bytes_max / res.bytes_per_tile:.0%} of a tile), "
      f"mean {_kib(res.tile_bytes_mean)}; fits: {fit}")
    if res.worst_tiles:
        t, b = res.worst_tiles[0]
        w(f"  total memory        {res.tile_bytes_total:,} B over {res.num_ipus * res.compute_tiles_per_ipu:,} tiles; "
          f"worst tile {t} ({b:,} B)")
    if res.over_budget_plans:
        w(f"  planner             {len(res.over_budget_plans)} matmul/convolution plan(s) over the temporary-memory "
          "budget (least-memory plan taken), e.g.")
        op, tb, bb = max(res.over_budget_plans, key=lambda o: o[1] - o[2])
        w(f"                      {op[:100]}: {tb:,} B per tile, budget {bb:,} B")
    if not res.fits:
        w("  worst tiles         " + ", ".join(f"tile {t}: {_kib(b)}" for t, b in res.worst_tiles))
        w(f"  shortfall           {res.shortfall_bytes:,} B over a tile's {res.bytes_per_tile:,} B on the worst tile")
        w(f"  latency             {_seconds(res.latency)} per batch  ({res.latency_cycles:,.0f} cycles per batch; "
          "if it fitted)")
        w(f"  throughput          {res.throughput:,.1f} samples/s (if it fitted)")
        w()
        w("The model does not fit in tile memory, so it was not run. Try:")
        w(f"  --num-ipus {res.num_ipus * 2}            shard over more IPUs")
        if res.precision == "fp32":
            w("  --precision fp16         halve weights and activations")
        if res.batch_size > 1:
            w(f"  --batch-size {max(1, res.batch_size // 2):<11} a smaller batch")
        if not res.over_budget_plans:
            amp = res.options.available_memory_proportion / 2
            w(f"  --available-memory-proportion {amp:g}   less temporary memory per matmul/convolution "
              "(more serial steps, which take longer)")
        w(f"  openipu sweep {res.model_path} --max-batch   the largest batch that fits")
        return
    w(f"  latency             {_seconds(res.latency)} per batch  ({res.latency_cycles:,.0f} cycles per batch)")
    w(f"  step                {_seconds(res.step_seconds)}  ({res.step_cycles:,.0f} cycles per step, "
      f"{res.batches_per_step} batch(es), host I/O not overlapped)")
    over = ""
    if res.options.overlapped and res.throughput:
        over = f" (host I/O overlapped: one batch each {_seconds(res.batch_size / res.throughput)})"
    w(f"  throughput          {res.throughput:,.1f} samples/s{over}")
    total = sum(res.by_category.values()) or 1.0
    shares = "  ".join(f"{_CATEGORY_LABELS[c]} {v / total:.1%}" for c, v in res.by_category.items() if v)
    w(f"  time shares         {shares}")
    if res.flops:
        w(f"  arithmetic          {_si(res.flops, 'FLOP')} per step, {_si(res.flops / res.step_seconds, 'FLOP/s')} achieved")
    w()
    w("Host (this machine running the simulation; not an IPU figure)")
    if res.offline:
        w(f"  compile {res.host_compile_seconds:,.2f} s, prediction {res.host_run_seconds:,.2f} s (offline: nothing run)")
    else:
        w(f"  compile {res.host_compile_seconds:,.2f} s, run {res.host_run_seconds:,.2f} s per step")
    if res.report_dir:
        w(f"  profile written to {res.report_dir}")


def _run(args) -> int:
    from openipu import runner
    from openipu.popart.errors import popart_exception

    def fail(msg: str, code: int = EXIT_ERROR) -> int:
        print(f"openipu run: {msg}", file=sys.stderr)
        return code

    if str(args.model).lower().endswith(".popef"):
        return _run_popef(args, fail)
    try:
        runner.check_options(ipu=args.ipu, num_ipus=args.num_ipus, batch_size=args.batch_size,
                             batches_per_step=args.batches_per_step, precision=args.precision, seed=args.seed,
                             available_memory_proportion=args.available_memory_proportion,
                             tiles_per_ipu=args.tiles_per_ipu, num_io_tiles=args.num_io_tiles,
                             overlap_io=args.overlap_io, partials_type=args.partials_type)
    except runner.UsageError as e:
        return fail(f"error: {e} (see openipu run --help)", EXIT_USAGE)
    # paths first, so that a bad one costs no compile
    if args.report and os.path.exists(args.report) and not os.path.isdir(args.report):
        return fail(f"--report '{args.report}' is a file; give a directory (it is created if missing)")
    if args.output:
        if os.path.isdir(args.output):
            return fail(f"--output '{args.output}' is a directory; give a file name (FILE.npz)")
        folder = os.path.dirname(os.path.abspath(args.output))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            return fail(f"cannot create the folder of --output '{args.output}': {e.strerror or e}")
        if not os.access(folder, os.W_OK):
            return fail(f"cannot write --output '{args.output}': its folder is not writable")
    inputs = None
    try:
        if args.input:
            inputs = runner.load_inputs(args.input)
        if args.report:
            os.makedirs(args.report, exist_ok=True)
        res = runner.run_model(args.model, ipu=args.ipu, num_ipus=args.num_ipus, batch_size=args.batch_size,
                               batches_per_step=args.batches_per_step, precision=args.precision, inputs=inputs,
                               seed=args.seed, report_dir=args.report,
                               available_memory_proportion=args.available_memory_proportion,
                               tiles_per_ipu=args.tiles_per_ipu, offline=args.offline,
                               all_inputs=inputs is not None, num_io_tiles=args.num_io_tiles,
                               overlap_io=args.overlap_io, partials_type=args.partials_type)
    except runner.UsageError as e:
        return fail(f"error: {e} (see openipu run --help)", EXIT_USAGE)
    except (FileNotFoundError, ValueError) as e:
        return fail(_one_line(e))
    except OSError as e:
        return fail(f"{e.strerror or e}" + (f": '{e.filename}'" if getattr(e, "filename", None) else ""))
    except MemoryError:
        return fail("the host ran out of memory; use --offline to predict without running the model, or a "
                    "smaller --batch-size")
    except popart_exception as e:
        return fail(f"the model could not be compiled or run for the IPU: {type(e).__name__}: {_one_line(e)}")
    except Exception as e:  # noqa: BLE001 - Poplar / PopLibs errors: report them, not a traceback
        if type(e).__module__.startswith(("openipu.popart", "openipu.poplar", "openipu.poplibs")):
            return fail(f"the model could not be compiled or run for the IPU: {type(e).__name__}: {_one_line(e)}")
        raise
    if args.json:
        import json
        doc = res.to_dict()
        doc["outputs"] = {k: _output_stats(v) for k, v in res.outputs.items()}
        doc["exit_status"] = EXIT_OK if res.fits else EXIT_DOES_NOT_FIT
        print(json.dumps(doc, indent=1))
    else:
        _print_run(res, sys.stdout)
    if args.output and res.outputs:
        try:
            np.savez(args.output, **res.outputs)
        except OSError as e:
            return fail(f"cannot write --output '{args.output}': {e.strerror or e}")
        print(f"Outputs written to {args.output}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK if res.fits else EXIT_DOES_NOT_FIT


def _run_popef(args, fail) -> int:
    """``openipu run MODEL.popef``: a saved PopRT executable (``poprt --export_popef``,
    ``Compiler.compile_and_export``) with its own compile options. ``--offline`` prints its
    prediction; otherwise one batch of random inputs (or ``--input``) runs through PopRT's
    ``Runner`` and the outputs are printed beside the prediction. Options that would change the
    compile are the executable's; ``--json`` and ``--report`` are not available for executables."""
    from openipu import runner
    from openipu.poprt import runtime
    if args.json or args.report:
        return fail("error: --json and --report take an ONNX model, not a .popef executable "
                    "(see openipu run --help)", EXIT_USAGE)
    try:
        r = runtime.Runner(args.model, runtime.RuntimeConfig(timing="predicted" if args.offline else "host"))
    except (runtime.PopRTRuntimeError, OSError) as e:
        return fail(_one_line(e))
    with r:
        exe, out = r.executable, sys.stdout
        out.write(f"Executable {args.model}: {exe.target['ipu_version']} x {exe.target['num_ipus']}, "
                  f"batch {r.batch_size}, batches_per_step {r.batches_per_step} (its own compile options; "
                  f"compile flags of openipu run do not apply)\n")
        outputs = None
        if not args.offline:
            rng = np.random.default_rng(args.seed)
            try:
                given = runner.load_inputs(args.input) if args.input else {}
            except (FileNotFoundError, ValueError) as e:
                return fail(_one_line(e))
            feeds = {}
            for d in r.get_model_inputs():
                if d.name in given:
                    feeds[d.name] = given[d.name]
                elif np.issubdtype(d.dtype, np.integer):
                    feeds[d.name] = rng.integers(0, 2, d.shape).astype(d.dtype)
                else:
                    feeds[d.name] = rng.standard_normal(d.shape).astype(d.dtype)
            try:
                outputs = r.execute(feeds)
            except runtime.PopRTRuntimeError as e:
                return fail(_one_line(e))
            out.write("Outputs (simulated IPU):\n")
            for n, v in outputs.items():
                st = _output_stats(np.asarray(v))
                out.write(f"  {n}: {st['dtype']} {st['shape']} mean {st.get('mean', 0):.6g} std {st.get('std', 0):.6g}\n")
        out.write(f"Prediction for the IPU (openipu's cost model; not host time)\n  "
                  f"{exe.prediction.summary(exe.target['ipu_version'])}\n")
        h = r.host_stats()
        out.write(f"Host (this machine; not an IPU figure)\n  load {h['load_seconds']:.2f} s"
                  + ("" if args.offline else f", run {h['host_seconds']:.2f} s") + "\n")
    if args.output and outputs:
        np.savez(args.output, **{k: np.asarray(v) for k, v in outputs.items()})
        print(f"Outputs written to {args.output}")
    return EXIT_OK


def _output_stats(v: np.ndarray) -> dict:
    """dtype, shape and summary statistics of one output (JSON numbers; NaN / inf as strings)."""
    a = np.asarray(v, dtype=np.float64) if v.dtype != np.bool_ else v.astype(np.float64)

    def num(x):
        x = float(x)
        return x if np.isfinite(x) else str(x)
    stats = {"mean": num(a.mean()), "std": num(a.std()), "min": num(a.min()), "max": num(a.max())} if a.size else {}
    return {"dtype": str(v.dtype), "shape": list(v.shape), **stats}


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``openipu`` script. Returns the exit status (see the module
    docstring: 0 ok, 1 error, 2 usage, 3 does not fit). Every error is one line on stderr; an
    unexpected exception too (exit 1), with its traceback when ``OPENIPU_DEBUG=1``."""
    try:
        args = _build_parser().parse_args(argv)
    except SystemExit as e:             # --help (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        if args.command == "report":
            return _report(args)
        if args.command == "sweep":
            from openipu.sizing import sweep_main
            return sweep_main(args)
        return _run(args)
    except KeyboardInterrupt:
        print(f"openipu {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the top-level guard: one line, never a traceback
        if os.environ.get("OPENIPU_DEBUG", "") not in ("", "0"):
            import traceback
            traceback.print_exc()
        print(f"openipu {args.command}: unexpected error: {type(e).__name__}: {_one_line(e)} (set OPENIPU_DEBUG=1 "
              "for the traceback, and please report it)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
