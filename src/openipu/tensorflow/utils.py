"""``ipu.utils``: re-exports of :mod:`.config` and seed / system helpers (Graphcore TF2 API)."""

import os

from .config import (DeviceConnectionType, ExecutionProfileType, IPUConfig, MergeRemoteBuffersBehaviour,  # noqa: F401
                     SchedulingAlgorithm, SelectionOrder, StochasticRoundingBehaviour, configure_ipu_system,
                     get_ipu_config, reset_ipu_configuration)
from . import config as _config


def reset_ipu_seed(seed, device="/device:IPU:0", cpu_device="cpu", experimental_identical_replicas=False):
    """Reseed TensorFlow's random generators and the IPU's (PopART's dropout masks) of the
    programs compiled from now on."""
    import tensorflow as tf
    tf.random.set_seed(seed)
    _config._SEED = int(seed)


def running_on_ipu_model() -> bool:
    """True when ``TF_POPLAR_FLAGS`` has ``--use_ipu_model``."""
    return "--use_ipu_model" in os.environ.get("TF_POPLAR_FLAGS", "")


def get_num_of_ipus_in_device(ipu_device, device="cpu") -> int:
    sysm = _config._system()
    if sysm is None:
        raise RuntimeError("No IPU devices configured.")
    idx = int(str(ipu_device).rsplit(":", 1)[-1])
    return int(sysm.device_sizes[idx])


def move_variable_initialization_to_cpu(graph=None):
    """No-op: variables are initialised on the host here."""
