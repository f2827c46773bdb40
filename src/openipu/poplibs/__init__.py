"""``openipu.poplibs``: PopLibs on the simulated IPU (poputil, popops, poplin, popnn, poprand, gcl).

Each op chooses tile mappings, creates its outputs, appends compute sets to a program
``Sequence`` and gives every vertex group a cycle estimate (in the shape of PopLibs' estimators)
and one torch kernel for the whole group.
"""

from openipu.poplibs import gcl, poplin, popnn, popops, poprand, poputil

__all__ = ["gcl", "poplin", "popnn", "popops", "poprand", "poputil"]
