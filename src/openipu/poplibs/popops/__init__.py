"""``popops``: PopLibs' general operations (``include/popops/*.hpp``), one op family per module.

- ``elementwise``: binary and unary elementwise ops (``ElementWise.hpp``).
"""

from openipu.poplibs.popops.elementwise import *  # noqa: F401,F403
from openipu.poplibs.popops.elementwise import __all__ as _ew_all
from openipu.poplibs.popops.scaled_add import ScaledAddSpecialisation, scaledAddTo, scaledSubtractFrom  # noqa: F401


def addCodelets(graph) -> None:  # noqa: N802
    """Register popops' codelets (library vertices are built in; kept for API compatibility)."""


__all__ = ["addCodelets", *_ew_all]
