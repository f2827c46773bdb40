"""PopTorch on the simulated IPU (``import poptorch``; ``research/poptorch.md``): wrap a
``torch.nn.Module`` with :func:`inferenceModel` or :func:`trainingModel`; it is captured with
``torch.export``, lowered to PopART (:mod:`openipu.poptorch.lower`) and run by a PopART session
with PopTorch's batching rules (:class:`Options`)."""

from __future__ import annotations

from openipu.poptorch import _impl, optim  # noqa: F401
from openipu.poptorch._args import ICustomArgParser, registerCustomArgParser  # noqa: F401
from openipu.poptorch._geometric_ops import fps, nearest  # noqa: F401
from openipu.poptorch.blocks import (BeginBlock, Block, BlockFunction, PipelinedExecution,  # noqa: F401
                                     ShardedExecution, Stage, removeBlocks)
from openipu.poptorch.dataloader import AsynchronousDataAccessor, DataLoader  # noqa: F401
from openipu.poptorch.enums import *  # noqa: F401,F403
from openipu.poptorch.errors import Error, RecoverableError, UnrecoverableError, createPoptorchError  # noqa: F401
from openipu.poptorch.executor import PoplarExecutor
from openipu.poptorch.ops import (CPU, Attribute, MultiConv, NameScope, cond, custom_op,  # noqa: F401
                                  dynamic_slice, dynamic_update, for_loop, identity_loss, ipu_print_tensor,
                                  isRunningOnIpu, nop, recomputationCheckpoint, register_custom_op,
                                  serializedMatMul, set_available_memory)
from openipu.poptorch.options import Options, TensorLocationSettings  # noqa: F401

__version__ = "3.4.0+openipu"


def inferenceModel(model, options=None) -> PoplarExecutor:  # noqa: N802
    """Wrap ``model`` for inference (output mode All by default); compiled on the first call."""
    return PoplarExecutor(model, options, training=False)


def trainingModel(model, options=None, optimizer=None) -> PoplarExecutor:  # noqa: N802
    """Wrap ``model`` for training: each call runs forward, backward and the optimizer's update
    on the IPU (default optimizer ``poptorch.optim.SGD(lr=0.01)``, output mode Final); the loss is
    what ``forward`` computes with a ``torch.nn`` loss or ``poptorch.identity_loss``."""
    return PoplarExecutor(model, options, training=True, optimizer=optimizer)


def load(filename: str, edit_opts_fn=None) -> PoplarExecutor:
    """The wrapper saved in ``filename`` (``PoplarExecutor.save`` / ``compileAndExport`` with
    ``export_model=True``), ready to run: its model is a module holding the saved weights (the
    file stores no Python code, so it runs on the IPU only). ``edit_opts_fn(options)`` may change
    the options first. Raises :class:`Error` for a file that is not such an executable."""
    import torch

    from openipu.poptorch import export
    meta, model_bytes, weights = export.read(filename)
    if not meta.get("export_model"):
        raise Error(f"{filename} was saved with export_model=False: wrap the model with poptorch.inferenceModel / "
                    "trainingModel and call loadExecutable(filename)")
    opts = export.options_from_json(meta["options"])
    if edit_opts_fn is not None:
        edit_opts_fn(opts)
    model = export.LoadedModel(meta.get("forward"))
    params = set(meta["params"])
    for tid, path in meta["weights"].items():
        export._set(model, path, torch.from_numpy(weights[tid].copy()), path in params)
    training = bool(meta["training"])
    optimizer = export.optimizer_from_json(meta["optimizer"], model) if training else None
    pm = PoplarExecutor(model, opts, training=training, optimizer=optimizer)
    pm._install(meta, model_bytes, export.read_executable(filename))
    return pm


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:  # noqa: N802
    """The simulated IPUs are always available."""
    return num_ipus <= 256


def ipuHardwareVersion() -> int:  # noqa: N802
    """The simulated IPU's generation: 2 (Mk2), as optimum-graphcore expects."""
    return 2


def setLogLevel(level) -> None:  # noqa: N802
    """``TRACE``, ``DEBUG``, ``INFO``, ``WARN``, ``ERR``, ``OFF`` or 0 .. 6."""
    import logging
    names = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
             "ERR": logging.ERROR, "OFF": logging.CRITICAL + 10}
    ints = [5, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL, logging.CRITICAL + 10]
    lvl = names[str(level).upper()] if isinstance(level, str) else ints[int(level)]
    logging.getLogger("poptorch").setLevel(lvl)
