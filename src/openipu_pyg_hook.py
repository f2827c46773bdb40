"""Start-up hook that gives PyTorch Geometric openipu's neighbour sampler and graph partitioner
whether or not ``poptorch_geometric`` has been imported.

In Graphcore's environment torch-sparse is installed, so a script may build PyG's
``ClusterData`` (METIS) or sample with ``NeighborLoader`` before it imports ``poptorch`` or
``poptorch_geometric`` (Graphcore's tutorial 5 does). Neither pyg-lib nor torch-sparse installs
on the torch openipu pins, and ``import poptorch_geometric`` installs the numpy paths of
:mod:`openipu.poptorch_geometric.sampling`; this hook makes the order irrelevant.

Installed by ``openipu-pyg.pth`` (one ``import openipu_pyg_hook`` line in site-packages, shipped
by the openipu wheel, or written by ``python -m openipu_pyg_hook install`` for an editable
install). It runs in every interpreter of the environment, so it imports nothing (never torch
or PyG): it registers a :class:`importlib.abc.MetaPathFinder` that answers only the name
``torch_geometric``, with the real module's spec whose loader, after the module has executed,
puts two thin stand-ins on ``ClusterData._metis`` and ``NeighborSampler._sample``. On their first
call those import :mod:`openipu.poptorch_geometric.sampling` and install the real numpy paths
(``sampling.install``). Nothing is patched when pyg-lib or torch-sparse is installed, or when the
environment variable ``OPENIPU_PYG_HOOK=0`` is set.
"""

import os
import sys

_NAME = "torch_geometric"


class _AfterExecLoader:
    """Wraps the real loader of ``torch_geometric``; runs :func:`_patch` after the module body."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch()

    def __getattr__(self, name):          # get_resource_reader, get_filename, ...
        return getattr(self._loader, name)


class PygImportFinder:
    """Answers ``torch_geometric`` with the spec the other finders give, its loader wrapped in
    :class:`_AfterExecLoader`. A ``MetaPathFinder`` by protocol (importing ``importlib.abc`` at
    start-up would cost time in every interpreter)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _NAME or os.environ.get("OPENIPU_PYG_HOOK") == "0":
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, PygImportFinder):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _AfterExecLoader(spec.loader)
        return spec


def _patch() -> None:
    """Stand-ins on ``ClusterData._metis`` / ``NeighborSampler._sample`` that install
    :mod:`openipu.poptorch_geometric.sampling` on first use (no-op with pyg-lib or
    torch-sparse)."""
    try:
        import torch_geometric.typing as tgt
        if tgt.WITH_PYG_LIB or tgt.WITH_TORCH_SPARSE:
            return
        from torch_geometric.loader.cluster import ClusterData
        from torch_geometric.sampler import NeighborSampler
    except Exception:                      # a broken or partial PyG: leave it alone
        return

    _on_first_use(ClusterData, "_metis")
    _on_first_use(NeighborSampler, "_sample")


def _on_first_use(cls, attr: str) -> None:
    """Put on ``cls.attr`` a stand-in that installs :mod:`openipu.poptorch_geometric.sampling`
    on its first call, then calls the method installed in its place, or PyG's own
    (``_openipu_native``) when ``sampling.install`` declined. No-op if openipu's method is there."""
    native = getattr(cls, attr)
    if getattr(native, "_openipu", False):
        return

    def stand_in(self, *args, **kwargs):
        from openipu.poptorch_geometric import sampling
        sampling.install()
        method = getattr(cls, attr)
        return (native if method is stand_in else method)(self, *args, **kwargs)
    stand_in._openipu_pending = True
    stand_in._openipu_native = native
    setattr(cls, attr, stand_in)


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (idempotent). If ``torch_geometric`` is already
    imported, patch it now."""
    if not any(isinstance(f, PygImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PygImportFinder())
    if _NAME in sys.modules and os.environ.get("OPENIPU_PYG_HOOK") != "0":
        _patch()


def write_pth(site_dir=None) -> str:
    """Write ``openipu-pyg.pth`` into ``site_dir`` (default: this environment's site-packages)
    and return its path (:func:`openipu_pth.write_pth`)."""
    import openipu_pth
    return openipu_pth.write_pth("openipu-pyg.pth", "openipu_pyg_hook", site_dir)


install()

if __name__ == "__main__":
    import openipu_pth
    openipu_pth.main("openipu-pyg.pth", "openipu_pyg_hook")
