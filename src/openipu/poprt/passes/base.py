"""The pass machinery of PopRT's converter: :class:`Pass`, :func:`register`, the registry.

A pass is a class with ``run(model: onnx.ModelProto) -> onnx.ModelProto``, registered under a
name with ``@register('name')`` (PopRT 1.4 user guide, "Python API": ``poprt.Pass``).
``Pass.get_pass(name)`` returns an instance (calling it runs the pass on a copy of the model);
:func:`get_registered_passes` maps names to classes (looked up through
:mod:`openipu.poprt.passes.base_pass` at each call). Passes rewrite
the ONNX graph with the ``onnx`` package only; they record what they did in ``self.applied``
(one entry per rewrite, e.g. the output names of the fused subgraphs) so callers and tests can
tell whether a pattern was found.

:class:`GraphView` gives the graph's producers, consumers and constant values (initializers and
``Constant`` nodes) that pattern passes match on.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

_REGISTRY: dict[str, type] = {}


class PassError(ValueError):
    """A pass name that is not registered, or a pass that cannot run on the model."""


def register(name: str):
    """Class decorator: register a :class:`Pass` subclass as ``name`` (PopRT's
    ``poprt.passes.register``). Sets ``cls.name = name``; the pass is then found by name through
    :func:`openipu.poprt.passes.base_pass.get_all_named_subclasses` (which a client may replace,
    as Byte MLPerf's IPU backend does).

    Raises:
        PassError: ``name`` is already registered by another class.
    """
    def deco(cls):
        old = _REGISTRY.get(name)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise PassError(f"pass '{name}' is already registered ({old.__module__}.{old.__qualname__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def get_registered_passes() -> dict[str, type]:
    """``{name: Pass subclass}`` of every named pass (built-in and custom), sorted by name.

    The names come from ``poprt.passes.base_pass.get_all_named_subclasses(Pass)``, looked up at
    each call (PopRT's lookup: a class is a pass of that name when it, or a base, has a ``name``
    attribute; ``@register`` sets it). Classes registered with ``@register`` are always included.
    """
    _load_builtin()
    from openipu.poprt.passes import base_pass
    found = dict(_REGISTRY)
    found.update(base_pass.get_all_named_subclasses(Pass))
    return dict(sorted(found.items()))


def _load_builtin() -> None:
    from openipu.poprt.passes import _builtin  # noqa: F401  (registers the built-in passes)


class Pass:
    """Base class of converter passes (PopRT's ``poprt.Pass`` / ``poprt.passes.Pass``).
    Subclasses implement :meth:`run`; an instance is called on a model (``p(model)``).

    Attributes:
        name: the registered name (set by :func:`register`; the base class has none, so that
            subclasses without one are not passes of some inherited name).
        applied: what the last run rewrote (list of str), empty when the pattern was not found.
        logger: a ``logging.Logger`` named ``poprt.passes.<name>``.
    """

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.applied: list[str] = []

    @property
    def logger(self):
        import logging
        return logging.getLogger(f"poprt.passes.{getattr(self, 'name', type(self).__name__)}")

    @staticmethod
    def get_pass(name: str, *args, **kwargs) -> "Pass":
        """An instance of the pass registered as ``name`` (``kwargs`` go to its constructor).

        Raises:
            PassError: no pass is registered under ``name`` (the message lists the known ones).
        """
        passes = get_registered_passes()
        if name not in passes:
            raise PassError(f"Pass '{name}' is not registered. Registered passes: {', '.join(passes)}")
        return passes[name](*args, **kwargs)

    @staticmethod
    def get_registered_passes() -> dict[str, type]:
        return get_registered_passes()

    def __call__(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """Run the pass on a copy of ``model``; returns the rewritten copy."""
        out = onnx.ModelProto()
        out.CopyFrom(model)
        self.applied = []
        res = self.run(out)
        return out if res is None else res

    def run(self, model: onnx.ModelProto) -> onnx.ModelProto:  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def traverse_graph(graph: onnx.GraphProto, transform, is_main_graph: bool = True) -> onnx.GraphProto:
        """PopRT's ``Pass.traverse_graph(graph, transform, is_main_graph=True)``: call
        ``transform(g, is_main_graph)`` on the subgraphs of ``graph``'s control-flow nodes (``If``
        branches, ``Loop`` / ``Scan`` bodies, recursively, ``is_main_graph=False``), each result
        replacing its subgraph, then on ``graph`` itself. Returns what ``transform`` returned for
        ``graph`` (``graph`` itself when it returned None)."""
        for node in graph.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    new = Pass.traverse_graph(a.g, transform, False)
                    if new is not a.g:
                        a.g.CopyFrom(new)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for g in a.graphs:
                        new = Pass.traverse_graph(g, transform, False)
                        if new is not g:
                            g.CopyFrom(new)
        res = transform(graph, is_main_graph)
        return graph if res is None else res


class GraphView:
    """Producers, consumers and constant values of one ``GraphProto`` (rebuilt with :meth:`refresh`)."""

    def __init__(self, graph: onnx.GraphProto):
        self.g = graph
        self.refresh()

    def refresh(self) -> None:
        g = self.g
        self.inits = {t.name: t for t in g.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in g.output}
        self._names = set(self.inits) | set(self.producer) | {i.name for i in g.input}

    def const(self, name: str):
        """The value (ndarray) of ``name`` if it is an initializer or a ``Constant`` output, else None."""
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        n = self.producer.get(name)
        if n is not None and n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name == "value_float":
                    import numpy as np
                    return np.array(a.f, np.float32)
        return None

    def scalar(self, name: str):
        """``float(value)`` when ``name`` is a constant with one element, else None."""
        v = self.const(name)
        if v is None or v.size != 1:
            return None
        return float(v.reshape(()))

    def single_consumer(self, name: str) -> onnx.NodeProto | None:
        """The one node reading ``name`` (None if several, none, or it is a graph output)."""
        cs = self.consumers.get(name, [])
        if len(cs) != 1 or name in self.outputs:
            return None
        return cs[0]

    def prod(self, name: str, op_type: str | tuple) -> onnx.NodeProto | None:
        """The producer of ``name`` if it is an ai.onnx node of ``op_type``."""
        n = self.producer.get(name)
        types = (op_type,) if isinstance(op_type, str) else op_type
        if n is not None and n.op_type in types and n.domain in ("", "ai.onnx"):
            return n
        return None

    def fresh(self, stem: str) -> str:
        """A tensor / node name not used in the graph yet."""
        name, k = stem, 0
        while name in self._names:
            k += 1
            name = f"{stem}_{k}"
        self._names.add(name)
        return name

    def add_init(self, stem: str, value) -> str:
        name = self.fresh(stem)
        t = numpy_helper.from_array(value, name)
        self.g.initializer.append(t)
        self.inits[name] = t
        return name


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def opset_of(model: onnx.ModelProto, domain: str = "") -> int:
    for o in model.opset_import:
        if (o.domain or "") in (domain, "ai.onnx" if domain == "" else domain):
            return int(o.version)
    return 0


def ensure_domain(model: onnx.ModelProto, domain: str, version: int = 1) -> None:
    """Add an opset import for ``domain`` if the model has none."""
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(domain, version))


def replace_repeated(field, items) -> None:
    """Make the repeated protobuf ``field`` (``graph.node``, ``graph.input``, ...) hold ``items``, in
    order. The items are copied first: they may be elements of ``field`` itself."""
    copies = [type(x)() for x in items]
    for c, x in zip(copies, items):
        c.CopyFrom(x)
    del field[:]
    field.extend(copies)


def remove_nodes(graph: onnx.GraphProto, dead: list[onnx.NodeProto], insert: list[tuple[onnx.NodeProto, onnx.NodeProto]] = ()) -> None:
    """Remove the nodes ``dead`` (by identity) and put each new node of ``insert`` at the position of
    its anchor node ``(new, anchor)``, keeping the graph topologically sorted when the anchor is
    the last removed node of its subgraph."""
    dead_ids = {id(n) for n in dead}
    at = {id(a): [] for _, a in insert}
    for new, a in insert:
        at[id(a)].append(new)
    kept = []
    for n in graph.node:
        if id(n) in at:
            kept.extend(at[id(n)])
        if id(n) not in dead_ids:
            kept.append(n)
    replace_repeated(graph.node, kept)


def prune_unused(graph: onnx.GraphProto) -> int:
    """Drop nodes whose outputs nobody reads, and unused initializers; returns the count removed."""
    removed = 0
    while True:
        used = {o.name for o in graph.output}
        for n in graph.node:
            used.update(i for i in n.input if i)
            for a in n.attribute:          # names a subgraph reads from the outer scope
                if a.type == onnx.AttributeProto.GRAPH:
                    used.update(_outer_names(a.g))
        keep = [n for n in graph.node if any(o in used for o in n.output if o) or not any(n.output)]
        gone = len(graph.node) - len(keep)
        if gone:
            replace_repeated(graph.node, keep)
            removed += gone
            continue
        inits = [t for t in graph.initializer if t.name in used]
        if len(inits) != len(graph.initializer):
            removed += len(graph.initializer) - len(inits)
            replace_repeated(graph.initializer, inits)
        return removed


def _outer_names(g: onnx.GraphProto) -> set[str]:
    out = set()
    for n in g.node:
        out.update(i for i in n.input if i)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out |= _outer_names(a.g)
    return out
