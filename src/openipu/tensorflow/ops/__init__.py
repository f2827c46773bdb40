"""``ipu.ops``: IPU operations (Graphcore TF2 API); ``ipu.<name>_ops`` is ``ipu.ops.<name>_ops``."""

from . import cross_replica_ops, pipelining_ops, replication_ops  # noqa: F401
