"""Every cost-model constant of the simulator, each with its source.

Constants are fitted only to the calibration points in ``shared/research/ipu_calibration.md``
(Poplar tutorial 6's cost search and IPU Model profile, gc-flops, STREAM triad, the ``pi``
reduction, ByteMLPerf ResNet-50). ``[A]`` marks an assumption: a number that no published figure
pins down, chosen to be plausible and stated wherever it is used.
"""

#: Effective host<->IPU stream bandwidth (bytes/s). Fitted: tutorial 6's IPU Model profile moves
#: 40,044,000 B (10000x1000 float matrix, 1000-float vector, 10000-float result) in 6,663,550.8
#: host-exchange cycles at 1.33 GHz -> 6.0094 B/cycle = 7.993e9 B/s. The README's hardware run
#: shows the same total, so this is used for IPU Model and IPU targets alike.
HOST_EXCHANGE_BYTES_PER_S = 40_044_000 / 6_663_550.8 * 1.33e9

#: Cycles of one internal (one-IPU) sync. Fitted: tutorial 6's IPU Model profile reports 1,134.8
#: sync cycles for its program, which our lowering runs as 7 syncs (one per stream copy, two per
#: compute set with exchanged inputs): 1134.8 / 7 = 162.1.
INTERNAL_SYNC_CYCLES = 162

#: Fixed cycles a tile spends in each exchange phase it takes part in (exchange code set-up,
#: alignment). Fitted: with this at 0 our tutorial 6 program averages 7,473.6 IPU-exchange cycles
#: per tile, and each cycle of it adds 4.68 (tiles take part in 4.68 phases on average); the IPU
#: Model reports 8,697.4, so (8697.4 - 7473.6) / 4.68 = 261.5. One calibration point fixes only
#: this sum: how it splits between per-phase and per-message costs is an assumption.
EXCHANGE_PHASE_OVERHEAD_CYCLES = 262

#: Cycles per contiguous region (message) a tile receives or sends in an exchange phase: the
#: exchange code issues one instruction pair per region. [A] not separable from the constant
#: above on the one calibration point.
EXCHANGE_CYCLES_PER_MESSAGE = 2

#: Supervisor cycles to launch a compute set on a tile (idle time for the workers, so counted in
#: "including idle threads" only). Fitted: tutorial 6's two compute sets average 3,786.0 busy-context
#: cycles per tile in our model against the IPU Model's 3,801.8: (3801.8 - 3786.0) / 2 = 7.9.
COMPUTE_SET_LAUNCH_CYCLES = 8

#: Worker cycles of a user vertex on a simulated *hardware* target with no estimate (the IPU Model
#: requires one). [A] 10 cycles plus one cycle per element of its fields.
DEFAULT_VERTEX_BASE_CYCLES = 10

#: Stack bytes per tile (worker + supervisor stacks). [A] a Mk1 Target printout shows 3,168 B of
#: stack on tile 0 (graphcore/tensorflow logging docs).
STACK_BYTES_PER_TILE = 3_168

#: Control code bytes on every tile per lowered program step (call, sync, branch). [A]
CONTROL_CODE_BYTES_PER_STEP = 16

#: Exchange code bytes per code unit of an exchange phase on a tile: per region (message) it sends
#: or receives, except that a run of equal regions at one address stride is one loop of two units
#: (``exchange_moves.code_units``: Poplar sends a strided or transposed block with a repeat loop whose
#: address steps by the stride, not with code per region). [A] one 32-bit instruction for the
#: address and one for the length.
EXCHANGE_CODE_BYTES_PER_MESSAGE = 8

#: Code bytes of a user (Python) codelet on each tile that runs it. [A] typical small C++ codelet.
USER_CODELET_CODE_BYTES = 256

#: Vertex state bytes: per scalar field pointer and per vector field (pointer + size). [A] 32-bit
#: pointers, Poplar SPAN layout.
VERTEX_STATE_BYTES_PER_SCALAR = 4
VERTEX_STATE_BYTES_PER_VECTOR = 8

#: Worker instructions per slice of the ``pi`` vertex's loop (``UCL-RITS/pi_examples``
#: ``cpp_ipu_pi_dir``: ``x = (i + 0.5) * slice; sum += 4 / (1 + x * x)`` compiled with ``-O3``).
#: Fitted: the ``pi`` calibration point, 90,084 tile cycles for 1,000 slices on a Bow IPU; a worker
#: running alone issues once every 6 tile cycles, so 90,084 / 6 = 15,014 = 15 x 1,000 + 14. The same
#: README's second run (2,917,776 slices per tile: 262,599,924 cycles = 6 x (15 x 2,917,776 + 14))
#: fixes the same two numbers, so slope and intercept are both measured, not split by assumption.
#: Used only by that program's estimator (``benchmarks/calibration.py``).
PI_LOOP_WORKER_CYCLES = 15

#: Worker instructions of the ``pi`` vertex between its two cycle-counter reads outside the loop
#: (loop set-up, the final store). Fitted with :data:`PI_LOOP_WORKER_CYCLES` (see there).
PI_FIXED_WORKER_CYCLES = 14
