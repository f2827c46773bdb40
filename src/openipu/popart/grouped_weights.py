"""The host side of replica-grouped variables (``popart.VariableSettings``) for the sessions.

A grouped weight's host copy is ``[groups, *shape]``; each replica holds its group's value. The
IR executor and the device program hold one copy per replica; ``weightsFromHost`` sends each
replica its group's value (a ``REPLICATE`` stream on the device), ``weightsToHost`` keeps each
group's first replica (``OnePerGroup``) and, for ``AllReplicas``, every replica's value, which
``readWeights`` returns as ``[replicas, *shape]``. :mod:`openipu.popart.variable_settings` has
the groups; :meth:`openipu.popart.ir.Ir._group_variables` reads them from the model.
"""

from __future__ import annotations

import numpy as np


class GroupedWeightsMixin:
    """Methods of ``popart.InferenceSession`` / ``TrainingSession`` for grouped weights (they
    use the session's ``_ir``, ``options``, ``_host_weights`` and ``replicationFactor``)."""

    def _group_host_weights(self) -> None:
        """Host copies of the replica-grouped variables: ``[groups, *shape]`` (each group's
        value); :attr:`_replica_group` gives the group of each local replica, and
        :attr:`_replica_values` the per-replica values ``AllReplicas`` weights last read back."""
        o = self.options
        reps = o.getGlobalReplicationFactor()
        offset = int(o.globalReplicaOffset) if o.enableDistributedReplicatedGraphs else 0
        self._replica_group: dict[str, list[int]] = {}
        self._replica_values: dict[str, np.ndarray] = {}
        for tid, vs in self._ir.variable_settings.items():
            if tid not in self._host_weights:
                continue
            n = vs.getGroupCount(reps)
            if n > 1:
                full = self._ir.grouped_values.get(tid)
                one = self._host_weights[tid]
                full = np.stack([one] * n) if full is None else full
                self._host_weights[tid] = np.array(full, dtype=one.dtype, order="C", copy=True)
                self._replica_group[tid] = vs.group_of(reps)[offset:offset + o.replication_factor()]

    def _returns_all(self, tid) -> bool:
        vs = self._ir.variable_settings.get(tid)
        return vs is not None and str(vs.retrievalMode) == "AllReplicas"

    def _replica_view(self, tid) -> np.ndarray:
        """``[replicas, *shape]``: each local replica's value of a variable as the host holds it."""
        host = self._host_weights[tid]
        if tid in self._replica_group:
            return host[self._replica_group[tid]]
        return np.broadcast_to(host, (self.replicationFactor,) + host.shape)

    def _store_replicas(self, tid, per: np.ndarray) -> None:
        """Take the replicas' values ``per`` ``[replicas, *shape]`` read from the device into the
        host copy: each group's first replica (``OnePerGroup``), all of them kept for
        ``AllReplicas``."""
        host = self._host_weights[tid]
        if tid in self._replica_group:
            groups = self._replica_group[tid]
            for g in range(host.shape[0]):
                if g in groups:
                    host[g] = per[groups.index(g)].reshape(host.shape[1:])
        else:
            host[...] = per[0].reshape(host.shape)
        if self._returns_all(tid):
            self._replica_values[tid] = np.array(per, copy=True)

    def _returned_values(self, tid) -> np.ndarray:
        """What ``readWeights`` gives for a weight: ``[replicas, *shape]`` for ``AllReplicas``,
        else the host copy (``[groups, *shape]`` for a grouped one)."""
        if self._returns_all(tid) and self.replicationFactor > 1:
            if tid in self._replica_values:
                return self._replica_values[tid]
            return np.ascontiguousarray(self._replica_view(tid))
        return self._host_weights[tid]

