"""Custom argument parsers (PopTorch's ``poptorch.ICustomArgParser`` /
``poptorch.registerCustomArgParser``, ``research/poptorch.md``): a way to pass objects that are
not tensors, lists, tuples or dicts (PyG's ``Data`` / ``Batch``) to a wrapped model.

A parser turns an object into its tensors (``yieldTensors``) and builds an object of the same
structure from new tensors (``reconstruct``). openipu registers each parsed type as a
``torch.utils._pytree`` node, so the executor's argument flattening, ``torch.export``'s capture,
output rebuilding and :func:`openipu.poptorch._utils.combined_batch_generator` all see the
object's tensors as leaves and rebuild the object around them.

Written for the PyG integration (``openipu.poptorch_geometric``); kept in its own module so that
it stays independent of the executor. PopTorch mirrored: ``poptorch.ICustomArgParser``,
``poptorch.registerCustomArgParser(type, parser)`` (``parser=None`` unregisters).
"""

from __future__ import annotations

import sys

import torch
import torch.utils._pytree as pytree

#: type -> parser, as registered (PopTorch's ``_utils.custom_arg_parsers``)
custom_arg_parsers: dict = {}


class ICustomArgParser:
    """Interface of a custom argument parser (PopTorch's ``poptorch.ICustomArgParser``)."""

    def yieldTensors(self, struct):  # noqa: N802
        """Yield the tensors of ``struct`` in a fixed order (``reconstruct`` reads them back in
        that order)."""
        raise NotImplementedError

    def reconstruct(self, original_structure, tensor_iterator):
        """An object like ``original_structure`` whose tensors are taken, in ``yieldTensors``'
        order, from ``tensor_iterator``."""
        raise NotImplementedError


class _Context:
    """A pytree context holding the object the tensors came from (its non-tensor parts are
    rebuilt from it); equal for objects of one type with the same tensor keys."""

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

    def __deepcopy__(self, memo):      # torch.export deep-copies specs; the template is read only
        return self

    def __copy__(self):
        return self


def getCustomParser(obj):  # noqa: N802
    """The parser registered for ``type(obj)`` (exact type first, then ``isinstance``) or None."""
    parser = custom_arg_parsers.get(type(obj))
    if parser is not None:
        return parser
    for t, p in custom_arg_parsers.items():
        if isinstance(obj, t):
            return p
    return None


def _keys(parser, obj, n: int):
    keys_fn = getattr(parser, "tensorKeys", None)
    keys = list(keys_fn(obj)) if keys_fn is not None else [str(i) for i in range(n)]
    return keys if len(keys) == n else [str(i) for i in range(n)]


def registerCustomArgParser(arg_type: type, parser) -> None:  # noqa: N802
    """Use ``parser`` (an :class:`ICustomArgParser`) for arguments and outputs of type
    ``arg_type``; ``parser=None`` removes it. Raises ``TypeError`` when ``arg_type`` is not a
    type or ``parser`` is not an ``ICustomArgParser``. A parser may add ``tensorKeys(struct)``
    (one name per tensor) to name the inputs (``data.x``); PopTorch's parsers need not."""
    if not isinstance(arg_type, type):
        raise TypeError(f"registerCustomArgParser: {arg_type!r} is not a type")
    if parser is not None and not isinstance(parser, ICustomArgParser):
        raise TypeError("registerCustomArgParser: the parser must be a poptorch.ICustomArgParser")
    if arg_type in pytree.SUPPORTED_NODES:
        if arg_type not in custom_arg_parsers:
            raise TypeError(f"registerCustomArgParser: {arg_type.__name__} is already a pytree node type")
        pytree._deregister_pytree_node(arg_type)
    custom_arg_parsers.pop(arg_type, None)
    if parser is None:
        return
    custom_arg_parsers[arg_type] = parser

    def flatten(obj):
        tensors = list(parser.yieldTensors(obj))
        return tensors, _Context(obj, _keys(parser, obj, len(tensors)))

    def flatten_with_keys(obj):
        tensors, ctx = flatten(obj)
        return [(pytree.MappingKey(k), t) for k, t in zip(ctx.keys, tensors)], ctx

    def unflatten(values, ctx):
        return parser.reconstruct(ctx.template, iter(values))

    pytree.register_pytree_node(arg_type, flatten, unflatten, flatten_with_keys_fn=flatten_with_keys)


def flattenTensorStructure(struct) -> list:  # noqa: N802
    """The tensors of ``struct`` (tensors, lists, tuples, dicts and registered types), in order."""
    return [v for v in pytree.tree_leaves(struct) if isinstance(v, torch.Tensor)]


def reconstructTensorStructure(struct, tensors):  # noqa: N802
    """``struct`` with its tensors replaced, in :func:`flattenTensorStructure`'s order, by those
    of the iterable ``tensors``."""
    it = iter(tensors)
    return pytree.tree_map(lambda v: next(it) if isinstance(v, torch.Tensor) else v, struct)


def ensure_geometric_parsers() -> None:
    """Register PyG's parsers when ``torch_geometric`` is in use (PopTorch registers them at
    ``import poptorch``; openipu does it on the first call that may see a ``Data``, so that
    ``import poptorch`` does not import PyG)."""
    if "torch_geometric" in sys.modules and "openipu.poptorch_geometric.types" not in sys.modules:
        try:
            from openipu.poptorch_geometric import types  # noqa: F401  (registers on import)
        except ImportError:
            pass
