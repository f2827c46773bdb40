"""The weights of a ``PoplarExecutor`` kept in sync with its ``torch.nn.Module``: sent to the
device (``copyWeightsToDevice``, an inference model's upload when the module's weights changed,
``copyNamedBuffersToDevice``) and read back into the module (``copyWeightsToHost``, after every
training call).

A session that runs on the IR executor (:mod:`openipu.popart.execute`, the default) gives its
variables straight to the module: one copy of the weights per training call, and none of the
optimizer state; the session's host copies are refreshed (``weightsToHost``) only before they
are sent again.
"""

from __future__ import annotations

import numpy as np
import torch

from openipu import popart
from openipu.poptorch.errors import Error, from_popart
from openipu.poptorch.lower import NUMPY_TYPE, POPART_TYPE


def _to_numpy(t: torch.Tensor, dtype: str) -> np.ndarray:
    """``t`` as a C-contiguous array of the IPU-side ``dtype`` (a transposed or sliced input is
    copied, as PopTorch copies inputs into its host buffers; no copy when already laid out)."""
    a = t.detach().cpu().numpy().astype(NUMPY_TYPE[dtype], copy=False)
    return a if a.flags.c_contiguous else a.copy(order="C")     # (ascontiguousarray makes 0-d 1-d)


def _is_param(model: torch.nn.Module, path: str) -> bool:
    try:
        model.get_parameter(path)
        return True
    except AttributeError:
        return False


class WeightSync:
    """``PoplarExecutor``'s weight methods (mixed into it; they use its ``_session``,
    ``_built``, ``_user_model``, ``_attached`` and ``_options``)."""

    def _module_tensor(self, path: str) -> torch.Tensor:
        m = self._user_model
        return m.get_parameter(path) if _is_param(m, path) else m.get_buffer(path)

    def _weight_tensors(self) -> list:
        """``[(tensor id, module tensor)]`` of the compiled weights: the module's current
        parameter or buffer at each path (the owning submodules are looked up once per compiled
        model; the tensors each call, so that a replaced parameter is the one synced)."""
        if self._owners is None or self._owners[0] is not self._built:
            m = self._user_model
            owners = []
            for tid, path in self._built.weights.items():
                mod_path, _, name = path.rpartition(".")
                owners.append((tid, m.get_submodule(mod_path) if mod_path else m, name, path))
            self._owners = (self._built, owners)
        out = []
        for tid, mod, name, path in self._owners[1]:
            t = mod._parameters.get(name) if name in mod._parameters else mod._buffers.get(name)
            out.append((tid, t if t is not None else self._module_tensor(path)))
        return out

    def _versions(self):
        return [t._version for _, t in self._weight_tensors()]

    def _upload_weights(self, force: bool = False) -> None:
        if self._connection_never() or not self._attached:      # sent when the device is attached
            return
        versions = self._versions()
        if not force and versions == self._uploaded_versions:
            return
        if self._host_behind:       # the optimizer state is sent too: the device's, not a stale one
            self._session.weightsToHost()
            self._host_behind = False
        io = {tid: _to_numpy(t, POPART_TYPE[t.dtype]) for tid, t in self._weight_tensors()}
        self._session.writeWeights(popart.PyWeightsIO(io))
        self._session.weightsFromHost()
        self._uploaded_versions = versions

    def _broadcast_weights(self) -> None:
        """PopDist's start of a distributed training run: the model's weights and buffers of the
        PopRun instance 0 overwrite this instance's (in the user model, in place), so that the
        instances need not build identical initial weights. Every instance compiles its training
        model, so every instance takes part (inference models are not broadcast: one evaluated on
        some instances only must not wait for the others). Raises :class:`Error` when an instance
        is lost or the broadcast times out."""
        from openipu.poplar.errors import poplar_error
        from openipu.poplibs import gcl_instances
        try:
            gcl_instances.broadcast_tensors_from([self._module_tensor(p) for p in self._built.weights.values()], 0,
                                                 "weights broadcast from instance 0")
        except poplar_error as e:
            raise from_popart(e) from None

    def copyWeightsToDevice(self) -> None:  # noqa: N802
        """Send the module's weights to the device."""
        self._check_compiled()
        self._upload_weights(force=True)

    def copyWeightsToHost(self) -> None:  # noqa: N802
        """Copy the device's weights into the module."""
        self._check_compiled()
        if self._connection_never():
            return
        s = self._session
        device = s._device_weights()
        # copy_ into the module's tensors keeps their version counters right (other wrappers of
        # the module read them to know they must upload)
        with torch.no_grad():
            if device is not None and any(tid in s._replica_group or s._returns_all(tid)
                                          for tid in self._built.weights):
                device = None       # replica-grouped or AllReplicas weights: through the host copies
            if device is not None:
                # the IR executor's variables straight into the module: one copy of the weights,
                # no host copies of them nor of the optimizer state (those are fetched when
                # needed: _upload_weights, copyNamedBuffersToDevice)
                self._host_behind = True
            else:
                s.weightsToHost()
                self._host_behind = False
            for tid, t in self._weight_tensors():
                v = device.get(tid) if device is not None else None
                if v is None:       # a host copy (or a constant of the model, readWeights' fallback)
                    if tid in s._host_weights:
                        host = s._returned_values(tid)
                    else:
                        host = np.empty(t.shape, NUMPY_TYPE[POPART_TYPE[t.dtype]])
                        s.readWeights(popart.PyWeightsIO({tid: host}))
                    v = torch.from_numpy(host)
                    if t.numel() != v.numel():      # AllReplicas: one value per replica from now on
                        t.data = v.clone().to(t.dtype)
                        continue
                t.copy_(v.reshape(t.shape))
        self._uploaded_versions = self._versions()

    def copyNamedBuffersToDevice(self) -> None:  # noqa: N802
        """Send the module's buffers listed in ``Options.updatableNamedBuffers`` to the device,
        leaving the other weights (and the optimizer state) as the device has them. Raises
        :class:`Error` ("Model has not been compiled or has been destroyed.", "No named buffers
        marked as updatable via updatableNamedBuffers option")."""
        self._check_compiled()
        names = self._options._Popart.options.get("updatableNamedBuffers")
        if names is None:
            raise Error("No named buffers marked as updatable via updatableNamedBuffers option")
        if not self._attached or self._connection_never():
            return
        ids = {path: tid for tid, path in self._built.weights.items()}
        buffers = dict(self._user_model.named_buffers())
        io = {}
        for name in names:
            if name not in buffers:
                raise Error(f"updatableNamedBuffers: the model has no buffer '{name}'")
            if name in ids:
                io[ids[name]] = _to_numpy(buffers[name], POPART_TYPE[buffers[name].dtype])
        if not io:
            return
        try:
            self._session.weightsToHost()
            self._host_behind = False
            self._session.writeWeights(popart.PyWeightsIO(io))
            self._session.weightsFromHost()
        except popart.popart_exception as e:
            raise from_popart(e) from e

    def copyWeightsToHostIfNeeded(self) -> bool:  # noqa: N802
        """Weights are copied back after every training call, so there is nothing to do."""
        return False
