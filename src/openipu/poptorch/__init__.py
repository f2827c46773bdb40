"""PopTorch on the simulated IPU (``import poptorch``; ``research/poptorch.md``): wrap a
``torch.nn.Module`` with :func:`inferenceModel` or :func:`trainingModel`; it is captured with
``torch.export``, lowered to PopART (:mod:`openipu.poptorch.lower`) and run by a PopART session
with PopTorch's batching rules (:class:`Options`)."""

from __future__ import annotations

import abc as _abc
from typing import Any as _Any

from openipu.poptorch import _impl, _logging, _utils, optim, poptorch_core, profiling  # noqa: F401
from openipu.poptorch._geometric_ops import fps, nearest  # noqa: F401
from openipu.poptorch._impl import isDispatchTracing  # noqa: F401
from openipu.poptorch._logging import logger, setLogLevel  # noqa: F401
from openipu.poptorch._utils import accessAttributes, getIpuTensorId  # noqa: F401
from openipu.poptorch.blocks import (BeginBlock, Block, BlockFunction, ParallelPhasedExecution,  # noqa: F401
                                     Phase, PhasedExecution, PipelinedExecution, SerialPhasedExecution,
                                     ShardedExecution, Stage, removeBlocks)
from openipu.poptorch.dataloader import AsynchronousDataAccessor, DataLoader  # noqa: F401
from openipu.poptorch.enums import *  # noqa: F401,F403
from openipu.poptorch.errors import Error, RecoverableError, UnrecoverableError, createPoptorchError  # noqa: F401
from openipu.poptorch.executor import PoplarExecutor, registerPostCompileHook, registerPreCompileHook  # noqa: F401
from openipu.poptorch.ops import (CPU, Attribute, MultiConv, NameScope, cond, ctc_beam_search_decoder, custom_op,  # noqa: F401,E501
                                  dynamic_slice, dynamic_update, for_loop, identity_loss, ipu_print_tensor,
                                  isRunningOnIpu, nop, recomputationCheckpoint, register_custom_op,
                                  serializedMatMul, set_available_memory, set_overlap_for_input,
                                  set_overlap_for_output)
from openipu.poptorch.options import ConfigFileError, Options, TensorLocationSettings  # noqa: F401
from openipu.poptorch.poptorch_core import importPoptorchMetadataFromFile  # noqa: F401

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


class ICustomArgParser(_abc.ABC):
    """``poptorch.ICustomArgParser``: how a wrapped model's inputs of a custom type hold
    tensors. Register an instance with :func:`registerCustomArgParser`; the executor then
    flattens such arguments to the tensors :meth:`yieldTensors` gives (they are the model's
    inputs, batched and validated like any other) and, while capturing, hands ``forward`` the
    object :meth:`reconstruct` builds from them."""

    @_abc.abstractmethod
    def yieldTensors(self, struct) -> None:  # noqa: N802
        """Yield every ``torch.Tensor`` of ``struct``, in a deterministic order."""

    @_abc.abstractmethod
    def reconstruct(self, original_structure, tensor_iterator) -> _Any:
        """A new object like ``original_structure`` whose tensors are taken, in the order of
        :meth:`yieldTensors`, from ``tensor_iterator``."""


def registerCustomArgParser(arg_data_type: type, arg_parser) -> None:  # noqa: N802
    """Use ``arg_parser`` (an :class:`ICustomArgParser`) for inputs of type ``arg_data_type``
    (and its subclasses), replacing any parser registered for it; ``None`` removes it. Raises
    :class:`Error` ("arg_parser must inherit from ICustomArgParser") for another object."""
    if arg_parser is None:
        _utils.custom_arg_parsers.pop(arg_data_type, None)
        return
    if not isinstance(arg_parser, ICustomArgParser):
        raise createPoptorchError("arg_parser must inherit from ICustomArgParser")
    _utils.custom_arg_parsers[arg_data_type] = arg_parser
