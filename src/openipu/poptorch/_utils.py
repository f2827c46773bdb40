"""``poptorch._utils``: the helpers PopTorch programs import from it, chiefly the custom argument
parsers (``poptorch.ICustomArgParser``, ``registerCustomArgParser``): a registered parser says
which tensors an object of its type holds (``yieldTensors``) and how to build one back from
tensors (``reconstruct``), so objects of that type can be inputs of a wrapped model."""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings

import torch
import torch.utils._pytree as pytree

ATTR_PREFIX = "attr:"

#: type -> ICustomArgParser (``poptorch.registerCustomArgParser``)
custom_arg_parsers: dict = {}


def deprecated(domain, since_version, reason):
    """Decorator: warn ``<domain>.<name> is deprecated since <since_version>: <reason>`` on each call."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            warnings.warn(f"{domain}.{fn.__name__} is deprecated since {since_version}: {reason}",
                          DeprecationWarning, stacklevel=2)
            return fn(*args, **kwargs)
        return wrapper
    return deco


def accessAttributes(attribute_id_str) -> dict:  # noqa: N802
    """The attributes dict of a ``poptorch.Attribute`` scope (``{}`` for None)."""
    if attribute_id_str is None:
        return {}
    if isinstance(attribute_id_str, dict):
        return attribute_id_str
    import json
    return json.loads(str(attribute_id_str)[len(ATTR_PREFIX):] if str(attribute_id_str).startswith(ATTR_PREFIX)
                      else str(attribute_id_str))


def isOnIpu(x) -> bool:  # noqa: N802
    """Whether tensor ``x`` is on the ``ipu`` device (never, in openipu: the model is captured
    with fake tensors)."""
    return isinstance(x, torch.Tensor) and x.device.type == "ipu"


def getCustomParser(custom_type_instance):  # noqa: N802
    """The parser registered for the object's type, or for one of its base classes; None."""
    if not custom_arg_parsers:
        return None
    parser = custom_arg_parsers.get(type(custom_type_instance))
    if parser is not None:
        return parser
    for t, p in custom_arg_parsers.items():
        if isinstance(custom_type_instance, t):
            return p
    return None


def flattenTensorStructure(tensors, canonical_structure=None) -> list:  # noqa: N802
    """The tensors of a nested structure (dicts, lists, tuples, objects with a custom parser) in
    order; other values are left out. With ``canonical_structure`` dict keys follow its order."""
    def flatten(x, c):
        parser = getCustomParser(x)
        if parser is not None:
            yield from parser.yieldTensors(x)
        elif isinstance(x, dict):
            for k in (x.keys() if c is None else c.keys()):
                yield from flatten(x[k], None if c is None else c[k])
        elif isinstance(x, (list, tuple)):
            for t, ct in zip(x, itertools.repeat(None, len(x)) if c is None else c):
                yield from flatten(t, ct)
        elif isinstance(x, torch.Tensor):
            yield x
    return list(flatten(tensors, canonical_structure))


def reconstructTensorStructure(structure, values, filter_fn=lambda t: True):  # noqa: N802
    """``structure`` with its tensors (those ``filter_fn`` accepts) replaced, in order, by
    ``values``; other values are kept."""
    def copy(x, it):
        parser = getCustomParser(x)
        if parser is not None:
            return parser.reconstruct(x, it)
        if isinstance(x, dict):
            return type(x)({k: copy(v, it) for k, v in x.items()})
        if isinstance(x, (tuple, list)):
            if hasattr(x, "_asdict") and hasattr(x, "_fields"):
                return type(x)(*(copy(e, it) for e in x))
            return type(x)(copy(e, it) for e in x)
        if isinstance(x, torch.Tensor) and filter_fn(x):
            return next(it)
        return x
    return copy(structure, iter(values))


def getIpuTensorId(x: torch.Tensor) -> int:  # noqa: N802
    """See :func:`openipu.poptorch.poptorch_core.getIpuTensorId`."""
    from openipu.poptorch.poptorch_core import getIpuTensorId as _get
    return _get(x)


class _Wrapped:
    """A custom-parsed object as a pytree leaf context: compared by identity of the object."""

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Wrapped) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):       # torch.export copies specs; the object may hold fake tensors
        return self


def _custom_types(values) -> set:
    """The types in ``values`` (nested) that have a custom parser and are not pytree nodes."""
    found = set()

    def walk(x):
        if getCustomParser(x) is not None:
            found.add(type(x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(values)
    return {t for t in found if t not in pytree.SUPPORTED_NODES}


@contextlib.contextmanager
def custom_pytree_nodes(values):
    """Make the custom-parsed types found in ``values`` pytree nodes while the context lasts:
    their children are the tensors ``yieldTensors`` gives, rebuilt by ``reconstruct`` (so
    ``torch.export`` and the executor's flattening see the tensors inside them)."""
    registered = []
    for t in _custom_types(values):
        parser = getCustomParser     # looked up per object: a subclass may have its own parser

        def flatten(obj, _p=parser):
            return list(_p(obj).yieldTensors(obj)), _Wrapped(obj)

        def unflatten(children, ctx, _p=parser):
            return _p(ctx.obj).reconstruct(ctx.obj, iter(children))

        def flatten_with_keys(obj, _p=parser):
            kids = list(_p(obj).yieldTensors(obj))
            return [(pytree.SequenceKey(i), c) for i, c in enumerate(kids)], _Wrapped(obj)
        pytree.register_pytree_node(t, flatten, unflatten, flatten_with_keys_fn=flatten_with_keys)
        registered.append(t)
    try:
        yield
    finally:
        for t in registered:
            pytree._deregister_pytree_node(t)
