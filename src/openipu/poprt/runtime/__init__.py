"""``poprt.runtime``: load a compiled executable and run it (PopRT's ``Runner``, Model Runtime's
``ModelRunner``), on the simulated IPU.

``Runner(path_or_executable, RuntimeConfig())`` loads an executable written by
``Compiler.compile_and_export`` or takes one from ``Compiler.compile``. ``execute`` fills the
caller's output arrays; ``execute_async`` / ``executeAsync`` return a future (``wait()``).
``RuntimeConfig.batching_dim`` turns on dynamic batch: inputs of any batch are split into
compiled batches (the last one padded) and the outputs joined. :class:`PackRunner` collects
single-sample requests from many threads into compiled batches; in packed mode several
variable-length sequences share one row (packed BERT; see its docstring).

``batches_per_step`` (PopRT's call contract, user guide "Overlap I/O" and "Quick start"): one
``execute`` takes ONE compiled batch, with the descriptor shapes (never ``batches_per_step`` times
larger); throughput comes from concurrent callers. The compiled program still loops over
``batches_per_step`` batches per step on the device. The runner maps calls onto steps as PopRT's
runtime does: a device thread starts a step when a request is queued; each iteration of the
step's loop takes the next queued request when it reads its inputs (host-to-device stream
callbacks) and completes that request when it writes its outputs, so a caller returns as soon as
its own batch is done, not at the end of the step. When no request arrives for ``timeout_ns``
(the flush), the step ends there (on the simulator the rest of the loop is not run); an
iteration that must run while earlier batches are still in flight (a pipelined program reads
ahead) gets a batch of zeros. With ``batches_per_step = 1`` each call is one step.

Inputs whose size is ``k`` times the descriptor's (``[k, *shape]``, or ``k * batch`` rows) are ``k``
batches, run in turn, the outputs joined (Model Runtime's rule when dynamic batch is off).

Timing (openipu's ``RuntimeConfig.timing``, default from ``OPENIPU_TIMING``): ``host`` runs the
program on the simulator, so a call takes host time and returns real outputs; ``predicted`` computes
no outputs (zeros) and completes each call when the modelled IPU would (queueing on the device,
overlapped I/O as compiled; ``openipu.poprt.runtime._timing``), so that a benchmark harness that
times its calls, unmodified, measures the prediction.

Two kinds of figures, kept apart: ``runner.predicted`` holds predicted IPU figures (cycles,
latency in IPU seconds, QPS) from the cost model; ``runner.host_stats()`` measures this machine
running the simulation (host seconds).
"""

from openipu.poprt.runtime._common import (DataDesc, DeviceManager, Future, InputMemoryView,  # noqa: F401
                                           OutputMemoryView, PackAlgorithm, PackRunnerConfig, PopRTRuntimeError,
                                           RuntimeConfig)
from openipu.poprt.runtime._pack import PackRunner  # noqa: F401
from openipu.poprt.runtime._runner import Runner  # noqa: F401

ModelRunner = Runner
