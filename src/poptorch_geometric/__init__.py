"""Drop-in ``poptorch_geometric`` module: ``import poptorch_geometric`` gives
:mod:`openipu.poptorch_geometric` (PopTorch Geometric's API on the simulated IPU), so PyG
scripts written for an IPU system run unchanged."""

import importlib as _importlib
import sys as _sys

import openipu.poptorch_geometric as _impl
from openipu.poptorch_geometric import *  # noqa: F401,F403

for _name in dir(_impl):
    if not _name.startswith("__"):
        globals()[_name] = getattr(_impl, _name)
for _sub in ("collate", "dataloader", "pyg_dataloader", "pyg_collate", "fixed_size_options", "stream_packing_sampler",
             "types", "utils", "override", "sampling", "neighbor_loader", "cluster_loader", "pyg_cluster_loader", "masker", "ops", "common"):
    try:
        _sys.modules[f"{__name__}.{_sub}"] = _importlib.import_module(f"openipu.poptorch_geometric.{_sub}")
    except ImportError:
        pass
del _name, _sub


def __getattr__(name):
    return getattr(_impl, name)
