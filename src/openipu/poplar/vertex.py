"""Codelets: ``poplar::Vertex`` and ``poplar::MultiVertex`` written as Python classes.

A codelet declares its fields as class attributes and does its work in ``compute()``::

    class SumVertex(poplar.Vertex):
        in_ = poplar.Input(poplar.Vector(poplar.FLOAT))   # field "in" (trailing _ dropped)
        out = poplar.Output(poplar.FLOAT)

        def compute(self):
            self.out = self.in_.sum()

Inside ``compute()`` each field is a torch tensor: a scalar field has shape ``()``, a
``Vector`` field shape ``(n,)``, a ``VectorList`` (``Vector<Input<Vector<T>>>``) field is a list
of 1-D tensors. Assigning to an output field (``self.out = x``) writes into it. Inputs are
copies: writing to them changes nothing. ``MultiVertex.compute(self, worker_id)`` runs once per
worker context (0..5).

The engine runs all vertices of one type in a compute set together: it groups them by field
sizes and calls ``compute()`` under ``torch.vmap`` once per group, and falls back to one call per
vertex when the codelet has data-dependent Python control flow (set ``vectorize = False`` to
skip the attempt).
"""

from __future__ import annotations

import torch

from openipu.poplar.types import Type, as_type


class _Shape:
    SCALAR, VECTOR, VECTOR_LIST = "scalar", "vector", "vectorlist"


class Vector:
    """``Vector<T>``: a 1-D run of elements of type ``T``."""

    def __init__(self, t, layout=None, align=None, interleaved=False):
        self.inner = t
        self.type = t.type if isinstance(t, FieldSpec) else as_type(t)


class VectorList:
    """``VectorList<T>`` / ``Vector<Input<Vector<T>>>``: a list of 1-D runs."""

    def __init__(self, t, layout=None):
        self.type = as_type(t)


class FieldSpec:
    """A declared vertex field: direction (``in``/``out``/``inout``/``value``), type and shape."""

    direction = "in"

    def __init__(self, t):
        if isinstance(t, VectorList):
            self.shape, self.type = _Shape.VECTOR_LIST, t.type
        elif isinstance(t, Vector):
            if isinstance(t.inner, FieldSpec):        # Vector<Input<Vector<T>>>
                if t.inner.shape != _Shape.VECTOR:
                    raise TypeError("Vector<Input<...>> must wrap a Vector")
                self.shape, self.type, self.direction = _Shape.VECTOR_LIST, t.inner.type, t.inner.direction
            else:
                self.shape, self.type = _Shape.VECTOR, t.type
        else:
            self.shape, self.type = _Shape.SCALAR, as_type(t)
        self.name = None       # the Poplar field name (set by the codelet class)
        self.attr = None       # the Python attribute name

    def __set_name__(self, owner, attr):
        self.attr = attr
        self.name = attr[:-1] if attr.endswith("_") else attr

    @property
    def writes(self) -> bool:
        return self.direction in ("out", "inout")

    @property
    def reads(self) -> bool:
        return self.direction in ("in", "inout")

    def __repr__(self):
        return f"{type(self).__name__}({self.shape} {self.type})"


class Input(FieldSpec):
    """``Input<T>``: read by the vertex."""
    direction = "in"


class Output(FieldSpec):
    """``Output<T>``: written by the vertex."""
    direction = "out"


class InOut(FieldSpec):
    """``InOut<T>``: read and written by the vertex."""
    direction = "inout"


class Value(FieldSpec):
    """A plain vertex state member (e.g. ``unsigned size;``), set with ``graph.setInitialValue``."""
    direction = "value"


class _CodeletMeta(type):
    def __new__(mcs, name, bases, ns):
        cls = super().__new__(mcs, name, bases, ns)
        fields = {}
        for base in reversed(cls.__mro__[1:]):
            fields.update(getattr(base, "_fields", {}))
        for v in ns.values():
            if isinstance(v, FieldSpec):
                fields[v.name] = v
        cls._fields = fields
        cls._out_attrs = frozenset(f.attr for f in fields.values() if f.writes)
        if "vertex_name" not in ns:
            cls.vertex_name = name
        return cls


class Vertex(metaclass=_CodeletMeta):
    """Base of single-worker codelets (``poplar::Vertex``). Override ``compute(self)``."""

    vertex_name = "Vertex"
    multi_vertex = False
    vectorize = True  # try torch.vmap over vertices that share field sizes

    def compute(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def __setattr__(self, attr, value):
        if attr in self._out_attrs and attr in self.__dict__:
            dst = self.__dict__[attr]
            if isinstance(dst, list):
                for d, v in zip(dst, value):
                    d.copy_(torch.as_tensor(v, dtype=d.dtype) if not isinstance(v, torch.Tensor) else v)
            elif isinstance(value, torch.Tensor):
                dst.copy_(value)
            else:
                dst.fill_(value)
        else:
            object.__setattr__(self, attr, value)

    @classmethod
    def fields(cls) -> dict[str, FieldSpec]:
        """The declared fields, by Poplar field name."""
        return dict(cls._fields)


class MultiVertex(Vertex):
    """Base of codelets that run on all worker contexts (``poplar::MultiVertex``).

    ``compute(self, worker_id)`` is called for ``worker_id`` in ``range(numWorkers())``. Cycle
    estimates of a MultiVertex are tile cycles (already counting the 6 contexts).
    """

    multi_vertex = True
    vertex_name = "MultiVertex"

    @staticmethod
    def numWorkers() -> int:  # noqa: N802
        return 6

    def compute(self, worker_id):  # pragma: no cover - overridden
        raise NotImplementedError


SupervisorVertex = MultiVertex


def field_type(codelet: type, name: str) -> Type:
    return codelet._fields[name].type
