"""Replica-grouped parameters of a ``PoplarExecutor`` (PopTorch's
``wrapper.<param>.replicaGrouping(comm_group_type, shards, variable_retrieval_mode)``): each
group of replicas holds its own value of the parameter, which the module holds stacked
``[groups, *shape]``; the model is captured with one group's value and the session's
``popart.VariableSettings`` give each replica its group's row.
"""

from __future__ import annotations

import torch

from openipu import popart
from openipu.poptorch.errors import Error


class ReplicaGrouping:
    """``PoplarExecutor``'s replica-grouping method (mixed into it; it uses its
    ``_user_model``, ``_options`` and ``_per_replica_params``)."""

    def _replica_grouped(self):
        """The replica-grouped parameters (``replicaGrouping``) for the capture: each is swapped
        for one replica's value (its first row) while the model is captured. Returns (path ->
        (``popart.VariableSettings``, host value ``[groups, *shape]``), a function putting the
        module's own parameters back). Raises :class:`Error` for a scalar parameter (PopTorch's
        "Scalars cannot be passed as per-replica weight tensor values")."""
        grouped, saved = {}, []
        model = self._user_model
        for path, (cgt, shards, mode) in self._per_replica_params.items():
            param = model.get_parameter(path)
            if param.dim() == 0:
                raise Error("Scalars cannot be passed as per-replica weight tensor values")
            name = {0: "All", 1: "Consecutive", 2: "Orthogonal", 3: "Ungrouped"}[int(cgt)]
            vs = popart.VariableSettings(popart.CommGroup(getattr(popart.CommGroupType, name), int(shards)),
                                         popart.VariableRetrievalMode.AllReplicas if int(mode) == 2 else
                                         popart.VariableRetrievalMode.OnePerGroup)
            n = vs.getGroupCount(self._options.replication_factor)
            full = param.detach().cpu().numpy()
            if n > 1 and (full.shape[0] != n):
                raise Error(f"Parameter '{path}': replicaGrouping({name}, {shards}) over "
                            f"{self._options.replication_factor} replicas makes {n} groups, so its first dimension "
                            f"must be {n} (one value per group), not {full.shape[0]}")
            grouped[path] = (vs, full)
            if n > 1:
                owner, attr = _owner(model, path)
                saved.append((owner, attr, param))
                owner._parameters[attr] = torch.nn.Parameter(param.detach()[0].clone(),
                                                             requires_grad=param.requires_grad)

        def restore():
            for owner, attr, param in saved:
                owner._parameters[attr] = param
        return grouped, restore


def _owner(model: torch.nn.Module, path: str):
    """(the module holding parameter ``path``, its attribute name)."""
    *mods, attr = path.split(".")
    owner = model
    for m in mods:
        owner = getattr(owner, m)
    return owner, attr


class _ReplicaGroupingParameter:
    """A parameter as ``model.<name>`` on a PopTorch wrapper gives it: the parameter, plus
    ``replicaGrouping(comm_group_type, shards, variable_retrieval_mode)`` making it a
    replica-grouped weight of that wrapper (``shards``: replicas per group; the parameter holds
    one value per group, ``[groups, *shape]``). Set before the model is compiled."""

    def __init__(self, wrapper, name, param):
        object.__setattr__(self, "_wrapper", wrapper)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_param", param)

    def replicaGrouping(self, comm_group_type, shards: int, variable_retrieval_mode):  # noqa: N802
        self._wrapper._per_replica_params[self._name] = (int(comm_group_type), int(shards),
                                                         int(variable_retrieval_mode))

    def __getattr__(self, attr):
        return getattr(self._param, attr)
