"""``ipu.ops``: IPU operations (Graphcore TF2 API); ``ipu.<name>_ops`` is ``ipu.ops.<name>_ops``."""

from . import (cross_replica_ops, embedding_ops, functional_ops, math_ops, nn_ops, normalization_ops,  # noqa: F401
               pipelining_ops, rand_ops, replication_ops)
