"""Sizing a model: ``openipu sweep MODEL`` predicts it over batch sizes, targets and inference
options, and finds the largest batch that fits (``--max-batch``).

Every point is an offline prediction of :func:`openipu.runner.run_model` (``--offline``: compiled
for an offline IPU, predicted, nothing run), with the options of
:class:`openipu.runner.InferenceOptions`. Points share what does not change between them:

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

Batch sizes in parallel (``--jobs N``; default: the usable cores, fewer when host memory would
not hold them): the model is read and converted in the sweep's process, which then predicts the
points of the first batch size (warming the plan cache and the exchange-geometry memo) and forks
one worker process per other batch size, at most N at a time (:mod:`openipu.forked_jobs`). A
worker inherits that state copy-on-write, predicts its batch size's points in the order one
process would, and sends each point back; the output is that of ``--jobs 1`` but for the host
seconds. A worker that dies is its points' error; Ctrl-C stops the workers. ``--max-batch``
then tries N batches a round (a k-ary search; the bisection's answer when memory grows with the
batch).

Host memory: a point's compiled graph is freed (and its reference cycles collected) as soon as
the point is predicted; the batched model is handed to the session compiling it (its weights
move into the IR instead of being copied), so a sweep keeps the half model and one IR beside the
compile of its largest point, and the exchange-geometry memo
(:mod:`openipu.poplar.structure_cache`, bounded). A worker's own memory is what its batch size
adds to the shared state.

Figures: the prediction (latency, throughput, cycles, tile memory) is predicted IPU figures of
the cost model, never host time; ``host_seconds`` of a point and of the sweep is this machine's
wall time.

Exit status of ``openipu sweep``: 0 when at least one point fits, 3 when none does, 1 error,
2 usage (as ``openipu run``), 130 when interrupted (Ctrl-C / SIGINT): the table, CSV, JSON and
plot are still written, of the points predicted before the interrupt.

Modules: :mod:`openipu.sizing.sweeper` (the points and what they share, worker processes,
``--max-batch``), :mod:`openipu.sizing.output` (table, CSV, JSON, plot) and
:mod:`openipu.sizing.command` (``openipu sweep``).
"""

from openipu import forked_jobs, runner  # noqa: F401 - patched by tests through this package
from openipu.sizing.command import add_sweep_parser, sweep_main
from openipu.sizing.output import document, plot_html, table, write_csv
from openipu.sizing.sweeper import (COLUMNS, DEFAULT_BATCH_LIMIT, EXIT_INTERRUPTED, Point, PointSpec,
                                    Sweeper)

__all__ = ["COLUMNS", "DEFAULT_BATCH_LIMIT", "EXIT_INTERRUPTED", "Point", "PointSpec", "Sweeper", "add_sweep_parser",
           "document", "plot_html", "sweep_main", "table", "write_csv"]
