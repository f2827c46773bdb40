"""``ipu.distributed.popdist_strategy.PopDistStrategy`` (Graphcore TF2 API)."""

from ..ipu_strategy import IPUStrategyV1


class PopDistStrategy(IPUStrategyV1):
    """The ``IPUStrategy`` of one ``poprun`` instance: models built in its scope train on this
    instance's replicas with their gradients reduced over every instance's replicas (PopART's
    distributed replicated graphs) and start from instance 0's weights (broadcast before the
    first execution). Configure the system with ``popdist.tensorflow.set_ipu_config`` first.

    Raises ``RuntimeError`` when the configured system's ``multi_replica_distribution`` does not
    match PopDist's instances (``set_ipu_config`` not called before ``configure_ipu_system``)."""

    def __init__(self, add_ipu_cross_replica_reductions=True, enable_dataset_iterators=True,
                 enable_keras_extensions=True):
        from openipu import popdist

        from .. import config as _config
        popdist.init()
        n = popdist.getNumInstances()
        sysm = _config._system()
        count = sysm.config.experimental.multi_replica_distribution.process_count if sysm is not None else 0
        if n > 1 and count != n:
            raise RuntimeError(f"PopDistStrategy: the IPU system is configured for {count or 1} instance(s) but poprun "
                               f"started {n}: call popdist.tensorflow.set_ipu_config(config) before "
                               "config.configure_ipu_system().")
        super().__init__()
        self.add_ipu_cross_replica_reductions = add_ipu_cross_replica_reductions
