"""``poprt.passes.base_pass``: the pass base classes and the name lookup PopRT's converter uses.

- :class:`Pass` (also ``poprt.Pass``): a pass rewrites a model (``run(model) -> model``); an
  instance is called on a model.
- :class:`ImmutablePass`: a pass that only inspects or checks a model (PopRT's base of checks such
  as ``final_check``); the same interface, ``run`` may return the model unchanged.
- :func:`get_all_named_subclasses`: ``{name: class}`` of the subclasses of a class that have a
  ``name``. The converter finds passes through this module attribute at each look-up, so a client
  that assigns its own function here (Byte MLPerf's IPU backend does, to swap ``final_check``)
  changes which class a name gives.

Source: PopRT 1.4 user guide, "Python API" (``poprt.Pass``, ``poprt.passes.register``) and the
call sites in Byte MLPerf's ``backends/IPU/passes``.
"""

from __future__ import annotations

from typing import Any

from openipu.poprt.passes.base import Pass, PassError, get_registered_passes, register


class ImmutablePass(Pass):
    """A pass that checks a model and does not rewrite its structure (PopRT's
    ``poprt.passes.base_pass.ImmutablePass``). Subclasses implement ``run(model) -> model`` and
    usually walk the graphs with :meth:`Pass.traverse_graph`; ``self.logger`` reports findings."""


def get_all_named_subclasses(cls: Any) -> dict[str, Any]:
    """``{sub.name: sub}`` of every subclass of ``cls`` (recursively, in definition order; a later
    class of the same name wins) that sets ``name`` itself (a class attribute, or
    ``@register``); a subclass that only inherits a name does not take it over.

    Args:
        cls: a class, normally :class:`Pass`.
    Returns:
        dict of name (str) to class.
    """
    found: dict[str, Any] = {}

    def visit(c):
        for sub in c.__subclasses__():
            name = sub.__dict__.get("name")
            if isinstance(name, str) and name:
                found[name] = sub
            visit(sub)

    visit(cls)
    return found


__all__ = ["ImmutablePass", "Pass", "PassError", "get_all_named_subclasses", "get_registered_passes", "register"]
