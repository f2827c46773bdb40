"""The inputs and outputs of a ``PoplarExecutor`` call: binding the call's arguments to the
captured inputs, the micro-batch a compile traces, the check that a call's inputs match the
compiled ones, and PopART's anchors as the tensors PopTorch returns."""

from __future__ import annotations

import inspect
import logging

import numpy as np
import torch
import torch.utils._pytree as pytree

from openipu.poptorch.enums import OutputMode
from openipu.poptorch.errors import Error

_pylog = logging.getLogger("poptorch::python")
_BACKWARD_ERROR = ("backward() cannot be called explicitly on outputs of a PopTorch model. If you're using a "
                   "trainingModel, the backwards pass is performed automatically when invoking the model. If "
                   "you're using an inferenceModel, you should use a trainingModel instead.")



class Marshalling:
    """``PoplarExecutor``'s argument and output methods (mixed into it; they use its
    ``_user_model``, ``_options``, ``_training`` and ``_signature``)."""

    def _bind(self, args, kwargs):
        """(positional args, kwargs, [(name, tensor)] of the tensor leaves in capture order,
        the non-tensor leaves)."""
        sig = inspect.signature(self._user_model.forward)
        try:
            ba = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise Error(f"The arguments do not match {type(self._user_model).__name__}.forward: {e}") from None
        ba.apply_defaults()
        args_, kwargs_ = ba.args, ba.kwargs
        leaves, _ = pytree.tree_flatten_with_path((args_, kwargs_))
        names = list(sig.parameters)
        var = next((p.name for p in sig.parameters.values() if p.kind == p.VAR_POSITIONAL), None)
        if var is not None:     # forward(self, *xs): the extra positionals are xs_0, xs_1, ...
            first = names.index(var)
            names = names[:first] + [f"{var}_{i}" for i in range(len(args_) - first)]
        tensors, others = [], []
        for path, v in leaves:
            if isinstance(v, torch.Tensor):
                key = path[1]
                name = names[key.idx] if isinstance(key, pytree.SequenceKey) and path[0].idx == 0 else \
                    str(getattr(key, "key", key))
                rest = "".join(f".{getattr(k, 'idx', getattr(k, 'key', k))}" for k in path[2:])
                tensors.append((name + rest, v))
            else:
                others.append(v)
        return args_, kwargs_, tensors, others

    def _factor(self) -> tuple[int, int, int]:
        o = self._options
        af = o.Training.gradient_accumulation if self._training else 1
        return o.device_iterations, af, o.replication_factor

    def _micro(self, tensors):
        di, af, rf = self._factor()
        rf //= self._options.input_group_size      # the replicas of an input group share their data
        f = di * af * rf
        out = []
        for name, t in tensors:
            if t.dim() == 0:
                out.append(t)
                continue
            if t.shape[0] % f:
                raise Error(f"Invalid batch dimension: In the input {name}, the batch dimension ({t.shape[0]}) must be "
                            f"a multiple of Options.deviceIterations({di}) * Options.replicationFactor({rf}) * "
                            f"Options.Training.gradientAccumulation({af}) = {f} because it is used to calculate the "
                            f"batch size which will be fetched from the host per device iteration.")
            out.append(t.narrow(0, 0, t.shape[0] // f))
        return out

    def _output(self, arr: np.ndarray) -> torch.Tensor:
        """A PopART anchor (leading dims: iterations / micro-batches / replicas, as returned by
        the output mode) as PopTorch returns it: the leading dims merged into dim 0."""
        o = self._options
        di, af, rf = self._factor()
        mode = o.output_mode
        if mode == OutputMode.All:
            lead = [d for d in (di, af, rf) if d > 1]
        elif mode == OutputMode.EveryN:
            lead = [d for d in (di // o.output_return_period, af, rf) if d > 1]
        else:
            lead = [rf] if rf > 1 else []
        arr = np.asarray(arr)
        n = int(np.prod(lead)) if lead else 1
        shape = list(arr.shape[len(lead):]) if lead else list(arr.shape)
        if lead:
            arr = arr.reshape([n] + shape) if not shape else arr.reshape([n * shape[0]] + shape[1:])
        return torch.from_numpy(np.array(arr, order="C"))

    def _validate(self, tensors, others) -> None:
        want, want_others = self._signature
        got = [(n, tuple(t.shape), t.dtype) for n, t in tensors]
        if len(got) != len(want) or any(g[1:] != w[1:] for g, w in zip(got, want)) or others != want_others:
            raise Error(f"The inputs provided ({[(n, list(s), str(d)) for n, s, d in got]}) don't match the inputs used "
                        f"to compile the model ({[(n, list(s), str(d)) for n, s, d in want]}). To use different "
                        "inputs, create a new inferenceModel / trainingModel wrapper or call destroy() on the current "
                        "one first.")


def _detach_input(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, with PopTorch's warning, if it requires a gradient."""
    if t.requires_grad:
        _pylog.warning("Input tensor has requires_grad=True set. This tensor will be detached because backward pass "
                       "via inputs is not supported.")
        return t.detach()
    return t


def _error_on_backward(*args, **kwargs):
    raise Error(_BACKWARD_ERROR)
