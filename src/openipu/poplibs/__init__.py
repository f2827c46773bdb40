"""``openipu.poplibs``: PopLibs on the simulated IPU (poputil, popops, poplin).

Each op chooses tile mappings, creates its outputs, appends compute sets to a program
``Sequence`` and gives every vertex group a cycle estimate (in the shape of PopLibs' estimators)
and one torch kernel for the whole group.
"""

from openipu.poplibs import poplin, popops, poputil
from openipu.poplibs import popnn, poprand  # noqa: E402,F401

__all__ = ["poplin", "popops", "poputil"]
