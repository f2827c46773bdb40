"""``popdist.popart``: PopART session options and device for an instance started by ``poprun``."""

from __future__ import annotations

import openipu.popart as _popart
from openipu import popdist

__all__ = ["configureSessionOptions", "getDevice"]


def configureSessionOptions(opts) -> None:  # noqa: N802
    """Set ``opts`` (``popart.SessionOptions``) for this instance: ``enableReplicatedGraphs`` and
    ``replicatedGraphCount = getNumLocalReplicas()``, and with several instances
    ``enableDistributedReplicatedGraphs``, ``globalReplicationFactor = getNumTotalReplicas()``,
    ``globalReplicaOffset = getReplicaIndexOffset()``."""
    popdist.init()
    local = popdist.getNumLocalReplicas()
    if local > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = local
    if popdist.getNumInstances() > 1:
        opts.enableDistributedReplicatedGraphs = True
        opts.globalReplicationFactor = popdist.getNumTotalReplicas()
        opts.globalReplicaOffset = popdist.getReplicaIndexOffset()


def getDevice(ipus_per_replica: int | None = None, *, ipu_model: bool = False):  # noqa: N802
    """The device of this instance's local replicas: ``getNumLocalReplicas() * ipus_per_replica``
    IPUs (default ``getNumIpusPerReplica()``), from ``DeviceManager().acquireAvailableDevice``
    (``ipu_model``: ``createIpuModelDevice``)."""
    k = popdist.getNumIpusPerReplica() if ipus_per_replica is None else int(ipus_per_replica)
    n = popdist.getNumLocalReplicas() * k
    dm = _popart.DeviceManager()
    return dm.createIpuModelDevice({"numIPUs": n}) if ipu_model else dm.acquireAvailableDevice(n)
