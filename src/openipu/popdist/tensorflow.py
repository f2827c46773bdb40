"""``popdist.tensorflow``: the IPU configuration of one instance started by ``poprun`` (PopDist's
TensorFlow 2 helper).

Each instance drives ``getNumLocalReplicas()`` replicas of ``ipus_per_replica`` IPUs; the
``experimental.multi_replica_distribution`` options tell the TensorFlow route that this process
is instance ``getInstanceIndex()`` of ``getNumInstances()``: its Keras programs then run as
PopART's distributed replicated graphs (gradients reduced over every instance's replicas through
:mod:`openipu.poplibs.gcl_instances`, weights broadcast from instance 0 before the first run).
"""

from __future__ import annotations

from openipu import popdist

__all__ = ["set_ipu_config"]


def set_ipu_config(config, ipus_per_replica: int | None = None, configure_device: bool = True):
    """Set ``config`` (an ``ipu.config.IPUConfig``) for this instance and return it:
    ``experimental.multi_replica_distribution.process_count`` / ``process_index`` from PopDist
    and, with ``configure_device``, ``auto_select_ipus`` = local replicas x ``ipus_per_replica``
    (default ``getNumIpusPerReplica()``; the simulated IPUs of the instance, standing for the
    device id poprun's partition gives it). Outside ``poprun`` one instance holding every replica.
    Raises ``ValueError`` for ``ipus_per_replica`` below 1."""
    popdist.init()
    k = popdist.getNumIpusPerReplica() if ipus_per_replica is None else int(ipus_per_replica)
    if k < 1:
        raise ValueError(f"ipus_per_replica must be at least 1, not {k}")
    if configure_device:
        config.auto_select_ipus = popdist.getNumLocalReplicas() * k
    mrd = config.experimental.multi_replica_distribution
    mrd.process_count = popdist.getNumInstances()
    mrd.process_index = popdist.getInstanceIndex()
    return config
