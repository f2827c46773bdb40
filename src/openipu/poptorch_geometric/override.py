"""PyG substitutions for the IPU (PopTorch Geometric's ``override``).

While ``poptorch`` captures a model, :class:`_TorchGeometricOpsSubstitutionManager` (registered
with ``poptorch``'s substitution managers at import) puts the static ops of :mod:`.ops` in place
of PyG's ``knn``, ``knn_graph``, ``radius``, ``radius_graph`` and ``knn_interpolate`` (in every
loaded ``torch_geometric`` module that bound them, e.g. SchNet's ``radius_graph``, and in
``torch_cluster`` if present), gives ``ClusterGCNConv`` a forward without boolean-mask writes,
makes ``Aggregation.assert_sorted_index`` a no-op (it reads index
values on the host) and turns on PyG's ``disable_dynamic_shapes`` experimental mode (so a
missing ``dim_size`` / ``batch_size`` raises PyG's ``ValueError`` instead of a capture error).
Everything is restored after capture: eager CPU calls run PyG's code.

Compatibility shims installed at import (PyG 2.8 against PopTorch Geometric 3.4's PyG 2.4):

* without pyg-lib / torch-cluster, PyG 2.8's ``knn`` ... ``radius_graph`` raise ``ImportError``;
  they are replaced by :func:`.ops.dynamic` versions (the static op, -1 pairs dropped), so
  models such as SchNet also run on the CPU;
* PyG >= 2.5 rejects ``add_self_loops=`` for layers that never had it (``SAGEConv``,
  ``GraphConv`` ...), which PyG 2.4 ignored and Graphcore's tutorials pass: ``MessagePassing``
  drops that one keyword again.
"""

from __future__ import annotations

import functools
import sys

import torch_geometric
import torch_geometric.nn.pool as _pool
import torch_geometric.nn.unpool as _unpool
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.nn.conv import ClusterGCNConv, MessagePassing

from openipu.poptorch._overrides import _OverwriteContextManager
from openipu.poptorch_geometric import ops

_NAMES = ("knn", "knn_graph", "radius", "radius_graph", "knn_interpolate")
_STATIC = {n: getattr(ops, n) for n in _NAMES}
#: the functions that may stand at those names: PyG's, and the eager fallbacks
_KNOWN: dict = {n: set() for n in _NAMES}
for _n in _NAMES[:-1]:
    _KNOWN[_n].add(getattr(_pool, _n))
_KNOWN["knn_interpolate"].add(_unpool.knn_interpolate)


def _cluster_gcn_forward(self, x, edge_index):
    """``ClusterGCNConv.forward`` for a dense ``edge_index`` [2, E] with static shapes: the
    diagonal term ``diag_lambda / deg`` is added to the self-loop edges' weights through a 0/1
    factor (PyG writes it through a boolean mask, a data-dependent shape)."""
    from torch_geometric.utils import add_self_loops, degree, remove_self_loops
    num_nodes = x.size(self.node_dim)
    if self.add_self_loops:
        edge_index, _ = remove_self_loops(edge_index)
        edge_index, _ = add_self_loops(edge_index, num_nodes=num_nodes)
    row, col = edge_index[0], edge_index[1]
    deg_inv = 1. / degree(col, num_nodes=num_nodes).clamp_(1.)
    w = deg_inv[col]
    edge_weight = w + (row == col).to(w.dtype) * self.diag_lambda * w
    out = self.propagate(edge_index, x=x, edge_weight=edge_weight)
    return self.lin_out(out) + self.lin_root(x)


def _modules():
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name == "torch_geometric" or name.startswith("torch_geometric.")
                                or name == "torch_cluster" or name.startswith("torch_cluster.")):
            yield mod


def _swap(choose) -> list:
    """Replace, in every loaded PyG module, each known function by ``choose(name, fn)``;
    returns the (module, name, old) list to undo it."""
    done = []
    for mod in _modules():
        d = getattr(mod, "__dict__", {})
        for name in _NAMES:
            fn = d.get(name)
            if fn is not None and fn in _KNOWN[name]:
                new = choose(name, fn)
                if new is not fn:
                    setattr(mod, name, new)
                    done.append((mod, name, fn))
    return done


class _TorchGeometricOpsSubstitutionManager:
    """``replace()`` / ``restore()`` the PyG substitutions around capture (module docstring)."""

    def __init__(self):
        self._undo = []
        self._assert_sorted = None
        self._experimental = None
        self._cluster_gcn_forward = None

    def replace(self):
        self._undo = _swap(lambda name, fn: _STATIC[name])
        self._cluster_gcn_forward = ClusterGCNConv.__dict__["forward"]
        ClusterGCNConv.forward = _cluster_gcn_forward
        self._assert_sorted = Aggregation.__dict__.get("assert_sorted_index")
        Aggregation.assert_sorted_index = lambda self, index: None
        from torch_geometric import experimental
        self._experimental = experimental.set_experimental_mode(True, "disable_dynamic_shapes")
        self._experimental.__enter__()

    def restore(self):
        if self._cluster_gcn_forward is not None:
            ClusterGCNConv.forward = self._cluster_gcn_forward
            self._cluster_gcn_forward = None
        if self._experimental is not None:
            self._experimental.__exit__(None, None, None)
            self._experimental = None
        if self._assert_sorted is not None:
            Aggregation.assert_sorted_index = self._assert_sorted
            self._assert_sorted = None
        for mod, name, fn in reversed(self._undo):
            setattr(mod, name, fn)
        self._undo = []


def _install_eager_fallbacks():
    t = torch_geometric.typing
    missing = {"knn": not t.WITH_KNN, "knn_graph": not t.WITH_KNN, "radius": not t.WITH_RADIUS,
               "radius_graph": not t.WITH_RADIUS, "knn_interpolate": not t.WITH_KNN}
    fallbacks = {}
    for name, miss in missing.items():
        if miss:
            f = ops.dynamic(_STATIC[name]) if name != "knn_interpolate" else ops.knn_interpolate
            fallbacks[name] = f
            _KNOWN[name].add(f)
    if fallbacks:
        _swap(lambda name, fn: fallbacks.get(name, fn))


def _install_add_self_loops_shim():
    init = MessagePassing.__init__
    if getattr(init, "_openipu", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, add_self_loops=None, **kwargs):  # noqa: N807
        init(self, *args, **kwargs)
    __init__._openipu = True
    MessagePassing.__init__ = __init__


_install_eager_fallbacks()
_install_add_self_loops_shim()
_OverwriteContextManager.registerSubsitutionManager(_TorchGeometricOpsSubstitutionManager)
