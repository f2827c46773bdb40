"""PopTorch Geometric on the simulated IPU (``import poptorch_geometric``;
``research/poptorch_geometric.md``): PyTorch Geometric graphs batched into fixed numbers of
nodes, edges and graphs (:class:`FixedSizeDataLoader`, :class:`FixedSizeOptions`) so a model
wrapped by ``poptorch.trainingModel`` / ``inferenceModel`` sees static shapes; PyG's
``Data`` / ``Batch`` as model arguments (:class:`PyGArgsParser`); static replacements of PyG's
dynamic ops while ``poptorch`` captures a model (:mod:`.override`); neighbour sampling and
graph partitioning without pyg-lib / torch-sparse (:mod:`.sampling`).

Needs ``torch_geometric`` (``pip install openipu[pyg]``).
"""

from __future__ import annotations

try:
    import torch_geometric  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("poptorch_geometric needs PyTorch Geometric: pip install 'openipu[pyg]'") from e

from openipu.poptorch_geometric import override as _override  # noqa: F401  (registers the substitutions)
from openipu.poptorch_geometric import sampling as _sampling
from openipu.poptorch_geometric.collate import CombinedBatchingCollater, FixedSizeCollater, make_exclude_keys  # noqa: F401
from openipu.poptorch_geometric.dataloader import DataLoader, FixedSizeDataLoader  # noqa: F401
from openipu.poptorch_geometric.fixed_size_options import FixedSizeOptions  # noqa: F401
from openipu.poptorch_geometric.pyg_dataloader import FixedSizeStrategy, OverSizeStrategy  # noqa: F401
from openipu.poptorch_geometric.stream_packing_sampler import StreamPackingSampler  # noqa: F401
from openipu.poptorch_geometric.types import PyGArgsParser, registerCustomArgParsers  # noqa: F401
from openipu.poptorch_geometric.utils import TrainingStepper, set_aggregation_dim_size  # noqa: F401

_sampling.install()

__version__ = "3.4.0+openipu"

__all__ = ["__version__", "FixedSizeDataLoader", "FixedSizeOptions", "FixedSizeStrategy", "OverSizeStrategy",
           "set_aggregation_dim_size", "TrainingStepper", "make_exclude_keys", "PyGArgsParser"]


def __getattr__(name):
    # the loaders that need the neighbour sampler / partitioner load on first use
    if name in ("FixedSizeNeighborLoader",):
        from openipu.poptorch_geometric.neighbor_loader import FixedSizeNeighborLoader
        return FixedSizeNeighborLoader
    if name in ("FixedSizeClusterLoader",):
        from openipu.poptorch_geometric.cluster_loader import FixedSizeClusterLoader
        return FixedSizeClusterLoader
    raise AttributeError(name)
