"""``poptorch._utils``: the helpers PopTorch programs import from it, chiefly the custom argument
parsers (``poptorch.ICustomArgParser``, ``registerCustomArgParser``): a registered parser says
which tensors an object of its type holds (``yieldTensors``) and how to build one back from
tensors (``reconstruct``), so objects of that type (PyG's ``Data`` / ``Batch``) can be inputs
and outputs of a wrapped model; and combined batches (``combined_batch_generator``): the
batches of a user ``batch_sampler`` concatenated into one call's worth of data."""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import sys
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


class _Context:
    """The pytree context of a custom-parsed object: the object itself (the template
    ``reconstruct`` rebuilds from) and the names of its tensors. Contexts compare equal for
    objects of one type with the same tensor names, so the specs of two batches of equal
    structure match (as ``torch.export`` and spec comparisons expect)."""

    __slots__ = ("template", "keys")

    def __init__(self, template, keys):
        self.template = template
        self.keys = tuple(keys)

    def __eq__(self, other):
        return isinstance(other, _Context) and type(self.template) is type(other.template) and \
            self.keys == other.keys

    def __hash__(self):
        return hash((type(self.template), self.keys))

    def __repr__(self):
        return f"{type(self.template).__name__}{list(self.keys)}"

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):       # torch.export copies specs; the object may hold fake tensors
        return self


def _tensor_keys(parser, obj, n: int) -> list:
    """One name per tensor of ``obj``: the parser's optional ``tensorKeys(obj)`` (openipu
    extension, e.g. ``x`` / ``edge_index`` for PyG's ``Data``; they name the model's inputs in
    error messages), else ``0``, ``1`` ..."""
    keys_fn = getattr(parser, "tensorKeys", None)
    keys = [str(k) for k in keys_fn(obj)] if keys_fn is not None else []
    return keys if len(keys) == n else [str(i) for i in range(n)]


def _flatten(obj):
    parser = getCustomParser(obj)
    tensors = list(parser.yieldTensors(obj))
    # the template is a shallow copy: a model that adds tensors to its input object (PyG models
    # set ``data.h = ...``) must not change the structure its spec was flattened from
    return tensors, _Context(copy.copy(obj), _tensor_keys(parser, obj, len(tensors)))


def _unflatten(children, ctx):
    return getCustomParser(ctx.template).reconstruct(ctx.template, iter(children))


def _flatten_with_keys(obj):
    tensors, ctx = _flatten(obj)
    return [(pytree.MappingKey(k), t) for k, t in zip(ctx.keys, tensors)], ctx


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


def _spec_types(spec) -> set:
    """The custom-parsed types a pytree spec (``TreeSpec``) was built from."""
    found, todo = set(), [spec]
    while todo:
        s = todo.pop()
        if isinstance(s.context, _Context):
            found.add(s.type)
        todo.extend(s.children() if hasattr(s, "children") else s.children_specs)
    return {t for t in found if t not in pytree.SUPPORTED_NODES}


@contextlib.contextmanager
def _registered(types):
    registered = []
    try:
        for t in types:
            pytree.register_pytree_node(t, _flatten, _unflatten, flatten_with_keys_fn=_flatten_with_keys)
            registered.append(t)
        yield
    finally:
        for t in registered:
            pytree._deregister_pytree_node(t)


@contextlib.contextmanager
def custom_pytree_nodes(values):
    """Make the custom-parsed types found in ``values`` pytree nodes while the context lasts:
    their children are the tensors ``yieldTensors`` gives, rebuilt by ``reconstruct`` (so
    ``torch.export`` and the executor's flattening see the tensors inside them). The parser is
    looked up per object, so a subclass may have its own."""
    ensure_geometric_parsers()
    with _registered(_custom_types(values)):
        yield


def tree_unflatten(values, spec):
    """``torch.utils._pytree.tree_unflatten`` for a spec that may hold custom-parsed objects
    (a model returning PyG's ``Data``): their types are pytree nodes while it runs."""
    with _registered(_spec_types(spec)):
        return pytree.tree_unflatten(values, spec)


def ensure_geometric_parsers() -> None:
    """Register PopTorch Geometric's ``PyGArgsParser`` when ``torch_geometric`` is in use
    (PopTorch Geometric registers it on import; openipu also does on the first call that may
    see a ``Data``, so that ``import poptorch`` alone does not import PyG)."""
    if "torch_geometric" in sys.modules and "openipu.poptorch_geometric.types" not in sys.modules:
        try:
            from openipu.poptorch_geometric import types  # noqa: F401  (registers on import)
        except ImportError:
            pass


# -- combined batches (a user ``batch_sampler`` under device iterations / replicas) ---------------
def combine_batch_tensors_gen(tensors):
    """Yield ``torch.cat`` on dim 0 of the i-th tensor of every batch (``tensors``: one list of
    tensors per batch, all the same length), for each i."""
    for i in range(len(tensors[0])):
        yield torch.cat([batch[i] for batch in tensors])


def combined_batch_generator(iterator, num_batches_to_combine: int, drop_last: bool = True):
    """Wrap a loader iterator (PopTorch's ``_utils.combined_batch_generator``): yield batches
    made of ``num_batches_to_combine`` consecutive batches concatenated tensor by tensor on dim 0,
    non-tensor values taken from the last of them (the last, shorter group is dropped when
    ``drop_last``)."""
    group, last = [], None
    for batch in iterator:
        group.append(flattenTensorStructure(batch))
        last = batch
        if len(group) == num_batches_to_combine:
            yield reconstructTensorStructure(last, combine_batch_tensors_gen(group))
            group = []
    if group and not drop_last:
        yield reconstructTensorStructure(last, combine_batch_tensors_gen(group))
