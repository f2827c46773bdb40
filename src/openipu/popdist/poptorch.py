"""``popdist.poptorch``: PopTorch options for an instance started by ``poprun``."""

from __future__ import annotations

import openipu.poptorch as _poptorch
from openipu import popdist

__all__ = ["Options"]


class Options(_poptorch.Options):
    """``popdist.poptorch.Options(ipus_per_replica=None, **kwargs)``: ``poptorch.Options`` with
    ``replicationFactor(getNumLocalReplicas())`` and ``Distributed.configureProcessId(
    getInstanceIndex(), getNumInstances())`` from PopDist's environment, so that the instance's
    replicas form one global replicated graph with the other instances'. ``ipus_per_replica``
    (default ``getNumIpusPerReplica()``) is checked against the environment: a model must then
    place its stages on that many IPUs. Raises ``RuntimeError`` outside ``poprun`` where the
    environment is inconsistent (see :func:`popdist.init`)."""

    def __init__(self, ipus_per_replica: int | None = None, **kwargs):
        super().__init__(**kwargs)
        popdist.init()
        env_ipus = popdist.getNumIpusPerReplica()
        if ipus_per_replica is not None and int(ipus_per_replica) != env_ipus and popdist.isPopdistEnvSet():
            raise RuntimeError(f"popdist.poptorch.Options: ipus_per_replica={ipus_per_replica} but poprun was started "
                               f"with --ipus-per-replica {env_ipus}")
        self.replicationFactor(popdist.getNumLocalReplicas())
        self.Distributed.configureProcessId(popdist.getInstanceIndex(), popdist.getNumInstances())
