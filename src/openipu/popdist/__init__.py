"""``popdist``: PopDist's Python API on the simulated IPU (``import popdist`` gives this module).

A program started by ``poprun`` (:mod:`openipu.popdist.poprun`) is one *instance* of several;
each instance drives its *local* replicas, a consecutive block of the *global* replicas. PopDist
reads the instance's place from the environment ``poprun`` sets:

==================================  =====================================================
``POPDIST_NUM_INSTANCES``           instances in the run (:func:`getNumInstances`)
``POPDIST_INSTANCE_INDEX``          this instance, 0-based (:func:`getInstanceIndex`)
``POPDIST_NUM_TOTAL_REPLICAS``      global replicas (:func:`getNumTotalReplicas`)
``POPDIST_NUM_LOCAL_REPLICAS``      replicas of this instance (:func:`getNumLocalReplicas`)
``POPDIST_REPLICA_INDEX_OFFSET``    first global replica of this instance
``POPDIST_NUM_IPUS_PER_REPLICA``    IPUs of one replica (:func:`getNumIpusPerReplica`)
``POPDIST_DEVICE_ID``               the IPU device id of the instance's IPUs
==================================  =====================================================

Outside ``poprun`` every getter answers for a single instance holding every replica
(``isPopdistEnvSet()`` is False). The collectives between instances run on ``torch.distributed``
(gloo), see :mod:`openipu.poplibs.gcl_instances`. Submodules: :mod:`popdist.poptorch`
(``Options``), :mod:`popdist.popart` (``configureSessionOptions``, ``getDevice``).

Importing it also installs :mod:`openipu_hvd_hook`: where no real Horovod is installed,
``import horovod.torch`` (which Graphcore's PopTorch applications do after ``import popdist``)
then gives openipu's stand-in, :mod:`openipu.popdist.horovod_torch`.
"""

from __future__ import annotations

import os

import openipu_hvd_hook
from openipu.poplibs import gcl_instances

openipu_hvd_hook.install()

__all__ = ["init", "isPopdistEnvSet", "isUsingPoprun", "getNumInstances", "getInstanceIndex", "getNumTotalReplicas",
           "getNumLocalReplicas", "getReplicaIndexOffset", "getNumIpusPerReplica", "getDeviceId",
           "execute_on_instances", "ENV"]

#: the environment variables poprun sets, by getter
ENV = {"instances": "POPDIST_NUM_INSTANCES", "index": "POPDIST_INSTANCE_INDEX",
       "total": "POPDIST_NUM_TOTAL_REPLICAS", "local": "POPDIST_NUM_LOCAL_REPLICAS",
       "offset": "POPDIST_REPLICA_INDEX_OFFSET", "ipus": "POPDIST_NUM_IPUS_PER_REPLICA",
       "device": "POPDIST_DEVICE_ID"}


def _int(key: str, default: int) -> int:
    v = os.environ.get(ENV[key], "")
    try:
        return int(v) if v.strip() else default
    except ValueError:
        raise RuntimeError(f"PopDist: the environment variable {ENV[key]}={v!r} is not an integer") from None


def isPopdistEnvSet() -> bool:  # noqa: N802
    """True when the program runs under ``poprun`` (PopDist's environment is set)."""
    return all(os.environ.get(ENV[k], "").strip() for k in ("instances", "index", "total", "local"))


def isUsingPoprun() -> bool:  # noqa: N802
    """Same as :func:`isPopdistEnvSet`."""
    return isPopdistEnvSet()


def getNumInstances() -> int:  # noqa: N802
    """Instances (processes) of the run; 1 outside ``poprun``."""
    return _int("instances", 1)


def getInstanceIndex() -> int:  # noqa: N802
    """This instance's index in ``[0, getNumInstances())``; 0 outside ``poprun``."""
    return _int("index", 0)


def getNumTotalReplicas() -> int:  # noqa: N802
    """Replicas of all instances together (the global replication factor); 1 outside ``poprun``."""
    return _int("total", 1)


def getNumLocalReplicas() -> int:  # noqa: N802
    """Replicas this instance drives (``getNumTotalReplicas() / getNumInstances()``)."""
    return _int("local", getNumTotalReplicas() // max(1, getNumInstances()))


def getReplicaIndexOffset() -> int:  # noqa: N802
    """The global index of this instance's first replica (``getInstanceIndex() * getNumLocalReplicas()``)."""
    return _int("offset", getInstanceIndex() * getNumLocalReplicas())


def getNumIpusPerReplica() -> int:  # noqa: N802
    """IPUs of one replica (``poprun --ipus-per-replica``); 1 by default."""
    return _int("ipus", 1)


def getDeviceId() -> int:  # noqa: N802
    """The device id of the IPUs this instance attaches to. Each instance simulates its own
    device, so ``poprun`` sets 0 unless told otherwise."""
    return _int("device", 0)


def init() -> None:
    """Check PopDist's environment and, with several instances, join the instances'
    ``torch.distributed`` group now (otherwise the first cross-instance collective joins it).
    Raises ``RuntimeError`` for an inconsistent environment and ``poplar_error`` when the
    rendezvous fails."""
    if not isPopdistEnvSet():
        return
    n, i, total, local = getNumInstances(), getInstanceIndex(), getNumTotalReplicas(), getNumLocalReplicas()
    if not 0 <= i < n or local * n != total:
        raise RuntimeError(f"PopDist: inconsistent environment: instance {i} of {n}, {local} local of {total} "
                           "total replicas (the total must be the local replicas times the instances)")
    if n > 1:
        gcl_instances.init_process_group()


def execute_on_instances(instances, fn, *args, **kwargs):
    """Call ``fn(*args, **kwargs)`` on the instances whose index is in ``instances`` (a set of
    ints) and return its result there; None on the others."""
    return fn(*args, **kwargs) if getInstanceIndex() in set(instances) else None
